//! The model interface every provider implements: a request in (system prompt, history,
//! tool definitions), a stream of text and thinking deltas, complete tool calls, usage and
//! one stop out. Providers assemble tool-call arguments that arrive in pieces; the engine
//! only ever sees whole calls.

use std::sync::Arc;

use futures_util::stream::BoxStream;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::domain::Usage;
use crate::projection::history::Message;

/// A tool the model may call.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolDef {
    pub name: String,
    pub description: String,
    /// JSON Schema of the input object.
    pub parameters: Value,
}

#[derive(Debug, Clone)]
pub struct ModelRequest {
    pub system: String,
    /// The conversation, shared with the turn that asks (a copy costs a pointer each).
    pub messages: Vec<Arc<Message>>,
    pub tools: Vec<ToolDef>,
    /// Cancelled when the turn is cancelled: a provider drops its HTTP stream at once.
    pub cancel: CancellationToken,
}

pub use crate::domain::event::ModelStop;

#[derive(Debug, Clone, PartialEq)]
pub enum ModelEvent {
    TextDelta(String),
    ThinkingDelta(String),
    /// A complete call. `id` is the model's own call id, if it gave one.
    ToolCall {
        id: Option<String>,
        name: String,
        input: Value,
    },
    /// Usage so far; the last one counts.
    Usage(Usage),
    Stop(ModelStop),
}

/// A failed model request, with a code the log and the views can show
/// (`model_overloaded_error`, `model_rate_limited_error`, `model_auth_error`, ...).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct ModelError {
    pub code: String,
    pub message: String,
    /// The MCP server that failed, when one did (`mcp_unavailable`).
    pub mcp_server: Option<String>,
}

impl ModelError {
    pub fn new(code: impl Into<String>, message: impl Into<String>) -> ModelError {
        ModelError { code: code.into(), message: message.into(), mcp_server: None }
    }
}

pub type ModelStream = BoxStream<'static, Result<ModelEvent, ModelError>>;

/// A model provider. `stream` starts one model request; the stream ends after `Stop` or
/// an error. Dropping the stream abandons the request.
pub trait Model: Send + Sync + 'static {
    /// The name recorded in `span.model_request_start` (e.g. `scripted`, `gpt-4o`).
    fn name(&self) -> &str;
    /// The provider, for metrics labels (`scripted`, `openai`, `anthropic`).
    fn provider(&self) -> &'static str;
    fn stream(&self, request: ModelRequest) -> ModelStream;
}
