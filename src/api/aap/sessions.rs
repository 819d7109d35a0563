//! `POST /sessions`, `GET /sessions`, `GET /sessions/{id}`, `DELETE /sessions/{id}`.

use actix_web::{web, HttpResponse};

use serde_json::{Map, Value};

use super::wire::{CreateSession, Created, ListQuery, SessionInfo, SessionList, ToolSpec, ToolTrustRequest};
use crate::agent::{Agent, OptionKind, Tools};
use crate::api::body::{JsonBody, Query};
use crate::api::State;
use crate::domain::event::Permission;
use crate::error::ApiError;
use crate::projection::SessionSummary;
use crate::session::{Caller, ListFilter};

pub async fn create(state: State, caller: Caller, body: JsonBody<CreateSession>) -> Result<HttpResponse, ApiError> {
    let mut request = body.0;
    let agents = state.engine.agents();
    let Some(agent) = agents.get(&request.agent.name) else {
        let known: Vec<&str> = agents.all().map(|a| a.name.as_str()).collect();
        return Err(ApiError::invalid(format!(
            "invalid field `agent.name`: no agent named {:?}; this server has: {}",
            request.agent.name,
            known.join(", ")
        )));
    };
    if let Some(trust) = &request.agent.tools {
        check_agent_tools(&agent, &agents.tools, trust)?;
    }
    check_client_tools(&agent, &request.tools)?;
    request.agent.options = merge_options(&agent, &Map::new(), &request.agent.options)?;
    let summary = state.sessions.create(&caller, request.into_spec()).await?;
    tracing::info!(session_id = %summary.id, agent = %summary.spec.agent.name, "session created");
    Ok(HttpResponse::Created().json(Created { session_id: summary.id.to_string() }))
}

pub async fn list(state: State, caller: Caller, query: Query<ListQuery>) -> Result<HttpResponse, ApiError> {
    let query = query.0;
    let max = state.settings.limits.max_page_size;
    let limit = query.limit.unwrap_or(100);
    if limit == 0 || limit > max {
        return Err(ApiError::invalid(format!("invalid query `limit`: must be between 1 and {max}")));
    }
    let after = match query.after.as_deref() {
        Some(after) => Some(after.parse().map_err(|_| ApiError::invalid("invalid query `after`: not a session id"))?),
        None => None,
    };
    for (name, bound) in [("created_after", &query.created_after), ("created_before", &query.created_before)] {
        if let Some(bound) = bound {
            chrono::DateTime::parse_from_rfc3339(bound)
                .map_err(|e| ApiError::invalid(format!("invalid query `{name}`: not an RFC 3339 time: {e}")))?;
        }
    }
    let filter = ListFilter {
        agent: query.agent,
        created_by: query.created_by,
        created_after: query.created_after.map(|t| normalise_time(&t)),
        created_before: query.created_before.map(|t| normalise_time(&t)),
        after,
        limit,
    };
    let page = state.sessions.list(&caller, &filter)?;
    let next = if page.has_more { page.items.last().map(|s| s.id.to_string()) } else { None };
    Ok(HttpResponse::Ok().json(SessionList { sessions: page.items.iter().map(|s| info(&state, s)).collect(), next }))
}

/// Stored times are UTC with microseconds; compare like with like.
fn normalise_time(time: &str) -> String {
    chrono::DateTime::parse_from_rfc3339(time)
        .map(|t| t.with_timezone(&chrono::Utc).to_rfc3339_opts(chrono::SecondsFormat::Micros, true))
        .unwrap_or_else(|_| time.to_string())
}

pub async fn get(state: State, caller: Caller, path: web::Path<String>) -> Result<HttpResponse, ApiError> {
    let summary = state.sessions.get(&caller, &path)?;
    Ok(HttpResponse::Ok().json(info(&state, &summary)))
}

