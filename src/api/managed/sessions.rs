//! `/v1/sessions`: create (from an agent id, a pinned version, or an agent with extra
//! custom tools, plus initial events), retrieve, update (a metadata patch), list, archive
//! and delete.

use actix_web::{delete, get, post, web, HttpResponse};
use serde::Deserialize;
use serde_json::{Map, Value};

use super::events::inputs;
use super::wire::{self, TimeQuery};
use super::{limit, page, time_bounds, Auth, CallerSession, Error, Json, Managed, Query};
use crate::api::State;
use crate::domain::event::{AgentSpec, ClientTool, SessionSpec};
use crate::error::ApiError;
use crate::projection::SessionSummary;
use crate::session::rules::configured_tools;
use crate::session::{ListFilter, SessionUpdate, Submission, WhenBusy};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateSession {
    agent: Value,
    environment_id: String,
    #[serde(default)]
    title: Option<String>,
    #[serde(default)]
    metadata: Option<Map<String, Value>>,
    #[serde(default)]
    initial_events: Option<Vec<Value>>,
    #[serde(default)]
    resources: Option<Vec<Value>>,
    #[serde(default)]
    vault_ids: Option<Vec<String>>,
    #[serde(default)]
    budget: Option<Value>,
}

/// `agent` as an object: `{"type":"agent","id","version"?}` or `agent_with_overrides`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AgentRef {
    #[serde(rename = "type")]
    kind: String,
    id: String,
    #[serde(default, deserialize_with = "crate::api::body::integer")]
    version: Option<u32>,
    #[serde(default)]
    tools: Option<Vec<Value>>,
    #[serde(default)]
    model: Option<Value>,
    #[serde(default)]
    system: Option<Value>,
    #[serde(default)]
    mcp_servers: Option<Vec<Value>>,
    #[serde(default)]
    skills: Option<Vec<Value>>,
}

#[utoipa::path(
    tag = "managed",
    operation_id = "managed_sessions_create",
    params(("Idempotency-Key" = Option<String>, Header, description = "Names this write: sent again with the same key and body, it is answered as the first time and stored once (docs/idempotency.md)", min_length = 1, max_length = 255, pattern = "^[ -~]+$")),
    request_body(content = super::request::CreateSession, description = "`{agent, environment_id, title?, metadata?, initial_events?}`", example = json!({"agent": "AGENT_ID", "environment_id": "ENVIRONMENT_ID"})),
    responses((status = 200, description = "The session", body = wire::Session)),
)]
#[post("/sessions")]
pub async fn create(
    state: State,
    Auth(caller, _): Auth<Managed>,
    body: Json<CreateSession>,
) -> Result<HttpResponse, Error> {
    let key = body.request_key();
    let request = body.0;
    unsupported("resources", request.resources.as_ref().is_some_and(|r| !r.is_empty()))?;
    unsupported("vault_ids", request.vault_ids.as_ref().is_some_and(|v| !v.is_empty()))?;
    unsupported("budget", request.budget.as_ref().is_some_and(|b| !b.is_null()))?;
    let (mut agent, tools) = agent_ref(request.agent)?;
    // The SDK has no per-session opt-in to an agent's server tools (the AAP's `agent.tools`):
    // a session runs its agent as configured, trusting what the config allows.
    if let Some(configured) = state.sessions.agents().get(&agent.name) {
        agent.tools = configured_tools(&configured, &state.sessions.agents().tools);
    }
    let initial = match &request.initial_events {
        Some(events) if events.len() > 50 => {
            return Err(ApiError::invalid("invalid field `initial_events`: at most 50 events").into())
        }
        Some(events) => inputs("initial_events", events.clone(), &["user.message", "user.define_outcome"])?,
        None => Vec::new(),
    };
    let spec = SessionSpec {
        agent,
        tools,
        title: request.title,
        metadata: metadata(request.metadata)?,
        environment_id: Some(request.environment_id),
        ..SessionSpec::default()
    };
    let first = Submission { inputs: initial, when_busy: WhenBusy::Queue, request: key, ..Submission::default() };
    let summary = state.sessions.create_with_input(&caller, spec, first).await?;
    Ok(HttpResponse::Ok().json(render(&state, &summary).await?))
}

