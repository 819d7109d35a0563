//! The group-commit writer: one thread takes every append ordered so far (numbered already,
//! in order, by [`super::SledLog`]'s `order`), applies them as one batch, folds the
//! projections from the events in hand, flushes once, advances the watermarks, broadcasts,
//! and only then acknowledges. Appends to one session ordered while a flush is under way
//! wait in the queue and go into the next flush together.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::{mpsc, oneshot};

use super::{keys, Inner};
use crate::domain::{RawEvent, SessionId};
use crate::metrics;
use crate::store::{chain, AppendError, Channel, StoreError};

/// An ordered append: its session's channel (held while it is in flight), its events as
/// numbered, and who waits for them to be durable.
pub(super) struct Job {
    pub session: SessionId,
    pub channel: Arc<Channel>,
    pub events: Vec<RawEvent>,
    pub reply: oneshot::Sender<Result<(), AppendError>>,
}

pub(super) struct Writer {
    store: Arc<Inner>,
    jobs: mpsc::UnboundedReceiver<Job>,
}

impl Writer {
    pub fn new(store: Arc<Inner>, jobs: mpsc::UnboundedReceiver<Job>) -> Writer {
        Writer { store, jobs }
    }

    pub fn run(mut self) {
        while let Some(first) = self.jobs.blocking_recv() {
            let mut count = first.events.len();
            let mut jobs = vec![first];
            while count < self.store.config.max_batch_events {
                match self.jobs.try_recv() {
                    Ok(job) => {
                        count += job.events.len();
                        jobs.push(job);
                    }
                    Err(_) => break,
                }
            }
            self.commit(jobs, count);
        }
        if let Err(error) = self.store.db.flush() {
            tracing::error!(%error, "final flush of the log failed");
        }
    }

    fn commit(&mut self, jobs: Vec<Job>, count: usize) {
        if let Some(error) = self.store.failed() {
            for job in jobs {
                let _ = job.reply.send(Err(error.clone()));
            }
            return;
        }
        if let Err(error) = self.apply_and_flush(&jobs) {
            let error = self.store.fail(error);
            for job in jobs {
                let _ = job.reply.send(Err(error.clone()));
            }
            return;
        }
        self.store.commits.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        metrics::EVENTS_APPENDED.inc_by(count as u64);
        metrics::BATCH_EVENTS.observe(count as f64);
        // One broadcast per session per commit, its appends in the order they were made.
        let mut touched: Vec<(&Arc<Channel>, Vec<RawEvent>)> = Vec::new();
        let mut slots: HashMap<SessionId, usize> = HashMap::new();
        for job in &jobs {
            let slot = *slots.entry(job.session).or_insert_with(|| {
                touched.push((&job.channel, Vec::new()));
                touched.len() - 1
            });
            touched[slot].1.extend(job.events.iter().cloned());
        }
        for (channel, events) in touched {
            channel.publish(events.into());
        }
        for job in jobs {
            let _ = job.reply.send(Ok(()));
        }
    }

    fn apply_and_flush(&self, jobs: &[Job]) -> Result<(), StoreError> {
        let mut batch = ::sled::Batch::default();
        for job in jobs {
            // The writer alone extends chains, one job at a time, in the order numbered.
            let mut head = job.channel.chain_head.lock();
            let mut hash = match *head {
                Some(hash) => hash,
                None => self.store.chain_head(job.session)?,
            };
            for event in &job.events {
                hash = chain::link(&hash, &event.json);
                batch.insert(&keys::event_key(job.session, event.id)[..], super::seal(&event.json, &hash));
            }
            *head = Some(hash);
        }
        self.store.events.apply_batch(batch)?;
        for event in jobs.iter().flat_map(|job| &job.events) {
            self.store.project(event)?;
        }
        let started = Instant::now();
        self.store.db.flush()?;
        metrics::FSYNC_SECONDS.observe(started.elapsed().as_secs_f64());
        Ok(())
    }
}
