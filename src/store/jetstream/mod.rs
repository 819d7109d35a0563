//! The log on NATS JetStream, for several turnlog nodes on one log: one stream holds every
//! session's events, one subject per session (`<prefix>.events.<session>`), one message per
//! append batch ([`wire`]), so a batch is stored whole or not at all. An append names the
//! stream sequence of the session's last message (`Nats-Expected-Last-Subject-Sequence`):
//! if another node appended first, JetStream refuses it and nothing is stored. It is
//! acknowledged once JetStream has stored it (on a quorum of replicas with R3).
//!
//! That check is not enough alone. With replicas, JetStream 2.9 makes it on the stream's
//! leader against what the leader has applied, so two publishes at the same expected
//! sequence in flight at once can both be stored (nats-server#4320): a publish sent again
//! across a leader change (its first copy was in the new leader's log, not yet applied), or
//! two nodes that both believe they hold the session's lease. So the log is defined by the
//! messages themselves: a message is part of its session's log only if its first event
//! follows the last event of the messages before it that are ([`follows`]); any other is
//! void, and every node, reading the same stream in the same order, skips the same ones. A
//! node that publishes checks where its message landed before it answers ([`JetStreamLog::placed`]):
//! a message made void by another is refused as a race, never acknowledged.
//!
//! The numbering rules are the same as sled's ([`crate::store::numbering`]), applied by the
//! node that appends, which must have [prepared](SharedLog::prepare) the session (loaded its tail from
//! the stream). The session layer holds a lease per session so that one node appends at a
//! time; the expected sequence is the fence if two ever do.
//!
//! Each node runs one ordered consumer on the whole stream: every message, from any node,
//! reaches the sessions this node has loaded through the in-process hub (their watermark,
//! index and live bus), the path to every subscriber. A consumer that brings nothing while
//! the stream holds more (its server died) is replaced within seconds ([`quiet::Quiet`]), the
//! messages meanwhile fetched one by one; the projections' watch likewise. A node's own
//! append is applied when JetStream acknowledges it (it follows what the session holds, by
//! the expected sequence), and the consumer's copy of it is then skipped by its stream
//! sequence. A loaded session keeps an index of its messages (read once from their
//! headers) and its most recent messages; older events are fetched from the stream by
//! sequence.
//!
//! Projections live in a key-value bucket ([`mirror`]).
//!
//! The files, one concern each:
//! - here: the shared state (a loaded [`Session`] and how it takes a message), the second
//!   fence's rule ([`follows`]), and the store's traits ([`Log`], [`Projections`],
//!   [`AuditLog`], [`SharedLog`]) implemented by calls into the others;
//! - [`config`]: what a node is told of the engine;
//! - [`open`]: connecting, making or checking the stream and the bucket, closing;
//! - [`follow`]: the node's consumer of the whole stream, its replacement when quiet
//!   ([`quiet`] says when), the turns seen open;
//! - [`load`]: loading a session (its index and tail), reading it, finding an event;
//! - [`publish`]: ordering an append and publishing it behind both fences;
//! - [`projections`]: putting, repairing and rebuilding the projections;
//! - [`mirror`]: each node's copy of the projections' bucket; [`wire`]: a message's form.

mod claims;
mod config;
mod follow;
mod load;
mod mirror;
mod open;
mod projections;
mod publish;
mod quiet;
pub mod wire;

use std::collections::VecDeque;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use async_nats::jetstream::{self, kv, stream};
use bytes::Bytes;
use dashmap::DashMap;
use parking_lot::Mutex;
use tokio::sync::{oneshot, watch};

use self::mirror::Mirror;
use self::wire::Entry;
use super::hub::{Channel, Hub};
use super::numbering::{Clock, Tail};
use super::{
    chain, AppendError, AuditLog, Conflict, Key, Log, Ordered, Position, Projection, Projections, ReadRange, Scan,
    SharedLog, StoreError, Subscription,
};
use crate::domain::{Draft, EventId, RawEvent, SessionId};

pub use self::config::{Credentials, JetStreamConfig};
pub use self::open::{open_bucket, patiently, when_ready};

/// Messages of a loaded session kept decoded, newest last.
const RECENT_MESSAGES: usize = 256;
/// How many of the messages its consumer brought last a node remembers the session of:
/// far more than its consumer can run ahead of the stream's leader (see `load`).
const HEARD: usize = 4096;

type Hashed = Arc<[(RawEvent, chain::Hash)]>;

