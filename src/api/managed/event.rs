//! The managed view's events, as the SDK's closed event union has them ([`Event`]), and the
//! one function that maps a log event to one ([`event`]); turnlog's own events and stop
//! reasons are mapped or left out here, and never reach the wire as they are. Also the
//! previews a stream sends when asked (`event_start`, `event_delta`).

use serde::Serialize;
use serde_json::{json, Value};
use utoipa::openapi::{RefOr, Schema};
use utoipa::{PartialSchema, ToSchema};

use super::wire::{rubric_problem, string_map, ContentBlock, Metadata};
use crate::domain::event::{Confirmation, Permission, StopReason};
use crate::domain::{Block, EventBody};

/// The event types this view shows, as the SDK names them.
pub const TYPES: &[&str] = &[
    "user.message",
    "user.interrupt",
    "user.tool_confirmation",
    "user.custom_tool_result",
    "user.define_outcome",
    "agent.message",
    "agent.thinking",
    "agent.tool_use",
    "agent.tool_result",
    "agent.mcp_tool_use",
    "agent.mcp_tool_result",
    "agent.custom_tool_use",
    "session.status_running",
    "session.status_rescheduled",
    "session.status_idle",
    "session.status_terminated",
    "session.error",
    "session.updated",
    "session.deleted",
    "span.model_request_start",
    "span.model_request_end",
    "span.outcome_evaluation_start",
    "span.outcome_evaluation_end",
];

/// The log's type for an SDK type (they differ for the end of a session's log, and for
/// MCP tool calls, which the log keeps as tool calls that name their server).
pub fn log_kind(sdk: &str) -> &str {
    match sdk {
        "session.status_terminated" => "terminated",
        "session.status_rescheduled" => "turn.resumed",
        "agent.mcp_tool_use" => "agent.tool_use",
        "agent.mcp_tool_result" => "agent.tool_result",
        other => other,
    }
}

