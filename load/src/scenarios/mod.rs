//! The scenarios, what they share (a server per scenario, the hard deadline, the server's
//! counters before and after), and `all`, which runs them in order and passes the raw sled
//! figures on so appends and replay are reported as ratios of them.

pub mod append;
pub mod baseline;
pub mod catchup;
pub mod connections;
pub mod fanout;
pub mod live;
pub mod model;
pub mod reconnect;
pub mod replay;
pub mod turns;

use std::future::Future;
use std::time::{Duration, Instant};

use clap::{Args, Parser, Subcommand};
use futures_util::{stream, StreamExt};

use crate::check::Log;
use crate::client::Api;
use crate::report::Report;
use crate::server::{Launcher, Metrics, Server};

/// What every scenario runs with.
pub struct Ctx {
    pub launcher: Launcher,
    /// No progress bars (tests, and output that is not a terminal anyway).
    pub quiet: bool,
}

/// Preset sizes: `Full` are the design's figures, `Quick` a pass of everything in well
/// under two minutes, `Tiny` a few seconds in total for the tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Size {
    Full,
    Quick,
    Tiny,
}

#[derive(Subcommand, Debug, Clone)]
pub enum Scenario {
    /// Durable events/s through POST /sessions/{id}/events, and ack latency.
    Append(append::Params),
    /// Raw sled batch-append (apply_batch + flush) and scan throughput, in-process.
    Baseline(baseline::Params),
    /// Turns/s and turn latency with the scripted model, per AAP stream mode.
    Turns(turns::Params),
    /// One writer, many live subscribers on one session: delivery latency.
    Fanout(fanout::Params),
    /// Many clients replaying a session from the start at once: time to caught up.
    Catchup(catchup::Params),
    /// One client replaying one large session: events/s.
    Replay(replay::Params),
    /// Many idle SSE connections: server memory per connection.
    Connections(connections::Params),
    /// Subscribers that drop at random points and resume with Last-Event-ID.
    Reconnect(reconnect::Params),
    /// What turnlog adds to a real model's stream (llama.cpp, from scripts/llama): to the
    /// first token and to each delta, through AAP and the native stream. Not part of `all`.
    Model(model::Params),
}

impl Scenario {
    pub fn name(&self) -> &'static str {
        match self {
            Scenario::Append(_) => "append",
            Scenario::Baseline(_) => "baseline",
            Scenario::Turns(_) => "turns",
            Scenario::Fanout(_) => "fanout",
            Scenario::Catchup(_) => "catchup",
            Scenario::Replay(_) => "replay",
            Scenario::Connections(_) => "connections",
            Scenario::Reconnect(_) => "reconnect",
            Scenario::Model(_) => "model",
        }
    }

    pub const NAMES: [&'static str; 8] =
        ["baseline", "append", "turns", "fanout", "catchup", "replay", "connections", "reconnect"];

    /// Every scenario at `size`, baseline first; append's baseline is the `baseline` run
    /// (with the same batch size), so `all` measures them side by side once.
    pub fn all(size: Size) -> Vec<Scenario> {
        let mut append = append::Params::sized(size);
        append.no_baseline = true;
        let mut baseline = baseline::Params::sized(size);
        baseline.batch = append.writers * append.events_per_request;
        baseline.sessions = append.sessions;
        baseline.event_bytes = append.event_bytes;
        vec![
            Scenario::Baseline(baseline),
            Scenario::Append(append),
            Scenario::Turns(turns::Params::sized(size)),
            Scenario::Fanout(fanout::Params::sized(size)),
            Scenario::Catchup(catchup::Params::sized(size)),
            Scenario::Replay(replay::Params::sized(size)),
            Scenario::Connections(connections::Params::sized(size)),
            Scenario::Reconnect(reconnect::Params::sized(size)),
        ]
    }

    /// One scenario at `size`, by name.
    pub fn named(name: &str, size: Size) -> Option<Scenario> {
        Scenario::all(size).into_iter().find(|s| s.name() == name)
    }
}

/// The 1-minute load average, to tell a quiet machine from a busy one.
pub fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg").ok()?.split_whitespace().next()?.parse().ok()
}