fn unsupported(field: &str, given: bool) -> Result<(), ApiError> {
    match given {
        true => Err(ApiError::invalid(format!("invalid field `{field}`: this server does not support {field}"))),
        false => Ok(()),
    }
}

/// The session's agent, and the custom tools an `agent_with_overrides` adds.
fn agent_ref(agent: Value) -> Result<(AgentSpec, Vec<ClientTool>), ApiError> {
    if let Value::String(id) = agent {
        return Ok((AgentSpec { name: id, ..AgentSpec::default() }, Vec::new()));
    }
    let agent: AgentRef =
        serde_json::from_value(agent).map_err(|e| ApiError::invalid(format!("invalid field `agent`: {e}")))?;
    let spec = AgentSpec { name: agent.id, version: agent.version, ..AgentSpec::default() };
    let overrides = agent.tools.is_some() || agent.model.is_some() || agent.system.is_some();
    match agent.kind.as_str() {
        "agent" if overrides || agent.mcp_servers.is_some() || agent.skills.is_some() => {
            Err(ApiError::invalid("invalid field `agent`: overrides need `\"type\": \"agent_with_overrides\"`"))
        }
        "agent" => Ok((spec, Vec::new())),
        "agent_with_overrides" => {
            for (name, given) in [
                ("model", agent.model.is_some()),
                ("system", agent.system.is_some()),
                ("mcp_servers", agent.mcp_servers.is_some_and(|m| !m.is_empty())),
                ("skills", agent.skills.is_some_and(|s| !s.is_empty())),
            ] {
                if given {
                    return Err(ApiError::invalid(format!(
                        "invalid field `agent.{name}`: this server overrides only an agent's `tools`"
                    )));
                }
            }
            Ok((spec, custom_tools("agent.tools", agent.tools.unwrap_or_default())?))
        }
        other => Err(ApiError::invalid(format!(
            "invalid field `agent.type`: {other:?} is not agent or agent_with_overrides"
        ))),
    }
}

/// `tools` of `"type":"custom"`: the only kind this server runs for an agent made
/// through the API (its built-in tools belong to agents configured on the server).
pub(super) fn custom_tools(field: &str, tools: Vec<Value>) -> Result<Vec<ClientTool>, ApiError> {
    tools.into_iter().enumerate().map(|(i, tool)| custom_tool(&format!("{field}[{i}]"), tool)).collect()
}

/// A `custom` tool (`at` names it in errors).
pub(super) fn custom_tool(at: &str, tool: Value) -> Result<ClientTool, ApiError> {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Custom {
        #[serde(rename = "type")]
        _kind: String,
        name: String,
        #[serde(default)]
        description: String,
        input_schema: Value,
    }
    let kind = tool.get("type").and_then(Value::as_str).unwrap_or_default().to_string();
    if kind != "custom" {
        return Err(ApiError::invalid(format!(
            "invalid field `{at}.type`: {kind:?} tools do not run on this server; declare `custom` tools"
        )));
    }
    let tool: Custom =
        serde_json::from_value(tool).map_err(|e| ApiError::invalid(format!("invalid field `{at}`: {e}")))?;
    if let Some(why) = wire::schema_problem(&tool.input_schema) {
        return Err(ApiError::invalid(format!("invalid field `{at}.input_schema`: {why}")));
    }
    Ok(ClientTool {
        name: tool.name,
        title: None,
        description: tool.description,
        input_schema: tool.input_schema,
        editor: false,
    })
}

/// Metadata: string values only, as the SDK's models have it.
pub(super) fn metadata(metadata: Option<Map<String, Value>>) -> Result<Map<String, Value>, ApiError> {
    let metadata = metadata.unwrap_or_default();
    match metadata.iter().find(|(_, v)| !v.is_string()) {
        Some((key, _)) => Err(ApiError::invalid(format!("invalid field `metadata.{key}`: must be a string"))),
        None => Ok(metadata),
    }
}

