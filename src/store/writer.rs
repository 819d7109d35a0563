//! The group-commit writer: one thread takes every pending append, assigns ids and
//! sequence numbers, applies them as one batch, flushes once, advances the watermarks,
//! broadcasts, and only then acknowledges. Being the only writer makes it the one place
//! where a session's order is decided.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use serde::Deserialize;
use tokio::sync::{mpsc, oneshot};

use super::hub::{Channel, Position};
use super::{keys, AppendError, Inner};
use crate::domain::event::{timestamp_now, Envelope};
use crate::domain::ids::{next_ulid, now_ms};
use crate::domain::{Draft, EventId, RawEvent, SessionId, TurnId};
use crate::metrics;

pub(super) struct Job {
    pub session: SessionId,
    pub drafts: Vec<Draft>,
    pub reply: oneshot::Sender<Result<Vec<RawEvent>, AppendError>>,
}

/// What the writer must know of a session's log to append to it.
#[derive(Debug, Clone, Copy, Default)]
struct Tail {
    position: Position,
    turn: Option<(TurnId, u32)>,
    closed: bool,
}

/// The head of a stored event, enough to rebuild a [`Tail`] after a restart.
#[derive(Deserialize)]
struct Head {
    #[serde(rename = "type")]
    kind: String,
    sequence_number: u64,
    turn_id: Option<TurnId>,
    turn_sequence_number: Option<u32>,
}

pub(super) struct Writer {
    store: Arc<Inner>,
    jobs: mpsc::UnboundedReceiver<Job>,
    tails: HashMap<SessionId, Tail>,
}

/// The writer forgets tails past this many sessions; a forgotten tail is re-read from the
/// store, which is exact because only the writer writes.
const MAX_CACHED_TAILS: usize = 100_000;

impl Writer {
    pub fn new(store: Arc<Inner>, jobs: mpsc::UnboundedReceiver<Job>) -> Writer {
        Writer { store, jobs, tails: HashMap::new() }
    }

    pub fn run(mut self) {
        while let Some(first) = self.jobs.blocking_recv() {
            let mut count = first.drafts.len();
            let mut jobs = vec![first];
            while count < self.store.config.max_batch_events {
                match self.jobs.try_recv() {
                    Ok(job) => {
                        count += job.drafts.len();
                        jobs.push(job);
                    }
                    Err(_) => break,
                }
            }
            self.commit(jobs);
        }
        if let Err(error) = self.store.db.flush() {
            tracing::error!(%error, "final flush of the log failed");
        }
    }

    fn commit(&mut self, jobs: Vec<Job>) {
        if let Some(error) = self.store.failed() {
            for job in jobs {
                let _ = job.reply.send(Err(error.clone()));
            }
            return;
        }
        let now = timestamp_now();
        let now_ms = now_ms();
        let mut batch = sled::Batch::default();
        let mut accepted: Vec<(Job, Vec<RawEvent>)> = Vec::with_capacity(jobs.len());
        let mut touched: Vec<(Arc<Channel>, Vec<RawEvent>)> = Vec::new();
        let mut touched_index: HashMap<SessionId, usize> = HashMap::new();
        for job in jobs {
            let slot = match touched_index.get(&job.session) {
                Some(&slot) => slot,
                None => match self.store.channel(job.session) {
                    Ok(channel) => {
                        touched.push((channel, Vec::new()));
                        touched_index.insert(job.session, touched.len() - 1);
                        touched.len() - 1
                    }
                    Err(error) => {
                        let _ = job.reply.send(Err(AppendError::Storage(error.to_string())));
                        continue;
                    }
                },
            };
            match self.stage(&job, &now, now_ms, &mut batch) {
                Ok(events) => {
                    touched[slot].1.extend(events.iter().cloned());
                    accepted.push((job, events));
                }
                Err(error) => {
                    metrics::APPENDS_REFUSED.with_label_values(&[error.reason()]).inc();
                    let _ = job.reply.send(Err(error));
                }
            }
        }
        if accepted.is_empty() {
            return;
        }
        if let Err(error) = self.apply_and_flush(batch, &accepted) {
            let error = self.store.fail(error);
            self.tails.clear();
            for (job, _) in accepted {
                let _ = job.reply.send(Err(error.clone()));
            }
            return;
        }
        let count: usize = accepted.iter().map(|(_, events)| events.len()).sum();
        metrics::EVENTS_APPENDED.inc_by(count as u64);
        metrics::BATCH_EVENTS.observe(count as f64);
        for (channel, events) in touched {
            channel.publish(events.into());
        }
        for (job, events) in accepted {
            let _ = job.reply.send(Ok(events));
        }
    }

