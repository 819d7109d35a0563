//! The engine's way into the log: appends (with the one mapping of append errors), the
//! reads an actor folds its session from, and the open-turn index that recovery and the
//! reaper walk. [`super::writer::Writer`] keeps one session's appends in a row.

use std::sync::Arc;

use crate::domain::{Draft, RawEvent, SessionId, TurnId};
use crate::error::SessionError;
use crate::projection::turns::{OpenTurn, OpenTurns};
use crate::projection::{read, SessionIndex, SessionSummary};
use crate::store::{
    self, AppendError, Appended, Claims, Conflict, Key, Live, Log, Ordered, Position, Projections, Scan, SharedLog,
    Store,
};

#[derive(Clone)]
pub(super) struct EngineLog {
    log: Arc<dyn Log>,
    projections: Arc<dyn Projections>,
    claims: Arc<dyn Claims>,
    /// What a log shared by several nodes adds (`None` on one node).
    shared: Option<Arc<dyn SharedLog>>,
}

/// A session with a turn open, or messages waiting for one, as the open-turn index has it.
pub(super) struct Open {
    pub session: SessionId,
    pub turn: Option<TurnId>,
}

impl EngineLog {
    pub fn new(store: &Store) -> EngineLog {
        let (log, projections, claims) = (store.log.clone(), store.projections.clone(), store.claims.clone());
        EngineLog { log, projections, claims, shared: store.shared.clone() }
    }

    /// Appends at `expected`: the stored events or the conflict, once durable.
    pub async fn append(
        &self,
        session: SessionId,
        expected: u64,
        drafts: Vec<Draft>,
    ) -> Result<Appended, SessionError> {
        self.prepare(session).await?;
        // Another node appended first: a conflict like any other, at where the log now ends.
        let raced = || async {
            self.prepare(session).await?;
            Ok(Err(Conflict { expected, actual: self.position(session).await? }))
        };
        let ordered = match self.log.order(session, expected, drafts) {
            Ok(ordered) => ordered,
            Err(AppendError::Raced(_)) => return raced().await,
            Err(error) => return Err(SessionError::from_append(session, error)),
        };
        match ordered.durable().await {
            Ok(appended) => Ok(appended),
            Err(AppendError::Raced(_)) => raced().await,
            Err(error) => Err(SessionError::from_append(session, error)),
        }
    }

    /// Orders `drafts` at `expected` without waiting for them to be durable (see
    /// [`Log::order`]): for the session's one writer.
    pub fn order(&self, session: SessionId, expected: u64, drafts: Vec<Draft>) -> Result<Ordered, AppendError> {
        self.log.order(session, expected, drafts)
    }

    /// Whether the log is shared by several nodes (a [`SharedLog`] underneath).
    pub fn is_shared(&self) -> bool {
        self.shared.is_some()
    }

    /// Makes a shared log ready to order appends to `session` (see [`SharedLog::prepare`]).
    pub async fn prepare(&self, session: SessionId) -> Result<(), SessionError> {
        match &self.shared {
            Some(shared) => Ok(shared.prepare(session).await?),
            None => Ok(()),
        }
    }

    /// This node's writer of `session` has stopped (see [`SharedLog::release`]).
    pub fn release(&self, session: SessionId) {
        if let Some(shared) = &self.shared {
            shared.release(session);
        }
    }

    pub async fn position(&self, session: SessionId) -> Result<Position, SessionError> {
        Ok(self.log.position(session).await?)
    }

    /// Waits until the session's log is durable up to `seq` (after a conflict with an
    /// append another writer ordered, before reading it).
    pub async fn durable_to(&self, session: SessionId, seq: u64) -> Result<(), SessionError> {
        use tokio::sync::broadcast::error::RecvError;
        let mut subscription = self.log.subscribe(session).await?;
        let mut at = subscription.at.seq;
        while at < seq {
            at = match subscription.live.recv().await {
                Ok(Live::Events(batch)) => batch.last().map_or(at, |event| event.seq),
                Ok(Live::Stored(end)) => end.seq,
                Err(RecvError::Lagged(_)) => subscription.channel.durable().seq,
                Err(RecvError::Closed) => return Err(SessionError::ShuttingDown),
            };
        }
        Ok(())
    }

    /// Every durable event after `after`, in order; answers the last position read.
    pub async fn fold(
        &self,
        session: SessionId,
        after: Position,
        apply: impl FnMut(&RawEvent),
    ) -> Result<Position, SessionError> {
        Ok(store::fold(self.log.as_ref(), session, after, apply).await?)
    }

    /// Reserves `value` under `name` unless a live claim holds it (see [`Claims`]).
    pub async fn claim(
        &self,
        name: &str,
        value: bytes::Bytes,
        ttl: std::time::Duration,
    ) -> Result<bytes::Bytes, SessionError> {
        Ok(self.claims.claim(name, value, ttl).await?)
    }

    /// `count` durable events of `session` from sequence number `first` on.
    pub async fn events_from(
        &self,
        session: SessionId,
        first: u64,
        count: usize,
    ) -> Result<Vec<RawEvent>, SessionError> {
        let Some(before) = first.checked_sub(1) else { return Ok(Vec::new()) };
        let after = match before {
            0 => None,
            seq => Some(self.log.event_at(session, seq).await?.ok_or_else(|| {
                SessionError::Storage(store::StoreError::new(format!("event {seq} of session {session} is missing")))
            })?),
        };
        let range =
            store::ReadRange { after: after.map(|event| event.id), before: None, limit: count, newest_first: false };
        Ok(self.log.read(session, range).await?)
    }

    pub async fn summary(&self, session: SessionId) -> Result<Option<SessionSummary>, SessionError> {
        Ok(read::get(self.projections.as_ref(), SessionIndex::NAME, Key::session(session)).await?)
    }

    /// Every session with a turn open or messages waiting for one, by the open-turn index.
    pub async fn open(&self) -> Result<Vec<Open>, SessionError> {
        let mut open = Vec::new();
        let mut after = None;
        loop {
            let scan = Scan { session: None, after, newest_first: false, limit: 1024 };
            let page = read::scan::<OpenTurn>(self.projections.as_ref(), OpenTurns::NAME, scan).await?;
            let Some((last, _)) = page.last() else { return Ok(open) };
            after = Some(*last);
            let found = page.into_iter().filter(|(_, state)| state.turn.is_some() || !state.queued.is_empty());
            open.extend(found.map(|(key, state)| Open { session: key.session, turn: state.turn }));
        }
    }

    /// A page of sessions as the index has them, after `after`.
    pub async fn sessions(&self, after: Option<Key>, limit: usize) -> Result<Vec<(Key, SessionSummary)>, SessionError> {
        let scan = Scan { session: None, after, newest_first: false, limit };
        Ok(read::scan::<SessionSummary>(self.projections.as_ref(), SessionIndex::NAME, scan).await?)
    }

    /// Sessions a shared log has seen end with a turn open (see [`SharedLog::turns_seen_open`]).
    pub fn turns_seen_open(&self) -> Vec<SessionId> {
        self.shared.as_ref().map(|shared| shared.turns_seen_open()).unwrap_or_default()
    }
}
