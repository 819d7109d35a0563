//! `/v1/agents` and `/v1/environments`: made, versioned and archived through the catalog,
//! stored in turnlog's log like everything else. An agent made here is a real turnlog
//! agent: the AAP `/meta` lists it, and its `model` picks a model from the server's config.

use actix_web::{delete, get, post, web, HttpResponse};
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::sessions::{custom_tool, metadata, metadata_patch};
use super::wire::{self, TimeQuery};
use super::{limit, page, time_bounds, Auth, Error, Json, Managed, Query};
use crate::api::State;
use crate::catalog::{AgentChange, CatalogFilter, EnvironmentChange, NewAgent, NewEnvironment};
use crate::domain::catalog::{McpServerDecl, McpToolRule, McpToolset};
use crate::domain::event::{ClientTool, Permission};
use crate::error::ApiError;
use crate::session::{Page, SessionError};

pub fn routes(cfg: &mut utoipa_actix_web::service_config::ServiceConfig) {
    cfg.service(create_agent)
        .service(list_agents)
        .service(retrieve_agent)
        .service(update_agent)
        .service(archive_agent)
        .service(agent_versions)
        .service(create_environment)
        .service(list_environments)
        .service(retrieve_environment)
        .service(update_environment)
        .service(delete_environment)
        .service(archive_environment);
}

/// What an agent may be given here. Fields this server has nothing to do with are refused
/// by name rather than kept and ignored.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentBody {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    model: Option<Value>,
    #[serde(default, deserialize_with = "nullable")]
    description: Option<Option<String>>,
    #[serde(default, deserialize_with = "nullable")]
    system: Option<Option<String>>,
    #[serde(default, deserialize_with = "nullable")]
    tools: Option<Option<Vec<Value>>>,
    #[serde(default)]
    metadata: Option<Map<String, Value>>,
    #[serde(default, deserialize_with = "nullable")]
    mcp_servers: Option<Option<Vec<Value>>>,
    #[serde(default)]
    skills: Option<Option<Vec<Value>>>,
    #[serde(default)]
    execution_identity: Option<Value>,
    #[serde(default)]
    multiagent: Option<Value>,
    #[serde(default, deserialize_with = "crate::api::body::integer")]
    version: Option<u32>,
}

impl AgentBody {
    fn unsupported(&self) -> Result<(), ApiError> {
        let identity_default = |v: &Value| v.is_null() || v == &json!({"type": "service_account"});
        for (field, given) in [
            ("skills", self.skills.clone().flatten().is_some_and(|s| !s.is_empty())),
            ("execution_identity", self.execution_identity.as_ref().is_some_and(|v| !identity_default(v))),
            ("multiagent", self.multiagent.as_ref().is_some_and(|v| !v.is_null())),
        ] {
            if given {
                return Err(ApiError::invalid(format!(
                    "invalid field `{field}`: this server does not support {field}"
                )));
            }
        }
        Ok(())
    }
}

/// An agent's `tools`: its custom tools, and the toolsets of its MCP servers.
fn agent_tools(tools: Vec<Value>) -> Result<(Vec<ClientTool>, Vec<McpToolset>), ApiError> {
    let (mut custom, mut toolsets) = (Vec::new(), Vec::new());
    for (i, tool) in tools.into_iter().enumerate() {
        let at = format!("tools[{i}]");
        match tool.get("type").and_then(Value::as_str) {
            Some("mcp_toolset") => toolsets.push(toolset(&at, tool)?),
            _ => custom.push(custom_tool(&at, tool)?),
        }
    }
    Ok((custom, toolsets))
}

