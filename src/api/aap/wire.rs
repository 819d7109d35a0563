//! What AAP clients send and see for sessions (camelCase, as the protocol writes it).

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use utoipa::{IntoParams, ToSchema};

use crate::api::body::objects;
use crate::domain::event::{AgentSpec, ClientTool, SessionSpec, ToolTrust};
use crate::domain::{Message, Part};
use crate::projection::SessionSummary;
use crate::session::{AgentChanges, SessionUpdate};

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CreateSession {
    #[serde(deserialize_with = "objects")]
    pub agent: AgentRequest,
    /// Seed history: AAP messages (`role` system, user, assistant, tool, tool_permission).
    #[serde(default, deserialize_with = "by_role")]
    #[schema(schema_with = seed_messages)]
    pub messages: Vec<MessageIn>,
    #[serde(default, deserialize_with = "objects")]
    pub tools: Vec<ToolSpec>,
    /// Extensions of ours, for listing and audit.
    #[serde(default)]
    pub title: Option<String>,
    #[serde(default)]
    pub metadata: Map<String, Value>,
}

#[derive(Debug, Deserialize, ToSchema)]
pub struct AgentRequest {
    /// A configured agent's name, or a catalog agent's id (one that is not there is not
    /// found: 404).
    #[serde(deserialize_with = "non_empty")]
    #[schema(min_length = 1)]
    pub name: String,
    #[serde(default, deserialize_with = "objects")]
    pub tools: Option<Vec<ToolTrustRequest>>,
    #[serde(default)]
    pub options: Map<String, Value>,
}

#[derive(Debug, Deserialize, ToSchema)]
pub struct ToolTrustRequest {
    pub name: String,
    #[serde(default)]
    pub trust: bool,
}

impl ToolTrustRequest {
    pub fn into_domain(self) -> ToolTrust {
        ToolTrust { name: self.name, trust: self.trust }
    }
}

/// A tool the client declares and runs itself.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ToolSpec {
    /// Unique among the session's tools, the agent's included.
    #[schema(pattern = "\\S")]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    #[serde(default)]
    pub description: String,
    #[serde(default = "empty_schema")]
    pub parameters: Value,
    /// turnlog's own: one of the editor's tools (its files and terminals), run by the editor
    /// the session is open in through `turnlog acp` (docs/acp.md), not by this client.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub editor: bool,
}

fn empty_schema() -> Value {
    ClientTool::any_object()
}

impl From<ToolSpec> for ClientTool {
    fn from(t: ToolSpec) -> ClientTool {
        ClientTool {
            name: t.name,
            title: t.title,
            description: t.description,
            input_schema: t.parameters,
            editor: t.editor,
        }
    }
}

impl From<&ClientTool> for ToolSpec {
    fn from(t: &ClientTool) -> ToolSpec {
        ToolSpec {
            name: t.name.clone(),
            title: t.title.clone(),
            description: t.description.clone(),
            parameters: t.input_schema.clone(),
            editor: t.editor,
        }
    }
}

impl CreateSession {
    pub fn into_spec(self) -> SessionSpec {
        SessionSpec {
            agent: AgentSpec {
                name: self.agent.name,
                version: None,
                tools: self.agent.tools.map(|tools| tools.into_iter().map(ToolTrustRequest::into_domain).collect()),
                options: self.agent.options,
            },
            tools: self.tools.into_iter().map(ClientTool::from).collect(),
            messages: self.messages.into_iter().filter_map(MessageIn::into_domain).collect(),
            title: self.title,
            metadata: self.metadata,
            mode: None,
            model: None,
            environment_id: None,
            forked_from: None,
            replay_of: None,
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Created {
    pub session_id: String,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionInfo {
    pub session_id: String,
    pub agent: AgentInfo,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<ToolSpec>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    #[serde(skip_serializing_if = "Map::is_empty")]
    pub metadata: Map<String, Value>,
    pub created_at: String,
    pub created_by: String,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct AgentInfo {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Vec<serde_json::Value>>)]
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
            tools: s.spec.tools.iter().map(ToolSpec::from).collect(),
            title: s.spec.title.clone(),
            metadata: s.spec.metadata.clone(),
            created_at: s.created_at.clone(),
            created_by: s.created_by.clone(),
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct SessionList {
    pub sessions: Vec<SessionInfo>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
}

#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
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

/// A history message as AAP clients send it (seed history and turn input).
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "role", rename_all = "snake_case")]
pub enum MessageIn {
    System {
        content: String,
    },
    User {
        #[serde(deserialize_with = "crate::api::content::blocks")]
        content: Vec<crate::domain::Block>,
    },
    Assistant {
        content: AssistantContent,
    },
    Tool {
        #[serde(rename = "toolCallId")]
        tool_call_id: String,
        content: ToolContent,
    },
    ToolPermission {
        #[serde(rename = "toolCallId")]
        tool_call_id: String,
        granted: bool,
        #[serde(default)]
        reason: Option<String>,
    },
}

#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum AssistantContent {
    Text(String),
    Blocks(#[serde(deserialize_with = "by_type")] Vec<BlockIn>),
}

#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum BlockIn {
    Text {
        text: String,
    },
    Thinking {
        thinking: String,
    },
    ToolUse {
        #[serde(rename = "toolCallId")]
        tool_call_id: String,
        name: String,
        #[serde(default)]
        input: Value,
    },
}

#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum ToolContent {
    Text(String),
    Blocks(Vec<crate::domain::Block>),
}

