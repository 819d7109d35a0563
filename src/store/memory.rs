//! A log in memory, for tests: the same numbering rules, watermarks, live buses and
//! projections as the durable log, and nothing on disk. [`MemoryLog::reopen`] keeps the
//! events and rebuilds everything else from them, as a restart would.

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;

use super::hub::Hub;
use super::numbering::{Clock, Tail};
use super::{
    chain, claim_record, live_claim, project, AppendError, Appended, AuditLog, Claims, Key, Log, Ordered, Position,
    Projection, Projections, ReadRange, Scan, StoreError, Subscription, Values,
};
use crate::domain::{Draft, EventId, RawEvent, SessionId};

#[derive(Clone)]
pub struct MemoryLog {
    inner: Arc<Inner>,
}

struct Inner {
    state: Mutex<State>,
    hub: Hub,
    projections: Vec<Arc<dyn Projection>>,
    max_events_per_session: u64,
}

#[derive(Default)]
struct State {
    sessions: HashMap<SessionId, Session>,
    values: HashMap<&'static str, BTreeMap<Key, Bytes>>,
    claims: HashMap<String, Vec<u8>>,
    closed: bool,
}

#[derive(Default)]
struct Session {
    events: Vec<RawEvent>,
    /// Each event's chain hash.
    hashes: Vec<chain::Hash>,
    tail: Tail,
}

impl Session {
    fn extend(&mut self, events: &[RawEvent]) {
        for event in events {
            let prev = self.hashes.last().unwrap_or(&chain::GENESIS);
            self.hashes.push(chain::link(prev, &event.json));
            self.events.push(event.clone());
        }
    }
}

impl Values for HashMap<&'static str, BTreeMap<Key, Bytes>> {
    fn get(&mut self, projection: &'static str, key: Key) -> Result<Option<Bytes>, StoreError> {
        Ok(HashMap::get(self, projection).and_then(|values| values.get(&key)).cloned())
    }

    fn put(&mut self, projection: &'static str, key: Key, value: Vec<u8>) -> Result<(), StoreError> {
        self.entry(projection).or_default().insert(key, Bytes::from(value));
        Ok(())
    }
}

impl MemoryLog {
    pub fn new(projections: Vec<Arc<dyn Projection>>, bus_capacity: usize, max_events_per_session: u64) -> MemoryLog {
        let inner = Inner { state: Mutex::default(), hub: Hub::new(bus_capacity), projections, max_events_per_session };
        MemoryLog { inner: Arc::new(inner) }
    }

    /// A new log over this one's events, with tails and projections rebuilt from them; this
    /// one is closed.
    pub fn reopen(&self) -> MemoryLog {
        let mut old = self.inner.state.lock();
        old.closed = true;
        let inner = &self.inner;
        let reopened =
            MemoryLog::new(inner.projections.clone(), inner.hub.bus_capacity(), inner.max_events_per_session);
        let mut state = reopened.inner.state.lock();
        for (id, session) in &old.sessions {
            let tail =
                Tail::recover(session.events.iter().rev().cloned().map(Ok::<_, Infallible>)).expect("infallible");
            for event in &session.events {
                project(&inner.projections, event, &mut state.values).expect("memory never fails");
            }
            let mut reopened = Session { tail, ..Session::default() };
            reopened.extend(&session.events);
            state.sessions.insert(*id, reopened);
        }
        drop(state);
        reopened
    }

    fn append_now(&self, session: SessionId, expected: u64, drafts: &[Draft]) -> Result<Appended, AppendError> {
        if drafts.is_empty() {
            return Ok(Ok(Vec::new()));
        }
        self.write(session, |log| {
            let mut tail = log.tail;
            if let Some(turn) = tail.unknown_turn(drafts) {
                let newest_first = log.events.iter().rev().cloned().map(Ok::<_, Infallible>);
                tail.continue_turn(turn, Tail::last_in_turn(newest_first, turn).expect("infallible"));
            }
            let staged = tail.stage(session, expected, drafts, &Clock::now(), self.inner.max_events_per_session)?;
            Ok(staged.map(|events| (events, tail)))
        })
    }

    fn adopt_now(&self, session: SessionId, events: Vec<RawEvent>) -> Result<Appended, AppendError> {
        let tail = Tail::adopted(&events, self.inner.max_events_per_session)?;
        self.write(session, |log| match log.tail.position.seq {
            0 => Ok(Ok((events, tail))),
            _ => Ok(Err(super::Conflict { expected: 0, actual: log.tail.position })),
        })
    }

    /// Stores the events `stage` makes of the session's log, with the tail after them, as
    /// one unit: projected and published under the state's lock, so that batches are
    /// published in the order they were made.
    fn write(
        &self,
        session: SessionId,
        stage: impl FnOnce(&Session) -> Result<Result<(Vec<RawEvent>, Tail), super::Conflict>, AppendError>,
    ) -> Result<Appended, AppendError> {
        // Taken before the state's lock: making a channel reads the state.
        let channel = self.channel(session);
        let mut state = self.inner.state.lock();
        if state.closed {
            return Err(AppendError::ShuttingDown);
        }
        let State { sessions, values, .. } = &mut *state;
        let log = sessions.entry(session).or_default();
        let (events, tail) = match stage(log)? {
            Ok(staged) => staged,
            Err(conflict) => return Ok(Err(conflict)),
        };
        log.tail = tail;
        log.extend(&events);
        for event in &events {
            project(&self.inner.projections, event, values).expect("memory never fails");
        }
        channel.publish(events.clone().into());
        Ok(Ok(events))
    }

