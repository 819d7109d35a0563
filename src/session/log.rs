//! The session layer's one way into the log: every append (with its one mapping of append
//! errors), every read, projection lookup and follower goes through [`SessionLog`]; and
//! [`Writer`] keeps one session's appends in a row at the position the last one left.

use std::sync::Arc;

use futures_util::future::{BoxFuture, FutureExt, Shared};
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;

use super::follow::Follower;
use super::{FollowConfig, SessionError};
use crate::domain::{Draft, EventId, RawEvent, SessionId};
use crate::projection::{SessionIndex, SessionSummary};
use crate::store::{AppendError, Appended, Key, Live, Log, Position, ReadRange, Scan, StoreError};

#[derive(Clone)]
pub(crate) struct SessionLog {
    log: Arc<dyn Log>,
    pub follow: FollowConfig,
    /// Summaries decoded lately, each with the stored bytes it was decoded from: a lookup
    /// still reads the projection, and decodes only when its bytes have changed (every
    /// request names a session, and decoding its summary was a tenth of an append's work).
    summaries: Arc<dashmap::DashMap<SessionId, (bytes::Bytes, SessionSummary)>>,
}

/// Decoded summaries kept at most; past that the cache starts again.
const SUMMARIES_KEPT: usize = 4096;

/// Events read per step when a whole log is folded.
const FOLD_CHUNK: usize = 1024;

