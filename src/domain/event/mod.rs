//! The event envelope and the catalog of event types: the one format every view renders.
//!
//! An event is stored as the exact JSON bytes the native stream sends. The writer builds
//! the envelope (`id`, `type`, ids, sequence numbers, times) in front of the body that
//! a caller serialised, so replay never re-serialises and the type can be read from a
//! fixed offset without parsing.
//!
//! Here: the catalog of types ([`EventBody`]) and a decoded [`Event`]; [`content`]'s blocks,
//! [`spec`]'s setup of a session, and [`stored`]'s envelope, drafts and stored bytes.

mod content;
mod run;
mod spec;
mod stored;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

pub use content::{Block, File};
pub use run::{ClientRun, Diff, Location, TerminalRun};
pub use spec::{AgentSpec, ClientTool, ForkPoint, ReplayOf, SessionSpec, ToolTrust, DEFAULT_MODEL};
pub use stored::{timestamp_now, Draft, Envelope, RawEvent};

use super::ids::{EventId, SessionId, TurnId};

/// The version of the stored event format that each event follows ("The event format" in
/// docs/native.md says what each holds). Additive changes (a new optional field, a new event
/// type) keep it; a change that a reader of the last version would misread raises it, for
/// the events it concerns, and readers keep accepting every earlier version.
/// - 1: the format.
/// - 2: `processed_at` may be null: input stored while a turn ran, that no turn has taken
///   yet. Only such events carry 2.
pub const SCHEMA_VERSION: u32 = 1;
pub const SCHEMA_VERSION_QUEUED: u32 = 2;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
}

impl Usage {
    /// Tokens in `bytes` of text, by the rule of thumb turnlog estimates with (and the
    /// scripted model counts by): four bytes each. For what no provider reported: the
    /// input of a request, the output of one cut short.
    pub fn estimated_tokens(bytes: usize) -> u64 {
        bytes.div_ceil(4) as u64
    }
}

impl std::ops::AddAssign for Usage {
    fn add_assign(&mut self, other: Usage) {
        self.input_tokens += other.input_tokens;
        self.output_tokens += other.output_tokens;
    }
}

/// Why a turn stopped (`session.status_idle.stop_reason.type`). Read also under the
/// native view's names (`cancel`, `max_turns`), for the clients of that view.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    EndTurn,
    RequiresAction,
    MaxTokens,
    #[serde(alias = "max_turns")]
    MaxTurnRequests,
    Refusal,
    #[serde(alias = "cancel")]
    Cancelled,
    Error,
}

impl StopReason {
    /// The name the log gives it.
    pub fn as_str(self) -> &'static str {
        match self {
            StopReason::EndTurn => "end_turn",
            StopReason::RequiresAction => "requires_action",
            StopReason::MaxTokens => "max_tokens",
            StopReason::MaxTurnRequests => "max_turn_requests",
            StopReason::Refusal => "refusal",
            StopReason::Cancelled => "cancelled",
            StopReason::Error => "error",
        }
    }
}

/// How a model ended one response (`span.model_request_end.stop_reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ModelStop {
    EndTurn,
    ToolUse,
    MaxTokens,
    Refusal,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(from = "StopRead")]
pub struct StopInfo {
    #[serde(rename = "type")]
    pub kind: StopReason,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub event_ids: Vec<EventId>,
}

/// A stop as read: the native view names its protocol's reason in `type` and the log's
/// own in `detail` where they differ; the log's is the one kept.
#[derive(Deserialize)]
struct StopRead {
    #[serde(rename = "type")]
    kind: StopReason,
    #[serde(default)]
    detail: Option<StopReason>,
    #[serde(default)]
    event_ids: Vec<EventId>,
}

