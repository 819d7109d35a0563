//! Resuming a turn whose process stopped (a crash, a stop past its grace, a node that
//! died): it goes on from its log. A model request in flight is made again, and what it
//! had streamed is discarded; a server call that had started and has no result runs again
//! if it may run twice, and is answered as interrupted otherwise; calls that wait for the
//! client keep waiting. A turn resumed `max_resumes` times is closed instead.

use super::calls::error_result;
use super::{after_response, idle, running};
use crate::domain::event::StopReason;
use crate::domain::{Draft, EventBody, EventId, TurnId, Usage};
use crate::projection::progress::TurnProgress;
use crate::projection::turns::{PendingCall, TurnState};

/// The error code of a turn closed because it was resumed too often.
pub const RETRIES_EXHAUSTED: &str = "retries_exhausted";

/// What the answer to an interrupted call says, for the model to read.
pub const INTERRUPTED: &str = "Tool call interrupted: the server stopped while this call was running, so it may or \
     may not have taken effect. It was not run again.";

/// Whether and how a turn left running goes on.
#[derive(Debug)]
pub enum Resume {
    /// The turn is closed with these events.
    Close(Vec<Draft>),
    /// These events first (the retraction, the answers of interrupted calls), then the
    /// turn goes on from the point.
    Go(Vec<Draft>, ResumePoint),
}

/// Where a resumed turn goes on from.
#[derive(Debug, Clone, PartialEq)]
pub struct ResumePoint {
    /// Calls to run again first (safe to run twice).
    pub rerun: Vec<PendingCall>,
    pub next: Next,
    /// Model requests the turn made before, which count against its limit.
    pub requests: u32,
    /// What those requests used (the one the process stopped in as estimated).
    pub usage: Usage,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Next {
    /// Ask the model (again).
    Model,
    /// The last response was whole: the turn stops, with the calls that wait.
    Stop(StopReason, Vec<EventId>),
}

/// The decision for `turn`, which the log shows running and nothing runs: `progress` is
/// folded from its events, `state` is the session's.
pub fn resume(turn: TurnId, progress: &TurnProgress, state: &TurnState, max_resumes: u32) -> Resume {
    // The request in flight ended with the process: its span is closed as failed, counted
    // to have used its input and what it streamed (its provider never said).
    let cut = progress.open_span.as_ref().map(|open| open.estimated_usage()).unwrap_or_default();
    let span_end = progress.open_span.as_ref().map(|open| {
        let end = EventBody::ModelRequestEnd {
            span_id: open.span_id.clone(),
            model: open.model.clone(),
            usage: cut,
            is_error: true,
            model_request_start_id: Some(open.start),
            stop_reason: None,
            context_window: None,
            usage_estimated: true,
        };
        Draft::new(Some(turn), &end)
    });
    let mut usage = progress.usage;
    usage += cut;
    let mut started: Vec<PendingCall> = progress.running_calls.clone();
    for granted in &state.granted {
        if !started.iter().any(|call| call.event_id == granted.event_id) {
            started.push(granted.clone());
        }
    }
    // The user's interrupt was stored before the process stopped: the turn ends as the
    // cancel would have ended it.
    if progress.interrupted {
        let mut drafts: Vec<Draft> = span_end.into_iter().collect();
        for call in &started {
            drafts
                .push(Draft::new(Some(turn), &error_result(call.event_id, &call.tool_call_id, "Tool call cancelled")));
        }
        drafts.push(Draft::new(Some(turn), &idle(StopReason::Cancelled, vec![], usage)));
        return Resume::Close(drafts);
    }
    if progress.resumes >= max_resumes {
        let mut drafts: Vec<Draft> = span_end.into_iter().collect();
        let why = format!(
            "the server stopped while this turn was running, and again each of the {} times it was resumed \
             (turns.max_resumes); it is closed",
            progress.resumes
        );
        let error = EventBody::SessionError { error: why, code: RETRIES_EXHAUSTED.into(), mcp_server: None };
        drafts.push(Draft::new(Some(turn), &error));
        drafts.push(Draft::new(Some(turn), &idle(StopReason::Error, vec![], usage)));
        return Resume::Close(drafts);
    }
    let (rerun, interrupted): (Vec<PendingCall>, Vec<PendingCall>) = started.into_iter().partition(|c| c.idempotent);
    let resumed = EventBody::TurnResumed {
        attempt: progress.resumes + 1,
        reason: "the server stopped while this turn was running".into(),
        discarded: progress.unfinished.clone(),
        rerun: rerun.iter().map(|call| call.event_id).collect(),
        interrupted: interrupted.iter().map(|call| call.event_id).collect(),
    };
    // The retraction first: a view that puts messages together drops the unfinished one
    // before the span's end would close it.
    let mut drafts = vec![Draft::new(Some(turn), &resumed)];
    drafts.extend(span_end);
    drafts.push(Draft::new(Some(turn), &running()));
    for call in &interrupted {
        drafts.push(Draft::new(Some(turn), &error_result(call.event_id, &call.tool_call_id, INTERRUPTED)));
    }
    for (event_id, tool_call_id, name) in &progress.denied {
        let text = format!("Tool call denied: {name:?} is not available in this session, or the user rejects it");
        drafts.push(Draft::new(Some(turn), &error_result(*event_id, tool_call_id, &text)));
    }
    let waiting: Vec<EventId> = state.pending.keys().copied().collect();
    let next = match progress.last_stop {
        // Calls wait for the client (a seed history's, say): the turn waits with them.
        _ if !waiting.is_empty() => Next::Stop(StopReason::RequiresAction, waiting),
        // No request ended since the last one started (or none was made), or it failed.
        None | Some((None, _)) => Next::Model,
        Some((Some(stop), called)) => match after_response(stop, called, waiting) {
            None => Next::Model,
            Some((reason, waiting)) => Next::Stop(reason, waiting),
        },
    };
    // The request the process stopped in is made again: it counts once.
    let requests = progress.requests - u32::from(progress.open_span.is_some());
    Resume::Go(drafts, ResumePoint { rerun, next, requests, usage })
}