struct Inner {
    client: async_nats::Client,
    js: jetstream::Context,
    stream: stream::Stream,
    bucket: kv::Store,
    /// Claims of keyed writes that make sessions (see [`crate::store::Claims`]).
    claims: kv::Store,
    config: JetStreamConfig,
    hub: Hub,
    sessions: DashMap<SessionId, Arc<Session>>,
    projections: Vec<Arc<dyn Projection>>,
    mirror: Arc<Mirror>,
    closed: AtomicBool,
    tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// Publishes in flight, to wait for at close.
    publishing: watch::Sender<usize>,
    /// Sessions whose turn is open after their last message, as read when the node started
    /// and then from what its consumer delivers (see [`SharedLog::turns_seen_open`]).
    seen_open: Mutex<std::collections::HashSet<SessionId>>,
    /// The session and stream sequence of the last [`HEARD`] messages the node's consumer
    /// brought, loaded here or not (see `load`).
    heard: Mutex<VecDeque<(SessionId, u64)>>,
    /// Sessions loaded here whose projections the last sweep found behind their log.
    behind: Mutex<std::collections::HashSet<SessionId>>,
}

/// A session this node has loaded.
struct Session {
    id: SessionId,
    channel: Arc<Channel>,
    loaded: tokio::sync::OnceCell<()>,
    state: Mutex<SessionState>,
    /// The stream sequence of the subject's last message this node has taken, part of the
    /// log or void (0 before any).
    seen: watch::Sender<u64>,
}

#[derive(Default)]
struct SessionState {
    loaded: bool,
    /// Messages the consumer delivered while the session was loading.
    early: Vec<(Entry, Hashed)>,
    index: Vec<Entry>,
    recent: VecDeque<(u64, Hashed)>,
    /// Appends ordered here and not yet published, oldest first.
    queue: Vec<Job>,
    publishing: bool,
    /// The subject's last stream sequence as this node's appends know it (`None`: not
    /// prepared, or another node appended: prepare again).
    expect: Option<u64>,
    /// The projections of some stored events were not put: repair before the next append.
    unprojected: bool,
}

struct Job {
    events: Vec<(RawEvent, chain::Hash)>,
    reply: oneshot::Sender<Result<(), AppendError>>,
    /// The channel's epoch when the events were numbered (see [`Channel::drop_tail`]).
    epoch: u64,
}

/// The log on JetStream.
#[derive(Clone)]
pub struct JetStreamLog {
    inner: Arc<Inner>,
}

/// Whether a message is part of its session's log after the messages of `index` (the log's,
/// in stream order): its first event comes right after their last. One that is not is
/// void: a copy of a batch already stored, or a batch JetStream let in at a position
/// another had taken (see the module's notes).
fn follows(index: &[Entry], entry: &Entry) -> bool {
    entry.first_seq == index.last().map_or(1, |last| last.last_seq() + 1)
}

/// Says that a message of the stream is void, once per node that skips it.
fn skipped(session: impl std::fmt::Display, entry: &Entry, index: &[Entry]) {
    let repeat = index.iter().rev().any(|e| e.first_id == entry.first_id && e.first_seq == entry.first_seq);
    tracing::warn!(session_id = %session, stream_seq = entry.stream_seq, first = entry.first_seq,
        what = if repeat { "a second copy of a batch" } else { "a batch at a position another took" },
        "a message of the stream is not part of its session's log; skipped");
}

/// A failure of a request to JetStream: the engine may be failing over, so try again.
fn store_error(context: &str, error: impl std::fmt::Display) -> StoreError {
    StoreError::unavailable(format!("{context}: {error}"))
}

impl JetStreamLog {
    /// The largest append (bytes of JSON) this log takes: `server.max_body_bytes`, or less
    /// if the NATS server's messages are too small for that.
    pub fn max_batch_bytes(&self) -> usize {
        self.inner.config.max_batch_bytes
    }

    fn subject(&self, session: SessionId) -> String {
        format!("{}.events.{}", self.inner.config.prefix, session.ulid())
    }

    fn session_of(&self, subject: &str) -> Option<SessionId> {
        let rest = subject.strip_prefix(&self.inner.config.prefix)?.strip_prefix(".events.")?;
        rest.parse::<ulid::Ulid>().ok().map(SessionId)
    }
}

impl Session {
    /// Loaded: `index` read from the stream up to its message `upto`.
    fn loaded_with(&self, index: Vec<Entry>, recent: VecDeque<(u64, Hashed)>, upto: u64) {
        let mut state = self.state.lock();
        if let Some(last) = index.last() {
            self.channel.set_durable(Position { last: Some(last.last_id), seq: last.last_seq() });
        }
        state.index = index;
        state.recent = recent;
        state.loaded = true;
        // Once what it says is taken (see `publish`).
        self.seen.send_modify(|seen| *seen = (*seen).max(upto));
        for (entry, events) in std::mem::take(&mut state.early) {
            if entry.stream_seq > upto {
                self.publish(&mut state, entry, events);
            }
        }
    }

