//! Appending: numbering and hashing under the session's tail lock, queueing, and publishing
//! one message per batch at the subject's expected last sequence, then checking where it
//! landed (the two fences of the module's notes).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use async_nats::jetstream;
use bytes::Bytes;
use tokio::sync::oneshot;

use super::wire::{self, Entry};
use super::{patiently, Hashed, JetStreamLog, Job, Session};
use crate::domain::{RawEvent, SessionId};
use crate::metrics;
use crate::store::numbering::Tail;
use crate::store::{chain, AppendError, Conflict, Ordered};

/// How many times an append refused at its expected sequence is sent again after void
/// messages (see [`JetStreamLog::past_void`]).
const VOID_PASSES: usize = 3;

impl JetStreamLog {
    /// Numbers and hashes under the session's tail lock, then queues: shared by appends
    /// and adoptions.
    pub(super) fn order_with(
        &self,
        session: SessionId,
        stage: impl FnOnce(&mut Tail) -> Result<Result<Vec<RawEvent>, Conflict>, AppendError>,
    ) -> Result<Ordered, AppendError> {
        if self.inner.closed.load(Ordering::SeqCst) {
            return Err(AppendError::ShuttingDown);
        }
        let not_prepared = || raced(session);
        let loaded = self.inner.sessions.get(&session).map(|s| s.clone());
        let session = loaded.filter(|s| s.loaded.initialized()).ok_or_else(not_prepared)?;
        let mut slot = session.channel.tail.lock();
        let mut tail = slot.ok_or_else(not_prepared)?;
        let events = match stage(&mut tail).inspect_err(|error| {
            metrics::APPENDS_REFUSED.with_label_values(&[error.reason()]).inc();
        })? {
            Ok(events) => events,
            Err(conflict) => {
                metrics::APPENDS_REFUSED.with_label_values(&["conflict"]).inc();
                return Ok(Ordered::settled(Err(conflict)));
            }
        };
        if events.is_empty() {
            return Ok(Ordered::settled(Ok(events)));
        }
        let size: usize = events.iter().map(|event| event.json.len()).sum();
        if size > self.inner.config.max_batch_bytes + self.inner.config.max_batch_bytes / 4 {
            return Err(AppendError::Storage(format!("an append of {size} bytes is more than one message carries")));
        }
        let mut head_slot = session.channel.chain_head.lock();
        let mut head = head_slot.ok_or_else(not_prepared)?;
        let hashed: Vec<(RawEvent, chain::Hash)> = events
            .into_iter()
            .map(|event| {
                head = chain::link(&head, &event.json);
                (event, head)
            })
            .collect();
        let ordered = self.queue(&session, hashed)?;
        *head_slot = Some(head);
        *slot = Some(tail);
        Ok(ordered)
    }

    /// Orders `events` (numbered under the session's tail lock, with their hashes) for the
    /// session's publisher.
    fn queue(&self, session: &Arc<Session>, events: Vec<(RawEvent, chain::Hash)>) -> Result<Ordered, AppendError> {
        let (reply, answer) = oneshot::channel();
        let appended: Vec<RawEvent> = events.iter().map(|(event, _)| event.clone()).collect();
        // Under the tail's lock (see `order_with`), which `Channel::drop_tail` is given too.
        let epoch = session.channel.epoch.load(Ordering::SeqCst);
        let start = {
            let mut state = session.state.lock();
            state.queue.push(Job { events, reply, epoch });
            !std::mem::replace(&mut state.publishing, true)
        };
        if start {
            self.inner.publishing.send_modify(|n| *n += 1);
            metrics::JETSTREAM_PUBLISHING.inc();
            let log = self.clone();
            let session = session.clone();
            tokio::spawn(async move {
                log.publish_queued(&session).await;
                log.inner.publishing.send_modify(|n| *n -= 1);
                metrics::JETSTREAM_PUBLISHING.dec();
            });
        }
        let durable = async move { answer.await.map_err(|_| AppendError::ShuttingDown)? };
        Ok(Ordered::new(Ok(appended), Box::pin(durable)))
    }

