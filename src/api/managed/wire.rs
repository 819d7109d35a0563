//! What the `anthropic` SDK sends and accepts (its strict models, `_strict_response_validation`):
//! sessions, agents and environments as Claude Managed Agents shapes them, each mapped from
//! turnlog's own by one function here ([`session`], [`agent`], [`environment`]); the events
//! are in [`super::event`]. Every union there is closed, so what turnlog has and the SDK
//! does not is mapped or left out here, and never reaches the wire as it is.

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use utoipa::openapi::{RefOr, Schema};
use utoipa::{PartialSchema, ToSchema};

use crate::api::error::ErrorTag;
use crate::domain::catalog::{AgentDefinition, Environment as Env, McpToolset};
use crate::domain::event::{ClientTool, Permission};
use crate::domain::Block;
use crate::projection::SessionSummary;
use crate::session::Activity;

/// The SDK's metadata: string to string (other JSON values are shown as their text).
pub type Metadata = Map<String, Value>;

// Constant `type` fields: each a one-value enum, so that the document says the value.

#[derive(Debug, Clone, Copy, Default, Serialize, ToSchema)]
#[schema(as = ManagedSessionTag)]
pub enum SessionTag {
    #[default]
    #[serde(rename = "session")]
    Tag,
}

#[derive(Debug, Clone, Copy, Default, Serialize, ToSchema)]
#[schema(as = ManagedAgentTag)]
pub enum AgentTag {
    #[default]
    #[serde(rename = "agent")]
    Tag,
}

#[derive(Debug, Clone, Copy, Default, Serialize, ToSchema)]
#[schema(as = ManagedEnvironmentTag)]
pub enum EnvironmentTag {
    #[default]
    #[serde(rename = "environment")]
    Tag,
}

#[derive(Debug, Clone, Copy, Default, Serialize, ToSchema)]
#[schema(as = ManagedUrlTag)]
pub enum UrlTag {
    #[default]
    #[serde(rename = "url")]
    Tag,
}

#[derive(Debug, Clone, Copy, Default, Serialize, ToSchema)]
#[schema(as = ManagedServiceAccount)]
pub enum ServiceAccount {
    #[default]
    #[serde(rename = "service_account")]
    Tag,
}

#[derive(Debug, Clone, Copy, Default, Serialize, ToSchema)]
#[schema(as = ManagedSessionDeletedTag)]
pub enum SessionDeletedTag {
    #[default]
    #[serde(rename = "session_deleted")]
    Tag,
}

#[derive(Debug, Clone, Copy, Default, Serialize, ToSchema)]
#[schema(as = ManagedEnvironmentDeletedTag)]
pub enum EnvironmentDeletedTag {
    #[default]
    #[serde(rename = "environment_deleted")]
    Tag,
}

/// A session as the SDK's strict `BetaManagedAgentsSession` wants it.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = ManagedSession)]
pub struct Session {
    #[serde(rename = "type")]
    pub kind: SessionTag,
    pub id: String,
    pub status: SessionStatus,
    pub environment_id: String,
    pub agent: AgentSnapshot,
    pub title: Option<String>,
    #[schema(value_type = HashMap<String, String>)]
    pub metadata: Metadata,
    /// Always empty: this server takes no resources.
    #[schema(value_type = Vec<Object>, max_items = 0)]
    pub resources: Vec<Value>,
    /// Always empty: this server takes no vaults.
    #[schema(max_items = 0)]
    pub vault_ids: Vec<String>,
    pub outcome_evaluations: Vec<super::outcomes::OutcomeEvaluation>,
    #[schema(value_type = Object)]
    pub stats: Map<String, Value>,
    #[schema(inline)]
    pub usage: SessionUsage,
    pub created_at: String,
    pub updated_at: String,
    pub archived_at: Option<String>,
}

#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum SessionStatus {
    Idle,
    Running,
    Terminated,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct SessionUsage {
    pub input_tokens: u64,
    pub output_tokens: u64,
}

