//! `turns`: turns/s and turn latency with the scripted model (no delay), in each AAP stream
//! mode (`none`, `delta`, `message`) and through the agent harness view's turn stream
//! (`harness`); N clients, each on its own session, each with one turn in flight. The
//! scripted model answers `echo: <text>`. Each mode starts on new sessions, so that a mode
//! is not measured on histories the modes before it made long (how the rate falls as a
//! history grows is in each mode's note: its first half against its second).
//!
//! Correctness: every turn must end with `end_turn` (`done`, for the harness) and answer
//! exactly `echo: <text>` (the JSON messages in `none`, the concatenated `text_delta`s in
//! `delta`, the `text` events in `message`, between `turn_start` and `turn_stop`; the
//! `model.message.delta` contents between `turn.created` and `turn.done`, each frame with
//! a greater integer id); at the end each session's log must be well formed and hold one
//! `user.message` and one `session.status_idle` (`end_turn`) per turn.

use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use clap::Args;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::task::JoinSet;

use super::{check_alive, create_sessions, Ctx, Deadline, Observe, Size};
use crate::check::{Log, Violations};
use crate::client::{Api, EventStream, LogEvent};
use crate::report::Report;
use crate::stats::Latency;

#[derive(Args, Debug, Clone, Serialize)]
pub struct Params {
    /// Concurrent clients, each on its own session with one turn in flight.
    #[arg(long, default_value_t = 16)]
    pub clients: usize,
    /// Seconds of turns per stream mode.
    #[arg(long, default_value_t = 8.0)]
    pub duration: f64,
    /// Stop a mode after this many turns even if time is left.
    #[arg(long, default_value_t = 1_000_000)]
    pub count: u64,
    /// The AAP stream modes to measure, in order (`harness`: the harness view's stream).
    #[arg(long, value_delimiter = ',', default_value = "none,delta,message,harness")]
    pub modes: Vec<String>,
    /// Hard stop for the whole scenario, in seconds (default: modes x duration + 60).
    #[arg(long)]
    pub deadline: Option<f64>,
}

impl Params {
    pub fn sized(size: Size) -> Params {
        let mut p: Params = super::defaults();
        match size {
            Size::Full => {}
            Size::Quick => p.duration = 1.5,
            Size::Tiny => {
                p.clients = 2;
                p.duration = 0.3;
                p.count = 20;
            }
        }
        p
    }
}

#[derive(Default)]
struct Client {
    session: usize,
    turns: u64,
    /// Turns finished in the first half of the mode's time.
    first_half: u64,
    latency: Latency,
    error: Option<String>,
    deadline_hit: bool,
}

pub async fn run(ctx: &Ctx, p: &Params) -> anyhow::Result<Report> {
    let mut report = Report::new("turns", p);
    let mut server = ctx.launcher.start().await?;
    let api = Api::new(&server.url);
    let deadline = Deadline::after(p.deadline.unwrap_or(p.modes.len() as f64 * p.duration + 60.0));
    // One turn first, so a missing turn API is one clear error rather than one per client.
    let warm_up = create_sessions(&api, 1, 1, true).await?;
    turn(&api, &warm_up[0], "none", "warm up").await.context("the turn API (POST /sessions/{id}/turns)")?;
    let mut sessions_made = vec![(warm_up[0].clone(), 1u64)];
    let mut violations = Violations::default();

    for mode in &p.modes {
        let sessions = create_sessions(&api, p.clients.max(1), 16, ctx.quiet).await?;
        let mut turns_per_session = vec![0u64; sessions.len()];
        let observe = Observe::start(&server, &api).await;
        let label = format!("turns, stream {mode}");
        let bar = crate::progress::timed(ctx.quiet, Duration::from_secs_f64(p.duration), &label);
        let started = Instant::now();
        let clients = turns_in_mode(&api, &sessions, mode, p, deadline).await;
        let elapsed = started.elapsed().as_secs_f64();
        bar.finish_and_clear();
        observe.finish_as(&format!("stream {mode}: "), &server, &api, &mut report).await;
        let mut latency = Latency::new();
        let (mut turns, mut early) = (0, 0);
        for client in clients {
            latency.merge(&client.latency);
            turns += client.turns;
            early += client.first_half;
            turns_per_session[client.session] += client.turns;
            report.deadline_hit |= client.deadline_hit;
            violations.check(client.error.map_or(Ok(()), Err));
        }
        let rate = turns as f64 / elapsed.max(1e-9);
        report.at_least(&format!("stream {mode}: turns"), rate, "turns/s", 2000.0, ">= 2000 turns/s");
        report.figure(&format!("stream {mode}: turn p50"), latency.ms(0.5), "ms");
        report.figure(&format!("stream {mode}: turn p99"), latency.ms(0.99), "ms");
        report.note(format!(
            "stream {mode}: {:.0} turns/s in the first half, {:.0} in the second (each session's history grows with every turn)",
            early as f64 / (elapsed / 2.0).max(1e-9),
            (turns - early) as f64 / (elapsed / 2.0).max(1e-9)
        ));
        sessions_made.extend(sessions.into_iter().zip(turns_per_session));
    }
    report.note(format!("{} clients, each on its own session (new sessions for each mode)", p.clients.max(1)));
    for (session, turns) in &sessions_made {
        violations.check(check_log(&api, session, *turns).await);
    }
    report.violations.extend(violations.into_vec());
    check_alive(&mut server, &mut report);
    server.stop().await;
    Ok(report)
}