    /// Publishes what is queued for the session, all of it as one message each time, until
    /// nothing is left.
    async fn publish_queued(&self, session: &Arc<Session>) {
        // Why the last message was not stored: what is queued after it is refused for that.
        let mut failed: Option<AppendError> = None;
        loop {
            let (jobs, expect) = {
                let mut state = session.state.lock();
                if state.queue.is_empty() {
                    state.publishing = false;
                    return;
                }
                // As many as one message carries (each alone was checked to fit); the rest go
                // in the next.
                let cap = self.inner.config.max_batch_bytes + self.inner.config.max_batch_bytes / 4;
                let (mut size, mut take) = (0, 0);
                for job in &state.queue {
                    let bytes: usize = job.events.iter().map(|(event, _)| event.json.len()).sum();
                    if take > 0 && size + bytes > cap {
                        break;
                    }
                    (size, take) = (size + bytes, take + 1);
                }
                (state.queue.drain(..take).collect::<Vec<_>>(), state.expect)
            };
            // Numbered on a tail dropped since: refused as the append that dropped it was
            // (or as raced, if another node's append did), whatever `expect` says now.
            let epoch = session.channel.epoch.load(Ordering::SeqCst);
            let (jobs, stale): (Vec<Job>, Vec<Job>) = jobs.into_iter().partition(|job| job.epoch == epoch);
            for job in stale {
                let _ = job.reply.send(Err(failed.clone().unwrap_or_else(|| raced(session.id))));
            }
            if jobs.is_empty() {
                continue;
            }
            let events: Vec<(RawEvent, chain::Hash)> = jobs.iter().flat_map(|job| job.events.iter().cloned()).collect();
            let result = match (expect, &failed) {
                (Some(expect), _) => self.publish(session, expect, &events).await,
                // Numbered after events that were not stored, not after another node's.
                (None, Some(error)) => Err(error.clone()),
                (None, None) => Err(raced(session.id)),
            };
            if let Err(error) = &result {
                failed = Some(error.clone());
                // The tail and the chain head counted these events: load them again before
                // the next append, and refuse what was ordered after these.
                session.channel.drop_tail(&mut session.channel.tail.lock());
                session.state.lock().expect = None;
                tracing::warn!(%error, session_id = %session.id, events = events.len(), "an append was not stored");
            }
            for job in jobs {
                let _ = job.reply.send(result.clone());
            }
        }
    }

