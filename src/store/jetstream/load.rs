//! Loading a session from the stream (its index of messages, read from their headers, and
//! its last message), reading its events, finding one, and loading its tail to append.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::{consumer, stream};
use futures_util::{StreamExt, TryStreamExt};
use parking_lot::Mutex;
use tokio::sync::watch;

use super::wire::{self, Entry};
use super::{follows, patiently, skipped, store_error, Hashed, JetStreamLog, Session};
use crate::domain::{RawEvent, SessionId};
use crate::store::numbering::Tail;
use crate::store::{chain, Position, ReadRange, StoreError};

/// How long a node waits for a consumer to index a session before it walks the messages.
const CONSUMER_WAIT: Duration = Duration::from_secs(3);

/// How long a lookup of an event newer than all a node holds asks the stream again before
/// it calls the event unknown (see `JetStreamLog::find`).
const UNSEEN_WAIT: Duration = Duration::from_secs(2);

/// A log of at most this many events is short: walking its messages (one request each) is
/// cheap.
const SHORT_LOG: u64 = 64;

/// How long the first read of a short log waits for its consumer before it walks it too.
const HEDGE_AFTER: Duration = Duration::from_millis(250);

/// Messages fetched from the stream at once by a read.
const FETCH_AHEAD: usize = 16;

impl JetStreamLog {
    /// The session, loaded: its index read from the stream, its watermark at its last message.
    pub(super) async fn session(&self, id: SessionId) -> Result<Arc<Session>, StoreError> {
        if self.inner.closed.load(Ordering::SeqCst) {
            return Err(StoreError::new("the log is closed"));
        }
        let session = self
            .inner
            .sessions
            .entry(id)
            .or_insert_with(|| {
                let channel = self.inner.hub.channel(id.ulid(), || Ok::<_, StoreError>(Position::default()));
                Arc::new(Session {
                    id,
                    channel: channel.expect("a new channel"),
                    loaded: tokio::sync::OnceCell::new(),
                    state: Mutex::default(),
                    seen: watch::channel(0).0,
                })
            })
            .clone();
        session.loaded.get_or_try_init(|| self.load(&session)).await?;
        Ok(session)
    }

    /// [`AuditLog::session_ids`](crate::store::AuditLog::session_ids): the sessions the
    /// stream holds a subject of.
    pub(super) async fn sessions_in_stream(
        &self,
        after: Option<SessionId>,
        limit: usize,
    ) -> Result<Vec<SessionId>, StoreError> {
        let filter = format!("{}.events.*", self.inner.config.prefix);
        let subjects = self.inner.stream.info_with_subjects(filter).await.map_err(|e| store_error("the stream", e))?;
        let mut ids: Vec<SessionId> = subjects
            .map_ok(|(subject, _)| self.session_of(&subject))
            .try_filter_map(|id| std::future::ready(Ok(id)))
            .try_collect()
            .await
            .map_err(|e| store_error("the stream's subjects", e))?;
        ids.sort_unstable();
        ids.dedup();
        Ok(ids.into_iter().filter(|id| after.is_none_or(|after| *id > after)).take(limit).collect())
    }

    /// The subject's last message (`None`: it has none), asked patiently of the stream's
    /// leader.
    pub(super) async fn last_message(
        &self,
        subject: &str,
    ) -> Result<Option<async_nats::jetstream::message::StreamMessage>, stream::LastRawMessageError> {
        let none = |e: &stream::LastRawMessageError| e.kind() == stream::LastRawMessageErrorKind::NoMessageFound;
        let stream = &self.inner.stream;
        let wait = self.inner.config.failover_wait;
        match patiently(wait, "last message", || stream.get_last_raw_message_by_subject(subject), none).await {
            Ok(message) => Ok(Some(message)),
            Err(error) if none(&error) => Ok(None),
            Err(error) => Err(error),
        }
    }

    async fn load(&self, session: &Arc<Session>) -> Result<(), StoreError> {
        let subject = self.subject(session.id);
        let last = self
            .last_message(&subject)
            .await
            .map_err(|error| store_error(&format!("could not read session {}", session.id), error))?;
        // The leader answers what it has stored; this node's consumer may have brought a
        // later message of the session from a replica a moment earlier, before the session
        // was loading here (see `find`), and will not bring it again: read up to it too.
        let heard = self.inner.heard.lock().iter().filter(|(of, _)| *of == session.id).map(|(_, seq)| *seq).max();
        let upto = last.as_ref().map_or(0, |last| last.sequence).max(heard.unwrap_or(0));
        let mut index = Vec::new();
        let mut recent = VecDeque::new();
        if upto > 0 {
            // How many events the log holds, from its last message's header: a short log is
            // cheaper to walk than to wait for a consumer (see `index`).
            let events = last.as_ref().and_then(|last| wire::entry(last.sequence, Some(&last.headers)).ok());
            let short = events.is_some_and(|entry| entry.last_seq() <= SHORT_LOG);
            index = self.index(session.id, &subject, upto, short).await?;
            if let Some(last) = last.filter(|last| last.sequence == upto) {
                if index.last().is_some_and(|entry| entry.stream_seq == upto) {
                    let events = Hashed::from(wire::decode(&last.payload).map_err(StoreError::new)?);
                    recent.push_back((upto, events));
                }
            }
        }
        tracing::debug!(session_id = %session.id, upto, heard, messages = index.len(), "a session loaded");
        session.loaded_with(index, recent, upto);
        Ok(())
    }

