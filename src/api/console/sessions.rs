//! The caller's sessions for the console: a page of them with their status, and a stream
//! of each one as it changes.

use std::collections::HashSet;
use std::time::Duration;

use actix_web::HttpResponse;
use bytes::{Bytes, BytesMut};
use serde::{Deserialize, Serialize};
use tokio::sync::broadcast::error::RecvError;

use crate::api::auth::Auth;
use crate::api::body::Query;
use crate::api::native::sse_response;
use crate::api::sse::{frame, PING};
use crate::api::{Error, State};
use crate::domain::SessionId;
use crate::error::ApiError;
use crate::projection::SessionSummary;
use crate::session::{Activity, Caller, ListFilter, Sessions};

/// Changes to one session closer together than this are sent once.
const COALESCE: Duration = Duration::from_millis(100);

#[derive(Debug, Deserialize)]
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
    fn new(summary: &'a SessionSummary, activity: &Activity) -> Item<'a> {
        let status = match (summary.archived_at.is_some(), activity.running) {
            (true, _) => "archived",
            (false, true) => "running",
            (false, false) => "idle",
        };
        Item {
            id: summary.id.to_string(),
            agent: &summary.spec.agent.name,
            created_by: &summary.created_by,
            created_at: &summary.created_at,
            updated_at: &summary.updated_at,
            title: summary.spec.title.as_deref(),
            status,
        }
    }
}

pub async fn list(state: State, Auth(caller, _): Auth, query: Query<ListQuery>) -> Result<HttpResponse, Error> {
    let query = query.0;
    let max = state.settings.limits.max_page_size;
    let limit = query.limit.unwrap_or(50);
    if limit == 0 || limit > max {
        return Err(ApiError::invalid(format!("invalid query `limit`: must be between 1 and {max}")).into());
    }
    let (running, archived) = match query.status.as_deref().unwrap_or("") {
        "" => (None, None),
        "running" => (Some(true), Some(false)),
        "idle" => (Some(false), Some(false)),
        "archived" => (None, Some(true)),
        other => {
            return Err(ApiError::invalid(format!(
                "invalid query `status`: {other:?} is not running, idle or archived"
            ))
            .into())
        }
    };
    let after = match query.after.as_deref() {
        Some(after) => Some(after.parse().map_err(|_| ApiError::invalid("invalid query `after`: not a session id"))?),
        None => None,
    };
    let filter = ListFilter {
        agent: query.agent.filter(|a| !a.is_empty()),
        created_by: query.created_by.filter(|c| !c.is_empty()),
        running,
        archived,
        after,
        limit,
        ..ListFilter::default()
    };
    let page = state.sessions.list(&caller, &filter).await?;
    let mut sessions = Vec::with_capacity(page.items.len());
    for summary in &page.items {
        sessions.push(serde_json::to_value(Item::new(summary, &state.sessions.activity(summary).await?)).unwrap());
    }
    let next = if page.has_more { page.items.last().map(|s| s.id.to_string()) } else { None };
    Ok(HttpResponse::Ok().json(serde_json::json!({"sessions": sessions, "next": next})))
}

/// `session` with each of the caller's sessions as it changes (at most one frame per
/// session per [`COALESCE`]), `resync` when changes were missed (the stream fell behind:
/// the page reloads its list), and heartbeats.
pub async fn stream(state: State, Auth(caller, _): Auth) -> Result<HttpResponse, Error> {
    let settings = &state.settings.streams;
    let guard = state.streams.open(&caller.subject, settings.max_streams_per_subject)?;
    let mut changes = state.sessions.changes();
    let heartbeat = Duration::from_millis(settings.heartbeat_ms);
    let (sessions, shutdown) = (state.sessions.clone(), state.shutdown.clone());
    let body = async_stream::stream! {
        let _guard = guard;
        // Sent at once, so that the browser's `open` fires before the first change.
        yield Ok::<_, std::convert::Infallible>(Bytes::from_static(PING));
        loop {
            let first = tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tokio::time::sleep(heartbeat) => {
                    yield Ok(Bytes::from_static(PING));
                    continue;
                }
                first = changes.recv() => first,
            };
            let mut changed = HashSet::new();
            let mut lagged = false;
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
                    Err(tokio::sync::broadcast::error::TryRecvError::Lagged(_)) => lagged = true,
                    Err(_) => break,
                }
            }
            if lagged {
                let mut out = BytesMut::new();
                frame(&mut out, None, "resync", b"{}");
                yield Ok(out.freeze());
                continue;
            }
            match frames(&sessions, &caller, changed).await {
                Ok(Some(out)) => yield Ok(out),
                Ok(None) => {}
                Err(error) => {
                    tracing::warn!(%error, "the console's session stream could not read a session");
                    let mut out = BytesMut::new();
                    frame(&mut out, None, "resync", b"{}");
                    yield Ok(out.freeze());
                }
            }
        }
    };
    Ok(sse_response().streaming(body))
}

/// A `session` frame for each changed session the caller may see.
async fn frames(
    sessions: &Sessions,
    caller: &Caller,
    changed: HashSet<ulid::Ulid>,
) -> Result<Option<Bytes>, crate::session::SessionError> {
    let mut out = BytesMut::new();
    for id in changed {
        if let Some((summary, activity)) = sessions.changed(caller, SessionId(id)).await? {
            let json = serde_json::to_vec(&Item::new(&summary, &activity)).expect("an item serialises");
            frame(&mut out, None, "session", &json);
        }
    }
    Ok((!out.is_empty()).then(|| out.freeze()))
}
