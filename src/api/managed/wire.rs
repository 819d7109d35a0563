//! What the `anthropic` SDK sends and accepts (its strict models, `_strict_response_validation`):
//! sessions, events, agents and environments as Claude Managed Agents shapes them. Every
//! union there is closed, so turnlog's own events and stop reasons are mapped or left out
//! here, and never reach the wire as they are.

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use utoipa::ToSchema;

use crate::api::error::ErrorTag;
use crate::domain::catalog::{AgentDefinition, Environment, McpToolset};
use crate::domain::event::{ClientTool, Permission, StopReason};
use crate::domain::{Block, Event, EventBody};
use crate::projection::SessionSummary;
use crate::session::Activity;

/// The event types this view shows, as the SDK names them.
pub const TYPES: &[&str] = &[
    "user.message",
    "user.interrupt",
    "user.tool_confirmation",
    "user.custom_tool_result",
    "user.define_outcome",
    "agent.message",
    "agent.thinking",
    "agent.tool_use",
    "agent.tool_result",
    "agent.mcp_tool_use",
    "agent.mcp_tool_result",
    "agent.custom_tool_use",
    "session.status_running",
    "session.status_idle",
    "session.status_terminated",
    "session.error",
    "session.updated",
    "session.deleted",
    "span.model_request_start",
    "span.model_request_end",
];

/// The log's type for an SDK type (they differ for the end of a session's log, and for
/// MCP tool calls, which the log keeps as tool calls that name their server).
pub fn log_kind(sdk: &str) -> &str {
    match sdk {
        "session.status_terminated" => "terminated",
        "agent.mcp_tool_use" => "agent.tool_use",
        "agent.mcp_tool_result" => "agent.tool_result",
        other => other,
    }
}

/// A session as the SDK's strict `BetaManagedAgentsSession` wants it.
pub fn session(summary: &SessionSummary, agent: Option<&AgentDefinition>, activity: Activity) -> Value {
    let spec = &summary.spec;
    let status = if summary.deleted {
        "terminated"
    } else if activity.running {
        "running"
    } else {
        "idle"
    };
    let mut snapshot = match agent {
        Some(agent) => agent_snapshot(agent),
        None => json!({"type": "agent", "id": spec.agent.name, "version": 1, "name": spec.agent.name,
            "model": {"id": "unknown"}, "tools": [], "mcp_servers": [], "skills": [],
            "execution_identity": {"type": "service_account"}}),
    };
    // A session's own client tools join its agent's.
    if let Some(tools) = snapshot["tools"].as_array_mut() {
        tools.extend(spec.tools.iter().map(custom_tool));
    }
    json!({
        "type": "session",
        "id": summary.id.to_string(),
        "status": status,
        "environment_id": spec.environment_id.clone().unwrap_or_default(),
        "agent": snapshot,
        "title": spec.title,
        "metadata": string_map(&spec.metadata),
        "resources": [],
        "vault_ids": [],
        "outcome_evaluations": [],
        "stats": {},
        "usage": {"input_tokens": activity.usage.input_tokens, "output_tokens": activity.usage.output_tokens},
        "created_at": summary.created_at,
        "updated_at": summary.updated_at,
        "archived_at": summary.archived_at,
    })
}

/// The agent fields a session's snapshot and an agent object share.
fn agent_snapshot(agent: &AgentDefinition) -> Value {
    json!({
        "type": "agent",
        "id": agent.id,
        "version": agent.version,
        "name": agent.name,
        "description": agent.description,
        "system": agent.system,
        "model": {"id": agent.model},
        "tools": agent.tools.iter().map(custom_tool).chain(agent.mcp_toolsets.iter().map(mcp_toolset)).collect::<Vec<_>>(),
        "mcp_servers": agent.mcp_servers.iter().map(|s| json!({"type": "url", "name": s.name, "url": s.url})).collect::<Vec<_>>(),
        "skills": [],
        "execution_identity": {"type": "service_account"},
    })
}

/// An agent as `BetaManagedAgentsAgent`.
pub fn agent(agent: &AgentDefinition) -> Value {
    let mut out = agent_snapshot(agent);
    out["metadata"] = string_map(&agent.metadata);
    out["created_at"] = json!(agent.created_at);
    out["updated_at"] = json!(agent.updated_at);
    out["archived_at"] = json!(agent.archived_at);
    out
}

fn custom_tool(tool: &ClientTool) -> Value {
    // A tool another view declared with a schema the SDK cannot read shows as taking any object.
    let schema = match schema_problem(&tool.input_schema) {
        None => tool.input_schema.clone(),
        Some(_) => ClientTool::any_object(),
    };
    json!({"type": "custom", "name": tool.name, "description": tool.description, "input_schema": schema})
}