    /// The entries of the subject's messages that are part of its log ([`follows`]), up to
    /// stream sequence `upto`, from their headers. Read with a consumer on the subject's
    /// headers; if that does not answer in time (a server failing over may leave a new
    /// consumer unplaced for a while), by walking the subject's messages one request at a
    /// time, which only needs the stream's leader.
    /// A `short` log is also walked if the consumer has not answered within
    /// [`HEDGE_AFTER`] (a busy or failing-over server places new consumers slowly): its first
    /// read does not wait for a consumer that a few requests do without.
    async fn index(&self, session: SessionId, subject: &str, upto: u64, short: bool) -> Result<Vec<Entry>, StoreError> {
        let by_consumer = tokio::time::timeout(CONSUMER_WAIT, self.index_once(subject, upto));
        let by_consumer = match short {
            false => by_consumer.await,
            true => {
                tokio::pin!(by_consumer);
                tokio::select! {
                    indexed = &mut by_consumer => indexed,
                    _ = tokio::time::sleep(HEDGE_AFTER) => tokio::select! {
                        indexed = by_consumer => indexed,
                        walked = self.index_walking(subject, upto) => Ok(walked),
                    },
                }
            }
        };
        let whole = |every: &[Entry]| every.last().map(|entry| entry.stream_seq) == Some(upto);
        let every = match by_consumer {
            // A consumer made as a server fails over may bring less than the leader holds:
            // the leader's own messages are read instead.
            Ok(Ok(every)) if !whole(&every) => {
                tracing::warn!(subject, upto, "a session's index by consumer ends before its last message; walking it");
                self.index_walking(subject, upto).await?
            }
            Ok(Ok(every)) => every,
            Ok(Err(error)) => {
                tracing::warn!(%error, subject, "indexing a session by consumer failed; walking it");
                self.index_walking(subject, upto).await?
            }
            Err(_) => {
                tracing::warn!(subject, "indexing a session by consumer took too long; walking it");
                self.index_walking(subject, upto).await?
            }
        };
        if !whole(&every) {
            // Still short, as the stream elects its next leader: not an error of the log, and
            // the same read a moment later is answered.
            return Err(StoreError::unavailable(format!(
                "session {session}: its index does not end at its last message yet (the stream is failing over)"
            )));
        }
        let mut index: Vec<Entry> = Vec::with_capacity(every.len());
        for entry in every {
            if follows(&index, &entry) {
                index.push(entry);
            } else {
                skipped(session, &entry, &index);
            }
        }
        Ok(index)
    }

    async fn index_walking(&self, subject: &str, upto: u64) -> Result<Vec<Entry>, StoreError> {
        let stream = &self.inner.stream;
        let mut every = Vec::new();
        let mut from = 1;
        while from <= upto {
            let next = || stream.raw_message_builder().sequence(from).next_by_subject(subject.to_string()).send();
            let message = patiently(self.inner.config.failover_wait, "a session's message", next, |_| false)
                .await
                .map_err(|e| store_error("could not index a session", e))?;
            every.push(wire::entry(message.sequence, Some(&message.headers)).map_err(StoreError::new)?);
            from = message.sequence + 1;
        }
        Ok(every)
    }

    async fn index_once(&self, subject: &str, upto: u64) -> Result<Vec<Entry>, StoreError> {
        let all = consumer::DeliverPolicy::All;
        let mut messages = self.read_stream(Some(subject), all, true, "could not index a session").await?;
        let mut index = Vec::new();
        while let Some(message) = messages.next().await {
            let message = message.map_err(|e| store_error("could not index a session", e))?;
            let info = message.info().map_err(|e| store_error("could not index a session", e))?;
            let stream_seq = info.stream_sequence;
            index.push(wire::entry(stream_seq, message.headers.as_ref()).map_err(StoreError::new)?);
            if stream_seq >= upto {
                break;
            }
        }
        Ok(index)
    }

