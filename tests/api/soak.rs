//! The soak test (issue 15): mixed load against the real binary, which is SIGKILLed at a
//! random moment of every cycle and started again on the same data dir.
//!
//! The load of a cycle, all at once until the kill ends it (each client ends at its first
//! connection error once the server is killed; before that, any failure is the test's):
//! - appenders post batches of 1 to 5 `user.define_outcome` events to a few sessions;
//! - one turn driver per AAP stream mode (`none`, `delta`, `message`), each on its own
//!   session, runs turns of the scripted model one after another;
//! - subscribers follow the append and turn sessions' native streams, each dropping its
//!   connection every few events and resuming with `Last-Event-ID` (across kills too);
//! - one `turnlog acp --server URL` process, driven over stdio with JSON-RPC, prompts its
//!   session (made in the first cycle, loaded with `session/load` in the later ones);
//! - a deleter creates sessions and deletes them (some only in the next cycle).
//!
//! After every restart: every acknowledged event is in its log with the very bytes it was
//! acknowledged with; every log's sequence numbers are 1..n and its ids increase; its hash
//! chain, recomputed here from the export, ends at the head the audit route verifies; what
//! every subscriber received (over all its connections) is a gapless, duplicate-free run of
//! its log after its first cursor, byte for byte; every acknowledged turn (AAP or ACP) is in
//! its log, ended `end_turn`; no turn is left running (in the log, and in the session's
//! status); an acknowledged delete stayed done, and a created session whose delete was not
//! sent is still there. Each cycle then runs turns again on the same sessions.
//!
//! `TURNLOG_SOAK_CYCLES` (default 20) kills, each after a random moment within
//! `TURNLOG_SOAK_MS` (default 400) of load; `TURNLOG_SOAK_SEED` repeats a run's choices
//! (the scheduling is the machine's). Each cycle prints one line of figures.
//!
//! The clients and the checks take a list of nodes: `soak_cluster.rs` runs the same load
//! over three nodes on one JetStream log.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::future::Future;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::{Stream, StreamExt};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::helpers::{list_events, spawn_app, TestApp};

pub(super) const APPEND_SESSIONS: usize = 3;
pub(super) const APPENDERS: usize = 4;
pub(super) const MODES: [&str; 3] = ["none", "delta", "message"];
/// The longest wait for one frame of a stream while the load runs (events keep coming).
const FRAME_WAIT: Duration = Duration::from_secs(60);
/// The longest wait for the load to be under way, and for the clients to end after a kill.
const WAIT: Duration = Duration::from_secs(60);
/// How many refusals in the aftermath of a nats-server's failover the clients of a cycle go
/// on after (see [`Cycle::refused`]).
const AFTERMATH_RETRIES: usize = 20;

pub(super) fn env_number(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(value) => value.parse().unwrap_or_else(|_| panic!("{name}={value:?} is not a number")),
        Err(_) => default,
    }
}

pub(super) fn client() -> reqwest::Client {
    reqwest::Client::builder().pool_max_idle_per_host(8).build().expect("http client")
}

/// What the clients of one cycle share with the test: the nodes' addresses (one, for the
/// single-node soak), which was killed, and how far the load has got.
pub(super) struct Cycle {
    pub number: usize,
    pub urls: Vec<String>,
    /// Whether several nodes share the log: once one is killed, the others may refuse a
    /// request (503) while they take its sessions over (and resume their turns).
    failover: bool,
    killed: AtomicBool,
    /// The node killed (its index in `urls`), once `killed`.
    victim: AtomicUsize,
    /// Whether a nats-server was killed too: then a survivor's stream may end, what it
    /// read from the log having failed while the log's streams failed over.
    server_killed: AtomicBool,
    /// Whether the cycle before killed a nats-server (see [`Cycle::refused`]).
    aftermath: AtomicBool,
    /// The refusals clients went on after, in this cycle.
    pub retried: AtomicUsize,
    /// Cancelled to end the clients still going (the survivors of a node's kill).
    stop: CancellationToken,
    pub appended: AtomicUsize,
    pub subscribed: AtomicUsize,
    pub turning: AtomicUsize,
    pub acp_ready: AtomicBool,
    /// How the clients ended after the kill: a connection to the killed node failed; a
    /// survivor refused (503); still going when stopped.
    pub ended_cut: AtomicUsize,
    pub ended_refused: AtomicUsize,
    pub ended_stopped: AtomicUsize,
    /// Appends answered 504 (stored or not, not known yet): sent again with their keys.
    pub ended_unknown: AtomicUsize,
}

impl Cycle {
    pub fn new(number: usize, urls: Vec<String>) -> Arc<Cycle> {
        Arc::new(Cycle {
            number,
            failover: urls.len() > 1,
            urls,
            killed: AtomicBool::new(false),
            victim: AtomicUsize::new(usize::MAX),
            server_killed: AtomicBool::new(false),
            aftermath: AtomicBool::new(false),
            retried: AtomicUsize::new(0),
            stop: CancellationToken::new(),
            appended: AtomicUsize::new(0),
            subscribed: AtomicUsize::new(0),
            turning: AtomicUsize::new(0),
            acp_ready: AtomicBool::new(false),
            ended_cut: AtomicUsize::new(0),
            ended_refused: AtomicUsize::new(0),
            ended_stopped: AtomicUsize::new(0),
            ended_unknown: AtomicUsize::new(0),
        })
    }

    fn url(&self, node: usize) -> &str {
        &self.urls[node]
    }

    /// Node `node` is about to be killed: from now on its clients' connections may fail.
    pub fn kill(&self, node: usize) {
        self.victim.store(node, Ordering::SeqCst);
        self.killed.store(true, Ordering::SeqCst);
    }

    /// The cycle before killed a nats-server: see [`Cycle::refused`].
    pub fn after_server_kill(&self) {
        self.aftermath.store(true, Ordering::SeqCst);
    }

    /// A nats-server is about to be killed too (with the node, see [`Cycle::kill`]).
    pub fn kill_server(&self) {
        self.server_killed.store(true, Ordering::SeqCst);
    }

    /// Ends the clients still going.
    pub fn stop(&self) {
        self.stop.cancel();
    }

    /// Whether the cycle has stopped its clients (not counted as a client's end).
    pub fn is_stopped(&self) -> bool {
        self.stop.is_cancelled()
    }

    /// `work`, unless the cycle stops first (not counted as a client's end).
    pub async fn until_stopped<T>(&self, work: impl Future<Output = T>) -> Option<T> {
        tokio::select! {
            biased;
            _ = self.stop.cancelled() => None,
            done = work => Some(done),
        }
    }

    /// A node chosen at random among those not killed in this cycle.
    pub fn live_node(&self, rng: &mut StdRng) -> usize {
        let killed = self.killed.load(Ordering::SeqCst).then(|| self.victim.load(Ordering::SeqCst));
        let live: Vec<usize> = (0..self.urls.len()).filter(|n| Some(*n) != killed).collect();
        live[rng.random_range(0..live.len())]
    }

    /// A client's connection to `node` failed: the expected end of it once that node was
    /// killed, a failure of the test before (or on another node).
    fn cut(&self, node: usize, what: impl std::fmt::Display) {
        let up = if self.urls.len() == 1 { "the server".to_string() } else { format!("node {node}") };
        let killed = self.killed.load(Ordering::SeqCst) && self.victim.load(Ordering::SeqCst) == node;
        assert!(killed, "cycle {}: {what}, with {up} still up", self.number);
        self.ended_cut.fetch_add(1, Ordering::SeqCst);
    }

    /// A client got a failure from `node` that, with several nodes, the kill of another
    /// explains (an error answer); with one node, only that
    /// node's death does.
    fn failed_over(&self, node: usize, what: impl std::fmt::Display) {
        if self.failover && self.killed.load(Ordering::SeqCst) {
            self.ended_refused.fetch_add(1, Ordering::SeqCst);
        } else {
            self.cut(node, what);
        }
    }

    /// A stream from `node` ended before it was done (an SSE body cut): with several nodes,
    /// the failover of a killed nats-server explains it; otherwise only `node`'s death does.
    fn ended(&self, node: usize, what: impl std::fmt::Display) {
        if self.failover && self.server_killed.load(Ordering::SeqCst) && self.killed.load(Ordering::SeqCst) {
            self.ended_refused.fetch_add(1, Ordering::SeqCst);
        } else {
            self.cut(node, what);
        }
    }

