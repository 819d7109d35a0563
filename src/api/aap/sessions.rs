//! `POST /sessions`, `GET /sessions`, `GET /sessions/{id}`, `DELETE /sessions/{id}`.

use actix_web::{web, HttpResponse};

use super::wire::{CreateSession, Created, ListQuery, SessionInfo, SessionList};
use crate::api::body::{JsonBody, Query};
use crate::api::State;
use crate::error::ApiError;
use crate::session::{Caller, ListFilter};

pub async fn create(
    state: State,
    caller: Caller,
    body: JsonBody<CreateSession>,
) -> Result<HttpResponse, ApiError> {
    let request = body.0;
    if request.agent.name.trim().is_empty() {
        return Err(ApiError::invalid(
            "invalid field `agent.name`: must not be empty",
        ));
    }
    let summary = state.sessions.create(&caller, request.into_spec()).await?;
    tracing::info!(session_id = %summary.id, agent = %summary.spec.agent.name, "session created");
    Ok(HttpResponse::Created().json(Created {
        session_id: summary.id.to_string(),
    }))
}

pub async fn list(
    state: State,
    caller: Caller,
    query: Query<ListQuery>,
) -> Result<HttpResponse, ApiError> {
    let query = query.0;
    let max = state.settings.limits.max_page_size;
    let limit = query.limit.unwrap_or(100);
    if limit == 0 || limit > max {
        return Err(ApiError::invalid(format!(
            "invalid query `limit`: must be between 1 and {max}"
        )));
    }
    let after = match query.after.as_deref() {
        Some(after) => Some(
            after
                .parse()
                .map_err(|_| ApiError::invalid("invalid query `after`: not a session id"))?,
        ),
        None => None,
    };
    for (name, bound) in [
        ("created_after", &query.created_after),
        ("created_before", &query.created_before),
    ] {
        if let Some(bound) = bound {
            chrono::DateTime::parse_from_rfc3339(bound).map_err(|e| {
                ApiError::invalid(format!("invalid query `{name}`: not an RFC 3339 time: {e}"))
            })?;
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
    let next = if page.has_more {
        page.items.last().map(|s| s.id.to_string())
    } else {
        None
    };
    Ok(HttpResponse::Ok().json(SessionList {
        sessions: page.items.iter().map(SessionInfo::from).collect(),
        next,
    }))
}

/// Stored times are UTC with microseconds; compare like with like.
fn normalise_time(time: &str) -> String {
    chrono::DateTime::parse_from_rfc3339(time)
        .map(|t| {
            t.with_timezone(&chrono::Utc)
                .to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
        })
        .unwrap_or_else(|_| time.to_string())
}

pub async fn get(
    state: State,
    caller: Caller,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let summary = state.sessions.get(&caller, &path)?;
    Ok(HttpResponse::Ok().json(SessionInfo::from(&summary)))
}

pub async fn delete(
    state: State,
    caller: Caller,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    state.sessions.delete(&caller, &path).await?;
    tracing::info!(session_id = %path, "session deleted");
    Ok(HttpResponse::NoContent().finish())
}
