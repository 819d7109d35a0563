//! The log in sled: one `events` tree keyed session ++ event, appends numbered as they are
//! ordered and written by a group-commit writer (durable in a write-ahead log of its own,
//! see [`wal`], and checkpointed into sled), per-session watermarks and live buses, and one
//! tree per projection, rebuilt from the events when the last run did not close cleanly.

mod keys;
mod open;
mod read;
pub(crate) mod wal;
mod writer;

use std::ops::Bound;
use std::path::PathBuf;
use std::sync::Arc;

use ::sled::IVec;
use bytes::Bytes;
use parking_lot::Mutex;
use tokio::sync::{mpsc, oneshot};

use super::hub::Hub;
use super::numbering::{Clock, Tail};
use super::{
    chain, claim_record, live_claim, project, AppendError, Appended, AuditLog, Claims, Key, Log, Ordered, Position,
    Projection, Projections, ReadRange, Scan, StoreError, Subscription, Values,
};
use crate::domain::{Draft, EventId, RawEvent, SessionId};
use crate::metrics;

#[derive(Debug, Clone)]
pub struct SledConfig {
    /// `None` for a temporary store that is deleted when dropped (unit tests).
    pub path: Option<PathBuf>,
    pub cache_capacity_bytes: u64,
    pub max_batch_events: usize,
    pub max_events_per_session: u64,
    pub bus_capacity: usize,
    /// A segment of the write-ahead log this long is checkpointed into sled and removed.
    pub wal_segment_bytes: u64,
    /// Appends are refused while the file system has less free space than this.
    pub min_free_bytes: u64,
    /// The newest events kept in memory for readers, per session and in all (bytes).
    pub recent_bytes: usize,
    pub recent_total_bytes: usize,
}

impl Default for SledConfig {
    fn default() -> Self {
        SledConfig {
            path: None,
            cache_capacity_bytes: 256 << 20,
            max_batch_events: 8192,
            max_events_per_session: 1_000_000,
            bus_capacity: 256,
            wal_segment_bytes: wal::SEGMENT_BYTES,
            min_free_bytes: 0,
            recent_bytes: 2 << 20,
            recent_total_bytes: 128 << 20,
        }
    }
}

impl From<::sled::Error> for StoreError {
    fn from(error: ::sled::Error) -> StoreError {
        StoreError::new(error)
    }
}

impl From<std::io::Error> for StoreError {
    fn from(error: std::io::Error) -> StoreError {
        StoreError::new(error)
    }
}

struct Inner {
    db: ::sled::Db,
    events: ::sled::Tree,
    meta: ::sled::Tree,
    projections: Vec<Arc<dyn Projection>>,
    trees: Vec<::sled::Tree>,
    hub: Hub,
    config: SledConfig,
    failed: Mutex<Option<AppendError>>,
    /// Group commits made since the log was opened.
    commits: std::sync::atomic::AtomicU64,
    /// Opened to write (not only to read, see [`SledLog::open_to_read`]).
    writable: bool,
}

impl Inner {
    fn channel(&self, session: SessionId) -> Result<Arc<super::Channel>, StoreError> {
        self.hub.channel(session.ulid(), || self.last_stored(session))
    }

    /// The last event in the store for `session`. Only exact as a durable position when
    /// nothing is in flight for it, which [`Hub::channel`] guarantees when it calls this.
    fn last_stored(&self, session: SessionId) -> Result<Position, StoreError> {
        Ok(match self.events.scan_prefix(keys::session_key(session)).next_back().transpose()? {
            Some((key, value)) => {
                let event = raw_event(&key, value);
                Position { last: Some(event.id), seq: event.seq }
            }
            None => Position::default(),
        })
    }

    /// The chain hash of the session's last stored event, recording the hashes its last
    /// events lack first (see [`Inner::complete_chain`]).
    fn chain_head(&self, session: SessionId) -> Result<chain::Hash, StoreError> {
        // The hashes recorded here are not in the write-ahead log: they must be durable
        // before the writer links events to them.
        if self.complete_chain(session)? > 0 {
            self.db.flush()?;
        }
        match self.events.scan_prefix(keys::session_key(session)).next_back().transpose()? {
            Some((_, value)) => match unseal(&value).1 {
                Some(hash) => Ok(hash),
                None => Err(StoreError::new(format!("session {session}: its last event has no chain hash"))),
            },
            None => Ok(chain::GENESIS),
        }
    }

