//! What the client sends and reads, as a client sees it: the fields its callers use, with
//! everything else the server says left unread.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// A new session (`POST /sessions`).
#[derive(Debug, Clone, Default, Serialize)]
pub struct NewSession {
    pub agent: AgentChoice,
    /// Tools the client runs (the turn API's `tools`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<crate::domain::event::ClientTool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    #[serde(skip_serializing_if = "Map::is_empty")]
    pub metadata: Map<String, Value>,
}

impl NewSession {
    /// A session of `agent` as configured.
    pub fn of(agent: &str) -> NewSession {
        NewSession { agent: AgentChoice { name: agent.to_string(), tools: None }, ..NewSession::default() }
    }
}

/// The agent a new session runs, and which of its server tools (none given: the agent's).
#[derive(Debug, Clone, Default, Serialize)]
pub struct AgentChoice {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<ToolTrust>>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ToolTrust {
    pub name: String,
    pub trust: bool,
}

/// An agent as `GET /meta` offers it.
#[derive(Debug, Clone, Deserialize)]
pub struct AgentMeta {
    pub name: String,
    #[serde(default)]
    pub tools: Vec<ToolMeta>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct ToolMeta {
    pub name: String,
}

#[derive(Deserialize)]
pub(super) struct Meta {
    pub agents: Vec<AgentMeta>,
}

/// A session as `GET /sessions` and `GET /sessions/{id}` show it.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Session {
    pub session_id: String,
    pub agent: AgentName,
    #[serde(default)]
    pub title: Option<String>,
    #[serde(default)]
    pub metadata: Map<String, Value>,
    pub created_at: String,
    pub created_by: String,
}

#[derive(Debug, Clone, Deserialize)]
pub struct AgentName {
    pub name: String,
}

/// Which sessions `GET /sessions` lists (the caller's own; an admin's, all).
#[derive(Debug, Clone, Default, Serialize)]
pub struct SessionQuery {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub created_by: Option<String>,
    /// The previous page's `next`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub after: Option<String>,
}

/// A page of sessions, newest first, and the cursor of the next one.
#[derive(Debug, Clone, Deserialize)]
pub struct SessionPage {
    pub sessions: Vec<Session>,
    #[serde(default)]
    pub next: Option<String>,
}

/// A session's mode and its agent's modes (`mode` is `None` for an agent without modes).
#[derive(Debug, Clone, Deserialize)]
pub struct SessionModes {
    pub mode: Option<String>,
    pub modes: Vec<ModeMeta>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct ModeMeta {
    pub id: String,
    pub name: String,
    #[serde(default)]
    pub description: String,
}

/// A session's model and those its agent offers.
#[derive(Debug, Clone, Deserialize)]
pub struct SessionModels {
    pub model: String,
    pub models: Vec<ModelMeta>,
}

/// The prompts of a session's MCP servers (`GET /sessions/{id}/prompts`).
#[derive(Debug, Clone, Deserialize)]
pub struct SessionPrompts {
    pub prompts: Vec<PromptMeta>,
    /// The servers whose prompts could not be listed, with why.
    #[serde(default)]
    pub unavailable: Vec<PromptsUnavailable>,
}

/// One prompt of a session's MCP server.
#[derive(Debug, Clone, Deserialize)]
pub struct PromptMeta {
    pub server: String,
    pub name: String,
    #[serde(default)]
    pub description: String,
    #[serde(default)]
    pub arguments: Vec<PromptArgumentMeta>,
}

/// One argument of a prompt.
#[derive(Debug, Clone, Deserialize)]
pub struct PromptArgumentMeta {
    pub name: String,
    #[serde(default)]
    pub description: String,
    #[serde(default)]
    pub required: bool,
}

/// A server whose prompts could not be listed, and why.
#[derive(Debug, Clone, Deserialize)]
pub struct PromptsUnavailable {
    pub server: String,
    pub error: String,
}

/// A prompt written out (`POST /sessions/{id}/prompts/{server}/{prompt}`).
#[derive(Debug, Clone, Deserialize)]
pub(super) struct WrittenPrompt {
    pub content: Vec<crate::domain::Block>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct ModelMeta {
    pub id: String,
    pub name: String,
}

#[derive(Deserialize)]
pub(super) struct Created {
    #[serde(rename = "sessionId")]
    pub session_id: String,
}

/// Which events `GET /sessions/{id}/events` answers, oldest first.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PageQuery {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub after_id: Option<String>,
}

/// A page of events (each as `T`: a `serde_json::Value`, the domain's `Event`, or only
/// the fields a caller reads).
#[derive(Debug, Clone, Deserialize)]
pub struct Page<T> {
    pub data: Vec<T>,
    #[serde(default)]
    pub first_id: Option<String>,
    #[serde(default)]
    pub last_id: Option<String>,
    pub has_more: bool,
}

/// The events an append stored.
#[derive(Deserialize)]
pub(super) struct Stored<T> {
    pub data: Vec<T>,
}

/// Where a session's native stream starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamFrom {
    Start,
    /// After this event, by `?after_id=`.
    AfterId(String),
    /// After this event, by the `Last-Event-ID` header (as a reconnecting client says it).
    LastEventId(String),
}

/// What an import did with one session.
#[derive(Debug, Clone, Deserialize)]
pub struct ImportedSession {
    pub session_id: String,
    pub status: ImportStatus,
    pub events: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ImportStatus {
    Imported,
    /// The server held the session with the same events.
    Unchanged,
}

#[derive(Deserialize)]
pub(super) struct ImportAnswer {
    pub sessions: Vec<ImportedSession>,
}