/// The agent fields a session's snapshot and an agent object share.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = ManagedAgentSnapshot)]
pub struct AgentSnapshot {
    #[serde(rename = "type")]
    pub kind: AgentTag,
    pub id: String,
    pub version: u32,
    pub name: String,
    /// Absent only from the snapshot of an agent this server no longer has.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub description: Option<Option<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub system: Option<Option<String>>,
    #[schema(inline)]
    pub model: Model,
    pub tools: Vec<Tool>,
    pub mcp_servers: Vec<McpServer>,
    /// Always empty: this server runs no skills.
    #[schema(value_type = Vec<Object>, max_items = 0)]
    pub skills: Vec<Value>,
    #[schema(inline)]
    pub execution_identity: ExecutionIdentity,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Model {
    pub id: String,
}

#[derive(Debug, Default, Serialize, ToSchema)]
pub struct ExecutionIdentity {
    #[serde(rename = "type")]
    pub kind: ServiceAccount,
}

/// An agent as `BetaManagedAgentsAgent`: its snapshot, and what the catalog keeps of it.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = ManagedAgent)]
pub struct Agent {
    #[serde(flatten)]
    pub snapshot: AgentSnapshot,
    #[schema(value_type = HashMap<String, String>)]
    pub metadata: Metadata,
    pub created_at: String,
    pub updated_at: String,
    pub archived_at: Option<String>,
}

/// An agent's tool: one the client runs, or an MCP server's tools.
#[derive(Debug, Serialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
#[schema(as = ManagedTool)]
pub enum Tool {
    Custom {
        name: String,
        description: String,
        #[schema(value_type = Object)]
        input_schema: Value,
    },
    McpToolset {
        mcp_server_name: String,
        #[schema(inline)]
        default_config: ToolsetConfig,
        configs: Vec<ToolConfig>,
    },
}

/// What a toolset's tools get unless a tool's own config says otherwise.
#[derive(Debug, Serialize, ToSchema)]
pub struct ToolsetConfig {
    pub enabled: bool,
    #[schema(inline)]
    pub permission_policy: PermissionPolicy,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ToolConfig {
    pub name: String,
    pub enabled: bool,
    #[schema(inline)]
    pub permission_policy: PermissionPolicy,
}

#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum PermissionPolicy {
    AlwaysAllow,
    AlwaysAsk,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct McpServer {
    #[serde(rename = "type")]
    pub kind: UrlTag,
    pub name: String,
    pub url: String,
}

/// An environment as `BetaEnvironment`.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = ManagedEnvironment)]
pub struct Environment {
    #[serde(rename = "type")]
    pub kind: EnvironmentTag,
    pub id: String,
    pub name: String,
    pub description: Option<String>,
    /// `cloud` (with its `networking` and `packages`, every part filled) or `self_hosted`.
    #[schema(value_type = Object)]
    pub config: Value,
    #[schema(value_type = HashMap<String, String>)]
    pub metadata: Metadata,
    pub created_at: String,
    pub updated_at: String,
    pub archived_at: Option<String>,
}

/// A page as the SDK's cursor pages want it: `next_page` null at the end, or it loops.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = ManagedPage)]
pub struct Page<T: ToSchema> {
    pub data: Vec<T>,
    pub next_page: Option<String>,
    pub prev_page: Option<String>,
}

/// What a delete answers: `{"type": "session_deleted", "id"}`.
#[derive(Debug, Serialize, ToSchema)]
pub struct SessionDeleted {
    #[serde(rename = "type")]
    pub kind: SessionDeletedTag,
    pub id: String,
}

/// `{"type": "environment_deleted", "id"}`.
#[derive(Debug, Serialize, ToSchema)]
pub struct EnvironmentDeleted {
    #[serde(rename = "type")]
    pub kind: EnvironmentDeletedTag,
    pub id: String,
}

/// A content block the SDK's unions hold, as stored: text, an image or document with its
/// `source`, a search result.
#[derive(Debug, Clone, Serialize)]
#[serde(transparent)]
pub struct ContentBlock(pub Block);

impl PartialSchema for ContentBlock {
    fn schema() -> RefOr<Schema> {
        RefOr::T(crate::api::schema::schema(content_block_schema()))
    }
}

impl ToSchema for ContentBlock {
    fn name() -> std::borrow::Cow<'static, str> {
        "ManagedContentBlock".into()
    }
}

/// Blocks as the SDK's unions read them (and as this view takes them): text with its
/// `text`; an image or a document with a `source` of a kind it has; a search result with
/// its text.
pub fn content_block_schema() -> Value {
    let string = json!({"type": "string"});
    let block = |kind: &str, required: &[&str], mut properties: Value| {
        properties["type"] = json!({"type": "string", "enum": [kind]});
        // A text block's `text` is a string; any other block's, a string or null.
        properties["text"] = if kind == "text" { string.clone() } else { json!({"type": ["string", "null"]}) };
        let mut all = vec!["type"];
        all.extend(required);
        json!({"type": "object", "required": all, "properties": properties})
    };
    let source = |kinds: &[(&str, &str)]| {
        let one_of: Vec<Value> = kinds
            .iter()
            .map(|(kind, field)| {
                json!({"type": "object", "required": ["type", field],
                       "properties": {"type": {"type": "string", "enum": [kind]}, *field: string}})
            })
            .collect();
        json!({"oneOf": one_of})
    };
    json!({"oneOf": [
        block("text", &["text"], json!({})),
        block("image", &["source"], json!({"source": source(&[("base64", "data"), ("url", "url"), ("file", "file_id")])})),
        block("document", &["source"], json!({"source": source(&[("base64", "data"), ("text", "data"), ("url", "url"), ("file", "file_id")])})),
        block("search_result", &["source", "title", "content"], json!({
            "source": string, "title": string,
            "content": {"type": "array", "items": {"type": "object", "required": ["type", "text"],
                "properties": {"type": {"type": "string", "enum": ["text"]}, "text": string}}},
        })),
    ]})
}

/// A session as the SDK's strict `BetaManagedAgentsSession` wants it, with its agent's full
/// snapshot (or what is known of an agent this server no longer has).
pub fn session(summary: &SessionSummary, agent: Option<&AgentDefinition>, activity: Activity) -> Session {
    let spec = &summary.spec;
    let status = if summary.deleted || summary.ended.is_some() {
        SessionStatus::Terminated
    } else if activity.running {
        SessionStatus::Running
    } else {
        SessionStatus::Idle
    };
    let mut snapshot = match agent {
        Some(agent) => agent_snapshot(agent),
        None => AgentSnapshot {
            kind: AgentTag::Tag,
            id: spec.agent.name.clone(),
            version: 1,
            name: spec.agent.name.clone(),
            description: None,
            system: None,
            model: Model { id: "unknown".into() },
            tools: Vec::new(),
            mcp_servers: Vec::new(),
            skills: Vec::new(),
            execution_identity: ExecutionIdentity::default(),
        },
    };
    // A session's own client tools join its agent's.
    snapshot.tools.extend(spec.tools.iter().map(custom_tool));
    Session {
        kind: SessionTag::Tag,
        id: summary.id.to_string(),
        status,
        environment_id: spec.environment_id.clone().unwrap_or_default(),
        agent: snapshot,
        title: spec.title.clone(),
        metadata: string_map(&spec.metadata),
        resources: Vec::new(),
        vault_ids: Vec::new(),
        outcome_evaluations: activity.outcomes.iter().map(super::outcomes::OutcomeEvaluation::from).collect(),
        stats: Map::new(),
        usage: SessionUsage { input_tokens: activity.usage.input_tokens, output_tokens: activity.usage.output_tokens },
        created_at: summary.created_at.clone(),
        updated_at: summary.updated_at.clone(),
        archived_at: summary.archived_at.clone(),
    }
}

fn agent_snapshot(agent: &AgentDefinition) -> AgentSnapshot {
    AgentSnapshot {
        kind: AgentTag::Tag,
        id: agent.id.clone(),
        version: agent.version,
        name: agent.name.clone(),
        description: Some(agent.description.clone()),
        system: Some(agent.system.clone()),
        model: Model { id: agent.model.clone() },
        tools: agent.tools.iter().map(custom_tool).chain(agent.mcp_toolsets.iter().map(mcp_toolset)).collect(),
        mcp_servers: agent
            .mcp_servers
            .iter()
            .map(|s| McpServer { kind: UrlTag::Tag, name: s.name.clone(), url: s.url.clone() })
            .collect(),
        skills: Vec::new(),
        execution_identity: ExecutionIdentity::default(),
    }
}

/// An agent as `BetaManagedAgentsAgent`.
pub fn agent(agent: &AgentDefinition) -> Agent {
    Agent {
        snapshot: agent_snapshot(agent),
        metadata: string_map(&agent.metadata),
        created_at: agent.created_at.clone(),
        updated_at: agent.updated_at.clone(),
        archived_at: agent.archived_at.clone(),
    }
}

fn custom_tool(tool: &ClientTool) -> Tool {
    // A tool another view declared with a schema the SDK cannot read shows as taking any object.
    let input_schema = match schema_problem(&tool.input_schema) {
        None => tool.input_schema.clone(),
        Some(_) => ClientTool::any_object(),
    };
    Tool::Custom { name: tool.name.clone(), description: tool.description.clone(), input_schema }
}

/// An MCP toolset, resolved as `BetaManagedAgentsMCPToolset` has it: each config says
/// whether its tool is enabled and with which policy.
fn mcp_toolset(toolset: &McpToolset) -> Tool {
    let policy = |permission: Permission| match permission {
        Permission::Allow => PermissionPolicy::AlwaysAllow,
        _ => PermissionPolicy::AlwaysAsk,
    };
    let configs = toolset
        .rules
        .iter()
        .map(|rule| ToolConfig {
            name: rule.name.clone(),
            enabled: rule.enabled.unwrap_or(toolset.enabled),
            permission_policy: policy(rule.permission.unwrap_or(toolset.permission)),
        })
        .collect();
    Tool::McpToolset {
        mcp_server_name: toolset.server.clone(),
        default_config: ToolsetConfig { enabled: toolset.enabled, permission_policy: policy(toolset.permission) },
        configs,
    }
}

/// An environment as `BetaEnvironment`.
pub fn environment(environment: &Env) -> Environment {
    Environment {
        kind: EnvironmentTag::Tag,
        id: environment.id.clone(),
        name: environment.name.clone(),
        description: environment.description.clone(),
        config: environment.config.clone(),
        metadata: string_map(&environment.metadata),
        created_at: environment.created_at.clone(),
        updated_at: environment.updated_at.clone(),
        archived_at: environment.archived_at.clone(),
    }
}

/// The SDK's metadata is string to string: other JSON values are shown as their text.
pub fn string_map(map: &Map<String, Value>) -> Metadata {
    let strings =
        map.iter().map(|(k, v)| (k.clone(), Value::String(v.as_str().map_or_else(|| v.to_string(), String::from))));
    strings.collect()
}

/// Why a content block is not one the SDK's unions hold, if it is not: text with its
/// `text`, or an image or document with a known `source`, (with `search_result`) a search
/// result.
pub fn block_problem(block: &Block, search_results: bool) -> Option<String> {
    let source = |kinds: &[(&str, &str)]| {
        let source = block.rest.get("source")?.as_object()?;
        let kind = source.get("type")?.as_str()?;
        let (_, field) = kinds.iter().find(|(k, _)| *k == kind)?;
        source.get(*field)?.as_str().map(drop)
    };
    let strings = |fields: &[&str]| fields.iter().all(|f| block.rest.get(*f).is_some_and(Value::is_string));
    let ok = match block.kind.as_str() {
        "text" => block.text.is_some(),
        "image" => source(&[("base64", "data"), ("url", "url"), ("file", "file_id")]).is_some(),
        "document" => source(&[("base64", "data"), ("text", "data"), ("url", "url"), ("file", "file_id")]).is_some(),
        "search_result" if search_results => {
            strings(&["source", "title"])
                && block
                    .rest
                    .get("content")
                    .and_then(Value::as_array)
                    .is_some_and(|c| c.iter().all(|b| b["type"] == "text" && b["text"].is_string()))
        }
        _ => return Some(format!("{:?} is not a block this API takes", block.kind)),
    };
    (!ok).then(|| {
        format!("a {} block is missing its {}", block.kind, if block.kind == "text" { "text" } else { "source" })
    })
}

/// Why a custom tool's `input_schema` is not one the SDK reads back, if it is not.
pub fn schema_problem(schema: &Value) -> Option<&'static str> {
    let Some(fields) = schema.as_object() else { return Some("must be an object") };
    if fields.get("type").and_then(Value::as_str) != Some("object") {
        return Some("`type` must be \"object\"");
    }
    if fields.get("properties").is_some_and(|p| !(p.is_object() || p.is_null())) {
        return Some("`properties` must be an object");
    }
    let strings = |r: &Value| r.as_array().is_some_and(|r| r.iter().all(Value::is_string));
    if fields.get("required").is_some_and(|r| !(strings(r) || r.is_null())) {
        return Some("`required` must be a list of names");
    }
    None
}

