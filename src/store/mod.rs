//! The durable event log behind narrow traits (raft-engine's `PipeLog` is the model), one
//! for each kind of user: [`Log`] (append a batch of drafts to one session at an expected
//! position, read after a cursor, subscribe to live events), [`Projections`] (the values
//! folded from the log), [`AuditLog`] (the hash chain, whole logs brought in) and
//! [`SharedLog`] (what a log shared by several nodes adds for the engine), and [`Claims`]
//! (names reserved once, for keyed writes that make a session). [`Store`] is one
//! backend seen through each.
//!
//! Three implementations: [`sled::SledLog`], embedded and durable; [`jetstream`], shared by
//! several nodes; [`memory::MemoryLog`], for tests. The rules that number events live once,
//! in [`numbering`]; the live channels and durable watermarks in `hub`; following a log in
//! [`follow`]; the chain's hash in [`chain`]. Nothing here knows about HTTP, sessions or
//! projections by name, and no sled type leaves [`sled`].

pub mod chain;
pub mod follow;
mod hub;
pub mod jetstream;
pub mod memory;
pub mod numbering;
mod recent;
pub mod sled;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use std::sync::Arc;
use tokio::sync::broadcast;
use ulid::Ulid;

use crate::domain::ids::now_ms;
use crate::domain::{Draft, Event, EventId, RawEvent, SessionId};
pub use hub::{Batch, Channel, Live, Position};

/// The answer to an append that was made or refused as the log stood: the stored events,
/// or the conflict when the log did not end where the caller expected.
pub type Appended = Result<Vec<RawEvent>, Conflict>;

/// An append, already ordered: it waits only for the events to be durable.
pub type AppendFuture = BoxFuture<'static, Result<Appended, AppendError>>;

/// An append the log has ordered and numbered, before it is durable: its events (or the
/// conflict) are known at once, so that the one writer of a session can decide its next
/// append on them while this one is being written, and both share a flush. Nobody else
/// may see the events before [`Ordered::durable`] resolves: until then they can still be
/// lost with the process.
pub struct Ordered {
    pub appended: Appended,
    durable: BoxFuture<'static, Result<(), AppendError>>,
}

impl Ordered {
    /// An append with nothing to write (a conflict, or no drafts).
    pub fn settled(appended: Appended) -> Ordered {
        Ordered { appended, durable: Box::pin(std::future::ready(Ok(()))) }
    }

    pub fn new(appended: Appended, durable: BoxFuture<'static, Result<(), AppendError>>) -> Ordered {
        Ordered { appended, durable }
    }

    /// The events (or the conflict), once durable.
    pub async fn durable(self) -> Result<Appended, AppendError> {
        self.durable.await?;
        Ok(self.appended)
    }

    /// The events (or the conflict) now, and what resolves once they are durable.
    pub fn split(self) -> (Appended, BoxFuture<'static, Result<(), AppendError>>) {
        (self.appended, self.durable)
    }
}

/// An event and its chain hash, if it has one.
pub type Chained = (RawEvent, Option<chain::Hash>);

/// The log did not end at the expected position: someone else appended first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conflict {
    pub expected: u64,
    pub actual: Position,
}

/// Why an append was not made. `Closed` and `TooManyEvents` are answers, not failures.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AppendError {
    #[error("the session is terminated; its log takes no more events")]
    Closed,
    #[error("the session has reached its limit of {limit} events")]
    TooManyEvents { limit: u64 },
    /// A turn's events go between its `turn.started` and the next turn's: a caller that
    /// appends to an earlier turn has a bug.
    #[error("turn {turn} has ended: a later turn has started")]
    OutOfTurn { turn: String },
    /// A whole log brought in from elsewhere is not one the numbering could have made.
    #[error("{0}")]
    Malformed(String),
    #[error("the log is shutting down")]
    ShuttingDown,
    /// Another node appended to the session first (or this one has not loaded it to
    /// append): nothing was stored, and the appender must load the session again.
    #[error("{0}")]
    Raced(String),
    #[error("storage failed: {0}")]
    Storage(String),
    /// The engine under a shared log did not store it (out of reach, or failing over):
    /// nothing was acknowledged, and the caller may try again.
    #[error("{0}")]
    Unavailable(String),
    /// The engine under a shared log did not say whether it stored the append, and could
    /// not be asked in time: it may be stored. Only a keyed write is safe to send again.
    #[error("{0}")]
    FateUnknown(String),
}

impl AppendError {
    fn reason(&self) -> &'static str {
        match self {
            AppendError::Closed => "closed",
            AppendError::TooManyEvents { .. } => "too_many_events",
            AppendError::OutOfTurn { .. } => "out_of_turn",
            AppendError::Malformed(_) => "malformed",
            AppendError::ShuttingDown => "shutting_down",
            AppendError::Raced(_) => "raced",
            AppendError::Unavailable(_) => "unavailable",
            AppendError::FateUnknown(_) => "fate_unknown",
            AppendError::Storage(_) => "storage",
        }
    }
}