    /// Records the hashes of the events at the end of the session's log that have none
    /// (back to the last one that has, or the start); the number recorded.
    fn complete_chain(&self, session: SessionId) -> Result<u64, StoreError> {
        let mut missing = Vec::new();
        let mut head = chain::GENESIS;
        for item in self.events.scan_prefix(keys::session_key(session)).rev() {
            let (key, value) = item?;
            match unseal(&value).1 {
                Some(hash) => {
                    head = hash;
                    break;
                }
                None => missing.push((key, value)),
            }
        }
        for (key, value) in missing.iter().rev() {
            head = chain::link(&head, value);
            self.events.insert(key, seal(value, &head))?;
        }
        Ok(missing.len() as u64)
    }

    /// A session's stored events, newest first (to rebuild its tail).
    fn newest_first(&self, session: SessionId) -> impl Iterator<Item = Result<RawEvent, ::sled::Error>> + '_ {
        self.events.scan_prefix(keys::session_key(session)).rev().map(|item| item.map(|(k, v)| raw_event(&k, v)))
    }

    fn tree(&self, name: &str) -> Result<&::sled::Tree, StoreError> {
        let at = self.projections.iter().position(|p| p.name() == name);
        at.map(|at| &self.trees[at]).ok_or_else(|| super::unknown_projection(name))
    }

    fn project(&self, event: &RawEvent) -> Result<(), StoreError> {
        project(&self.projections, event, &mut Trees(self))
    }

    fn failed(&self) -> Option<AppendError> {
        self.failed.lock().clone()
    }

    /// A failed flush leaves the log in an unknown state: refuse every later append.
    fn fail(&self, error: StoreError) -> AppendError {
        tracing::error!(%error, "the log failed to write; refusing further appends");
        let error = AppendError::Storage(error.to_string());
        *self.failed.lock() = Some(error.clone());
        error
    }
}

/// The projection trees, as [`project`] writes them.
struct Trees<'a>(&'a Inner);

impl Values for Trees<'_> {
    fn get(&mut self, projection: &'static str, key: Key) -> Result<Option<Bytes>, StoreError> {
        Ok(self.0.tree(projection)?.get(keys::projection_key(key))?.map(bytes_of))
    }

    fn put(&mut self, projection: &'static str, key: Key, value: Vec<u8>) -> Result<(), StoreError> {
        self.0.tree(projection)?.insert(keys::projection_key(key), value)?;
        Ok(())
    }
}

/// sled's bytes, handed on without a copy between its cache and the socket buffer.
fn bytes_of(value: IVec) -> Bytes {
    Bytes::from_owner(value)
}

/// What the `events` tree stores for an event: its JSON, then its chain hash and a zero
/// byte (no JSON ends with one), so that an event and its hash are one value, written and
/// read together. A value without them is an event the chain has not reached yet.
pub(super) fn seal(json: &[u8], hash: &chain::Hash) -> Vec<u8> {
    let mut value = Vec::with_capacity(json.len() + SEAL_LEN);
    value.extend_from_slice(json);
    value.extend_from_slice(hash);
    value.push(0);
    value
}

const SEAL_LEN: usize = 33;

/// A stored value's JSON, and its chain hash if it has one.
fn unseal(value: &[u8]) -> (&[u8], Option<chain::Hash>) {
    match value.split_last() {
        Some((0, rest)) if rest.len() >= 32 => {
            let (json, hash) = rest.split_at(rest.len() - 32);
            (json, Some(hash.try_into().expect("32 bytes")))
        }
        _ => (value, None),
    }
}

fn raw_event(key: &[u8], value: IVec) -> RawEvent {
    let id = keys::event_from_key(key).expect("event keys are 32 bytes");
    let json_len = unseal(&value).0.len();
    RawEvent::stored(id, bytes_of(value).slice(..json_len))
}

type KeyRange = (Bound<keys::EventKey>, Bound<keys::EventKey>);

/// The durable log in sled.
#[derive(Clone)]
pub struct SledLog {
    inner: Arc<Inner>,
    jobs: Arc<Mutex<Option<mpsc::UnboundedSender<writer::Job>>>>,
    writer: Arc<Mutex<Option<Threads>>>,
}

/// The writer's thread (which answers its write-ahead log when it ends) and the
/// checkpointer's.
struct Threads {
    writer: std::thread::JoinHandle<Option<wal::Wal>>,
    checkpointer: std::thread::JoinHandle<()>,
}

