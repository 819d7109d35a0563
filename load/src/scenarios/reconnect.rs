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
use super::live::{check_followers, write_at_rate, Follower, Rate, Received};
use super::{check_alive, fetch_logs, Ctx, Deadline, Observe, Size};
use crate::check::Violations;
use crate::client::{Api, Cursor, EventStream};
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

/// A subscriber that keeps dropping and resuming, and how many connections it made.
struct Resumer {
    follower: Follower,
    connections: u64,
}

pub async fn run(ctx: &Ctx, p: &Params) -> anyhow::Result<Report> {
    let mut report = Report::new("reconnect", p);
    let mut server = ctx.launcher.start().await?;
    let api = Api::new(&server.url);
    let deadline = Deadline::after(p.deadline.unwrap_or(p.duration + 120.0));
    let sessions = vec![api.create_session().await?];
    fill(&api, &sessions, p.prefill, 300, true).await?;
    let prefilled = fetch_logs(&api, &sessions, 1).await.remove(0).map_err(anyhow::Error::msg)?.ids;
    let mut violations = Violations::default();
    refusals(&api, &sessions[0], &mut violations).await;

    let observe = Observe::start(&server, &api).await;
    let (target, receiver) = watch::channel(None::<u128>);
    let resumers = spawn_resumers(&api, &sessions[0], &prefilled, &receiver, p, deadline);
    let bar = crate::progress::timed(ctx.quiet, Duration::from_secs_f64(p.duration), "writing");
    let rate = Rate { per_sec: p.rate, duration: p.duration, count: u64::MAX, event_bytes: 300 };
    let written = write_at_rate(&api, &sessions[0], rate, deadline).await;
    bar.finish_and_clear();
    let _ = target.send(written.last().or(prefilled.last().copied()));
    let resumers: Vec<Resumer> = resumers.join_all().await;
    observe.finish(&server, &api, &mut report).await;

    if let Some(error) = &written.error {
        violations.push(error.clone());
    }
    report.deadline_hit = written.deadline_hit || resumers.iter().any(|r| r.follower.received.deadline_hit);
    let connections: u64 = resumers.iter().map(|r| r.connections).sum();
    let followers: Vec<Follower> = resumers.into_iter().map(|r| r.follower).collect();
    let exact = check_followers(&fetch_logs(&api, &sessions, 1).await, &followers, &mut violations);
    let delivered: usize = followers.iter().map(|f| f.received.frames.len()).sum();
    report.figure("subscribers", p.subscribers as f64, "");
    report.figure("connections opened", connections as f64, "");
    let reconnects = connections.saturating_sub(p.subscribers as u64) as f64;
    report.figure("reconnects per subscriber", reconnects / p.subscribers.max(1) as f64, "");
    report.figure("events delivered", delivered as f64, "");
    report.figure("events written meanwhile", written.acked.len() as f64, "");
    report.figure("subscribers with exactly their suffix", exact as f64, "");
    report.violations.extend(violations.into_vec());
    check_alive(&mut server, &mut report);
    server.stop().await;
    Ok(report)
}

/// The subscribers, each with its own seeded randomness; a third start from the start,
/// a third after an id in the prefilled log by `after_id`, a third by `Last-Event-ID`.
fn spawn_resumers(
    api: &Api,
    session: &str,
    prefilled: &[u128],
    target: &watch::Receiver<Option<u128>>,
    p: &Params,
    deadline: Deadline,
) -> JoinSet<Resumer> {
    let mut resumers = JoinSet::new();
    for client in 0..p.subscribers {
        let mut rng = StdRng::seed_from_u64(p.seed.wrapping_mul(1_000_003) + client as u64);
        let inside = prefilled[rng.random_range(0..prefilled.len())];
        let first = match client % 3 {
            0 => Cursor::Start,
            1 => Cursor::AfterId(inside),
            _ => Cursor::LastEventId(inside),
        };
        let follower = Follower { client, session: 0, first, received: Received::default() };
        let (api, session, target, p) = (api.clone(), session.to_string(), target.clone(), p.clone());
        resumers.spawn(async move { resume(&api, &session, follower, target, &p, rng, deadline).await });
    }
    resumers
}

