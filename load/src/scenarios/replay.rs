//! `replay`: one client replaying one large session from the start over SSE; events/s
//! from sending the request to having the last event. Twice: parsed and checked, then
//! read as bytes with only its frames counted, which is what the server alone sustains
//! (parsing the frames costs this client about as much as sending them costs the server,
//! and both share the machine's cores).
//!
//! Correctness: the client must receive exactly the whole log, once each, in order; the
//! counted replay must hold exactly as many frames.

use std::time::Instant;

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
    if !received.deadline_hit && received.error.is_none() {
        let observe = Observe::start(&server, &api).await;
        let mut counted = Vec::with_capacity(COUNTED_REPLAYS);
        for _ in 0..COUNTED_REPLAYS {
            match count_frames(&api, &sessions[0], received.frames.len(), deadline).await {
                Ok(replay) => counted.push(replay),
                Err(error) => {
                    report.violations.push(format!("the counted replay: {error:#}"));
                    break;
                }
            }
        }
        counted_figures(&mut report, &mut counted, raw_scan);
        observe.finish_as(&format!("{} counted replays: ", counted.len()), &server, &api, &mut report).await;
    }
    let follower = Follower { client: 0, session: 0, first: Cursor::Start, received };
    let mut violations = Violations::default();
    check_followers(&fetch_logs(&api, &sessions, 1).await, &[follower], &mut violations);
    report.violations.extend(violations.into_vec());
    check_alive(&mut server, &mut report);
    server.stop().await;
    Ok(report)
}

/// Counted replays, one after another; the median is reported. One lasts about 0.15 s here,
/// so a single one moves with whatever else the machine does in that moment.
const COUNTED_REPLAYS: usize = 5;

/// A replay read as bytes: its frames, its bytes, and how long from the request to the
/// end of the last frame.
struct Counted {
    frames: usize,
    bytes: usize,
    secs: f64,
}

/// Reads the session's stream from the start until `frames` frames have ended, counting
/// each `\n\n` that ends one (the data of a native frame is one line of compact JSON, so
/// a frame holds no other). The stream then idles (it follows the log live); anything
/// that arrived with the last frame beyond it is counted, and more frames than the log
/// holds is a violation.
async fn count_frames(api: &Api, session: &str, frames: usize, deadline: Deadline) -> anyhow::Result<Counted> {
    let sent = Instant::now();
    let response = deadline.run(api.stream_bytes(session)).await.ok_or_else(|| anyhow!("deadline"))??;
    let mut body = response.bytes_stream();
    let mut ends = FrameEnds::default();
    let (mut seen, mut bytes) = (0, 0);
    while seen < frames {
        let chunk = match deadline.run(body.next()).await {
            None => return Err(anyhow!("deadline, {seen} of {frames} frames read")),
            Some(None) => return Err(anyhow!("the server ended the stream after {seen} of {frames} frames")),
            Some(Some(chunk)) => chunk?,
        };
        bytes += chunk.len();
        seen += ends.count(&chunk);
    }
    if seen > frames {
        return Err(anyhow!("{seen} frames, where the log holds {frames} events"));
    }
    Ok(Counted { frames: seen, bytes, secs: sent.elapsed().as_secs_f64().max(1e-9) })
}

/// Counts the `\n\n` that end frames, in a stream read in chunks of any size.
struct FrameEnds {
    finder: memchr::memmem::Finder<'static>,
    /// The last chunk ended with a newline.
    after_newline: bool,
}

impl Default for FrameEnds {
    fn default() -> FrameEnds {
        FrameEnds { finder: memchr::memmem::Finder::new(b"\n\n"), after_newline: false }
    }
}

impl FrameEnds {
    /// The frame ends in `chunk`, with one split between it and the chunk before.
    fn count(&mut self, chunk: &[u8]) -> usize {
        let split = self.after_newline && chunk.first() == Some(&b'\n');
        // A chunk of one newline that ends a frame does not start the next end.
        self.after_newline = chunk.last() == Some(&b'\n') && !(split && chunk.len() == 1);
        usize::from(split) + self.finder.find_iter(chunk).count()
    }
}

fn counted_figures(report: &mut Report, counted: &mut [Counted], raw_scan: Option<f64>) {
    counted.sort_by(|a, b| a.secs.total_cmp(&b.secs));
    let Some(median) = counted.get(counted.len() / 2) else { return };
    let rate = |c: &Counted| c.frames as f64 / c.secs;
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
    use super::FrameEnds;

    #[test]
    fn frame_ends_are_counted_once_wherever_the_chunks_split() {
        let stream = b"id: a\nevent: x\ndata: {}\n\nid: b\nevent: y\ndata: {\"t\":\"\\n\"}\n\n: ping\n\n";
        for size in 1..=stream.len() {
            let mut ends = FrameEnds::default();
            let counted: usize = stream.chunks(size).map(|chunk| ends.count(chunk)).sum();
            assert_eq!(counted, 3, "chunks of {size}");
        }
        for split in 0..=stream.len() {
            let mut ends = FrameEnds::default();
            let (head, tail) = stream.split_at(split);
            assert_eq!(ends.count(head) + ends.count(tail), 3, "split at {split}");
        }
    }
}
