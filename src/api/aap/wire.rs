//! What AAP clients send and see for sessions (camelCase, as the protocol writes it).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::domain::event::{AgentSpec, SessionSpec, ToolTrust};
use crate::projection::SessionSummary;

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CreateSession {
    pub agent: AgentRequest,
    #[serde(default)]
    pub messages: Vec<Value>,
    #[serde(default)]
    pub tools: Vec<ToolSpec>,
    /// Extensions of ours, for listing and audit.
    #[serde(default)]
    pub title: Option<String>,
    #[serde(default)]
    pub metadata: Map<String, Value>,
}

#[derive(Debug, Deserialize)]
pub struct AgentRequest {
    pub name: String,
    #[serde(default)]
    pub tools: Option<Vec<ToolTrustRequest>>,
    #[serde(default)]
    pub options: Map<String, Value>,
}

#[derive(Debug, Deserialize)]
pub struct ToolTrustRequest {
    pub name: String,
    #[serde(default)]
    pub trust: bool,
}

/// A tool the client declares and runs itself.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ToolSpec {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    #[serde(default)]
    pub description: String,
    #[serde(default = "empty_schema")]
    pub parameters: Value,
}

fn empty_schema() -> Value {
    serde_json::json!({"type": "object", "properties": {}})
}

impl CreateSession {
    pub fn into_spec(self) -> SessionSpec {
        SessionSpec {
            agent: AgentSpec {
                name: self.agent.name,
                tools: self.agent.tools.map(|tools| {
                    tools
                        .into_iter()
                        .map(|t| ToolTrust {
                            name: t.name,
                            trust: t.trust,
                        })
                        .collect()
                }),
                options: self.agent.options,
            },
            tools: self
                .tools
                .into_iter()
                .map(|t| serde_json::to_value(t).expect("tool specs serialise"))
                .collect(),
            messages: self.messages,
            title: self.title,
            metadata: self.metadata,
        }
    }
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Created {
    pub session_id: String,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionInfo {
    pub session_id: String,
    pub agent: AgentInfo,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    #[serde(skip_serializing_if = "Map::is_empty")]
    pub metadata: Map<String, Value>,
    pub created_at: String,
    pub created_by: String,
}

#[derive(Debug, Serialize)]
pub struct AgentInfo {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<ToolTrust>>,
    #[serde(skip_serializing_if = "Map::is_empty")]
    pub options: Map<String, Value>,
}

impl From<&SessionSummary> for SessionInfo {
    fn from(s: &SessionSummary) -> SessionInfo {
        SessionInfo {
            session_id: s.id.to_string(),
            agent: AgentInfo {
                name: s.spec.agent.name.clone(),
                tools: s.spec.agent.tools.clone(),
                options: s.spec.agent.options.clone(),
            },
            tools: s.spec.tools.clone(),
            title: s.spec.title.clone(),
            metadata: s.spec.metadata.clone(),
            created_at: s.created_at.clone(),
            created_by: s.created_by.clone(),
        }
    }
}

#[derive(Debug, Serialize)]
pub struct SessionList {
    pub sessions: Vec<SessionInfo>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
pub struct ListQuery {
    /// The `next` of the previous page.
    pub after: Option<String>,
    pub limit: Option<usize>,
    pub agent: Option<String>,
    pub created_by: Option<String>,
    /// RFC 3339 bounds on creation time.
    pub created_after: Option<String>,
    pub created_before: Option<String>,
}