/// An event as the SDK's `BetaManagedAgentsSessionEvent` union has it. Every event has its
/// `id` (an agent message's or thinking's is its message id, which previews announce before
/// the final event exists) and `processed_at` (null while a queued message waits).
#[derive(Debug, Serialize, ToSchema)]
#[serde(tag = "type")]
#[schema(as = ManagedEvent)]
pub enum Event {
    #[serde(rename = "user.message")]
    UserMessage { id: String, content: Vec<ContentBlock>, processed_at: Option<String> },
    #[serde(rename = "user.interrupt")]
    UserInterrupt { id: String, processed_at: Option<String> },
    #[serde(rename = "user.tool_confirmation")]
    UserToolConfirmation {
        id: String,
        tool_use_id: String,
        result: Decision,
        deny_message: Option<String>,
        processed_at: Option<String>,
    },
    #[serde(rename = "user.custom_tool_result")]
    UserCustomToolResult {
        id: String,
        custom_tool_use_id: String,
        content: Vec<ContentBlock>,
        is_error: bool,
        processed_at: Option<String>,
    },
    #[serde(rename = "user.define_outcome")]
    UserDefineOutcome {
        id: String,
        processed_at: Option<String>,
        outcome_id: String,
        description: String,
        #[schema(schema_with = rubric_schema)]
        rubric: Value,
        #[schema(value_type = Option<u32>)]
        max_iterations: Option<Value>,
    },
    #[serde(rename = "agent.message")]
    AgentMessage { id: String, content: Vec<ContentBlock>, processed_at: Option<String> },
    #[serde(rename = "agent.thinking")]
    AgentThinking { id: String, processed_at: Option<String> },
    #[serde(rename = "agent.mcp_tool_use")]
    AgentMcpToolUse {
        id: String,
        name: String,
        mcp_server_name: String,
        #[schema(value_type = Object)]
        input: Value,
        evaluated_permission: Evaluated,
        processed_at: Option<String>,
    },
    #[serde(rename = "agent.tool_use")]
    AgentToolUse {
        id: String,
        name: String,
        #[schema(value_type = Object)]
        input: Value,
        evaluated_permission: Evaluated,
        processed_at: Option<String>,
    },
    #[serde(rename = "agent.custom_tool_use")]
    AgentCustomToolUse {
        id: String,
        name: String,
        #[schema(value_type = Object)]
        input: Value,
        processed_at: Option<String>,
    },
    #[serde(rename = "agent.mcp_tool_result")]
    AgentMcpToolResult {
        id: String,
        mcp_tool_use_id: String,
        content: Vec<ContentBlock>,
        is_error: bool,
        processed_at: Option<String>,
    },
    #[serde(rename = "agent.tool_result")]
    AgentToolResult {
        id: String,
        tool_use_id: String,
        content: Vec<ContentBlock>,
        is_error: bool,
        processed_at: Option<String>,
    },
    #[serde(rename = "session.status_running")]
    StatusRunning { id: String, processed_at: Option<String> },
    /// A turn whose process stopped goes on from the log (`turn.resumed`): what it had
    /// previewed of an unfinished message is void, and a new attempt follows.
    #[serde(rename = "session.status_rescheduled")]
    StatusRescheduled { id: String, processed_at: Option<String> },
    #[serde(rename = "session.status_idle")]
    StatusIdle {
        id: String,
        #[schema(inline)]
        stop_reason: Stop,
        processed_at: Option<String>,
    },
    #[serde(rename = "session.error")]
    SessionError {
        id: String,
        processed_at: Option<String>,
        #[schema(inline)]
        error: SessionFailure,
    },
    #[serde(rename = "span.model_request_start")]
    ModelRequestStart { id: String, processed_at: Option<String> },
    #[serde(rename = "span.model_request_end")]
    ModelRequestEnd {
        id: String,
        processed_at: Option<String>,
        is_error: bool,
        model_request_start_id: String,
        #[schema(inline)]
        model_usage: ModelUsage,
    },
    #[serde(rename = "session.updated")]
    SessionUpdated {
        id: String,
        processed_at: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        title: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        #[schema(value_type = Option<HashMap<String, String>>)]
        metadata: Option<Metadata>,
    },
    #[serde(rename = "span.outcome_evaluation_start")]
    OutcomeEvaluationStart { id: String, processed_at: Option<String>, outcome_id: String, iteration: u32 },
    #[serde(rename = "span.outcome_evaluation_end")]
    OutcomeEvaluationEnd {
        id: String,
        processed_at: Option<String>,
        outcome_id: String,
        iteration: u32,
        result: String,
        explanation: String,
        outcome_evaluation_start_id: String,
        #[schema(inline)]
        usage: ModelUsage,
    },
    #[serde(rename = "session.deleted")]
    SessionDeleted { id: String, processed_at: Option<String> },
    #[serde(rename = "session.status_terminated")]
    Terminated { id: String, processed_at: Option<String> },
}

impl Event {
    /// Its type, as its frame's `event:` line names it.
    pub fn kind(&self) -> &'static str {
        match self {
            Event::UserMessage { .. } => "user.message",
            Event::UserInterrupt { .. } => "user.interrupt",
            Event::UserToolConfirmation { .. } => "user.tool_confirmation",
            Event::UserCustomToolResult { .. } => "user.custom_tool_result",
            Event::UserDefineOutcome { .. } => "user.define_outcome",
            Event::AgentMessage { .. } => "agent.message",
            Event::AgentThinking { .. } => "agent.thinking",
            Event::AgentMcpToolUse { .. } => "agent.mcp_tool_use",
            Event::AgentToolUse { .. } => "agent.tool_use",
            Event::AgentCustomToolUse { .. } => "agent.custom_tool_use",
            Event::AgentMcpToolResult { .. } => "agent.mcp_tool_result",
            Event::AgentToolResult { .. } => "agent.tool_result",
            Event::StatusRunning { .. } => "session.status_running",
            Event::StatusRescheduled { .. } => "session.status_rescheduled",
            Event::StatusIdle { .. } => "session.status_idle",
            Event::SessionError { .. } => "session.error",
            Event::ModelRequestStart { .. } => "span.model_request_start",
            Event::ModelRequestEnd { .. } => "span.model_request_end",
            Event::SessionUpdated { .. } => "session.updated",
            Event::OutcomeEvaluationStart { .. } => "span.outcome_evaluation_start",
            Event::OutcomeEvaluationEnd { .. } => "span.outcome_evaluation_end",
            Event::SessionDeleted { .. } => "session.deleted",
            Event::Terminated { .. } => "session.status_terminated",
        }
    }
}