/// An `mcp_toolset` as sent.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Toolset {
    #[serde(rename = "type")]
    _kind: String,
    mcp_server_name: String,
    #[serde(default)]
    default_config: Option<Config>,
    #[serde(default)]
    configs: Vec<ToolConfig>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    #[serde(default)]
    enabled: Option<bool>,
    #[serde(default)]
    permission_policy: Option<Policy>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ToolConfig {
    name: String,
    #[serde(default)]
    enabled: Option<bool>,
    #[serde(default)]
    permission_policy: Option<Policy>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Policy {
    #[serde(rename = "type")]
    kind: String,
}

/// `{"type": "mcp_toolset", "mcp_server_name", "default_config"?, "configs"?}`: every tool of
/// the server, enabled and `always_ask` unless the defaults or a tool's config say otherwise.
fn toolset(at: &str, tool: Value) -> Result<McpToolset, ApiError> {
    let policy = |field: String, policy: Option<Policy>| -> Result<Option<Permission>, ApiError> {
        match policy.map(|p| p.kind).as_deref() {
            None => Ok(None),
            Some("always_allow") => Ok(Some(Permission::Allow)),
            Some("always_ask") => Ok(Some(Permission::Ask)),
            Some(other) => Err(ApiError::invalid(format!(
                "invalid field `{field}.permission_policy.type`: {other:?}: this server takes always_allow or always_ask"
            ))),
        }
    };
    let toolset: Toolset =
        serde_json::from_value(tool).map_err(|e| ApiError::invalid(format!("invalid field `{at}`: {e}")))?;
    let defaults = toolset.default_config.unwrap_or(Config { enabled: None, permission_policy: None });
    let mut rules = Vec::new();
    for (i, config) in toolset.configs.into_iter().enumerate() {
        let field = format!("{at}.configs[{i}]");
        if config.name.is_empty() || rules.iter().any(|r: &McpToolRule| r.name == config.name) {
            return Err(ApiError::invalid(format!("invalid field `{field}.name`: empty or named twice")));
        }
        let permission = policy(field, config.permission_policy)?;
        rules.push(McpToolRule { name: config.name, enabled: config.enabled, permission });
    }
    Ok(McpToolset {
        server: toolset.mcp_server_name,
        enabled: defaults.enabled.unwrap_or(true),
        permission: policy(format!("{at}.default_config"), defaults.permission_policy)?.unwrap_or(Permission::Ask),
        rules,
    })
}

/// `mcp_servers`: `[{"type": "url", "name", "url"}]`.
fn mcp_servers(servers: Vec<Value>) -> Result<Vec<McpServerDecl>, ApiError> {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Server {
        #[serde(rename = "type")]
        kind: String,
        name: String,
        url: String,
    }
    let parse = |(i, server): (usize, Value)| {
        let server: Server = serde_json::from_value(server)
            .map_err(|e| ApiError::invalid(format!("invalid field `mcp_servers[{i}]`: {e}")))?;
        if server.kind != "url" {
            let kind = server.kind;
            return Err(ApiError::invalid(format!("invalid field `mcp_servers[{i}].type`: {kind:?}: must be \"url\"")));
        }
        Ok(McpServerDecl { name: server.name, url: server.url })
    };
    servers.into_iter().enumerate().map(parse).collect()
}

/// A field that may be absent (keep), `null` (clear) or a value (replace).
fn nullable<'de, D: serde::Deserializer<'de>, T: Deserialize<'de>>(de: D) -> Result<Option<Option<T>>, D::Error> {
    Option::<T>::deserialize(de).map(Some)
}

/// A model as a string or `{"id": …}`.
fn model(model: Value) -> Result<String, ApiError> {
    match model {
        Value::String(id) => Ok(id),
        Value::Object(fields) => match fields.get("id") {
            Some(Value::String(id)) => Ok(id.clone()),
            _ => Err(ApiError::invalid("invalid field `model.id`: a string is required")),
        },
        _ => Err(ApiError::invalid("invalid field `model`: a model id or {\"id\": …} is required")),
    }
}

#[utoipa::path(
    tag = "managed",
    operation_id = "managed_agents_create",
    params(("Idempotency-Key" = Option<String>, Header, description = "Names this write: sent again with the same key and body, it is answered as the first time and stored once (docs/idempotency.md)", min_length = 1, max_length = 255, pattern = "^[ -~]+$")),
    request_body(content = super::request::CreateAgent, description = "`{name, model, system?, tools?, mcp_servers?, metadata?}`", example = json!({"name": "helper", "model": "scripted"})),
    responses((status = 200, description = "The agent", body = wire::Agent)),
)]
#[post("/agents")]
async fn create_agent(
    state: State,
    Auth(caller, _): Auth<Managed>,
    body: Json<AgentBody>,
) -> Result<HttpResponse, Error> {
    let key = body.request_key();
    let body = body.0;
    body.unsupported()?;
    if body.version.is_some() {
        return Err(ApiError::invalid("invalid field `version`: a new agent starts at version 1").into());
    }
    let (tools, mcp_toolsets) = agent_tools(body.tools.flatten().unwrap_or_default())?;
    let new = NewAgent {
        name: body.name.ok_or_else(|| ApiError::invalid("invalid field `name`: required"))?,
        model: model(body.model.ok_or_else(|| ApiError::invalid("invalid field `model`: required"))?)?,
        description: body.description.flatten(),
        system: body.system.flatten(),
        tools,
        mcp_servers: mcp_servers(body.mcp_servers.flatten().unwrap_or_default())?,
        mcp_toolsets,
        metadata: metadata(body.metadata)?,
    };
    let agent = state.catalog.create_agent(&caller, new, key.as_ref()).await?;
    Ok(HttpResponse::Ok().json(wire::agent(&agent)))
}

