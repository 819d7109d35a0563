//! `fanout`: one writer appending at a steady rate to one session, K SSE subscribers on it.
//! Delivery latency is measured from the append's acknowledgement (the writer records when
//! each id was acknowledged) to its receipt at each subscriber; the server broadcasts just
//! before it answers the append, so a receipt may come first and then counts as zero.
//!
//! Correctness: every subscriber (from the start of the log) must receive exactly the whole
//! log, once each, in order, up to the writer's last event.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use serde::Serialize;
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;

use super::{check_alive, fetch_logs, message, Ctx, Deadline, Observe, Size};
use crate::check::Violations;
use crate::client::{parse_event_id, Api, Cursor, Frame};
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

/// Streams being opened at once (more would overflow the listen backlog for no gain).
pub const OPENING: usize = 128;

/// What one subscriber received.
pub struct Received {
    pub frames: Vec<Frame>,
    pub error: Option<String>,
    pub deadline_hit: bool,
}

pub async fn run(ctx: &Ctx, p: &Params) -> anyhow::Result<Report> {
    let mut report = Report::new("fanout", p);
    let mut server = ctx.launcher.start().await?;
    let api = Api::new(&server.url);
    let deadline = Deadline::after(p.deadline.unwrap_or(p.duration + 120.0));
    let session = api.create_session().await?;

    let (last_tx, last_rx) = watch::channel(None::<u128>);
    let connected = Arc::new(AtomicUsize::new(0));
    let opening = Arc::new(Semaphore::new(OPENING));
    let mut subscribers = JoinSet::new();
    for _ in 0..p.subscribers {
        let (api, session, last) = (api.clone(), session.clone(), last_rx.clone());
        let (connected, opening) = (connected.clone(), opening.clone());
        subscribers.spawn(async move {
            let _permit = opening.acquire_owned().await;
            follow(&api, &session, Cursor::Start, last, deadline, move || {
                drop(_permit);
                connected.fetch_add(1, Ordering::Relaxed);
            })
            .await
        });
    }
    let all_in = wait_for(&connected, p.subscribers, deadline, ctx.quiet).await;
    if !all_in {
        report.violations.push(format!(
            "only {} of {} subscribers were connected before the deadline",
            connected.load(Ordering::Relaxed),
            p.subscribers
        ));
    }

    let observe = Observe::start(&server, &api).await;
    let bar = crate::progress::timed(ctx.quiet, Duration::from_secs_f64(p.duration), "writing");
    let written = write_at_rate(&server.url, &session, p, deadline).await;
    bar.finish_and_clear();
    let last = match written.acked.last() {
        Some(append) => Some(append.id),
        // Nothing written: the subscribers are done once they have the log as it is.
        None => api.log(&session).await?.last().and_then(|e| parse_event_id(&e.id)),
    };
    let _ = last_tx.send(last);
    let received: Vec<Received> = subscribers.join_all().await;
    observe.finish(&server, &api, &mut report).await;

    let mut violations = Violations::default();
    if let Some(error) = &written.error {
        violations.push(error.clone());
    }
    report.deadline_hit = written.deadline_hit || received.iter().any(|r| r.deadline_hit);
    let appends: HashMap<u128, Append> = written.acked.iter().map(|a| (a.id, *a)).collect();
    let (mut from_ack, mut from_send, mut early) = (Latency::new(), Latency::new(), 0u64);
    for r in &received {
        for frame in &r.frames {
            if let Some(append) = appends.get(&frame.id) {
                early += u64::from(frame.at < append.acked);
                from_ack.record(frame.at.saturating_duration_since(append.acked));
                from_send.record(frame.at.saturating_duration_since(append.sent));
            }
        }
    }
    report.figure("subscribers", p.subscribers as f64, "");
    report.figure("events written", written.acked.len() as f64, "");
    report.below("delivery p50 (from ack)", from_ack.ms(0.5), "ms", 2.0, "< 2 ms");
    report.below("delivery p99 (from ack)", from_ack.ms(0.99), "ms", 20.0, "< 20 ms");
    report.figure("delivery max (from ack)", from_ack.max_ms(), "ms");
    report.figure("delivery p50 (from append sent)", from_send.ms(0.5), "ms");
    report.figure("delivery p99 (from append sent)", from_send.ms(0.99), "ms");
    report.figure("delivery max (from append sent)", from_send.max_ms(), "ms");
    report.note(format!(
        "{} deliveries; {early} ({:.0}%) arrived before the writer had its acknowledgement (the server broadcasts, then answers) and count as 0 from the ack; 'from append sent' includes the durable commit. Writer {:.1} events/s, ack p50 {:.2} ms, p99 {:.2} ms",
        from_ack.count(),
        early as f64 * 100.0 / from_ack.count().max(1) as f64,
        written.acked.len() as f64 / written.elapsed.max(1e-9),
        written.latency.ms(0.5),
        written.latency.ms(0.99)
    ));

    match fetch_logs(&api, std::slice::from_ref(&session), 1).await.remove(0) {
        Err(violation) => violations.push(violation),
        Ok(log) => {
            for (i, r) in received.iter().enumerate() {
                let ids: Vec<u128> = r.frames.iter().map(|f| f.id).collect();
                if let Some(error) = &r.error {
                    violations.push(format!("subscriber {i}: {error}"));
                }
                violations.check(log.check(&format!("subscriber {i}"), None, &ids));
            }
        }
    }
    report.violations.extend(violations.into_vec());
    check_alive(&mut server, &mut report);
    server.stop().await;
    Ok(report)
}