/// A failure of the storage underneath; its `Debug` carries the cause.
#[derive(Debug, thiserror::Error)]
#[error("storage failed: {cause}")]
pub struct StoreError {
    #[source]
    cause: Box<dyn std::error::Error + Send + Sync>,
    unavailable: bool,
}

impl StoreError {
    pub fn new(cause: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> StoreError {
        StoreError { cause: cause.into(), unavailable: false }
    }

    /// The engine a shared log is a client of could not be reached, or did not answer in
    /// time: nothing is known to be wrong with the log, and the caller may try again.
    pub fn unavailable(cause: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> StoreError {
        StoreError { cause: cause.into(), unavailable: true }
    }

    pub fn is_unavailable(&self) -> bool {
        self.unavailable
    }
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

/// Events read per step when a whole log is folded.
const FOLD_CHUNK: usize = 1024;

/// Reads every event of `session` after `after`, in order, to the end of its log, a chunk
/// at a time, handing each to `apply`; answers the last position read.
pub async fn fold(
    log: &dyn Log,
    session: SessionId,
    mut after: Position,
    mut apply: impl FnMut(&RawEvent),
) -> Result<Position, StoreError> {
    loop {
        let range = ReadRange { after: after.last, before: None, limit: FOLD_CHUNK, newest_first: false };
        let events = log.read(session, range).await?;
        let Some(last) = events.last() else { return Ok(after) };
        after = Position { last: Some(last.id), seq: last.seq };
        events.iter().for_each(&mut apply);
    }
}

/// A live subscription: the bus receiver, taken before the watermark was read, so
/// everything after `at` arrives on `live` (or is in the log when the bus lags).
pub struct Subscription {
    pub channel: Arc<Channel>,
    pub live: broadcast::Receiver<Live>,
    pub at: Position,
}

/// Where a projection keeps a value: one per session (`item: None`), or one per item of a
/// session (a turn), in id order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Key {
    pub session: SessionId,
    pub item: Option<Ulid>,
}

impl Key {
    pub fn session(session: SessionId) -> Key {
        Key { session, item: None }
    }
}

/// A page of a projection in key order: within one session or across all, strictly past
/// `after` in the direction of the scan.
#[derive(Debug, Clone, Copy)]
pub struct Scan {
    pub session: Option<SessionId>,
    pub after: Option<Key>,
    pub newest_first: bool,
    pub limit: usize,
}

/// A page of projected values kept in memory in key order, as [`Projections::scan`] answers it.
fn page(values: &std::collections::BTreeMap<Key, Bytes>, scan: Scan) -> Vec<(Key, Bytes)> {
    let in_scope = |key: &Key| scan.session.is_none_or(|s| key.session == s);
    let entries: Box<dyn Iterator<Item = (&Key, &Bytes)>> = match (scan.newest_first, scan.after) {
        (false, Some(after)) => Box::new(values.range(after..).filter(move |(k, _)| **k != after)),
        (false, None) => Box::new(values.iter()),
        (true, Some(after)) => Box::new(values.range(..after).rev()),
        (true, None) => Box::new(values.iter().rev()),
    };
    entries.filter(|(k, _)| in_scope(k)).take(scan.limit).map(|(k, v)| (*k, v.clone())).collect()
}

/// A projection: values folded from the events it wants, kept beside the log. `apply` is
/// pure; the log does the reading and writing, and rebuilds every projection from the
/// events after an unclean stop or when the set of projections changes.
pub trait Projection: Send + Sync + 'static {
    fn name(&self) -> &'static str;
    /// Raised when the stored form changes, so that the log rebuilds it.
    fn version(&self) -> u32 {
        1
    }
    fn wants(&self, kind: &str) -> bool;
    /// Whether its values are the sessions' summaries, one per session: a log that learns
    /// from its projections of appends made on other nodes (JetStream's) reports each
    /// session whose summary changes on [`Log::changes`].
    fn lists_sessions(&self) -> bool {
        false
    }
    /// The values `event` changes (most change one, or none).
    fn keys(&self, event: &Event) -> Vec<Key>;
    /// The new value under `key` after `event`, or `None` to keep the current one.
    fn apply(&self, key: Key, current: Option<&[u8]>, event: &Event) -> Option<Vec<u8>>;
}

fn unknown_projection(name: &str) -> StoreError {
    StoreError::new(format!("the log keeps no projection named {name:?}"))
}

/// The signature of a set of projections: a log whose stored set differs rebuilds them.
fn signature(projections: &[Arc<dyn Projection>]) -> String {
    projections.iter().map(|p| format!("{}:{}", p.name(), p.version())).collect::<Vec<_>>().join(",")
}

/// Where a log keeps its projected values, for [`project`].
trait Values {
    fn get(&mut self, projection: &'static str, key: Key) -> Result<Option<Bytes>, StoreError>;
    fn put(&mut self, projection: &'static str, key: Key, value: Vec<u8>) -> Result<(), StoreError>;
    /// Whether the value under `key` already has the event numbered `seq` folded in (a log
    /// that may fold an event twice, after a crash between two puts, keeps that per value;
    /// the next `put` is the one for `seq`).
    fn folded(&mut self, _projection: &'static str, _key: Key, _seq: u64) -> bool {
        false
    }
}

/// Folds one event into every projection that wants it.
fn project(projections: &[Arc<dyn Projection>], event: &RawEvent, values: &mut impl Values) -> Result<(), StoreError> {
    let kind = event.kind();
    let mut decoded = None;
    for projection in projections {
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
        for key in projection.keys(event) {
            if values.folded(projection.name(), key, event.sequence_number) {
                continue;
            }
            let current = values.get(projection.name(), key)?;
            if let Some(value) = projection.apply(key, current.as_deref(), event) {
                values.put(projection.name(), key, value)?;
            }
        }
    }
    Ok(())
}

/// The engine underneath a log that is a client of one, for `/healthz`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Health {
    pub engine: &'static str,
    pub connected: bool,
    /// The engine's version, as its server said at connect.
    pub version: String,
    /// When an acknowledged append is on disk (see [`Durability`]).
    pub durability: Durability,
}

/// When an append the log acknowledged is on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Durability {
    /// Synced before the acknowledgement (sled's write-ahead log).
    SyncedOnAck,
    /// Synced on the engine's own timer (nats-server before 2.10: every 2 minutes): the
    /// replicas' memory holds it until then, and losing every replica at once (one machine,
    /// one power supply) loses it.
    SyncedOnTimer,
    /// As the engine's configuration says (nats-server 2.10+: `sync_interval: always` syncs
    /// every write before its acknowledgement), which the log cannot read from here.
    EngineConfigured,
}

/// The log itself: each session's events, appended at an expected position, read back
/// after a cursor, and followed live. Appends to one session are ordered by the calls to
/// [`Log::order`]; reads never see an event before it is durable.
#[async_trait::async_trait]
pub trait Log: Send + Sync + 'static {
    /// Orders `drafts` as the session's next events, as one unit, if the log ends at
    /// sequence number `expected` (0: empty) counting every append ordered so far, durable
    /// or not; otherwise answers the [`Conflict`]. Appends to one session ordered in a row,
    /// each at the position the one before leaves, all succeed and share flushes as they
    /// come. A refusal (`Closed`, a limit, shutting down) is answered at once.
    fn order(&self, session: SessionId, expected: u64, drafts: Vec<Draft>) -> Result<Ordered, AppendError>;