/// `{"data": [...]}`: the events a send stored, as the SDK echoes them.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = ManagedSent)]
pub struct Sent {
    pub data: Vec<Event>,
}

/// A permission decision.
#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
#[schema(as = ManagedDecision)]
pub enum Decision {
    Allow,
    Deny,
}

/// How a server tool's call was let run.
#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Evaluated {
    Allow,
    Ask,
    Deny,
}

/// Why the session went idle, in the SDK's closed set.
#[derive(Debug, Serialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Stop {
    EndTurn,
    RequiresAction { event_ids: Vec<String> },
    Refusal,
    RetriesExhausted,
}

/// An outcome's rubric, as the client gave it: its text, or a file.
fn rubric_schema() -> Schema {
    crate::api::schema::schema(json!({"oneOf": [
        {"type": "object", "required": ["type", "content"],
         "properties": {"type": {"type": "string", "enum": ["text"]}, "content": {"type": "string"}}},
        {"type": "object", "required": ["type", "file_id"],
         "properties": {"type": {"type": "string", "enum": ["file"]}, "file_id": {"type": "string"}}},
    ]}))
}

#[derive(Debug, Serialize, ToSchema)]
pub struct SessionFailure {
    /// One of the SDK's session error types (`model_overloaded_error`, ...).
    #[serde(rename = "type")]
    pub kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mcp_server_name: Option<String>,
    pub message: String,
    #[schema(inline)]
    pub retry_status: RetryStatus,
}

/// turnlog retries a model request itself before it gives up: a failure it shows is final.
#[derive(Debug, Serialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum RetryStatus {
    Exhausted,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ModelUsage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cache_creation_input_tokens: u64,
    pub cache_read_input_tokens: u64,
}

/// A log event as the SDK's event union has it, or `None` for what this view never shows
/// (`session.created`, turns, deltas, archiving).
pub fn event(e: &crate::domain::Event) -> Option<Event> {
    user(e).or_else(|| agent(e)).or_else(|| session(e))
}

/// What the client sent, as it reads back.
fn user(e: &crate::domain::Event) -> Option<Event> {
    let id = e.id.to_string();
    let processed_at = e.processed_at.clone();
    Some(match &e.body {
        EventBody::UserMessage { content } => {
            Event::UserMessage { id, content: ContentBlock::shown(content, false), processed_at }
        }
        EventBody::UserInterrupt {} => Event::UserInterrupt { id, processed_at },
        EventBody::UserToolConfirmation { tool_use_id, result, deny_message, .. } => Event::UserToolConfirmation {
            id,
            tool_use_id: tool_use_id.clone(),
            result: match result {
                Confirmation::Allow => Decision::Allow,
                Confirmation::Deny => Decision::Deny,
            },
            deny_message: deny_message.clone(),
            processed_at,
        },
        EventBody::UserCustomToolResult { custom_tool_use_id, content, is_error, .. } => Event::UserCustomToolResult {
            id,
            custom_tool_use_id: custom_tool_use_id.clone(),
            content: ContentBlock::shown(content, true),
            is_error: *is_error,
            processed_at,
        },
        EventBody::UserDefineOutcome { outcome } => {
            outcome_event(id, outcome, processed_at.unwrap_or_else(|| e.created_at.clone()))
        }
        _ => return None,
    })
}

/// What the agent said and did.
fn agent(e: &crate::domain::Event) -> Option<Event> {
    let id = e.id.to_string();
    let processed_at = e.processed_at.clone();
    Some(match &e.body {
        EventBody::AgentMessage { message_id, content } => Event::AgentMessage {
            id: message_id.clone(),
            content: content.iter().filter(|b| b.kind == "text").cloned().map(ContentBlock).collect(),
            processed_at,
        },
        EventBody::AgentThinking { message_id, .. } => Event::AgentThinking { id: message_id.clone(), processed_at },
        EventBody::AgentToolUse { name, input, evaluated_permission, mcp, .. } => match mcp {
            Some(mcp) => Event::AgentMcpToolUse {
                id,
                name: mcp.tool.clone(),
                mcp_server_name: mcp.server.clone(),
                input: object(input),
                evaluated_permission: evaluated(*evaluated_permission),
                processed_at,
            },
            None => Event::AgentToolUse {
                id,
                name: name.clone(),
                input: object(input),
                evaluated_permission: evaluated(*evaluated_permission),
                processed_at,
            },
        },
        EventBody::AgentCustomToolUse { name, input, .. } => {
            Event::AgentCustomToolUse { id, name: name.clone(), input: object(input), processed_at }
        }
        EventBody::AgentToolResult { tool_use_id, content, is_error, mcp, .. } => {
            let (call, content, is_error) = (tool_use_id.to_string(), ContentBlock::shown(content, true), *is_error);
            match mcp {
                Some(_) => Event::AgentMcpToolResult { id, mcp_tool_use_id: call, content, is_error, processed_at },
                None => Event::AgentToolResult { id, tool_use_id: call, content, is_error, processed_at },
            }
        }
        _ => return None,
    })
}

