//! Decisions that end things: the turn that answers queued messages, how a turn that ran
//! ended, a turn nothing runs any more, and closing a session (deleted or archived).

use super::{idle, running, Decision};
use crate::agent::ModelError;
use crate::domain::event::{ModelStop, StopReason};
use crate::domain::{Draft, EventBody, EventId, SessionId, TurnId, Usage};
use crate::engine::command::{Closing, Input, Submission};
use crate::error::SessionError;
use crate::projection::turns::{Phase, TurnState};
use crate::projection::SessionSummary;

/// The turn that answers the messages queued while the last one ran, once the session is
/// idle; `None` when nothing waits (or the session is not idle).
pub fn answer_queued(state: &TurnState, new_turn: TurnId) -> Option<Decision> {
    if state.phase != Phase::Idle || state.queued.is_empty() {
        return None;
    }
    let drafts = vec![
        Draft::new(Some(new_turn), &EventBody::TurnStarted {}),
        Draft::new(Some(new_turn), &turn_input(state)),
        Draft::new(Some(new_turn), &running()),
    ];
    Some(Decision { drafts, start: Some(new_turn), cancel: false })
}

pub(super) fn turn_input(state: &TurnState) -> EventBody {
    EventBody::TurnInput { event_ids: state.queued.clone() }
}

/// How a turn ended: a stop reason (with the calls waiting for the client), or a failure.
pub struct Outcome {
    pub stop: Result<(StopReason, Vec<EventId>), ModelError>,
    pub usage: Usage,
}

impl Outcome {
    pub fn stop_reason(&self) -> StopReason {
        match &self.stop {
            Ok((reason, _)) => *reason,
            Err(_) => StopReason::Error,
        }
    }
}

/// The events that record how a turn ended: a failure's `session.error`, then the idle
/// status with its stop reason, the calls that wait, and the turn's usage.
pub fn end_turn(turn: TurnId, outcome: &Outcome) -> Vec<Draft> {
    let mut drafts = Vec::with_capacity(2);
    let pending = match &outcome.stop {
        Ok((_, pending)) => pending.clone(),
        Err(error) => {
            let body = EventBody::SessionError {
                error: error.message.clone(),
                code: error.code.clone(),
                mcp_server: error.mcp_server.clone(),
            };
            drafts.push(Draft::new(Some(turn), &body));
            Vec::new()
        }
    };
    drafts.push(Draft::new(Some(turn), &idle(outcome.stop_reason(), pending, outcome.usage)));
    drafts
}

/// The end of a turn nothing runs and nothing will resume (a session closed, or a replay
/// ended, while it ran): `session.error` (`interrupted`, saying `why`) and an idle status.
pub fn abandoned(turn: TurnId, why: &str) -> Vec<Draft> {
    let error = EventBody::SessionError { error: why.into(), code: "interrupted".into(), mcp_server: None };
    vec![Draft::new(Some(turn), &error), Draft::new(Some(turn), &idle(StopReason::Error, vec![], Usage::default()))]
}

/// Whether the session takes the submission at all: a deleted one is gone, an archived one
/// takes nothing but a cancel (which has nothing to do), and one a replay writes into takes
/// input once the replay is done.
pub fn admit(
    session: SessionId,
    summary: &SessionSummary,
    submission: &Submission,
    replaying: bool,
) -> Result<(), SessionError> {
    if replaying {
        return Err(SessionError::Conflict(format!(
            "session {session} is replaying another session's events: it takes input once the replay is done"
        )));
    }
    if summary.deleted {
        return Err(SessionError::NotFound(session.to_string()));
    }
    let only_cancels = submission.update.is_empty()
        && !submission.inputs.is_empty()
        && submission.inputs.iter().all(|input| matches!(input, Input::Cancel));
    if summary.archived_at.is_some() && !only_cancels {
        let why = format!(
            "session {session} is closed (archived, or cancelled through the agent harness): it takes no input"
        );
        return Err(SessionError::Conflict(why));
    }
    match &summary.ended {
        Some(ended) if !only_cancels => {
            let why = format!("session {session} has ended ({}, at {}): it takes no input", ended.reason, ended.at);
            Err(SessionError::Conflict(why))
        }
        _ => Ok(()),
    }
}

