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

use crate::helpers::{spawn_app, TestApp};

const APPEND_SESSIONS: usize = 3;
const APPENDERS: usize = 4;
const MODES: [&str; 3] = ["none", "delta", "message"];
/// The longest wait for one frame of a stream while the load runs (events keep coming).
const FRAME_WAIT: Duration = Duration::from_secs(60);
/// The longest wait for the load to be under way, and for the clients to end after a kill.
const WAIT: Duration = Duration::from_secs(60);

fn env_number(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(value) => value.parse().unwrap_or_else(|_| panic!("{name}={value:?} is not a number")),
        Err(_) => default,
    }
}

fn client() -> reqwest::Client {
    reqwest::Client::builder().pool_max_idle_per_host(8).build().expect("http client")
}

/// What the clients of one cycle share with the test: the server's address, whether it has
/// been killed, and how far the load has got.
struct Cycle {
    number: usize,
    url: String,
    killed: AtomicBool,
    appended: AtomicUsize,
    subscribed: AtomicUsize,
    turning: AtomicUsize,
    acp_ready: AtomicBool,
}

impl Cycle {
    /// A client's connection failed: the expected end of it once the server was killed,
    /// a failure of the test before.
    fn cut(&self, what: impl std::fmt::Display) {
        assert!(self.killed.load(Ordering::SeqCst), "cycle {}: {what}, with the server still up", self.number);
    }
}

