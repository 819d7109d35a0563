//! `reconnect`: subscribers that drop their connection at random points (after a random
//! number of events or a random time, often in the middle of a frame) while one writer
//! appends, and resume from the last event they received with `Last-Event-ID` (or
//! `after_id`, at random). Their first cursor is the start, an `after_id`, or a
//! `Last-Event-ID` inside the log written before they start. Also checks that a cursor
//! that is not in the log is refused with 409 `unknown_cursor`.
//!
//! Correctness: each subscriber's events across all its connections must be exactly the
//! log's suffix after its first cursor, once each, in order.

use std::time::{Duration, Instant};

use clap::Args;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use tokio::sync::watch;
use tokio::task::JoinSet;
use ulid::Ulid;

use super::catchup::fill;
use super::fanout::rate_writer;
use super::{check_alive, fetch_logs, Ctx, Deadline, Observe, Size};
use crate::check::Violations;
use crate::client::{Api, Cursor};
use crate::report::Report;

#[derive(Args, Debug, Clone, Serialize)]
pub struct Params {
    /// Subscribers that keep dropping and resuming.
    #[arg(long, default_value_t = 100)]
    pub subscribers: usize,
    /// Events per second the writer appends.
    #[arg(long, default_value_t = 200.0)]
    pub rate: f64,
    /// Seconds of writing.
    #[arg(long, default_value_t = 15.0)]
    pub duration: f64,
    /// Events written before the subscribers start (their first cursors point into these).
    #[arg(long, default_value_t = 200)]
    pub prefill: usize,
    /// A connection is dropped after at most this many events...
    #[arg(long, default_value_t = 50)]
    pub max_events_per_connection: usize,
    /// ... or at most this many milliseconds.
    #[arg(long, default_value_t = 300)]
    pub max_connection_ms: u64,
    /// Seed of the random drops, for a run that can be repeated.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
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
                p.subscribers = 30;
                p.duration = 4.0;
            }
            Size::Tiny => {
                p.subscribers = 5;
                p.duration = 1.0;
                p.rate = 100.0;
                p.prefill = 20;
                p.max_events_per_connection = 10;
                p.max_connection_ms = 100;
            }
        }
        p
    }
}

struct Subscriber {
    first: Cursor,
    received: Vec<u128>,
    connections: u64,
    error: Option<String>,
    deadline_hit: bool,
}

pub async fn run(ctx: &Ctx, p: &Params) -> anyhow::Result<Report> {
    let mut report = Report::new("reconnect", p);
    let mut server = ctx.launcher.start().await?;
    let api = Api::new(&server.url);
    let deadline = Deadline::after(p.deadline.unwrap_or(p.duration + 120.0));
    let session = api.create_session().await?;
    fill(&api, std::slice::from_ref(&session), p.prefill, 300, true).await?;
    let prefilled: Vec<u128> =
        fetch_logs(&api, std::slice::from_ref(&session), 1).await.remove(0).map_err(anyhow::Error::msg)?.ids;

    let mut violations = Violations::default();
    refusals(&api, &session, &mut violations).await;

    let observe = Observe::start(&server, &api).await;
    let (last_tx, last_rx) = watch::channel(None::<u128>);
    let mut subscribers = JoinSet::new();
    for i in 0..p.subscribers {
        let mut rng = StdRng::seed_from_u64(p.seed.wrapping_mul(1_000_003) + i as u64);
        let inside = prefilled[rng.random_range(0..prefilled.len())];
        let first = match i % 3 {
            0 => Cursor::Start,
            1 => Cursor::AfterId(inside),
            _ => Cursor::LastEventId(inside),
        };
        let (api, session, last, p) = (api.clone(), session.clone(), last_rx.clone(), p.clone());
        subscribers.spawn(async move { resume(&api, &session, first, last, &p, rng, deadline).await });
    }
    let bar = crate::progress::timed(ctx.quiet, Duration::from_secs_f64(p.duration), "writing");
    let written = rate_writer(&api, &session, p.rate, p.duration, u64::MAX, 300, deadline).await;
    bar.finish_and_clear();
    let last = written.acked.last().map(|a| a.id).or(prefilled.last().copied());
    let _ = last_tx.send(last);
    let done: Vec<Subscriber> = subscribers.join_all().await;
    observe.finish(&server, &api, &mut report).await;

    if let Some(error) = &written.error {
        violations.push(error.clone());
    }
    report.deadline_hit = written.deadline_hit || done.iter().any(|s| s.deadline_hit);
    let connections: u64 = done.iter().map(|s| s.connections).sum();
    let delivered: usize = done.iter().map(|s| s.received.len()).sum();
    let log = fetch_logs(&api, std::slice::from_ref(&session), 1).await.remove(0);
    let mut exact = 0;
    match &log {
        Err(violation) => violations.push(violation.clone()),
        Ok(log) => {
            for (i, s) in done.iter().enumerate() {
                if let Some(error) = &s.error {
                    violations.push(format!("subscriber {i}: {error}"));
                }
                let who = format!("subscriber {i} (first cursor {:?})", s.first);
                exact += usize::from(violations.check(log.check(&who, s.first.id(), &s.received)));
            }
        }
    }
    report.figure("subscribers", p.subscribers as f64, "");
    report.figure("connections opened", connections as f64, "");
    report.figure(
        "reconnects per subscriber",
        (connections as f64 - p.subscribers as f64) / p.subscribers.max(1) as f64,
        "",
    );
    report.figure("events delivered", delivered as f64, "");
    report.figure("events written meanwhile", written.acked.len() as f64, "");
    report.figure("subscribers with exactly their suffix", exact as f64, "");
    report.violations.extend(violations.into_vec());
    check_alive(&mut server, &mut report);
    server.stop().await;
    Ok(report)
}