    /// Takes a message of the stream: false if it is void (see [`follows`]).
    fn apply(&self, entry: Entry, events: Hashed) -> bool {
        // Another node appended: what this node ordered is stale; load the tail again first.
        // (The tail's lock before the state's, as an append takes them.)
        let stale = {
            let mut tail = self.channel.tail.lock();
            let stale = tail.is_some_and(|tail| tail.position.seq < entry.last_seq());
            if stale {
                self.channel.drop_tail(&mut tail);
            }
            stale
        };
        let mut state = self.state.lock();
        if stale {
            state.expect = None;
        }
        if !state.loaded {
            state.early.push((entry, events));
            return true;
        }
        if state.index.last().is_some_and(|last| last.stream_seq >= entry.stream_seq) {
            return true;
        }
        self.publish(&mut state, entry, events)
    }

    /// A message after those the session holds: if it is part of the log ([`follows`]),
    /// indexed, kept, and published; if void, skipped, but the next append names it.
    fn publish(&self, state: &mut SessionState, entry: Entry, events: Hashed) -> bool {
        let taken = follows(&state.index, &entry);
        tracing::debug!(session_id = %self.id, stream_seq = entry.stream_seq, first = entry.first_seq,
            count = entry.count, taken, "a message taken");
        if taken {
            state.index.push(entry);
            state.recent.push_back((entry.stream_seq, events.clone()));
            if state.recent.len() > RECENT_MESSAGES {
                state.recent.pop_front();
            }
            let batch: super::Batch = events.iter().map(|(event, _)| event.clone()).collect();
            self.channel.publish(batch);
        } else {
            skipped(self.id, &entry, &state.index);
            // The subject's last message: what this node's next append must expect, if what
            // it holds is still the log (a void message changes nothing of it).
            if let Some(expect) = state.expect.as_mut() {
                *expect = (*expect).max(entry.stream_seq);
            }
        }
        // Only now: whoever sees the message counted as seen finds its events (`find`
        // reads this, then the durable position).
        self.seen.send_modify(|seen| *seen = (*seen).max(entry.stream_seq));
        taken
    }

    fn recent(&self, stream_seq: u64) -> Option<Hashed> {
        let state = self.state.lock();
        let at = state.recent.binary_search_by_key(&stream_seq, |(seq, _)| *seq).ok()?;
        Some(state.recent[at].1.clone())
    }
}

#[async_trait::async_trait]
impl Log for JetStreamLog {
    fn order(&self, session: SessionId, expected: u64, drafts: Vec<Draft>) -> Result<Ordered, AppendError> {
        if drafts.is_empty() {
            return Ok(Ordered::settled(Ok(Vec::new())));
        }
        let limit = self.inner.config.max_events_per_session;
        self.order_with(session, |tail| {
            if let Some(turn) = tail.unknown_turn(&drafts) {
                // Not the session's last turn: an earlier one, which takes nothing more.
                tail.continue_turn(turn, 0);
            }
            tail.stage(session, expected, &drafts, &Clock::now(), limit)
        })
    }

    fn append(&self, session: SessionId, expected: u64, drafts: Vec<Draft>) -> super::AppendFuture {
        let log = self.clone();
        Box::pin(async move {
            log.prepare(session).await.map_err(unprepared)?;
            log.order(session, expected, drafts)?.durable().await
        })
    }

    async fn position(&self, session: SessionId) -> Result<Position, StoreError> {
        Ok(self.session(session).await?.channel.durable())
    }

    async fn read(&self, session: SessionId, range: ReadRange) -> Result<Vec<RawEvent>, StoreError> {
        Ok(self.within(session, range).await?.into_iter().map(|(event, _)| event).collect())
    }

    async fn event(&self, session: SessionId, id: EventId) -> Result<Option<RawEvent>, StoreError> {
        let beyond = |held: &Position| held.last.is_none_or(|last| id > last);
        self.find(session, |entry| entry.last_id < id, |event| event.id == id, beyond).await
    }

    async fn event_at(&self, session: SessionId, seq: u64) -> Result<Option<RawEvent>, StoreError> {
        let beyond = |held: &Position| seq > held.seq;
        self.find(session, |entry| entry.last_seq() < seq, |event| event.seq == seq, beyond).await
    }

    async fn subscribe(&self, session: SessionId) -> Result<Subscription, StoreError> {
        let channel = self.session(session).await?.channel.clone();
        let live = channel.subscribe();
        let at = channel.durable();
        Ok(Subscription { channel, live, at })
    }

    fn changes(&self) -> tokio::sync::broadcast::Receiver<ulid::Ulid> {
        self.inner.hub.changes()
    }