/// Runs `scenarios` in order; a scenario that cannot run becomes a failed report.
pub async fn run_all(ctx: &Ctx, scenarios: Vec<Scenario>) -> Vec<Report> {
    if let Some(load) = load_average().filter(|&l| l > 0.5 && !ctx.quiet) {
        eprintln!("note: the load average is {load:.2}: other work on this machine will lower the figures");
    }
    let mut reports = Vec::new();
    let mut raw: Option<baseline::Raw> = None;
    for scenario in scenarios {
        let name = scenario.name();
        if !ctx.quiet {
            eprintln!("== {name}");
        }
        let started = Instant::now();
        let result = match scenario {
            Scenario::Baseline(p) => baseline::run(ctx, &p).await.map(|(report, figures)| {
                raw = Some(figures);
                report
            }),
            Scenario::Append(p) => append::run(ctx, &p, raw).await,
            Scenario::Turns(p) => turns::run(ctx, &p).await,
            Scenario::Fanout(p) => fanout::run(ctx, &p).await,
            Scenario::Catchup(p) => catchup::run(ctx, &p).await,
            Scenario::Replay(p) => replay::run(ctx, &p, raw.map(|r| r.scan_per_sec)).await,
            Scenario::Connections(p) => connections::run(ctx, &p).await,
            Scenario::Reconnect(p) => reconnect::run(ctx, &p).await,
            Scenario::Model(p) => model::run(ctx, &p).await,
        };
        let mut report = result.unwrap_or_else(|error| Report::failed(name, &error));
        report.elapsed_secs = started.elapsed().as_secs_f64();
        reports.push(report);
    }
    reports
}

/// The defaults clap would give `T` with no flags.
pub fn defaults<T: Args>() -> T {
    #[derive(Parser)]
    struct Wrap<T: Args> {
        #[command(flatten)]
        inner: T,
    }
    Wrap::<T>::parse_from(["turnlog-load"]).inner
}

/// The hard stop of a scenario: every wait is bounded by it.
#[derive(Debug, Clone, Copy)]
pub struct Deadline(pub tokio::time::Instant);

impl Deadline {
    pub fn after(secs: f64) -> Deadline {
        Deadline(tokio::time::Instant::now() + Duration::from_secs_f64(secs.max(0.0)))
    }

    pub fn passed(&self) -> bool {
        tokio::time::Instant::now() >= self.0
    }

    /// `f`, or `None` if the deadline comes first.
    pub async fn run<F: Future>(&self, f: F) -> Option<F::Output> {
        tokio::time::timeout_at(self.0, f).await.ok()
    }
}

/// The stored JSON of a `user.define_outcome` is about this much more than its text.
pub const ENVELOPE_BYTES: usize = 256;

/// A message text that starts with `tag` and makes a stored event of about `event_bytes`.
pub fn message(tag: &str, event_bytes: usize) -> String {
    let len = event_bytes.saturating_sub(ENVELOPE_BYTES).max(tag.len() + 1);
    let mut text = String::with_capacity(len);
    text.push_str(tag);
    text.push(' ');
    while text.len() < len {
        text.push('x');
    }
    text
}

/// Creates `n` sessions, `concurrency` at a time.
pub async fn create_sessions(api: &Api, n: usize, concurrency: usize, quiet: bool) -> anyhow::Result<Vec<String>> {
    let bar = crate::progress::bar(quiet || n < 1000, n as u64, "creating sessions");
    let sessions: Vec<anyhow::Result<String>> = stream::iter(0..n)
        .map(|_| {
            let api = api.clone();
            let bar = bar.clone();
            async move {
                let session = api.create_session().await;
                bar.inc(1);
                session
            }
        })
        .buffered(concurrency.max(1))
        .collect()
        .await;
    bar.finish_and_clear();
    sessions.into_iter().collect()
}

/// Fetches and checks the log of each session, `concurrency` at a time. A malformed log
/// (or a failed fetch) is an `Err` carrying the violation.
pub async fn fetch_logs(api: &Api, sessions: &[String], concurrency: usize) -> Vec<Result<Log, String>> {
    stream::iter(sessions.iter().cloned())
        .map(|session| {
            let api = api.clone();
            async move {
                let events = api.log(&session).await.map_err(|e| format!("listing the log of {session}: {e:#}"))?;
                Log::new(&session, &events)
            }
        })
        .buffered(concurrency.max(1))
        .collect()
        .await
}

