//! `connections`: K idle SSE connections (by default each on its own session, as browsers
//! watching their own sessions would be); the server's memory per connection is
//! (RSS after opening them - RSS before) / K, read from `/proc/<pid>/status`.
//!
//! Correctness: each connection must first get its session's replay; then one event is
//! appended to every session and each connection must receive exactly its session's log.

use std::time::Duration;

use anyhow::bail;
use clap::Args;
use futures_util::{stream, StreamExt};
use serde::Serialize;
use tokio::sync::watch;

use super::live::{check_followers, Followers};
use super::{check_alive, create_sessions, fetch_logs, Ctx, Deadline, Observe, Size};
use crate::check::Violations;
use crate::client::{parse_event_id, Api};
use crate::report::Report;
use crate::server::Server;

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
    // The server and this client each hold a descriptor a connection (the server raises its
    // soft limit to the hard one at start; this one was raised just now).
    let needed = p.connections + 512;
    if (limit as usize) < needed {
        bail!(
            "{} connections need {needed} open files in the server and in this client and the limit is {limit}: \
             raise it with `ulimit -n {}` (the hard limit too, as root), or ask for fewer with --connections",
            p.connections,
            needed + 512
        );
    }
    let mut server = ctx.launcher.start().await?;
    let api = Api::new(&server.url);
    let deadline = Deadline::after(p.deadline);
    let n_sessions = p.sessions.unwrap_or(p.connections).clamp(1, p.connections.max(1));
    let sessions = create_sessions(&api, n_sessions, 32, ctx.quiet).await?;
    let mut violations = Violations::default();
    tokio::time::sleep(Duration::from_secs_f64(p.settle)).await;
    let before = server.rss_kib();

    let observe = Observe::start(&server, &api).await;
    let (targets, receivers): (Vec<_>, Vec<_>) = sessions.iter().map(|_| watch::channel(None::<u128>)).unzip();
    let followers = Followers::spawn(&api, &sessions, p.connections, &receivers, deadline);
    violations.check(followers.connected(deadline, ctx.quiet).await);
    tokio::time::sleep(Duration::from_secs_f64(p.settle)).await;
    let after = server.rss_kib();
    figures(&mut report, p, &server, sessions.len(), before.zip(after));

    wake(&api, &sessions, &targets, &mut violations).await;
    let Some(followers) = deadline.run(followers.join()).await else {
        bail!("the connections did not finish by the deadline");
    };
    observe.finish(&server, &api, &mut report).await;
    report.deadline_hit = followers.iter().any(|f| f.received.deadline_hit);
    check_followers(&fetch_logs(&api, &sessions, 32).await, &followers, &mut violations);
    report.violations.extend(violations.into_vec());
    check_alive(&mut server, &mut report);
    server.stop().await;
    Ok(report)
}

fn figures(report: &mut Report, p: &Params, server: &Server, sessions: usize, rss: Option<(u64, u64)>) {
    report.figure("idle SSE connections", p.connections as f64, "");
    match rss {
        Some((before, after)) => {
            let per = (after as f64 - before as f64) / p.connections.max(1) as f64;
            report.figure("server RSS before", before as f64 / 1024.0, "MiB");
            report.figure("server RSS with the connections", after as f64 / 1024.0, "MiB");
            report.below("server memory per connection", per, "KiB", 16.0, "< 16 KiB");
        }
        None => report.note("the server's RSS is unknown (a --url server without --server-pid)"),
    }
    let in_process = server.pid == Some(std::process::id());
    report.note(format!(
        "{} connections over {sessions} sessions; load client RSS {} MiB{}",
        p.connections,
        crate::server::rss_kib(std::process::id()).unwrap_or(0) / 1024,
        if in_process { " (the server runs in the same process, so its RSS includes the client)" } else { "" }
    ));
}

/// Wakes every connection once: each session gets one event, which each of its
/// connections must then receive.
async fn wake(api: &Api, sessions: &[String], targets: &[watch::Sender<Option<u128>>], violations: &mut Violations) {
    let probes: Vec<anyhow::Result<u128>> = stream::iter(sessions.iter().cloned())
        .map(|session| {
            let api = api.clone();
            async move {
                let (acked, _) = api.post_events(&session, &["probe".to_string()]).await?;
                Ok(parse_event_id(&acked[0].id).unwrap_or_default())
            }
        })
        .buffered(32)
        .collect()
        .await;
    for (probe, target) in probes.into_iter().zip(targets) {
        match probe {
            Ok(id) => {
                let _ = target.send(Some(id));
            }
            Err(error) => violations.push(format!("the probe append: {error:#}")),
        }
    }
}