/// Waits until `target` subscribers have their first event, or the deadline.
pub async fn wait_for(count: &AtomicUsize, target: usize, deadline: Deadline, quiet: bool) -> bool {
    let bar = crate::progress::bar(quiet || target < 500, target as u64, "connecting");
    loop {
        let now = count.load(Ordering::Relaxed);
        bar.set_position(now as u64);
        if now >= target {
            bar.finish_and_clear();
            return true;
        }
        if deadline.passed() {
            bar.finish_and_clear();
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Reads a stream from `cursor` until it has the event `last` names (once the writer has
/// set it), the stream fails, or the deadline. `on_first` runs at the first event.
pub async fn follow(
    api: &Api,
    session: &str,
    cursor: Cursor,
    mut last: watch::Receiver<Option<u128>>,
    deadline: Deadline,
    on_first: impl FnOnce(),
) -> Received {
    let mut received = Received { frames: Vec::new(), error: None, deadline_hit: false };
    let mut stream = match deadline.run(api.stream(session, cursor)).await {
        None => {
            received.deadline_hit = true;
            return received;
        }
        Some(Err(error)) => {
            received.error = Some(format!("{error:#}"));
            return received;
        }
        Some(Ok(stream)) => stream,
    };
    let mut on_first = Some(on_first);
    let mut watching = true;
    loop {
        let target = *last.borrow();
        if let (Some(target), Some(got)) = (target, received.frames.last()) {
            if got.id >= target {
                return received;
            }
        }
        tokio::select! {
            next = deadline.run(stream.next()) => match next {
                None => {
                    received.deadline_hit = true;
                    return received;
                }
                Some(Ok(Some(frame))) => {
                    received.frames.push(frame);
                    if let Some(first) = on_first.take() {
                        first();
                    }
                }
                Some(Ok(None)) => {
                    received.error = Some("the server ended the stream".into());
                    return received;
                }
                Some(Err(error)) => {
                    received.error = Some(format!("{error:#}"));
                    return received;
                }
            },
            changed = last.changed(), if watching => watching = changed.is_ok(),
        }
    }
}

/// One append: the event's id, when the request was sent, and when its acknowledgement
/// arrived.
#[derive(Debug, Clone, Copy)]
pub struct Append {
    pub id: u128,
    pub sent: Instant,
    pub acked: Instant,
}

#[derive(Default)]
pub struct Written {
    /// Every acknowledged append, in order.
    pub acked: Vec<Append>,
    pub latency: Latency,
    pub elapsed: f64,
    pub error: Option<String>,
    pub deadline_hit: bool,
}

/// Appends one event at a time at `p.rate` for `p.duration` (at most `p.count`), on a
/// thread and runtime of its own, so the acknowledgement times are not delayed behind the
/// subscribers' work in the load client.
pub async fn write_at_rate(url: &str, session: &str, p: &Params, deadline: Deadline) -> Written {
    let (url, session, p) = (url.to_string(), session.to_string(), p.clone());
    let writer = std::thread::spawn(move || {
        let runtime =
            tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime for the writer");
        runtime.block_on(async move {
            let api = Api::new(&url);
            rate_writer(&api, &session, p.rate, p.duration, p.count, p.event_bytes, deadline).await
        })
    });
    tokio::task::spawn_blocking(move || writer.join())
        .await
        .ok()
        .and_then(Result::ok)
        .unwrap_or_else(|| Written { error: Some("the writer thread panicked".into()), ..Written::default() })
}

pub async fn rate_writer(
    api: &Api,
    session: &str,
    rate: f64,
    duration: f64,
    count: u64,
    event_bytes: usize,
    deadline: Deadline,
) -> Written {
    let mut written =
        Written { acked: Vec::new(), latency: Latency::new(), elapsed: 0.0, error: None, deadline_hit: false };
    let started = Instant::now();
    let stop = started + Duration::from_secs_f64(duration);
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate.max(0.001)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut n = 0u64;
    while n < count {
        tick.tick().await;
        if Instant::now() >= stop {
            break;
        }
        let text = message(&format!("fan{n}"), event_bytes);
        let sent = Instant::now();
        match deadline.run(api.post_messages(session, &[text])).await {
            None => {
                written.deadline_hit = true;
                break;
            }
            Some(Err(error)) => {
                written.error = Some(format!("the writer: {error:#}"));
                break;
            }
            Some(Ok((stored, _))) => {
                let acked = Instant::now();
                written.latency.record(acked - sent);
                let id = parse_event_id(&stored[0].id).unwrap_or_default();
                written.acked.push(Append { id, sent, acked });
            }
        }
        n += 1;
    }
    written.elapsed = started.elapsed().as_secs_f64();
    written
}