impl SledLog {
    /// Queues numbered `events` for the writer while the session's tail is still locked (so
    /// the writer takes a session's appends in the order they were numbered), then moves
    /// the tail on.
    fn queue(
        &self,
        session: SessionId,
        channel: Arc<super::Channel>,
        events: Vec<RawEvent>,
        mut slot: parking_lot::MutexGuard<'_, Option<Tail>>,
        tail: Tail,
    ) -> Result<Ordered, AppendError> {
        let (reply, answer) = oneshot::channel();
        let epoch = channel.epoch.load(std::sync::atomic::Ordering::SeqCst);
        let job = writer::Job { session, channel, events: events.clone(), reply, epoch };
        let queued = self.jobs.lock().as_ref().is_some_and(|jobs| jobs.send(job).is_ok());
        if !queued {
            return Err(AppendError::ShuttingDown);
        }
        *slot = Some(tail);
        drop(slot);
        let durable = async move { answer.await.map_err(|_| AppendError::ShuttingDown)? };
        Ok(Ordered::new(Ok(events), Box::pin(durable)))
    }

    /// How many group commits (one `fdatasync` each) the writer has made since the log opened.
    pub fn commits(&self) -> u64 {
        self.inner.commits.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The segments of the write-ahead log on disk now (each is removed once checkpointed).
    pub fn wal_segments(&self) -> usize {
        self.inner.config.path.as_deref().map_or(0, |path| wal::segments(&wal::dir(path)).map_or(0, |s| s.len()))
    }

    /// The bytes the write-ahead log takes on disk now (its records, and the zeros each
    /// segment is filled with ahead of them).
    pub fn wal_bytes(&self) -> u64 {
        self.inner.config.path.as_deref().map_or(0, |path| wal::len(&wal::dir(path)).unwrap_or(0))
    }

    /// Closes as a crash would leave the log: the write-ahead log kept and the log not marked
    /// clean, so the next open replays the one and rebuilds the projections (sled itself
    /// writes what it holds when its last handle drops). For tests of recovery.
    pub fn close_unclean(&self) -> Result<(), StoreError> {
        self.stop(false)
    }

    /// Stops the writer after it has written everything queued; then, if asked and nothing
    /// failed, flushes sled, removes the write-ahead log it has made redundant, and marks
    /// the log clean.
    /// Orders a whole log brought in from elsewhere as `session`'s, if it has no events.
    fn order_adopted(&self, session: SessionId, events: Vec<RawEvent>) -> Result<Ordered, AppendError> {
        if let Some(error) = self.inner.failed() {
            return Err(error);
        }
        let tail = Tail::adopted(&events, self.inner.config.max_events_per_session)?;
        let storage = |error: StoreError| AppendError::Storage(error.to_string());
        let channel = self.inner.channel(session).map_err(storage)?;
        let slot = channel.tail.lock();
        let now = match *slot {
            Some(tail) => tail,
            None => Tail::recover(self.inner.newest_first(session)).map_err(|e| storage(e.into()))?,
        };
        if now.position.seq > 0 {
            return Ok(Ordered::settled(Err(super::Conflict { expected: 0, actual: now.position })));
        }
        self.queue(session, channel.clone(), events, slot, tail)
    }

    fn stop(&self, clean: bool) -> Result<(), StoreError> {
        if !self.inner.writable {
            return Ok(());
        }
        self.jobs.lock().take();
        let Some(threads) = self.writer.lock().take() else { return Ok(()) };
        let wal = threads.writer.join().map_err(|_| StoreError::new("the writer thread panicked"))?;
        let _ = threads.checkpointer.join();
        if !clean || self.inner.failed().is_some() {
            return Ok(());
        }
        self.inner.db.flush()?;
        if let Some(wal) = wal {
            wal.retire()?;
        }
        self.inner.meta.insert(open::META_STATE, b"clean".as_slice())?;
        self.inner.db.flush()?;
        Ok(())
    }
}

#[async_trait::async_trait]
impl Log for SledLog {
    fn order(&self, session: SessionId, expected: u64, drafts: Vec<Draft>) -> Result<Ordered, AppendError> {
        if drafts.is_empty() {
            return Ok(Ordered::settled(Ok(Vec::new())));
        }
        let refused = |error: AppendError| {
            metrics::APPENDS_REFUSED.with_label_values(&[error.reason()]).inc();
            error
        };
        if let Some(error) = self.inner.failed() {
            return Err(error);
        }
        let storage = |error: StoreError| refused(AppendError::Storage(error.to_string()));
        let channel = self.inner.channel(session).map_err(storage)?;
        // The tail's lock is held until the job is queued, so that the writer takes a
        // session's appends in the order they were numbered.
        let mut slot = channel.tail.lock();
        let mut tail = match *slot {
            Some(tail) => tail,
            None => Tail::recover(self.inner.newest_first(session)).map_err(|e| storage(e.into()))?,
        };
        if let Some(turn) = tail.unknown_turn(&drafts) {
            let last = Tail::last_in_turn(self.inner.newest_first(session), turn);
            tail.continue_turn(turn, last.map_err(|e| storage(e.into()))?);
        }
        let limit = self.inner.config.max_events_per_session;
        let events = match tail.stage(session, expected, &drafts, &Clock::now(), limit).map_err(refused)? {
            Ok(events) => events,
            Err(conflict) => {
                metrics::APPENDS_REFUSED.with_label_values(&["conflict"]).inc();
                *slot = Some(tail);
                return Ok(Ordered::settled(Err(conflict)));
            }
        };
        self.queue(session, channel.clone(), events, slot, tail)
    }