/// A session as AAP shows it, with secret options redacted.
fn info(state: &State, summary: &SessionSummary) -> SessionInfo {
    let mut info = SessionInfo::from(summary);
    if let Some(agent) = state.engine.agents().get(&summary.spec.agent.name) {
        for option in agent.config.options.iter().filter(|o| o.kind == OptionKind::Secret) {
            if let Some(value) = info.agent.options.get_mut(&option.name) {
                *value = Value::String("***".into());
            }
        }
    }
    info
}

/// `agent.tools` may name only the agent's exposed tools, once each.
pub(super) fn check_agent_tools(agent: &Agent, tools: &Tools, trust: &[ToolTrustRequest]) -> Result<(), ApiError> {
    let offered: Vec<&str> = agent
        .config
        .tools
        .iter()
        .filter(|(name, permission)| **permission != Permission::Deny && tools.exposed(name))
        .map(|(name, _)| name.as_str())
        .collect();
    for (i, tool) in trust.iter().enumerate() {
        if !offered.contains(&tool.name.as_str()) {
            return Err(ApiError::invalid(format!(
                "invalid field `agent.tools[{i}].name`: agent {:?} has no tool {:?}; it offers: {}",
                agent.name,
                tool.name,
                offered.join(", ")
            )));
        }
        if trust[..i].iter().any(|t| t.name == tool.name) {
            return Err(ApiError::invalid(format!(
                "invalid field `agent.tools[{i}].name`: {:?} is listed twice",
                tool.name
            )));
        }
    }
    Ok(())
}

/// Client tool names must be unique, and unique across the agent's tools.
pub(super) fn check_client_tools(agent: &Agent, client: &[ToolSpec]) -> Result<(), ApiError> {
    for (i, tool) in client.iter().enumerate() {
        if tool.name.trim().is_empty() {
            return Err(ApiError::invalid(format!("invalid field `tools[{i}].name`: must not be empty")));
        }
        if agent.config.tools.contains_key(&tool.name) {
            return Err(ApiError::invalid(format!(
                "invalid field `tools[{i}].name`: {:?} clashes with a tool of agent {:?}; tool names must be unique \
                 across the client's and the agent's tools",
                tool.name, agent.name
            )));
        }
        if client[..i].iter().any(|t| t.name == tool.name) {
            return Err(ApiError::invalid(format!(
                "invalid field `tools[{i}].name`: {:?} is declared twice",
                tool.name
            )));
        }
    }
    Ok(())
}

/// Options merge by key; each must be one the agent declares, and a select's value one of
/// its choices.
pub(super) fn merge_options(
    agent: &Agent,
    current: &Map<String, Value>,
    changes: &Map<String, Value>,
) -> Result<Map<String, Value>, ApiError> {
    let mut merged = current.clone();
    for (name, value) in changes {
        let Some(spec) = agent.config.options.iter().find(|o| &o.name == name) else {
            return Err(ApiError::invalid(format!(
                "invalid field `agent.options.{name}`: agent {:?} has no option {name:?}",
                agent.name
            )));
        };
        let Some(text) = value.as_str() else {
            return Err(ApiError::invalid(format!("invalid field `agent.options.{name}`: must be a string")));
        };
        if spec.kind == OptionKind::Select && !spec.options.iter().any(|o| o == text) {
            return Err(ApiError::invalid(format!(
                "invalid field `agent.options.{name}`: {text:?} is not one of {}",
                spec.options.join(", ")
            )));
        }
        merged.insert(name.clone(), value.clone());
    }
    Ok(merged)
}

pub async fn delete(state: State, caller: Caller, path: web::Path<String>) -> Result<HttpResponse, ApiError> {
    let summary = state.sessions.get(&caller, &path)?;
    state.engine.cancel(summary.id).await;
    state.sessions.delete(&caller, &path).await?;
    tracing::info!(session_id = %path, "session deleted");
    Ok(HttpResponse::NoContent().finish())
}