#[utoipa::path(
    tag = "managed",
    operation_id = "managed_agents_update",
    params(("agent_id" = String, Path, description = "The agent's id")),
    request_body(content = super::request::ChangeAgent, description = "`{version, ...changes}`", example = json!({"version": 1, "description": "changed"})),
    responses((status = 200, description = "The agent's new version", body = wire::Agent)),
)]
#[post("/agents/{agent_id}")]
async fn update_agent(
    state: State,
    Auth(caller, _): Auth<Managed>,
    path: web::Path<String>,
    body: Json<AgentBody>,
) -> Result<HttpResponse, Error> {
    let body = body.0;
    body.unsupported()?;
    let patch = metadata_patch(body.metadata)?;
    let (tools, mcp_toolsets) = match body.tools {
        Some(tools) => agent_tools(tools.unwrap_or_default()).map(|(t, m)| (Some(t), Some(m)))?,
        None => (None, None),
    };
    let change = AgentChange {
        version: body.version,
        name: body.name,
        description: body.description.map(|d| d.filter(|d| !d.is_empty())),
        model: body.model.map(model).transpose()?,
        system: body.system.map(|s| s.filter(|s| !s.is_empty())),
        tools,
        mcp_servers: body.mcp_servers.map(|s| mcp_servers(s.unwrap_or_default())).transpose()?,
        mcp_toolsets,
        metadata: Some(patch).filter(|p| !p.is_empty()),
    };
    let agent = state.catalog.update_agent(&caller, &path, change).await?;
    Ok(HttpResponse::Ok().json(wire::agent(&agent)))
}

#[derive(Debug, Default, Deserialize)]
pub struct VersionQuery {
    version: Option<u32>,
}

#[utoipa::path(
    tag = "managed",
    operation_id = "managed_agents_retrieve",
    params(("agent_id" = String, Path, description = "The agent's id"), ("version" = Option<u32>, Query)),
    responses((status = 200, description = "The agent", body = wire::Agent)),
)]
#[get("/agents/{agent_id}")]
async fn retrieve_agent(
    state: State,
    Auth(caller, _): Auth<Managed>,
    path: web::Path<String>,
    query: Query<VersionQuery>,
) -> Result<HttpResponse, Error> {
    let agent = state.catalog.agent(&caller, &path, query.0.version);
    let agent = agent.ok_or_else(|| SessionError::CatalogNotFound(format!("agent {path}")))?;
    Ok(HttpResponse::Ok().json(wire::agent(&agent)))
}

#[utoipa::path(
    tag = "managed",
    operation_id = "managed_agents_archive",
    params(("agent_id" = String, Path, description = "The agent's id")),
    responses((status = 200, description = "The agent, archived", body = wire::Agent)),
)]
#[post("/agents/{agent_id}/archive")]
async fn archive_agent(
    state: State,
    Auth(caller, _): Auth<Managed>,
    path: web::Path<String>,
) -> Result<HttpResponse, Error> {
    let agent = state.catalog.archive_agent(&caller, &path).await?;
    Ok(HttpResponse::Ok().json(wire::agent(&agent)))
}

#[derive(Debug, Default, Deserialize)]
pub struct CatalogQuery {
    limit: Option<usize>,
    page: Option<String>,
    include_archived: Option<bool>,
    created_at: Option<TimeQuery>,
}

impl CatalogQuery {
    fn filter(self, state: &State) -> Result<CatalogFilter, ApiError> {
        Ok(CatalogFilter {
            include_archived: self.include_archived.unwrap_or(false),
            created: time_bounds("created_at", self.created_at.unwrap_or_default())?,
            after: self.page,
            limit: limit(self.limit, 20, state.settings.limits.max_page_size)?,
        })
    }
}

/// A catalog page: the next page starts after its last item.
fn catalog_page<T, W: serde::Serialize + utoipa::ToSchema>(
    found: Page<T>,
    render: impl Fn(&T) -> W,
    id: impl Fn(&T) -> String,
) -> HttpResponse {
    let next = found.has_more.then(|| found.items.last().map(&id)).flatten();
    page(found.items.iter().map(render).collect(), next)
}

