//! The group-commit writer: one thread takes every append ordered so far (numbered already,
//! in order, by [`super::SledLog`]'s `order`), makes them durable as one record of the
//! write-ahead log (one `fdatasync`), inserts them into sled, folds the
//! projections from the events in hand, advances the watermarks, broadcasts, and only then
//! acknowledges. Appends to one session ordered while a commit is under way wait in the
//! queue and go into the next one together. When a segment of the write-ahead log is full,
//! the writer starts the next, and the checkpointer flushes sled and removes the old one.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::{mpsc, oneshot};

use super::wal::{self, Wal};
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
    /// The channel's epoch when the events were numbered.
    pub epoch: u64,
}

/// Why a commit was not made.
enum Unwritten {
    /// The write-ahead log refused it and is as it was (a full disk): the commit's appends
    /// are refused, and later ones may succeed.
    Refused(std::io::Error),
    /// Anything else: the log is in an unknown state and takes no more appends.
    Failed(StoreError),
}

impl From<StoreError> for Unwritten {
    fn from(error: StoreError) -> Unwritten {
        Unwritten::Failed(error)
    }
}

impl From<::sled::Error> for Unwritten {
    fn from(error: ::sled::Error) -> Unwritten {
        Unwritten::Failed(error.into())
    }
}

pub(super) struct Writer {
    store: Arc<Inner>,
    jobs: mpsc::UnboundedReceiver<Job>,
    /// `None` for a temporary log, which nothing outlives.
    wal: Option<Wal>,
    /// Ended segments, for the checkpointer.
    checkpoints: std::sync::mpsc::Sender<u64>,
    /// The commit being made: each event's key and stored value.
    staged: Vec<(keys::EventKey, Vec<u8>)>,
    /// Appends are being refused for lack of room (said once, not per commit).
    refusing: bool,
}

impl Writer {
    pub fn new(
        store: Arc<Inner>,
        jobs: mpsc::UnboundedReceiver<Job>,
        wal: Option<Wal>,
        checkpoints: std::sync::mpsc::Sender<u64>,
    ) -> Writer {
        Writer { store, jobs, wal, checkpoints, staged: Vec::new(), refusing: false }
    }

    /// Commits until every sender of jobs is gone; answers the write-ahead log, whose
    /// segments hold what sled may not have made durable yet.
    pub fn run(mut self) -> Option<Wal> {
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
        self.wal
    }