impl ToolContent {
    pub fn into_blocks(self) -> Vec<crate::domain::Block> {
        match self {
            ToolContent::Text(text) => vec![crate::domain::Block::text(text)],
            ToolContent::Blocks(blocks) => blocks,
        }
    }
}

impl MessageIn {
    /// The domain message, or `None` for a `tool_permission` (never stored).
    pub fn into_domain(self) -> Option<Message> {
        Some(match self {
            MessageIn::System { content } => Message::System { content },
            MessageIn::User { content } => Message::User { content },
            MessageIn::Assistant { content: AssistantContent::Text(text) } => {
                Message::Assistant { content: vec![Part::Text { text }] }
            }
            MessageIn::Assistant { content: AssistantContent::Blocks(blocks) } => Message::Assistant {
                content: blocks
                    .into_iter()
                    .map(|b| match b {
                        BlockIn::Text { text } => Part::Text { text },
                        BlockIn::Thinking { thinking } => Part::Thinking { thinking },
                        BlockIn::ToolUse { tool_call_id, name, input } => Part::ToolUse { tool_call_id, name, input },
                    })
                    .collect(),
            },
            MessageIn::Tool { tool_call_id, content } => {
                Message::Tool { tool_call_id, content: content.into_blocks(), is_error: false }
            }
            MessageIn::ToolPermission { .. } => return None,
        })
    }
}

/// A history message as AAP clients see it: content is a string when it is plain text.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "role", rename_all = "snake_case")]
pub enum MessageOut {
    System {
        content: String,
    },
    User {
        content: ContentOut,
    },
    Assistant {
        content: ContentOut,
    },
    Tool {
        #[serde(rename = "toolCallId")]
        tool_call_id: String,
        content: ContentOut,
    },
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum ContentOut {
    Text(String),
    Blocks(Vec<Value>),
}

impl ContentOut {
    fn from_blocks(blocks: &[crate::domain::Block]) -> ContentOut {
        if blocks.iter().all(|b| b.kind == "text") {
            ContentOut::Text(crate::domain::Block::join_text(blocks))
        } else {
            ContentOut::Blocks(blocks.iter().map(|b| serde_json::to_value(b).expect("blocks serialise")).collect())
        }
    }
}

impl From<&Message> for MessageOut {
    fn from(message: &Message) -> MessageOut {
        match message {
            Message::System { content } => MessageOut::System { content: content.clone() },
            Message::User { content } => MessageOut::User { content: ContentOut::from_blocks(content) },
            Message::Tool { tool_call_id, content, .. } => {
                MessageOut::Tool { tool_call_id: tool_call_id.clone(), content: ContentOut::from_blocks(content) }
            }
            Message::Assistant { content } => MessageOut::Assistant {
                content: match content.as_slice() {
                    [Part::Text { text }] => ContentOut::Text(text.clone()),
                    parts => ContentOut::Blocks(
                        parts
                            .iter()
                            .map(|p| match p {
                                Part::Text { text } => serde_json::json!({"type": "text", "text": text}),
                                Part::Thinking { thinking } => {
                                    serde_json::json!({"type": "thinking", "thinking": thinking})
                                }
                                Part::ToolUse { tool_call_id, name, input } => serde_json::json!(
                                    {"type": "tool_use", "toolCallId": tool_call_id, "name": name, "input": input}
                                ),
                            })
                            .collect(),
                    ),
                },
            },
        }
    }
}

/// `POST /sessions/{id}/turns`.
#[derive(Debug, Deserialize, ToSchema)]
pub struct TurnRequest {
    #[serde(default, deserialize_with = "objects")]
    pub agent: Option<AgentUpdate>,
    #[serde(default)]
    pub stream: StreamMode,
    /// One user message, or the results and permissions for every waiting tool call.
    #[serde(deserialize_with = "by_role")]
    #[schema(schema_with = turn_messages)]
    pub messages: Vec<MessageIn>,
    #[serde(default, deserialize_with = "objects")]
    pub tools: Option<Vec<ToolSpec>>,
}

impl TurnRequest {
    /// The session changes the request makes, in the session layer's terms.
    pub fn update(&mut self) -> SessionUpdate {
        SessionUpdate {
            agent: self.agent.take().map(|agent| AgentChanges {
                tools: agent.tools.map(|tools| tools.into_iter().map(ToolTrustRequest::into_domain).collect()),
                options: agent.options,
            }),
            tools: self.tools.take().map(|tools| tools.into_iter().map(ClientTool::from).collect()),
            ..SessionUpdate::default()
        }
    }
}

#[derive(Debug, Deserialize, ToSchema)]
pub struct AgentUpdate {
    #[serde(default, deserialize_with = "objects")]
    pub tools: Option<Vec<ToolTrustRequest>>,
    #[serde(default)]
    pub options: Option<Map<String, Value>>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum StreamMode {
    Delta,
    Message,
    #[default]
    None,
}

/// The JSON answer of a turn with `stream: "none"`.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentResponse {
    #[schema(value_type = String)]
    pub stop_reason: &'static str,
    #[schema(value_type = Vec<serde_json::Value>)]
    pub messages: Vec<MessageOut>,
}

#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct HistoryQuery {
    #[serde(rename = "type")]
    pub kind: Option<String>,
}