    /// A message's events, from the session's recent ones or the stream.
    async fn message(&self, session: &Session, stream_seq: u64) -> Result<Hashed, StoreError> {
        if let Some(events) = session.recent(stream_seq) {
            return Ok(events);
        }
        let stream = &self.inner.stream;
        let message =
            patiently(self.inner.config.failover_wait, "a message", || stream.get_raw_message(stream_seq), |_| false)
                .await
                .map_err(|e| store_error(&format!("could not read message {stream_seq}"), e))?;
        Ok(Hashed::from(wire::decode(&message.payload).map_err(StoreError::new)?))
    }

    /// The events of `session` within `range`, each with its hash, never past its watermark.
    pub(super) async fn within(
        &self,
        id: SessionId,
        range: ReadRange,
    ) -> Result<Vec<(RawEvent, chain::Hash)>, StoreError> {
        let session = self.session(id).await?;
        let durable = session.channel.durable();
        let in_range = |event: &RawEvent| {
            event.seq <= durable.seq
                && range.after.is_none_or(|after| event.id > after)
                && range.before.is_none_or(|before| event.id < before)
        };
        // The messages that may hold events of the range, in the order read, as many as
        // `limit` events need (the first may hold some outside the range).
        let entries: Vec<Entry> = {
            let state = session.state.lock();
            let index = &state.index;
            let from = range.after.map_or(0, |after| index.partition_point(|e| e.last_id <= after));
            let to =
                index.partition_point(|e| e.first_seq <= durable.seq && range.before.is_none_or(|b| e.first_id < b));
            let within = &index[from..to.max(from)];
            let ordered: Box<dyn Iterator<Item = &Entry>> =
                if range.newest_first { Box::new(within.iter().rev()) } else { Box::new(within.iter()) };
            let mut events = 0u64;
            let mut first = None;
            ordered
                .take_while(|entry| {
                    let spare = *first.get_or_insert(entry.count);
                    let more = events < (range.limit as u64).saturating_add(spare);
                    events += entry.count;
                    more
                })
                .copied()
                .collect()
        };
        let mut found = Vec::new();
        for chunk in entries.chunks(FETCH_AHEAD) {
            let fetches = chunk.iter().map(|entry| self.message(&session, entry.stream_seq));
            let messages = futures_util::future::try_join_all(fetches).await?;
            for events in messages {
                let mut events: Vec<(RawEvent, chain::Hash)> =
                    events.iter().filter(|(event, _)| in_range(event)).cloned().collect();
                if range.newest_first {
                    events.reverse();
                }
                found.extend(events);
                if found.len() >= range.limit {
                    found.truncate(range.limit);
                    return Ok(found);
                }
            }
        }
        Ok(found)
    }

