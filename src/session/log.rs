//! The session layer's one way into the log: every append (with its one mapping of append
//! errors), every read, projection lookup and follower goes through [`SessionLog`]; and
//! [`Writer`] keeps one session's appends in a row at the position the last one left.

use std::sync::Arc;

use serde::de::DeserializeOwned;

use super::follow::Follower;
use super::{FollowConfig, SessionError};
use crate::domain::{Draft, EventId, RawEvent, SessionId};
use crate::projection::{SessionIndex, SessionSummary};
use crate::store::{AppendError, Appended, Key, Log, Position, ReadRange, Scan, StoreError};

#[derive(Clone)]
pub(crate) struct SessionLog {
    log: Arc<dyn Log>,
    pub follow: FollowConfig,
}

/// Events read per step when a whole log is folded.
const FOLD_CHUNK: usize = 1024;

impl SessionLog {
    pub fn new(log: Arc<dyn Log>, follow: FollowConfig) -> SessionLog {
        SessionLog { log, follow }
    }

    /// Appends at `expected`: the stored events or the conflict, once durable.
    pub async fn append(
        &self,
        session: SessionId,
        expected: u64,
        drafts: Vec<Draft>,
    ) -> Result<Appended, SessionError> {
        self.log.append(session, expected, drafts).await.map_err(|error| match error {
            // A terminated log belongs to a deleted session.
            AppendError::Closed => SessionError::NotFound(session.to_string()),
            AppendError::TooManyEvents { .. } => SessionError::Limit(error.to_string()),
            AppendError::ShuttingDown => SessionError::ShuttingDown,
            AppendError::OutOfTurn { .. } => SessionError::Storage(StoreError::new(error)),
            AppendError::Storage(message) => SessionError::Storage(StoreError::new(message)),
        })
    }

    pub async fn read(&self, session: SessionId, range: ReadRange) -> Result<Vec<RawEvent>, SessionError> {
        Ok(self.log.read(session, range).await?)
    }

    /// Every event after `after`, in order, to its end; answers the last position read.
    pub async fn fold(
        &self,
        session: SessionId,
        mut after: Position,
        mut apply: impl FnMut(&RawEvent),
    ) -> Result<Position, SessionError> {
        loop {
            let range = ReadRange { after: after.last, before: None, limit: FOLD_CHUNK, newest_first: false };
            let events = self.read(session, range).await?;
            let Some(last) = events.last() else { return Ok(after) };
            after = Position { last: Some(last.id), seq: last.seq };
            events.iter().for_each(&mut apply);
        }
    }

    pub async fn event(&self, session: SessionId, id: EventId) -> Result<Option<RawEvent>, SessionError> {
        Ok(self.log.event(session, id).await?)
    }

    pub async fn event_at(&self, session: SessionId, seq: u64) -> Result<Option<RawEvent>, SessionError> {
        Ok(self.log.event_at(session, seq).await?)
    }

    pub async fn position(&self, session: SessionId) -> Result<Position, SessionError> {
        Ok(self.log.position(session).await?)
    }

    /// A projected value, decoded.
    pub async fn projected<T: DeserializeOwned>(&self, projection: &str, key: Key) -> Result<Option<T>, SessionError> {
        let Some(bytes) = self.log.projected(projection, key).await? else { return Ok(None) };
        Ok(decode(projection, &bytes))
    }

    /// A page of a projection's values, decoded (undecodable ones are logged and skipped).
    pub async fn scan<T: DeserializeOwned>(&self, projection: &str, scan: Scan) -> Result<Vec<(Key, T)>, SessionError> {
        let page = self.log.scan(projection, scan).await?;
        Ok(page.into_iter().filter_map(|(key, bytes)| Some((key, decode(projection, &bytes)?))).collect())
    }

    pub async fn summary(&self, session: SessionId) -> Result<Option<SessionSummary>, SessionError> {
        self.projected(SessionIndex::NAME, Key::session(session)).await
    }

    /// A follower of `session` after `after`.
    pub async fn follower(&self, session: SessionId, after: Position) -> Result<Follower, SessionError> {
        Ok(Follower::new(self.log.clone(), session, after, self.follow).await?)
    }

    /// A follower that starts at the current end of the log (live only).
    pub async fn live(&self, session: SessionId) -> Result<Follower, SessionError> {
        Ok(Follower::live(self.log.clone(), session, self.follow).await?)
    }
}

fn decode<T: DeserializeOwned>(projection: &str, bytes: &[u8]) -> Option<T> {
    serde_json::from_slice(bytes)
        .map_err(|error| tracing::error!(%error, projection, "a projected value does not decode"))
        .ok()
}

/// One session's appends, one after another, each at the position the one before left.
/// The actor and its running turn share one, so the session has a single writer; if
/// anything else appends to the log, the next append here gets the conflict.
pub(crate) struct Writer {
    log: SessionLog,
    session: SessionId,
    at: tokio::sync::Mutex<u64>,
}

impl Writer {
    pub fn new(log: SessionLog, session: SessionId, at: u64) -> Writer {
        Writer { log, session, at: tokio::sync::Mutex::new(at) }
    }

    pub async fn append(&self, drafts: Vec<Draft>) -> Result<Appended, SessionError> {
        let mut at = self.at.lock().await;
        let appended = self.log.append(self.session, *at, drafts).await?;
        if let Some(last) = appended.as_ref().ok().and_then(|events| events.last()) {
            *at = last.seq;
        }
        Ok(appended)
    }

    /// The log was read up to `seq`: append after it from now on (if nothing here has
    /// appended further meanwhile).
    pub async fn caught_up(&self, seq: u64) {
        let mut at = self.at.lock().await;
        *at = (*at).max(seq);
    }
}