/// Where the session is: its turns' starts and ends, model requests, changes, its end.
fn session(e: &crate::domain::Event) -> Option<Event> {
    let id = e.id.to_string();
    let processed_at = e.processed_at.clone();
    Some(match &e.body {
        EventBody::StatusRunning { .. } => Event::StatusRunning { id, processed_at },
        EventBody::TurnResumed { .. } => Event::StatusRescheduled { id, processed_at },
        EventBody::StatusIdle { stop_reason, .. } => {
            let stop = match stop_reason.kind {
                StopReason::RequiresAction => {
                    Stop::RequiresAction { event_ids: stop_reason.event_ids.iter().map(ToString::to_string).collect() }
                }
                StopReason::Refusal => Stop::Refusal,
                StopReason::Error => Stop::RetriesExhausted,
                // The SDK knows no other ends: a turn cancelled or cut short ended its turn.
                StopReason::EndTurn | StopReason::Cancelled | StopReason::MaxTokens | StopReason::MaxTurnRequests => {
                    Stop::EndTurn
                }
            };
            Event::StatusIdle { id, stop_reason: stop, processed_at }
        }
        EventBody::SessionError { error, code, mcp_server, .. } => {
            let kind = if mcp_server.is_some() { "mcp_connection_failed_error" } else { error_type(code) };
            let error = SessionFailure {
                kind,
                mcp_server_name: mcp_server.clone(),
                message: error.clone(),
                retry_status: RetryStatus::Exhausted,
            };
            Event::SessionError { id, processed_at, error }
        }
        EventBody::ModelRequestStart { .. } => Event::ModelRequestStart { id, processed_at },
        EventBody::ModelRequestEnd { usage, is_error, model_request_start_id, span_id, .. } => Event::ModelRequestEnd {
            id,
            processed_at,
            is_error: *is_error,
            // Logs written before the start's id was kept name the span instead.
            model_request_start_id: model_request_start_id.map_or_else(|| span_id.clone(), |s| s.to_string()),
            model_usage: ModelUsage {
                input_tokens: usage.input_tokens,
                output_tokens: usage.output_tokens,
                cache_creation_input_tokens: 0,
                cache_read_input_tokens: 0,
            },
        },
        EventBody::SessionUpdated { title, metadata, .. } => Event::SessionUpdated {
            id,
            processed_at,
            title: title.clone(),
            metadata: metadata.as_ref().map(string_map),
        },
        EventBody::OutcomeEvaluationStart { outcome_id, iteration } => {
            Event::OutcomeEvaluationStart { id, processed_at, outcome_id: outcome_id.clone(), iteration: *iteration }
        }
        EventBody::OutcomeEvaluationEnd {
            outcome_id,
            iteration,
            result,
            explanation,
            usage,
            outcome_evaluation_start_id,
            ..
        } => Event::OutcomeEvaluationEnd {
            id: id.clone(),
            processed_at,
            outcome_id: outcome_id.clone(),
            iteration: *iteration,
            result: result.clone(),
            explanation: explanation.clone(),
            outcome_evaluation_start_id: outcome_evaluation_start_id.map_or(id, |start| start.to_string()),
            usage: ModelUsage {
                input_tokens: usage.input_tokens,
                output_tokens: usage.output_tokens,
                cache_creation_input_tokens: 0,
                cache_read_input_tokens: 0,
            },
        },
        EventBody::SessionDeleted {} => Event::SessionDeleted { id, processed_at },
        EventBody::Terminated { .. } => Event::Terminated { id, processed_at },
        _ => return None,
    })
}

