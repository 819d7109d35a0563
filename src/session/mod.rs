//! Sessions: creating, finding, listing and deleting them, appending to their logs and
//! following them, with ownership checked on every call. Views call this layer; they
//! never reach into the store.

mod actor;
mod coalesce;
pub mod engine;
mod follow;
pub mod turn;

pub use coalesce::Coalescer;
pub use engine::{Engine, EngineSettings, Input, SessionUpdate, Submission, Submitted};

pub use follow::{FollowError, Follower};

use crate::domain::event::SessionSpec;
use crate::domain::{Draft, EventBody, EventId, RawEvent, SessionId};
use crate::projection::{SessionIndex, SessionSummary};
use crate::store::{AppendError, Position, ReadRange, Store, StoreError};

/// Who is calling: the subject of the API key, and whether it may see every session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub subject: String,
    pub admin: bool,
}

impl Caller {
    pub fn may_see(&self, summary: &SessionSummary) -> bool {
        self.admin || summary.created_by == self.subject
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("session {0} not found")]
    NotFound(String),
    #[error("{0} is not an event of this session")]
    UnknownCursor(String),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    Limit(String),
    #[error("the service is shutting down")]
    ShuttingDown,
    /// The session's actor stopped before it took the submission: send it again.
    #[error("retry")]
    Retry(Box<engine::Submission>),
    #[error(transparent)]
    Storage(#[from] StoreError),
}

impl From<AppendError> for SessionError {
    fn from(error: AppendError) -> Self {
        match error {
            AppendError::Closed => SessionError::Conflict("the session is terminated".into()),
            AppendError::TooManyEvents { .. } => SessionError::Limit(error.to_string()),
            AppendError::ShuttingDown => SessionError::ShuttingDown,
            AppendError::Storage(message) => SessionError::Storage(StoreError::from(sled::Error::Unsupported(message))),
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct ListFilter {
    pub agent: Option<String>,
    pub created_by: Option<String>,
    pub created_after: Option<String>,
    pub created_before: Option<String>,
    /// Continue after this session (newest first).
    pub after: Option<SessionId>,
    pub limit: usize,
}

pub struct Page<T> {
    pub items: Vec<T>,
    pub has_more: bool,
}

#[derive(Clone)]
pub struct Sessions {
    store: Store,
    follow: FollowConfig,
}

#[derive(Debug, Clone, Copy)]
pub struct FollowConfig {
    pub replay_chunk: usize,
    pub max_backlog: u64,
}

impl Sessions {
    pub fn new(store: Store, follow: FollowConfig) -> Sessions {
        Sessions { store, follow }
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    pub async fn create(&self, caller: &Caller, spec: SessionSpec) -> Result<SessionSummary, SessionError> {
        let id = SessionId::generate();
        let body = EventBody::SessionCreated { spec, created_by: caller.subject.clone() };
        self.store.append(id, vec![Draft::new(None, &body)]).await?;
        self.summary(id)?.ok_or_else(|| SessionError::NotFound(id.to_string()))
    }

    /// The session's summary, whoever owns it (for the engine).
    pub(crate) fn summary_of(&self, id: SessionId) -> Result<SessionSummary, SessionError> {
        self.summary(id)?.ok_or_else(|| SessionError::NotFound(id.to_string()))
    }

    /// Appends to a session's log on the engine's behalf.
    pub(crate) async fn append_to(&self, id: SessionId, drafts: Vec<Draft>) -> Result<Vec<RawEvent>, SessionError> {
        match self.store.append(id, drafts).await {
            Err(AppendError::Closed) => Err(SessionError::NotFound(id.to_string())),
            other => other.map_err(Into::into),
        }
    }

    fn summary(&self, id: SessionId) -> Result<Option<SessionSummary>, SessionError> {
        let Some(bytes) = self.store.projected(SessionIndex::NAME, id)? else {
            return Ok(None);
        };
        Ok(serde_json::from_slice(&bytes).ok())
    }

    /// The session if it exists, is not deleted, and the caller may see it: one answer
    /// (not found) for all three, so ids of other subjects are not disclosed.
    pub fn get(&self, caller: &Caller, id: &str) -> Result<SessionSummary, SessionError> {
        let not_found = || SessionError::NotFound(id.to_string());
        let session: SessionId = id.parse().map_err(|_| not_found())?;
        match self.summary(session)? {
            Some(summary) if !summary.deleted && caller.may_see(&summary) => Ok(summary),
            _ => Err(not_found()),
        }
    }

    pub fn list(&self, caller: &Caller, filter: &ListFilter) -> Result<Page<SessionSummary>, SessionError> {
        let mut items = Vec::new();
        let mut has_more = false;
        for entry in self.store.projected_scan(SessionIndex::NAME, filter.after, true) {
            let (_, bytes) = entry?;
            let Ok(summary) = serde_json::from_slice::<SessionSummary>(&bytes) else {
                continue;
            };
            if summary.deleted || !caller.may_see(&summary) || !matches(filter, &summary) {
                continue;
            }
            if filter.created_after.as_deref().is_some_and(|after| summary.created_at.as_str() <= after) {
                break; // newest first: everything further is older still
            }
            if items.len() == filter.limit {
                has_more = true;
                break;
            }
            items.push(summary);
        }
        Ok(Page { items, has_more })
    }

    /// Appends `session.deleted` and `terminated`; every open stream ends after the latter.
    pub async fn delete(&self, caller: &Caller, id: &str) -> Result<(), SessionError> {
        let summary = self.get(caller, id)?;
        let drafts = vec![
            Draft::new(None, &EventBody::SessionDeleted {}),
            Draft::new(None, &EventBody::Terminated { reason: "session deleted".into() }),
        ];
        // A concurrent delete that got there first leaves the log closed: not found either way.
        self.append_to(summary.id, drafts).await.map(drop)
    }

    /// The session's history, folded from its whole log.
    pub fn history(&self, summary: &SessionSummary) -> Result<Vec<crate::domain::Message>, SessionError> {
        let mut history = crate::projection::history::History::default();
        let mut after = None;
        loop {
            let range = ReadRange { after, before: None, limit: 4096, newest_first: false };
            let events = self.store.read(summary.id, range)?;
            let Some(last) = events.last() else { return Ok(history.messages) };
            after = Some(last.id);
            for raw in &events {
                if let Ok(event) = raw.decode() {
                    history.apply(&event);
                }
            }
        }
    }

    pub fn events(&self, summary: &SessionSummary, range: ReadRange) -> Result<Vec<RawEvent>, SessionError> {
        Ok(self.store.read(summary.id, range)?)
    }

    /// The position of `cursor`, which must be an event of this session.
    pub fn check_cursor(&self, summary: &SessionSummary, cursor: &str) -> Result<Position, SessionError> {
        let unknown = || SessionError::UnknownCursor(cursor.to_string());
        let id: EventId = cursor.parse().map_err(|_| unknown())?;
        match self.store.event(summary.id, id)? {
            Some(event) => Ok(Position { last: Some(event.id), seq: event.seq }),
            None => Err(unknown()),
        }
    }

    /// A follower of the session's log after `cursor` (from the start when `None`).
    pub fn follow(&self, summary: &SessionSummary, cursor: Option<&str>) -> Result<Follower, SessionError> {
        let after = match cursor {
            Some(cursor) => self.check_cursor(summary, cursor)?,
            None => Position::default(),
        };
        Ok(Follower::new(self.store.clone(), summary.id, after, self.follow)?)
    }

    /// A follower that starts at the current end of the log (live only).
    pub fn follow_live(&self, summary: &SessionSummary) -> Result<Follower, SessionError> {
        Ok(Follower::live(self.store.clone(), summary.id, self.follow)?)
    }
}

fn matches(filter: &ListFilter, summary: &SessionSummary) -> bool {
    filter.agent.as_ref().is_none_or(|agent| &summary.spec.agent.name == agent)
        && filter.created_by.as_ref().is_none_or(|by| &summary.created_by == by)
        && filter.created_before.as_deref().is_none_or(|before| summary.created_at.as_str() < before)
}
