//! `baseline`: what sled 0.34.7 itself does on this machine, in-process, with the log's key
//! layout (16-byte session ULID ++ 16-byte event ULID) and JSON values of the size the
//! server stores: batch-append throughput (one `apply_batch` and one `flush` per batch, as
//! the group-commit writer does) and scan throughput (each session's prefix, as replay
//! does). `append` and `replay` are reported as ratios of these.

use std::path::Path;
use std::time::{Duration, Instant};

use clap::Args;
use serde::Serialize;
use ulid::Ulid;

use super::{message, Ctx, Size};
use crate::report::Report;

#[derive(Args, Debug, Clone, Serialize)]
pub struct Params {
    /// Sessions the events are spread over, round robin.
    #[arg(long, default_value_t = 16)]
    pub sessions: usize,
    /// Events per apply_batch + flush (`all` uses append's writers x events per request).
    #[arg(long, default_value_t = 16)]
    pub batch: usize,
    /// Approximate size of each stored event's JSON, in bytes.
    #[arg(long, default_value_t = 300)]
    pub event_bytes: usize,
    /// Seconds of appending.
    #[arg(long, default_value_t = 10.0)]
    pub duration: f64,
    /// Stop appending after this many events even if time is left.
    #[arg(long, default_value_t = 5_000_000)]
    pub count: u64,
    /// Hard stop for the whole scenario, in seconds (default: duration + 60).
    #[arg(long)]
    pub deadline: Option<f64>,
}

impl Params {
    pub fn sized(size: Size) -> Params {
        let mut p: Params = super::defaults();
        match size {
            Size::Full => {}
            Size::Quick => p.duration = 3.0,
            Size::Tiny => {
                p.duration = 0.3;
                p.count = 2_000;
                p.sessions = 2;
                p.batch = 4;
            }
        }
        p
    }
}

/// The raw figures other scenarios compare with.
#[derive(Debug, Clone, Copy)]
pub struct Raw {
    pub append_per_sec: f64,
    pub scan_per_sec: f64,
    pub batch: usize,
}

struct Measured {
    raw: Raw,
    written: u64,
    scanned: u64,
    value_bytes: u64,
    flush: Duration,
    deadline_hit: bool,
}

pub async fn run(ctx: &Ctx, p: &Params) -> anyhow::Result<(Report, Raw)> {
    let mut report = Report::new("baseline", p);
    let dir = tempfile::Builder::new().prefix("turnlog-load-sled-").tempdir_in(ctx.launcher.data_root())?;
    let deadline = Instant::now() + Duration::from_secs_f64(p.deadline.unwrap_or(p.duration + 60.0));
    let params = p.clone();
    let path = dir.path().to_path_buf();
    let m = tokio::task::spawn_blocking(move || measure(&path, &params, deadline)).await??;
    report.deadline_hit = m.deadline_hit;
    report.figure(&format!("raw sled append (batch {}, flush each)", p.batch), m.raw.append_per_sec, "events/s");
    report.figure("raw sled scan", m.raw.scan_per_sec, "events/s");
    report.note(format!(
        "{} events of {} bytes over {} sessions; flush took {:.0}% of the append time ({:.3} ms per batch)",
        m.written,
        m.value_bytes / m.written.max(1),
        p.sessions,
        m.flush.as_secs_f64() / (m.written as f64 / m.raw.append_per_sec).max(1e-9) * 100.0,
        m.flush.as_secs_f64() * 1000.0 / (m.written as f64 / p.batch as f64).max(1.0)
    ));
    if m.scanned != m.written {
        report.violations.push(format!("raw sled: wrote {} events but scanned {}", m.written, m.scanned));
    }
    Ok((report, m.raw))
}

fn measure(dir: &Path, p: &Params, deadline: Instant) -> anyhow::Result<Measured> {
    let db = sled::Config::new()
        .path(dir)
        .cache_capacity(256 << 20)
        .flush_every_ms(None)
        .mode(sled::Mode::HighThroughput)
        .open()?;
    let tree = db.open_tree("events")?;
    let sessions: Vec<u128> = (0..p.sessions.max(1)).map(|_| Ulid::new().0).collect();
    let mut m = append(&db, &tree, &sessions, p, deadline)?;
    let scanning = Instant::now();
    let mut scanned_bytes = 0usize;
    for session in &sessions {
        for item in tree.scan_prefix(session.to_be_bytes()) {
            let (_, value) = item?;
            m.scanned += 1;
            scanned_bytes += value.len();
        }
    }
    m.raw.scan_per_sec = m.scanned as f64 / scanning.elapsed().as_secs_f64().max(1e-9);
    std::hint::black_box(scanned_bytes);
    Ok(m)
}

/// Batches of `p.batch` events round robin over `sessions`, each applied and flushed, as
/// the writer does, until the duration, the count or the deadline.
fn append(
    db: &sled::Db,
    tree: &sled::Tree,
    sessions: &[u128],
    p: &Params,
    deadline: Instant,
) -> sled::Result<Measured> {
    let mut last: Vec<u128> = sessions.iter().map(|_| Ulid::new().0).collect();
    let mut seq = vec![0u64; sessions.len()];
    let text = message("raw", p.event_bytes);
    let (mut written, mut value_bytes, mut flush) = (0u64, 0u64, Duration::ZERO);
    let started = Instant::now();
    let stop = started + Duration::from_secs_f64(p.duration);
    while Instant::now() < stop && written < p.count && Instant::now() < deadline {
        let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
        let mut batch = sled::Batch::default();
        for _ in 0..p.batch.max(1) {
            let s = (written % sessions.len() as u64) as usize;
            last[s] += 1;
            seq[s] += 1;
            let mut key = [0u8; 32];
            key[..16].copy_from_slice(&sessions[s].to_be_bytes());
            key[16..].copy_from_slice(&last[s].to_be_bytes());
            let value = format!(
                "{{\"id\":\"evt_{}\",\"type\":\"user.define_outcome\",\"session_id\":\"sess_{}\",\"sequence_number\":{},\"created_at\":\"{now}\",\"processed_at\":\"{now}\",\"schema_version\":1,\"outcome\":\"{text}\"}}",
                Ulid(last[s]),
                Ulid(sessions[s]),
                seq[s],
            );
            value_bytes += value.len() as u64;
            batch.insert(&key[..], value.as_bytes());
            written += 1;
        }
        tree.apply_batch(batch)?;
        let flushing = Instant::now();
        db.flush()?;
        flush += flushing.elapsed();
    }
    let append_per_sec = written as f64 / started.elapsed().as_secs_f64().max(1e-9);
    Ok(Measured {
        raw: Raw { append_per_sec, scan_per_sec: 0.0, batch: p.batch },
        written,
        scanned: 0,
        value_bytes,
        flush,
        deadline_hit: Instant::now() >= deadline,
    })
}
