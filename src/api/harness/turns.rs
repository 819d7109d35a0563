//! Turns: create one (streamed, or answered at once with the running turn), list and get
//! them, subscribe to one from any sequence number, and list a finished turn's events.

use std::time::Duration;

use actix_web::{get, post, web, HttpRequest, HttpResponse};
use bytes::BytesMut;

use super::event::{Turn, TurnEvent};
use super::fold::{Item, TurnFold};
use super::wire::{self, CreateTurn, ListTurnEvents, ListTurns, Subscribe};
use super::{bad_token, data, limit, page, CallerSession, Error, Harness, Json, Query};
use crate::api::body::{newest_first, parse_json, RawBody};
use crate::api::sse::{self, Flow, Follow};
use crate::api::State;
use crate::domain::{EventBody, EventId, RawEvent, TurnId};
use crate::error::{ApiError, Code};
use crate::projection::{SessionSummary, TurnSummary};
use crate::session::{Cursor, EventQuery, Follower, Follows, SessionError, Submission, TurnQuery};

/// `POST /turns`: the turn starts from its input and streams (SSE) unless `stream` is
/// false, when the answer is the running turn. The turn is the session's: a client that
/// goes away does not stop it.
#[utoipa::path(
    tag = "harness",
    operation_id = "harness_turns_create",
    params(("Idempotency-Key" = Option<String>, Header, description = "Names this write: sent again with the same key and body, it is answered as the first time and stored once (docs/idempotency.md)", min_length = 1, max_length = 255, pattern = "^[ -~]+$"), ("session_id" = String, Path, description = "The session's id")),
    request_body(content = CreateTurn, example = json!({"input": [{"type": "user.message", "content": [{"type": "text", "text": "hello"}]}], "stream": false})),
    responses((status = 200, description = "The turn as SSE (`stream: true`; each frame's `data` a `HarnessTurnEvent`, its `id:` the sequence number), or the running turn", content((wire::Data<Turn> = "application/json"), (String = "text/event-stream")))),
)]
#[post("/{session_id}/turns")]
pub async fn create(
    state: State,
    CallerSession { caller, summary, .. }: CallerSession<Harness>,
    body: Json<CreateTurn>,
) -> Result<HttpResponse, Error> {
    let request = body.request_key();
    let CreateTurn { input, previous_turn_id, stream } = body.0;
    let inputs = wire::inputs(input)?;
    let follows = wire::follows(previous_turn_id.as_deref())?;
    if let Follows::Turn(named) = follows {
        // A turn of this session, or 404 naming it (an earlier one is branched from).
        state.sessions.turn(&summary, &named.to_string()).await?;
    }
    // Counted and following from the current end before the turn starts, so that every
    // event of the turn is seen and a refused stream starts nothing.
    let live = match stream {
        true => {
            let guard = state.streams.open(&caller.subject, state.settings.streams.max_streams_per_subject)?;
            Some((guard, state.sessions.follow_live(&summary).await?))
        }
        false => None,
    };
    let submission = Submission { inputs, all_at_once: true, follows, request, ..Submission::default() };
    let submitted = state.sessions.submit(&summary, submission).await?;
    let turn = submitted.turn.ok_or_else(|| ApiError::internal("a turn request started no turn"))?;
    tracing::debug!(session_id = %summary.id, turn_id = %turn, "turn started");
    let previous = previous(&state, &summary, turn).await?;
    let fold = fold_of(&state, &summary, turn, previous, &submitted.events).await?;
    match live {
        Some((guard, follower)) if !submitted.recalled => Ok(respond(&state, guard, follower, fold, 0)),
        // A request sent again with its key: its turn may be far on, so from the turn's
        // start, as a subscription does.
        Some((guard, _)) => {
            let follower = state.sessions.follow(&summary, Some(Cursor::Turn { turn, sequence: 0 })).await?;
            Ok(respond(&state, guard, follower, fold, 0))
        }
        None => {
            let mut fold = fold;
            for event in &submitted.events {
                fold.push(event);
            }
            Ok(data(fold.turn()))
        }
    }
}

/// The session's turns, newest first.
#[utoipa::path(
    tag = "harness",
    operation_id = "harness_turns_list",
    params(("session_id" = String, Path, description = "The session's id"), ListTurns),
    responses((status = 200, description = "`{data, pagination}`", body = wire::Page<Turn>)),
)]
#[get("/{session_id}/turns")]
pub async fn list(
    state: State,
    CallerSession { summary, .. }: CallerSession<Harness>,
    query: Query<ListTurns>,
) -> Result<HttpResponse, Error> {
    let query = query.0;
    let limit = limit(query.limit, 10, 100)?;
    let before = match &query.page_token {
        // A token that is no turn's id is a bad one; a turn that is not there, not found.
        Some(token) => {
            let id = token.parse::<TurnId>().map_err(|_| bad_token(token))?;
            Some(state.sessions.turn(&summary, &id.to_string()).await?.id)
        }
        None => None,
    };
    // One more than the page: the turn before the page's last is that one's previous turn.
    let found = state.sessions.turns(&summary, TurnQuery { before, limit: limit + 1 }).await?;
    let mut data = Vec::new();
    for (i, turn) in found.items.iter().take(limit).enumerate() {
        let previous = found.items.get(i + 1).map(|t| t.id);
        let (fold, _) = folded(&state, &summary, turn, previous).await?;
        data.push(fold.turn());
    }
    let next = (found.items.len() > limit).then(|| found.items[limit - 1].id.to_string());
    Ok(page(data, limit, next))
}

