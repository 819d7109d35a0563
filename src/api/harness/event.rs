//! What the harness shows of a turn, as `truefoundry-gateway-sdk`'s models have it: the
//! turn's events ([`TurnEvent`], one union by `type`), the `Turn` object and its state, and
//! the input items a turn shows it took. [`super::fold::TurnFold`] makes them from the log.

use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;

use crate::domain::{Block, Usage as LogUsage};

/// The one thread of a turnlog session (the harness names sub-agents' threads otherwise).
pub const THREAD: &str = "main";

/// A harness event of a turn: a stream's frame, or an item of a list.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(tag = "type")]
#[schema(as = HarnessTurnEvent)]
pub enum TurnEvent {
    #[serde(rename = "turn.created")]
    TurnCreated(TurnCreated),
    /// A model response: empty (its first frame on a stream, naming it), or whole (in lists).
    #[serde(rename = "model.message")]
    ModelMessage(ModelMessage),
    #[serde(rename = "model.message.delta")]
    ModelMessageDelta(MessageDelta),
    #[serde(rename = "mcp.initialize")]
    McpInitialize(McpInitialize),
    #[serde(rename = "tool.response")]
    ToolResponse(ToolResponse),
    #[serde(rename = "tool.approval_required")]
    ApprovalRequired(Action),
    #[serde(rename = "tool.response_required")]
    ResponseRequired(Action),
    #[serde(rename = "turn.done")]
    TurnDone(TurnDone),
}

impl TurnEvent {
    /// Its type, as its frame's `event:` line names it.
    pub fn kind(&self) -> &'static str {
        match self {
            TurnEvent::TurnCreated(_) => "turn.created",
            TurnEvent::ModelMessage(_) => "model.message",
            TurnEvent::ModelMessageDelta(_) => "model.message.delta",
            TurnEvent::McpInitialize(_) => "mcp.initialize",
            TurnEvent::ToolResponse(_) => "tool.response",
            TurnEvent::ApprovalRequired(_) => "tool.approval_required",
            TurnEvent::ResponseRequired(_) => "tool.response_required",
            TurnEvent::TurnDone(_) => "turn.done",
        }
    }
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TurnCreated {
    pub id: String,
    pub turn_id: String,
    pub previous_turn_id: Option<String>,
    pub input: Vec<InputItem>,
    pub state: TurnState,
    pub created_by: Subject,
    pub created_at: String,
    /// Always null: the turn is the session's, not a thread's.
    #[schema(value_type = Option<String>)]
    pub thread_id: Option<()>,
}

/// A model message: what one model request said and called.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ModelMessage {
    pub id: String,
    pub thread_id: &'static str,
    pub created_at: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finish_reason: Option<FinishReason>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

/// A whole model message where it stands apart from the turn's events (a turn's
/// `output`): with its `type`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Output {
    #[serde(rename = "type")]
    pub kind: ModelMessageTag,
    #[serde(flatten)]
    pub message: ModelMessage,
}

#[derive(Debug, Clone, Copy, Default, Serialize, ToSchema)]
pub enum ModelMessageTag {
    #[default]
    #[serde(rename = "model.message")]
    ModelMessage,
}

/// More of a model message: text, reasoning, a tool call, or how it ended and its usage.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct MessageDelta {
    pub id: String,
    pub thread_id: &'static str,
    pub created_at: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCallDelta>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finish_reason: Option<FinishReason>,
}

/// How a model response ended, in the chat-completions words the harness uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    Stop,
    Length,
    ContentFilter,
    ToolCalls,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ToolCall {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: FunctionTag,
    pub function: Function,
    pub tool_info: ToolInfo,
}

/// A tool call as a delta names it: with its place among the message's calls.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ToolCallDelta {
    pub index: usize,
    #[serde(flatten)]
    pub call: ToolCall,
}