    /// The event `matches` picks, from the first message of the index that `before` is
    /// false for (the index is in log order, so `before` is a partition of it). One this
    /// node does not hold may be in a message another node appended a moment ago (a client
    /// resuming here after an event it had from that node): it is looked for again once
    /// this node holds the session's last message.
    ///
    /// It is looked for again in what the node holds after the stream was asked, whatever
    /// the stream answered: the stream's leader answers what it has stored, and a replica
    /// may have stored a message, and served it to a node's consumer, a moment before the
    /// leader did. So the leader may say this node holds the session's last message while
    /// this node's own consumer brings the event meanwhile (the cluster soak once had a
    /// client's cursor called unknown that way). If the event would still come after
    /// everything this node holds (`beyond`), the stream is asked again for a moment
    /// ([`UNSEEN_WAIT`]) before the event is called unknown.
    pub(super) async fn find(
        &self,
        id: SessionId,
        before: impl Fn(&Entry) -> bool,
        matches: impl Fn(&RawEvent) -> bool,
        beyond: impl Fn(&Position) -> bool,
    ) -> Result<Option<RawEvent>, StoreError> {
        let session = self.session(id).await?;
        let held = *session.seen.borrow();
        if let Some(found) = self.find_held(&session, &before, &matches).await? {
            return Ok(Some(found));
        }
        let caught_up = self.catch_up(&session, held).await?;
        if let Some(found) = self.find_held(&session, &before, &matches).await? {
            return Ok(Some(found));
        }
        if !caught_up && beyond(&session.channel.durable()) {
            let deadline = Instant::now() + UNSEEN_WAIT;
            while Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(50)).await;
                let held = *session.seen.borrow();
                if let Some(found) = self.find_held(&session, &before, &matches).await? {
                    return Ok(Some(found));
                }
                self.catch_up(&session, held).await?;
            }
        }
        // A client's cursor this node cannot place: foreign, or a fault of the log's.
        let (durable, seen) = (session.channel.durable(), *session.seen.borrow());
        let state = session.state.lock();
        let near = state.index.get(state.index.partition_point(|entry| before(entry))).copied();
        tracing::debug!(session_id = %id, held, seen, durable = ?durable, messages = state.index.len(),
            last = ?state.index.last(), near = ?near, "an event looked for is not in this node's log");
        Ok(None)
    }

    /// Waits until this node has taken the session's last message, which its consumer may
    /// not have brought yet; false if it had already when it had taken the message `held`.
    async fn catch_up(&self, session: &Session, held: u64) -> Result<bool, StoreError> {
        let subject = self.subject(session.id);
        let last = self
            .last_message(&subject)
            .await
            .map_err(|error| store_error(&format!("could not read session {}", session.id), error))?;
        let Some(last) = last else { return Ok(false) };
        if last.sequence <= held {
            return Ok(false);
        }
        let mut seen = session.seen.subscribe();
        let caught_up = async {
            let _ = seen.wait_for(|seen| *seen >= last.sequence).await;
        };
        if tokio::time::timeout(self.inner.config.failover_wait, caught_up).await.is_err() {
            return Err(StoreError::unavailable(format!("session {}: this node is behind its log", session.id)));
        }
        Ok(true)
    }

    /// [`JetStreamLog::find`] in what this node holds now.
    async fn find_held(
        &self,
        session: &Session,
        before: &impl Fn(&Entry) -> bool,
        matches: &impl Fn(&RawEvent) -> bool,
    ) -> Result<Option<RawEvent>, StoreError> {
        let durable = session.channel.durable();
        let entry = {
            let state = session.state.lock();
            state.index.get(state.index.partition_point(|entry| before(entry))).copied()
        };
        let Some(entry) = entry.filter(|entry| entry.first_seq <= durable.seq) else { return Ok(None) };
        let events = self.message(session, entry.stream_seq).await?;
        Ok(events.iter().map(|(event, _)| event).find(|event| matches(event) && event.seq <= durable.seq).cloned())
    }

    /// The tail and the chain head of a session this node is about to append to, from
    /// its last events.
    async fn load_tail(&self, session: &Arc<Session>) -> Result<(), StoreError> {
        let mut newest_first = Vec::new();
        let mut before = None;
        // Back to the last event of a turn (or the start): the tail knows the turn then.
        loop {
            let range = ReadRange { after: None, before, limit: 256, newest_first: true };
            let page = self.within(session.id, range).await?;
            let Some((last, _)) = page.last() else { break };
            before = Some(last.id);
            let found = page.iter().any(|(event, _)| event.turn().is_some());
            newest_first.extend(page);
            if found {
                break;
            }
        }
        let mut tail =
            Tail::recover(newest_first.iter().map(|(event, _)| Ok::<_, std::convert::Infallible>(event.clone())))
                .expect("infallible");
        if tail.turn.is_none() {
            if let Some((turn, number)) = newest_first.iter().find_map(|(event, _)| event.turn()) {
                tail.continue_turn(turn, number);
            }
        }
        let head = newest_first.first().map_or(chain::GENESIS, |(_, hash)| *hash);
        // The subject's last message, if the tail ends with the log's last (void messages
        // after it change nothing); else the message that ends where the tail does, as read:
        // the consumer may have indexed a later one meanwhile, which the tail does not count.
        let at = tail.position.seq;
        let expect = {
            let state = session.state.lock();
            match state.index.last() {
                last if last.map_or(0, |last| last.last_seq()) == at => Some(*session.seen.borrow()),
                _ => state.index.iter().rev().find(|entry| entry.last_seq() == at).map(|e| e.stream_seq),
            }
        };
        let Some(expect) = expect else {
            return Err(StoreError::unavailable(format!("session {}: its index moved as it was read", session.id)));
        };
        *session.channel.tail.lock() = Some(tail);
        *session.channel.chain_head.lock() = Some(head);
        session.state.lock().expect = Some(expect);
        Ok(())
    }

    /// [`SharedLog::prepare`](crate::store::SharedLog::prepare): the session loaded, its
    /// tail and chain head read, its projections made whole.
    pub(super) async fn prepare_to_append(&self, session: SessionId) -> Result<(), StoreError> {
        let loaded = self.session(session).await?;
        if loaded.channel.tail.lock().is_none() {
            // Fold onto the projections as they stand in the bucket, not as this node's copy
            // had them (another node may have appended to the session until a moment ago).
            let upto = self.bucket_revision().await?;
            if tokio::time::timeout(self.inner.config.failover_wait, self.inner.mirror.applied(upto)).await.is_err() {
                return Err(StoreError::unavailable("this node's copy of the projections is behind the bucket"));
            }
            self.load_tail(&loaded).await?;
            self.repair(&loaded).await?;
        }
        Ok(())
    }
}
