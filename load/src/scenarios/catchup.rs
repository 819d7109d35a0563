//! `catchup`: N clients, all at once, each replaying M events of a given size from the start
//! of its own session (or of one shared session); the time from sending the request to
//! having the log's last event, per client.
//!
//! Correctness: each client must receive exactly its session's whole log, once, in order.

use std::sync::Arc;
use std::time::Instant;

use clap::Args;
use futures_util::{stream, StreamExt};
use serde::Serialize;
use tokio::sync::{watch, Barrier};
use tokio::task::JoinSet;

use super::fanout::{follow, Received};
use super::{check_alive, create_sessions, fetch_logs, message, Ctx, Deadline, Observe, Size};
use crate::check::Violations;
use crate::client::{parse_event_id, Api, Cursor};
use crate::report::Report;
use crate::stats::Latency;

#[derive(Args, Debug, Clone, Serialize)]
pub struct Params {
    /// Clients replaying at once.
    #[arg(long, default_value_t = 1000)]
    pub clients: usize,
    /// Events in each session's log (after `session.created`).
    #[arg(long, default_value_t = 200)]
    pub events: usize,
    /// Approximate size of each stored event's JSON, in bytes.
    #[arg(long, default_value_t = 1024)]
    pub event_bytes: usize,
    /// All clients replay one shared session instead of one session each.
    #[arg(long)]
    pub shared: bool,
    /// Hard stop for the whole scenario, in seconds.
    #[arg(long, default_value_t = 300.0)]
    pub deadline: f64,
}

impl Params {
    pub fn sized(size: Size) -> Params {
        let mut p: Params = super::defaults();
        match size {
            Size::Full => {}
            Size::Quick => p.clients = 200,
            Size::Tiny => {
                p.clients = 5;
                p.events = 20;
                p.deadline = 60.0;
            }
        }
        p
    }
}

pub async fn run(ctx: &Ctx, p: &Params) -> anyhow::Result<Report> {
    let mut report = Report::new("catchup", p);
    let mut server = ctx.launcher.start().await?;
    let api = Api::new(&server.url);
    let deadline = Deadline::after(p.deadline);
    let n_sessions = if p.shared { 1 } else { p.clients.max(1) };
    let sessions = create_sessions(&api, n_sessions, 16, ctx.quiet).await?;
    let lasts = fill(&api, &sessions, p.events, p.event_bytes, ctx.quiet).await?;

    let go = Arc::new(Barrier::new(p.clients + 1));
    let targets: Vec<_> = lasts.iter().map(|&last| watch::channel(Some(last))).collect();
    let mut clients = JoinSet::new();
    for i in 0..p.clients {
        let s = if p.shared { 0 } else { i };
        let (api, session, go) = (api.clone(), sessions[s].clone(), go.clone());
        let last = targets[s].1.clone();
        clients.spawn(async move {
            go.wait().await;
            let sent = Instant::now();
            let received = follow(&api, &session, Cursor::Start, last, deadline, || {}).await;
            (i, s, sent, received)
        });
    }
    let observe = Observe::start(&server, &api).await;
    let started = Instant::now();
    go.wait().await;
    let done: Vec<(usize, usize, Instant, Received)> = clients.join_all().await;
    let wall = started.elapsed().as_secs_f64();
    observe.finish(&server, &api, &mut report).await;

    let mut latency = Latency::new();
    let mut delivered = 0usize;
    for (_, s, sent, r) in &done {
        delivered += r.frames.len();
        report.deadline_hit |= r.deadline_hit;
        if let Some(last) = r.frames.last().filter(|f| f.id == lasts[*s]) {
            latency.record(last.at - *sent);
        }
    }
    let bytes = delivered as f64 * p.event_bytes as f64;
    report.figure("clients", p.clients as f64, "");
    report.figure("time to caught up p50", latency.ms(0.5), "ms");
    report.below("time to caught up p99", latency.ms(0.99), "ms", 100.0, "< 100 ms");
    report.figure("time to caught up max", latency.max_ms(), "ms");
    report.figure("all clients caught up in", wall * 1000.0, "ms");
    report.figure("aggregate replay", delivered as f64 / wall.max(1e-9), "events/s");
    report.note(format!(
        "{} clients x {} events of about {} bytes ({} sessions); {delivered} events, about {:.0} MB/s in all",
        p.clients,
        p.events,
        p.event_bytes,
        sessions.len(),
        bytes / wall.max(1e-9) / 1e6
    ));

    let mut violations = Violations::default();
    let logs = fetch_logs(&api, &sessions, 16).await;
    for log in &logs {
        if let Err(violation) = log {
            violations.push(violation.clone());
        }
    }
    for (i, s, _, r) in &done {
        if let Some(error) = &r.error {
            violations.push(format!("client {i}: {error}"));
        }
        if let Ok(log) = &logs[*s] {
            let ids: Vec<u128> = r.frames.iter().map(|f| f.id).collect();
            violations.check(log.check(&format!("client {i}"), None, &ids));
        }
    }
    report.violations.extend(violations.into_vec());
    check_alive(&mut server, &mut report);
    server.stop().await;
    Ok(report)
}

/// Appends `events` messages of about `event_bytes` to each session, in requests of at most
/// 1000 events or 2 MiB; answers each session's last event id.
pub async fn fill(
    api: &Api,
    sessions: &[String],
    events: usize,
    event_bytes: usize,
    quiet: bool,
) -> anyhow::Result<Vec<u128>> {
    let total = (sessions.len() * events) as u64;
    let bar = crate::progress::bar(quiet || total < 20_000, total, "writing the logs");
    let chunk = (2 << 20) / event_bytes.max(1);
    let chunk = chunk.clamp(1, 1000);
    let text = message("catchup", event_bytes);
    let lasts: Vec<anyhow::Result<u128>> = stream::iter(sessions.iter().cloned())
        .map(|session| {
            let (api, bar, text) = (api.clone(), bar.clone(), text.clone());
            async move {
                let mut last = 0;
                let mut left = events;
                while left > 0 {
                    let n = left.min(chunk);
                    let (acked, _) = api.post_messages(&session, &vec![text.clone(); n]).await?;
                    last = acked.last().and_then(|e| parse_event_id(&e.id)).unwrap_or(last);
                    left -= n;
                    bar.inc(n as u64);
                }
                if last == 0 {
                    last = api.log(&session).await?.last().and_then(|e| parse_event_id(&e.id)).unwrap_or(0);
                }
                Ok(last)
            }
        })
        .buffered(16)
        .collect()
        .await;
    bar.finish_and_clear();
    lasts.into_iter().collect()
}
