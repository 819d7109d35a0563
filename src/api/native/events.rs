//! `GET /sessions/{id}/events` (a page of the log) and `POST /sessions/{id}/events`
//! (user events, answered once durable).

use actix_web::{get, post, HttpResponse};
use bytes::{BufMut, BytesMut};

use super::wire::{user_event, wire_json, ListQuery, PostEvents};
use crate::api::body::{newest_first, JsonBody, Query};
use crate::api::caller::CallerSession;
use crate::api::{Error, State};
use crate::domain::event::Confirmation;
use crate::domain::{EventBody, RawEvent};
use crate::error::ApiError;
use crate::session::{Cursor, EventQuery, Input, Submission};

/// Appends user events; answered once they are durable, with the events as stored.
#[utoipa::path(
    tag = "native",
    operation_id = "events_post",
    params(("Idempotency-Key" = Option<String>, Header, description = "Names this write: sent again with the same key and body, it is answered as the first time and stored once (docs/idempotency.md)", min_length = 1, max_length = 255, pattern = "^[ -~]+$"), ("session_id" = String, Path, description = "The session's id")),
    request_body(content = PostEvents, example = json!({"events": [{"type": "user.define_outcome", "outcome": "done"}]})),
    responses((status = 200, description = "`{\"data\": [stored events]}`", body = Object)),
)]
#[post("/sessions/{session_id}/events")]
pub async fn post(
    state: State,
    CallerSession { summary, .. }: CallerSession,
    body: JsonBody<PostEvents>,
) -> Result<HttpResponse, Error> {
    let request = body.request_key();
    let events = body.0.events;
    if events.is_empty() {
        return Err(ApiError::invalid("invalid field `events`: at least one event is needed").into());
    }
    let inputs =
        events.iter().enumerate().map(|(i, event)| user_event(i, event).map(input)).collect::<Result<_, _>>()?;
    let submission = Submission { inputs, request, ..Submission::default() };
    let submitted = state.sessions.submit(&summary, submission).await?;
    let stored: Vec<RawEvent> = submitted.events.into_iter().filter(|e| e.kind().starts_with("user.")).collect();
    Ok(json_events(&stored, None))
}

/// A user event as input for the session's engine.
fn input(body: EventBody) -> Input {
    match body {
        EventBody::UserMessage { content } => Input::Message(content),
        EventBody::UserToolConfirmation { tool_use_id, result, deny_message, remember, .. } => Input::Permission {
            call: tool_use_id,
            granted: result == Confirmation::Allow,
            reason: deny_message,
            remember,
        },
        EventBody::UserCustomToolResult { custom_tool_use_id, content, is_error, ran, .. } => {
            Input::Result { call: custom_tool_use_id, content, is_error, ran: ran.map(Box::new) }
        }
        EventBody::UserDefineOutcome { outcome } => Input::Outcome(outcome),
        EventBody::UserCompact {} => Input::Compact,
        _ => Input::Interrupt,
    }
}

/// A page of the session's log, as stored (turns' ends name the seed's stop reasons).
#[utoipa::path(
    tag = "native",
    operation_id = "events_list",
    params(("session_id" = String, Path, description = "The session's id"), ListQuery),
    responses((status = 200, description = "`{\"data\": [events], \"has_more\", ...}`", body = Object)),
)]
#[get("/sessions/{session_id}/events")]
pub async fn list(
    state: State,
    CallerSession { summary, .. }: CallerSession,
    query: Query<ListQuery>,
) -> Result<HttpResponse, Error> {
    let query = query.0;
    let max = state.settings.limits.max_page_size;
    let limit = query.limit.unwrap_or(100);
    if limit == 0 || limit > max {
        return Err(ApiError::invalid(format!("invalid query `limit`: must be between 1 and {max}")).into());
    }
    let newest_first = newest_first(query.order.as_deref(), false)?;
    let cursor = |c: Option<String>| c.map(|c| Cursor::event(&c)).transpose();
    let kinds: Vec<String> = query
        .kind
        .iter()
        .flat_map(|k| k.split(','))
        .chain(query.types.iter().map(String::as_str))
        .map(str::trim)
        .filter(|k| !k.is_empty())
        .map(String::from)
        .collect();
    let query = EventQuery {
        after: cursor(query.after_id)?,
        before: cursor(query.before_id)?,
        limit,
        newest_first,
        kinds,
        ..EventQuery::default()
    };
    let page = state.sessions.events(&summary, query).await?;
    Ok(json_events(&page.events, Some(page.has_more)))
}

/// `{"data":[...]}` (and the page fields when `has_more` is given), writing the stored
/// JSON as it is (but for the stop reasons of turns' ends, [`wire_json`]).
fn json_events(events: &[RawEvent], has_more: Option<bool>) -> HttpResponse {
    let size: usize = events.iter().map(|e| e.json.len() + 1).sum();
    let mut out = BytesMut::with_capacity(size + 128);
    out.put_slice(b"{\"data\":[");
    for (i, event) in events.iter().enumerate() {
        if i > 0 {
            out.put_u8(b',');
        }
        out.put_slice(&wire_json(event));
    }
    out.put_u8(b']');
    if let Some(has_more) = has_more {
        let id = |e: Option<&RawEvent>| e.map_or("null".to_string(), |e| format!("\"{}\"", e.id));
        out.put_slice(
            format!(",\"first_id\":{},\"last_id\":{},\"has_more\":{}", id(events.first()), id(events.last()), has_more)
                .as_bytes(),
        );
    }
    out.put_u8(b'}');
    HttpResponse::Ok().content_type("application/json").body(out.freeze())
}
