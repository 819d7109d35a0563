//! `append`: durable events/s through `POST /sessions/{id}/events` from N concurrent writers
//! (each with one request in flight) over M sessions, and the acknowledgement latency.
//! Reported as a ratio of raw sled batch-append measured in the same run.
//!
//! Correctness: at the end each session's log must be `session.created` followed by exactly
//! the acknowledged events, at the sequence numbers and with the ids the acknowledgements
//! gave, each holding the text its writer sent.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use serde::{Deserialize, Serialize};
use tokio::task::JoinSet;

use super::baseline::{self, Raw};
use super::{check_alive, create_sessions, message, Ctx, Deadline, Observe, Size};
use crate::check::{Log, Violations};
use crate::client::{parse_event_id, Api};
use crate::report::Report;
use crate::stats::Latency;

#[derive(Args, Debug, Clone, Serialize)]
pub struct Params {
    /// Concurrent writers, each with one request in flight.
    #[arg(long, default_value_t = 16)]
    pub writers: usize,
    /// Sessions the writers append to (writer i uses session i mod sessions).
    #[arg(long, default_value_t = 16)]
    pub sessions: usize,
    /// Events per request.
    #[arg(long, default_value_t = 1)]
    pub events_per_request: usize,
    /// Approximate size of each stored event's JSON, in bytes.
    #[arg(long, default_value_t = 300)]
    pub event_bytes: usize,
    /// Seconds of appending.
    #[arg(long, default_value_t = 15.0)]
    pub duration: f64,
    /// Stop after this many events even if time is left.
    #[arg(long, default_value_t = 2_000_000)]
    pub count: u64,
    /// Hard stop for the whole scenario, in seconds (default: twice the duration + 60).
    #[arg(long)]
    pub deadline: Option<f64>,
    /// Do not measure raw sled alongside (then no ratio is reported).
    #[arg(long)]
    pub no_baseline: bool,
    /// Send each request with an `Idempotency-Key` of its own (what keys cost an append).
    #[arg(long)]
    pub keyed: bool,
}

impl Params {
    pub fn sized(size: Size) -> Params {
        let mut p: Params = super::defaults();
        match size {
            Size::Full => {}
            Size::Quick => p.duration = 3.0,
            Size::Tiny => {
                p.writers = 4;
                p.sessions = 2;
                p.events_per_request = 2;
                p.duration = 0.5;
                p.count = 400;
            }
        }
        p
    }
}

/// What one writer saw acknowledged.
#[derive(Default)]
struct Acks {
    session: usize,
    /// (sequence number, event id, the tag its text starts with)
    events: Vec<(u64, u128, String)>,
    latency: Latency,
    response_bytes: usize,
    error: Option<String>,
    deadline_hit: bool,
}

/// Where a writer appends, and until when.
struct Lane {
    writer: usize,
    session: usize,
    session_id: String,
    stop: Instant,
    deadline: Deadline,
    claimed: Arc<AtomicU64>,
}

pub async fn run(ctx: &Ctx, p: &Params, raw: Option<Raw>) -> anyhow::Result<Report> {
    let mut report = Report::new("append", p);
    let raw = match raw {
        Some(raw) => Some(raw),
        None if !p.no_baseline => Some(own_baseline(ctx, p, &mut report).await?),
        None => None,
    };
    let mut server = ctx.launcher.start().await?;
    let api = Api::new(&server.url);
    let deadline = Deadline::after(p.deadline.unwrap_or(p.duration * 2.0 + 60.0));
    let sessions = create_sessions(&api, p.sessions.max(1), 16, ctx.quiet).await?;

    let observe = Observe::start(&server, &api).await;
    let bar = crate::progress::timed(ctx.quiet, Duration::from_secs_f64(p.duration), "appending");
    let started = Instant::now();
    let stop = started + Duration::from_secs_f64(p.duration);
    let claimed = Arc::new(AtomicU64::new(0));
    let mut writers = JoinSet::new();
    for writer in 0..p.writers.max(1) {
        let session = writer % sessions.len();
        let session_id = sessions[session].clone();
        let lane = Lane { writer, session, session_id, stop, deadline, claimed: claimed.clone() };
        let (api, p) = (api.clone(), p.clone());
        writers.spawn(async move { write(&api, &p, lane).await });
    }
    let acks: Vec<Acks> = writers.join_all().await;
    let elapsed = started.elapsed().as_secs_f64();
    bar.finish_and_clear();
    observe.finish(&server, &api, &mut report).await;

    let mut violations = Violations::default();
    let by_session = figures(&mut report, p, raw, acks, sessions.len(), elapsed, &mut violations);
    for (session, acked) in sessions.iter().zip(by_session) {
        check_session(&api, session, acked, &mut violations).await;
    }
    report.violations.extend(violations.into_vec());
    check_alive(&mut server, &mut report);
    server.stop().await;
    Ok(report)
}