#[utoipa::path(
    tag = "managed",
    operation_id = "managed_agents_list",
    params(("limit" = Option<u32>, Query, description = "Page size (cut to the server's page size)"), ("page" = Option<String>, Query, description = "The `next_page` of the previous page"), ("include_archived" = Option<bool>, Query), ("created_at[gt]" = Option<String>, Query, description = "RFC 3339"), ("created_at[gte]" = Option<String>, Query, description = "RFC 3339"), ("created_at[lt]" = Option<String>, Query, description = "RFC 3339"), ("created_at[lte]" = Option<String>, Query, description = "RFC 3339")),
    responses((status = 200, description = "`{data, next_page, prev_page}`", body = wire::Page<wire::Agent>)),
)]
#[get("/agents")]
async fn list_agents(
    state: State,
    Auth(caller, _): Auth<Managed>,
    query: Query<CatalogQuery>,
) -> Result<HttpResponse, Error> {
    let filter = query.0.filter(&state)?;
    let found = state.catalog.agents(&caller, &filter).await?;
    Ok(catalog_page(found, wire::agent, |a| a.id.clone()))
}

#[utoipa::path(
    tag = "managed",
    operation_id = "managed_agents_versions",
    params(("agent_id" = String, Path, description = "The agent's id"), ("limit" = Option<u32>, Query, description = "Page size (cut to the server's page size)"), ("page" = Option<String>, Query, description = "The `next_page` of the previous page")),
    responses((status = 200, description = "`{data, next_page, prev_page}`", body = wire::Page<wire::Agent>)),
)]
#[get("/agents/{agent_id}/versions")]
async fn agent_versions(
    state: State,
    Auth(caller, _): Auth<Managed>,
    path: web::Path<String>,
    query: Query<CatalogQuery>,
) -> Result<HttpResponse, Error> {
    let query = query.0;
    let all = state.catalog.agent_versions(&caller, &path).await?;
    let limit = limit(query.limit, 20, state.settings.limits.max_page_size)?;
    let from = match query.page.as_deref() {
        Some(page) => page.parse::<u32>().map_err(|_| ApiError::invalid("invalid query `page`: not a page cursor"))?,
        None => 0,
    };
    let rest: Vec<_> = all.iter().filter(|v| v.version > from).collect();
    let next = (rest.len() > limit).then(|| rest[limit - 1].version.to_string());
    Ok(page(rest.into_iter().take(limit).map(wire::agent).collect(), next))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnvironmentBody {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    config: Option<Value>,
    #[serde(default, deserialize_with = "nullable")]
    description: Option<Option<String>>,
    #[serde(default)]
    metadata: Option<Map<String, Value>>,
    #[serde(default)]
    scope: Option<String>,
}

fn config(config: Option<Value>) -> Result<Value, ApiError> {
    wire::environment_config(config).map_err(|why| ApiError::invalid(format!("invalid field `config`: {why}")))
}

fn scope(scope: &Option<String>) -> Result<(), ApiError> {
    match scope.as_deref() {
        None | Some("organization") => Ok(()),
        Some(other) => {
            Err(ApiError::invalid(format!("invalid field `scope`: {other:?}: this server has only organization scope")))
        }
    }
}

#[utoipa::path(
    tag = "managed",
    operation_id = "managed_environments_create",
    params(("Idempotency-Key" = Option<String>, Header, description = "Names this write: sent again with the same key and body, it is answered as the first time and stored once (docs/idempotency.md)", min_length = 1, max_length = 255, pattern = "^[ -~]+$")),
    request_body(content = super::request::CreateEnvironment, description = "`{name, config?}`", example = json!({"name": "env"})),
    responses((status = 200, description = "The environment", body = wire::Environment)),
)]
#[post("/environments")]
async fn create_environment(
    state: State,
    Auth(caller, _): Auth<Managed>,
    body: Json<EnvironmentBody>,
) -> Result<HttpResponse, Error> {
    let key = body.request_key();
    let body = body.0;
    scope(&body.scope)?;
    let new = NewEnvironment {
        name: body
            .name
            .filter(|n| !n.trim().is_empty())
            .ok_or_else(|| ApiError::invalid("invalid field `name`: required"))?,
        description: body.description.flatten(),
        config: config(body.config)?,
        metadata: metadata(body.metadata)?,
    };
    let environment = state.catalog.create_environment(&caller, new, key.as_ref()).await?;
    Ok(HttpResponse::Ok().json(wire::environment(&environment)))
}

