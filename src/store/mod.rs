//! The durable event log in sled: one `events` tree keyed session ++ event, a group-commit
//! writer, per-session watermarks and live buses, and projection trees that are pure folds
//! over the log and can be rebuilt from it.
//!
//! The narrow surface: [`Store::append`], [`Store::read`], [`Store::subscribe`],
//! [`Store::position`], [`Store::close`]. Nothing here knows about HTTP.

mod hub;
pub mod keys;
mod writer;

use std::path::PathBuf;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::{broadcast, mpsc, oneshot};

use crate::domain::{Draft, Event, EventId, RawEvent, SessionId};
use hub::Hub;
pub use hub::{Batch, Channel, Position};

#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// `None` for a temporary store that is deleted when dropped (unit tests).
    pub path: Option<PathBuf>,
    pub cache_capacity_bytes: u64,
    pub max_batch_events: usize,
    pub max_events_per_session: u64,
    pub bus_capacity: usize,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            path: None,
            cache_capacity_bytes: 256 << 20,
            max_batch_events: 8192,
            max_events_per_session: 1_000_000,
            bus_capacity: 256,
        }
    }
}

/// Why an append was not made. `Closed` and `TooManyEvents` are answers, not failures.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AppendError {
    #[error("the session is terminated; its log takes no more events")]
    Closed,
    #[error("the session has reached its limit of {limit} events")]
    TooManyEvents { limit: u64 },
    #[error("the log is shutting down")]
    ShuttingDown,
    #[error("storage failed: {0}")]
    Storage(String),
}

impl AppendError {
    fn reason(&self) -> &'static str {
        match self {
            AppendError::Closed => "closed",
            AppendError::TooManyEvents { .. } => "too_many_events",
            AppendError::ShuttingDown => "shutting_down",
            AppendError::Storage(_) => "storage",
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[error("storage failed: {0}")]
pub struct StoreError(#[from] sled::Error);

/// A projection: one value per session in a tree of its own, folded from the events it
/// wants. `apply` is pure; the store does the reading and writing.
pub trait Projection: Send + Sync + 'static {
    fn name(&self) -> &'static str;
    fn wants(&self, kind: &str) -> bool;
    /// The session's new value after `event`, or `None` to keep the current one.
    fn apply(&self, current: Option<&[u8]>, event: &Event) -> Option<Vec<u8>>;
}

/// Which events to read: strictly after `after`, strictly before `before`, at most `limit`,
/// oldest first unless `newest_first`. Never past the durable watermark.
#[derive(Debug, Clone, Copy, Default)]
pub struct ReadRange {
    pub after: Option<EventId>,
    pub before: Option<EventId>,
    pub limit: usize,
    pub newest_first: bool,
}

/// A live subscription: the bus receiver, taken before the watermark was read, so
/// everything after `at` arrives on `live` (or is in the store when the bus lags).
pub struct Subscription {
    pub channel: Arc<Channel>,
    pub live: broadcast::Receiver<Batch>,
    pub at: Position,
}

struct Inner {
    db: sled::Db,
    events: sled::Tree,
    meta: sled::Tree,
    projections: Vec<(Arc<dyn Projection>, sled::Tree)>,
    hub: Hub,
    config: StoreConfig,
    failed: Mutex<Option<AppendError>>,
}

impl Inner {
    fn channel(&self, session: SessionId) -> Result<Arc<Channel>, StoreError> {
        self.hub.channel(session.ulid(), || self.last_stored(session))
    }

    /// The last event in the store for `session`. Only exact as a durable position when
    /// nothing is in flight for it, which [`Hub::channel`] guarantees when it calls this.
    fn last_stored(&self, session: SessionId) -> Result<Position, StoreError> {
        Ok(match self.events.scan_prefix(keys::session_key(session)).next_back().transpose()? {
            Some((key, value)) => Position { last: keys::event_from_key(&key), seq: sequence_number(&value) },
            None => Position::default(),
        })
    }

    fn project(&self, session: SessionId, event: &RawEvent) -> Result<(), sled::Error> {
        let kind = event.kind();
        let mut decoded = None;
        for (projection, tree) in &self.projections {
            if !projection.wants(kind) {
                continue;
            }
            let event = match &mut decoded {
                Some(event) => event,
                None => match event.decode() {
                    Ok(event) => decoded.insert(event),
                    Err(error) => {
                        tracing::error!(%error, id = %event.id, "stored event does not decode");
                        return Ok(());
                    }
                },
            };
            let key = keys::session_key(session);
            let current = tree.get(key)?;
            if let Some(value) = projection.apply(current.as_deref(), event) {
                tree.insert(key, value)?;
            }
        }
        Ok(())
    }

    fn failed(&self) -> Option<AppendError> {
        self.failed.lock().clone()
    }

    /// A failed flush leaves the log in an unknown state: refuse every later append.
    fn fail(&self, error: sled::Error) -> AppendError {
        tracing::error!(%error, "the log failed to write; refusing further appends");
        let error = AppendError::Storage(error.to_string());
        *self.failed.lock() = Some(error.clone());
        error
    }
}

/// The sequence number of a stored event, found without parsing the whole event.
fn sequence_number(json: &[u8]) -> u64 {
    const FIELD: &[u8] = b",\"sequence_number\":";
    json.windows(FIELD.len())
        .position(|w| w == FIELD)
        .map(|at| {
            json[at + FIELD.len()..]
                .iter()
                .take_while(|b| b.is_ascii_digit())
                .fold(0u64, |n, b| n * 10 + u64::from(b - b'0'))
        })
        .unwrap_or(0)
}

fn raw_event(key: &[u8], value: sled::IVec) -> RawEvent {
    let id = keys::event_from_key(key).expect("event keys are 32 bytes");
    let seq = sequence_number(&value);
    // The stored bytes are sent as they are: no copy between sled's cache and the socket
    // buffer.
    RawEvent { id, seq, json: bytes::Bytes::from_owner(value) }
}

#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
    jobs: Arc<Mutex<Option<mpsc::UnboundedSender<writer::Job>>>>,
    writer: Arc<Mutex<Option<std::thread::JoinHandle<()>>>>,
}

const META_STATE: &[u8] = b"state";
const META_PROJECTIONS: &[u8] = b"projections";

impl Store {
    /// Opens the log, rebuilds the projections if the last run did not close cleanly, and
    /// starts the writer.
    pub fn open(config: StoreConfig, projections: Vec<Arc<dyn Projection>>) -> Result<Store, StoreError> {
        let sled_config = sled::Config::new()
            .cache_capacity(config.cache_capacity_bytes)
            .flush_every_ms(None)
            .mode(sled::Mode::HighThroughput);
        let db = match &config.path {
            Some(path) => sled_config.path(path).open()?,
            None => sled_config.temporary(true).open()?,
        };
        let events = db.open_tree("events")?;
        let meta = db.open_tree("meta")?;
        let projections = projections
            .into_iter()
            .map(|p| Ok((p.clone(), db.open_tree(format!("projection:{}", p.name()))?)))
            .collect::<Result<Vec<_>, sled::Error>>()?;
        let hub = Hub::new(config.bus_capacity);
        let inner = Arc::new(Inner { db, events, meta, projections, hub, config, failed: Mutex::new(None) });
        Store::recover(&inner)?;
        let (tx, rx) = mpsc::unbounded_channel();
        let worker = writer::Writer::new(inner.clone(), rx);
        let handle = std::thread::Builder::new()
            .name("turnlog-writer".into())
            .spawn(move || worker.run())
            .expect("spawning the writer thread");
        Ok(Store { inner, jobs: Arc::new(Mutex::new(Some(tx))), writer: Arc::new(Mutex::new(Some(handle))) })
    }

