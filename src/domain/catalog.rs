//! The catalog: agents and environments made through an API (the managed-agents view's
//! `/v1/agents` and `/v1/environments`), kept in a log of their own beside the sessions'.
//! An agent definition is immutable: a change appends its next version, and a session runs
//! the version it was created with.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::event::ClientTool;
use super::SessionId;

/// The catalog's own log: the session id no session can have (the nil ULID).
pub const CATALOG: SessionId = SessionId(ulid::Ulid(0));

/// One version of an agent made through an API.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentDefinition {
    /// `agent_` + ULID.
    pub id: String,
    /// From 1, one more with each change.
    pub version: u32,
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// A model id: one of the `[models]` in config, or `scripted`.
    pub model: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<String>,
    /// Tools the client runs (the agent's `custom` tools).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<ClientTool>,
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub metadata: Map<String, Value>,
    pub created_at: String,
    pub updated_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub archived_at: Option<String>,
    /// The subject that made it: only it (and admins) may see, use and change it.
    #[serde(default)]
    pub created_by: String,
}

/// Where an agent's sessions run. turnlog runs every agent in its own process, so an
/// environment is a name and its configuration, kept as given.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Environment {
    /// `env_` + ULID.
    pub id: String,
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    pub config: Value,
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub metadata: Map<String, Value>,
    pub created_at: String,
    pub updated_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub archived_at: Option<String>,
    /// Deleted: no longer found (sessions made in it go on).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub deleted: bool,
    /// The subject that made it: only it (and admins) may see, use and change it.
    #[serde(default)]
    pub created_by: String,
}
