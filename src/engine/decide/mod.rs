//! The decisions, with no IO: given what an actor knows of its session and a command, the
//! events to append (and what the actor does once they are stored), or the refusal. Every
//! event the engine appends is decided here; the actor folds the log, calls these, and
//! appends what they return; the turn loop records what a model did through [`calls`].
//!
//! - [`submit`]: a client's input (messages, results, permissions, interrupts, cancels).
//! - [`ends`]: how turns end and sessions close.
//! - [`calls`]: a model's (or a seed history's) tool calls, and the denials among them.
//! - [`resume`]: a turn whose process stopped, going on from its log.

mod calls;
mod ends;
mod resume;
mod submit;

pub use calls::{denials, plan_calls, seed_settled, seed_waiting, Call};
pub use ends::{abandoned, admit, after_response, answer_queued, close, copy, end_turn, Outcome, IDLE_TIMEOUT};
pub use resume::{resume, Next, Resume, ResumePoint, INTERRUPTED, RETRIES_EXHAUSTED};
pub use submit::decide;

use crate::domain::event::{StopInfo, StopReason};
use crate::domain::{Draft, EventBody, EventId, TurnId, Usage};

/// What to append, and what the actor does once it is stored.
#[derive(Debug, Default)]
pub struct Decision {
    pub drafts: Vec<Draft>,
    /// The turn these events start.
    pub start: Option<TurnId>,
    /// Whether the running turn is to be cancelled.
    pub cancel: bool,
}

pub fn running() -> EventBody {
    EventBody::StatusRunning { status: "running".into() }
}

pub fn idle(reason: StopReason, event_ids: Vec<EventId>, usage: Usage) -> EventBody {
    EventBody::StatusIdle { status: "idle".into(), stop_reason: StopInfo { kind: reason, event_ids }, usage }
}

#[cfg(test)]
mod tests;
