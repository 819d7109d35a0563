//! Opening the log: the directory's lock, the write-ahead log replayed into sled after a
//! crash, chains completed, projections rebuilt when the last run did not close cleanly (or
//! kept another set of them), and the writer and checkpointer started.

use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::mpsc;

use super::{keys, raw_event, wal, writer, Inner, SledConfig, SledLog, Threads};
use crate::domain::SessionId;
use crate::store::hub::Hub;
use crate::store::recent::Budget;
use crate::store::{signature, Projection, StoreError};

/// How long opening waits for the directory's lock when another handle holds it.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Opens the database, waiting up to [`LOCK_WAIT`] for its lock. A log this process has
/// just closed lets its lock go only once sled's IO threads drop their last handle to the
/// file, a moment after `close` returns; a lock another process holds stays held, and
/// opening fails with sled's error naming the directory.
fn open_locked(config: &::sled::Config) -> Result<::sled::Db, ::sled::Error> {
    let deadline = std::time::Instant::now() + LOCK_WAIT;
    loop {
        match config.open() {
            Err(::sled::Error::Io(e)) if e.to_string().contains("could not acquire lock") => {
                if std::time::Instant::now() >= deadline {
                    return Err(::sled::Error::Io(e));
                }
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            opened => return opened,
        }
    }
}

pub(super) const META_STATE: &[u8] = b"state";
const META_PROJECTIONS: &[u8] = b"projections";
/// Set once every event has its chain hash (logs written before the chain get theirs at
/// the first open that knows it).
const META_CHAIN: &[u8] = b"chain";

impl SledLog {
    /// Opens the log, rebuilds the projections if the last run did not close cleanly (or
    /// kept another set of them), and starts the writer.
    pub fn open(config: SledConfig, projections: Vec<Arc<dyn Projection>>) -> Result<SledLog, StoreError> {
        SledLog::open_as(config, projections, true)
    }

    /// Opens the log to read it as it is, for audit tools: nothing is recovered, rebuilt or
    /// completed, no writer runs (appends answer `ShuttingDown`), and closing marks nothing.
    /// What the write-ahead log holds is read into sled, which writes it to its own files
    /// when it closes (the same events, byte for byte); sled may also tidy its files as it
    /// opens them.
    pub fn open_to_read(config: SledConfig, projections: Vec<Arc<dyn Projection>>) -> Result<SledLog, StoreError> {
        SledLog::open_as(config, projections, false)
    }

    fn open_as(config: SledConfig, projections: Vec<Arc<dyn Projection>>, write: bool) -> Result<SledLog, StoreError> {
        let sled_config = ::sled::Config::new()
            .cache_capacity(config.cache_capacity_bytes)
            .flush_every_ms(None)
            .mode(::sled::Mode::HighThroughput);
        let db = match &config.path {
            Some(path) => open_locked(&sled_config.path(path))?,
            None => sled_config.temporary(true).open()?,
        };
        let events = db.open_tree("events")?;
        let meta = db.open_tree("meta")?;
        let trees = projections
            .iter()
            .map(|p| db.open_tree(format!("projection:{}", p.name())))
            .collect::<Result<Vec<_>, _>>()?;
        let hub = Hub::keeping(config.bus_capacity, Budget::new(config.recent_bytes, config.recent_total_bytes));
        let commits = Default::default();
        let inner = Arc::new(Inner {
            db,
            events,
            meta,
            projections,
            trees,
            hub,
            config,
            failed: Mutex::new(None),
            commits,
            writable: write,
        });
        let wal_dir = inner.config.path.as_deref().map(wal::dir);
        if !write {
            // What the write-ahead log holds is part of the log.
            if let Some(dir) = &wal_dir {
                for commit in wal::read_all(dir)? {
                    SledLog::replay(&inner, commit)?;
                }
            }
            return Ok(SledLog { inner, jobs: Arc::new(Mutex::new(None)), writer: Arc::new(Mutex::new(None)) });
        }
        let mut replayed = 0;
        let (wal, ended) = match &wal_dir {
            Some(dir) => {
                let (wal, ended) = wal::Wal::open(dir, inner.config.wal_segment_bytes, |commit| {
                    replayed += commit.len();
                    SledLog::replay(&inner, commit).map_err(std::io::Error::other)
                })?;
                (Some(wal), ended)
            }
            None => (None, None),
        };
        if replayed > 0 {
            tracing::info!(events = replayed, "applied the write-ahead log's commits to the store");
        }
        SledLog::recover(&inner, replayed > 0)?;
        // `recover` flushed sled: what the old segments held is durable there now.
        if let (Some(dir), Some(ended)) = (&wal_dir, ended) {
            wal::remove_through(dir, ended)?;
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let (checkpoints, ended) = std::sync::mpsc::channel();
        let worker = writer::Writer::new(inner.clone(), rx, wal, checkpoints);
        let writer = std::thread::Builder::new()
            .name("turnlog-writer".into())
            .spawn(move || worker.run())
            .expect("spawning the writer thread");
        let checkpointer = {
            let (inner, dir) = (inner.clone(), wal_dir.unwrap_or_default());
            std::thread::Builder::new()
                .name("turnlog-checkpoint".into())
                .spawn(move || writer::checkpointer(inner, dir, ended))
                .expect("spawning the checkpoint thread")
        };
        let threads = Threads { writer, checkpointer };
        Ok(SledLog { inner, jobs: Arc::new(Mutex::new(Some(tx))), writer: Arc::new(Mutex::new(Some(threads))) })
    }

    /// Writes a commit of the write-ahead log into the `events` tree again (a commit sled
    /// already holds is written over with the same bytes). The segments stay until sled
    /// is flushed, so a crash in between replays them again.
    fn replay(inner: &Inner, commit: wal::Commit) -> Result<(), StoreError> {
        for (key, value) in commit {
            inner.events.insert(&key[..], value)?;
        }
        Ok(())
    }

    fn recover(inner: &Inner, replayed: bool) -> Result<(), StoreError> {
        let names = signature(&inner.projections);
        let clean = !replayed && inner.meta.get(META_STATE)?.as_deref() == Some(b"clean");
        let same = inner.meta.get(META_PROJECTIONS)?.as_deref() == Some(names.as_bytes());
        if !(clean && same) {
            let started = std::time::Instant::now();
            let count = SledLog::rebuild_projections(inner)?;
            tracing::info!(events = count, elapsed_ms = started.elapsed().as_millis() as u64, "rebuilt projections");
        }
        // A log from before the chain, or one an older binary wrote to, has events without
        // hashes at the end of some sessions.
        if !(clean && inner.meta.get(META_CHAIN)?.is_some()) {
            let added = SledLog::complete_chains(inner)?;
            if added > 0 {
                tracing::info!(events = added, "recorded the chain hashes the log lacked");
            }
            inner.meta.insert(META_CHAIN, b"1".as_slice())?;
        }
        inner.meta.insert(META_PROJECTIONS, names.as_bytes())?;
        inner.meta.insert(META_STATE, b"open".as_slice())?;
        inner.db.flush()?;
        Ok(())
    }

    /// Gives the events at the end of each session's log that have no chain hash theirs,
    /// from their predecessor's: a whole log written before the chain existed, or what a
    /// binary without the chain appended. A missing hash with hashed events after it was
    /// removed by hand: it is left for `verify` to report.
    fn complete_chains(inner: &Inner) -> Result<u64, StoreError> {
        let mut added = 0;
        let mut after: Option<SessionId> = None;
        loop {
            let from = match after {
                Some(session) => match u128::from(session.ulid()).checked_add(1) {
                    Some(next) => next.to_be_bytes().to_vec(),
                    None => break,
                },
                None => Vec::new(),
            };
            let Some(item) = inner.events.range(from..).next() else { break };
            let (key, _) = item?;
            let session = keys::session_from_key(&key).ok_or_else(|| StoreError::new("an event key is malformed"))?;
            added += inner.complete_chain(session)?;
            after = Some(session);
        }
        Ok(added)
    }

    fn rebuild_projections(inner: &Inner) -> Result<u64, StoreError> {
        for tree in &inner.trees {
            tree.clear()?;
        }
        let mut count = 0;
        for item in inner.events.iter() {
            let (key, value) = item?;
            inner.project(&raw_event(&key, value))?;
            count += 1;
        }
        Ok(count)
    }
}
