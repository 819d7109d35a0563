//! A session's setup, in no view's dialect: its agent and the tools the client declares,
//! its seed history, and where it was forked or replayed from.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::domain::ids::{EventId, SessionId};

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
    pub messages: Vec<crate::domain::Message>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub metadata: Map<String, Value>,
    /// The agent's mode the session runs in (one of its config's `modes`); `None`: the
    /// agent's `default_mode`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    /// The model the session runs (one of its agent's `models`); `None`: the agent's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
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
    pub session_id: SessionId,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<EventId>,
    pub speed: f64,
}

/// Where a fork was made: the source session, the event its history runs to, and the
/// source's chain head there (the hash of that event), so the fork names exactly what it
/// continues.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ForkPoint {
    pub session_id: SessionId,
    pub event_id: EventId,
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

/// The id of an agent's own `model` among those its sessions may choose.
pub const DEFAULT_MODEL: &str = "default";

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
    /// One of the editor's tools (an ACP client's files and terminals, declared by
    /// `turnlog acp`): run by whichever editor the session is open in, not by the client
    /// that made it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub editor: bool,
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