/// An MCP toolset, resolved as `BetaManagedAgentsMCPToolset` has it: each config says
/// whether its tool is enabled and with which policy.
fn mcp_toolset(toolset: &McpToolset) -> Value {
    let policy = |permission: Permission| {
        let kind = if permission == Permission::Allow { "always_allow" } else { "always_ask" };
        json!({"type": kind})
    };
    let configs: Vec<Value> = toolset
        .rules
        .iter()
        .map(|rule| {
            let enabled = rule.enabled.unwrap_or(toolset.enabled);
            json!({"name": rule.name, "enabled": enabled, "permission_policy": policy(rule.permission.unwrap_or(toolset.permission))})
        })
        .collect();
    json!({
        "type": "mcp_toolset",
        "mcp_server_name": toolset.server,
        "default_config": {"enabled": toolset.enabled, "permission_policy": policy(toolset.permission)},
        "configs": configs,
    })
}

/// An environment as `BetaEnvironment`.
pub fn environment(environment: &Environment) -> Value {
    json!({
        "type": "environment",
        "id": environment.id,
        "name": environment.name,
        "description": environment.description,
        "config": environment.config,
        "metadata": string_map(&environment.metadata),
        "created_at": environment.created_at,
        "updated_at": environment.updated_at,
        "archived_at": environment.archived_at,
    })
}