    fn recover(inner: &Inner) -> Result<(), StoreError> {
        let names: Vec<&str> = inner.projections.iter().map(|(p, _)| p.name()).collect();
        let names = names.join(",");
        let clean = inner.meta.get(META_STATE)?.as_deref() == Some(b"clean");
        let same = inner.meta.get(META_PROJECTIONS)?.as_deref() == Some(names.as_bytes());
        if !(clean && same) {
            let started = std::time::Instant::now();
            let count = Store::rebuild_projections(inner)?;
            tracing::info!(events = count, elapsed_ms = started.elapsed().as_millis() as u64, "rebuilt projections");
        }
        inner.meta.insert(META_PROJECTIONS, names.as_bytes())?;
        inner.meta.insert(META_STATE, b"open".as_slice())?;
        inner.db.flush()?;
        Ok(())
    }

    fn rebuild_projections(inner: &Inner) -> Result<u64, StoreError> {
        for (_, tree) in &inner.projections {
            tree.clear()?;
        }
        let mut count = 0;
        for item in inner.events.iter() {
            let (key, value) = item?;
            let event = raw_event(&key, value);
            let session = keys::session_from_key(&key).expect("event keys are 32 bytes");
            inner.project(session, &event)?;
            count += 1;
        }
        Ok(count)
    }

    /// Appends `drafts` to the session's log as one unit and answers once they are durable.
    pub async fn append(&self, session: SessionId, drafts: Vec<Draft>) -> Result<Vec<RawEvent>, AppendError> {
        if drafts.is_empty() {
            return Ok(Vec::new());
        }
        let (reply, answer) = oneshot::channel();
        let job = writer::Job { session, drafts, reply };
        match self.jobs.lock().as_ref() {
            Some(jobs) => jobs.send(job).map_err(|_| AppendError::ShuttingDown)?,
            None => return Err(AppendError::ShuttingDown),
        }
        answer.await.map_err(|_| AppendError::ShuttingDown)?
    }