/// Why an outcome's rubric is not one the SDK reads back, if it is not.
pub fn rubric_problem(rubric: &Value) -> Option<&'static str> {
    let text = |field: &str| rubric.get(field).is_some_and(Value::is_string);
    match rubric.get("type").and_then(Value::as_str) {
        Some("text") if text("content") => None,
        Some("file") if text("file_id") => None,
        Some("text") => Some("a text rubric needs its `content`"),
        Some("file") => Some("a file rubric needs its `file_id`"),
        _ => Some("`type` must be text or file"),
    }
}

/// `created_at[gt|gte|lt|lte]`, as the SDK sends them.
#[derive(Debug, Default, Deserialize)]
pub struct TimeQuery {
    pub gt: Option<String>,
    pub gte: Option<String>,
    pub lt: Option<String>,
    pub lte: Option<String>,
}

/// The default configuration of a cloud environment, and what a partial one is filled to:
/// the SDK wants every part of it.
pub fn environment_config(config: Option<Value>) -> Result<Value, String> {
    let mut config = config.filter(|c| !c.is_null()).unwrap_or_else(|| json!({"type": "cloud"}));
    let Some(fields) = config.as_object_mut() else { return Err("must be an object".into()) };
    match fields.get("type").and_then(Value::as_str) {
        Some("self_hosted") => {}
        Some("cloud") => {
            let networking = fields.entry("networking").or_insert(Value::Null);
            if networking.is_null() {
                *networking = json!({"type": "unrestricted"});
            }
            let networking = networking.as_object_mut().ok_or("`networking` must be an object")?;
            match networking.get("type").and_then(Value::as_str) {
                Some("unrestricted") => {}
                Some("limited") => {
                    let hosts = networking.entry("allowed_hosts").or_insert(json!([]));
                    if !hosts.as_array().is_some_and(|h| h.iter().all(Value::is_string)) {
                        return Err("`networking.allowed_hosts` must be a list of hosts".into());
                    }
                    for flag in ["allow_mcp_servers", "allow_package_managers"] {
                        if !networking.entry(flag).or_insert(json!(false)).is_boolean() {
                            return Err(format!("`networking.{flag}` must be true or false"));
                        }
                    }
                }
                _ => return Err("`networking.type` must be unrestricted or limited".into()),
            }
            let packages = fields.entry("packages").or_insert(Value::Null);
            if packages.is_null() {
                *packages = json!({});
            }
            let packages = packages.as_object_mut().ok_or("`packages` must be an object")?;
            packages.insert("type".into(), json!("packages"));
            for manager in ["apt", "cargo", "gem", "go", "npm", "pip"] {
                let list = packages.entry(manager).or_insert(json!([]));
                if !list.as_array().is_some_and(|l| l.iter().all(Value::is_string)) {
                    return Err(format!("`packages.{manager}` must be a list of package names"));
                }
            }
        }
        _ => return Err("`type` must be cloud or self_hosted".into()),
    }
    Ok(config)
}

/// Anthropic's error body: `{"type":"error","error":{"type","message"}}`.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = ManagedError)]
pub struct ErrorBody {
    #[serde(rename = "type")]
    pub kind: ErrorTag,
    #[schema(inline)]
    pub error: ErrorDetail,
}

#[derive(Debug, Serialize, ToSchema)]
#[schema(as = ManagedErrorDetail)]
pub struct ErrorDetail {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub message: String,
}