/// Every client takes turns on its own session in `mode` for `p.duration`.
async fn turns_in_mode(api: &Api, sessions: &[String], mode: &str, p: &Params, deadline: Deadline) -> Vec<Client> {
    let half = Instant::now() + Duration::from_secs_f64(p.duration / 2.0);
    let stop = Instant::now() + Duration::from_secs_f64(p.duration);
    let per_client = p.count.div_ceil(p.clients.max(1) as u64);
    let mut clients = JoinSet::new();
    for (c, session) in sessions.iter().enumerate() {
        let (api, session, mode) = (api.clone(), session.clone(), mode.to_string());
        clients.spawn(async move {
            let mut client = Client { session: c, ..Client::default() };
            while Instant::now() < stop && client.turns < per_client {
                let text = format!("hello from client {c} turn {}", client.turns);
                let sent = Instant::now();
                match deadline.run(turn(&api, &session, &mode, &text)).await {
                    None => client.deadline_hit = true,
                    Some(Err(error)) => client.error = Some(format!("client {c}, stream {mode}: {error:#}")),
                    Some(Ok(())) => {
                        client.latency.record(sent.elapsed());
                        client.turns += 1;
                        client.first_half += u64::from(Instant::now() < half);
                    }
                }
                if client.deadline_hit || client.error.is_some() {
                    break;
                }
            }
            client
        });
    }
    clients.join_all().await
}