    /// One message, at the subject's expected last sequence; then its projections; answers
    /// once this node holds both (so that its reads see them).
    async fn publish(
        &self,
        session: &Arc<Session>,
        expect: u64,
        events: &[(RawEvent, chain::Hash)],
    ) -> Result<(), AppendError> {
        let storage =
            |context: &str, error: &dyn std::fmt::Display| AppendError::Storage(format!("{context}: {error}"));
        let open_before = session.state.lock().index.last().and_then(|entry| entry.open);
        let (mut headers, payload) = wire::encode(events, open_before);
        // The chain hash of the batch's last event, which covers its every byte and every
        // event before it: a publish sent again is recognised as this batch, and never
        // confused with another batch at the same position, even one whose events have the
        // same ids (two writers numbering from one tail within a millisecond of its last
        // event, or on clocks that disagree, each take its id plus one).
        headers.insert("Nats-Msg-Id", hex::encode(events[events.len() - 1].1).as_str());
        let subject = self.subject(session.id);
        let started = Instant::now();
        use jetstream::context::PublishErrorKind as Kind;
        let js = &self.inner.js;
        // Sent again while the engine fails over: the message id makes a second copy of a
        // publish whose answer was lost a duplicate, answered with the first one's sequence.
        let answered = |e: &jetstream::context::PublishError| {
            matches!(e.kind(), Kind::WrongLastSequence | Kind::WrongLastMessageId | Kind::MaxPayloadExceeded)
        };
        let (mut expect, mut passes) = (expect, 0);
        let at = loop {
            headers.insert("Nats-Expected-Last-Subject-Sequence", expect.to_string().as_str());
            let send = || async {
                let sent = js.publish_with_headers(subject.clone(), headers.clone(), payload.clone()).await?;
                sent.await
            };
            match patiently(self.inner.config.failover_wait, "an append", send, answered).await {
                Ok(ack) => break ack.sequence,
                Err(error) if error.kind() == Kind::WrongLastSequence => {
                    // This very batch may be what moved the subject on: stored by a copy whose
                    // answer was lost as the leader died, and refused when sent again to the
                    // next leader (which checks the sequence before the message id).
                    if let Fate::Stored(at) = self.fate(session, expect, &payload).await {
                        break at;
                    }
                    passes += 1;
                    match self.past_void(session, events[0].0.seq).await {
                        Some(last) if passes <= VOID_PASSES && last > expect => expect = last,
                        _ => {
                            metrics::APPENDS_REFUSED.with_label_values(&["raced"]).inc();
                            return Err(raced(session.id));
                        }
                    }
                }
                Err(error) if answered(&error) => return Err(storage("JetStream did not store the append", &error)),
                // Still unanswered once the failover wait is over: stored or not, the answer
                // says which only after the stream is read where the append would be.
                Err(error) => match self.fate(session, expect, &payload).await {
                    Fate::Stored(at) => break at,
                    Fate::NotStored => {
                        metrics::APPENDS_REFUSED.with_label_values(&["unavailable"]).inc();
                        return Err(AppendError::Unavailable(format!(
                            "JetStream did not answer the append ({error}) and has not stored it; send it again"
                        )));
                    }
                    Fate::Unknown(cause) => {
                        metrics::APPENDS_REFUSED.with_label_values(&["fate_unknown"]).inc();
                        return Err(AppendError::FateUnknown(format!(
                            "JetStream did not answer the append ({error}), and whether it stored it could not be \
                             read ({cause}): it may be stored. Send it again only with the same Idempotency-Key, or \
                             read the session's events first"
                        )));
                    }
                },
            }
        };
        let stream_seq = self.placed(session, expect, at, events[0].0.seq, &payload).await?;
        metrics::JETSTREAM_PUBLISH_SECONDS.observe(started.elapsed().as_secs_f64());
        session.state.lock().expect = Some(at);
        // Applied here at once, not when this node's consumer brings it back (it may be
        // recovering from a lost server): it is the first message after the one this node
        // last had, so it follows what the session holds.
        let entry = Entry {
            stream_seq,
            first_seq: events[0].0.seq,
            count: events.len() as u64,
            first_id: events[0].0.id,
            last_id: events[events.len() - 1].0.id,
            open: wire::turn(Some(&headers)),
        };
        if !session.apply(entry, Hashed::from(events.to_vec())) {
            // Never expected: JetStream took it after a message this node does not hold.
            return Err(raced(session.id));
        }
        // The events are stored and published: the append stands. Projections this node
        // could not put yet are put again, in order, before the session's next ones: from
        // the session's watermark in the bucket to its end, these events included.
        let unprojected = std::mem::take(&mut session.state.lock().unprojected);
        let projected = match unprojected {
            true => self.repair(session).await,
            false => self.project(session.id, events).await.map(drop),
        };
        if let Err(error) = projected {
            tracing::error!(%error, session_id = %session.id, "the projections of stored events were not put; repairing");
            session.state.lock().unprojected = true;
        }
        metrics::EVENTS_APPENDED.inc_by(events.len() as u64);
        Ok(())
    }