/// A cursor that is not in the log is a 409 `unknown_cursor`, by query and by header.
async fn refusals(api: &Api, session: &str, violations: &mut Violations) {
    let stranger = Ulid::new().0;
    for cursor in [Cursor::AfterId(stranger), Cursor::LastEventId(stranger)] {
        match api.stream_refusal(session, cursor).await {
            Ok((409, body)) if body.contains("unknown_cursor") => {}
            Ok((status, body)) => violations.push(format!(
                "a stream at {cursor}, which is not in the log, answered {status} {body} (expected 409 unknown_cursor)"
            )),
            Err(error) => violations.push(format!("a stream at an unknown cursor: {error:#}")),
        }
    }
}

/// Whether `received` has reached `target`, or there was nothing after its first cursor.
fn caught_up(follower: &Follower, target: Option<u128>) -> bool {
    let Some(target) = target else { return false };
    follower.received.frames.last().map_or(follower.first.id() == Some(target), |got| got.id >= target)
}

/// Connects, reads a little, drops, and resumes from the last event received (by
/// `Last-Event-ID` or `after_id`, at random), until it has the writer's last event.
async fn resume(
    api: &Api,
    session: &str,
    mut follower: Follower,
    mut target: watch::Receiver<Option<u128>>,
    p: &Params,
    mut rng: StdRng,
    deadline: Deadline,
) -> Resumer {
    let mut connections = 0;
    let stopped = |f: &Follower| f.received.error.is_some() || f.received.deadline_hit;
    while !caught_up(&follower, *target.borrow()) && !stopped(&follower) {
        let cursor = match follower.received.frames.last() {
            None => follower.first,
            Some(last) if rng.random_bool(0.5) => Cursor::LastEventId(last.id),
            Some(last) => Cursor::AfterId(last.id),
        };
        let stream = match deadline.run(api.stream(session, cursor)).await {
            None => {
                follower.received.deadline_hit = true;
                break;
            }
            Some(Err(error)) => {
                follower.received.error = Some(format!("reconnecting at {cursor}: {error:#}"));
                break;
            }
            Some(Ok(stream)) => stream,
        };
        connections += 1;
        let budget = rng.random_range(1..=p.max_events_per_connection.max(1));
        let until = Instant::now() + Duration::from_millis(rng.random_range(1..=p.max_connection_ms.max(1)));
        read_some(stream, &mut follower, &mut target, budget, until.into(), deadline).await;
        if rng.random_bool(0.3) {
            tokio::time::sleep(Duration::from_millis(rng.random_range(0..50))).await;
        }
    }
    Resumer { follower, connections }
}

/// Reads at most `budget` events, until `until`, or until caught up; then drops the
/// connection, often in the middle of a frame.
async fn read_some(
    mut stream: EventStream,
    follower: &mut Follower,
    target: &mut watch::Receiver<Option<u128>>,
    budget: usize,
    until: tokio::time::Instant,
    deadline: Deadline,
) {
    let (mut watching, mut got) = (true, 0);
    while got < budget && !caught_up(follower, *target.borrow()) {
        let received = &mut follower.received;
        tokio::select! {
            next = stream.next() => match next {
                Ok(Some(frame)) => {
                    received.frames.push(frame);
                    got += 1;
                }
                Ok(None) => received.error = Some("the server ended the stream".into()),
                Err(error) => received.error = Some(format!("{error:#}")),
            },
            _ = tokio::time::sleep_until(until) => return,
            _ = tokio::time::sleep_until(deadline.0) => received.deadline_hit = true,
            changed = target.changed(), if watching => watching = changed.is_ok(),
        }
        if received.error.is_some() || received.deadline_hit {
            return;
        }
    }
}