/// A metadata patch: string values set their keys, `null` deletes them.
pub(super) fn metadata_patch(patch: Option<Map<String, Value>>) -> Result<Map<String, Value>, ApiError> {
    let patch = patch.unwrap_or_default();
    match patch.iter().find(|(_, v)| !(v.is_string() || v.is_null())) {
        Some((key, _)) => Err(ApiError::invalid(format!("invalid field `metadata.{key}`: must be a string or null"))),
        None => Ok(patch),
    }
}

/// The session as the SDK wants it, with its agent's full snapshot.
pub(super) async fn render(state: &State, summary: &SessionSummary) -> Result<wire::Session, Error> {
    let agent = state.catalog.snapshot(&summary.spec.agent.name, summary.spec.agent.version);
    let activity = state.sessions.activity(summary).await?;
    Ok(wire::session(summary, agent.as_ref(), activity))
}

#[utoipa::path(
    tag = "managed",
    operation_id = "managed_sessions_retrieve",
    params(("session_id" = String, Path, description = "The session's id")),
    responses((status = 200, description = "The session", body = wire::Session)),
)]
#[get("/sessions/{session_id}")]
pub async fn retrieve(
    state: State,
    CallerSession { summary, .. }: CallerSession<Managed>,
) -> Result<HttpResponse, Error> {
    Ok(HttpResponse::Ok().json(render(&state, &summary).await?))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpdateSession {
    #[serde(default)]
    title: Option<String>,
    #[serde(default)]
    metadata: Option<Map<String, Value>>,
    #[serde(default, deserialize_with = "crate::api::body::objects")]
    agent: Option<AgentUpdate>,
    #[serde(default)]
    budget: Option<Value>,
    #[serde(default)]
    vault_ids: Option<Vec<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AgentUpdate {
    #[serde(default)]
    tools: Option<Vec<Value>>,
    #[serde(default)]
    mcp_servers: Option<Vec<Value>>,
}

#[utoipa::path(
    tag = "managed",
    operation_id = "managed_sessions_update",
    params(("Idempotency-Key" = Option<String>, Header, description = "Names this write: sent again with the same key and body, it is answered as the first time and stored once (docs/idempotency.md)", min_length = 1, max_length = 255, pattern = "^[ -~]+$"), ("session_id" = String, Path, description = "The session's id")),
    request_body(content = super::request::UpdateSession, description = "`{title?, metadata?, agent?: {tools?, mcp_servers?}}`", example = json!({"title": "renamed"})),
    responses((status = 200, description = "The session", body = wire::Session)),
)]
#[post("/sessions/{session_id}")]
pub async fn update(
    state: State,
    CallerSession { summary, .. }: CallerSession<Managed>,
    body: Json<UpdateSession>,
) -> Result<HttpResponse, Error> {
    let key = body.request_key();
    let request = body.0;
    unsupported("budget", request.budget.is_some())?;
    unsupported("vault_ids", request.vault_ids.is_some())?;
    let agent = request.agent.unwrap_or(AgentUpdate { tools: None, mcp_servers: None });
    unsupported("agent.mcp_servers", agent.mcp_servers.as_ref().is_some_and(|m| !m.is_empty()))?;
    let patch = metadata_patch(request.metadata)?;
    let update = SessionUpdate {
        title: request.title,
        metadata: Some(patch).filter(|p| !p.is_empty()),
        tools: agent.tools.map(|tools| custom_tools("agent.tools", tools)).transpose()?,
        ..SessionUpdate::default()
    };
    let summary = state.sessions.update(&summary, update, key).await?;
    Ok(HttpResponse::Ok().json(render(&state, &summary).await?))
}

#[utoipa::path(
    tag = "managed",
    operation_id = "managed_sessions_archive",
    params(("session_id" = String, Path, description = "The session's id")),
    responses((status = 200, description = "The session, archived", body = wire::Session)),
)]
#[post("/sessions/{session_id}/archive")]
pub async fn archive(
    state: State,
    CallerSession { summary, .. }: CallerSession<Managed>,
) -> Result<HttpResponse, Error> {
    let summary = state.sessions.archive(&summary).await?;
    Ok(HttpResponse::Ok().json(render(&state, &summary).await?))
}

