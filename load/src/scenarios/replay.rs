//! `replay`: one client replaying one large session from the start over SSE; events/s
//! from sending the request to having the last event.
//!
//! Correctness: the client must receive exactly the whole log, once each, in order.

use std::time::Instant;

use clap::Args;
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
    let follower = Follower { client: 0, session: 0, first: Cursor::Start, received };
    let mut violations = Violations::default();
    check_followers(&fetch_logs(&api, &sessions, 1).await, &[follower], &mut violations);
    report.violations.extend(violations.into_vec());
    check_alive(&mut server, &mut report);
    server.stop().await;
    Ok(report)
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