    /// Whether JetStream stored the batch `payload`, published after the subject's message
    /// `expect`, whose answer never came: a copy of it among the subject's messages after
    /// `expect` (read patiently: the stream may still be electing a leader).
    async fn fate(&self, session: &Session, expect: u64, payload: &Bytes) -> Fate {
        let (stream, subject) = (&self.inner.stream, self.subject(session.id));
        let wait = self.inner.config.failover_wait;
        let mut from = expect + 1;
        loop {
            let next = || stream.raw_message_builder().sequence(from).next_by_subject(subject.clone()).send();
            let no_message = |e: &jetstream::stream::LastRawMessageError| {
                e.kind() == jetstream::stream::LastRawMessageErrorKind::NoMessageFound
            };
            match patiently(wait, "whether an append was stored", next, no_message).await {
                Ok(message) if message.payload == *payload => return Fate::Stored(message.sequence),
                Ok(message) => from = message.sequence + 1,
                Err(error) if no_message(&error) => return Fate::NotStored,
                Err(error) => return Fate::Unknown(error.to_string()),
            }
        }
    }

    /// After JetStream refused an append numbered from `first_seq` at the subject's expected
    /// sequence: the subject's last message, if the messages after what this node held are
    /// all void, so that the append still follows the log's last event and may name that
    /// message instead (`None` if another batch is in the log there, or this node cannot
    /// tell in time, as its consumer recovers from a failover).
    async fn past_void(&self, session: &Session, first_seq: u64) -> Option<u64> {
        let (stream, subject) = (&self.inner.stream, self.subject(session.id));
        let last = patiently(
            self.inner.config.failover_wait,
            "last message",
            || stream.get_last_raw_message_by_subject(&subject),
            |_| false,
        )
        .await;
        let last = last.ok()?.sequence;
        let mut seen = session.seen.subscribe();
        tokio::time::timeout(self.inner.config.failover_wait, seen.wait_for(|seen| *seen >= last)).await.ok()?.ok()?;
        let state = session.state.lock();
        let held = state.index.last().map_or(0, |entry| entry.last_seq());
        (held + 1 == first_seq).then(|| *session.seen.borrow())
    }

    /// Where the batch `payload` (its first event numbered `first_seq`) is in the log, now
    /// that JetStream has stored a copy at `at`, published after the subject's message
    /// `expect`: the first message after `expect` at its position ([`super::follows`]) is the
    /// log's, and void messages (copies of older batches) may come before it. That is `at`,
    /// or an earlier copy of this same batch, byte for byte (a publish sent again), or
    /// another batch, which makes this one void: refused as a race, as if JetStream had
    /// refused it. Without replicas JetStream checks the expected sequence in order, and a
    /// message right after `expect` has nothing before it.
    async fn placed(
        &self,
        session: &Session,
        expect: u64,
        at: u64,
        first_seq: u64,
        payload: &Bytes,
    ) -> Result<u64, AppendError> {
        if self.inner.config.replicas <= 1 || at == expect + 1 {
            return Ok(at);
        }
        let (stream, subject) = (&self.inner.stream, self.subject(session.id));
        let mut from = expect + 1;
        loop {
            let next = || stream.raw_message_builder().sequence(from).next_by_subject(subject.clone()).send();
            let message = patiently(self.inner.config.failover_wait, "checking where an append is", next, |_| false)
                .await
                .map_err(|error| {
                    AppendError::Unavailable(format!("JetStream stored an append but did not say where: {error}"))
                })?;
            if message.sequence >= at {
                return Ok(at);
            }
            let entry = wire::entry(message.sequence, Some(&message.headers)).map_err(AppendError::Storage)?;
            if entry.first_seq == first_seq {
                if message.payload == *payload {
                    return Ok(message.sequence);
                }
                metrics::APPENDS_REFUSED.with_label_values(&["raced"]).inc();
                tracing::warn!(session_id = %session.id, stream_seq = at, taken_by = message.sequence,
                    "JetStream stored an append at a position another had taken; it is void");
                return Err(raced(session.id));
            }
            from = message.sequence + 1;
        }
    }
}

/// What became of a publish whose answer never came.
enum Fate {
    Stored(u64),
    NotStored,
    Unknown(String),
}

fn raced(session: SessionId) -> AppendError {
    AppendError::Raced(format!("another node appended to session {session} first; nothing was stored"))
}