    /// [`Log::order`], resolved once the events are durable and published.
    fn append(&self, session: SessionId, expected: u64, drafts: Vec<Draft>) -> AppendFuture {
        let ordered = self.order(session, expected, drafts);
        Box::pin(async move { ordered?.durable().await })
    }

    /// The session's durable position.
    async fn position(&self, session: SessionId) -> Result<Position, StoreError>;

    /// Events of `session` within `range`.
    async fn read(&self, session: SessionId, range: ReadRange) -> Result<Vec<RawEvent>, StoreError>;

    /// The durable event `id` of `session`, if there is one.
    async fn event(&self, session: SessionId, id: EventId) -> Result<Option<RawEvent>, StoreError>;

    /// The durable event with sequence number `seq` of `session`, if there is one.
    async fn event_at(&self, session: SessionId, seq: u64) -> Result<Option<RawEvent>, StoreError>;

    /// The session's live bus, and the position from which it delivers everything.
    async fn subscribe(&self, session: SessionId) -> Result<Subscription, StoreError>;

    /// The sessions whose logs grow from now on, each as its new events are published.
    fn changes(&self) -> broadcast::Receiver<Ulid>;

    /// Drops what sessions nobody watches or writes hold (their live channels).
    fn sweep(&self);

    /// Writes what is queued and closes; later appends answer `ShuttingDown`.
    async fn close(&self) -> Result<(), StoreError>;
}

/// The projections the log keeps beside it ([`Projection`]), folded as it writes and
/// rebuilt from the events when it opens after an unclean stop, or when the set of
/// projections it was given differs from the stored one.
#[async_trait::async_trait]
pub trait Projections: Send + Sync + 'static {
    /// A projection's value.
    async fn get(&self, projection: &str, key: Key) -> Result<Option<Bytes>, StoreError>;

    /// A page of a projection's values.
    async fn scan(&self, projection: &str, scan: Scan) -> Result<Vec<(Key, Bytes)>, StoreError>;
}