#[utoipa::path(
    tag = "managed",
    operation_id = "managed_sessions_delete",
    params(("session_id" = String, Path, description = "The session's id")),
    responses((status = 200, description = "`{type: session_deleted, id}`", body = wire::SessionDeleted)),
)]
#[delete("/sessions/{session_id}")]
pub async fn delete(
    state: State,
    Auth(caller, _): Auth<Managed>,
    path: web::Path<String>,
) -> Result<HttpResponse, Error> {
    state.sessions.delete(&caller, &path).await?;
    let id = path.into_inner();
    Ok(HttpResponse::Ok().json(wire::SessionDeleted { kind: wire::SessionDeletedTag::Tag, id }))
}

#[derive(Debug, Default, Deserialize)]
pub struct ListQuery {
    limit: Option<usize>,
    order: Option<String>,
    page: Option<String>,
    #[serde(default, deserialize_with = "crate::api::body::query_list")]
    statuses: Vec<String>,
    include_archived: Option<bool>,
    created_at: Option<TimeQuery>,
    agent_id: Option<String>,
    agent_version: Option<u32>,
}

#[utoipa::path(
    tag = "managed",
    operation_id = "managed_sessions_list",
    params(("limit" = Option<u32>, Query, description = "Page size (cut to the server's page size)"), ("order" = Option<String>, Query, description = "`asc` or `desc`"), ("page" = Option<String>, Query, description = "The `next_page` of the previous page"), ("statuses[]" = Option<Vec<String>>, Query, description = "idle, running, rescheduling, terminated"), ("include_archived" = Option<bool>, Query), ("created_at[gt]" = Option<String>, Query, description = "RFC 3339"), ("created_at[gte]" = Option<String>, Query, description = "RFC 3339"), ("created_at[lt]" = Option<String>, Query, description = "RFC 3339"), ("created_at[lte]" = Option<String>, Query, description = "RFC 3339"), ("agent_id" = Option<String>, Query), ("agent_version" = Option<u32>, Query)),
    responses((status = 200, description = "`{data, next_page, prev_page}`", body = wire::Page<wire::Session>)),
)]
#[get("/sessions")]
pub async fn list(
    state: State,
    Auth(caller, _): Auth<Managed>,
    query: Query<ListQuery>,
) -> Result<HttpResponse, Error> {
    let query = query.0;
    let limit = limit(query.limit, 20, state.settings.limits.max_page_size)?;
    let oldest_first = !crate::api::body::newest_first(query.order.as_deref(), true)?;
    let after = match query.page.as_deref() {
        Some(page) => Some(page.parse().map_err(|_| ApiError::invalid("invalid query `page`: not a page cursor"))?),
        None => None,
    };
    for status in &query.statuses {
        if !matches!(status.as_str(), "idle" | "running" | "rescheduling" | "terminated") {
            let message =
                format!("invalid query `statuses`: {status:?} is not idle, running, rescheduling or terminated");
            return Err(ApiError::invalid(message).into());
        }
    }
    let wants = |s: &str| query.statuses.is_empty() || query.statuses.iter().any(|w| w == s);
    // Deleted sessions are not listed, and no session is ever rescheduled here.
    if !wants("idle") && !wants("running") {
        return Ok(page(Vec::<wire::Session>::new(), None));
    }
    let filter = ListFilter {
        agent: query.agent_id,
        agent_version: query.agent_version,
        created: time_bounds("created_at", query.created_at.unwrap_or_default())?,
        archived: if query.include_archived.unwrap_or(false) { None } else { Some(false) },
        running: if wants("idle") == wants("running") { None } else { Some(wants("running")) },
        oldest_first,
        after,
        limit,
        ..ListFilter::default()
    };
    let found = state.sessions.list(&caller, &filter).await?;
    let mut data = Vec::with_capacity(found.items.len());
    for summary in &found.items {
        data.push(render(&state, summary).await?);
    }
    let next = found.has_more.then(|| found.items.last().map(|s| s.id.to_string())).flatten();
    Ok(page(data, next))
}