    async fn position(&self, session: SessionId) -> Result<Position, StoreError> {
        Ok(self.inner.channel(session)?.durable())
    }

    async fn read(&self, session: SessionId, range: ReadRange) -> Result<Vec<RawEvent>, StoreError> {
        self.read_sync(session, range)
    }

    async fn event(&self, session: SessionId, id: EventId) -> Result<Option<RawEvent>, StoreError> {
        let durable = self.inner.channel(session)?.durable();
        if durable.last.is_none_or(|last| id > last) {
            return Ok(None);
        }
        let key = keys::event_key(session, id);
        Ok(self.inner.events.get(key)?.map(|value| raw_event(&key, value)))
    }

    async fn event_at(&self, session: SessionId, seq: u64) -> Result<Option<RawEvent>, StoreError> {
        self.event_at_sync(session, seq)
    }

    async fn subscribe(&self, session: SessionId) -> Result<Subscription, StoreError> {
        let channel = self.inner.channel(session)?;
        let live = channel.subscribe();
        let at = channel.durable();
        Ok(Subscription { channel, live, at })
    }

    fn changes(&self) -> tokio::sync::broadcast::Receiver<ulid::Ulid> {
        self.inner.hub.changes()
    }

    fn sweep(&self) {
        self.inner.hub.sweep();
    }

    async fn close(&self) -> Result<(), StoreError> {
        let log = self.clone();
        tokio::task::spawn_blocking(move || log.stop(true)).await.map_err(StoreError::new)?
    }
}

#[async_trait::async_trait]
impl Projections for SledLog {
    async fn get(&self, projection: &str, key: Key) -> Result<Option<Bytes>, StoreError> {
        Ok(self.inner.tree(projection)?.get(keys::projection_key(key))?.map(bytes_of))
    }

    async fn scan(&self, projection: &str, scan: Scan) -> Result<Vec<(Key, Bytes)>, StoreError> {
        self.scan_sync(projection, scan)
    }
}

#[async_trait::async_trait]
impl AuditLog for SledLog {
    async fn chained(&self, session: SessionId, range: ReadRange) -> Result<Vec<super::Chained>, StoreError> {
        self.scan_events(session, range, |key, value| {
            let hash = unseal(&value).1;
            (raw_event(key, value), hash)
        })
    }

    async fn adopt(&self, session: SessionId, events: Vec<RawEvent>) -> Result<Appended, AppendError> {
        self.order_adopted(session, events)?.durable().await
    }

    async fn session_ids(&self, after: Option<SessionId>, limit: usize) -> Result<Vec<SessionId>, StoreError> {
        // From each session's first key, skip to the next session's.
        let mut from = after.map(|after| u128::from(after.ulid()).checked_add(1));
        let mut ids = Vec::new();
        while ids.len() < limit {
            let start = match from {
                Some(None) => break,
                Some(Some(next)) => next.to_be_bytes().to_vec(),
                None => Vec::new(),
            };
            let Some(item) = self.inner.events.range(start..).next() else { break };
            let (key, _) = item?;
            let session = keys::session_from_key(&key).ok_or_else(|| StoreError::new("an event key is malformed"))?;
            ids.push(session);
            from = Some(u128::from(session.ulid()).checked_add(1));
        }
        Ok(ids)
    }
}

/// Claims live in the `meta` tree under this prefix.
const CLAIM_PREFIX: &[u8] = b"claim:";

#[async_trait::async_trait]
impl Claims for SledLog {
    async fn claim(&self, name: &str, value: Bytes, ttl: std::time::Duration) -> Result<Bytes, StoreError> {
        let key = [CLAIM_PREFIX, name.as_bytes()].concat();
        let mut held = self.inner.meta.get(&key)?;
        loop {
            if let Some(value) = held.as_deref().and_then(live_claim) {
                return Ok(Bytes::copy_from_slice(value));
            }
            // Absent or expired: taken if nobody changed it since it was read.
            match self.inner.meta.compare_and_swap(&key, held.as_ref(), Some(claim_record(&value, ttl)))? {
                Ok(()) => break,
                Err(swap) => held = swap.current,
            }
        }
        // Durable before the write it reserves for is made: a retry after a crash finds it.
        self.inner.db.flush_async().await?;
        Ok(value)
    }
}