    fn channel(&self, session: SessionId) -> Arc<super::Channel> {
        let load = || Ok::<_, Infallible>(self.position_now(session));
        self.inner.hub.channel(session.ulid(), load).expect("infallible")
    }

    fn position_now(&self, session: SessionId) -> Position {
        let state = self.inner.state.lock();
        state.sessions.get(&session).map_or_else(Position::default, |s| s.tail.position)
    }

    /// `take` of each of the session's events within `range`, by its index.
    fn within<T>(&self, session: SessionId, range: ReadRange, take: impl Fn(&Session, usize) -> T) -> Vec<T> {
        let state = self.inner.state.lock();
        let Some(log) = state.sessions.get(&session) else { return Vec::new() };
        let events = &log.events;
        let from = range.after.map_or(0, |after| events.partition_point(|e| e.id <= after));
        let to = range.before.map_or(events.len(), |before| events.partition_point(|e| e.id < before)).max(from);
        let indices = from..to;
        if range.newest_first {
            indices.rev().take(range.limit).map(|i| take(log, i)).collect()
        } else {
            indices.take(range.limit).map(|i| take(log, i)).collect()
        }
    }

    /// `read` of the session's events (none for a session it has never seen).
    fn with_events<T>(&self, session: SessionId, read: impl FnOnce(&[RawEvent]) -> T) -> T {
        let state = self.inner.state.lock();
        read(state.sessions.get(&session).map_or(&[][..], |s| &s.events))
    }

    /// `read` of a projection's values, if the log keeps that projection.
    fn with_values<T>(
        &self,
        projection: &str,
        read: impl FnOnce(Option<&BTreeMap<Key, Bytes>>) -> T,
    ) -> Result<T, StoreError> {
        if !self.inner.projections.iter().any(|p| p.name() == projection) {
            return Err(super::unknown_projection(projection));
        }
        Ok(read(self.inner.state.lock().values.get(projection)))
    }
}

#[async_trait::async_trait]
impl Log for MemoryLog {
    fn order(&self, session: SessionId, expected: u64, drafts: Vec<Draft>) -> Result<Ordered, AppendError> {
        Ok(Ordered::settled(self.append_now(session, expected, &drafts)?))
    }

    async fn position(&self, session: SessionId) -> Result<Position, StoreError> {
        Ok(self.channel(session).durable())
    }

    async fn read(&self, session: SessionId, range: ReadRange) -> Result<Vec<RawEvent>, StoreError> {
        Ok(self.within(session, range, |log, i| log.events[i].clone()))
    }

    async fn event(&self, session: SessionId, id: EventId) -> Result<Option<RawEvent>, StoreError> {
        Ok(self.with_events(session, |events| {
            events.binary_search_by_key(&id, |e| e.id).ok().map(|at| events[at].clone())
        }))
    }

    async fn event_at(&self, session: SessionId, seq: u64) -> Result<Option<RawEvent>, StoreError> {
        let at = usize::try_from(seq).ok().and_then(|seq| seq.checked_sub(1));
        Ok(self.with_events(session, |events| at.and_then(|at| events.get(at)).cloned()))
    }

    async fn subscribe(&self, session: SessionId) -> Result<Subscription, StoreError> {
        let channel = self.channel(session);
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
        self.inner.state.lock().closed = true;
        Ok(())
    }
}

#[async_trait::async_trait]
impl Projections for MemoryLog {
    async fn get(&self, projection: &str, key: Key) -> Result<Option<Bytes>, StoreError> {
        self.with_values(projection, |values| values.and_then(|values| values.get(&key)).cloned())
    }

    async fn scan(&self, projection: &str, scan: Scan) -> Result<Vec<(Key, Bytes)>, StoreError> {
        self.with_values(projection, |values| values.map(|values| super::page(values, scan)).unwrap_or_default())
    }
}

#[async_trait::async_trait]
impl AuditLog for MemoryLog {
    async fn chained(&self, session: SessionId, range: ReadRange) -> Result<Vec<super::Chained>, StoreError> {
        Ok(self.within(session, range, |log, i| (log.events[i].clone(), Some(log.hashes[i]))))
    }

    async fn adopt(&self, session: SessionId, events: Vec<RawEvent>) -> Result<Appended, AppendError> {
        self.adopt_now(session, events)
    }

    async fn session_ids(&self, after: Option<SessionId>, limit: usize) -> Result<Vec<SessionId>, StoreError> {
        let state = self.inner.state.lock();
        let mut ids: Vec<SessionId> = state
            .sessions
            .iter()
            .filter(|(id, s)| !s.events.is_empty() && after.is_none_or(|after| **id > after))
            .map(|(id, _)| *id)
            .collect();
        ids.sort_unstable();
        ids.truncate(limit);
        Ok(ids)
    }
}

#[async_trait::async_trait]
impl Claims for MemoryLog {
    async fn claim(&self, name: &str, value: Bytes, ttl: std::time::Duration) -> Result<Bytes, StoreError> {
        let mut state = self.inner.state.lock();
        if let Some(held) = state.claims.get(name).and_then(|record| live_claim(record)) {
            return Ok(Bytes::copy_from_slice(held));
        }
        state.claims.insert(name.to_string(), claim_record(&value, ttl));
        Ok(value)
    }
}