/// What audit tools need of a log: each event's chain hash, whole logs brought in from an
/// export, and every session there is.
#[async_trait::async_trait]
pub trait AuditLog: Send + Sync + 'static {
    /// [`Log::read`], each event with its chain hash (`None`: the chain has not reached it).
    async fn chained(&self, session: SessionId, range: ReadRange) -> Result<Vec<Chained>, StoreError>;

    /// Stores `events` (a whole log, exported from somewhere) as `session`'s log, byte for
    /// byte, if the session has no events (else the conflict); sequence numbers must run 1,
    /// 2, 3, ... and ids increase. The chain is computed anew as they are written. Answered
    /// once durable.
    async fn adopt(&self, session: SessionId, events: Vec<RawEvent>) -> Result<Appended, AppendError>;

    /// The sessions that have events, in id order, strictly after `after`.
    async fn session_ids(&self, after: Option<SessionId>, limit: usize) -> Result<Vec<SessionId>, StoreError>;
}

/// What a log shared by several nodes adds, for the engine that writes to it (beside its
/// cluster port) and for `/healthz`.
#[async_trait::async_trait]
pub trait SharedLog: Send + Sync + 'static {
    /// Makes ready to order appends to `session` (loads its end from the engine underneath,
    /// unless it is loaded). The engine calls it before a session's first append on this
    /// node, and before each decision made with no turn running and nothing of its own in
    /// flight: the end is let go when another node's batch lands there.
    async fn prepare(&self, session: SessionId) -> Result<(), StoreError>;

    /// This node's writer of `session` has stopped: what `prepare` loaded may go (the
    /// session's next writer, here or elsewhere, prepares again).
    fn release(&self, session: SessionId);

    /// Sessions whose log, as this node knows it (from each session's last message when it
    /// started, then from the messages it sees go by), ends with a turn open: a node that
    /// died between storing `turn.started` and writing its projections leaves a turn the
    /// open-turn index does not list.
    fn turns_seen_open(&self) -> Vec<SessionId>;

    /// The engine underneath and whether it is reachable.
    fn health(&self) -> Health;
}

/// Names reserved once, for keyed writes that make something new (a session, whose id a
/// retry must find): the first claim of a name reserves its value, and every later claim
/// answers that value, until it expires. The log stays the truth of what was made: a claim
/// names only what a write will make, so a write cut short is made by its retry.
#[async_trait::async_trait]
pub trait Claims: Send + Sync + 'static {
    /// Reserves `value` under `name` for `ttl` unless a live claim holds it: answers the
    /// value that holds it now (`value`, if this claim won). Durable before it answers.
    async fn claim(&self, name: &str, value: Bytes, ttl: std::time::Duration) -> Result<Bytes, StoreError>;
}

/// A claim's value as an embedded log keeps it: when it expires (ms since the epoch, 8
/// bytes big-endian), then the value.
fn claim_record(value: &[u8], ttl: std::time::Duration) -> Vec<u8> {
    let expires = now_ms().saturating_add(ttl.as_millis() as u64);
    [&expires.to_be_bytes()[..], value].concat()
}

/// The value of a stored claim record if it has not expired.
fn live_claim(record: &[u8]) -> Option<&[u8]> {
    let (expires, value) = record.split_at_checked(8)?;
    let expires = u64::from_be_bytes(expires.try_into().ok()?);
    (expires > now_ms()).then_some(value)
}

/// One log store seen through each of its traits, as the service hands it out: the log to
/// everyone, the projections to readers, the audit side to audit tools, and what a shared
/// log adds to the engine (`None` for an embedded log).
#[derive(Clone)]
pub struct Store {
    pub log: Arc<dyn Log>,
    pub projections: Arc<dyn Projections>,
    pub audit: Arc<dyn AuditLog>,
    pub claims: Arc<dyn Claims>,
    pub shared: Option<Arc<dyn SharedLog>>,
}

impl Store {
    /// A log of this process alone (sled, or memory).
    pub fn embedded<S: Log + Projections + AuditLog + Claims>(store: Arc<S>) -> Store {
        Store { log: store.clone(), projections: store.clone(), audit: store.clone(), claims: store, shared: None }
    }

    /// A log shared by several nodes.
    pub fn shared<S: Log + Projections + AuditLog + Claims + SharedLog>(store: Arc<S>) -> Store {
        let claims = store.clone();
        Store { log: store.clone(), projections: store.clone(), audit: store.clone(), claims, shared: Some(store) }
    }
}
