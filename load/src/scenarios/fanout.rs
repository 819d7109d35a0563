//! `fanout`: one writer appending at a steady rate to one session, K SSE subscribers on it.
//! Delivery latency is measured from the append's acknowledgement (the writer records when
//! each id was acknowledged) to its receipt at each subscriber. The server broadcasts just
//! before it answers the append, so a receipt may come first: it then counts as zero, and
//! the latency from when the append was sent (which includes the durable commit) is
//! reported beside it.
//!
//! Correctness: every subscriber (from the start of the log) must receive exactly the whole
//! log, once each, in order, up to the writer's last event.

use std::collections::HashMap;
use std::time::Duration;

use clap::Args;
use serde::Serialize;
use tokio::sync::watch;

use super::live::{check_followers, write_on_own_thread, Append, Follower, Followers, Rate, Written};
use super::{check_alive, fetch_logs, Ctx, Deadline, Observe, Size};
use crate::check::Violations;
use crate::client::{parse_event_id, Api};
use crate::report::Report;
use crate::stats::Latency;

#[derive(Args, Debug, Clone, Serialize)]
pub struct Params {
    /// SSE subscribers on the session.
    #[arg(long, default_value_t = 1000)]
    pub subscribers: usize,
    /// Events per second the writer appends (one event per request).
    #[arg(long, default_value_t = 50.0)]
    pub rate: f64,
    /// Seconds of writing.
    #[arg(long, default_value_t = 20.0)]
    pub duration: f64,
    /// Stop after this many events even if time is left.
    #[arg(long, default_value_t = 100_000)]
    pub count: u64,
    /// Approximate size of each stored event's JSON, in bytes.
    #[arg(long, default_value_t = 300)]
    pub event_bytes: usize,
    /// Hard stop for the whole scenario, in seconds (default: duration + 120).
    #[arg(long)]
    pub deadline: Option<f64>,
}

impl Params {
    pub fn sized(size: Size) -> Params {
        let mut p: Params = super::defaults();
        match size {
            Size::Full => {}
            Size::Quick => {
                p.subscribers = 200;
                p.duration = 4.0;
            }
            Size::Tiny => {
                p.subscribers = 5;
                p.duration = 0.5;
                p.count = 50;
            }
        }
        p
    }
}

pub async fn run(ctx: &Ctx, p: &Params) -> anyhow::Result<Report> {
    let mut report = Report::new("fanout", p);
    let mut server = ctx.launcher.start().await?;
    let api = Api::new(&server.url);
    let deadline = Deadline::after(p.deadline.unwrap_or(p.duration + 120.0));
    let sessions = vec![api.create_session().await?];
    let mut violations = Violations::default();

    let (target, targets) = watch::channel(None::<u128>);
    let followers = Followers::spawn(&api, &sessions, p.subscribers, &[targets], deadline);
    violations.check(followers.connected(deadline, ctx.quiet).await);
    let observe = Observe::start(&server, &api).await;
    let bar = crate::progress::timed(ctx.quiet, Duration::from_secs_f64(p.duration), "writing");
    let rate = Rate { per_sec: p.rate, duration: p.duration, count: p.count, event_bytes: p.event_bytes };
    let written = write_on_own_thread(&server.url, &sessions[0], rate, deadline).await;
    bar.finish_and_clear();
    let last = match written.last() {
        Some(last) => Some(last),
        // Nothing written: the subscribers are done once they have the log as it is.
        None => api.log(&sessions[0]).await?.last().and_then(|e| parse_event_id(&e.id)),
    };
    let _ = target.send(last);
    let followers = followers.join().await;
    observe.finish(&server, &api, &mut report).await;

    figures(&mut report, p, &written, &followers);
    if let Some(error) = &written.error {
        violations.push(error.clone());
    }
    check_followers(&fetch_logs(&api, &sessions, 1).await, &followers, &mut violations);
    report.violations.extend(violations.into_vec());
    check_alive(&mut server, &mut report);
    server.stop().await;
    Ok(report)
}

fn figures(report: &mut Report, p: &Params, written: &Written, followers: &[Follower]) {
    report.deadline_hit = written.deadline_hit || followers.iter().any(|f| f.received.deadline_hit);
    let appends: HashMap<u128, Append> = written.acked.iter().map(|a| (a.id, *a)).collect();
    let (mut from_ack, mut from_send, mut early) = (Latency::new(), Latency::new(), 0u64);
    for frame in followers.iter().flat_map(|f| &f.received.frames) {
        if let Some(append) = appends.get(&frame.id) {
            early += u64::from(frame.at < append.acked);
            from_ack.record(frame.at.saturating_duration_since(append.acked));
            from_send.record(frame.at.saturating_duration_since(append.sent));
        }
    }
    report.figure("subscribers", p.subscribers as f64, "");
    report.figure("events written", written.acked.len() as f64, "");
    report.below("delivery p50 (from ack)", from_ack.ms(0.5), "ms", 2.0, "< 2 ms");
    report.below("delivery p99 (from ack)", from_ack.ms(0.99), "ms", 20.0, "< 20 ms");
    report.figure("delivery max (from ack)", from_ack.max_ms(), "ms");
    report.below("delivery p50 (from append sent)", from_send.ms(0.5), "ms", 2.0, "< 2 ms");
    report.below("delivery p99 (from append sent)", from_send.ms(0.99), "ms", 20.0, "< 20 ms");
    report.figure("delivery max (from append sent)", from_send.max_ms(), "ms");
    report.note(format!(
        "{} deliveries; {early} ({:.0}%) arrived before the writer had its acknowledgement (the server broadcasts, then answers) and count as 0 from the ack; 'from append sent' includes the durable commit. Writer {:.1} events/s, ack p50 {:.2} ms, p99 {:.2} ms",
        from_ack.count(),
        early as f64 * 100.0 / from_ack.count().max(1) as f64,
        written.acked.len() as f64 / written.elapsed.max(1e-9),
        written.latency.ms(0.5),
        written.latency.ms(0.99)
    ));
}