#[utoipa::path(
    tag = "harness",
    operation_id = "harness_turns_get",
    params(("session_id" = String, Path, description = "The session's id"), ("turn_id" = String, Path, description = "The turn's id")),
    responses((status = 200, description = "The turn", body = wire::Data<Turn>)),
)]
#[get("/{session_id}/turns/{turn_id}")]
pub async fn get(
    state: State,
    CallerSession { summary, .. }: CallerSession<Harness>,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, Error> {
    let (_, turn) = path.into_inner();
    let turn = state.sessions.turn(&summary, &turn).await?;
    let previous = previous(&state, &summary, turn.id).await?;
    let (fold, _) = folded(&state, &summary, &turn, previous).await?;
    Ok(data(fold.turn()))
}

/// The turn's stream from its start, or after a sequence number: `Last-Event-Id` if sent,
/// else the body's `after_sequence_number` (exclusive). Any turn, running or not: a
/// finished one replays to its `turn.done`.
#[utoipa::path(
    tag = "harness",
    operation_id = "harness_turns_subscribe",
    params(("session_id" = String, Path, description = "The session's id"), ("turn_id" = String, Path, description = "The turn's id"), ("Last-Event-Id" = Option<String>, Header, description = "Resume after this sequence number (one of the turn's)", pattern = "^ *[0-9]{1,19} *$")),
    request_body(content = Subscribe, example = json!({})),
    responses((status = 200, description = "The turn's events as SSE, with integer sequence numbers", body = String, content_type = "text/event-stream")),
)]
#[post("/{session_id}/turns/{turn_id}/subscribe")]
pub async fn subscribe(
    state: State,
    CallerSession { caller, summary, .. }: CallerSession<Harness>,
    path: web::Path<(String, String)>,
    request: HttpRequest,
    RawBody(body, _): RawBody<Harness>,
) -> Result<HttpResponse, Error> {
    let (_, turn) = path.into_inner();
    let turn = state.sessions.turn(&summary, &turn).await?;
    let asked: Subscribe = if body.is_empty() { Subscribe::default() } else { parse_json(&body)? };
    let header = request.headers().get("last-event-id").map(|v| {
        let text = v.to_str().unwrap_or_default().trim();
        text.parse::<u64>().map_err(|_| {
            ApiError::invalid(format!("invalid header `Last-Event-Id`: {text:?} is not a sequence number"))
        })
    });
    let after = match header {
        Some(number) => number?,
        None => asked.after_sequence_number.unwrap_or(0),
    };
    if after > 0 {
        known_number(&state, &summary, &turn, after).await?;
    }
    let guard = state.streams.open(&caller.subject, state.settings.streams.max_streams_per_subject)?;
    let previous = previous(&state, &summary, turn.id).await?;
    // `turn.started`, then `turn.input` if the turn takes queued messages.
    let head = state.sessions.turn_events(&summary, &turn, 0, 2).await?;
    let fold = fold_of(&state, &summary, turn.id, previous, &head).await?;
    let follower = state.sessions.follow(&summary, Some(Cursor::Turn { turn: turn.id, sequence: 0 })).await?;
    Ok(respond(&state, guard, follower, fold, after))
}

/// Refuses a sequence number that names no event of the turn.
async fn known_number(state: &State, summary: &SessionSummary, turn: &TurnSummary, after: u64) -> Result<(), Error> {
    let unknown = || {
        ApiError::invalid(format!(
            "invalid `after_sequence_number`: {after} is not a sequence number of turn {}",
            turn.id
        ))
    };
    let sequence = u32::try_from(after / 10).map_err(|_| unknown())?;
    let query = EventQuery { after: Some(Cursor::Turn { turn: turn.id, sequence }), limit: 0, ..EventQuery::default() };
    match state.sessions.events(summary, query).await {
        Ok(_) => Ok(()),
        Err(SessionError::UnknownCursor(_)) => Err(unknown().into()),
        Err(error) => Err(error.into()),
    }
}