/// An outcome as `user.define_outcome`: turnlog keeps what the client sent; one sent
/// through another view without these fields shows as its text. Its `processed_at` is
/// never null (an outcome waits for nothing).
fn outcome_event(id: String, outcome: &Value, at: String) -> Event {
    let text = |field: &str| outcome.get(field).and_then(Value::as_str).map(String::from);
    let rubric = outcome.get("rubric").filter(|r| rubric_problem(r).is_none()).cloned();
    Event::UserDefineOutcome {
        outcome_id: text("outcome_id").unwrap_or_else(|| id.clone()),
        description: text("description").unwrap_or_else(|| outcome.to_string()),
        rubric: rubric.unwrap_or_else(|| json!({"type": "text", "content": ""})),
        max_iterations: outcome.get("max_iterations").cloned(),
        id,
        processed_at: Some(at),
    }
}

fn object(input: &Value) -> Value {
    if input.is_object() {
        input.clone()
    } else {
        json!({"input": input})
    }
}

fn evaluated(permission: Permission) -> Evaluated {
    match permission {
        Permission::Allow => Evaluated::Allow,
        Permission::Ask => Evaluated::Ask,
        Permission::Deny => Evaluated::Deny,
    }
}

/// turnlog's error codes as the SDK's closed set of session error types.
fn error_type(code: &str) -> &'static str {
    match code {
        "model_overloaded_error" => "model_overloaded_error",
        "model_rate_limited_error" => "model_rate_limited_error",
        code if code.starts_with("model_") => "model_request_failed_error",
        _ => "unknown_error",
    }
}

/// A stream's preview of what is on its way: `event_start` names a message (or thinking)
/// by the id its final event will have; `event_delta` brings more of a message's text.
#[derive(Debug, Serialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
#[schema(as = ManagedPreview)]
pub enum Preview {
    EventStart {
        #[schema(inline)]
        event: Announced,
    },
    EventDelta {
        event_id: String,
        #[schema(inline)]
        delta: ContentDelta,
    },
}

impl Preview {
    pub fn kind(&self) -> &'static str {
        match self {
            Preview::EventStart { .. } => "event_start",
            Preview::EventDelta { .. } => "event_delta",
        }
    }

    pub fn start(kind: &'static str, message_id: &str) -> Preview {
        Preview::EventStart { event: Announced { kind, id: message_id.to_string() } }
    }

    pub fn delta(message_id: &str, text: &str) -> Preview {
        Preview::EventDelta {
            event_id: message_id.to_string(),
            delta: ContentDelta::ContentDelta { content: TextContent::Text { text: text.to_string() }, index: 0 },
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Announced {
    /// `agent.message` or `agent.thinking`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub id: String,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentDelta {
    ContentDelta {
        #[schema(inline)]
        content: TextContent,
        index: u32,
    },
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum TextContent {
    Text { text: String },
}

/// What the view's stream sends: events, and the previews asked for.
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub enum Frame {
    Event(Event),
    Preview(Preview),
}

impl PartialSchema for Frame {
    fn schema() -> RefOr<Schema> {
        let mut one_of = utoipa::openapi::schema::OneOfBuilder::new();
        for name in [Event::name(), Preview::name()] {
            one_of = one_of.item(RefOr::Ref(utoipa::openapi::Ref::from_schema_name(name)));
        }
        RefOr::T(Schema::OneOf(one_of.build()))
    }
}

impl ToSchema for Frame {
    fn name() -> std::borrow::Cow<'static, str> {
        "ManagedFrame".into()
    }

    fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
        schemas.push((Event::name().into(), Event::schema()));
        Event::schemas(schemas);
        schemas.push((Preview::name().into(), Preview::schema()));
        Preview::schemas(schemas);
    }
}

/// Blocks that other views stored and the SDK could not read are left out.
impl ContentBlock {
    pub fn shown(blocks: &[Block], search_results: bool) -> Vec<ContentBlock> {
        blocks
            .iter()
            .filter(|b| super::wire::block_problem(b, search_results).is_none())
            .cloned()
            .map(ContentBlock)
            .collect()
    }
}