/// The SDK's metadata is string to string: other JSON values are shown as their text.
fn string_map(map: &Map<String, Value>) -> Value {
    let strings =
        map.iter().map(|(k, v)| (k.clone(), Value::String(v.as_str().map_or_else(|| v.to_string(), String::from))));
    Value::Object(strings.collect())
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

/// Content as the SDK's unions hold it: blocks that other views stored and the SDK could
/// not read are left out rather than breaking the client's whole list or stream.
fn content(blocks: &[Block], search_results: bool) -> Vec<&Block> {
    blocks.iter().filter(|b| block_problem(b, search_results).is_none()).collect()
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

/// A log event as the SDK's event union has it, or `None` for what this view never shows
/// (`session.created`, turns, deltas, archiving). Agent messages and thinking carry their
/// message id, which previews announce before the final event exists.
pub fn event(e: &Event) -> Option<Value> {
    let id = e.id.to_string();
    let at = &e.processed_at;
    let out = match &e.body {
        EventBody::UserMessage { content } => {
            json!({"type": "user.message", "id": id, "content": self::content(content, false), "processed_at": at})
        }
        EventBody::UserInterrupt {} => json!({"type": "user.interrupt", "id": id, "processed_at": at}),
        EventBody::UserToolConfirmation { tool_use_id, result, deny_message, .. } => json!({
            "type": "user.tool_confirmation", "id": id, "tool_use_id": tool_use_id, "result": result,
            "deny_message": deny_message, "processed_at": at,
        }),
        EventBody::UserCustomToolResult { custom_tool_use_id, content, is_error, .. } => json!({
            "type": "user.custom_tool_result", "id": id, "custom_tool_use_id": custom_tool_use_id,
            "content": self::content(content, true), "is_error": is_error, "processed_at": at,
        }),
        EventBody::UserDefineOutcome { outcome } => outcome_event(&id, outcome, at.as_deref().unwrap_or(&e.created_at)),
        EventBody::AgentMessage { message_id, content } => {
            let text: Vec<&Block> = content.iter().filter(|b| b.kind == "text").collect();
            json!({"type": "agent.message", "id": message_id, "content": text, "processed_at": at})
        }
        EventBody::AgentThinking { message_id, .. } => {
            json!({"type": "agent.thinking", "id": message_id, "processed_at": at})
        }
        EventBody::AgentToolUse { input, evaluated_permission, mcp: Some(mcp), .. } => json!({
            "type": "agent.mcp_tool_use", "id": id, "name": mcp.tool, "mcp_server_name": mcp.server,
            "input": object(input), "evaluated_permission": permission(*evaluated_permission), "processed_at": at,
        }),
        EventBody::AgentToolUse { name, input, evaluated_permission, .. } => json!({
            "type": "agent.tool_use", "id": id, "name": name, "input": object(input),
            "evaluated_permission": permission(*evaluated_permission), "processed_at": at,
        }),
        EventBody::AgentCustomToolUse { name, input, .. } => json!({
            "type": "agent.custom_tool_use", "id": id, "name": name, "input": object(input), "processed_at": at,
        }),
        EventBody::AgentToolResult { tool_use_id, content, is_error, mcp: Some(_), .. } => json!({
            "type": "agent.mcp_tool_result", "id": id, "mcp_tool_use_id": tool_use_id.to_string(),
            "content": self::content(content, true), "is_error": is_error, "processed_at": at,
        }),
        EventBody::AgentToolResult { tool_use_id, content, is_error, .. } => json!({
            "type": "agent.tool_result", "id": id, "tool_use_id": tool_use_id.to_string(),
            "content": self::content(content, true), "is_error": is_error, "processed_at": at,
        }),
        EventBody::StatusRunning { .. } => json!({"type": "session.status_running", "id": id, "processed_at": at}),
        EventBody::StatusIdle { stop_reason, .. } => {
            let stop = match stop_reason.kind {
                StopReason::RequiresAction => {
                    let ids: Vec<String> = stop_reason.event_ids.iter().map(ToString::to_string).collect();
                    json!({"type": "requires_action", "event_ids": ids})
                }
                StopReason::Refusal => json!({"type": "refusal"}),
                StopReason::Error => json!({"type": "retries_exhausted"}),
                // The SDK knows no other ends: a turn cancelled or cut short ended its turn.
                StopReason::EndTurn | StopReason::Cancelled | StopReason::MaxTokens | StopReason::MaxTurnRequests => {
                    json!({"type": "end_turn"})
                }
            };
            json!({"type": "session.status_idle", "id": id, "stop_reason": stop, "processed_at": at})
        }
        EventBody::SessionError { error, mcp_server: Some(server), .. } => json!({
            "type": "session.error", "id": id, "processed_at": at,
            "error": {"type": "mcp_connection_failed_error", "mcp_server_name": server, "message": error,
                "retry_status": {"type": "exhausted"}},
        }),
        EventBody::SessionError { error, code, .. } => json!({
            "type": "session.error", "id": id, "processed_at": at,
            "error": {"type": error_type(code), "message": error, "retry_status": {"type": "exhausted"}},
        }),
        EventBody::ModelRequestStart { .. } => {
            json!({"type": "span.model_request_start", "id": id, "processed_at": at})
        }
        EventBody::ModelRequestEnd { usage, is_error, model_request_start_id, span_id, .. } => json!({
            "type": "span.model_request_end", "id": id, "processed_at": at, "is_error": is_error,
            // Logs written before the start's id was kept name the span instead.
            "model_request_start_id": model_request_start_id.map_or_else(|| span_id.clone(), |s| s.to_string()),
            "model_usage": {"input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens,
                "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0},
        }),
        EventBody::SessionUpdated { title, metadata, .. } => {
            let mut out = json!({"type": "session.updated", "id": id, "processed_at": at});
            if let Some(title) = title {
                out["title"] = json!(title);
            }
            if let Some(metadata) = metadata {
                out["metadata"] = string_map(metadata);
            }
            out
        }
        EventBody::SessionDeleted {} => json!({"type": "session.deleted", "id": id, "processed_at": at}),
        EventBody::Terminated { .. } => json!({"type": "session.status_terminated", "id": id, "processed_at": at}),
        _ => return None,
    };
    Some(out)
}

/// An outcome as `user.define_outcome`: turnlog keeps what the client sent; one sent
/// through another view without these fields shows as its text.
fn outcome_event(id: &str, outcome: &Value, at: &str) -> Value {
    let description =
        outcome.get("description").and_then(Value::as_str).map_or_else(|| outcome.to_string(), String::from);
    let rubric = outcome.get("rubric").filter(|r| rubric_problem(r).is_none()).cloned();
    json!({
        "type": "user.define_outcome", "id": id, "processed_at": at,
        "outcome_id": outcome.get("outcome_id").and_then(Value::as_str).unwrap_or(id),
        "description": description,
        "rubric": rubric.unwrap_or_else(|| json!({"type": "text", "content": ""})),
        "max_iterations": outcome.get("max_iterations"),
    })
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

fn object(input: &Value) -> Value {
    if input.is_object() {
        input.clone()
    } else {
        json!({"input": input})
    }
}

fn permission(permission: Permission) -> &'static str {
    match permission {
        Permission::Allow => "allow",
        Permission::Ask => "ask",
        Permission::Deny => "deny",
    }
}

/// turnlog's error codes as the SDK's closed set of session error types.
fn error_type(code: &str) -> &'static str {
    match code {
        "model_overloaded_error" => "model_overloaded_error",
        "model_rate_limited_error" => "model_rate_limited_error",
        code if code.starts_with("model_") => "model_request_failed_error",
        _ => "unknown_error",
    }
}

/// `event_start`: a message (or thinking) is on its way, under the id its final event has.
pub fn event_start(kind: &str, message_id: &str) -> Value {
    json!({"type": "event_start", "event": {"type": kind, "id": message_id}})
}

/// `event_delta`: more text of an announced message.
pub fn event_delta(message_id: &str, text: &str) -> Value {
    json!({"type": "event_delta", "event_id": message_id,
        "delta": {"type": "content_delta", "content": {"type": "text", "text": text}, "index": 0}})
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
pub struct ErrorDetail {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub message: String,
}