/// A finished turn's events: whole messages, tool responses and the actions it waits for
/// (no `turn.created`/`turn.done`, no deltas), oldest first unless `order=desc`. The page
/// token is the last event's sequence number.
#[utoipa::path(
    tag = "harness",
    operation_id = "harness_turns_events",
    params(("session_id" = String, Path, description = "The session's id"), ("turn_id" = String, Path, description = "The turn's id"), ListTurnEvents),
    responses((status = 200, description = "`{data, pagination}`", body = wire::Page<TurnEvent>)),
)]
#[get("/{session_id}/turns/{turn_id}/events")]
pub async fn events(
    state: State,
    CallerSession { summary, .. }: CallerSession<Harness>,
    path: web::Path<(String, String)>,
    query: Query<ListTurnEvents>,
) -> Result<HttpResponse, Error> {
    let (_, turn) = path.into_inner();
    let turn = state.sessions.turn(&summary, &turn).await?;
    let query = query.0;
    let limit = limit(query.limit, 25, 25)?;
    let newest_first = newest_first(query.order.as_deref(), false)?;
    let from = match &query.page_token {
        Some(token) => Some(token.parse::<u64>().map_err(|_| bad_token(token))?),
        None => None,
    };
    if turn.stop.is_none() {
        let message =
            format!("turn {} is running: its events list once it has ended; subscribe to it for them live", turn.id);
        return Err(ApiError::new(Code::Busy, message).into());
    }
    let previous = previous(&state, &summary, turn.id).await?;
    let (_, items) = folded(&state, &summary, &turn, previous).await?;
    let mut listed: Vec<Item> = items.into_iter().filter(|i| i.place.in_turn_list()).collect();
    if newest_first {
        listed.reverse();
    }
    let mut listed: Vec<Item> = listed
        .into_iter()
        .filter(|i| from.is_none_or(|from| if newest_first { i.id < from } else { i.id > from }))
        .take(limit + 1)
        .collect();
    let more = listed.len() > limit;
    listed.truncate(limit);
    let next = more.then(|| listed.last().map(|i| i.id.to_string())).flatten();
    Ok(page(listed.into_iter().map(|i| i.event).collect::<Vec<_>>(), limit, next))
}

/// The turn `turn` follows: the one it branched from, or else the one before it.
pub(super) async fn previous(
    state: &State,
    summary: &SessionSummary,
    turn: TurnId,
) -> Result<Option<TurnId>, SessionError> {
    if let Some(from) = state.sessions.turn(summary, &turn.to_string()).await?.branched_from {
        return Ok(Some(from));
    }
    let before = state.sessions.turns(summary, TurnQuery { before: Some(turn), limit: 1 }).await?;
    Ok(before.items.first().map(|t| t.id))
}

/// A turn's events so far, folded: the fold (for the `Turn` object) and every harness
/// event it made.
pub(super) async fn folded(
    state: &State,
    summary: &SessionSummary,
    turn: &TurnSummary,
    previous: Option<TurnId>,
) -> Result<(TurnFold, Vec<Item>), SessionError> {
    let stored: Vec<RawEvent> = state.sessions.turn_events(summary, turn, 0, usize::MAX).await?;
    let mut fold = fold_of(state, summary, turn.id, previous, &stored).await?;
    let items = stored.iter().flat_map(|event| fold.push(event)).collect();
    Ok((fold, items))
}

/// A fold of the turn that knows the queued messages its `turn.input` (among `head`, its
/// first events) names: they lie before the turn in the log.
async fn fold_of(
    state: &State,
    summary: &SessionSummary,
    turn: TurnId,
    previous: Option<TurnId>,
    head: &[RawEvent],
) -> Result<TurnFold, SessionError> {
    let named: Vec<EventId> = head
        .iter()
        .filter(|raw| raw.kind() == "turn.input" && raw.turn().is_some_and(|(of, _)| of == turn))
        .filter_map(|raw| match raw.decode().map(|event| event.body) {
            Ok(EventBody::TurnInput { event_ids }) => Some(event_ids),
            _ => None,
        })
        .flatten()
        .collect();
    let queued = match named.is_empty() {
        true => Vec::new(),
        false => state.sessions.events_by_id(summary, &named).await?,
    };
    Ok(TurnFold::new(summary, turn, previous).knowing(&queued))
}

/// The turn's stream: every frame after `after` with its sequence number as `id:`, to its
/// `turn.done`, with `: ping` comments between.
fn respond(
    state: &State,
    guard: crate::api::StreamGuard,
    follower: Follower,
    mut fold: TurnFold,
    after: u64,
) -> HttpResponse {
    let settings = &state.settings.streams;
    let body = sse::follow(
        Follow {
            preamble: None,
            follower,
            heartbeat: Duration::from_millis(settings.heartbeat_ms),
            merge_window: None,
            shutdown: state.shutdown.clone(),
            guard,
        },
        move |out: &mut BytesMut, raw: &RawEvent| {
            for item in fold.push(raw).into_iter().filter(|i| i.place.streamed() && i.id > after) {
                frame(out, &item);
            }
            if fold.ended() {
                Flow::End
            } else {
                Flow::Continue
            }
        },
    );
    sse::response().streaming(body)
}

fn frame(out: &mut BytesMut, item: &Item) {
    let data = serde_json::to_vec(&item.event).expect("events serialise");
    sse::frame(out, Some(&item.id.to_string()), item.event.kind(), &data);
}
