//! The event envelope and the catalog of event types: the one format every view renders.
//!
//! An event is stored as the exact JSON bytes the native stream sends. The writer builds
//! the envelope (`id`, `type`, ids, sequence numbers, times) in front of the body that
//! a caller serialised, so replay never re-serialises and the type can be read from a
//! fixed offset without parsing.

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

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

/// A content block (`{"type":"text","text":"..."}`, images, documents, ...). Only text is
/// interpreted; every other block is kept as it came.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Block {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

impl Block {
    pub fn text(text: impl Into<String>) -> Self {
        Block { kind: "text".into(), text: Some(text.into()), rest: Map::new() }
    }

    /// The text of all text blocks, joined.
    pub fn join_text(blocks: &[Block]) -> String {
        blocks.iter().filter_map(|b| b.text.as_deref()).collect::<Vec<_>>().join("")
    }

    /// Binary content a model provider may take, from the shapes clients send it in: a
    /// `file` block (the agent harness: `name`, and `data` as `data:<mime>;base64,<payload>`),
    /// an ACP `image` (`data` in base64, `mimeType`) or an ACP `resource` holding a `blob`.
    pub fn file(&self) -> Option<File<'_>> {
        fn text<'a>(map: &'a Map<String, Value>, key: &str) -> Option<&'a str> {
            map.get(key).and_then(Value::as_str)
        }
        match self.kind.as_str() {
            "file" => {
                let name = text(&self.rest, "name")?;
                let (mime, base64) = text(&self.rest, "data")?.strip_prefix("data:")?.split_once(";base64,")?;
                Some(File { name, mime: bare_mime(mime), base64 })
            }
            "image" => {
                let base64 = text(&self.rest, "data")?;
                let mime = bare_mime(text(&self.rest, "mimeType")?);
                Some(File { name: text(&self.rest, "uri").unwrap_or("image"), mime, base64 })
            }
            "resource" => {
                let resource = self.rest.get("resource")?.as_object()?;
                let base64 = text(resource, "blob")?;
                let mime = bare_mime(text(resource, "mimeType").unwrap_or("application/octet-stream"));
                Some(File { name: text(resource, "uri").unwrap_or("resource"), mime, base64 })
            }
            _ => None,
        }
    }

    /// Context a client attached as text (ACP's embedded text `resource` and its
    /// `resource_link`), as a model reads it.
    pub fn context(&self) -> Option<String> {
        let text = |map: &Map<String, Value>, key: &str| map.get(key).and_then(Value::as_str).map(str::to_string);
        match self.kind.as_str() {
            "resource" => {
                let resource = self.rest.get("resource")?.as_object()?;
                let (uri, body) = (text(resource, "uri").unwrap_or_default(), text(resource, "text")?);
                Some(format!("<resource uri=\"{uri}\">\n{body}\n</resource>"))
            }
            "resource_link" => {
                let uri = text(&self.rest, "uri")?;
                let name = text(&self.rest, "name").unwrap_or_else(|| uri.clone());
                Some(format!("[{name}]({uri})"))
            }
            _ => None,
        }
    }
}

/// `image/png`, without parameters such as `;charset=utf-8`.
fn bare_mime(mime: &str) -> &str {
    mime.split(';').next().unwrap_or_default().trim()
}

/// A file a user message carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct File<'a> {
    pub name: &'a str,
    /// The MIME type without its parameters, as sent (compare without case).
    pub mime: &'a str,
    pub base64: &'a str,
}

impl File<'_> {
    /// The file as a `data:` URI.
    pub fn data_uri(&self) -> String {
        format!("data:{};base64,{}", self.mime, self.base64)
    }

    /// What a model is told in place of a file its API cannot take.
    pub fn unsupported(&self, takes: &str) -> String {
        format!("[file {} ({}) left out: this model takes {takes}]", self.name, self.mime)
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
}

impl std::ops::AddAssign for Usage {
    fn add_assign(&mut self, other: Usage) {
        self.input_tokens += other.input_tokens;
        self.output_tokens += other.output_tokens;
    }
}

/// Why a turn stopped (`session.status_idle.stop_reason.type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    EndTurn,
    RequiresAction,
    MaxTokens,
    MaxTurnRequests,
    Refusal,
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
pub struct StopInfo {
    #[serde(rename = "type")]
    pub kind: StopReason,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub event_ids: Vec<EventId>,
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

/// How a session was created, in no view's dialect: every view maps its own request to it
/// and renders it back in its own shape.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SessionSpec {
    pub agent: AgentSpec,
    /// Tools the client declared (run by the client).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<ClientTool>,
    /// Seed history.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub messages: Vec<super::Message>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub metadata: Map<String, Value>,
    /// Where the agent runs (a catalog environment), when the client named one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub environment_id: Option<String>,
    /// The session this one was forked from, and where.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forked_from: Option<ForkPoint>,
    /// The session whose events this one re-emits, at their pace divided by `speed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay_of: Option<ReplayOf>,
}

