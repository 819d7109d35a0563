//! Sessions: create, list, get and cancel, and a session's events across its turns.

use actix_web::{get, post, HttpResponse};

use super::event::TurnEvent;
use super::turns::{folded, previous};
use super::wire::{self, CreateSession, ListSessionEvents, ListSessions, SessionEvent};
use super::{bad_token, data, limit, page, Auth, CallerSession, Error, Harness, Json, Query};
use crate::api::body::{newest_first, utc_time};
use crate::api::State;
use crate::domain::event::{AgentSpec, SessionSpec};
use crate::domain::{SessionId, TurnId};
use crate::error::{ApiError, Code};
use crate::projection::TurnSummary;
use crate::session::rules::configured_tools;
use crate::session::{Caller, Input, ListFilter, Submission, TimeBounds, TurnQuery};

#[utoipa::path(
    tag = "harness",
    operation_id = "harness_sessions_create",
    params(("Idempotency-Key" = Option<String>, Header, description = "Names this write: sent again with the same key and body, it is answered as the first time and stored once (docs/idempotency.md)", min_length = 1, max_length = 255, pattern = "^[ -~]+$")),
    request_body(content = CreateSession, example = json!({"agent_name": "default"})),
    responses((status = 200, description = "The session", body = wire::Data<wire::Session>)),
)]
#[post("")]
pub async fn create(
    state: State,
    Auth(caller, _): Auth<Harness>,
    body: Json<CreateSession>,
) -> Result<HttpResponse, Error> {
    let request = body.request_key();
    let CreateSession { agent_name, title } = body.0;
    known_agent(&state, &caller, &agent_name)?;
    // The harness has no way to pick an agent's server tools: a session runs its agent as
    // configured, trusting what the config allows.
    let agents = state.sessions.agents();
    let tools = agents.get(&agent_name).and_then(|agent| configured_tools(&agent, &agents.tools));
    let agent = AgentSpec { name: agent_name, tools, ..AgentSpec::default() };
    let spec = SessionSpec { agent, title, ..SessionSpec::default() };
    let summary = state.sessions.create(&caller, spec, request.as_ref()).await?;
    tracing::info!(session_id = %summary.id, agent = %summary.spec.agent.name, "session created");
    Ok(data(wire::session(&summary)))
}

/// An agent the caller may see: a configured agent by name, or a catalog agent by id.
fn known_agent(state: &State, caller: &Caller, name: &str) -> Result<(), ApiError> {
    match state.catalog.agent(caller, name, None) {
        Some(_) => Ok(()),
        None => Err(ApiError::new(Code::NotFound, format!("no agent named {name:?}"))),
    }
}

#[utoipa::path(
    tag = "harness",
    operation_id = "harness_sessions_list",
    params(ListSessions),
    responses((status = 200, description = "`{data, pagination}`", body = wire::Page<wire::Session>)),
)]
#[get("")]
pub async fn list(
    state: State,
    Auth(caller, _): Auth<Harness>,
    query: Query<ListSessions>,
) -> Result<HttpResponse, Error> {
    let query = query.0;
    known_agent(&state, &caller, &query.agent_name)?;
    let limit = limit(query.limit, 100, 100)?;
    let after = match &query.page_token {
        Some(token) => Some(token.parse::<SessionId>().map_err(|_| bad_token(token))?),
        None => None,
    };
    let time = |name, value: &Option<String>| value.as_deref().map(|t| utc_time(name, t)).transpose();
    let filter = ListFilter {
        agent: Some(query.agent_name.clone()),
        created_by: query.created_by_subject_slug.filter(|slug| !slug.is_empty()),
        created: TimeBounds {
            gte: time("start_timestamp", &query.start_timestamp)?,
            lte: time("end_timestamp", &query.end_timestamp)?,
            ..TimeBounds::default()
        },
        oldest_first: !newest_first(query.order.as_deref(), true)?,
        after,
        limit,
        ..ListFilter::default()
    };
    let found = state.sessions.list(&caller, &filter).await?;
    let next = found.has_more.then(|| found.items.last().map(|s| s.id.to_string())).flatten();
    Ok(page(found.items.iter().map(wire::session).collect::<Vec<_>>(), limit, next))
}

#[utoipa::path(
    tag = "harness",
    operation_id = "harness_sessions_get",
    params(("session_id" = String, Path, description = "The session's id")),
    responses((status = 200, description = "The session", body = wire::Data<wire::Session>)),
)]
#[get("/{session_id}")]
pub async fn get(CallerSession { summary, .. }: CallerSession<Harness>) -> Result<HttpResponse, Error> {
    Ok(data(wire::session(&summary)))
}