    /// A request was answered `status` (with `body`), not the success expected. After a
    /// kill, a survivor's 503 (the failover docs/cluster.md describes), or its 409 for an append
    /// that raced another node's as the killed node's sessions changed hands, ends the
    /// client: false. In the cycle after a nats-server's kill, a 503 is that failover's
    /// aftermath (docs/cluster.md: a request the engine still does not answer after a node's retry
    /// window is answered 503, and nothing acknowledged is lost; a stream can take longer
    /// than that to settle on a loaded machine, and a node checks where each append landed,
    /// one more request that can time out): the client goes on (true), up to
    /// `AFTERMATH_RETRIES` times a cycle. Anything else fails.
    fn refused(&self, node: usize, status: u16, body: &str, what: impl std::fmt::Display) -> bool {
        let killed = self.killed.load(Ordering::SeqCst);
        let raced = status == 409 && body.contains("another node appended");
        // 503: not stored; 504: not known, which the writer's key makes safe to send again.
        if self.failover && killed && (status == 503 || status == 504 || raced) {
            self.ended_refused.fetch_add(1, Ordering::SeqCst);
            return false;
        }
        if matches!(status, 503 | 504) && self.aftermath_refusal() {
            return true;
        }
        let when = if killed { "after the kill" } else { "before the kill" };
        panic!("cycle {}: {what} (node {node} answered {status}, {when})", self.number);
    }

    /// Whether a 503 before the kill is the aftermath of the last cycle's failover (see
    /// [`Cycle::refused`]), and the client goes on.
    fn aftermath_refusal(&self) -> bool {
        let aftermath = self.failover && !self.killed.load(Ordering::SeqCst) && self.aftermath.load(Ordering::SeqCst);
        aftermath && self.retried.fetch_add(1, Ordering::SeqCst) < AFTERMATH_RETRIES
    }

    /// Whether the clients were told to stop: then they end before their next request.
    fn stopped(&self) -> bool {
        if self.stop.is_cancelled() {
            self.ended_stopped.fetch_add(1, Ordering::SeqCst);
            return true;
        }
        false
    }

    /// `work`, unless the clients are told to stop first (`None`: what it did is unknown).
    async fn unless_stopped<T>(&self, work: impl Future<Output = T>) -> Option<T> {
        tokio::select! {
            biased;
            _ = self.stop.cancelled() => {
                self.ended_stopped.fetch_add(1, Ordering::SeqCst);
                None
            }
            done = work => Some(done),
        }
    }
}

/// One acknowledged event: its session, id, sequence number and the bytes acknowledged.
#[derive(Clone)]
pub(super) struct Acked {
    session: String,
    id: String,
    seq: u64,
    raw: String,
}

#[derive(Deserialize)]
struct Posted<'a> {
    #[serde(borrow)]
    data: Vec<&'a RawValue>,
}

/// What an appender had acknowledged when the kill ended it.
#[derive(Default)]
pub(super) struct Appended {
    pub acked: Vec<Acked>,
    pub requests: usize,
    /// The batch whose answer the kill cut off (or that was answered 504: its fate not
    /// known): sent again with its key once the nodes are back, and then acknowledged.
    pub cut: Option<Keyed>,
    /// Batches answered 503, which their logs must not hold.
    pub refused: Vec<(String, Vec<String>)>,
}

/// An appender's batch, with the idempotency key it was sent with.
#[derive(Clone)]
pub(super) struct Keyed {
    pub session: String,
    pub key: String,
    pub body: Value,
    pub outcomes: Vec<String>,
}