/// What a replay session re-emits: the source, the event it starts at (its history before
/// that is the replay's seed history), and the speed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReplayOf {
    pub session_id: super::SessionId,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<super::EventId>,
    pub speed: f64,
}

/// Where a fork was made: the source session, the event its history runs to, and the
/// source's chain head there (the hash of that event), so the fork names exactly what it
/// continues.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ForkPoint {
    pub session_id: super::SessionId,
    pub event_id: super::EventId,
    pub sequence_number: u64,
    pub hash: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AgentSpec {
    /// A configured agent's name, or a catalog agent's id.
    pub name: String,
    /// The catalog agent's version the session runs (config agents have none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<u32>,
    /// Server tools enabled for this session, with the trust the client gave them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<ToolTrust>>,
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub options: Map<String, Value>,
}

/// A tool the client declares and runs itself. Each view maps its wire shape to this one
/// (`parameters`, `inputSchema`, `input_schema`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClientTool {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    #[serde(default)]
    pub description: String,
    /// JSON Schema of the input object. Stored as `parameters`, the name the log has used
    /// from its first version: the stored format (and the native stream, which shows it)
    /// does not change with the type's name.
    #[serde(rename = "parameters", alias = "input_schema", default = "ClientTool::any_object")]
    pub input_schema: Value,
}

impl ClientTool {
    /// The schema of a tool that declares none: any object.
    pub fn any_object() -> Value {
        serde_json::json!({"type": "object", "properties": {}})
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolTrust {
    pub name: String,
    #[serde(default)]
    pub trust: bool,
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
    },
    #[serde(rename = "session.status_running")]
    StatusRunning { status: String },
    #[serde(rename = "span.model_request_start")]
    ModelRequestStart { model: String, span_id: String },
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
    },
    /// The MCP servers' tools a turn offers, listed as it starts.
    #[serde(rename = "agent.mcp_tools")]
    AgentMcpTools { servers: Vec<McpServerTools> },
    #[serde(rename = "agent.custom_tool_use")]
    AgentCustomToolUse { tool_call_id: String, name: String, input: Value },
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
    #[serde(rename = "terminated")]
    Terminated { reason: String },
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

/// What a caller asks to append: the body already serialised (off the writer's thread)
/// and the turn it belongs to. The writer adds the envelope.
#[derive(Debug, Clone)]
pub struct Draft {
    pub turn: Option<TurnId>,
    body: Bytes,
    kind_end: usize,
    /// Input stored while a turn runs, answered by a later one: `processed_at` is null
    /// until a `turn.input` names it.
    queued: bool,
}

const TYPE_PREFIX: &[u8] = b"{\"type\":\"";

impl Draft {
    pub fn new(turn: Option<TurnId>, body: &EventBody) -> Draft {
        let body = Bytes::from(serde_json::to_vec(body).expect("event bodies always serialise"));
        let kind_end =
            TYPE_PREFIX.len() + body[TYPE_PREFIX.len()..].iter().position(|&b| b == b'"').expect("a type tag");
        Draft { turn, body, kind_end, queued: false }
    }

    /// Input that waits for the running turn to end (`processed_at` null).
    pub fn queued(body: &EventBody) -> Draft {
        Draft { queued: true, ..Draft::new(None, body) }
    }

    pub fn is_queued(&self) -> bool {
        self.queued
    }

    /// The serialised body, as [`Draft::from_body`] takes it (to hand a draft to another node).
    pub fn body(&self) -> &[u8] {
        &self.body
    }

    /// A draft of a body serialised by [`Draft::new`] elsewhere; `None` if it is not one.
    pub fn from_body(turn: Option<TurnId>, body: Bytes, queued: bool) -> Option<Draft> {
        let rest = body.strip_prefix(TYPE_PREFIX)?;
        let kind_end = TYPE_PREFIX.len() + rest.iter().position(|&b| b == b'"')?;
        serde_json::from_slice::<EventBody>(&body).ok()?;
        Some(Draft { turn, body, kind_end, queued })
    }

    pub fn kind(&self) -> &str {
        std::str::from_utf8(&self.body[TYPE_PREFIX.len()..self.kind_end]).expect("utf-8")
    }