    fn commit(&mut self, jobs: Vec<Job>, count: usize) {
        if let Some(error) = self.store.failed() {
            for job in jobs {
                let _ = job.reply.send(Err(error.clone()));
            }
            return;
        }
        // Appends numbered after others of their session that were not stored would leave a
        // gap: they are refused too, and the appender orders them again.
        let (jobs, stale): (Vec<Job>, Vec<Job>) =
            jobs.into_iter().partition(|job| job.epoch == job.channel.epoch.load(Ordering::SeqCst));
        for job in stale {
            metrics::APPENDS_REFUSED.with_label_values(&["unavailable"]).inc();
            let why = "an earlier append to this session could not be stored; send it again";
            let _ = job.reply.send(Err(AppendError::Unavailable(why.into())));
        }
        let count = if jobs.len() == count { count } else { jobs.iter().map(|job| job.events.len()).sum() };
        if let Some(short) = self.short_of_space() {
            return self.refuse(jobs, short);
        }
        match self.write(&jobs) {
            Ok(()) => {}
            Err(Unwritten::Refused(error)) => return self.refuse(jobs, error),
            Err(Unwritten::Failed(error)) => {
                let error = self.store.fail(error);
                for job in jobs {
                    let _ = job.reply.send(Err(error.clone()));
                }
                return;
            }
        }
        if std::mem::take(&mut self.refusing) {
            tracing::warn!("the log stores appends again");
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
        // Readable first, then answered, then broadcast: an appender whose session has a
        // thousand subscribers on the same worker is answered before their writes, not after.
        for (channel, events) in &touched {
            channel.advance(events);
        }
        let channels: Vec<(Arc<Channel>, Vec<RawEvent>)> =
            touched.into_iter().map(|(channel, events)| (channel.clone(), events)).collect();
        for job in jobs {
            let _ = job.reply.send(Ok(()));
        }
        for (channel, events) in channels {
            channel.broadcast(events.into());
        }
        // After the answers, so that starting a segment adds nothing to their wait.
        if let Err(error) = self.checkpoint_if_full() {
            self.store.fail(error);
        }
    }

    /// Durable in the write-ahead log first, then in sled's tree (visible to nobody past
    /// the watermark until published). A commit whose write-ahead record fails leaves sled
    /// untouched; one that fails after it is durable (sled refusing an insert) is answered
    /// as failed, and the log takes no more appends: its events come back at the next open.
    /// A crash may leave part of a commit in sled: the write-ahead log holds all of it until
    /// a checkpoint, and the next open writes it again.
    fn write(&mut self, jobs: &[Job]) -> Result<(), Unwritten> {
        self.staged.clear();
        for job in jobs {
            // The writer alone extends chains, one job at a time, in the order numbered.
            let mut head = job.channel.chain_head.lock();
            let mut hash = match *head {
                Some(hash) => hash,
                None => self.store.chain_head(job.session)?,
            };
            for event in &job.events {
                hash = chain::link(&hash, &event.json);
                self.staged.push((keys::event_key(job.session, event.id), super::seal(&event.json, &hash)));
            }
            *head = Some(hash);
        }
        // A temporary log has none: nothing outlives it, so there is nothing to make durable.
        if let Some(wal) = self.wal.as_mut().filter(|_| !self.staged.is_empty()) {
            let started = Instant::now();
            match wal.append(self.staged.iter().map(|(key, value)| (key, value.as_slice()))) {
                Ok(()) => {}
                Err(wal::Failed::Refused(error)) => return Err(Unwritten::Refused(error)),
                Err(broken @ wal::Failed::Broken(_)) => return Err(StoreError::new(broken).into()),
            }
            metrics::FSYNC_SECONDS.observe(started.elapsed().as_secs_f64());
        }
        // One insert each, not sled's `apply_batch`: a batch is atomic in the write-ahead
        // log already, and sled's batches each write out its IO buffer (twice) through its
        // threadpool, which wakes all of its threads.
        for (key, value) in self.staged.drain(..) {
            self.store.events.insert(&key[..], value)?;
        }
        for event in jobs.iter().flat_map(|job| &job.events) {
            self.store.project(event)?;
        }
        Ok(())
    }

    /// Why appends are refused now for lack of room: the file system has less free space
    /// than `min_free_bytes`, kept for sled to write out what it holds (its own log, a
    /// checkpoint), which a full disk would break for good.
    fn short_of_space(&self) -> Option<std::io::Error> {
        let (wal, min) = (self.wal.as_ref()?, self.store.config.min_free_bytes);
        let free = wal.free_bytes().ok()?;
        (free < min).then(|| {
            std::io::Error::new(
                std::io::ErrorKind::StorageFull,
                format!("the disk has {} MiB free, less than store.min_free_mb ({} MiB)", free >> 20, min >> 20),
            )
        })
    }

    /// A commit the write-ahead log refused (and is as it was): nothing of it was stored, so
    /// its sessions' tails and chain heads, which counted it, are dropped (loaded again from
    /// the store by the next append), and their epochs raised, so that appends numbered on
    /// the old tails are refused as they come. The log goes on: a later commit may succeed
    /// (once a full disk has room again).
    fn refuse(&mut self, jobs: Vec<Job>, error: std::io::Error) {
        if !std::mem::replace(&mut self.refusing, true) {
            tracing::error!(%error, "the log cannot store appends; refusing them until it can");
        }
        for job in &jobs {
            job.channel.drop_tail(&mut job.channel.tail.lock());
        }
        let why = format!("the log could not store this append ({error}); nothing was stored: send it again later");
        for job in jobs {
            metrics::APPENDS_REFUSED.with_label_values(&["unavailable"]).inc();
            let _ = job.reply.send(Err(AppendError::Unavailable(why.clone())));
        }
    }

    /// Starts the next segment of a full write-ahead log and has the checkpointer make
    /// what the ended one holds durable in sled.
    fn checkpoint_if_full(&mut self) -> Result<(), StoreError> {
        let Some(wal) = self.wal.as_mut().filter(|wal| wal.full()) else { return Ok(()) };
        let ended = wal.rotate()?;
        // A checkpointer that has stopped leaves the segment for the next open to replay.
        let _ = self.checkpoints.send(ended);
        Ok(())
    }
}

/// Flushes sled for each ended segment of the write-ahead log, then removes the segments up
/// to it: everything they hold was applied to sled before the flush began.
pub(super) fn checkpointer(store: Arc<Inner>, dir: std::path::PathBuf, ended: std::sync::mpsc::Receiver<u64>) {
    while let Ok(mut segment) = ended.recv() {
        // Segments that ended meanwhile are covered by the same flush.
        while let Ok(later) = ended.try_recv() {
            segment = later;
        }
        let done = store.db.flush().map_err(StoreError::from).and_then(|_| {
            metrics::CHECKPOINTS.inc();
            wal::remove_through(&dir, segment).map_err(StoreError::from)
        });
        if let Err(error) = done {
            store.fail(error);
            return;
        }
    }
}