impl Keyed {
    /// Sends the batch again through `urls` (a node at random each time) until it is
    /// answered 200, within `within`: its events, acknowledged.
    pub async fn resend(&self, urls: &[String], within: Duration, rng: &mut StdRng) -> Vec<Acked> {
        let client = client();
        let deadline = Instant::now() + within;
        loop {
            let url = &urls[rng.random_range(0..urls.len())];
            let sent = client
                .post(format!("{url}/sessions/{}/events", self.session))
                .header("Idempotency-Key", &self.key)
                .json(&self.body)
                .send()
                .await;
            let answer = match sent {
                Ok(response) => Some((response.status().as_u16(), response.text().await.unwrap_or_default())),
                Err(_) => None,
            };
            match answer {
                Some((200, body)) => return self.acknowledged(&body),
                Some((status, body)) if !matches!(status, 409 | 503 | 504) => {
                    panic!("{}: the batch sent again with its key answered {status}: {body}", self.key)
                }
                _ => assert!(Instant::now() < deadline, "{}: not answered 200 within {within:?}", self.key),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The events of an answer to this batch, checked against what was sent.
    pub fn acknowledged(&self, body: &str) -> Vec<Acked> {
        let posted: Posted = serde_json::from_str(body).expect("the answer is JSON");
        assert_eq!(posted.data.len(), self.outcomes.len(), "{}: every event is acknowledged: {body}", self.key);
        let acked = posted.data.iter().zip(&self.outcomes).map(|(raw, outcome)| {
            let event: Value = serde_json::from_str(raw.get()).unwrap();
            assert_eq!(event["outcome"], outcome.as_str(), "the acknowledged event is the one sent");
            assert_eq!(event["session_id"], self.session.as_str());
            Acked {
                session: self.session.clone(),
                id: event["id"].as_str().unwrap().to_string(),
                seq: event["sequence_number"].as_u64().unwrap(),
                raw: raw.get().to_string(),
            }
        });
        acked.collect()
    }
}

/// Appends through `node` until its first failure after the kill (or the stop).
pub(super) async fn append(
    cycle: Arc<Cycle>,
    w: usize,
    node: usize,
    sessions: Vec<String>,
    mut rng: StdRng,
) -> Appended {
    let client = client();
    let mut done = Appended::default();
    let mut i = 0;
    loop {
        if cycle.stopped() {
            return done;
        }
        i += 1;
        let session = &sessions[(w + i) % sessions.len()];
        let n = rng.random_range(1..=5);
        let outcomes: Vec<String> =
            (0..n).map(|k| format!("c{}-w{w}-{i}-{k}-{}", cycle.number, "x".repeat(rng.random_range(0..80)))).collect();
        let events: Vec<Value> =
            outcomes.iter().map(|o| json!({"type": "user.define_outcome", "outcome": o})).collect();
        // Every batch is keyed: one whose answer is lost is sent again after the cycle.
        let key = format!("c{}-w{w}-{i}", cycle.number);
        let batch = Keyed { session: session.clone(), key, body: json!({"events": events}), outcomes };
        let url = cycle.url(node);
        let sent = client
            .post(format!("{url}/sessions/{session}/events"))
            .header("Idempotency-Key", &batch.key)
            .json(&batch.body)
            .send();
        let response = match cycle.unless_stopped(sent).await {
            None => return done,
            Some(Ok(response)) => response,
            Some(Err(error)) => {
                cycle.cut(node, format!("appender {w}: {error}"));
                done.cut = Some(batch);
                return done;
            }
        };
        let status = response.status();
        let body = match cycle.unless_stopped(response.text()).await {
            None => return done,
            Some(Ok(body)) => body,
            Some(Err(error)) => {
                cycle.cut(node, format!("appender {w}: reading the answer: {error}"));
                done.cut = Some(batch);
                return done;
            }
        };
        match status.as_u16() {
            200 => {}
            // Stored or not, nobody knows yet: sent again with its key after the cycle.
            504 => {
                cycle.ended_unknown.fetch_add(1, Ordering::SeqCst);
                done.cut = Some(batch);
                return done;
            }
            status => {
                if status == 503 {
                    done.refused.push((batch.session.clone(), batch.outcomes.clone()));
                }
                if cycle.refused(node, status, &body, format!("appender {w}: {session}: {body}")) {
                    continue;
                }
                return done;
            }
        }
        done.acked.extend(batch.acknowledged(&body));
        done.requests += 1;
        cycle.appended.fetch_add(n, Ordering::SeqCst);
    }
}

/// One SSE frame, its data as the bytes sent.
struct Frame {
    id: String,
    event: String,
    data: String,
}

/// The complete frames of an SSE body, read by hand: a frame cut by the kill (no blank line
/// after it) is never handed out, and an error or the end of the body is `None`.
struct Frames<S> {
    body: S,
    buffer: Vec<u8>,
}

impl<S: Stream<Item = reqwest::Result<bytes::Bytes>> + Unpin> Frames<S> {
    async fn next(&mut self) -> Option<Frame> {
        loop {
            if let Some(end) = self.buffer.windows(2).position(|w| w == b"\n\n") {
                let block: Vec<u8> = self.buffer.drain(..end + 2).collect();
                let text = std::str::from_utf8(&block[..end]).expect("a complete frame is UTF-8");
                let mut frame = Frame { id: String::new(), event: String::new(), data: String::new() };
                let mut fields = 0;
                for line in text.lines() {
                    if line.starts_with(':') {
                        continue;
                    }
                    let (name, value) = line.split_once(": ").unwrap_or((line, ""));
                    match name {
                        "id" => frame.id = value.to_string(),
                        "event" => frame.event = value.to_string(),
                        "data" => frame.data = value.to_string(),
                        // How long a browser waits to reconnect: nothing for this reader.
                        "retry" => continue,
                        other => panic!("an SSE field {other:?} in {text:?}"),
                    }
                    fields += 1;
                }
                if fields > 0 {
                    return Some(frame);
                }
                continue;
            }
            match self.body.next().await {
                Some(Ok(chunk)) => self.buffer.extend_from_slice(&chunk),
                _ => return None,
            }
        }
    }
}

fn frames(response: reqwest::Response) -> Frames<impl Stream<Item = reqwest::Result<bytes::Bytes>> + Unpin> {
    Frames { body: Box::pin(response.bytes_stream()), buffer: Vec::new() }
}

/// A reader of a session's native stream, across its reconnects and the server's restarts.
pub(super) struct Subscriber {
    name: String,
    session: String,
    /// Its first cursor (`None`: the start of the log).
    start: Option<String>,
    /// Every event received: id and data, as sent.
    pub got: Vec<(String, String)>,
    pub reconnects: usize,
}

impl Subscriber {
    pub fn new(name: String, session: String, start: Option<String>) -> Subscriber {
        Subscriber { name, session, start, got: vec![], reconnects: 0 }
    }

    fn cursor(&self) -> Option<String> {
        self.got.last().map(|(id, _)| id.clone()).or_else(|| self.start.clone())
    }

    async fn open(&self, client: &reqwest::Client, url: &str) -> reqwest::Result<reqwest::Response> {
        // Every event as logged: the stream's default merges deltas.
        let mut request =
            client.get(format!("{url}/sessions/{}/events/stream?delta_flush_interval_ms=0", self.session));
        if let Some(cursor) = self.cursor() {
            request = request.header("Last-Event-ID", cursor);
        }
        request.send().await
    }

    fn take(&mut self, frame: Frame) {
        assert!(!frame.id.is_empty(), "{}: a native frame has an id ({})", self.name, frame.data);
        self.got.push((frame.id, frame.data));
    }
}

/// Follows the session's stream from `node`, resuming every few events with
/// `Last-Event-ID` on a node chosen at random among the others (the same one, alone).
pub(super) async fn subscribe(cycle: Arc<Cycle>, mut sub: Subscriber, mut node: usize, mut rng: StdRng) -> Subscriber {
    let client = client();
    let nodes = cycle.urls.len();
    let mut opened = false;
    loop {
        if cycle.stopped() {
            return sub;
        }
        let response = match cycle.unless_stopped(sub.open(&client, cycle.url(node))).await {
            None => return sub,
            Some(Ok(response)) => response,
            Some(Err(error)) => {
                cycle.cut(node, format!("{}: {error}", sub.name));
                return sub;
            }
        };
        let status = response.status();
        if status != 200 {
            let body = response.text().await.unwrap_or_default();
            let what = format!("{}: the stream after {:?} answered {status}: {body}", sub.name, sub.cursor());
            if cycle.refused(node, status.as_u16(), &body, what) {
                continue;
            }
            return sub;
        }
        if !opened {
            opened = true;
            cycle.subscribed.fetch_add(1, Ordering::SeqCst);
        }
        let mut stream = frames(response);
        for _ in 0..rng.random_range(1..=8) {
            let frame = match cycle.unless_stopped(tokio::time::timeout(FRAME_WAIT, stream.next())).await {
                None => return sub,
                Some(frame) => frame,
            };
            let frame = frame.unwrap_or_else(|_| panic!("{}: no event for {FRAME_WAIT:?} under load", sub.name));
            match frame {
                Some(frame) => sub.take(frame),
                None => {
                    cycle.ended(node, format!("{}: the stream ended", sub.name));
                    return sub;
                }
            }
        }
        sub.reconnects += 1;
        if nodes > 1 {
            node = (node + rng.random_range(1..nodes)) % nodes;
        }
    }
}

/// A client of the AAP turn API, in one stream mode, on its own session.
pub(super) struct Driver {
    pub mode: &'static str,
    pub session: String,
    /// The replies of the turns whose end it was told of.
    pub acked: Vec<String>,
    /// Turns it sent whose answer the kill cut off.
    pub cut: usize,
    sent: usize,
}

impl Driver {
    pub fn new(mode: &'static str, session: String) -> Driver {
        Driver { mode, session, acked: vec![], cut: 0, sent: 0 }
    }
}

fn prompt(marker: &str) -> (String, String) {
    let words = "alpha beta gamma delta epsilon zeta eta theta";
    (format!("/delay 3\nsoak {marker} {words}"), format!("echo: soak {marker} {words}"))
}

/// Runs turns through `node` one after another until its first failure after the kill.
pub(super) async fn drive(cycle: Arc<Cycle>, mut driver: Driver, node: usize) -> Driver {
    let client = client();
    let mode = driver.mode;
    let mut first = true;
    loop {
        if cycle.stopped() {
            return driver;
        }
        driver.sent += 1;
        let marker = format!("{mode}-c{}-{}", cycle.number, driver.sent);
        let (mut content, expected) = prompt(&marker);
        if mode == "message" {
            content = format!("/think about {marker}\n{content}");
        }
        let body = json!({"stream": mode, "messages": [{"role": "user", "content": content}]});
        if first {
            first = false;
            cycle.turning.fetch_add(1, Ordering::SeqCst);
        }
        let url = cycle.url(node);
        let key = format!("turn-{}-{marker}", driver.session);
        let sent =
            client.post(format!("{url}/sessions/{}/turns", driver.session)).header("Idempotency-Key", key).json(&body);
        let response = match cycle.unless_stopped(sent.send()).await {
            None => {
                driver.cut += 1;
                return driver;
            }
            Some(Ok(response)) => response,
            Some(Err(error)) => {
                driver.cut += 1;
                cycle.cut(node, format!("turn driver {mode}: {error}"));
                return driver;
            }
        };
        let status = response.status();
        if status != 200 {
            let body = response.text().await.unwrap_or_default();
            let what = format!("turn driver {mode}: a turn on {}: {body}", driver.session);
            if cycle.refused(node, status.as_u16(), &body, what) {
                continue;
            }
            driver.cut += 1;
            return driver;
        }
        // The turn's end as told, if it was: whether it ended `end_turn`.
        let ended = match mode {
            "none" => match cycle.unless_stopped(response.json::<Value>()).await {
                None => {
                    driver.cut += 1;
                    return driver;
                }
                Some(Ok(answer)) => {
                    let whole =
                        json!({"stopReason": "end_turn", "messages": [{"role": "assistant", "content": expected}]});
                    if cycle.failover && answer["stopReason"] != "end_turn" {
                        Some(false)
                    } else {
                        assert_eq!(answer, whole, "turn driver none");
                        Some(true)
                    }
                }
                Some(Err(_)) => None,
            },
            _ => {
                let mut stream = frames(response);
                let mut seen = Vec::new();
                loop {
                    let frame = match cycle.unless_stopped(tokio::time::timeout(FRAME_WAIT, stream.next())).await {
                        None => {
                            driver.cut += 1;
                            return driver;
                        }
                        Some(frame) => frame,
                    };
                    match frame.unwrap_or_else(|_| panic!("turn driver {mode}: no frame for {FRAME_WAIT:?}")) {
                        Some(frame) => seen.push(frame),
                        None => break,
                    }
                }
                match seen.last() {
                    Some(last) if last.event == "turn_stop" => {
                        let stop: Value = serde_json::from_str(&last.data).expect("turn_stop's data is JSON");
                        if cycle.failover && stop["stopReason"] != "end_turn" {
                            Some(false)
                        } else {
                            check_turn_frames(mode, &marker, &expected, &seen, cycle.failover);
                            Some(true)
                        }
                    }
                    _ => None,
                }
            }
        };
        match ended {
            Some(true) => driver.acked.push(expected),
            Some(false) => {
                driver.cut += 1;
                cycle.failed_over(node, format!("turn driver {mode}: the turn ended, not end_turn"));
                return driver;
            }
            None => {
                driver.cut += 1;
                cycle.ended(node, format!("turn driver {mode}: the turn's answer was cut"));
                return driver;
            }
        }
    }
}

/// A turn's AAP stream: its frames, and what they say. With several nodes, a turn whose node
/// died mid-reply is resumed on another one: a stream through a survivor has sent the cut
/// attempts' deltas (AAP has no way to take them back) before the whole reply's.
fn check_turn_frames(mode: &str, marker: &str, expected: &str, seen: &[Frame], resumable: bool) {
    let data = |f: &Frame| -> Value { serde_json::from_str(&f.data).expect("frame data is JSON") };
    let names: Vec<&str> = seen.iter().map(|f| f.event.as_str()).collect();
    assert_eq!(names.first(), Some(&"turn_start"), "{mode}: {names:?}");
    assert_eq!(data(seen.last().unwrap()), json!({"stopReason": "end_turn"}), "{mode}");
    if mode == "delta" {
        assert!(names[1..names.len() - 1].iter().all(|n| *n == "text_delta"), "{mode}: {names:?}");
        let text: String = seen
            .iter()
            .filter(|f| f.event == "text_delta")
            .map(|f| data(f)["delta"].as_str().unwrap().to_string())
            .collect();
        if !(resumable && after_cut_attempts(&text, expected)) {
            assert_eq!(text, expected, "the deltas make the reply");
        }
    } else {
        assert_eq!(names, ["turn_start", "thinking", "text", "turn_stop"], "{mode}");
        assert_eq!(data(&seen[1]), json!({"thinking": format!("about {marker}")}));
        assert_eq!(data(&seen[2]), json!({"text": expected}));
    }
}

/// The ACP client's state across cycles: its session and the replies of its answered prompts.
#[derive(Default)]
pub(super) struct AcpClient {
    session: Option<String>,
    pub acked: Vec<String>,
    sent: usize,
    cut: usize,
}

/// The pipes of one `turnlog acp --server URL` process (which the test holds, to kill it).
pub(super) struct AcpProcess {
    stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
    next_id: u64,
    /// The text of the `agent_message_chunk` updates since the last request, by message id
    /// in the order the messages began.
    chunks: Vec<(String, String)>,
}

/// Why a call got no result.
#[derive(Debug)]
enum Failed {
    /// The process's pipes closed (it was killed).
    Gone,
    /// A JSON-RPC error answer.
    Error(Value),
}

impl AcpProcess {
    /// Checks that the last prompt's chunks said `expected`: one message, or (when a node's
    /// death cut a reply and the turn was resumed on another node) cut attempts that each
    /// said a beginning of it, each under its own message id, and then all of it.
    fn said(&self, expected: &str) {
        let Some(((_, reply), cut)) = self.chunks.split_last() else { panic!("acp: no reply streamed") };
        assert_eq!(reply, expected, "acp: the streamed reply");
        for (id, text) in cut {
            assert!(
                expected.starts_with(text.as_str()),
                "acp: message {id} is not a cut attempt of the reply: {text:?}"
            );
        }
    }

    pub fn spawn(url: &str, log: &std::path::Path) -> (Child, AcpProcess) {
        let mut child = Command::new(env!("CARGO_BIN_EXE_turnlog"))
            .args(["acp", "--server", url])
            .env("RUST_LOG", "warn")
            .env_remove("TURNLOG_API_KEY")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(std::fs::File::create(log).expect("acp log")))
            .kill_on_drop(true)
            .spawn()
            .expect("spawn turnlog acp");
        let stdin = child.stdin.take().unwrap();
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        (child, AcpProcess { stdin, lines, next_id: 0, chunks: Vec::new() })
    }

    async fn call(&mut self, method: &str, params: Value) -> Result<Value, Failed> {
        self.next_id += 1;
        let id = self.next_id;
        self.chunks.clear();
        let line = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string() + "\n";
        if self.stdin.write_all(line.as_bytes()).await.is_err() || self.stdin.flush().await.is_err() {
            return Err(Failed::Gone);
        }
        loop {
            let line = match self.lines.next_line().await {
                Ok(Some(line)) => line,
                _ => return Err(Failed::Gone),
            };
            let message: Value =
                serde_json::from_str(&line).unwrap_or_else(|e| panic!("acp: a stdout line is not JSON ({e}): {line}"));
            assert_eq!(message["jsonrpc"], "2.0", "acp: {line}");
            if message.get("method").is_some() {
                assert!(message.get("id").is_none(), "acp: the agent asked the client something: {line}");
                let update = &message["params"]["update"];
                if message["method"] == "session/update" && update["sessionUpdate"] == "agent_message_chunk" {
                    let id = update["messageId"].as_str().unwrap_or_default();
                    let text = update["content"]["text"].as_str().unwrap_or_default();
                    match self.chunks.last_mut() {
                        Some((last, said)) if last == id => said.push_str(text),
                        _ => self.chunks.push((id.to_string(), text.to_string())),
                    }
                }
                continue;
            }
            assert_eq!(message["id"], id, "acp: an answer to a request not sent: {line}");
            return match message.get("error") {
                Some(error) => Err(Failed::Error(error.clone())),
                None => Ok(message["result"].clone()),
            };
        }
    }
}

/// The ACP client of one cycle, on `node`: initialize, make or load its session, then
/// prompt it.
pub(super) async fn acp(
    cycle: Arc<Cycle>,
    mut state: AcpClient,
    mut process: AcpProcess,
    node: usize,
    cwd: String,
) -> AcpClient {
    macro_rules! call {
        ($method:expr, $params:expr) => {
            settle!($method, process.call($method, $params).await)
        };
    }
    macro_rules! settle {
        ($method:expr, $called:expr) => {
            match $called {
                Ok(result) => result,
                Err(failed) => {
                    match failed {
                        Failed::Error(error) => {
                            cycle.failed_over(node, format!("acp: {} answered {error}", $method));
                        }
                        // The test kills the process to stop it.
                        Failed::Gone if cycle.stopped() => {}
                        Failed::Gone => cycle.cut(node, format!("acp: the process went away during {}", $method)),
                    }
                    return state;
                }
            }
        };
    }
    let init = json!({"protocolVersion": 1, "clientCapabilities": {"fs": {"readTextFile": false, "writeTextFile": false}, "terminal": false}});
    let initialized = call!("initialize", init);
    assert_eq!(initialized["protocolVersion"], 1, "acp: {initialized}");
    let session = match state.session.clone() {
        Some(session) => {
            let loaded = call!("session/load", json!({"sessionId": session, "cwd": cwd, "mcpServers": []}));
            // The session's modes and config options, and nothing else (the default agent
            // has modes, and a second model).
            let mut keys: Vec<&String> = loaded.as_object().map(|o| o.keys().collect()).unwrap_or_default();
            keys.sort();
            assert_eq!(keys, ["configOptions", "modes"], "acp: session/load: {loaded}");
            assert_eq!(loaded["modes"]["currentModeId"], "code", "acp: session/load: {loaded}");
            assert_eq!(loaded["configOptions"][1]["currentValue"], "default", "acp: session/load: {loaded}");
            session
        }
        None => {
            let created = call!("session/new", json!({"cwd": cwd, "mcpServers": []}));
            let session = created["sessionId"].as_str().expect("acp: session/new names the session").to_string();
            state.session = Some(session.clone());
            session
        }
    };
    cycle.acp_ready.store(true, Ordering::SeqCst);
    loop {
        state.sent += 1;
        let (text, expected) = prompt(&format!("acp-c{}-{}", cycle.number, state.sent));
        let params = json!({"sessionId": session, "prompt": [{"type": "text", "text": text}]});
        state.cut += 1;
        let called = process.call("session/prompt", params).await;
        if let Err(Failed::Error(error)) = &called {
            // `turnlog acp` says what the server answered.
            if error.to_string().contains("503 Service Unavailable") && cycle.aftermath_refusal() {
                state.cut -= 1;
                continue;
            }
        }
        let answer = settle!("session/prompt", called);
        state.cut -= 1;
        if cycle.failover && answer["stopReason"] != "end_turn" {
            cycle.failed_over(node, format!("acp: a prompt ended {answer}"));
            return state;
        }
        assert_eq!(answer, json!({"stopReason": "end_turn"}), "acp: session/prompt");
        process.said(&expected);
        state.acked.push(expected);
    }
}

/// Whether `text` is `expected` after cut attempts of it, each a beginning of it (each
/// starts as the reply does, with its first word).
fn after_cut_attempts(text: &str, expected: &str) -> bool {
    let Some(cut) = text.strip_suffix(expected) else { return false };
    let first = expected.split(' ').next().unwrap_or(expected);
    let starts: Vec<usize> = cut.match_indices(first).map(|(at, _)| at).collect();
    if cut.is_empty() || starts.first() != Some(&0) {
        return cut.is_empty();
    }
    let ends = starts[1..].iter().copied().chain([cut.len()]);
    starts.iter().zip(ends).all(|(&from, to)| expected.starts_with(&cut[from..to]))
}

/// What became of a session the deleter made.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Fate {
    Created,
    /// Its DELETE was sent, and not answered.
    DeleteSent,
    /// Its DELETE was answered 204.
    Deleted,
}

#[derive(Default)]
pub(super) struct Deleter {
    sessions: Vec<(String, Fate)>,
    pub created: usize,
    pub deleted: usize,
}

/// Makes sessions through `node` and deletes them, until its first failure after the kill.
pub(super) async fn delete_sessions(cycle: Arc<Cycle>, mut d: Deleter, node: usize, mut rng: StdRng) -> Deleter {
    let client = client();
    let url = cycle.url(node).to_string();
    // What returns 204 or 404 for a session, and the answer's body; `None` once the node is
    // gone (or stopped).
    async fn delete(client: &reqwest::Client, cycle: &Cycle, node: usize, session: &str) -> Option<(u16, String)> {
        match cycle.unless_stopped(client.delete(format!("{}/sessions/{session}", cycle.url(node))).send()).await? {
            Ok(response) => Some((response.status().as_u16(), response.text().await.unwrap_or_default())),
            Err(error) => {
                cycle.cut(node, format!("deleter: {error}"));
                None
            }
        }
    }
    // First the sessions the last cycles left, each still there unless its delete was sent.
    for i in 0..d.sessions.len() {
        let (session, fate) = d.sessions[i].clone();
        if fate == Fate::Deleted {
            continue;
        }
        if cycle.stopped() {
            return d;
        }
        d.sessions[i].1 = Fate::DeleteSent;
        match delete(&client, &cycle, node, &session).await {
            Some((204, _)) => {}
            Some((404, _)) if fate == Fate::DeleteSent => {}
            Some((status, body)) => {
                // Left for the next cycle, its delete sent.
                if cycle.refused(node, status, &body, format!("deleter: deleting {session} ({fate:?}): {body}")) {
                    continue;
                }
                return d;
            }
            None => return d,
        }
        d.sessions[i].1 = Fate::Deleted;
        d.deleted += 1;
    }
    loop {
        if cycle.stopped() {
            return d;
        }
        let key = format!("deleter-c{}-{}", cycle.number, d.created);
        let made = client.post(format!("{url}/sessions")).header("Idempotency-Key", key);
        let made = made.json(&json!({"agent": {"name": "default"}})).send();
        let body = match cycle.unless_stopped(made).await {
            None => return d,
            Some(Ok(response)) if response.status() != 201 => {
                let status = response.status().as_u16();
                let body = response.text().await.unwrap_or_default();
                if cycle.refused(node, status, &body, format!("deleter: creating a session: {body}")) {
                    continue;
                }
                return d;
            }
            Some(Ok(response)) => match cycle.unless_stopped(response.json::<Value>()).await {
                None => return d,
                Some(body) => body,
            },
            Some(Err(error)) => Err(error),
        };
        let session = match body {
            Ok(body) => body["sessionId"].as_str().expect("a session id").to_string(),
            Err(error) => {
                cycle.cut(node, format!("deleter: {error}"));
                return d;
            }
        };
        d.created += 1;
        d.sessions.push((session.clone(), Fate::Created));
        let event = json!({"events": [{"type": "user.define_outcome", "outcome": "to be deleted"}]});
        let appended = client.post(format!("{url}/sessions/{session}/events")).json(&event).send();
        match cycle.unless_stopped(appended).await {
            None => return d,
            Some(Ok(response)) if response.status() == 200 => {}
            Some(Ok(response)) => {
                let status = response.status().as_u16();
                let body = response.text().await.unwrap_or_default();
                // Left for the next cycle to delete.
                if cycle.refused(node, status, &body, format!("deleter: appending to {session}: {body}")) {
                    continue;
                }
                return d;
            }
            Some(Err(error)) => {
                cycle.cut(node, format!("deleter: {error}"));
                return d;
            }
        }
        // Some are left for the next cycle to delete, after the restart.
        if rng.random_bool(0.2) {
            continue;
        }
        d.sessions.last_mut().unwrap().1 = Fate::DeleteSent;
        match delete(&client, &cycle, node, &session).await {
            Some((204, _)) => {
                d.sessions.last_mut().unwrap().1 = Fate::Deleted;
                d.deleted += 1;
            }
            Some((status, body)) => {
                // Left for the next cycle, its delete sent.
                if cycle.refused(node, status, &body, format!("deleter: deleting {session}: {body}")) {
                    continue;
                }
                return d;
            }
            None => return d,
        }
    }
}

/// One stored event, from the session's export.
struct Stored {
    id: String,
    raw: String,
    value: Value,
}

#[derive(Deserialize)]
struct ExportLine<'a> {
    session_id: String,
    sequence_number: u64,
    prev: String,
    hash: String,
    #[serde(borrow)]
    event: &'a RawValue,
}

