//! The read side's way into the log: pages of events, projection lookups (the session's
//! summary kept decoded), and followers. Appends go through the engine.

use std::sync::Arc;

use serde::de::DeserializeOwned;

use crate::domain::{EventId, RawEvent, SessionId};
use crate::error::SessionError;
use crate::projection::{read, SessionIndex, SessionSummary};
use crate::store::follow::{FollowConfig, Follower};
use crate::store::{self, Key, Log, Position, Projections, ReadRange, Scan, SharedLog, Store};

#[derive(Clone)]
pub(crate) struct SessionLog {
    log: Arc<dyn Log>,
    projections: Arc<dyn Projections>,
    shared: Option<Arc<dyn SharedLog>>,
    pub follow: FollowConfig,
    /// Summaries decoded lately, each with the stored bytes it was decoded from: a lookup
    /// still reads the projection, and decodes only when its bytes have changed (every
    /// request names a session, and decoding its summary was a tenth of an append's work).
    summaries: Arc<dashmap::DashMap<SessionId, (bytes::Bytes, SessionSummary)>>,
}

/// Decoded summaries kept at most; past that the cache starts again.
const SUMMARIES_KEPT: usize = 4096;

impl SessionLog {
    pub fn new(store: &Store, follow: FollowConfig) -> SessionLog {
        let (log, projections, shared) = (store.log.clone(), store.projections.clone(), store.shared.clone());
        SessionLog { log, projections, shared, follow, summaries: Arc::default() }
    }

    pub async fn read(&self, session: SessionId, range: ReadRange) -> Result<Vec<RawEvent>, SessionError> {
        Ok(self.log.read(session, range).await?)
    }

    /// Every event after `after`, in order, to its end; answers the last position read.
    pub async fn fold(
        &self,
        session: SessionId,
        after: Position,
        apply: impl FnMut(&RawEvent),
    ) -> Result<Position, SessionError> {
        Ok(store::fold(self.log.as_ref(), session, after, apply).await?)
    }

    pub async fn event(&self, session: SessionId, id: EventId) -> Result<Option<RawEvent>, SessionError> {
        Ok(self.log.event(session, id).await?)
    }

    pub async fn event_at(&self, session: SessionId, seq: u64) -> Result<Option<RawEvent>, SessionError> {
        Ok(self.log.event_at(session, seq).await?)
    }

    /// A projected value, decoded.
    pub async fn projected<T: DeserializeOwned>(&self, projection: &str, key: Key) -> Result<Option<T>, SessionError> {
        Ok(read::get(self.projections.as_ref(), projection, key).await?)
    }

    /// A page of a projection's values, decoded (undecodable ones are logged and skipped).
    pub async fn scan<T: DeserializeOwned>(&self, projection: &str, scan: Scan) -> Result<Vec<(Key, T)>, SessionError> {
        Ok(read::scan(self.projections.as_ref(), projection, scan).await?)
    }

    /// The engine underneath the log, if it is a client of one.
    pub fn health(&self) -> Option<crate::store::Health> {
        self.shared.as_ref().map(|shared| shared.health())
    }

    /// Every session whose log grows from now on.
    pub fn changes(&self) -> tokio::sync::broadcast::Receiver<ulid::Ulid> {
        self.log.changes()
    }

    pub async fn summary(&self, session: SessionId) -> Result<Option<SessionSummary>, SessionError> {
        let Some(bytes) = self.projections.get(SessionIndex::NAME, Key::session(session)).await? else {
            return Ok(None);
        };
        if let Some(cached) = self.summaries.get(&session).filter(|cached| cached.0 == bytes) {
            return Ok(Some(cached.1.clone()));
        }
        let Some(summary) = read::decode::<SessionSummary>(SessionIndex::NAME, &bytes) else { return Ok(None) };
        if self.summaries.len() >= SUMMARIES_KEPT {
            self.summaries.clear();
        }
        self.summaries.insert(session, (bytes, summary.clone()));
        Ok(Some(summary))
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