    /// Assigns ids and sequence numbers to one job's drafts and adds them to the batch.
    fn stage(
        &mut self,
        job: &Job,
        now: &str,
        now_ms: u64,
        batch: &mut sled::Batch,
    ) -> Result<Vec<RawEvent>, AppendError> {
        let mut tail = self.tail(job.session)?;
        // Nothing follows `terminated`: check the whole job before staging any of it.
        let terminated_early = job.drafts.iter().rev().skip(1).any(|d| d.kind() == "terminated");
        if tail.closed || terminated_early {
            return Err(AppendError::Closed);
        }
        let limit = self.store.config.max_events_per_session;
        if tail.position.seq + job.drafts.len() as u64 > limit {
            return Err(AppendError::TooManyEvents { limit });
        }
        let mut events = Vec::with_capacity(job.drafts.len());
        for draft in &job.drafts {
            let id = EventId(next_ulid(tail.position.last.map(EventId::ulid), now_ms));
            let seq = tail.position.seq + 1;
            let turn = draft.turn.map(|turn| match tail.turn {
                Some((current, n)) if current == turn => (turn, n + 1),
                _ => (turn, 1),
            });
            let json = Envelope { id, session: job.session, turn, seq, now }.write(draft);
            batch.insert(&keys::event_key(job.session, id)[..], json.as_ref());
            tail.position = Position { last: Some(id), seq };
            tail.turn = turn.or(tail.turn);
            tail.closed = draft.kind() == "terminated";
            events.push(RawEvent { id, seq, json });
        }
        if self.tails.len() >= MAX_CACHED_TAILS {
            self.tails.clear();
        }
        self.tails.insert(job.session, tail);
        Ok(events)
    }

    fn apply_and_flush(&self, batch: sled::Batch, accepted: &[(Job, Vec<RawEvent>)]) -> Result<(), sled::Error> {
        self.store.events.apply_batch(batch)?;
        for (job, events) in accepted {
            for event in events {
                self.store.project(job.session, event)?;
            }
        }
        let started = Instant::now();
        self.store.db.flush()?;
        metrics::FSYNC_SECONDS.observe(started.elapsed().as_secs_f64());
        Ok(())
    }

    fn tail(&mut self, session: SessionId) -> Result<Tail, AppendError> {
        if let Some(tail) = self.tails.get(&session) {
            return Ok(*tail);
        }
        self.load_tail(session).map_err(|e| AppendError::Storage(e.to_string()))
    }

    /// Rebuilds a session's tail from the store: its last event, and the last event that
    /// belonged to a turn (so turn sequence numbers go on after a restart).
    fn load_tail(&self, session: SessionId) -> Result<Tail, sled::Error> {
        let mut tail = Tail::default();
        let prefix = keys::session_key(session);
        for (i, item) in self.store.events.scan_prefix(prefix).rev().enumerate() {
            let (key, value) = item?;
            let Ok(head) = serde_json::from_slice::<Head>(&value) else {
                continue;
            };
            if i == 0 {
                tail.position = Position { last: keys::event_from_key(&key), seq: head.sequence_number };
                tail.closed = head.kind == "terminated";
            }
            if let (Some(turn), Some(n)) = (head.turn_id, head.turn_sequence_number) {
                tail.turn = Some((turn, n));
                break;
            }
            if i >= 256 {
                break;
            }
        }
        Ok(tail)
    }
}
