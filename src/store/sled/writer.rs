//! The group-commit writer: one thread takes every pending append, checks and numbers each
//! at its expected position (in order, so appends to one session in a row share the
//! commit), applies them as one batch, flushes once, advances the watermarks, broadcasts,
//! and only then acknowledges. Being the only writer makes it the one place where the
//! order of a session's log is decided.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::{mpsc, oneshot};

use super::{keys, Inner};
use crate::domain::{Draft, RawEvent, SessionId};
use crate::metrics;
use crate::store::numbering::{Clock, Tail};
use crate::store::{AppendError, Appended, Channel, StoreError};

pub(super) struct Job {
    pub session: SessionId,
    pub expected: u64,
    pub drafts: Vec<Draft>,
    pub reply: oneshot::Sender<Result<Appended, AppendError>>,
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
        // Forget cached tails between commits, never within one: a tail re-read from the
        // store mid-commit would miss what this commit has staged for its session.
        if self.tails.len() >= MAX_CACHED_TAILS {
            self.tails.clear();
        }
        let clock = Clock::now();
        let mut batch = ::sled::Batch::default();
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
            match self.stage(&job, &clock, &mut batch) {
                Ok(Ok(events)) => {
                    touched[slot].1.extend(events.iter().cloned());
                    accepted.push((job, events));
                }
                Ok(Err(conflict)) => {
                    metrics::APPENDS_REFUSED.with_label_values(&["conflict"]).inc();
                    let _ = job.reply.send(Ok(Err(conflict)));
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
            let _ = job.reply.send(Ok(Ok(events)));
        }
    }

    /// Numbers one job's drafts by the shared rules and adds them to the batch.
    fn stage(&mut self, job: &Job, clock: &Clock, batch: &mut ::sled::Batch) -> Result<Appended, AppendError> {
        let storage = |e: StoreError| AppendError::Storage(e.to_string());
        let mut tail = self.tail(job.session).map_err(storage)?;
        if let Some(turn) = tail.unknown_turn(&job.drafts) {
            let last = Tail::last_in_turn(self.store.newest_first(job.session), turn).map_err(StoreError::from);
            tail.continue_turn(turn, last.map_err(storage)?);
        }
        let limit = self.store.config.max_events_per_session;
        let staged = tail.stage(job.session, job.expected, &job.drafts, clock, limit)?;
        if let Ok(events) = &staged {
            for event in events {
                batch.insert(&keys::event_key(job.session, event.id)[..], event.json.as_ref());
            }
            self.tails.insert(job.session, tail);
        }
        Ok(staged)
    }

    fn apply_and_flush(&self, batch: ::sled::Batch, accepted: &[(Job, Vec<RawEvent>)]) -> Result<(), StoreError> {
        self.store.events.apply_batch(batch)?;
        for (_, events) in accepted {
            for event in events {
                self.store.project(event)?;
            }
        }
        let started = Instant::now();
        self.store.db.flush()?;
        metrics::FSYNC_SECONDS.observe(started.elapsed().as_secs_f64());
        Ok(())
    }

    fn tail(&mut self, session: SessionId) -> Result<Tail, StoreError> {
        if let Some(tail) = self.tails.get(&session) {
            return Ok(*tail);
        }
        Ok(Tail::recover(self.store.newest_first(session))?)
    }
}