/// A cursor that is not in the log is a 409 `unknown_cursor`, by query and by header.
async fn refusals(api: &Api, session: &str, violations: &mut Violations) {
    let stranger = Ulid::new().0;
    for cursor in [Cursor::AfterId(stranger), Cursor::LastEventId(stranger)] {
        match api.stream_refusal(session, cursor).await {
            Ok((409, body)) if body.contains("unknown_cursor") => {}
            Ok((status, body)) => violations.push(format!(
                "a stream at {cursor:?}, which is not in the log, answered {status} {body} (expected 409 unknown_cursor)"
            )),
            Err(error) => violations.push(format!("a stream at an unknown cursor: {error:#}")),
        }
    }
}

/// Connects, reads a little, drops, and resumes from the last event received, until it
/// has the writer's last event.
async fn resume(
    api: &Api,
    session: &str,
    first: Cursor,
    mut last: watch::Receiver<Option<u128>>,
    p: &Params,
    mut rng: StdRng,
    deadline: Deadline,
) -> Subscriber {
    let mut s = Subscriber { first, received: Vec::new(), connections: 0, error: None, deadline_hit: false };
    let mut watching = true;
    loop {
        let done = |s: &Subscriber, target: Option<u128>| {
            matches!((target, s.received.last()), (Some(t), Some(&got)) if got >= t)
                || (target.is_some() && target == first.id())
        };
        if done(&s, *last.borrow()) {
            return s;
        }
        let cursor = match s.received.last() {
            None => first,
            Some(&id) if rng.random_bool(0.5) => Cursor::LastEventId(id),
            Some(&id) => Cursor::AfterId(id),
        };
        let mut stream = match deadline.run(api.stream(session, cursor)).await {
            None => {
                s.deadline_hit = true;
                return s;
            }
            Some(Err(error)) => {
                s.error = Some(format!("reconnecting at {cursor:?}: {error:#}"));
                return s;
            }
            Some(Ok(stream)) => stream,
        };
        s.connections += 1;
        let budget = rng.random_range(1..=p.max_events_per_connection.max(1));
        let until =
            tokio::time::Instant::now() + Duration::from_millis(rng.random_range(1..=p.max_connection_ms.max(1)));
        let mut got = 0;
        while got < budget && !done(&s, *last.borrow()) {
            tokio::select! {
                next = stream.next() => match next {
                    Ok(Some(frame)) => {
                        s.received.push(frame.id);
                        got += 1;
                    }
                    Ok(None) => {
                        s.error = Some("the server ended the stream".into());
                        return s;
                    }
                    Err(error) => {
                        s.error = Some(format!("{error:#}"));
                        return s;
                    }
                },
                _ = tokio::time::sleep_until(until) => break,
                _ = tokio::time::sleep_until(deadline.0) => {
                    s.deadline_hit = true;
                    return s;
                }
                changed = last.changed(), if watching => watching = changed.is_ok(),
            }
        }
        drop(stream);
        if rng.random_bool(0.3) {
            let pause = Instant::now() + Duration::from_millis(rng.random_range(0..50));
            tokio::time::sleep_until(pause.into()).await;
        }
    }
}
