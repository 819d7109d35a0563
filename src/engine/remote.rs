//! A command for a session's actor and its answer, as they cross between nodes (JSON:
//! the nodes of one cluster may run different builds for a moment during a deploy).

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::command::{Closing, Submission, Submitted};
use crate::domain::{Draft, EventId, RawEvent, RequestMark, SessionId, TurnId};
use crate::error::SessionError;
use crate::store::StoreError;

/// A command for a session's actor, as it crosses to another node.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct Request {
    pub session: SessionId,
    pub command: Remote,
    /// The node that forwards it (absent from a node of an older build).
    #[serde(default)]
    pub from: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) enum Remote {
    Create(Vec<WireDraft>),
    Submit(Box<Submission>),
    Close(Closing),
    Wake,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct WireDraft {
    turn: Option<TurnId>,
    body: String,
    queued: bool,
    #[serde(default)]
    request: Option<RequestMark>,
}

impl WireDraft {
    pub fn from_draft(draft: &Draft) -> WireDraft {
        let body = String::from_utf8_lossy(draft.body()).into_owned();
        WireDraft { turn: draft.turn, body, queued: draft.is_queued(), request: draft.request().cloned() }
    }

    pub fn into_draft(self) -> Result<Draft, SessionError> {
        let draft = Draft::from_body(self.turn, Bytes::from(self.body), self.queued)
            .ok_or_else(|| SessionError::Invalid("a forwarded event is not one turnlog makes".into()))?;
        Ok(match self.request {
            Some(mark) => draft.marked(mark),
            None => draft,
        })
    }
}

/// The actor's answer, as it crosses back.
#[derive(Debug, Serialize, Deserialize)]
pub(super) enum Answer {
    Done,
    Submitted {
        events: Vec<(EventId, String)>,
        turn: Option<TurnId>,
        #[serde(default)]
        recalled: bool,
    },
    Failed(WireError),
}

impl Answer {
    pub fn submitted(submitted: &Submitted) -> Answer {
        let events = submitted
            .events
            .iter()
            .map(|event| (event.id, String::from_utf8_lossy(&event.json).into_owned()))
            .collect();
        Answer::Submitted { events, turn: submitted.turn, recalled: submitted.recalled }
    }

    pub fn into_submitted(self) -> Result<Submitted, SessionError> {
        match self {
            Answer::Submitted { events, turn, recalled } => {
                let events = events.into_iter().map(|(id, json)| RawEvent::stored(id, Bytes::from(json))).collect();
                Ok(Submitted { events, turn, recalled })
            }
            Answer::Failed(error) => Err(error.into_error()),
            Answer::Done => Err(SessionError::Storage(StoreError::new("a forwarded submission was answered as done"))),
        }
    }

    pub fn into_done(self) -> Result<(), SessionError> {
        match self {
            Answer::Failed(error) => Err(error.into_error()),
            _ => Ok(()),
        }
    }
}

/// A [`SessionError`] as it crosses back (a storage failure by its message).
#[derive(Debug, Serialize, Deserialize)]
pub(super) enum WireError {
    NotFound(String),
    TurnNotFound {
        turn: String,
        session: String,
    },
    CatalogNotFound(String),
    UnknownCursor(String),
    Conflict(String),
    Busy(String),
    PreviousTurn(String),
    Invalid(String),
    Limit(String),
    TooLarge(String),
    Unavailable(String),
    Forbidden(String),
    KeyReused(String),
    FateUnknown(String),
    ShuttingDown,
    Storage(String),
    /// The node does not hold the session's lease (any more): ask again where it is.
    NotHere,
}

impl WireError {
    pub fn from_error(error: &SessionError) -> WireError {
        match error {
            SessionError::NotFound(s) => WireError::NotFound(s.clone()),
            SessionError::TurnNotFound { turn, session } => {
                WireError::TurnNotFound { turn: turn.clone(), session: session.clone() }
            }
            SessionError::CatalogNotFound(s) => WireError::CatalogNotFound(s.clone()),
            SessionError::UnknownCursor(s) => WireError::UnknownCursor(s.clone()),
            SessionError::Conflict(s) => WireError::Conflict(s.clone()),
            SessionError::Busy(s) => WireError::Busy(s.clone()),
            SessionError::PreviousTurn(s) => WireError::PreviousTurn(s.clone()),
            SessionError::Invalid(s) => WireError::Invalid(s.clone()),
            SessionError::Limit(s) => WireError::Limit(s.clone()),
            SessionError::TooLarge(s) => WireError::TooLarge(s.clone()),
            SessionError::Unavailable(s) => WireError::Unavailable(s.clone()),
            SessionError::Forbidden(s) => WireError::Forbidden(s.clone()),
            SessionError::KeyReused(s) => WireError::KeyReused(s.clone()),
            SessionError::FateUnknown(s) => WireError::FateUnknown(s.clone()),
            SessionError::ShuttingDown => WireError::ShuttingDown,
            // An engine out of reach stays so (503: try again) on the node that forwarded.
            SessionError::Storage(e) if e.is_unavailable() => WireError::Unavailable(e.to_string()),
            SessionError::Storage(e) => WireError::Storage(e.to_string()),
        }
    }

    fn into_error(self) -> SessionError {
        match self {
            WireError::NotFound(s) => SessionError::NotFound(s),
            WireError::TurnNotFound { turn, session } => SessionError::TurnNotFound { turn, session },
            WireError::CatalogNotFound(s) => SessionError::CatalogNotFound(s),
            WireError::UnknownCursor(s) => SessionError::UnknownCursor(s),
            WireError::Conflict(s) => SessionError::Conflict(s),
            WireError::Busy(s) => SessionError::Busy(s),
            WireError::PreviousTurn(s) => SessionError::PreviousTurn(s),
            WireError::Invalid(s) => SessionError::Invalid(s),
            WireError::Limit(s) => SessionError::Limit(s),
            WireError::TooLarge(s) => SessionError::TooLarge(s),
            WireError::Unavailable(s) => SessionError::Unavailable(s),
            WireError::Forbidden(s) => SessionError::Forbidden(s),
            WireError::KeyReused(s) => SessionError::KeyReused(s),
            WireError::FateUnknown(s) => SessionError::FateUnknown(s),
            WireError::ShuttingDown => SessionError::ShuttingDown,
            WireError::Storage(s) => SessionError::Storage(StoreError::new(s)),
            WireError::NotHere => SessionError::Unavailable("the session moved between nodes; send it again".into()),
        }
    }
}

pub(super) fn encode<T: Serialize>(value: &T) -> Bytes {
    Bytes::from(serde_json::to_vec(value).expect("forwarded values serialise"))
}

pub(super) fn decode<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> Result<T, SessionError> {
    serde_json::from_slice(bytes).map_err(|error| SessionError::Invalid(format!("a forwarded message: {error}")))
}