    fn sweep(&self) {
        // Projections this node could not put after an append (the bucket out of reach), and
        // those of sessions loaded here whose watermark has stayed behind their log since
        // the last sweep (the node that appended died before its puts): put now, not only
        // before the session's next append.
        let mut behind = self.inner.behind.lock();
        let mut late = Vec::new();
        let mut still = std::collections::HashSet::new();
        for session in self.inner.sessions.iter() {
            let writing_here = session.channel.tail.lock().is_some();
            let lags = !writing_here && session.channel.durable().seq > self.inner.mirror.watermark(session.id);
            if session.state.lock().unprojected || (lags && behind.contains(&session.id)) {
                late.push(session.clone());
            } else if lags {
                still.insert(session.id);
            }
        }
        *behind = still;
        drop(behind);
        for session in late {
            let log = self.clone();
            tokio::spawn(async move {
                match log.repair(&session).await {
                    Ok(()) => session.state.lock().unprojected = false,
                    Err(error) => tracing::warn!(%error, session_id = %session.id, "projections still not repaired"),
                }
            });
        }
        self.inner.sessions.retain(|_, session| {
            // A writer here has it prepared (until it releases it).
            let prepared = session.channel.tail.lock().is_some();
            let state = session.state.lock();
            // Held by the map and the hub only, with nothing in flight.
            let busy = state.publishing || !state.queue.is_empty() || Arc::strong_count(&session.channel) > 2;
            prepared || busy || Arc::strong_count(session) > 1
        });
        self.inner.hub.sweep();
    }

    async fn close(&self) -> Result<(), StoreError> {
        self.close_cleanly().await
    }
}

#[async_trait::async_trait]
impl Projections for JetStreamLog {
    async fn get(&self, projection: &str, key: Key) -> Result<Option<Bytes>, StoreError> {
        self.projected_value(projection, key).await
    }

    async fn scan(&self, projection: &str, scan: Scan) -> Result<Vec<(Key, Bytes)>, StoreError> {
        if !self.inner.projections.iter().any(|p| p.name() == projection) {
            return Err(super::unknown_projection(projection));
        }
        Ok(self.inner.mirror.scan(projection, scan))
    }
}

#[async_trait::async_trait]
impl AuditLog for JetStreamLog {
    async fn chained(&self, session: SessionId, range: ReadRange) -> Result<Vec<super::Chained>, StoreError> {
        Ok(self.within(session, range).await?.into_iter().map(|(event, hash)| (event, Some(hash))).collect())
    }

    async fn adopt(&self, session: SessionId, events: Vec<RawEvent>) -> Result<super::Appended, AppendError> {
        self.prepare(session).await.map_err(unprepared)?;
        let adopted = Tail::adopted(&events, self.inner.config.max_events_per_session)?;
        let ordered = self.order_with(session, |tail| {
            if tail.position.seq > 0 {
                return Ok(Err(Conflict { expected: 0, actual: tail.position }));
            }
            *tail = adopted;
            Ok(Ok(events))
        })?;
        ordered.durable().await
    }

    async fn session_ids(&self, after: Option<SessionId>, limit: usize) -> Result<Vec<SessionId>, StoreError> {
        self.sessions_in_stream(after, limit).await
    }
}

#[async_trait::async_trait]
impl SharedLog for JetStreamLog {
    async fn prepare(&self, session: SessionId) -> Result<(), StoreError> {
        self.prepare_to_append(session).await
    }

    fn release(&self, session: SessionId) {
        if let Some(loaded) = self.inner.sessions.get(&session).map(|s| s.clone()) {
            // The tail's lock before the state's, as an append takes them.
            loaded.channel.drop_tail(&mut loaded.channel.tail.lock());
            loaded.state.lock().expect = None;
        }
    }

    fn turns_seen_open(&self) -> Vec<SessionId> {
        self.inner.seen_open.lock().iter().copied().collect()
    }

    fn health(&self) -> super::Health {
        let version = self.inner.client.server_info().version;
        let durability = durability(&version);
        super::Health { engine: "jetstream", connected: self.connected(), version, durability }
    }
}

/// When a nats-server of `version` has an acknowledged message on disk: 2.10 added
/// `sync_interval` (`always`: before the acknowledgement); before it, every 2 minutes.
pub fn durability(version: &str) -> super::Durability {
    let mut parts = version.trim_start_matches('v').split('.').map(|part| part.parse::<u32>().unwrap_or(0));
    match (parts.next().unwrap_or(0), parts.next().unwrap_or(0)) {
        (major, minor) if (major, minor) < (2, 10) => super::Durability::SyncedOnTimer,
        _ => super::Durability::EngineConfigured,
    }
}

/// A session that could not be made ready to append to, as an append's failure.
fn unprepared(error: StoreError) -> AppendError {
    match error.is_unavailable() {
        true => AppendError::Unavailable(error.to_string()),
        false => AppendError::Storage(error.to_string()),
    }
}