/// The server's counters and CPU time at the start of a measured phase, to report what it
/// did during it.
pub struct Observe {
    metrics: Metrics,
    server_cpu: Option<f64>,
    client_cpu: Option<f64>,
    started: Instant,
}

impl Observe {
    pub async fn start(server: &Server, api: &Api) -> Observe {
        Observe {
            metrics: api.metrics().await.unwrap_or_default(),
            server_cpu: server.cpu_seconds(),
            client_cpu: crate::server::cpu_seconds(std::process::id()),
            started: Instant::now(),
        }
    }

    /// Adds notes on CPU use and on the writer's and streams' counters since `start`.
    pub async fn finish(self, server: &Server, api: &Api, report: &mut Report) {
        self.finish_as("", server, api, report).await;
    }

    /// [`Observe::finish`], each note starting with `label` (for scenarios with phases).
    pub async fn finish_as(self, label: &str, server: &Server, api: &Api, report: &mut Report) {
        let mut notes = Report::default();
        self.notes(server, api, &mut notes).await;
        report.notes.extend(notes.notes.into_iter().map(|n| format!("{label}{n}")));
    }

    async fn notes(self, server: &Server, api: &Api, report: &mut Report) {
        let wall = self.started.elapsed().as_secs_f64().max(1e-9);
        let metrics = api.metrics().await.unwrap_or_default();
        let own = std::process::id();
        let client = crate::server::cpu_seconds(own).zip(self.client_cpu);
        match (server.cpu_seconds().zip(self.server_cpu), client) {
            (Some((s1, s0)), _) if server.pid == Some(own) => report.note(format!(
                "CPU (server in-process with the load client): {:.2} cores over {wall:.1} s",
                (s1 - s0) / wall
            )),
            (Some((s1, s0)), Some((c1, c0))) => report.note(format!(
                "CPU over {wall:.1} s: server {:.2} cores, load client {:.2} cores (2 cores in all)",
                (s1 - s0) / wall,
                (c1 - c0) / wall
            )),
            _ => {}
        }
        writer_note(&metrics, &self.metrics, wall, report);
        streams_note(&metrics, &self.metrics, report);
    }
}

fn writer_note(now: &Metrics, before: &Metrics, wall: f64, report: &mut Report) {
    let events = now.delta(before, "turnlog_events_appended_total");
    let commits = now.delta(before, "turnlog_writer_batch_events_count");
    let fsyncs = now.delta(before, "turnlog_writer_fsync_seconds_count");
    let fsync_secs = now.delta(before, "turnlog_writer_fsync_seconds_sum");
    if events <= 0.0 || commits <= 0.0 {
        return;
    }
    let mut note = format!(
        "writer: {events:.0} events in {commits:.0} group commits (mean {:.1} events per commit, {:.0} commits/s)",
        events / commits,
        commits / wall
    );
    if fsyncs > 0.0 {
        note.push_str(&format!(
            "; flush mean {:.3} ms, flushing {:.0}% of the wall time",
            fsync_secs / fsyncs * 1000.0,
            fsync_secs / wall * 100.0
        ));
    }
    report.note(note);
}

fn streams_note(now: &Metrics, before: &Metrics, report: &mut Report) {
    let replayed = now.delta(before, "turnlog_stream_events_replayed_total");
    let live = now.delta(before, "turnlog_stream_events_live_total");
    let lagged = now.delta(before, "turnlog_stream_lagged_total");
    let dropped = now.delta(before, "turnlog_stream_backlog_disconnects_total");
    if replayed + live + lagged + dropped > 0.0 {
        report.note(format!(
            "streams: {replayed:.0} events sent from the store, {live:.0} from the live bus; {lagged:.0} lagged re-reads, {dropped:.0} backlog disconnects"
        ));
    }
}

/// Fails the report if the server we started died during the scenario.
pub fn check_alive(server: &mut Server, report: &mut Report) {
    if !server.alive() {
        report.violations.push(format!("the server exited during the scenario; its log ends: {}", server.log_tail()));
    }
}
