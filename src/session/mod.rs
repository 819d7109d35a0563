//! The session layer: the one front door ([`Sessions`]) through which views, the turn
//! engine and recovery reach the log. It creates, finds, lists and deletes sessions with
//! ownership checked on every call, hands input to the engine, and reads, pages and
//! follows logs and turns by cursor.
//!
//! Inside: [`decide`] (the pure decision step), [`rules`] (what a session's setup may
//! hold), the engine and its actors, the turn loop, and `log` (the one way into the log).

mod actor;
mod audit;
pub mod catalog;
pub mod cluster;
mod coalesce;
pub mod decide;
mod engine;
mod follow;
mod log;
mod replay;
pub mod rules;
mod sessions;
pub mod turn;

pub use audit::{start_replay, Pace};
pub use catalog::Catalog;
pub use coalesce::Coalescer;
pub use engine::{
    AgentChanges, EngineSettings, Follows, Input, InputLimits, SessionUpdate, Submission, Submitted, WhenBusy,
};
pub use follow::{FollowError, Follower};
pub use sessions::{
    Activity, Changed, EventPage, EventQuery, ListFilter, Page, Sessions, Status, TimeBounds, TurnQuery,
};

pub(crate) use engine::Engine;
pub(crate) use log::SessionLog;

use crate::domain::{EventId, TurnId};
use crate::projection::SessionSummary;
use crate::store::StoreError;

/// Who is calling: the subject of the API key, and whether it may see every session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub subject: String,
    pub admin: bool,
}

impl Caller {
    pub fn may_see(&self, summary: &SessionSummary) -> bool {
        self.may_use(&summary.created_by)
    }

    /// Whether the caller may see and use what `owner` made.
    pub fn may_use(&self, owner: &str) -> bool {
        self.admin || owner == self.subject
    }
}

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

#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("session {0} not found")]
    NotFound(String),
    #[error("turn {turn} not found in session {session}")]
    TurnNotFound { turn: String, session: String },
    /// An agent or environment of the catalog.
    #[error("{0} not found")]
    CatalogNotFound(String),
    #[error("{0} is not an event of this session")]
    UnknownCursor(String),
    #[error("{0}")]
    Conflict(String),
    /// A turn runs, and the input needs the session idle.
    #[error("{0}")]
    Busy(String),
    /// The turn the client named as the one its new turn follows is not the session's last.
    #[error("{0}")]
    PreviousTurn(String),
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    Limit(String),
    /// A piece of input would be stored as an event larger than `limits.max_event_bytes`.
    #[error("{0}")]
    TooLarge(String),
    /// Something the request needs cannot be reached now (an MCP server): try again later.
    #[error("{0}")]
    Unavailable(String),
    /// The caller may see the session but not do this.
    #[error("{0}")]
    Forbidden(String),
    #[error("the service is shutting down")]
    ShuttingDown,
    /// The session's actor stopped before it took the submission: send it again.
    #[error("retry")]
    Retry(Box<engine::Submission>),
    #[error(transparent)]
    Storage(#[from] StoreError),
}

#[derive(Debug, Clone, Copy)]
pub struct FollowConfig {
    pub replay_chunk: usize,
    pub max_backlog: u64,
}
