//! `replay`: one client replaying one large session from the start over SSE; events/s
//! from sending the request to having the last event. Parsed and checked once, then read
//! as bytes five times with only its event frames counted: what the server alone sustains
//! (parsing the frames costs this client about as much as sending them costs the server,
//! and both share the machine's cores).
//!
//! Correctness: the parsed replay must be exactly the whole log, once each, in order; each
//! counted one must hold as many event frames as the log has events, the last one whole.

use std::time::{Duration, Instant};

use anyhow::anyhow;
use clap::Args;
use futures_util::StreamExt;
use serde::Serialize;
use tokio::sync::watch;

use super::catchup::fill;
use super::live::{check_followers, follow, Follower, Received};
use super::{check_alive, fetch_logs, Ctx, Deadline, Observe, Size};
use crate::check::Violations;
use crate::client::{Api, Cursor};
use crate::report::Report;

#[derive(Args, Debug, Clone, Serialize)]
pub struct Params {
    /// Events in the session's log.
    #[arg(long, default_value_t = 200_000)]
    pub events: usize,
    /// Approximate size of each stored event's JSON, in bytes.
    #[arg(long, default_value_t = 400)]
    pub event_bytes: usize,
    /// Hard stop for the whole scenario, in seconds.
    #[arg(long, default_value_t = 300.0)]
    pub deadline: f64,
}

impl Params {
    pub fn sized(size: Size) -> Params {
        let mut p: Params = super::defaults();
        match size {
            Size::Full => {}
            Size::Quick => p.events = 50_000,
            Size::Tiny => {
                p.events = 2_000;
                p.deadline = 60.0;
            }
        }
        p
    }
}

pub async fn run(ctx: &Ctx, p: &Params, raw_scan: Option<f64>) -> anyhow::Result<Report> {
    let mut report = Report::new("replay", p);
    let mut server = ctx.launcher.start().await?;
    let api = Api::new(&server.url);
    let deadline = Deadline::after(p.deadline);
    let sessions = vec![api.create_session().await?];
    let last = fill(&api, &sessions, p.events, p.event_bytes, ctx.quiet).await?[0];

    let observe = Observe::start(&server, &api).await;
    let (_keep, target) = watch::channel(Some(last));
    let sent = Instant::now();
    let received = follow(&api, &sessions[0], Cursor::Start, target, deadline, || {}).await;
    observe.finish(&server, &api, &mut report).await;

    report.deadline_hit = received.deadline_hit;
    figures(&mut report, p, &received, sent, raw_scan);
    let logs = fetch_logs(&api, &sessions, 1).await;
    if let (Ok(log), false) = (&logs[0], received.deadline_hit || received.error.is_some()) {
        // Ten times the parsed replay's time, and a few seconds: a replay that loses its
        // count fails here, not at the scenario's deadline.
        let parsed = received.frames.last().map_or(Duration::ZERO, |last| last.at - sent);
        let each = (parsed * 10 + Duration::from_secs(5)).as_secs_f64();
        let observe = Observe::start(&server, &api).await;
        let mut counted = Vec::with_capacity(COUNTED_REPLAYS);
        for _ in 0..COUNTED_REPLAYS {
            let deadline = Deadline(deadline.0.min(Deadline::after(each).0));
            match count_frames(&api, &sessions[0], log.ids.len(), deadline).await {
                Ok(replay) => counted.push(replay),
                Err(error) => {
                    report.violations.push(format!("the counted replay: {error:#}"));
                    break;
                }
            }
        }
        counted_figures(&mut report, log.ids.len(), &mut counted, raw_scan);
        observe.finish_as(&format!("{} counted replays: ", counted.len()), &server, &api, &mut report).await;
    }
    let follower = Follower { client: 0, session: 0, first: Cursor::Start, received };
    let mut violations = Violations::default();
    check_followers(&logs, &[follower], &mut violations);
    report.violations.extend(violations.into_vec());
    check_alive(&mut server, &mut report);
    server.stop().await;
    Ok(report)
}

/// Counted replays, one after another; the median is reported. One lasts about 0.15 s here,
/// so a single one moves with whatever else the machine does in that moment.
const COUNTED_REPLAYS: usize = 5;

/// A replay read as bytes: its bytes, and how long from the request to the end of the
/// last frame.
struct Counted {
    bytes: usize,
    secs: f64,
}

/// Reads the session's stream from the start as bytes until it holds `events` event
/// frames, the last one whole. The stream then idles (it follows the log live), so more
/// event frames than that is a violation.
async fn count_frames(api: &Api, session: &str, events: usize, deadline: Deadline) -> anyhow::Result<Counted> {
    let sent = Instant::now();
    let response = deadline.run(api.stream_bytes(session)).await.ok_or_else(|| anyhow!("deadline"))??;
    let mut body = response.bytes_stream();
    let mut frames = EventFrames::default();
    let mut bytes = 0;
    while frames.seen < events || !frames.whole() {
        let chunk = match deadline.run(body.next()).await {
            None => return Err(anyhow!("deadline, {} of {events} event frames read", frames.seen)),
            Some(None) => return Err(anyhow!("the server ended the stream after {} of {events} frames", frames.seen)),
            Some(Some(chunk)) => chunk?,
        };
        bytes += chunk.len();
        frames.read(&chunk);
    }
    if frames.seen > events {
        return Err(anyhow!("{} event frames, where the log holds {events} events", frames.seen));
    }
    Ok(Counted { bytes, secs: sent.elapsed().as_secs_f64().max(1e-9) })
}

