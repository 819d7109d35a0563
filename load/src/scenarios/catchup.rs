//! `catchup`: N clients, all at once, each replaying M events of a given size from the start
//! of its own session (or of one shared session); the time from sending the request to
//! having the log's last event, per client.
//!
//! Correctness: each client must receive exactly its session's whole log, once, in order.

use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use futures_util::{stream, StreamExt};
use serde::Serialize;
use tokio::sync::{watch, Barrier};
use tokio::task::JoinSet;

use super::live::{check_followers, follow, Follower};
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

    let observe = Observe::start(&server, &api).await;
    let started = Instant::now();
    let clients = catch_up(&api, &sessions, &lasts, p.clients, deadline).await;
    let wall = started.elapsed().as_secs_f64();
    observe.finish(&server, &api, &mut report).await;

    figures(&mut report, p, &clients, &lasts, wall);
    let followers: Vec<Follower> = clients.into_iter().map(|(f, _)| f).collect();
    let mut violations = Violations::default();
    check_followers(&fetch_logs(&api, &sessions, 16).await, &followers, &mut violations);
    report.violations.extend(violations.into_vec());
    check_alive(&mut server, &mut report);
    server.stop().await;
    Ok(report)
}

/// Starts every client at once (client `i` on session `i mod sessions`), each reading from
/// the start until it has its session's last event; answers each with when it sent its
/// request.
async fn catch_up(
    api: &Api,
    sessions: &[String],
    lasts: &[u128],
    clients: usize,
    deadline: Deadline,
) -> Vec<(Follower, Instant)> {
    let go = Arc::new(Barrier::new(clients + 1));
    let targets: Vec<_> = lasts.iter().map(|&last| watch::channel(Some(last))).collect();
    let mut tasks = JoinSet::new();
    for client in 0..clients {
        let session = client % sessions.len();
        let (api, id, go) = (api.clone(), sessions[session].clone(), go.clone());
        let target = targets[session].1.clone();
        tasks.spawn(async move {
            go.wait().await;
            let sent = Instant::now();
            let received = follow(&api, &id, Cursor::Start, target, deadline, || {}).await;
            (Follower { client, session, first: Cursor::Start, received }, sent)
        });
    }
    go.wait().await;
    let mut done = tasks.join_all().await;
    done.sort_by_key(|(f, _)| f.client);
    done
}

fn figures(report: &mut Report, p: &Params, clients: &[(Follower, Instant)], lasts: &[u128], wall: f64) {
    let (mut latency, mut opening, mut replaying) = (Latency::new(), Latency::new(), Latency::new());
    let (mut delivered, mut slow_open) = (0usize, 0usize);
    for (f, sent) in clients {
        let r = &f.received;
        delivered += r.frames.len();
        report.deadline_hit |= r.deadline_hit;
        if let (Some(last), Some(opened)) = (r.frames.last().filter(|l| l.id == lasts[f.session]), r.opened) {
            latency.record(last.at - *sent);
            opening.record(opened - *sent);
            replaying.record(last.at - opened);
            slow_open += usize::from(opened - *sent >= Duration::from_millis(900));
        }
    }
    report.figure("clients", p.clients as f64, "");
    report.figure("time to caught up p50", latency.ms(0.5), "ms");
    report.below("time to caught up p99", latency.ms(0.99), "ms", 100.0, "< 100 ms");
    report.figure("time to caught up max", latency.max_ms(), "ms");
    report.figure("stream open (request to response head) p99", opening.ms(0.99), "ms");
    report.figure("replay (response head to last event) p99", replaying.ms(0.99), "ms");
    report.figure("all clients caught up in", wall * 1000.0, "ms");
    report.figure("aggregate replay", delivered as f64 / wall.max(1e-9), "events/s");
    report.note(format!(
        "{} clients x {} events of about {} bytes ({} sessions); {delivered} events, about {:.0} MB/s in all",
        p.clients,
        p.events,
        p.event_bytes,
        lasts.len(),
        delivered as f64 * p.event_bytes as f64 / wall.max(1e-9) / 1e6
    ));
    if slow_open > 0 {
        report.note(format!(
            "{slow_open} clients waited about a second or more for their connection: a SYN retransmit, the server's accept queue overflowed (see its listen backlog with `ss -ltn`)"
        ));
    }
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
                    let (acked, _) = api.post_events(&session, &vec![text.clone(); n]).await?;
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