/// A session's log through the node at `url`, checked: its export's hash chain recomputed
/// (docs/audit.md's definition) and ending at the head the audit route verifies; sequence numbers
/// 1..n; increasing ids; the event API listing the same events; no turn open (in the log,
/// and in the session's status). A panic is a log that is wrong; `Err` one that is not
/// whole yet (a node that has not caught up with the log, or a turn a takeover has not
/// closed yet), which the single-node soak does not wait for.
async fn read_log(client: &reqwest::Client, url: &str, session: &str) -> Result<Vec<Stored>, String> {
    let response = client.get(format!("{url}/sessions/{session}/export")).send().await.unwrap();
    if response.status() != 200 {
        return Err(format!("export of {session} through {url} answered {}", response.status()));
    }
    let text = response.text().await.unwrap();
    let mut log: Vec<Stored> = Vec::new();
    let mut prev = [0u8; 32];
    for line in text.lines() {
        let parsed: ExportLine = serde_json::from_str(line).unwrap_or_else(|e| panic!("an export line ({e}): {line}"));
        let n = log.len() as u64 + 1;
        assert_eq!(parsed.session_id, session);
        assert_eq!(parsed.sequence_number, n, "{session}: sequence numbers have no gap (through {url})");
        let at = line.find("\"event\":").expect("an event field") + 8;
        let raw = &line[at..line.len() - 1];
        assert_eq!(raw, parsed.event.get(), "{session} {n}: the event's bytes");
        assert_eq!(parsed.prev, hex::encode(prev), "{session} {n}: the chain's link to the event before");
        let hash: [u8; 32] = Sha256::new().chain_update(prev).chain_update(raw.as_bytes()).finalize().into();
        assert_eq!(parsed.hash, hex::encode(hash), "{session} {n}: the chain's hash");
        prev = hash;
        let value: Value = serde_json::from_str(raw).unwrap();
        assert_eq!(value["sequence_number"], n, "{session}: the event's own sequence number");
        assert_eq!(value["session_id"], session);
        let id = value["id"].as_str().expect("an id").to_string();
        if let Some(last) = log.last() {
            assert!(id > last.id, "{session} {n}: ids increase ({} then {id})", last.id);
        }
        log.push(Stored { id, raw: raw.to_string(), value });
    }
    assert!(!log.is_empty(), "{session}: the log has its session.created");
    assert_eq!(log[0].value["type"], "session.created");

    let audit: Value =
        client.get(format!("{url}/sessions/{session}/audit?verify=true")).send().await.unwrap().json().await.unwrap();
    if audit["sequence_number"] != log.len() {
        return Err(format!("{session} through {url}: the audit head {audit} is not the export's, at {}", log.len()));
    }
    let head = json!({"session_id": session, "sequence_number": log.len(), "last_id": log.last().unwrap().id,
        "hash": hex::encode(prev), "verified": true});
    assert_eq!(audit, head, "{session}: the audit head is the export's last hash, verified");

    let listed = list_events(|path| client.get(format!("{url}{path}")), url, session).await?;
    if listed.len() != log.len() {
        return Err(format!("{session} through {url}: the event API lists {}, the export {}", listed.len(), log.len()));
    }
    for (listed, stored) in listed.iter().zip(&log) {
        let (mut listed, mut stored) = (listed.clone(), stored.value.clone());
        if stored["type"] == "user.message" {
            // The list fills in when a turn took the message; the stored bytes keep null.
            listed["processed_at"] = Value::Null;
            stored["processed_at"] = Value::Null;
        }
        assert_eq!(listed, stored, "{session}: the event API and the export agree");
    }

    let mut open: Vec<&str> = Vec::new();
    for event in &log {
        let turn = event.value["turn_id"].as_str();
        match event.value["type"].as_str().unwrap() {
            "turn.started" => open.push(turn.expect("turn.started has a turn_id")),
            "session.status_idle" => open.retain(|t| Some(*t) != turn),
            _ => {}
        }
    }
    if !open.is_empty() {
        // What the node's projections say of them (what its reaper goes by), for the failure.
        let listed: Value = client
            .get(format!("{url}/v1/agents/sessions/{session}/turns"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap_or_default();
        let listed: Vec<String> = listed["data"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|turn| open.iter().any(|t| turn["id"] == *t))
            .map(|turn| format!("{} {}", turn["id"], turn["state"]["status"]))
            .collect();
        let last: Vec<String> =
            log.iter().rev().take(4).map(|e| format!("#{} {}", e.value["sequence_number"], e.value["type"])).collect();
        return Err(format!(
            "{session}: turns left running after the restart: {open:?} (through {url}; its last events {last:?}; \
             its turn index lists them as {listed:?})"
        ));
    }
    let status: Value = client.get(format!("{url}/v1/sessions/{session}")).send().await.unwrap().json().await.unwrap();
    if status["status"] != "idle" {
        return Err(format!(
            "{session}: the session's status after the restart is {} (through {url})",
            status["status"]
        ));
    }
    Ok(log)
}

/// The replies of the turns the log shows ended `end_turn`.
fn finished_replies(log: &[Stored]) -> HashSet<String> {
    let ended: HashSet<&str> = log
        .iter()
        .filter(|e| e.value["type"] == "session.status_idle" && e.value["stop_reason"]["type"] == "end_turn")
        .filter_map(|e| e.value["turn_id"].as_str())
        .collect();
    log.iter()
        .filter(|e| e.value["type"] == "agent.message")
        .filter(|e| e.value["turn_id"].as_str().is_some_and(|t| ended.contains(t)))
        .map(|e| e.value["content"].as_array().unwrap().iter().filter_map(|b| b["text"].as_str()).collect())
        .collect()
}

/// The position after a subscriber's first cursor in its log.
fn start_of(sub: &Subscriber, log: &[Stored]) -> usize {
    match &sub.start {
        None => 0,
        Some(start) => log.iter().position(|e| e.id == *start).expect("the first cursor is in the log") + 1,
    }
}

/// Everything the soak keeps across cycles.
#[derive(Default)]
pub(super) struct Soak {
    pub append_sessions: Vec<String>,
    pub acked: Vec<Acked>,
    pub subscribers: Vec<Subscriber>,
    pub drivers: Vec<Driver>,
    pub acp: AcpClient,
    pub deleter: Deleter,
    /// Sessions whose delete every node has answered for (404): they stay deleted.
    pub gone: HashSet<String>,
    /// Batches whose answer was cut off, to send again with their keys (see [`Soak::resend`]).
    pub cut: Vec<Keyed>,
    /// Batches answered 503: not stored, ever.
    pub refused: Vec<(String, Vec<String>)>,
    /// Batches sent again with their keys after their answer was cut off, and answered.
    pub resent: usize,
}

/// A cycle's clients, running until the kill ends them.
pub(super) struct Clients {
    pub appenders: Vec<JoinHandle<Appended>>,
    pub subscribers: Vec<JoinHandle<Subscriber>>,
    pub drivers: Vec<JoinHandle<Driver>>,
    pub deleter: JoinHandle<Deleter>,
    pub acp: JoinHandle<AcpClient>,
}

impl Clients {
    /// Whether a client has ended before the kill: it failed (its panic is reported when it
    /// is joined).
    pub fn ended(&self) -> bool {
        self.appenders.iter().any(|h| h.is_finished())
            || self.subscribers.iter().any(|h| h.is_finished())
            || self.drivers.iter().any(|h| h.is_finished())
            || self.deleter.is_finished()
            || self.acp.is_finished()
    }

    /// Waits until every client is going: appends acknowledged, every subscriber following,
    /// every driver in a turn, the ACP client ready.
    pub async fn under_way(&self, cycle: &Cycle) {
        let going = || {
            cycle.appended.load(Ordering::SeqCst) > 0
                && cycle.subscribed.load(Ordering::SeqCst) == self.subscribers.len()
                && cycle.turning.load(Ordering::SeqCst) == self.drivers.len()
                && cycle.acp_ready.load(Ordering::SeqCst)
        };
        wait_for(&format!("cycle {}: the load under way", cycle.number), going, || self.ended()).await;
    }
}

impl Soak {
    /// Takes back what a cycle's clients did: the subscribers', drivers', deleter's and ACP
    /// client's state for the next cycle, and the appends acknowledged (with the requests
    /// that made them).
    /// Sends the batches whose answers were cut off again, each with its key, through the
    /// nodes at `urls` until answered: each is then acknowledged (stored once, however
    /// often it was sent, which the checks hold).
    pub(super) async fn resend(&mut self, urls: &[String], rng: &mut StdRng) {
        for batch in std::mem::take(&mut self.cut) {
            let acked = batch.resend(urls, Duration::from_secs(60), rng).await;
            self.acked.extend(acked);
            self.resent += 1;
        }
    }

    pub(super) async fn gather(&mut self, clients: Clients) -> (usize, usize) {
        let (mut appended, mut requests) = (0, 0);
        for handle in clients.appenders {
            let done = join("an appender", handle).await;
            appended += done.acked.len();
            requests += done.requests;
            self.acked.extend(done.acked);
            self.cut.extend(done.cut);
            self.refused.extend(done.refused);
        }
        for handle in clients.subscribers {
            self.subscribers.push(join("a subscriber", handle).await);
        }
        for handle in clients.drivers {
            self.drivers.push(join("a turn driver", handle).await);
        }
        self.deleter = join("the deleter", clients.deleter).await;
        self.acp = join("the acp client", clients.acp).await;
        (appended, requests)
    }
}

/// What the checks after a restart counted.
pub(super) struct Checked {
    pub sessions: usize,
    pub events: usize,
    pub turns: usize,
    /// Turns closed as `interrupted`: none, now that a stopped process's turns are resumed.
    pub interrupted: usize,
    /// Resumptions of turns a killed process left running (`turn.resumed`).
    pub resumed: usize,
    /// Turns closed because they were resumed `turns.max_resumes` times.
    pub exhausted: usize,
    /// The deleted sessions every node answered 404 for.
    gone: Vec<String>,
}

/// The checks after a restart, through every node (`urls`): a panic is something wrong;
/// `Err` says what does not hold yet while the nodes catch up with the log and close the
/// turns the killed node left running.
async fn survey(client: &reqwest::Client, urls: &[String], soak: &Soak) -> Result<Checked, String> {
    // An append a client gave up on may still be waiting for the engine (through a failover):
    // the logs are final once no node has one left.
    for url in urls {
        let metrics = client.get(format!("{url}/metrics")).send().await.unwrap().text().await.unwrap();
        let publishing = metrics.lines().find_map(|line| line.strip_prefix("turnlog_jetstream_publishing "));
        if let Some(n) = publishing.filter(|n| *n != "0") {
            return Err(format!("{url} still waits for JetStream to store the appends of {n} sessions"));
        }
    }
    let mut live: Vec<String> = soak.append_sessions.clone();
    live.extend(soak.drivers.iter().map(|d| d.session.clone()));
    live.extend(soak.acp.session.clone());
    // The deleter's sessions: each node's answer for each, which every node must agree on.
    let mut kept: Option<BTreeSet<String>> = None;
    for url in urls {
        let mut here = BTreeSet::new();
        for (session, fate) in &soak.deleter.sessions {
            let status = client.get(format!("{url}/sessions/{session}")).send().await.unwrap().status().as_u16();
            match (fate, status) {
                (Fate::Deleted, 404) | (Fate::DeleteSent, 404) => {
                    let events = client.get(format!("{url}/sessions/{session}/events")).send().await.unwrap();
                    if events.status() != 404 {
                        return Err(format!("the events of deleted session {session} answer {}", events.status()));
                    }
                }
                (Fate::Created, 200) | (Fate::DeleteSent, 200) => {
                    assert!(!soak.gone.contains(session), "session {session}, deleted, is back through {url}");
                    here.insert(session.clone());
                }
                (fate, status) => {
                    assert!(!soak.gone.contains(session), "session {session}, deleted, answers {status} through {url}");
                    return Err(format!(
                        "session {session} ({fate:?}) answers {status} after the restart (through {url})"
                    ));
                }
            }
        }
        match &kept {
            Some(kept) if *kept != here => {
                return Err(format!("the nodes do not agree on which sessions are left: {kept:?} and {here:?} ({url})"))
            }
            _ => kept = Some(here),
        }
    }
    let kept = kept.unwrap_or_default();
    let gone: Vec<String> =
        soak.deleter.sessions.iter().filter(|(s, _)| !kept.contains(s)).map(|(s, _)| s.clone()).collect();
    live.extend(kept);

    let mut first: Option<HashMap<String, Vec<Stored>>> = None;
    for url in urls {
        let mut logs = HashMap::new();
        for session in &live {
            logs.insert(session.clone(), read_log(client, url, session).await?);
        }
        check_logs(url, soak, &logs)?;
        // Every node reads the same logs.
        if let Some(first) = &first {
            for (session, log) in &logs {
                let other = &first[session];
                for (a, b) in log.iter().zip(other) {
                    let at = &a.value["sequence_number"];
                    assert!(a.id == b.id && a.raw == b.raw, "{session}: {url} and {} differ at #{at}", urls[0]);
                }
                if log.len() != other.len() {
                    return Err(format!(
                        "{session}: {} events through {url}, {} through {}",
                        log.len(),
                        other.len(),
                        urls[0]
                    ));
                }
            }
        } else {
            first = Some(logs);
        }
    }
    let logs = first.expect("a node");
    let count = |kind: &str, code: Option<&str>| {
        let events = logs.values().flatten();
        events.filter(|e| e.value["type"] == kind && code.is_none_or(|c| e.value["code"] == c)).count()
    };
    Ok(Checked {
        sessions: logs.len(),
        events: logs.values().map(Vec::len).sum(),
        turns: count("turn.started", None),
        interrupted: count("session.error", Some("interrupted")),
        resumed: count("turn.resumed", None),
        exhausted: count("session.error", Some("retries_exhausted")),
        gone,
    })
}

/// The acknowledged events, what the subscribers received and the answered turns, against
/// the logs read through the node at `url`.
fn check_logs(url: &str, soak: &Soak, logs: &HashMap<String, Vec<Stored>>) -> Result<(), String> {
    // Nothing twice: every batch an appender sent (however often) is in its log at most once.
    for session in &soak.append_sessions {
        let mut seen = HashSet::new();
        for stored in &logs[session] {
            if let Some(outcome) = stored.value["outcome"].as_str() {
                assert!(seen.insert(outcome), "{session}: {outcome} is stored twice (through {url})");
            }
        }
    }
    // A 503 says the append was not stored.
    for (session, outcomes) in &soak.refused {
        let stored = logs[session].iter().find(|s| outcomes.iter().any(|o| s.value["outcome"] == o.as_str()));
        assert!(
            stored.is_none(),
            "{session}: a batch answered 503 is in the log (through {url}): {:?}",
            stored.map(|s| &s.raw)
        );
    }
    for acked in &soak.acked {
        let log = &logs[&acked.session];
        let Some(stored) = log.get(acked.seq as usize - 1) else {
            return Err(format!(
                "acknowledged event {} ({} #{}) is lost: the log has {} (through {url})",
                acked.id,
                acked.session,
                acked.seq,
                log.len()
            ));
        };
        assert_eq!(stored.id, acked.id, "{} #{}: the acknowledged event's place", acked.session, acked.seq);
        assert_eq!(stored.raw, acked.raw, "{} #{}: the acknowledged bytes", acked.session, acked.seq);
    }
    for sub in &soak.subscribers {
        let log = &logs[&sub.session];
        let from = start_of(sub, log);
        if from + sub.got.len() > log.len() {
            return Err(format!("{}: received {} events past its log's end (through {url})", sub.name, sub.got.len()));
        }
        for (k, (id, data)) in sub.got.iter().enumerate() {
            let stored = &log[from + k];
            assert_eq!(*id, stored.id, "{}: received event {k} is the log's next one (no gap, no repeat)", sub.name);
            assert_eq!(*data, stored.raw, "{}: received event {k} has the stored bytes", sub.name);
        }
    }
    for driver in &soak.drivers {
        let done = finished_replies(&logs[&driver.session]);
        for reply in &driver.acked {
            if !done.contains(reply) {
                return Err(format!("turn driver {}: an answered turn is not in the log: {reply}", driver.mode));
            }
        }
    }
    if let Some(session) = &soak.acp.session {
        let done = finished_replies(&logs[session]);
        for reply in &soak.acp.acked {
            if !done.contains(reply) {
                return Err(format!("acp: an answered prompt's turn is not in the log: {reply}"));
            }
        }
    }
    Ok(())
}

/// The checks after a restart of the one node, polled until they hold: the turns the kill
/// cut are resumed as the node starts, and take a moment to end.
async fn check(app: &TestApp, soak: &mut Soak) -> Checked {
    check_until(std::slice::from_ref(&app.url), soak, Duration::from_secs(30), || app.log()).await.0
}

/// The checks after a restart of one of several nodes, polled until they all hold or
/// `within` has passed; with what did not hold at first, if anything.
pub(super) async fn check_until(
    urls: &[String],
    soak: &mut Soak,
    within: Duration,
    context: impl Fn() -> String,
) -> (Checked, Option<String>) {
    let client = client();
    let deadline = Instant::now() + within;
    let mut first = None;
    loop {
        match survey(&client, urls, soak).await {
            Ok(checked) => {
                soak.gone.extend(checked.gone.iter().cloned());
                return (checked, first);
            }
            Err(why) => {
                assert!(Instant::now() < deadline, "not within {within:?}: {why}\n{}", context());
                first.get_or_insert(why);
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits for `ready`, polling, up to `WAIT`; ends early if a client has already ended (it
/// failed: its panic is reported when it is joined).
pub(super) async fn wait_for(what: &str, ready: impl Fn() -> bool, ended: impl Fn() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !ready() && !ended() {
        assert!(Instant::now() < deadline, "{what}: not within {WAIT:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A client's task, once the kill has ended it; its panic, if it failed.
pub(super) async fn join<T>(what: &str, handle: impl Future<Output = Result<T, tokio::task::JoinError>>) -> T {
    match tokio::time::timeout(WAIT, handle).await {
        Ok(Ok(value)) => value,
        Ok(Err(error)) => std::panic::resume_unwind(error.into_panic()),
        Err(_) => panic!("{what} did not end within {WAIT:?} of the kill"),
    }
}

/// After the last restart, with no load: every subscriber catches up with its log (through
/// the node `pick` chooses), and then holds exactly the log after its first cursor; every
/// session takes new work, through every node.
pub(super) async fn finish(
    urls: &[String],
    soak: &mut Soak,
    cwd: &str,
    dir: &std::path::Path,
    mut pick: impl FnMut() -> usize,
) {
    let client = client();
    for sub in &mut soak.subscribers {
        let url = &urls[pick()];
        let log = read_log(&client, url, &sub.session).await.unwrap_or_else(|why| panic!("{why}"));
        let last = log.last().unwrap().id.clone();
        if sub.cursor().as_ref() != Some(&last) {
            let response = sub.open(&client, url).await.expect("the stream opens");
            assert_eq!(response.status(), 200, "{}: the last stream", sub.name);
            let mut stream = frames(response);
            while sub.cursor().as_ref() != Some(&last) {
                let frame = tokio::time::timeout(FRAME_WAIT, stream.next()).await;
                let frame = frame.unwrap_or_else(|_| panic!("{}: did not catch up within {FRAME_WAIT:?}", sub.name));
                sub.take(frame.unwrap_or_else(|| panic!("{}: the stream ended before the log's end", sub.name)));
            }
        }
        let from = start_of(sub, &log);
        let expected: Vec<(String, String)> = log[from..].iter().map(|e| (e.id.clone(), e.raw.clone())).collect();
        assert!(sub.got == expected, "{}: what it received is not exactly the log after its first cursor", sub.name);
    }
    for (i, driver) in soak.drivers.iter().enumerate() {
        let url = &urls[i % urls.len()];
        let (content, expected) = prompt(&format!("{}-last", driver.mode));
        let body = json!({"messages": [{"role": "user", "content": content}]});
        let response =
            client.post(format!("{url}/sessions/{}/turns", driver.session)).json(&body).send().await.unwrap();
        assert_eq!(response.status(), 200, "a turn after the last restart");
        let answer: Value = response.json().await.unwrap();
        assert_eq!(answer, json!({"stopReason": "end_turn", "messages": [{"role": "assistant", "content": expected}]}));
    }
    for session in &soak.append_sessions {
        let mut last = list_events(|path| client.get(format!("{}{path}", urls[0])), &urls[0], session)
            .await
            .unwrap_or_else(|why| panic!("{why}"))
            .len();
        for url in urls {
            let event = json!({"type": "user.define_outcome", "outcome": "after the last restart"});
            let response =
                client.post(format!("{url}/sessions/{session}/events")).json(&json!({"events": [event]})).send();
            let response = response.await.unwrap();
            assert_eq!(response.status(), 200, "an append after the last restart through {url}");
            let new: Value = response.json().await.unwrap();
            // After the one before, through another node. (Not always right after it: an append
            // whose client was cut by a kill may have been stored since.)
            let seq = new["data"][0]["sequence_number"].as_u64().expect("a sequence number") as usize;
            assert!(seq > last, "{session}: an append through {url} took #{seq}, not after #{last}");
            last = seq;
        }
    }
    let url = &urls[pick()];
    let (mut child, mut process) = AcpProcess::spawn(url, &dir.join("acp-last.log"));
    let init = json!({"protocolVersion": 1, "clientCapabilities": {}});
    process.call("initialize", init).await.expect("acp: initialize after the last restart");
    if let Some(session) = soak.acp.session.clone() {
        let load = json!({"sessionId": session, "cwd": cwd, "mcpServers": []});
        process.call("session/load", load).await.expect("acp: session/load after the last restart");
        let (text, expected) = prompt("acp-last");
        let params = json!({"sessionId": session, "prompt": [{"type": "text", "text": text}]});
        let answer = process.call("session/prompt", params).await.expect("acp: a prompt after the last restart");
        assert_eq!(answer, json!({"stopReason": "end_turn"}));
        process.said(&expected);
    }
    drop(process.stdin);
    let exit = tokio::time::timeout(WAIT, child.wait()).await.expect("acp exits once its stdin closes");
    assert!(exit.unwrap().success(), "acp exits 0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_sigkill_under_mixed_load() {
    let _heavy = crate::helpers::HEAVY.lock().await;
    let cycles = env_number("TURNLOG_SOAK_CYCLES", 20) as usize;
    let load_ms = env_number("TURNLOG_SOAK_MS", 400);
    let seed = env_number("TURNLOG_SOAK_SEED", rand::random::<u32>() as u64);
    println!("soak: {cycles} cycles, kills within {load_ms} ms of load, TURNLOG_SOAK_SEED={seed}");
    let mut rng = StdRng::seed_from_u64(seed);
    let started = Instant::now();

    let mut app = spawn_app().await;
    let cwd = app.dir.path().to_str().unwrap().to_string();
    let mut soak = Soak::default();
    for s in 0..APPEND_SESSIONS {
        let session = app.create_session().await;
        let created = app.all_events(&session).await[0]["id"].as_str().unwrap().to_string();
        for (k, start) in [None, Some(created)].into_iter().enumerate() {
            soak.subscribers.push(Subscriber::new(format!("subscriber {s}.{k}"), session.clone(), start));
        }
        soak.append_sessions.push(session);
    }
    for mode in MODES {
        let session = app.create_session().await;
        soak.subscribers.push(Subscriber::new(format!("subscriber {mode}"), session.clone(), None));
        soak.drivers.push(Driver::new(mode, session));
    }

    for number in 0..cycles {
        let cycle = Cycle::new(number, vec![app.url.clone()]);
        let before = (
            soak.subscribers.iter().map(|s| (s.got.len(), s.reconnects)).collect::<Vec<_>>(),
            soak.drivers.iter().map(|d| (d.acked.len(), d.cut)).collect::<Vec<_>>(),
            (soak.acp.acked.len(), soak.deleter.created, soak.deleter.deleted),
        );
        let appenders: Vec<JoinHandle<Appended>> = (0..APPENDERS)
            .map(|w| {
                let rng = StdRng::seed_from_u64(rng.random());
                tokio::spawn(append(cycle.clone(), w, 0, soak.append_sessions.clone(), rng))
            })
            .collect();
        let subscribers: Vec<JoinHandle<Subscriber>> = std::mem::take(&mut soak.subscribers)
            .into_iter()
            .map(|sub| tokio::spawn(subscribe(cycle.clone(), sub, 0, StdRng::seed_from_u64(rng.random()))))
            .collect();
        let drivers: Vec<JoinHandle<Driver>> =
            std::mem::take(&mut soak.drivers).into_iter().map(|d| tokio::spawn(drive(cycle.clone(), d, 0))).collect();
        let deleter = tokio::spawn(delete_sessions(
            cycle.clone(),
            std::mem::take(&mut soak.deleter),
            0,
            StdRng::seed_from_u64(rng.random()),
        ));
        let (mut acp_child, process) = AcpProcess::spawn(&app.url, &app.dir.path().join(format!("acp-{number}.log")));
        let acp_client = tokio::spawn(acp(cycle.clone(), std::mem::take(&mut soak.acp), process, 0, cwd.clone()));

        // The load under way (every client going), then the kill at a random moment.
        let clients = Clients { appenders, subscribers, drivers, deleter, acp: acp_client };
        clients.under_way(&cycle).await;
        let delay = rng.random_range(0..=load_ms);
        if !clients.ended() {
            tokio::time::sleep(Duration::from_millis(delay)).await;
        }
        cycle.kill(0);
        app.kill().await;
        // The ACP client too, which would otherwise keep trying the server.
        acp_child.start_kill().expect("kill turnlog acp");
        acp_child.wait().await.expect("reap turnlog acp");

        let (appended, requests) = soak.gather(clients).await;

        app.restart().await;
        // The batches the kill cut off, sent again with their keys: each stored once.
        let resent = soak.resent;
        soak.resend(std::slice::from_ref(&app.url), &mut rng).await;
        let resent = soak.resent - resent;
        let checking = Instant::now();
        let checked = check(&app, &mut soak).await;

        let received: usize = soak.subscribers.iter().zip(&before.0).map(|(s, (got, _))| s.got.len() - got).sum();
        let reconnects: usize = soak.subscribers.iter().zip(&before.0).map(|(s, (_, r))| s.reconnects - r).sum();
        let turns: Vec<String> = soak
            .drivers
            .iter()
            .zip(&before.1)
            .map(|(d, (acked, cut))| {
                format!("{} {}{}", d.mode, d.acked.len() - acked, if d.cut > *cut { "+cut" } else { "" })
            })
            .collect();
        println!(
            "cycle {:>2}/{cycles}: killed {delay} ms into the load | acked {appended} events in {requests} requests, \
             {resent} cut off and sent again with their keys | turns {} | acp prompts {} | subscribers got {received} events over {reconnects} reconnects | \
             sessions created {} deleted {} | after restart: {} sessions, {} events, {} turns, {} resumes, {} closed after \
             max_resumes, {} closed as interrupted, checked in {} ms",
            number + 1,
            turns.join(", "),
            soak.acp.acked.len() - before.2 .0,
            soak.deleter.created - before.2 .1,
            soak.deleter.deleted - before.2 .2,
            checked.sessions,
            checked.events,
            checked.turns,
            checked.resumed,
            checked.exhausted,
            checked.interrupted,
            checking.elapsed().as_millis(),
        );
        assert_eq!(checked.interrupted, 0, "a turn the kill left running was closed, not resumed");
    }

    // After the last restart, with no load: every subscriber catches up with its log, and
    // then holds exactly the log after its first cursor; every session takes new work.
    finish(std::slice::from_ref(&app.url), &mut soak, &cwd, app.dir.path(), || 0).await;

    let total_received: usize = soak.subscribers.iter().map(|s| s.got.len()).sum();
    let turns: usize = soak.drivers.iter().map(|d| d.acked.len()).sum();
    assert!(!soak.acked.is_empty() && total_received > 0, "the load ran");
    println!(
        "soak: {cycles} kills in {:.1} s: {} events acknowledged ({} batches cut off, sent again with their keys, \
         stored once), {turns} turns and {} acp prompts answered, \
         {total_received} events received by {} subscribers, {} sessions deleted; all checks held",
        started.elapsed().as_secs_f64(),
        soak.acked.len(),
        soak.resent,
        soak.acp.acked.len(),
        soak.subscribers.len(),
        soak.deleter.deleted,
    );
}