#[utoipa::path(
    tag = "managed",
    operation_id = "managed_environments_update",
    params(("environment_id" = String, Path, description = "The environment's id")),
    request_body(content = super::request::ChangeEnvironment, description = "`{name?, config?}`", example = json!({"name": "renamed"})),
    responses((status = 200, description = "The environment", body = wire::Environment)),
)]
#[post("/environments/{environment_id}")]
async fn update_environment(
    state: State,
    Auth(caller, _): Auth<Managed>,
    path: web::Path<String>,
    body: Json<EnvironmentBody>,
) -> Result<HttpResponse, Error> {
    let body = body.0;
    scope(&body.scope)?;
    // An empty value deletes its key, as `null` does.
    let empty_deletes = |(k, v): (String, Value)| (k, if v.as_str() == Some("") { Value::Null } else { v });
    let patch: Map<String, Value> = metadata_patch(body.metadata)?.into_iter().map(empty_deletes).collect();
    let change = EnvironmentChange {
        name: body.name,
        description: body.description,
        config: body.config.map(|c| config(Some(c))).transpose()?,
        metadata: Some(patch).filter(|p| !p.is_empty()),
    };
    let environment = state.catalog.update_environment(&caller, &path, change).await?;
    Ok(HttpResponse::Ok().json(wire::environment(&environment)))
}

#[utoipa::path(
    tag = "managed",
    operation_id = "managed_environments_retrieve",
    params(("environment_id" = String, Path, description = "The environment's id")),
    responses((status = 200, description = "The environment", body = wire::Environment)),
)]
#[get("/environments/{environment_id}")]
async fn retrieve_environment(
    state: State,
    Auth(caller, _): Auth<Managed>,
    path: web::Path<String>,
) -> Result<HttpResponse, Error> {
    let environment = state.catalog.environment(&caller, &path).await?;
    Ok(HttpResponse::Ok().json(wire::environment(&environment)))
}

#[utoipa::path(
    tag = "managed",
    operation_id = "managed_environments_archive",
    params(("environment_id" = String, Path, description = "The environment's id")),
    responses((status = 200, description = "The environment, archived", body = wire::Environment)),
)]
#[post("/environments/{environment_id}/archive")]
async fn archive_environment(
    state: State,
    Auth(caller, _): Auth<Managed>,
    path: web::Path<String>,
) -> Result<HttpResponse, Error> {
    let environment = state.catalog.archive_environment(&caller, &path).await?;
    Ok(HttpResponse::Ok().json(wire::environment(&environment)))
}

#[utoipa::path(
    tag = "managed",
    operation_id = "managed_environments_delete",
    params(("environment_id" = String, Path, description = "The environment's id")),
    responses((status = 200, description = "`{type: environment_deleted, id}`", body = wire::EnvironmentDeleted)),
)]
#[delete("/environments/{environment_id}")]
async fn delete_environment(
    state: State,
    Auth(caller, _): Auth<Managed>,
    path: web::Path<String>,
) -> Result<HttpResponse, Error> {
    state.catalog.delete_environment(&caller, &path).await?;
    let id = path.into_inner();
    Ok(HttpResponse::Ok().json(wire::EnvironmentDeleted { kind: wire::EnvironmentDeletedTag::Tag, id }))
}

#[utoipa::path(
    tag = "managed",
    operation_id = "managed_environments_list",
    params(("limit" = Option<u32>, Query, description = "Page size (cut to the server's page size)"), ("page" = Option<String>, Query, description = "The `next_page` of the previous page"), ("include_archived" = Option<bool>, Query), ("created_at[gt]" = Option<String>, Query, description = "RFC 3339"), ("created_at[gte]" = Option<String>, Query, description = "RFC 3339"), ("created_at[lt]" = Option<String>, Query, description = "RFC 3339"), ("created_at[lte]" = Option<String>, Query, description = "RFC 3339")),
    responses((status = 200, description = "`{data, next_page, prev_page}`", body = wire::Page<wire::Environment>)),
)]
#[get("/environments")]
async fn list_environments(
    state: State,
    Auth(caller, _): Auth<Managed>,
    query: Query<CatalogQuery>,
) -> Result<HttpResponse, Error> {
    let filter = query.0.filter(&state)?;
    let found = state.catalog.environments(&caller, &filter).await?;
    Ok(catalog_page(found, wire::environment, |e| e.id.clone()))
}