/// AAP's five stop reasons, from the log's. AAP has no name for two: a turn the client
/// interrupted ended as asked and the session takes the next message (`end_turn`); a turn
/// cut at the agent's limit of model requests stopped at a budget before the agent was done,
/// as `max_tokens` says of a reply (so a client shows it as cut short, not as finished).
pub fn stop_reason(reason: crate::domain::StopReason) -> &'static str {
    use crate::domain::StopReason::*;
    match reason {
        EndTurn | Cancelled => "end_turn",
        RequiresAction => "tool_use",
        MaxTokens | MaxTurnRequests => "max_tokens",
        Refusal => "refusal",
        Error => "error",
    }
}

fn by_role<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<MessageIn>, D::Error> {
    crate::api::body::tagged(d, "role")
}

fn by_type<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<BlockIn>, D::Error> {
    crate::api::body::tagged(d, "type")
}

/// A string with something in it.
fn non_empty<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    let text = String::deserialize(d)?;
    match text.is_empty() {
        true => Err(serde::de::Error::custom("must not be empty")),
        false => Ok(text),
    }
}

/// An AAP message of `role`, with its own fields.
fn message(role: &str, required: &[&str], mut properties: Value) -> Value {
    properties["role"] = json!({"type": "string", "enum": [role]});
    let mut all = vec!["role"];
    all.extend(required);
    json!({"type": "object", "required": all, "properties": properties})
}

/// Each role's message, as [`MessageIn`] reads it.
fn messages() -> [Value; 5] {
    let assistant_block = |kind: &str, required: &[&str], mut properties: Value| {
        properties["type"] = json!({"type": "string", "enum": [kind]});
        let mut all = vec!["type"];
        all.extend(required);
        json!({"type": "object", "required": all, "properties": properties})
    };
    let string = json!({"type": "string"});
    [
        message("system", &["content"], json!({"content": string})),
        message("user", &["content"], json!({"content": crate::api::content::schema_json()})),
        message(
            "assistant",
            &["content"],
            json!({"content": {"anyOf": [string, {"type": "array", "items": {"oneOf": [
                assistant_block("text", &["text"], json!({"text": string})),
                assistant_block("thinking", &["thinking"], json!({"thinking": string})),
                assistant_block("tool_use", &["toolCallId", "name"], json!({"toolCallId": string, "name": string})),
            ]}}]}}),
        ),
        message(
            "tool",
            &["toolCallId", "content"],
            json!({"toolCallId": string, "content": {"anyOf": [
                string, {"type": "array", "items": crate::api::content::block_schema(false)},
            ]}}),
        ),
        message(
            "tool_permission",
            &["toolCallId", "granted"],
            json!({
                "toolCallId": string, "granted": {"type": "boolean"}, "reason": {"type": ["string", "null"]},
            }),
        ),
    ]
}

/// A seed history: messages of any role.
fn seed_messages() -> utoipa::openapi::schema::Schema {
    crate::api::schema::schema(json!({"type": "array", "items": {"oneOf": messages()}}))
}

/// A turn's input: one user message, or tool results and permissions only.
fn turn_messages() -> utoipa::openapi::schema::Schema {
    let [_, user, _, tool, permission] = messages();
    crate::api::schema::schema(json!({"oneOf": [
        {"type": "array", "minItems": 1, "maxItems": 1, "items": user},
        {"type": "array", "minItems": 1, "items": {"oneOf": [tool, permission]}},
    ]}))
}
