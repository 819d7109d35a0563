//! The front door ([`Sessions`]) and the read side: views, `turnlog acp` and the features
//! beside them reach sessions only through here. It creates, finds, lists and deletes
//! sessions with ownership checked on every call, hands input to the engine
//! ([`crate::engine`]), and reads, pages and follows logs and turns by cursor.

mod coalesce;
pub mod commands;
mod list;
mod log;
mod models;
mod modes;
mod prompts;
mod read;
mod sessions;

pub use coalesce::Coalescer;
pub use list::{Changed, ListFilter, Status};
pub use models::{ModelInfo, Models};
pub use modes::{ModeInfo, Modes};
pub use prompts::{SessionPrompts, Unavailable};
pub use read::{Activity, EventPage, EventQuery, TurnQuery};
pub use sessions::Sessions;

pub use crate::agent::mcp::{McpPrompt, McpPromptArgument};
pub use crate::domain::Caller;
pub use crate::engine::rules;
pub use crate::engine::{AgentChanges, Follows, Input, SessionUpdate, Submission, Submitted, WhenBusy};
pub use crate::error::SessionError;
pub use crate::projection::{Page, TimeBounds};
pub use crate::store::follow::{FollowError, Follower};
pub use crate::store::{Durability, Health};

pub(crate) use log::SessionLog;

use crate::domain::{EventId, TurnId};

/// A point in a session's log, as each dialect names one: an event id (native, managed
/// agents), a session sequence number, or a turn and a number within it (the harness).
/// A cursor names the last event seen; reading resumes after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cursor {
    Event(EventId),
    /// 0 is the start of the log.
    Sequence(u64),
    /// 0 is the start of the turn.
    Turn {
        turn: TurnId,
        sequence: u32,
    },
    /// An agent message's id (`msg_…`): its final event.
    Message(ulid::Ulid),
}

impl Cursor {
    /// An event id (or an agent message's id) as a client sent it; text that is neither
    /// is an unknown cursor.
    pub fn event(text: &str) -> Result<Cursor, SessionError> {
        let unknown = || SessionError::UnknownCursor(text.to_string());
        match text.strip_prefix("msg_") {
            Some(message) => ulid::Ulid::from_string(message).map(Cursor::Message).map_err(|_| unknown()),
            None => text.parse().map(Cursor::Event).map_err(|_| unknown()),
        }
    }
}

impl Cursor {
    /// Where a stream resumes, from the `after_id` it was opened with and the
    /// `Last-Event-ID` a reconnect sends (blank ones ignored). A browser sends the id of the
    /// last event it received on the same URL, after the `after_id` it opened with: of two
    /// event ids the later holds, and a `Last-Event-ID` wins otherwise.
    pub fn resume(after_id: Option<&str>, last_event_id: Option<&str>) -> Result<Option<Cursor>, SessionError> {
        let parse = |text: Option<&str>| text.map(str::trim).filter(|t| !t.is_empty()).map(Cursor::event).transpose();
        Ok(match (parse(after_id)?, parse(last_event_id)?) {
            (Some(Cursor::Event(a)), Some(Cursor::Event(b))) => Some(Cursor::Event(a.max(b))),
            (after, last) => last.or(after),
        })
    }
}

impl std::fmt::Display for Cursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Cursor::Event(id) => write!(f, "{id}"),
            Cursor::Sequence(n) => write!(f, "sequence number {n}"),
            Cursor::Turn { turn, sequence } => write!(f, "sequence number {sequence} of turn {turn}"),
            Cursor::Message(message) => write!(f, "msg_{message}"),
        }
    }
}