/// Cancels the session: the running turn ends (answered once its end is recorded) and the
/// session takes no new turn (`create_turn()` then raises: 422, naming the cancel), as the
/// harness says of `Session.cancel()`. The SDK's `Turn.cancel()` calls the same route, so it
/// closes the session too. Idempotent. The session is kept, listed and readable; in the
/// other views it is archived, which is the same state.
#[utoipa::path(
    tag = "harness",
    operation_id = "harness_sessions_cancel",
    params(("session_id" = String, Path, description = "The session's id")),
    responses((status = 200, description = "`{}`, once the turn's end is recorded", body = wire::Cancelled)),
)]
#[post("/{session_id}/cancel")]
pub async fn cancel(
    state: State,
    CallerSession { summary, .. }: CallerSession<Harness>,
) -> Result<HttpResponse, Error> {
    if summary.archived_at.is_none() {
        // The running turn first, as the client's cancel (`client-cancelled`), then the session.
        let cancel = Submission { inputs: vec![Input::Cancel], ..Submission::default() };
        state.sessions.submit(&summary, cancel).await?;
        state.sessions.archive(&summary).await?;
        tracing::info!(session_id = %summary.id, "session cancelled");
    }
    Ok(HttpResponse::Ok().json(wire::Cancelled {}))
}

/// The session's events, newest first, across its turns: each turn's `turn.created`, what
/// it said and did (whole messages, no deltas), and its `turn.done`, as `{turn_id, event}`.
/// From `last_turn_id` (or the last turn) back; a turn that still runs is left out (its
/// stream has its events). The page token names the last event given.
#[utoipa::path(
    tag = "harness",
    operation_id = "harness_sessions_events",
    params(("session_id" = String, Path, description = "The session's id"), ListSessionEvents),
    responses((status = 200, description = "`{data, pagination}`", body = wire::Page<SessionEvent>)),
)]
#[get("/{session_id}/events")]
pub async fn events(
    state: State,
    CallerSession { summary, .. }: CallerSession<Harness>,
    query: Query<ListSessionEvents>,
) -> Result<HttpResponse, Error> {
    let query = query.0;
    let limit = limit(query.limit, 100, 100)?;
    let sessions = &state.sessions;
    // The turn to start from, and the event of it to continue before.
    let (mut turn, mut before) = match (&query.page_token, &query.last_turn_id) {
        (Some(token), _) => {
            let (turn, id) = token
                .split_once(':')
                .and_then(|(turn, id)| Some((turn.parse::<TurnId>().ok()?, id.parse::<u64>().ok()?)))
                .ok_or_else(|| bad_token(token))?;
            let turn = sessions.turn(&summary, &turn.to_string()).await?;
            (Some(turn), Some(id))
        }
        (None, Some(last)) => (Some(skip_running(&state, &summary, sessions.turn(&summary, last).await?).await?), None),
        (None, None) => {
            let last = sessions.turns(&summary, TurnQuery { before: None, limit: 1 }).await?.items.pop();
            match last {
                Some(last) => (Some(skip_running(&state, &summary, last).await?), None),
                None => (None, None),
            }
        }
    };
    let mut items: Vec<(TurnId, u64, TurnEvent)> = Vec::new();
    while let Some(current) = turn.filter(|t| t.stop.is_some()) {
        let previous = previous(&state, &summary, current.id).await?;
        let (_, all) = folded(&state, &summary, &current, previous).await?;
        let listed = all.into_iter().rev().filter(|i| i.place.in_session_list());
        let older = listed.filter(|i| before.is_none_or(|b| i.id < b));
        items.extend(older.map(|i| (current.id, i.id, i.event)));
        if items.len() > limit {
            break;
        }
        before = None;
        turn = match previous {
            Some(previous) => Some(sessions.turn(&summary, &previous.to_string()).await?),
            None => None,
        };
    }
    let more = items.len() > limit;
    items.truncate(limit);
    let next = more.then(|| items.last().map(|(turn, id, _)| format!("{turn}:{id}"))).flatten();
    let events = items.into_iter().map(|(turn, _, event)| SessionEvent { turn_id: turn.to_string(), event }).collect();
    Ok(page::<SessionEvent>(events, limit, next))
}

/// The turn itself once it has ended; its previous one while it runs.
async fn skip_running(
    state: &State,
    summary: &crate::projection::SessionSummary,
    turn: TurnSummary,
) -> Result<TurnSummary, Error> {
    if turn.stop.is_some() {
        return Ok(turn);
    }
    match previous(state, summary, turn.id).await? {
        Some(previous) => Ok(state.sessions.turn(summary, &previous.to_string()).await?),
        // A running first turn: nothing to list yet.
        None => Ok(turn),
    }
}