    /// The body's own fields after the type: `,"content":[...]}` or `}`.
    pub fn fields(&self) -> &[u8] {
        &self.body[self.kind_end + 1..]
    }

    pub fn len(&self) -> usize {
        self.body.len()
    }

    pub fn is_empty(&self) -> bool {
        self.body.is_empty()
    }
}

/// A stored event as bytes, with the two facts the hot paths need without parsing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawEvent {
    pub id: EventId,
    pub seq: u64,
    pub json: Bytes,
}

/// `{"id":"evt_` + 26 ULID characters + `","type":"`: where the writer puts the type.
const KIND_OFFSET: usize = 7 + 4 + 26 + 10;

impl RawEvent {
    /// A stored event: its id (from its key) and its bytes, exactly as stored.
    pub fn stored(id: EventId, json: Bytes) -> RawEvent {
        let seq = Head::read(&json).map_or(0, |head| head.seq);
        RawEvent { id, seq, json }
    }

    /// The turn the event belongs to and its number in it, read from the envelope.
    pub fn turn(&self) -> Option<(TurnId, u32)> {
        Head::read(&self.json)?.turn
    }

    /// The event type, read from where the writer put it.
    pub fn kind(&self) -> &str {
        let rest = self.json.get(KIND_OFFSET..).unwrap_or_default();
        let end = rest.iter().position(|&b| b == b'"').unwrap_or(0);
        std::str::from_utf8(&rest[..end]).unwrap_or("")
    }

    pub fn decode(&self) -> Result<Event, serde_json::Error> {
        serde_json::from_slice(&self.json)
    }

    pub fn is_delta(&self) -> bool {
        self.kind().ends_with(".delta")
    }
}

/// The numbers of an envelope, read where [`Envelope::write`] puts them: after the type,
/// `,"session_id":"sess_…"`, then inside a turn `,"turn_id":"turn_…","turn_sequence_number":N`,
/// then `,"sequence_number":N`. Fixed offsets, no scanning: every read of the log does this.
struct Head {
    turn: Option<(TurnId, u32)>,
    seq: u64,
}

impl Head {
    const SESSION: &'static [u8] = b"\",\"session_id\":\"sess_";
    const TURN: &'static [u8] = b"\",\"turn_id\":\"turn_";
    const TURN_NUMBER: &'static [u8] = b"\",\"turn_sequence_number\":";
    const SEQ: &'static [u8] = b",\"sequence_number\":";
    const ULID: usize = 26;

    fn read(json: &[u8]) -> Option<Head> {
        let kind_end = KIND_OFFSET + json.get(KIND_OFFSET..)?.iter().position(|&b| b == b'"')?;
        let rest = json.get(kind_end..)?.strip_prefix(Head::SESSION)?.get(Head::ULID..)?;
        let (turn, rest) = match rest.strip_prefix(Head::TURN) {
            Some(turn) => {
                let id = std::str::from_utf8(turn.get(..Head::ULID)?).ok()?;
                let id = TurnId(ulid::Ulid::from_string(id).ok()?);
                let (number, rest) = number(turn.get(Head::ULID..)?.strip_prefix(Head::TURN_NUMBER)?)?;
                (Some((id, u32::try_from(number).ok()?)), rest)
            }
            None => (None, rest.strip_prefix(b"\"")?),
        };
        let (seq, _) = number(rest.strip_prefix(Head::SEQ)?)?;
        Some(Head { turn, seq })
    }
}

/// The unsigned number at the start of `bytes`, and what follows it.
fn number(bytes: &[u8]) -> Option<(u64, &[u8])> {
    let len = bytes.iter().take_while(|b| b.is_ascii_digit()).count();
    let value = bytes[..len].iter().try_fold(0u64, |n, b| n.checked_mul(10)?.checked_add(u64::from(b - b'0')))?;
    (len > 0).then_some((value, &bytes[len..]))
}

/// Writes the envelope of an event in front of its fields. Field order is fixed: `id`
/// then `type` first, which [`RawEvent::kind`] relies on.
pub struct Envelope<'a> {
    pub id: EventId,
    pub session: SessionId,
    pub turn: Option<(TurnId, u32)>,
    pub seq: u64,
    pub now: &'a str,
}