#[derive(Debug, Clone, Copy, Default, Serialize, ToSchema)]
pub enum FunctionTag {
    #[default]
    #[serde(rename = "function")]
    Function,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Function {
    pub name: String,
    /// The input, as JSON text.
    pub arguments: String,
}

/// Where a tool comes from: the server's own (or the client's), or an MCP server's.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(tag = "type")]
pub enum ToolInfo {
    #[serde(rename = "truefoundry-system")]
    System { name: String },
    #[serde(rename = "mcp")]
    Mcp { server_id: String, server_name: String, name: String },
}

/// Usage as the harness reports it. turnlog does not break input tokens down by where they
/// came from: all of them count as `messages`.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[schema(as = HarnessUsage)]
pub struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub input_tokens_breakdown: Breakdown,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Breakdown {
    pub harness: u64,
    pub skills: u64,
    pub instructions: u64,
    pub tool_definitions: u64,
    pub messages: u64,
}

impl From<LogUsage> for Usage {
    fn from(usage: LogUsage) -> Usage {
        Usage {
            input_tokens: usage.input_tokens,
            output_tokens: usage.output_tokens,
            input_tokens_breakdown: Breakdown {
                harness: 0,
                skills: 0,
                instructions: 0,
                tool_definitions: 0,
                messages: usage.input_tokens,
            },
        }
    }
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct McpInitialize {
    pub id: String,
    pub thread_id: &'static str,
    pub created_at: String,
    pub mcp_servers: Vec<McpServer>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
#[schema(as = HarnessMcpServer)]
pub struct McpServer {
    pub id: String,
    pub name: String,
    /// The SDK knows the HTTP transports only; stdio goes unnamed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub transport_type: Option<String>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ToolResponse {
    pub id: String,
    pub thread_id: &'static str,
    pub created_at: String,
    pub tool_call_id: String,
    pub content: String,
}

/// What a stopped turn waits for: approvals, or the client's results, for these calls.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Action {
    pub id: String,
    pub created_at: String,
    pub thread_id: &'static str,
    pub tool_calls: Vec<CallRef>,
}

/// A waiting call, and the message that made it.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct CallRef {
    pub id: String,
    pub source_event_id: String,
}

/// A waiting action, as a turn's state lists it.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(tag = "type")]
pub enum RequiredAction {
    #[serde(rename = "tool.approval_required")]
    Approval(Action),
    #[serde(rename = "tool.response_required")]
    Response(Action),
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TurnDone {
    pub id: String,
    pub state: TurnState,
    pub created_at: String,
    #[schema(value_type = Option<String>)]
    pub thread_id: Option<()>,
}

/// Where a turn is: running, or how it ended.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum TurnState {
    Running,
    Cancelled {
        /// `client-cancelled`, or `abandoned` when the server stopped it.
        reason: &'static str,
        completed_at: String,
        metrics: Metrics,
    },
    Error {
        message: String,
        completed_at: String,
        metrics: Metrics,
    },
    Done {
        /// The turn's last message, whole.
        output: Option<Box<Output>>,
        required_actions: Vec<RequiredAction>,
        completed_at: String,
        metrics: Metrics,
    },
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Metrics {
    pub total_input_tokens: u64,
    pub total_output_tokens: u64,
    pub total_tokens: u64,
}

/// A turn as the SDK's `Turn` model has it.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = HarnessTurn)]
pub struct Turn {
    pub id: String,
    pub session_id: String,
    pub previous_turn_id: Option<String>,
    pub input: Vec<InputItem>,
    pub state: TurnState,
    pub created_by_subject: Subject,
    /// Null only before the turn's first event is read.
    pub created_at: Option<String>,
}

/// Who made a session (a harness subject).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Subject {
    pub subject_id: String,
    pub subject_type: SubjectType,
    pub subject_slug: String,
}

#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum SubjectType {
    User,
}

impl Subject {
    pub fn named(name: &str) -> Subject {
        Subject { subject_id: name.into(), subject_type: SubjectType::User, subject_slug: name.into() }
    }
}

/// An item of a turn's input: a user message, an approval, or a tool's result.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(tag = "type")]
#[schema(as = HarnessInputItem)]
pub enum InputItem {
    #[serde(rename = "user.message")]
    Message { content: MessageContent },
    #[serde(rename = "user.tool_approval")]
    ToolApproval { thread_id: &'static str, tool_call_id: String, approval: Approval },
    #[serde(rename = "user.tool_response")]
    ToolResponse { thread_id: &'static str, tool_call_id: String, content: String },
}

#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum Approval {
    Allow,
    Deny {
        /// Told to the model.
        #[serde(skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
}

/// A message's content: a string, or `text` and `file` parts.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(untagged)]
pub enum MessageContent {
    Text(String),
    Parts(Vec<Part>),
}

#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Part {
    Text {
        text: String,
    },
    File {
        name: String,
        /// A data URI: `data:<mime>;base64,<payload>`.
        data: String,
    },
}

impl MessageContent {
    /// A user message's content as the harness reads it: one text block as a string (as
    /// it was most likely sent), else text and `file` parts. Content other views stored
    /// (images and documents with their data inline) shows as `file` parts; what has no
    /// such form is left out.
    pub fn of(blocks: &[Block]) -> MessageContent {
        if let [block] = blocks {
            if block.kind == "text" {
                return MessageContent::Text(block.text.clone().unwrap_or_default());
            }
        }
        MessageContent::Parts(blocks.iter().filter_map(part).collect())
    }
}

fn part(block: &Block) -> Option<Part> {
    let string = |field: &str| block.rest.get(field).and_then(Value::as_str).map(String::from);
    match block.kind.as_str() {
        "text" => Some(Part::Text { text: block.text.clone().unwrap_or_default() }),
        "file" => Some(Part::File { name: string("name")?, data: string("data")? }),
        "image" | "document" => {
            let source = block.rest.get("source")?;
            if source.get("type")?.as_str()? != "base64" {
                return None;
            }
            let (mime, data) = (source.get("media_type")?.as_str()?, source.get("data")?.as_str()?);
            Some(Part::File { name: block.kind.clone(), data: format!("data:{mime};base64,{data}") })
        }
        _ => None,
    }
}
