//! `POST /sessions`, `GET /sessions`, `GET /sessions/{id}`, `DELETE /sessions/{id}`.

use actix_web::{delete, get, post, web, HttpResponse};

use super::wire::{CreateSession, Created, ListQuery, SessionInfo, SessionList};
use crate::api::body::{utc_time, JsonBody, Query};
use crate::api::caller::{Auth, CallerSession};
use crate::api::{Error, State};
use crate::error::ApiError;
use crate::session::{ListFilter, TimeBounds};

/// Creates a session for an agent, optionally with seed history and client tools.
#[utoipa::path(
    tag = "aap",
    operation_id = "sessions_create",
    params(("Idempotency-Key" = Option<String>, Header, description = "Names this write: sent again with the same key and body, it is answered as the first time and stored once (docs/idempotency.md)", min_length = 1, max_length = 255, pattern = "^[ -~]+$")),
    request_body(content = CreateSession, example = json!({"agent": {"name": "default"}, "title": "a session"})),
    responses((status = 201, description = "The new session's id", body = Created)),
)]
#[post("/sessions")]
pub async fn create(state: State, Auth(caller, _): Auth, body: JsonBody<CreateSession>) -> Result<HttpResponse, Error> {
    let key = body.request_key();
    let summary = state.sessions.create(&caller, body.0.into_spec(), key.as_ref()).await?;
    tracing::info!(session_id = %summary.id, agent = %summary.spec.agent.name, "session created");
    Ok(HttpResponse::Created().json(Created { session_id: summary.id.to_string() }))
}

/// The caller's sessions, newest first, a page at a time.
#[utoipa::path(
    tag = "aap",
    operation_id = "sessions_list",
    params(ListQuery),
    responses((status = 200, description = "A page of sessions; `next` continues it", body = SessionList)),
)]
#[get("/sessions")]
pub async fn list(state: State, Auth(caller, _): Auth, query: Query<ListQuery>) -> Result<HttpResponse, Error> {
    let query = query.0;
    let max = state.settings.limits.max_page_size;
    let limit = query.limit.unwrap_or(100);
    if limit == 0 || limit > max {
        return Err(ApiError::invalid(format!("invalid query `limit`: must be between 1 and {max}")).into());
    }
    let after = match query.after.as_deref() {
        Some(after) => Some(after.parse().map_err(|_| ApiError::invalid("invalid query `after`: not a session id"))?),
        None => None,
    };
    let filter = ListFilter {
        agent: query.agent,
        created_by: query.created_by,
        created: TimeBounds {
            gt: query.created_after.as_deref().map(|t| utc_time("created_after", t)).transpose()?,
            lt: query.created_before.as_deref().map(|t| utc_time("created_before", t)).transpose()?,
            ..TimeBounds::default()
        },
        after,
        limit,
        ..ListFilter::default()
    };
    let page = state.sessions.list(&caller, &filter).await?;
    let next = if page.has_more { page.items.last().map(|s| s.id.to_string()) } else { None };
    Ok(HttpResponse::Ok().json(SessionList { sessions: page.items.iter().map(SessionInfo::from).collect(), next }))
}

/// One session: its agent, client tools, title and metadata.
#[utoipa::path(
    tag = "aap",
    operation_id = "sessions_get",
    params(("session_id" = String, Path, description = "The session's id")),
    responses((status = 200, description = "The session", body = SessionInfo)),
)]
#[get("/sessions/{session_id}")]
pub async fn get(CallerSession { summary, .. }: CallerSession) -> Result<HttpResponse, Error> {
    Ok(HttpResponse::Ok().json(SessionInfo::from(&summary)))
}

/// Deletes a session and its log; a running turn is stopped first.
#[utoipa::path(
    tag = "aap",
    operation_id = "sessions_delete",
    params(("session_id" = String, Path, description = "The session's id")),
    responses((status = 204, description = "Deleted")),
)]
#[delete("/sessions/{session_id}")]
pub async fn delete(state: State, Auth(caller, _): Auth, path: web::Path<String>) -> Result<HttpResponse, Error> {
    state.sessions.delete(&caller, &path).await?;
    tracing::info!(session_id = %path, "session deleted");
    Ok(HttpResponse::NoContent().finish())
}