/// Counts the event frames of a native stream read in chunks of any size, by their one
/// `data:` line (a comment such as a heartbeat has none; the data of a native frame is one
/// line of compact JSON, so it holds no newline of its own).
struct EventFrames {
    finder: memchr::memmem::Finder<'static>,
    /// The last bytes read, as many as a data line's start can straddle into the next chunk.
    tail: Vec<u8>,
    seen: usize,
}

const DATA_LINE: &[u8] = b"\ndata: ";

impl Default for EventFrames {
    fn default() -> EventFrames {
        EventFrames { finder: memchr::memmem::Finder::new(DATA_LINE), tail: Vec::new(), seen: 0 }
    }
}

impl EventFrames {
    fn read(&mut self, chunk: &[u8]) {
        // Starts that straddle the two chunks: the tail is too short to hold one alone, and
        // so is the head taken from the chunk.
        let mut seam = std::mem::take(&mut self.tail);
        seam.extend_from_slice(&chunk[..chunk.len().min(DATA_LINE.len() - 1)]);
        self.seen += self.finder.find_iter(&seam).count() + self.finder.find_iter(chunk).count();
        let keep = seam.len().min(DATA_LINE.len() - 1);
        self.tail =
            if chunk.len() >= keep { chunk[chunk.len() - keep..].to_vec() } else { seam[seam.len() - keep..].to_vec() };
    }

    /// Whether what was read ends at the end of a frame.
    fn whole(&self) -> bool {
        self.tail.ends_with(b"\n\n")
    }
}

/// The median of the counted replays (each of `events` events).
fn counted_figures(report: &mut Report, events: usize, counted: &mut [Counted], raw_scan: Option<f64>) {
    counted.sort_by(|a, b| a.secs.total_cmp(&b.secs));
    let Some(median) = counted.get(counted.len() / 2) else { return };
    let rate = |c: &Counted| events as f64 / c.secs;
    report.figure("replay, frames counted (server alone; median)", rate(median), "events/s");
    report.figure("same, bytes", median.bytes as f64 / median.secs / 1e6, "MB/s");
    if let Some(raw) = raw_scan {
        report.at_least("counted replay / raw sled scan", rate(median) / raw * 100.0, "%", 50.0, ">= 50% (issue 17)");
    }
    let rates: Vec<String> = counted.iter().rev().map(|c| format!("{:.0}k", rate(c) / 1e3)).collect();
    report.note(format!("counted replays, events/s: {}", rates.join(", ")));
}

fn figures(report: &mut Report, p: &Params, received: &Received, sent: Instant, raw_scan: Option<f64>) {
    let n = received.frames.len();
    let (first, end) = match (received.frames.first(), received.frames.last()) {
        (Some(first), Some(end)) => (first.at - sent, end.at - sent),
        _ => Default::default(),
    };
    let rate = n as f64 / end.as_secs_f64().max(1e-9);
    report.at_least("replay", rate, "events/s", 300_000.0, ">= 300k events/s");
    report.figure("replay bytes", rate * p.event_bytes as f64 / 1e6, "MB/s");
    report.figure("time to first event", first.as_secs_f64() * 1000.0, "ms");
    if let Some(raw) = raw_scan {
        report.figure("replay / raw sled scan", rate / raw * 100.0, "%");
    }
    report.note(format!("{n} events of about {} bytes in {:.0} ms", p.event_bytes, end.as_secs_f64() * 1000.0));
}

#[cfg(test)]
mod tests {
    use super::EventFrames;

    const STREAM: &[u8] = b"id: a\nevent: x\ndata: {}\n\n: ping\n\nid: b\nevent: y\ndata: {\"t\":\"\\ndata: \"}\n\n";

    fn read(chunks: &[&[u8]]) -> (usize, bool) {
        let mut frames = EventFrames::default();
        chunks.iter().for_each(|chunk| frames.read(chunk));
        (frames.seen, frames.whole())
    }

    #[test]
    fn event_frames_are_counted_once_wherever_the_chunks_split() {
        for size in 1..=STREAM.len() {
            let chunks: Vec<&[u8]> = STREAM.chunks(size).collect();
            assert_eq!(read(&chunks), (2, true), "chunks of {size}");
        }
        for split in 0..=STREAM.len() {
            let (head, tail) = STREAM.split_at(split);
            assert_eq!(read(&[head, b"", tail]), (2, true), "split at {split}");
        }
    }

    #[test]
    fn a_frame_is_whole_only_at_its_end() {
        let end = STREAM.len();
        assert_eq!(read(&[&STREAM[..end - 1]]), (2, false));
        assert_eq!(read(&[&STREAM[..end - 2]]), (2, false));
        assert_eq!(read(&[&STREAM[..end - 1], &STREAM[end - 1..]]), (2, true));
    }
}
