//! The catalog: agents and environments made through an API (the managed-agents view's
//! `/v1/agents` and `/v1/environments`), kept in a log of their own beside the sessions'.
//! An agent definition is immutable: a change appends its next version, and a session runs
//! the version it was created with.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::event::{ClientTool, Permission};
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
    /// MCP servers it reaches over Streamable HTTP ...
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mcp_servers: Vec<McpServerDecl>,
    /// ... and which of their tools it has, with what permission: one toolset per server.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mcp_toolsets: Vec<McpToolset>,
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

/// An MCP server an agent made through an API reaches: a name and a URL, no secrets.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct McpServerDecl {
    pub name: String,
    pub url: String,
}

/// The tools of one MCP server an agent has: all of them (`enabled`) or none, each with
/// `permission` (`allow` or `ask`), unless a rule for the tool says otherwise.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct McpToolset {
    pub server: String,
    pub enabled: bool,
    pub permission: Permission,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<McpToolRule>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct McpToolRule {
    /// The tool's name on its server.
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permission: Option<Permission>,
}

impl McpToolset {
    /// The permission a tool of the server has: `deny` when it is not enabled.
    pub fn permission_of(&self, tool: &str) -> Permission {
        let rule = self.rules.iter().find(|r| r.name == tool);
        let enabled = rule.and_then(|r| r.enabled).unwrap_or(self.enabled);
        match rule.and_then(|r| r.permission) {
            _ if !enabled => Permission::Deny,
            Some(permission) => permission,
            None => self.permission,
        }
    }
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