/// Raw sled with the batch size the group commit could reach at most here (every writer's
/// request in one commit), measured before the server starts.
async fn own_baseline(ctx: &Ctx, p: &Params, report: &mut Report) -> anyhow::Result<Raw> {
    let mut b = baseline::Params::sized(Size::Full);
    b.batch = p.writers * p.events_per_request;
    b.sessions = p.sessions;
    b.event_bytes = p.event_bytes;
    b.duration = p.duration.min(10.0);
    b.count = p.count;
    let (baseline, raw) = baseline::run(ctx, &b).await?;
    report.rows.extend(baseline.rows);
    report.notes.extend(baseline.notes);
    Ok(raw)
}

/// Adds the figures; answers the acknowledged events by session, for the check.
fn figures(
    report: &mut Report,
    p: &Params,
    raw: Option<Raw>,
    acks: Vec<Acks>,
    sessions: usize,
    elapsed: f64,
    violations: &mut Violations,
) -> Vec<Vec<(u64, u128, String)>> {
    let (mut latency, mut bytes) = (Latency::new(), 0);
    let mut by_session = vec![Vec::new(); sessions];
    for a in acks {
        latency.merge(&a.latency);
        bytes += a.response_bytes;
        report.deadline_hit |= a.deadline_hit;
        if let Some(error) = a.error {
            violations.push(error);
        }
        by_session[a.session].extend(a.events);
    }
    let total: usize = by_session.iter().map(Vec::len).sum();
    let rate = total as f64 / elapsed.max(1e-9);
    report.figure("durable appends", rate, "events/s");
    if let Some(raw) = raw {
        let ratio = rate / raw.append_per_sec * 100.0;
        report.at_least(&format!("appends / raw sled (batch {})", raw.batch), ratio, "%", 60.0, ">= 60%");
    }
    report.figure("ack latency p50", latency.ms(0.5), "ms");
    report.figure("ack latency p99", latency.ms(0.99), "ms");
    report.note(format!(
        "{total} events acknowledged by {} writers over {sessions} sessions, {} per request, about {} bytes each as stored",
        p.writers,
        p.events_per_request,
        bytes / total.max(1)
    ));
    by_session
}

/// One writer: one request in flight at a time until the stop time or the shared count.
async fn write(api: &Api, p: &Params, lane: Lane) -> Acks {
    let mut acks = Acks { session: lane.session, ..Acks::default() };
    let per = p.events_per_request.max(1) as u64;
    let mut request = 0;
    while Instant::now() < lane.stop && lane.claimed.fetch_add(per, Ordering::Relaxed) < p.count {
        let tags: Vec<String> = (0..per).map(|e| format!("w{}r{request}e{e}", lane.writer)).collect();
        let texts: Vec<String> = tags.iter().map(|t| message(t, p.event_bytes)).collect();
        let sent = Instant::now();
        let key = p.keyed.then(|| format!("w{}r{request}", lane.writer));
        match lane.deadline.run(api.post_events_keyed(&lane.session_id, &texts, key.as_deref())).await {
            None => acks.deadline_hit = true,
            Some(Err(error)) => acks.error = Some(format!("writer {}: {error:#}", lane.writer)),
            Some(Ok((stored, bytes))) => {
                acks.latency.record(sent.elapsed());
                acks.response_bytes += bytes;
                for (event, tag) in stored.into_iter().zip(tags) {
                    let id = parse_event_id(&event.id).unwrap_or_default();
                    acks.events.push((event.sequence_number, id, tag));
                }
            }
        }
        if acks.deadline_hit || acks.error.is_some() {
            break;
        }
        request += 1;
    }
    acks
}

#[derive(Deserialize)]
struct Stored {
    id: String,
    sequence_number: u64,
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    outcome: Option<String>,
}

/// The log must be `session.created` and then exactly the acknowledged events.
async fn check_session(api: &Api, session: &str, mut acked: Vec<(u64, u128, String)>, violations: &mut Violations) {
    let events: Vec<Stored> = match api.log_as(session).await {
        Ok(events) => events,
        Err(error) => return violations.push(format!("listing {session}: {error:#}")),
    };
    let heads: Vec<crate::client::LogEvent> = events
        .iter()
        .map(|e| crate::client::LogEvent { id: e.id.clone(), sequence_number: e.sequence_number, kind: e.kind.clone() })
        .collect();
    if !violations.check(Log::new(session, &heads).map(|_| ())) {
        return;
    }
    acked.sort_by_key(|(seq, _, _)| *seq);
    if events.len() != acked.len() + 1 || events.first().map(|e| e.kind.as_str()) != Some("session.created") {
        return violations.push(format!(
            "log of {session}: {} events, expected session.created and the {} acknowledged",
            events.len(),
            acked.len()
        ));
    }
    let by_seq: HashMap<u64, &Stored> = events.iter().map(|e| (e.sequence_number, e)).collect();
    for (seq, id, tag) in acked {
        let stored = by_seq.get(&seq);
        let ok = stored.is_some_and(|e| {
            parse_event_id(&e.id) == Some(id)
                && e.kind == "user.define_outcome"
                && e.outcome.as_deref().is_some_and(|t| t.starts_with(&format!("{tag} ")))
        });
        if !ok {
            return violations.push(format!(
                "log of {session}: the event acknowledged as sequence number {seq} ({tag}) is not what the log holds there"
            ));
        }
    }
}