/// Why a session that times out ends, in its `terminated`.
pub const IDLE_TIMEOUT: &str = "idle timeout";

/// Closing a session: a turn its log shows running that nothing here runs is ended first;
/// then a delete appends `session.deleted` and `terminated` (after which every stream
/// ends), an archive `session.archived` (once: archiving twice is archiving once). An
/// expiry ends a session idle for its timeout (`idle_for_ms` since its last event) with
/// `terminated`, once its waiting calls are cancelled; a session that ended so is kept, and
/// a delete then appends `session.deleted` alone.
pub fn close(
    session: SessionId,
    summary: &SessionSummary,
    state: &TurnState,
    closing: Closing,
    running_here: bool,
    idle_for_ms: u64,
) -> Result<Decision, SessionError> {
    if summary.deleted {
        return Err(SessionError::NotFound(session.to_string()));
    }
    if summary.ended.is_some() {
        let drafts = match closing {
            Closing::Delete => vec![Draft::new(None, &EventBody::SessionDeleted {})],
            Closing::Archive | Closing::Expire { .. } => Vec::new(),
        };
        return Ok(Decision { drafts, ..Decision::default() });
    }
    if let Closing::Expire { idle_ms } = closing {
        let idle = idle_for_ms >= idle_ms && summary.archived_at.is_none() && !running_here;
        return Ok(Decision { drafts: if idle { expire(state) } else { Vec::new() }, ..Decision::default() });
    }
    let mut drafts = match state.phase {
        Phase::Running(turn) if !running_here => abandoned(turn, "the session was closed before this turn ended"),
        _ => Vec::new(),
    };
    drafts.extend(match closing {
        Closing::Delete => vec![
            Draft::new(None, &EventBody::SessionDeleted {}),
            Draft::new(None, &EventBody::Terminated { reason: "session deleted".into() }),
        ],
        Closing::Archive if summary.archived_at.is_some() => Vec::new(),
        Closing::Archive => vec![Draft::new(None, &EventBody::SessionArchived {})],
        Closing::Expire { .. } => Vec::new(),
    });
    Ok(Decision { drafts, ..Decision::default() })
}

/// The end of an idle session: its waiting calls cancelled, then `terminated`. A turn that
/// runs (here, or on the node that holds the session) is not idle: nothing.
fn expire(state: &TurnState) -> Vec<Draft> {
    let mut drafts = match state.phase {
        Phase::Running(_) => return Vec::new(),
        Phase::Waiting(turn) => super::submit::close_waiting(state, turn),
        Phase::Idle => Vec::new(),
    };
    drafts.push(Draft::new(None, &EventBody::Terminated { reason: IDLE_TIMEOUT.into() }));
    drafts
}

/// Events of another session's log, re-emitted by a replay as they are, unless the
/// session is gone.
pub fn copy(session: SessionId, summary: &SessionSummary, drafts: &[Draft]) -> Result<Decision, SessionError> {
    if summary.deleted {
        return Err(SessionError::NotFound(session.to_string()));
    }
    Ok(Decision { drafts: drafts.to_vec(), ..Decision::default() })
}

/// What a turn does once a model's response and the calls it could run are recorded:
/// stop (with its reason, and the calls that wait for the client), or ask the model again
/// (`None`: it called tools, and every call has its result).
pub fn after_response(stop: ModelStop, called: bool, waiting: Vec<EventId>) -> Option<(StopReason, Vec<EventId>)> {
    if !waiting.is_empty() {
        return Some((StopReason::RequiresAction, waiting));
    }
    match stop {
        ModelStop::ToolUse if called => None,
        ModelStop::ToolUse | ModelStop::EndTurn => Some((StopReason::EndTurn, vec![])),
        ModelStop::MaxTokens => Some((StopReason::MaxTokens, vec![])),
        ModelStop::Refusal => Some((StopReason::Refusal, vec![])),
    }
}