impl From<StopRead> for StopInfo {
    fn from(read: StopRead) -> StopInfo {
        StopInfo { kind: read.detail.unwrap_or(read.kind), event_ids: read.event_ids }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Permission {
    Allow,
    Ask,
    Deny,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Confirmation {
    Allow,
    Deny,
}

/// The MCP server and tool a call went to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct McpRef {
    pub server: String,
    pub tool: String,
}

/// One MCP server's tools as a turn listed them at its start: how the server is reached
/// (`stdio` or `streamable-http`) and the tools offered to the model, by the server's names.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct McpServerTools {
    pub server: String,
    pub transport: String,
    pub tools: Vec<String>,
}

/// Every event type, with its own fields. Serialised with `type` first (serde writes the
/// tag of an internally tagged enum before the fields), which the writer relies on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type")]
pub enum EventBody {
    #[serde(rename = "session.created")]
    SessionCreated {
        #[serde(flatten)]
        spec: SessionSpec,
        created_by: String,
    },
    #[serde(rename = "session.updated")]
    SessionUpdated {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        agent: Option<AgentSpec>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tools: Option<Vec<ClientTool>>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        title: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        metadata: Option<Map<String, Value>>,
        /// The agent's mode the session runs in from its next turn on.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mode: Option<String>,
        /// The model the session runs from its next turn on: one of its agent's `models`, or
        /// `default` (the agent's own).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        model: Option<String>,
    },
    #[serde(rename = "session.deleted")]
    SessionDeleted {},
    /// Kept and readable, but it takes no more input and lists only when asked for.
    #[serde(rename = "session.archived")]
    SessionArchived {},
    /// An agent definition made or changed through an API (a new version), in the catalog.
    #[serde(rename = "catalog.agent")]
    CatalogAgent { agent: super::catalog::AgentDefinition },
    #[serde(rename = "catalog.environment")]
    CatalogEnvironment { environment: super::catalog::Environment },
    #[serde(rename = "turn.started")]
    TurnStarted {},
    /// The queued user messages this turn answers (right after its `turn.started`).
    #[serde(rename = "turn.input")]
    TurnInput { event_ids: Vec<EventId> },
    #[serde(rename = "user.message")]
    UserMessage { content: Vec<Block> },
    #[serde(rename = "user.interrupt")]
    UserInterrupt {},
    /// The user asked that the conversation so far be compacted now: the turn it starts
    /// summarises it (`history.compacted`) and asks the model nothing else.
    #[serde(rename = "user.compact")]
    UserCompact {},
    #[serde(rename = "user.define_outcome")]
    UserDefineOutcome { outcome: Value },
    #[serde(rename = "user.tool_confirmation")]
    UserToolConfirmation {
        tool_use_id: String,
        result: Confirmation,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        deny_message: Option<String>,
        /// The model's id of the call (`tool_use_id` is its event's id).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tool_call_id: Option<String>,
        /// The decision holds for every later call of this tool in the session.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        remember: bool,
    },
    #[serde(rename = "user.custom_tool_result")]
    UserCustomToolResult {
        custom_tool_use_id: String,
        #[serde(default)]
        content: Vec<Block>,
        #[serde(default)]
        is_error: bool,
        /// The model's id of the call (`custom_tool_use_id` is its event's id).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tool_call_id: Option<String>,
        /// How the client ran it, where it says (see [`ClientRun`]).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        ran: Option<ClientRun>,
    },
    #[serde(rename = "session.status_running")]
    StatusRunning { status: String },
    #[serde(rename = "span.model_request_start")]
    ModelRequestStart {
        model: String,
        span_id: String,
        /// The request's input, estimated as it was sent ([`Usage::estimated_tokens`]): what
        /// a request cut short before its provider reported usage is counted to have used.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        input_tokens: Option<u64>,
    },
    #[serde(rename = "agent.thinking")]
    AgentThinking { message_id: String, thinking: String },
    #[serde(rename = "agent.thinking.delta")]
    AgentThinkingDelta { message_id: String, delta: String },
    #[serde(rename = "agent.message")]
    AgentMessage { message_id: String, content: Vec<Block> },
    #[serde(rename = "agent.message.delta")]
    AgentMessageDelta { message_id: String, delta: String },
    #[serde(rename = "agent.tool_use")]
    AgentToolUse {
        tool_call_id: String,
        name: String,
        input: Value,
        evaluated_permission: Permission,
        /// A tool of an MCP server: the server and the tool's own name (`name` is
        /// `<server>__<tool>`, as the model saw it).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mcp: Option<McpRef>,
        /// Whether running the call twice is safe (a read-only or idempotent tool): a
        /// turn resumed after its process stopped runs it again if it has no result, rather
        /// than answering that it was interrupted.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        idempotent: bool,
    },
    /// The MCP servers' tools a turn offers, listed as it starts.
    #[serde(rename = "agent.mcp_tools")]
    AgentMcpTools { servers: Vec<McpServerTools> },
    #[serde(rename = "agent.custom_tool_use")]
    AgentCustomToolUse {
        tool_call_id: String,
        name: String,
        input: Value,
        /// The session's mode asks the user before a call of this tool runs: the client
        /// that runs it asks first.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        ask: bool,
        /// One of the editor's tools (its files and terminals: see [`ClientTool::editor`]),
        /// run by the editor the session is open in.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        editor: bool,
    },
    #[serde(rename = "agent.tool_result")]
    AgentToolResult {
        tool_use_id: EventId,
        tool_call_id: String,
        content: Vec<Block>,
        #[serde(default)]
        is_error: bool,
        /// An MCP tool's structured result, as the server gave it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        structured_content: Option<Value>,
        /// The MCP server and tool that answered (as on its `agent.tool_use`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mcp: Option<McpRef>,
    },
    #[serde(rename = "span.model_request_end")]
    ModelRequestEnd {
        span_id: String,
        model: String,
        usage: Usage,
        #[serde(default)]
        is_error: bool,
        /// The id of the `span.model_request_start` this ends.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        model_request_start_id: Option<EventId>,
        /// How the model ended its response, when it did (not on a failed request).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        stop_reason: Option<ModelStop>,
        /// The model's context window in tokens, where the agent's config or the model's
        /// name says it: with `usage`, how full the context is after this request.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        context_window: Option<u64>,
        /// `usage` is turnlog's estimate, not the provider's: the request was cut short (an
        /// interrupt, a failure, the process stopping) before its provider reported it. The
        /// input as the request's start estimated it, the output from what it streamed.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        usage_estimated: bool,
    },
    #[serde(rename = "session.status_idle")]
    StatusIdle { status: String, stop_reason: StopInfo, usage: Usage },
    #[serde(rename = "session.error")]
    SessionError {
        error: String,
        code: String,
        /// The MCP server that could not be reached (code `mcp_unavailable`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mcp_server: Option<String>,
    },
    /// A turn whose process stopped goes on from its log: what the stopped process had
    /// streamed of messages it never finished is `discarded` (those message ids' deltas
    /// are retracted), the server calls it had started without a result are run again
    /// (`rerun`: safe to run twice) or answered as `interrupted`; `attempt` counts the
    /// resumptions of this turn.
    #[serde(rename = "turn.resumed")]
    TurnResumed {
        attempt: u32,
        reason: String,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        discarded: Vec<String>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        rerun: Vec<EventId>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        interrupted: Vec<EventId>,
    },
    /// The model's history made smaller to fit its context window: the first `messages`
    /// messages of the history (as folded up to here) are replaced by `summary` (`summary`),
    /// or keep their place with their tool outputs cut (`tool_outputs`). Only what the model
    /// reads changes: the log and the full history keep everything.
    #[serde(rename = "history.compacted")]
    HistoryCompacted {
        strategy: Compaction,
        messages: u32,
        #[serde(default, skip_serializing_if = "String::is_empty")]
        summary: String,
        /// The history's size for the model before and after, in tokens as estimated.
        tokens_before: u64,
        tokens_after: u64,
        /// What writing the summary cost.
        #[serde(default)]
        usage: Usage,
    },
    /// The turn (right after its `turn.started`) goes on from the conversation as it stood
    /// at the end of an earlier turn, `from`, rather than the last one: a branch. The turns
    /// after `from` stay in the log; the conversation from here on is `from`'s, then this.
    #[serde(rename = "turn.branched")]
    TurnBranched { from: TurnId },
    /// A grader model starts to evaluate the session's outcome (`user.define_outcome`)
    /// after a turn.
    #[serde(rename = "span.outcome_evaluation_start")]
    OutcomeEvaluationStart { outcome_id: String, iteration: u32 },
    /// Its verdict: `satisfied`, `needs_revision` (evaluated again after the next turn),
    /// `max_iterations_reached`, `failed` or `interrupted`; with what it cost.
    #[serde(rename = "span.outcome_evaluation_end")]
    OutcomeEvaluationEnd {
        outcome_id: String,
        iteration: u32,
        /// The outcome's description, so that the verdict reads alone.
        description: String,
        result: String,
        explanation: String,
        usage: Usage,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        outcome_evaluation_start_id: Option<EventId>,
    },
    #[serde(rename = "terminated")]
    Terminated { reason: String },
}

/// How a compaction made the history smaller.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Compaction {
    /// The model summarised the oldest messages.
    Summary,
    /// Tool outputs of the oldest messages were cut.
    ToolOutputs,
}

