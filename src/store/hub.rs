//! One channel per active session: its durable watermark and its live bus.
//!
//! sled makes what the writer inserts visible before it is durable, so no reader may look
//! past the watermark, which the writer advances only once the commit is durable. A channel exists while
//! anyone holds it (a subscriber, or the writer while a batch is in flight), so a reader
//! that has to create one knows that nothing is in flight for that session and can take
//! the store's last key as durable.

use std::sync::Arc;

use dashmap::DashMap;
use parking_lot::Mutex;
use tokio::sync::broadcast;
use ulid::Ulid;

use super::numbering::Tail;
use super::recent::{Budget, Recent};
use crate::domain::{EventId, RawEvent};

/// A point in a session's log: its last event and sequence number (0 for an empty log).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Position {
    pub last: Option<EventId>,
    pub seq: u64,
}

pub type Batch = Arc<[RawEvent]>;

/// A commit larger than this goes on the bus as where it ends, not as its events: a
/// subscriber that stops reading keeps up to the bus's capacity of commits alive until it is
/// cut off, so the bus is bounded in bytes as well as in commits (256 of at most 64 KiB
/// each, where a commit may carry a 4 MiB request).
pub const BUS_BATCH_BYTES: usize = 64 << 10;

/// What a session's bus carries for one commit.
#[derive(Clone)]
pub enum Live {
    /// The commit's events.
    Events(Batch),
    /// A commit of more than [`BUS_BATCH_BYTES`]: it ends here, and subscribers read its
    /// events from the log (they are readable before this is sent).
    Stored(Position),
}

pub struct Channel {
    session: Ulid,
    durable: Mutex<Position>,
    bus: broadcast::Sender<Live>,
    /// Where the next append goes, counting those ordered but not yet durable: kept by a
    /// log that numbers appends as they are ordered, loaded when the first one comes. The
    /// channel outlives every append in flight (each holds it), so a tail loaded from the
    /// store is exact.
    pub(super) tail: Mutex<Option<Tail>>,
    /// The hub's feed of changed sessions.
    changes: broadcast::Sender<Ulid>,
    /// The hash of the last event written, kept by a log's writer once it has loaded it.
    pub(super) chain_head: Mutex<Option<super::chain::Hash>>,
    /// Raised (under the tail's lock) when appends ordered here were not stored and the
    /// tail was dropped: an append numbered before that, on the old tail, is refused.
    pub(super) epoch: std::sync::atomic::AtomicU64,
    /// The newest commits published, for readers near the end of the log.
    pub(super) recent: Recent,
}

impl Channel {
    pub fn durable(&self) -> Position {
        *self.durable.lock()
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Live> {
        self.bus.subscribe()
    }

    /// Drops the session's tail and chain head (`tail` is the tail's lock, which the caller
    /// holds), so that the next append loads them again, and raises the epoch: appends
    /// numbered on the old tail and still queued are refused, never stored with ones
    /// numbered on the new one (one commit would hold, say, events 107-109 and then 105).
    pub(super) fn drop_tail(&self, tail: &mut Option<Tail>) {
        *tail = None;
        *self.chain_head.lock() = None;
        self.epoch.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }

    /// Sets the watermark of a channel made before its session was read (a log that reads
    /// asynchronously makes the channel first, so that no publish is missed meanwhile).
    pub(super) fn set_durable(&self, position: Position) {
        *self.durable.lock() = position;
    }

    /// Called by the writer once the events are durable: first the watermark, then the
    /// broadcast, so a subscriber that subscribed before reading the watermark misses
    /// nothing.
    pub(super) fn publish(&self, events: Batch) {
        self.advance(&events);
        self.broadcast(events);
    }

    /// The first half of [`Channel::publish`]: the events are readable from here on.
    pub(super) fn advance(&self, events: &[RawEvent]) {
        if let Some(last) = events.last() {
            *self.durable.lock() = Position { last: Some(last.id), seq: last.seq };
        }
    }

    /// The second half of [`Channel::publish`], after [`Channel::advance`] for the same
    /// events: a subscriber that read the watermark before it moved gets them here, one
    /// that read it after has them from the log and drops these.
    pub(super) fn broadcast(&self, events: Batch) {
        if events.is_empty() {
            return;
        }
        // No receivers is not an error: nobody is watching this session right now.
        // Deltas change neither the session nor its state: only the rest is a change.
        let changed = events.iter().any(|event| !event.is_delta());
        let bytes: usize = events.iter().map(|event| event.json.len()).sum();
        self.recent.keep(&events, bytes);
        let live = match events.last() {
            Some(last) if bytes > BUS_BATCH_BYTES => Live::Stored(Position { last: Some(last.id), seq: last.seq }),
            _ => Live::Events(events),
        };
        let _ = self.bus.send(live);
        if changed {
            let _ = self.changes.send(self.session);
        }
    }
}

pub struct Hub {
    channels: DashMap<Ulid, Arc<Channel>>,
    bus_capacity: usize,
    changes: broadcast::Sender<Ulid>,
    recent: Arc<Budget>,
}

/// How many changed sessions the feed holds for a slow watcher before it lags.
const CHANGES_CAPACITY: usize = 4096;

impl Hub {
    pub fn new(bus_capacity: usize) -> Hub {
        Hub::keeping(bus_capacity, Budget::new(0, 0))
    }

    /// A hub whose channels keep their sessions' newest commits within `recent`.
    pub fn keeping(bus_capacity: usize, recent: Arc<Budget>) -> Hub {
        let (changes, _) = broadcast::channel(CHANGES_CAPACITY);
        Hub { channels: DashMap::new(), bus_capacity: bus_capacity.max(1), changes, recent }
    }

    /// Every session whose log grows from now on by more than deltas, once per publish (a
    /// watcher that lags is told so, and rereads what it shows).
    pub fn changes(&self) -> broadcast::Receiver<Ulid> {
        self.changes.subscribe()
    }

    /// The sender of the feed, for a log that learns of changes elsewhere.
    pub(super) fn changes_sender(&self) -> broadcast::Sender<Ulid> {
        self.changes.clone()
    }

    pub fn bus_capacity(&self) -> usize {
        self.bus_capacity
    }

    /// The session's channel, created with `load` (the store's last position) if needed.
    pub fn channel<E>(&self, session: Ulid, load: impl FnOnce() -> Result<Position, E>) -> Result<Arc<Channel>, E> {
        if let Some(channel) = self.channels.get(&session) {
            return Ok(channel.clone());
        }
        match self.channels.entry(session) {
            dashmap::Entry::Occupied(entry) => Ok(entry.get().clone()),
            dashmap::Entry::Vacant(entry) => {
                let durable = load()?;
                let (bus, _) = broadcast::channel(self.bus_capacity);
                let channel = Arc::new(Channel {
                    session,
                    durable: Mutex::new(durable),
                    bus,
                    tail: Mutex::new(None),
                    changes: self.changes.clone(),
                    chain_head: Mutex::new(None),
                    epoch: Default::default(),
                    recent: Recent::new(self.recent.clone()),
                });
                entry.insert(channel.clone());
                Ok(channel)
            }
        }
    }

    /// Drops the channels nobody holds, so an idle session costs no memory.
    pub fn sweep(&self) {
        self.channels.retain(|_, channel| Arc::strong_count(channel) > 1);
    }
}