    /// The session's durable position.
    pub fn position(&self, session: SessionId) -> Result<Position, StoreError> {
        Ok(self.inner.channel(session)?.durable())
    }

    /// Events of `session` within `range`, never past the durable watermark.
    pub fn read(&self, session: SessionId, range: ReadRange) -> Result<Vec<RawEvent>, StoreError> {
        let durable = self.position(session)?;
        self.read_upto(session, range, durable)
    }

    /// Like [`Store::read`], up to a position the caller already holds.
    pub fn read_upto(
        &self,
        session: SessionId,
        range: ReadRange,
        durable: Position,
    ) -> Result<Vec<RawEvent>, StoreError> {
        let Some(last) = durable.last else {
            return Ok(Vec::new());
        };
        let (lower, mut upper) = keys::range(session, range.after, last);
        if let Some(before) = range.before.filter(|&before| before <= last) {
            upper = std::ops::Bound::Excluded(keys::event_key(session, before));
        }
        let iter = self.inner.events.range::<keys::Key, _>((lower, upper));
        let take = |item: Result<(sled::IVec, sled::IVec), sled::Error>| item.map(|(k, v)| raw_event(&k, v));
        let events: Result<Vec<_>, _> = if range.newest_first {
            iter.rev().take(range.limit).map(take).collect()
        } else {
            iter.take(range.limit).map(take).collect()
        };
        Ok(events?)
    }

    /// The durable event `id` of `session`, if there is one.
    pub fn event(&self, session: SessionId, id: EventId) -> Result<Option<RawEvent>, StoreError> {
        let durable = self.position(session)?;
        if durable.last.is_none_or(|last| id > last) {
            return Ok(None);
        }
        let key = keys::event_key(session, id);
        Ok(self.inner.events.get(key)?.map(|value| raw_event(&key, value)))
    }

    pub fn subscribe(&self, session: SessionId) -> Result<Subscription, StoreError> {
        let channel = self.inner.channel(session)?;
        let live = channel.subscribe();
        let at = channel.durable();
        Ok(Subscription { channel, live, at })
    }

    /// A projection's value for one session.
    pub fn projected(&self, name: &str, session: SessionId) -> Result<Option<sled::IVec>, StoreError> {
        Ok(self.tree(name).get(keys::session_key(session))?)
    }

    /// A projection's values in session order (creation order), newest first if asked,
    /// starting strictly past `from`.
    pub fn projected_scan(
        &self,
        name: &str,
        from: Option<SessionId>,
        newest_first: bool,
    ) -> Box<dyn Iterator<Item = Result<(SessionId, sled::IVec), StoreError>> + '_> {
        let tree = self.tree(name);
        let entry = |item: Result<(sled::IVec, sled::IVec), sled::Error>| {
            let (key, value) = item?;
            Ok((keys::session_from_key(&key).expect("16-byte key"), value))
        };
        let bound = from.map(|s| keys::session_key(s).to_vec());
        match (newest_first, bound) {
            (true, Some(b)) => Box::new(tree.range(..b).rev().map(entry)),
            (true, None) => Box::new(tree.iter().rev().map(entry)),
            (false, Some(b)) => {
                Box::new(tree.range((std::ops::Bound::Excluded(b), std::ops::Bound::Unbounded)).map(entry))
            }
            (false, None) => Box::new(tree.iter().map(entry)),
        }
    }

    fn tree(&self, name: &str) -> &sled::Tree {
        &self
            .inner
            .projections
            .iter()
            .find(|(p, _)| p.name() == name)
            .unwrap_or_else(|| panic!("no projection named {name}"))
            .1
    }

    /// Drops the channels of sessions nobody is watching or writing.
    pub fn sweep(&self) {
        self.inner.hub.sweep();
    }

    /// Stops the writer after it has written everything queued, marks the log clean and
    /// flushes. Appends after this answer `ShuttingDown`.
    pub fn close(&self) -> Result<(), StoreError> {
        self.stop(true)
    }

    /// Closes without marking the log clean, as a crash would leave it: the next open
    /// rebuilds the projections. For tests of recovery.
    pub fn close_unclean(&self) -> Result<(), StoreError> {
        self.stop(false)
    }

    fn stop(&self, clean: bool) -> Result<(), StoreError> {
        self.jobs.lock().take();
        if let Some(handle) = self.writer.lock().take() {
            let _ = handle.join();
        }
        if clean && self.inner.failed().is_none() {
            self.inner.meta.insert(META_STATE, b"clean".as_slice())?;
        }
        self.inner.db.flush()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequence_numbers_are_found_in_stored_json() {
        let json = br#"{"id":"evt_x","type":"t","session_id":"s","sequence_number":1234,"created_at":"c"}"#;
        assert_eq!(sequence_number(json), 1234);
        assert_eq!(sequence_number(b"{}"), 0);
    }
}