impl EventBody {
    /// Every event type, as written in `type` (a browser's `EventSource` needs a listener
    /// per name).
    pub const TYPES: &'static [&'static str] = &[
        "session.created",
        "session.updated",
        "session.deleted",
        "session.archived",
        "catalog.agent",
        "catalog.environment",
        "turn.started",
        "turn.input",
        "user.message",
        "user.interrupt",
        "user.compact",
        "user.define_outcome",
        "user.tool_confirmation",
        "user.custom_tool_result",
        "session.status_running",
        "span.model_request_start",
        "agent.thinking",
        "agent.thinking.delta",
        "agent.message",
        "agent.message.delta",
        "agent.tool_use",
        "agent.mcp_tools",
        "agent.custom_tool_use",
        "agent.tool_result",
        "span.model_request_end",
        "session.status_idle",
        "session.error",
        "turn.resumed",
        "history.compacted",
        "turn.branched",
        "span.outcome_evaluation_start",
        "span.outcome_evaluation_end",
        "terminated",
    ];

    /// A piece of a message still being said (`agent.message.delta`, `agent.thinking.delta`).
    pub fn is_delta(&self) -> bool {
        matches!(self, EventBody::AgentMessageDelta { .. } | EventBody::AgentThinkingDelta { .. })
    }

    /// Whether a client sent this (rather than the agent or the service writing it).
    pub fn is_user_input(&self) -> bool {
        matches!(
            self,
            EventBody::UserMessage { .. }
                | EventBody::UserInterrupt {}
                | EventBody::UserCompact {}
                | EventBody::UserDefineOutcome { .. }
                | EventBody::UserToolConfirmation { .. }
                | EventBody::UserCustomToolResult { .. }
        )
    }
}

/// A decoded event: the envelope and the type's own fields.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    pub id: EventId,
    pub session_id: SessionId,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn_id: Option<TurnId>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn_sequence_number: Option<u32>,
    pub sequence_number: u64,
    pub created_at: String,
    /// `None` for queued input no turn has taken yet.
    pub processed_at: Option<String>,
    pub schema_version: u32,
    #[serde(flatten)]
    pub body: EventBody,
}

#[cfg(test)]
mod tests;
