//! `GET /sessions/{id}/events/stream`: replay after `after_id` or `Last-Event-ID` (the later
//! of the two: a browser's reconnect sends the last id it got; see [`Cursor::resume`]), or
//! from the start, then live events, each as `id:`, `event:` and `data:`; only the
//! `types[]` asked for, when any are.

use std::time::Duration;

use actix_web::{get, HttpRequest, HttpResponse};

use super::wire::{wire_json, StreamQuery, DEFAULT_DELTA_FLUSH_MS};
use crate::api::body::Query;
use crate::api::caller::CallerSession;
use crate::api::sse::{self, Flow, Follow};
use crate::api::{Error, State};
use crate::session::Cursor;

/// The session's events as SSE: the log after `after_id` (or `Last-Event-ID`), then live.
#[utoipa::path(
    tag = "native",
    operation_id = "events_stream",
    params(
        ("session_id" = String, Path, description = "The session's id"),
        StreamQuery,
        ("Last-Event-ID" = Option<String>, Header, description = "Resume after this event id"),
    ),
    responses((status = 200, description = "Events as `id:`, `event:`, `data:` frames", body = String, content_type = "text/event-stream")),
)]
#[get("/sessions/{session_id}/events/stream")]
pub async fn stream(
    state: State,
    CallerSession { caller, summary, .. }: CallerSession,
    query: Query<StreamQuery>,
    req: HttpRequest,
) -> Result<HttpResponse, Error> {
    let header = req.headers().get("last-event-id").and_then(|v| v.to_str().ok());
    let cursor = Cursor::resume(query.0.after_id.as_deref(), header)?;
    let follower = state.sessions.follow(&summary, cursor).await?;
    let settings = &state.settings.streams;
    let guard = state.streams.open(&caller.subject, settings.max_streams_per_subject)?;
    tracing::debug!(session_id = %summary.id, cursor = ?cursor, "stream opened");
    let flush = query.0.delta_flush_interval_ms.unwrap_or(DEFAULT_DELTA_FLUSH_MS);
    let types = query.0.types;
    let body = sse::follow(
        Follow {
            preamble: sse::retry(settings.retry_ms, b""),
            follower,
            heartbeat: Duration::from_millis(settings.heartbeat_ms),
            merge_window: (flush > 0).then(|| Duration::from_millis(flush)),
            shutdown: state.shutdown.clone(),
            guard,
        },
        move |out, event| {
            if types.is_empty() || types.iter().any(|kind| kind == event.kind()) {
                sse::frame(out, Some(event.id.text().as_str()), event.kind(), &wire_json(event));
            }
            Flow::Continue
        },
    );
    Ok(sse::response().streaming(body))
}
