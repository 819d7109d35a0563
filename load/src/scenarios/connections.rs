//! `connections`: K idle SSE connections (by default each on its own session, as browsers
//! watching their own sessions would be); the server's memory per connection is
//! (RSS after opening them - RSS before) / K, read from `/proc/<pid>/status`.
//!
//! Correctness: each connection must first get its session's replay; then one event is
//! appended to every session and each connection must receive exactly its session's log.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::bail;
use clap::Args;
use futures_util::{stream, StreamExt};
use serde::Serialize;
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;

use super::fanout::{follow, wait_for, Received, OPENING};
use super::{check_alive, create_sessions, fetch_logs, Ctx, Deadline, Observe, Size};
use crate::check::Violations;
use crate::client::{parse_event_id, Api, Cursor};
use crate::report::Report;

#[derive(Args, Debug, Clone, Serialize)]
pub struct Params {
    /// Idle SSE connections to open.
    #[arg(long, default_value_t = 10_000)]
    pub connections: usize,
    /// Sessions they are spread over (default: one per connection).
    #[arg(long)]
    pub sessions: Option<usize>,
    /// Seconds to let the server settle before each RSS reading.
    #[arg(long, default_value_t = 1.0)]
    pub settle: f64,
    /// Hard stop for the whole scenario, in seconds.
    #[arg(long, default_value_t = 240.0)]
    pub deadline: f64,
}

impl Params {
    pub fn sized(size: Size) -> Params {
        let mut p: Params = super::defaults();
        match size {
            Size::Full => {}
            Size::Quick => p.connections = 2_000,
            Size::Tiny => {
                p.connections = 20;
                p.settle = 0.1;
                p.deadline = 60.0;
            }
        }
        p
    }
}

/// Raises the soft limit on open files to the hard limit; answers the new soft limit.
pub fn raise_fd_limit() -> u64 {
    rlimit::increase_nofile_limit(u64::MAX).unwrap_or(0)
}

pub async fn run(ctx: &Ctx, p: &Params) -> anyhow::Result<Report> {
    let mut report = Report::new("connections", p);
    let limit = raise_fd_limit();
    if (limit as usize) < p.connections + 512 {
        bail!(
            "{} connections need more open files than the limit of {limit}: raise it with `ulimit -n {}` (the hard limit too, as root) and run again",
            p.connections,
            p.connections + 1024
        );
    }
    let mut server = ctx.launcher.start().await?;
    let api = Api::new(&server.url);
    let deadline = Deadline::after(p.deadline);
    let n_sessions = p.sessions.unwrap_or(p.connections).clamp(1, p.connections.max(1));
    let sessions = create_sessions(&api, n_sessions, 32, ctx.quiet).await?;
    tokio::time::sleep(Duration::from_secs_f64(p.settle)).await;
    let before = server.rss_kib();

    let observe = Observe::start(&server, &api).await;
    let targets: Vec<_> = sessions.iter().map(|_| watch::channel(None::<u128>)).collect();
    let connected = Arc::new(AtomicUsize::new(0));
    let opening = Arc::new(Semaphore::new(OPENING));
    let mut clients = JoinSet::new();
    for c in 0..p.connections {
        let s = c % sessions.len();
        let (api, session, last) = (api.clone(), sessions[s].clone(), targets[s].1.clone());
        let (connected, opening) = (connected.clone(), opening.clone());
        clients.spawn(async move {
            let permit = opening.acquire_owned().await;
            let received = follow(&api, &session, Cursor::Start, last, deadline, move || {
                drop(permit);
                connected.fetch_add(1, Ordering::Relaxed);
            })
            .await;
            (c, s, received)
        });
    }
    let open = wait_for(&connected, p.connections, deadline, ctx.quiet).await;
    tokio::time::sleep(Duration::from_secs_f64(p.settle)).await;
    let after = server.rss_kib();
    let client_rss = crate::server::rss_kib(std::process::id());
    if !open {
        report.violations.push(format!(
            "only {} of {} connections had their replay before the deadline",
            connected.load(Ordering::Relaxed),
            p.connections
        ));
    }

    // Wake every connection once: each session gets one event, which each of its
    // connections must receive.
    let probes: Vec<anyhow::Result<u128>> = stream::iter(sessions.iter().cloned())
        .map(|session| {
            let api = api.clone();
            async move {
                let (acked, _) = api.post_messages(&session, &["probe".to_string()]).await?;
                Ok(parse_event_id(&acked[0].id).unwrap_or_default())
            }
        })
        .buffered(32)
        .collect()
        .await;
    let mut violations = Violations::default();
    for (probe, (tx, _)) in probes.into_iter().zip(&targets) {
        match probe {
            Ok(id) => {
                let _ = tx.send(Some(id));
            }
            Err(error) => violations.push(format!("the probe append: {error:#}")),
        }
    }
    let done: Vec<(usize, usize, Received)> = match deadline.run(clients.join_all()).await {
        Some(done) => done,
        None => bail!("the connections did not finish by the deadline"),
    };
    observe.finish(&server, &api, &mut report).await;

    report.figure("idle SSE connections", p.connections as f64, "");
    if let (Some(before), Some(after)) = (before, after) {
        let per = (after as f64 - before as f64) / p.connections.max(1) as f64;
        report.figure("server RSS before", before as f64 / 1024.0, "MiB");
        report.figure("server RSS with the connections", after as f64 / 1024.0, "MiB");
        report.below("server memory per connection", per, "KiB", 16.0, "< 16 KiB");
    } else {
        report.note("the server's RSS is unknown (a --url server without --server-pid)");
    }
    report.note(format!(
        "{} connections over {} sessions; load client RSS {} MiB{}",
        p.connections,
        sessions.len(),
        client_rss.unwrap_or(0) / 1024,
        if server.pid == Some(std::process::id()) {
            " (the server runs in the same process, so RSS includes the client)"
        } else {
            ""
        }
    ));

    let logs = fetch_logs(&api, &sessions, 32).await;
    for log in &logs {
        if let Err(violation) = log {
            violations.push(violation.clone());
        }
    }
    for (c, s, r) in &done {
        if let Some(error) = &r.error {
            violations.push(format!("connection {c}: {error}"));
        }
        report.deadline_hit |= r.deadline_hit;
        if let Ok(log) = &logs[*s] {
            let ids: Vec<u128> = r.frames.iter().map(|f| f.id).collect();
            violations.check(log.check(&format!("connection {c}"), None, &ids));
        }
    }
    report.violations.extend(violations.into_vec());
    check_alive(&mut server, &mut report);
    server.stop().await;
    Ok(report)
}