impl Envelope<'_> {
    pub fn write(&self, draft: &Draft) -> Bytes {
        use std::io::Write;
        let mut out = Vec::with_capacity(draft.len() + 256);
        write!(out, "{{\"id\":\"{}\",\"type\":\"{}\",\"session_id\":\"{}\"", self.id, draft.kind(), self.session)
            .expect("writing to a Vec");
        if let Some((turn, turn_seq)) = self.turn {
            write!(out, ",\"turn_id\":\"{turn}\",\"turn_sequence_number\":{turn_seq}").expect("vec");
        }
        write!(out, ",\"sequence_number\":{},\"created_at\":\"{}\"", self.seq, self.now).expect("vec");
        let version = if draft.is_queued() {
            out.extend_from_slice(QUEUED);
            SCHEMA_VERSION_QUEUED
        } else {
            write!(out, ",\"processed_at\":\"{}\"", self.now).expect("vec");
            SCHEMA_VERSION
        };
        write!(out, ",\"schema_version\":{version}").expect("vec");
        out.extend_from_slice(draft.fields());
        Bytes::from(out)
    }
}

const QUEUED: &[u8] = b",\"processed_at\":null";

impl RawEvent {
    /// Queued input as it reads once a turn has taken it: `processed_at` set to `at`.
    pub fn processed(&self, at: &str) -> RawEvent {
        let Some(position) = self.json.windows(QUEUED.len()).position(|w| w == QUEUED) else { return self.clone() };
        let mut json = Vec::with_capacity(self.json.len() + at.len() + 2);
        json.extend_from_slice(&self.json[..position]);
        json.extend_from_slice(format!(",\"processed_at\":\"{at}\"").as_bytes());
        json.extend_from_slice(&self.json[position + QUEUED.len()..]);
        RawEvent { json: Bytes::from(json), ..self.clone() }
    }

    /// When the event was stored (`created_at`), read from the envelope.
    pub fn created_at(&self) -> Option<&str> {
        const FIELD: &[u8] = b",\"created_at\":\"";
        let at = self.json.windows(FIELD.len()).position(|w| w == FIELD)? + FIELD.len();
        let end = at + self.json[at..].iter().position(|&b| b == b'"')?;
        std::str::from_utf8(&self.json[at..end]).ok()
    }

    /// Whether this is input still waiting for a turn (as stored): the envelope's
    /// `processed_at`, the field just before its `schema_version`, is null. (The first
    /// `,"schema_version":` is the envelope's: a body's strings escape their quotes.)
    pub fn is_queued(&self) -> bool {
        const VERSION: &[u8] = b",\"schema_version\":";
        let head = self.json.windows(VERSION.len()).position(|w| w == VERSION).map(|end| &self.json[..end]);
        head.is_some_and(|head| head.ends_with(QUEUED))
    }
}

/// RFC 3339 with microseconds, in UTC.
pub fn timestamp_now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
}