impl SessionLog {
    pub fn new(log: Arc<dyn Log>, follow: FollowConfig) -> SessionLog {
        SessionLog { log, follow, summaries: Arc::default() }
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
            Ok(Err(crate::store::Conflict { expected, actual: self.position(session).await? }))
        };
        let ordered = match self.log.order(session, expected, drafts) {
            Ok(ordered) => ordered,
            Err(AppendError::Raced(_)) => return raced().await,
            Err(error) => return Err(append_error(session, error)),
        };
        match ordered.durable().await {
            Ok(appended) => Ok(appended),
            Err(AppendError::Raced(_)) => raced().await,
            Err(error) => Err(append_error(session, error)),
        }
    }

    /// Makes the log ready to order appends to `session` (see [`Log::prepare`]); also what a
    /// writer on this node does when it stops ([`Log::release`]).
    pub async fn prepare(&self, session: SessionId) -> Result<(), SessionError> {
        Ok(self.log.prepare(session).await?)
    }

    pub fn release(&self, session: SessionId) {
        self.log.release(session);
    }

    /// Waits until the session's log is durable up to `seq` (after a conflict with an
    /// append another writer ordered, before reading it).
    pub async fn durable_to(&self, session: SessionId, seq: u64) -> Result<(), SessionError> {
        let mut subscription = self.log.subscribe(session).await?;
        let mut at = subscription.at.seq;
        while at < seq {
            at = match subscription.live.recv().await {
                Ok(Live::Events(batch)) => batch.last().map_or(at, |event| event.seq),
                Ok(Live::Stored(end)) => end.seq,
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => subscription.channel.durable().seq,
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return Err(SessionError::ShuttingDown),
            };
        }
        Ok(())
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

    /// The log itself, for the audit operations that work on any log.
    pub fn raw(&self) -> &dyn Log {
        self.log.as_ref()
    }

    /// The log itself, to hold beyond a request (a replay's task).
    pub fn raw_arc(&self) -> Arc<dyn Log> {
        self.log.clone()
    }

    /// Every session whose log grows from now on.
    pub fn changes(&self) -> tokio::sync::broadcast::Receiver<ulid::Ulid> {
        self.log.changes()
    }

    pub async fn summary(&self, session: SessionId) -> Result<Option<SessionSummary>, SessionError> {
        let Some(bytes) = self.log.projected(SessionIndex::NAME, Key::session(session)).await? else {
            return Ok(None);
        };
        if let Some(cached) = self.summaries.get(&session).filter(|cached| cached.0 == bytes) {
            return Ok(Some(cached.1.clone()));
        }
        let Some(summary) = decode::<SessionSummary>(SessionIndex::NAME, &bytes) else { return Ok(None) };
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

pub(super) fn append_error(session: SessionId, error: AppendError) -> SessionError {
    match error {
        // A terminated log belongs to a deleted session.
        AppendError::Closed => SessionError::NotFound(session.to_string()),
        AppendError::TooManyEvents { .. } => SessionError::Limit(error.to_string()),
        AppendError::ShuttingDown => SessionError::ShuttingDown,
        AppendError::OutOfTurn { .. } => SessionError::Storage(StoreError::new(error)),
        AppendError::Malformed(message) => SessionError::Invalid(message),
        AppendError::Storage(message) => SessionError::Storage(StoreError::new(message)),
        AppendError::Unavailable(message) => SessionError::Unavailable(message),
        AppendError::Raced(message) => SessionError::Conflict(format!("{message}; send it again")),
    }
}

fn decode<T: DeserializeOwned>(projection: &str, bytes: &[u8]) -> Option<T> {
    serde_json::from_slice(bytes)
        .map_err(|error| tracing::error!(%error, projection, "a projected value does not decode"))
        .ok()
}

/// What resolves once an append is durable (cloned by whoever waits for it).
#[derive(Clone)]
pub(crate) struct Durable {
    session: SessionId,
    done: Shared<BoxFuture<'static, Result<(), AppendError>>>,
    /// The writer's flag, set if the append fails (see [`Writer`]'s).
    failed: CancellationToken,
}

impl Durable {
    pub async fn wait(self) -> Result<(), SessionError> {
        self.done.await.map_err(|error| {
            self.failed.cancel();
            append_error(self.session, error)
        })
    }
}

/// One session's appends, one after another, each at the position the one before left.
/// The actor and its running turn share one, so the session has a single writer; if
/// anything else appends to the log, the next append here gets the conflict.
///
/// An append is numbered as it is ordered, and the writer keeps what it ordered for the
/// actor to fold ([`Writer::take_ordered`]): the actor decides on events in hand, never
/// reads back what was just written, and need not wait for one append to be durable before
/// it orders the next, so a session's appends share flushes.
pub(crate) struct Writer {
    log: SessionLog,
    session: SessionId,
    state: parking_lot::Mutex<Ordering>,
    /// Set once an append ordered here failed: refused because another node appended
    /// first, or not stored, or stored or not with no answer saying which (an engine failing
    /// over). What the actor folded may then not be the log, and it must be loaded again.
    failed: CancellationToken,
    watched: bool,
}

struct Ordering {
    /// The position after the last append ordered here.
    at: u64,
    /// The last append ordered here: once it is durable, all before it are.
    last: Option<Durable>,
    /// What was ordered here and not yet taken by the actor, oldest first.
    unfolded: Vec<RawEvent>,
}

impl Writer {
    /// `watched`: every append is waited for by a task of its own, so that one that fails
    /// is noticed even if nobody else waits for it (with several nodes, where an append can
    /// turn out to have raced another node's, or its fate be lost in a failover).
    pub fn new(log: SessionLog, session: SessionId, at: u64, watched: bool) -> Writer {
        let state = parking_lot::Mutex::new(Ordering { at, last: None, unfolded: Vec::new() });
        Writer { log, session, state, failed: CancellationToken::new(), watched }
    }

    /// Orders `drafts` after the last append: the events (or the conflict) at once, and
    /// what resolves once they are durable. Nothing may show the events to anyone before.
    pub fn order(&self, drafts: Vec<Draft>) -> Result<(Appended, Durable), SessionError> {
        let mut state = self.state.lock();
        let ordered = self.log.log.order(self.session, state.at, drafts);
        let (appended, done) = match ordered {
            Ok(ordered) => ordered.split(),
            Err(error) => {
                self.note(&error);
                return Err(append_error(self.session, error));
            }
        };
        let durable = Durable { session: self.session, done: done.shared(), failed: self.failed.clone() };
        if self.watched && appended.is_ok() {
            tokio::spawn(durable.clone().wait());
        }
        if let Some(last) = appended.as_ref().ok().and_then(|events| events.last()) {
            state.at = last.seq;
            state.last = Some(durable.clone());
            state.unfolded.extend(appended.as_ref().into_iter().flatten().cloned());
        }
        Ok((appended, durable))
    }

    fn note(&self, error: &AppendError) {
        if let AppendError::Raced(_) = error {
            self.failed.cancel();
        }
    }

    /// What was folded from this writer's appends is not the log (some were not stored):
    /// the actor must be loaded again, as after a race (see `failed`).
    pub fn invalidate(&self) {
        self.failed.cancel();
    }

    /// Whether an append ordered here failed (see `failed`).
    pub fn failed(&self) -> bool {
        self.failed.is_cancelled()
    }

    /// Resolves once an append ordered here has failed (see `failed`), for an actor that
    /// waits for its next command.
    pub fn failing(&self) -> tokio_util::sync::WaitForCancellationFuture<'_> {
        self.failed.cancelled()
    }

    /// Waits until everything ordered here so far is durable.
    pub async fn settled(&self) -> Result<(), SessionError> {
        let last = self.state.lock().last.clone();
        match last {
            Some(last) => last.wait().await,
            None => Ok(()),
        }
    }

    /// The events ordered here since the last call, oldest first.
    pub fn take_ordered(&self) -> Vec<RawEvent> {
        std::mem::take(&mut self.state.lock().unfolded)
    }

    /// The log was read (after a conflict, or at load) up to `seq`, and everything ordered
    /// here was taken: append after `seq` from now on. Nothing is changed if something
    /// was ordered here meanwhile (it was ordered at the log's end, so `at` is right).
    pub fn caught_up(&self, seq: u64) {
        let mut state = self.state.lock();
        if state.unfolded.is_empty() {
            state.at = seq;
        }
    }
}