/// One turn in `mode`; fails unless it ends with `end_turn` and answers `echo: <text>`.
pub async fn turn(api: &Api, session: &str, mode: &str, text: &str) -> anyhow::Result<()> {
    let (path, body) = match mode {
        "harness" => (
            format!("/v1/agents/sessions/{session}/turns"),
            json!({"input": [{"type": "user.message", "content": text}]}),
        ),
        _ => (
            format!("/sessions/{session}/turns"),
            json!({"stream": mode, "messages": [{"role": "user", "content": text}]}),
        ),
    };
    let response = api.client.request(reqwest::Method::POST, &path).json(&body).send().await?;
    let status = response.status();
    if status != 200 {
        bail!("POST {path} answered {status}: {}", crate::client::text(response).await);
    }
    let (stop, reply) = match mode {
        "none" => json_turn(response).await?,
        "harness" => harness_turn(EventStream::new(response).await?).await?,
        _ => streamed_turn(EventStream::new(response).await?, mode).await?,
    };
    let expected = format!("echo: {text}");
    if stop != "end_turn" || reply != expected {
        bail!("the turn ended with {stop:?} answering {reply:?}; expected end_turn answering {expected:?}");
    }
    Ok(())
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct TurnAnswer {
    stop_reason: String,
    messages: Vec<Value>,
}

async fn json_turn(response: reqwest::Response) -> anyhow::Result<(String, String)> {
    let answer: TurnAnswer =
        serde_json::from_slice(&response.bytes().await?).context("the answer of a turn with stream none")?;
    let mut reply = String::new();
    for message in answer.messages.iter().filter(|m| m["role"] == "assistant") {
        match &message["content"] {
            Value::String(content) => reply.push_str(content),
            Value::Array(blocks) => blocks
                .iter()
                .filter(|b| b["type"] == "text")
                .filter_map(|b| b["text"].as_str())
                .for_each(|t| reply.push_str(t)),
            _ => {}
        }
    }
    Ok((answer.stop_reason, reply))
}

async fn streamed_turn(mut events: EventStream, mode: &str) -> anyhow::Result<(String, String)> {
    let mut reply = String::new();
    let mut started = false;
    while let Some(event) = events.next_raw().await? {
        let data: Value =
            serde_json::from_str(&event.data).with_context(|| format!("the data of a `{}` event", event.event))?;
        match (event.event.as_str(), started) {
            ("turn_start", false) => started = true,
            (kind, false) => bail!("the first event was `{kind}`, not turn_start"),
            ("turn_start", true) => bail!("a second turn_start"),
            ("turn_stop", true) => {
                let stop = data["stopReason"].as_str().unwrap_or_default().to_string();
                return Ok((stop, reply));
            }
            ("text_delta", true) if mode == "delta" => {
                reply.push_str(data["delta"].as_str().ok_or_else(|| anyhow!("text_delta without delta"))?)
            }
            ("text", true) if mode == "message" => {
                reply.push_str(data["text"].as_str().ok_or_else(|| anyhow!("text without text"))?)
            }
            ("text_delta", true) | ("text", true) => {
                bail!("a `{}` event in stream mode {mode}", event.event)
            }
            _ => {}
        }
    }
    bail!("the stream ended before turn_stop")
}

/// A harness turn stream: `turn.created`, frames with increasing integer ids, the text of
/// the `model.message.delta`s, and `turn.done` (`done` reads as `end_turn`).
async fn harness_turn(mut events: EventStream) -> anyhow::Result<(String, String)> {
    let mut reply = String::new();
    let mut last_id: Option<u64> = None;
    while let Some(event) = events.next_raw().await? {
        let id: u64 = event.id.parse().with_context(|| format!("the id {:?} of a harness frame", event.id))?;
        if last_id.is_some_and(|last| id <= last) {
            bail!("frame id {id} after {last_id:?}");
        }
        let data: Value = serde_json::from_str(&event.data).context("the data of a harness frame")?;
        let kind = data["type"].as_str().unwrap_or_default();
        match (kind, last_id) {
            ("turn.created", None) => {}
            (kind, None) => bail!("the first frame was `{kind}`, not turn.created"),
            ("turn.done", Some(_)) => {
                let stop = match data["state"]["status"].as_str() {
                    Some("done") => "end_turn".to_string(),
                    other => format!("{other:?}"),
                };
                return Ok((stop, reply));
            }
            ("model.message.delta", Some(_)) => reply.push_str(data["content"].as_str().unwrap_or_default()),
            _ => {}
        }
        last_id = Some(id);
    }
    bail!("the stream ended before turn.done")
}

#[derive(Deserialize)]
struct TurnEvent {
    id: String,
    sequence_number: u64,
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    stop_reason: Option<Value>,
}

/// The log holds one user message and one `end_turn` idle per turn, and is well formed.
async fn check_log(api: &Api, session: &str, turns: u64) -> Result<(), String> {
    let events: Vec<TurnEvent> = api.log_as(session).await.map_err(|e| format!("listing {session}: {e:#}"))?;
    let heads: Vec<LogEvent> = events
        .iter()
        .map(|e| LogEvent { id: e.id.clone(), sequence_number: e.sequence_number, kind: e.kind.clone() })
        .collect();
    Log::new(session, &heads)?;
    let count = |kind: &str| events.iter().filter(|e| e.kind == kind).count() as u64;
    let ended = events
        .iter()
        .filter(|e| e.kind == "session.status_idle")
        .filter(|e| e.stop_reason.as_ref().is_some_and(|r| r["type"] == "end_turn"))
        .count() as u64;
    if count("user.message") != turns || ended != turns {
        return Err(format!(
            "log of {session}: {turns} turns answered, but {} user.message and {ended} session.status_idle (end_turn) events",
            count("user.message")
        ));
    }
    Ok(())
}