#[cfg(test)]
mod tests {
    #[test]
    fn types_names_every_variant_once() {
        // serde names every variant when it meets an unknown one.
        let error = serde_json::from_str::<EventBody>(r#"{"type":"?"}"#).unwrap_err().to_string();
        let mut variants: Vec<&str> = error.split('`').skip(3).step_by(2).collect();
        let mut listed = EventBody::TYPES.to_vec();
        variants.sort_unstable();
        listed.sort_unstable();
        assert_eq!(listed, variants, "{error}");
    }

    use super::*;
    use ulid::Ulid;

    #[test]
    fn envelope_and_body_make_one_event_that_decodes() {
        let body = EventBody::UserMessage { content: vec![Block::text("hi")] };
        let draft = Draft::new(None, &body);
        assert_eq!(draft.kind(), "user.message");
        let id = EventId(Ulid::new());
        let session = SessionId(Ulid::new());
        let turn = TurnId(Ulid::new());
        let json =
            Envelope { id, session, turn: Some((turn, 3)), seq: 7, now: "2026-01-01T00:00:00.000000Z" }.write(&draft);
        let (id_ulid, session_ulid, turn_ulid) = (id.ulid(), session.ulid(), turn.ulid());
        let head = format!(
            "{{\"id\":\"evt_{id_ulid}\",\"type\":\"user.message\",\"session_id\":\"sess_{session_ulid}\",\"turn_id\":\"turn_{turn_ulid}\",\
             \"turn_sequence_number\":3,\"sequence_number\":7,\"created_at\":\"2026-01-01T00:00:00.000000Z\",\
             \"processed_at\":\"2026-01-01T00:00:00.000000Z\",\"schema_version\":1,\"content\":"
        );
        assert!(json.starts_with(head.as_bytes()), "{}", String::from_utf8_lossy(&json));
        let raw = RawEvent::stored(id, json);
        assert_eq!(raw.seq, 7);
        assert_eq!(raw.turn(), Some((turn, 3)));
        assert_eq!(raw.kind(), "user.message");
        let event = raw.decode().unwrap();
        assert_eq!(event.id, id);
        assert_eq!(event.session_id, session);
        assert_eq!(event.turn_id, Some(turn));
        assert_eq!(event.turn_sequence_number, Some(3));
        assert_eq!(event.sequence_number, 7);
        assert_eq!(event.body, body);
    }

    #[test]
    fn a_body_with_no_fields_still_makes_valid_json() {
        let draft = Draft::new(None, &EventBody::SessionDeleted {});
        let id = EventId(Ulid::new());
        let json = Envelope { id, session: SessionId(Ulid::new()), turn: None, seq: 1, now: "t" }.write(&draft);
        let value: Value = serde_json::from_slice(&json).unwrap();
        assert_eq!(value["type"], "session.deleted");
        let raw = RawEvent::stored(id, json);
        assert_eq!((raw.kind(), raw.seq, raw.turn()), ("session.deleted", 1, None));
    }

    #[test]
    fn a_body_field_named_like_the_envelope_is_not_read_as_it() {
        let body =
            EventBody::UserDefineOutcome { outcome: serde_json::json!({"turn_id": "turn_x", "n": ",\"turn_id\":\""}) };
        let id = EventId(Ulid::new());
        let json = Envelope { id, session: SessionId(Ulid::new()), turn: None, seq: 12, now: "t" }
            .write(&Draft::new(None, &body));
        let raw = RawEvent::stored(id, json);
        assert_eq!((raw.seq, raw.turn()), (12, None));
    }

    #[test]
    fn a_cut_or_foreign_envelope_reads_as_nothing_rather_than_wrong() {
        let turn = TurnId(Ulid::new());
        let id = EventId(Ulid::new());
        let draft = Draft::new(Some(turn), &EventBody::UserInterrupt {});
        let json =
            Envelope { id, session: SessionId(Ulid::new()), turn: Some((turn, 9)), seq: 41, now: "t" }.write(&draft);
        for end in 0..json.len() {
            let cut = RawEvent::stored(id, json.slice(..end));
            // Cut inside a number, the envelope may read as a shorter number; never anything else.
            assert!(cut.turn().is_none_or(|(of, n)| of == turn && "9".starts_with(&n.to_string())));
        }
        let foreign = RawEvent::stored(id, Bytes::from_static(br#"{"sequence_number":3,"turn_id":"x"}"#));
        assert_eq!((foreign.seq, foreign.turn()), (0, None));
    }

    #[test]
    fn queued_input_is_known_at_any_sequence_number_and_reads_processed_later() {
        let body = EventBody::UserMessage { content: vec![Block::text(",\"processed_at\":null")] };
        for seq in [1, 9, 10, 12_345_678_901] {
            let id = EventId(Ulid::new());
            let json = Envelope { id, session: SessionId(Ulid::new()), turn: None, seq, now: "t" }
                .write(&Draft::queued(&body));
            let raw = RawEvent::stored(id, json);
            assert!(raw.is_queued(), "at {seq}");
            let event = raw.decode().unwrap();
            assert_eq!((event.processed_at, event.schema_version), (None, SCHEMA_VERSION_QUEUED));
            let processed = raw.processed("2026-01-01T00:00:00.000000Z");
            assert!(!processed.is_queued());
            assert_eq!(processed.decode().unwrap().processed_at.as_deref(), Some("2026-01-01T00:00:00.000000Z"));
            let plain = RawEvent::stored(
                id,
                Envelope { id, session: SessionId(Ulid::new()), turn: None, seq, now: "t" }
                    .write(&Draft::new(None, &body)),
            );
            assert!(!plain.is_queued(), "a body that holds the words is not queued");
        }
    }

    #[test]
    fn client_tools_keep_their_stored_form() {
        let stored =
            r#"{"name":"get_weather","description":"Weather","parameters":{"type":"object","required":["city"]}}"#;
        let tool: ClientTool = serde_json::from_str(stored).unwrap();
        assert_eq!(tool.input_schema["required"][0], "city");
        let written: Value = serde_json::to_value(&tool).unwrap();
        assert_eq!(written, serde_json::from_str::<Value>(stored).unwrap(), "written back exactly as stored");
        let bare: ClientTool = serde_json::from_str(r#"{"name":"t"}"#).unwrap();
        assert_eq!(bare.input_schema, ClientTool::any_object());
    }

    #[test]
    fn a_stop_reasons_name_is_the_one_the_log_stores() {
        use StopReason::*;
        for reason in [EndTurn, RequiresAction, MaxTokens, MaxTurnRequests, Refusal, Cancelled, Error] {
            assert_eq!(serde_json::to_value(reason).unwrap(), reason.as_str());
        }
    }
}
