//! The caller's sessions for the console: a page of them with their status, and a stream
//! of each one as it changes.

use std::collections::HashSet;
use std::time::Duration;

use actix_web::{get, HttpResponse};
use bytes::{Bytes, BytesMut};
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::sync::broadcast::error::{RecvError, TryRecvError};

use crate::api::body::Query;
use crate::api::caller::Auth;
use crate::api::sse::{self, frame, PING};
use crate::api::{Error, State};
use crate::domain::SessionId;
use crate::error::ApiError;
use crate::projection::SessionSummary;
use crate::session::{Caller, Changed, ListFilter, SessionError, Sessions, Status};

/// Changes to one session closer together than this are sent once.
const COALESCE: Duration = Duration::from_millis(100);

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    agent: Option<String>,
    created_by: Option<String>,
    status: Option<String>,
    after: Option<String>,
    limit: Option<usize>,
}

/// A session as the console lists it.
#[derive(Debug, Serialize)]
struct Item<'a> {
    id: String,
    agent: &'a str,
    created_by: &'a str,
    created_at: &'a str,
    updated_at: &'a str,
    title: Option<&'a str>,
    status: &'static str,
}

impl<'a> Item<'a> {
    fn new(summary: &'a SessionSummary, status: Status) -> Item<'a> {
        Item {
            id: summary.id.to_string(),
            agent: &summary.spec.agent.name,
            created_by: &summary.created_by,
            created_at: &summary.created_at,
            updated_at: &summary.updated_at,
            title: summary.spec.title.as_deref(),
            status: status.as_str(),
        }
    }
}

/// A page of the caller's sessions with their status, newest first.
#[utoipa::path(
    tag = "console",
    operation_id = "console_sessions",
    params(ListQuery),
    responses((status = 200, description = "`{sessions, next}`", body = Object)),
)]
#[get("/console/api/sessions")]
pub async fn list(state: State, Auth(caller, _): Auth, query: Query<ListQuery>) -> Result<HttpResponse, Error> {
    let query = query.0;
    let max = state.settings.limits.max_page_size;
    let limit = query.limit.unwrap_or(50);
    if limit == 0 || limit > max {
        return Err(ApiError::invalid(format!("invalid query `limit`: must be between 1 and {max}")).into());
    }
    let status = match query.status.as_deref().filter(|s| !s.is_empty()) {
        None => None,
        Some(text) => Some(Status::parse(text).ok_or_else(|| {
            ApiError::invalid(format!("invalid query `status`: {text:?} is not running, idle or archived"))
        })?),
    };
    let after = match query.after.as_deref() {
        Some(after) => Some(after.parse().map_err(|_| ApiError::invalid("invalid query `after`: not a session id"))?),
        None => None,
    };
    let filter = ListFilter {
        agent: query.agent.filter(|a| !a.is_empty()),
        created_by: query.created_by.filter(|c| !c.is_empty()),
        after,
        limit,
        ..ListFilter::default()
    }
    .with_status(status);
    let page = state.sessions.list(&caller, &filter).await?;
    let statuses = state.sessions.statuses(&page.items).await?;
    let sessions: Vec<Item> =
        page.items.iter().zip(statuses).map(|(summary, status)| Item::new(summary, status)).collect();
    let next = if page.has_more { page.items.last().map(|s| s.id.to_string()) } else { None };
    Ok(HttpResponse::Ok().json(json!({"sessions": sessions, "next": next})))
}

/// `session` with each of the caller's sessions as it changes (at most one frame per
/// session per [`COALESCE`]), `removed` when one is deleted, `resync` when changes were
/// missed (the stream fell behind: the page reloads its list), and heartbeats.
/// Each of the caller's sessions as it changes, as SSE.
#[utoipa::path(
    tag = "console",
    operation_id = "console_sessions_stream",
    responses((status = 200, description = "Session changes", body = String, content_type = "text/event-stream")),
)]
#[get("/console/api/sessions/stream")]
pub async fn stream(state: State, Auth(caller, _): Auth) -> Result<HttpResponse, Error> {
    let settings = &state.settings.streams;
    let guard = state.streams.open(&caller.subject, settings.max_streams_per_subject)?;
    let mut changes = state.sessions.changes();
    let (heartbeat, retry_ms) = (Duration::from_millis(settings.heartbeat_ms), settings.retry_ms);
    let (sessions, shutdown) = (state.sessions.clone(), state.shutdown.clone());
    let body = async_stream::stream! {
        let _guard = guard;
        // Sent at once, so that the browser's `open` fires before the first change.
        let first = sse::retry(retry_ms, PING).unwrap_or_else(|| Bytes::from_static(PING));
        yield Ok::<_, std::convert::Infallible>(first);
        let mut beat = tokio::time::interval_at(tokio::time::Instant::now() + heartbeat, heartbeat);
        loop {
            let first = tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = beat.tick() => {
                    yield Ok(Bytes::from_static(PING));
                    continue;
                }
                first = changes.recv() => first,
            };
            let (mut changed, mut lagged) = (HashSet::new(), false);
            match first {
                Ok(id) => {
                    changed.insert(id);
                }
                Err(RecvError::Lagged(_)) => lagged = true,
                Err(RecvError::Closed) => break,
            }
            tokio::time::sleep(COALESCE).await;
            loop {
                match changes.try_recv() {
                    Ok(id) => {
                        changed.insert(id);
                    }
                    Err(TryRecvError::Lagged(_)) => lagged = true,
                    Err(_) => break,
                }
            }
            let out = match lagged {
                true => Ok(resync()),
                false => frames(&sessions, &caller, changed).await,
            };
            match out {
                Ok(out) if out.is_empty() => {}
                Ok(out) => yield Ok(out),
                Err(error) => {
                    tracing::warn!(%error, "the console's session stream could not read a session");
                    yield Ok(resync());
                }
            }
        }
    };
    Ok(sse::response().streaming(body))
}

fn resync() -> Bytes {
    let mut out = BytesMut::new();
    frame(&mut out, None, "resync", b"{}");
    out.freeze()
}

/// A `session` frame for each changed session the caller may see, `removed` for each deleted.
async fn frames(sessions: &Sessions, caller: &Caller, changed: HashSet<ulid::Ulid>) -> Result<Bytes, SessionError> {
    let mut out = BytesMut::new();
    for id in changed {
        match sessions.changed(caller, SessionId(id)).await? {
            Changed::Shown(summary, status) => {
                let json = serde_json::to_vec(&Item::new(&summary, status)).expect("an item serialises");
                frame(&mut out, None, "session", &json);
            }
            Changed::Gone(id) => frame(&mut out, None, "removed", json!({"id": id.to_string()}).to_string().as_bytes()),
            Changed::Hidden => {}
        }
    }
    Ok(out.freeze())
}