/// One acknowledged event: its session, id, sequence number and the bytes acknowledged.
#[derive(Clone)]
struct Acked {
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
struct Appended {
    acked: Vec<Acked>,
    requests: usize,
}

async fn append(cycle: Arc<Cycle>, w: usize, sessions: Vec<String>, mut rng: StdRng) -> Appended {
    let client = client();
    let mut done = Appended::default();
    let mut i = 0;
    loop {
        i += 1;
        let session = &sessions[(w + i) % sessions.len()];
        let n = rng.random_range(1..=5);
        let outcomes: Vec<String> =
            (0..n).map(|k| format!("c{}-w{w}-{i}-{k}-{}", cycle.number, "x".repeat(rng.random_range(0..80)))).collect();
        let events: Vec<Value> =
            outcomes.iter().map(|o| json!({"type": "user.define_outcome", "outcome": o})).collect();
        let sent =
            client.post(format!("{}/sessions/{session}/events", cycle.url)).json(&json!({"events": events})).send();
        let response = match sent.await {
            Ok(response) => response,
            Err(error) => {
                cycle.cut(format!("appender {w}: {error}"));
                return done;
            }
        };
        let status = response.status();
        let body = match response.text().await {
            Ok(body) => body,
            Err(error) => {
                cycle.cut(format!("appender {w}: reading the answer: {error}"));
                return done;
            }
        };
        assert_eq!(status, 200, "appender {w}: {session}: {body}");
        let posted: Posted = serde_json::from_str(&body).expect("the answer is JSON");
        assert_eq!(posted.data.len(), n, "appender {w}: every event is acknowledged: {body}");
        for (raw, outcome) in posted.data.iter().zip(&outcomes) {
            let event: Value = serde_json::from_str(raw.get()).unwrap();
            assert_eq!(event["outcome"], outcome.as_str(), "the acknowledged event is the one sent");
            assert_eq!(event["session_id"], session.as_str());
            done.acked.push(Acked {
                session: session.clone(),
                id: event["id"].as_str().unwrap().to_string(),
                seq: event["sequence_number"].as_u64().unwrap(),
                raw: raw.get().to_string(),
            });
        }
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
struct Subscriber {
    name: String,
    session: String,
    /// Its first cursor (`None`: the start of the log).
    start: Option<String>,
    /// Every event received: id and data, as sent.
    got: Vec<(String, String)>,
    reconnects: usize,
}

impl Subscriber {
    fn cursor(&self) -> Option<String> {
        self.got.last().map(|(id, _)| id.clone()).or_else(|| self.start.clone())
    }

    async fn open(&self, client: &reqwest::Client, url: &str) -> reqwest::Result<reqwest::Response> {
        let mut request = client.get(format!("{url}/sessions/{}/events/stream", self.session));
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

async fn subscribe(cycle: Arc<Cycle>, mut sub: Subscriber, mut rng: StdRng) -> Subscriber {
    let client = client();
    let mut opened = false;
    loop {
        let response = match sub.open(&client, &cycle.url).await {
            Ok(response) => response,
            Err(error) => {
                cycle.cut(format!("{}: {error}", sub.name));
                return sub;
            }
        };
        let status = response.status();
        if status != 200 {
            let body = response.text().await.unwrap_or_default();
            panic!("{}: the stream after {:?} answered {status}: {body}", sub.name, sub.cursor());
        }
        if !opened {
            opened = true;
            cycle.subscribed.fetch_add(1, Ordering::SeqCst);
        }
        let mut stream = frames(response);
        for _ in 0..rng.random_range(1..=8) {
            let frame = tokio::time::timeout(FRAME_WAIT, stream.next()).await;
            let frame = frame.unwrap_or_else(|_| panic!("{}: no event for {FRAME_WAIT:?} under load", sub.name));
            match frame {
                Some(frame) => sub.take(frame),
                None => {
                    cycle.cut(format!("{}: the stream ended", sub.name));
                    return sub;
                }
            }
        }
        sub.reconnects += 1;
    }
}

/// A client of the AAP turn API, in one stream mode, on its own session.
struct Driver {
    mode: &'static str,
    session: String,
    /// The replies of the turns whose end it was told of.
    acked: Vec<String>,
    /// Turns it sent whose answer the kill cut off.
    cut: usize,
    sent: usize,
}

fn prompt(marker: &str) -> (String, String) {
    let words = "alpha beta gamma delta epsilon zeta eta theta";
    (format!("/delay 3\nsoak {marker} {words}"), format!("echo: soak {marker} {words}"))
}

async fn drive(cycle: Arc<Cycle>, mut driver: Driver) -> Driver {
    let client = client();
    let mode = driver.mode;
    let mut first = true;
    loop {
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
        let sent = client.post(format!("{}/sessions/{}/turns", cycle.url, driver.session)).json(&body).send();
        let response = match sent.await {
            Ok(response) => response,
            Err(error) => {
                driver.cut += 1;
                cycle.cut(format!("turn driver {mode}: {error}"));
                return driver;
            }
        };
        let status = response.status();
        if status != 200 {
            let body = response.text().await.unwrap_or_default();
            panic!("turn driver {mode}: a turn on {} answered {status}: {body}", driver.session);
        }
        let ended = match mode {
            "none" => match response.json::<Value>().await {
                Ok(answer) => {
                    let whole =
                        json!({"stopReason": "end_turn", "messages": [{"role": "assistant", "content": expected}]});
                    assert_eq!(answer, whole, "turn driver none");
                    true
                }
                Err(_) => false,
            },
            _ => {
                let mut stream = frames(response);
                let mut seen = Vec::new();
                loop {
                    let frame = tokio::time::timeout(FRAME_WAIT, stream.next()).await;
                    match frame.unwrap_or_else(|_| panic!("turn driver {mode}: no frame for {FRAME_WAIT:?}")) {
                        Some(frame) => seen.push(frame),
                        None => break,
                    }
                }
                let ended = seen.last().is_some_and(|f| f.event == "turn_stop");
                if ended {
                    check_turn_frames(mode, &marker, &expected, &seen);
                }
                ended
            }
        };
        if !ended {
            driver.cut += 1;
            cycle.cut(format!("turn driver {mode}: the turn's answer was cut"));
            return driver;
        }
        driver.acked.push(expected);
    }
}

fn check_turn_frames(mode: &str, marker: &str, expected: &str, seen: &[Frame]) {
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
        assert_eq!(text, expected, "the deltas make the reply");
    } else {
        assert_eq!(names, ["turn_start", "thinking", "text", "turn_stop"], "{mode}");
        assert_eq!(data(&seen[1]), json!({"thinking": format!("about {marker}")}));
        assert_eq!(data(&seen[2]), json!({"text": expected}));
    }
}

/// The ACP client's state across cycles: its session and the replies of its answered prompts.
#[derive(Default)]
struct AcpClient {
    session: Option<String>,
    acked: Vec<String>,
    sent: usize,
    cut: usize,
}

/// The pipes of one `turnlog acp --server URL` process (which the test holds, to kill it).
struct AcpProcess {
    stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
    next_id: u64,
    /// The text of the `agent_message_chunk` updates since the last request.
    chunks: String,
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
    fn spawn(url: &str, log: &std::path::Path) -> (Child, AcpProcess) {
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
        (child, AcpProcess { stdin, lines, next_id: 0, chunks: String::new() })
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
                    self.chunks.push_str(update["content"]["text"].as_str().unwrap_or_default());
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

/// The ACP client of one cycle: initialize, make or load its session, then prompt it.
async fn acp(cycle: Arc<Cycle>, mut state: AcpClient, mut process: AcpProcess, cwd: String) -> AcpClient {
    macro_rules! call {
        ($method:expr, $params:expr) => {
            match process.call($method, $params).await {
                Ok(result) => result,
                Err(failed) => {
                    if let Failed::Error(error) = failed {
                        cycle.cut(format!("acp: {} answered {error}", $method));
                    } else {
                        cycle.cut(format!("acp: the process went away during {}", $method));
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
            assert_eq!(loaded, json!({}), "acp: session/load");
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
        let answer = call!("session/prompt", params);
        state.cut -= 1;
        assert_eq!(answer, json!({"stopReason": "end_turn"}), "acp: session/prompt");
        assert_eq!(process.chunks, expected, "acp: the streamed reply");
        state.acked.push(expected);
    }
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
struct Deleter {
    sessions: Vec<(String, Fate)>,
    created: usize,
    deleted: usize,
}

async fn delete_sessions(cycle: Arc<Cycle>, mut d: Deleter, mut rng: StdRng) -> Deleter {
    let client = client();
    // What returns 204 or 404 for a session; `None` once the server is gone.
    async fn delete(client: &reqwest::Client, cycle: &Cycle, session: &str) -> Option<u16> {
        match client.delete(format!("{}/sessions/{session}", cycle.url)).send().await {
            Ok(response) => Some(response.status().as_u16()),
            Err(error) => {
                cycle.cut(format!("deleter: {error}"));
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
        d.sessions[i].1 = Fate::DeleteSent;
        match delete(&client, &cycle, &session).await {
            Some(204) => {}
            Some(404) if fate == Fate::DeleteSent => {}
            Some(status) => panic!("deleter: deleting {session} ({fate:?}) answered {status}"),
            None => return d,
        }
        d.sessions[i].1 = Fate::Deleted;
        d.deleted += 1;
    }
    loop {
        let made = client.post(format!("{}/sessions", cycle.url)).json(&json!({"agent": {"name": "default"}})).send();
        let body = match made.await {
            Ok(response) => {
                assert_eq!(response.status(), 201, "deleter: creating a session");
                response.json::<Value>().await
            }
            Err(error) => Err(error),
        };
        let session = match body {
            Ok(body) => body["sessionId"].as_str().expect("a session id").to_string(),
            Err(error) => {
                cycle.cut(format!("deleter: {error}"));
                return d;
            }
        };
        d.created += 1;
        d.sessions.push((session.clone(), Fate::Created));
        let event = json!({"events": [{"type": "user.define_outcome", "outcome": "to be deleted"}]});
        match client.post(format!("{}/sessions/{session}/events", cycle.url)).json(&event).send().await {
            Ok(response) => assert_eq!(response.status(), 200, "deleter: appending to {session}"),
            Err(error) => {
                cycle.cut(format!("deleter: {error}"));
                return d;
            }
        }
        // Some are left for the next cycle to delete, after the restart.
        if rng.random_bool(0.2) {
            continue;
        }
        d.sessions.last_mut().unwrap().1 = Fate::DeleteSent;
        match delete(&client, &cycle, &session).await {
            Some(204) => {
                d.sessions.last_mut().unwrap().1 = Fate::Deleted;
                d.deleted += 1;
            }
            Some(status) => panic!("deleter: deleting {session} answered {status}"),
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

/// A session's log, checked: its export's hash chain recomputed (README's definition) and
/// ending at the head the audit route verifies; sequence numbers 1..n; increasing ids; the
/// event API listing the same events; no turn open (in the log, and in the session's status).
async fn read_log(app: &TestApp, session: &str) -> Vec<Stored> {
    let response = app.get(&format!("/sessions/{session}/export")).send().await.unwrap();
    assert_eq!(response.status(), 200, "export of {session}");
    let text = response.text().await.unwrap();
    let mut log: Vec<Stored> = Vec::new();
    let mut prev = [0u8; 32];
    for line in text.lines() {
        let parsed: ExportLine = serde_json::from_str(line).unwrap_or_else(|e| panic!("an export line ({e}): {line}"));
        let n = log.len() as u64 + 1;
        assert_eq!(parsed.session_id, session);
        assert_eq!(parsed.sequence_number, n, "{session}: sequence numbers have no gap");
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
        app.get(&format!("/sessions/{session}/audit?verify=true")).send().await.unwrap().json().await.unwrap();
    let head = json!({"session_id": session, "sequence_number": log.len(), "last_id": log.last().unwrap().id,
        "hash": hex::encode(prev), "verified": true});
    assert_eq!(audit, head, "{session}: the audit head is the export's last hash, verified");

    let listed = app.all_events(session).await;
    assert_eq!(listed.len(), log.len(), "{session}: the event API lists the exported events");
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
    assert!(open.is_empty(), "{session}: turns left running after the restart: {open:?}");
    let status: Value = app.get(&format!("/v1/sessions/{session}")).send().await.unwrap().json().await.unwrap();
    assert_eq!(status["status"], "idle", "{session}: the session's status after the restart");
    log
}

/// The replies of the turns the log shows ended `end_turn`.
fn finished_replies(log: &[Stored]) -> std::collections::HashSet<String> {
    let ended: std::collections::HashSet<&str> = log
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
struct Soak {
    append_sessions: Vec<String>,
    acked: Vec<Acked>,
    subscribers: Vec<Subscriber>,
    drivers: Vec<Driver>,
    acp: AcpClient,
    deleter: Deleter,
}

/// What the checks after a restart counted.
struct Checked {
    sessions: usize,
    events: usize,
    turns: usize,
    interrupted: usize,
}

async fn check(app: &TestApp, soak: &Soak) -> Checked {
    let mut logs = std::collections::HashMap::new();
    let mut live: Vec<String> = soak.append_sessions.clone();
    live.extend(soak.drivers.iter().map(|d| d.session.clone()));
    live.extend(soak.acp.session.clone());
    for (session, fate) in &soak.deleter.sessions {
        let status = app.get(&format!("/sessions/{session}")).send().await.unwrap().status().as_u16();
        match (fate, status) {
            (Fate::Deleted, 404) | (Fate::DeleteSent, 404) => {
                let events = app.get(&format!("/sessions/{session}/events")).send().await.unwrap();
                assert_eq!(events.status(), 404, "the events of deleted session {session}");
            }
            (Fate::Created, 200) | (Fate::DeleteSent, 200) => live.push(session.clone()),
            (fate, status) => panic!("session {session} ({fate:?}) answers {status} after the restart"),
        }
    }
    for session in &live {
        logs.insert(session.clone(), read_log(app, session).await);
    }

    for acked in &soak.acked {
        let log = &logs[&acked.session];
        let stored = log.get(acked.seq as usize - 1).unwrap_or_else(|| {
            panic!(
                "acknowledged event {} ({} #{}) is lost: the log has {}",
                acked.id,
                acked.session,
                acked.seq,
                log.len()
            )
        });
        assert_eq!(stored.id, acked.id, "{} #{}: the acknowledged event's place", acked.session, acked.seq);
        assert_eq!(stored.raw, acked.raw, "{} #{}: the acknowledged bytes", acked.session, acked.seq);
    }
    for sub in &soak.subscribers {
        let log = &logs[&sub.session];
        let from = start_of(sub, log);
        assert!(
            from + sub.got.len() <= log.len(),
            "{}: received {} events past its log's end",
            sub.name,
            sub.got.len()
        );
        for (k, (id, data)) in sub.got.iter().enumerate() {
            let stored = &log[from + k];
            assert_eq!(*id, stored.id, "{}: received event {k} is the log's next one (no gap, no repeat)", sub.name);
            assert_eq!(*data, stored.raw, "{}: received event {k} has the stored bytes", sub.name);
        }
    }
    for driver in &soak.drivers {
        let done = finished_replies(&logs[&driver.session]);
        for reply in &driver.acked {
            assert!(done.contains(reply), "turn driver {}: an answered turn is not in the log: {reply}", driver.mode);
        }
    }
    if let Some(session) = &soak.acp.session {
        let done = finished_replies(&logs[session]);
        for reply in &soak.acp.acked {
            assert!(done.contains(reply), "acp: an answered prompt's turn is not in the log: {reply}");
        }
    }
    let count = |kind: &str, code: Option<&str>| {
        let events = logs.values().flatten();
        events.filter(|e| e.value["type"] == kind && code.is_none_or(|c| e.value["code"] == c)).count()
    };
    Checked {
        sessions: logs.len(),
        events: logs.values().map(Vec::len).sum(),
        turns: count("turn.started", None),
        interrupted: count("session.error", Some("interrupted")),
    }
}

/// Waits for `ready`, polling, up to `WAIT`; ends early if a client has already ended (it
/// failed: its panic is reported when it is joined).
async fn wait_for(what: &str, ready: impl Fn() -> bool, ended: impl Fn() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !ready() && !ended() {
        assert!(Instant::now() < deadline, "{what}: not within {WAIT:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A client's task, once the kill has ended it; its panic, if it failed.
async fn join<T>(what: &str, handle: impl Future<Output = Result<T, tokio::task::JoinError>>) -> T {
    match tokio::time::timeout(WAIT, handle).await {
        Ok(Ok(value)) => value,
        Ok(Err(error)) => std::panic::resume_unwind(error.into_panic()),
        Err(_) => panic!("{what} did not end within {WAIT:?} of the kill"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_sigkill_under_mixed_load() {
    let cycles = env_number("TURNLOG_SOAK_CYCLES", 20) as usize;
    let load_ms = env_number("TURNLOG_SOAK_MS", 400);
    let seed = env_number("TURNLOG_SOAK_SEED", rand::random::<u32>() as u64);
    println!("soak: {cycles} cycles, kills within {load_ms} ms of load, TURNLOG_SOAK_SEED={seed}");
    let mut rng = StdRng::seed_from_u64(seed);
    let started = Instant::now();

    let mut app = spawn_app().await;
    let cwd = app.dir.path().to_str().unwrap().to_string();
    let mut soak = Soak {
        append_sessions: Vec::new(),
        acked: Vec::new(),
        subscribers: Vec::new(),
        drivers: Vec::new(),
        acp: AcpClient::default(),
        deleter: Deleter::default(),
    };
    for s in 0..APPEND_SESSIONS {
        let session = app.create_session().await;
        let created = app.all_events(&session).await[0]["id"].as_str().unwrap().to_string();
        for (k, start) in [None, Some(created)].into_iter().enumerate() {
            let name = format!("subscriber {s}.{k}");
            soak.subscribers.push(Subscriber { name, session: session.clone(), start, got: vec![], reconnects: 0 });
        }
        soak.append_sessions.push(session);
    }
    for mode in MODES {
        let session = app.create_session().await;
        let name = format!("subscriber {mode}");
        soak.subscribers.push(Subscriber { name, session: session.clone(), start: None, got: vec![], reconnects: 0 });
        soak.drivers.push(Driver { mode, session, acked: vec![], cut: 0, sent: 0 });
    }

    for number in 0..cycles {
        let cycle = Arc::new(Cycle {
            number,
            url: app.url.clone(),
            killed: AtomicBool::new(false),
            appended: AtomicUsize::new(0),
            subscribed: AtomicUsize::new(0),
            turning: AtomicUsize::new(0),
            acp_ready: AtomicBool::new(false),
        });
        let before = (
            soak.subscribers.iter().map(|s| (s.got.len(), s.reconnects)).collect::<Vec<_>>(),
            soak.drivers.iter().map(|d| (d.acked.len(), d.cut)).collect::<Vec<_>>(),
            (soak.acp.acked.len(), soak.deleter.created, soak.deleter.deleted),
        );
        let appenders: Vec<JoinHandle<Appended>> = (0..APPENDERS)
            .map(|w| {
                let rng = StdRng::seed_from_u64(rng.random());
                tokio::spawn(append(cycle.clone(), w, soak.append_sessions.clone(), rng))
            })
            .collect();
        let subscribers: Vec<JoinHandle<Subscriber>> = std::mem::take(&mut soak.subscribers)
            .into_iter()
            .map(|sub| tokio::spawn(subscribe(cycle.clone(), sub, StdRng::seed_from_u64(rng.random()))))
            .collect();
        let drivers: Vec<JoinHandle<Driver>> =
            std::mem::take(&mut soak.drivers).into_iter().map(|d| tokio::spawn(drive(cycle.clone(), d))).collect();
        let deleter = tokio::spawn(delete_sessions(
            cycle.clone(),
            std::mem::take(&mut soak.deleter),
            StdRng::seed_from_u64(rng.random()),
        ));
        let (mut acp_child, process) = AcpProcess::spawn(&cycle.url, &app.dir.path().join(format!("acp-{number}.log")));
        let acp_client = tokio::spawn(acp(cycle.clone(), std::mem::take(&mut soak.acp), process, cwd.clone()));

        // The load under way (every client going), then the kill at a random moment.
        let ended = || {
            appenders.iter().any(|h| h.is_finished())
                || subscribers.iter().any(|h| h.is_finished())
                || drivers.iter().any(|h| h.is_finished())
                || deleter.is_finished()
                || acp_client.is_finished()
        };
        let going = || {
            cycle.appended.load(Ordering::SeqCst) > 0
                && cycle.subscribed.load(Ordering::SeqCst) == subscribers.len()
                && cycle.turning.load(Ordering::SeqCst) == drivers.len()
                && cycle.acp_ready.load(Ordering::SeqCst)
        };
        wait_for(&format!("cycle {number}: the load under way"), &going, &ended).await;
        let delay = rng.random_range(0..=load_ms);
        if !ended() {
            tokio::time::sleep(Duration::from_millis(delay)).await;
        }
        cycle.killed.store(true, Ordering::SeqCst);
        app.kill().await;
        // The ACP client too, which would otherwise keep trying the server.
        acp_child.start_kill().expect("kill turnlog acp");
        acp_child.wait().await.expect("reap turnlog acp");

        let mut appended = 0;
        let mut requests = 0;
        for handle in appenders {
            let done = join("an appender", handle).await;
            appended += done.acked.len();
            requests += done.requests;
            soak.acked.extend(done.acked);
        }
        for handle in subscribers {
            soak.subscribers.push(join("a subscriber", handle).await);
        }
        for handle in drivers {
            soak.drivers.push(join("a turn driver", handle).await);
        }
        soak.deleter = join("the deleter", deleter).await;
        soak.acp = join("the acp client", acp_client).await;

        app.restart().await;
        let checking = Instant::now();
        let checked = check(&app, &soak).await;

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
            "cycle {:>2}/{cycles}: killed {delay} ms into the load | acked {appended} events in {requests} requests | \
             turns {} | acp prompts {} | subscribers got {received} events over {reconnects} reconnects | \
             sessions created {} deleted {} | after restart: {} sessions, {} events, {} turns of which {} closed as interrupted, checked in {} ms",
            number + 1,
            turns.join(", "),
            soak.acp.acked.len() - before.2 .0,
            soak.deleter.created - before.2 .1,
            soak.deleter.deleted - before.2 .2,
            checked.sessions,
            checked.events,
            checked.turns,
            checked.interrupted,
            checking.elapsed().as_millis(),
        );
    }

    // After the last restart, with no load: every subscriber catches up with its log, and
    // then holds exactly the log after its first cursor; every session takes new work.
    let client = client();
    for sub in &mut soak.subscribers {
        let log = read_log(&app, &sub.session).await;
        let last = log.last().unwrap().id.clone();
        if sub.cursor().as_ref() != Some(&last) {
            let response = sub.open(&client, &app.url).await.expect("the stream opens");
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
    for driver in &soak.drivers {
        let (content, expected) = prompt(&format!("{}-last", driver.mode));
        let body = json!({"messages": [{"role": "user", "content": content}]});
        let response = app.post(&format!("/sessions/{}/turns", driver.session)).json(&body).send().await.unwrap();
        assert_eq!(response.status(), 200, "a turn after the last restart");
        let answer: Value = response.json().await.unwrap();
        assert_eq!(answer, json!({"stopReason": "end_turn", "messages": [{"role": "assistant", "content": expected}]}));
    }
    for session in &soak.append_sessions {
        let n = app.all_events(session).await.len();
        let new = app.post_outcomes(session, &["after the last restart".to_string()]).await;
        assert_eq!(new[0]["sequence_number"], n as u64 + 1);
    }
    let (mut child, mut process) = AcpProcess::spawn(&app.url, &app.dir.path().join("acp-last.log"));
    let init = json!({"protocolVersion": 1, "clientCapabilities": {}});
    process.call("initialize", init).await.expect("acp: initialize after the last restart");
    if let Some(session) = soak.acp.session.clone() {
        let load = json!({"sessionId": session, "cwd": cwd, "mcpServers": []});
        process.call("session/load", load).await.expect("acp: session/load after the last restart");
        let (text, expected) = prompt("acp-last");
        let params = json!({"sessionId": session, "prompt": [{"type": "text", "text": text}]});
        let answer = process.call("session/prompt", params).await.expect("acp: a prompt after the last restart");
        assert_eq!(answer, json!({"stopReason": "end_turn"}));
        assert_eq!(process.chunks, expected);
    }
    drop(process.stdin);
    let exit = tokio::time::timeout(WAIT, child.wait()).await.expect("acp exits once its stdin closes");
    assert!(exit.unwrap().success(), "acp exits 0");

    let total_received: usize = soak.subscribers.iter().map(|s| s.got.len()).sum();
    let turns: usize = soak.drivers.iter().map(|d| d.acked.len()).sum();
    assert!(!soak.acked.is_empty() && total_received > 0, "the load ran");
    println!(
        "soak: {cycles} kills in {:.1} s: {} events acknowledged, {turns} turns and {} acp prompts answered, \
         {total_received} events received by {} subscribers, {} sessions deleted; all checks held",
        started.elapsed().as_secs_f64(),
        soak.acked.len(),
        soak.acp.acked.len(),
        soak.subscribers.len(),
        soak.deleter.deleted,
    );
}
