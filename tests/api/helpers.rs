//! Starts the real `turnlog` binary on port 0 with a fresh data dir, and gives tests typed
//! verbs over its HTTP API: turnlog's own client ([`TestApp::api`]) for the native API, and
//! requests as they are ([`TestApp::get`], ...) for what a test sends on purpose.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use eventsource_stream::Eventsource;
use futures_util::{Stream, StreamExt};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use turnlog::client::{Client, NewSession};

pub struct TestApp {
    pub url: String,
    pub client: reqwest::Client,
    pub key: Option<String>,
    pub dir: Arc<tempfile::TempDir>,
    child: Child,
}

/// A server with the defaults and no API keys.
pub async fn spawn_app() -> TestApp {
    spawn_with("").await
}

/// A server with `config` (TOML) read over the defaults.
pub async fn spawn_with(config: &str) -> TestApp {
    let dir = Arc::new(tempfile::tempdir().expect("temp dir"));
    start(dir, config.to_string()).await
}

async fn start(dir: Arc<tempfile::TempDir>, config: String) -> TestApp {
    try_start(dir, config).await.expect("server starts")
}

/// A server with `config`, or what it printed if it refused to start.
pub async fn try_spawn_with(config: &str) -> Result<TestApp, String> {
    try_start(Arc::new(tempfile::tempdir().expect("temp dir")), config.to_string()).await
}

async fn try_start(dir: Arc<tempfile::TempDir>, config: String) -> Result<TestApp, String> {
    let config_path = dir.path().join("config.toml");
    std::fs::write(&config_path, &config).expect("write config");
    let (child, url) = launch(&config_path, &dir.path().join("data"), "127.0.0.1:0").await?;
    Ok(TestApp { url, client: client(), key: None, dir, child })
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder().pool_max_idle_per_host(64).build().expect("http client")
}

/// Runs the binary and waits for its `listening on` line; `Err` carries what it printed if
/// it exited instead. Its log (`<data>.log`) keeps every life of the server on that data
/// dir, each after a line that says when it started, so a failure after a restart still
/// shows what happened before it. `TURNLOG_TEST_RUST_LOG` sets the servers' `RUST_LOG`
/// (`warn` unless set), to look closer at a rare failure.
pub async fn launch(config: &Path, data: &Path, addr: &str) -> Result<(Child, String), String> {
    let path = data.with_extension("log");
    let mut log = std::fs::OpenOptions::new().create(true).append(true).open(&path).expect("log file");
    let started = log.metadata().expect("log file").len();
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    std::io::Write::write_all(
        &mut log,
        format!("--- started at {:.3} s since the epoch\n", since.as_secs_f64()).as_bytes(),
    )
    .expect("log file");
    let filter = std::env::var("TURNLOG_TEST_RUST_LOG").unwrap_or_else(|_| "warn".to_string());
    let mut child = Command::new(env!("CARGO_BIN_EXE_turnlog"))
        .args(["serve", "--addr", addr, "--config"])
        .arg(config)
        .arg("--data-dir")
        .arg(data)
        .env("RUST_LOG", filter)
        // The scripted model's `/crash` aborts the process (the crash-loop test).
        .env("TURNLOG_SCRIPTED_CRASH", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::from(log))
        .kill_on_drop(true)
        .spawn()
        .expect("spawn turnlog");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = BufReader::new(stdout).lines();
    // Longer than a JetStream node waits for its cluster to be ready (30 s).
    let line = tokio::time::timeout(Duration::from_secs(60), lines.next_line()).await;
    match line {
        Ok(Ok(Some(line))) if line.starts_with("listening on ") => {
            Ok((child, line.trim_start_matches("listening on ").trim().to_string()))
        }
        _ => {
            let _ = child.wait().await;
            let log = std::fs::read(&path).unwrap_or_default();
            Err(String::from_utf8_lossy(log.get(started as usize..).unwrap_or_default()).into_owned())
        }
    }
}

/// Every event of the session, through the event API of the server at `url` (`get` makes a
/// request of a path there), page by page; why not, if a page is refused.
pub async fn list_events(
    get: impl Fn(&str) -> reqwest::RequestBuilder,
    url: &str,
    session: &str,
) -> Result<Vec<Value>, String> {
    let mut all = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let mut path = format!("/sessions/{session}/events?limit=1000");
        if let Some(after) = &after {
            path.push_str(&format!("&after_id={after}"));
        }
        let response = get(&path).send().await.unwrap();
        if response.status() != 200 {
            return Err(format!("the events of {session} through {url} answered {}", response.status()));
        }
        let page: Value = response.json().await.unwrap();
        all.extend(page["data"].as_array().unwrap().iter().cloned());
        if !page["has_more"].as_bool().unwrap() {
            return Ok(all);
        }
        after = page["last_id"].as_str().map(String::from);
    }
}

/// Taken by the tests that keep both cores busy for a minute (the soaks) and by those that
/// time a JetStream cluster's failover or start: one of each at once would measure the
/// other's load, not the failover (a leader's kill took 30 s to recover from beside a soak,
/// against 5-15 s alone).
pub static HEAVY: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

impl TestApp {
    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id().expect("running")
    }

    /// How the server exited, if it has.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().expect("the server's status")
    }

    /// What the server has logged so far (at `warn` and above).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.data_dir().with_extension("log")).unwrap_or_default()
    }

    /// Kills the server with SIGKILL: no shutdown code runs.
    pub async fn kill(&mut self) {
        self.child.start_kill().expect("SIGKILL");
        self.child.wait().await.expect("reap");
    }

    /// Stops the server with SIGTERM and waits for it to exit.
    pub async fn terminate(&mut self) -> std::process::ExitStatus {
        let pid = self.child.id().expect("running") as i32;
        std::process::Command::new("kill").args(["-TERM", &pid.to_string()]).status().expect("kill -TERM");
        tokio::time::timeout(Duration::from_secs(30), self.child.wait()).await.expect("exits").expect("reap")
    }

    /// Starts the server again on the same data dir (after `kill` or `terminate`).
    pub async fn restart(&mut self) {
        self.try_restart().await.expect("server restarts");
    }

    /// Starts the server again, or what it printed if it exited before it listened.
    pub async fn try_restart(&mut self) -> Result<(), String> {
        let config_path = self.dir.path().join("config.toml");
        let (child, url) = launch(&config_path, &self.data_dir(), "127.0.0.1:0").await?;
        self.child = child;
        self.url = url;
        Ok(())
    }

    /// Waits up to `secs` for the server to exit by itself: how it exited, if it did.
    pub async fn exit_within(&mut self, secs: u64) -> Option<std::process::ExitStatus> {
        tokio::time::timeout(Duration::from_secs(secs), self.child.wait())
            .await
            .ok()
            .map(|status| status.expect("reap"))
    }

    /// The server started again by the caller (on an address of its choosing).
    pub fn restarted(&mut self, child: Child, url: String) {
        self.child = child;
        self.url = url;
    }

    /// Sends later requests with this API key.
    pub fn use_key(&mut self, key: &str) {
        self.key = Some(key.to_string());
    }

    pub fn get(&self, path: &str) -> reqwest::RequestBuilder {
        self.auth(self.client.get(format!("{}{}", self.url, path)))
    }

    pub fn post(&self, path: &str) -> reqwest::RequestBuilder {
        self.auth(self.client.post(format!("{}{}", self.url, path)))
    }

    pub fn delete(&self, path: &str) -> reqwest::RequestBuilder {
        self.auth(self.client.delete(format!("{}{}", self.url, path)))
    }

    fn auth(&self, request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.key {
            Some(key) => request.bearer_auth(key),
            None => request,
        }
    }

    /// turnlog's client of this server, with the key in use.
    pub fn api(&self) -> Client {
        Client::with_http(&self.url, self.key.clone(), self.client.clone())
    }

    pub async fn create_session(&self) -> String {
        self.api().create_session(&NewSession::of("default")).await.unwrap_or_else(|e| panic!("{e}"))
    }

    /// Posts `user.define_outcome` events, one per text, and returns the stored events. They
    /// start no turn, so tests of the log itself can append as many as they like.
    pub async fn post_outcomes(&self, session: &str, texts: &[String]) -> Vec<Value> {
        let events: Vec<Value> = texts.iter().map(|t| json!({"type": "user.define_outcome", "outcome": t})).collect();
        self.api().post_events(session, &events).await.unwrap_or_else(|e| panic!("{e}"))
    }

    /// Posts one event to the session's event API.
    pub async fn post_event(&self, session: &str, event: Value) -> reqwest::Response {
        self.post(&format!("/sessions/{session}/events")).json(&json!({"events": [event]})).send().await.unwrap()
    }

    /// Every event of the session, through the list API.
    pub async fn all_events(&self, session: &str) -> Vec<Value> {
        let listed = self.api().all_events(session, 1000).await;
        listed.unwrap_or_else(|e| panic!("the events of {session} through {}: {e}", self.url))
    }

    /// Opens the native stream after `after_id` (query) or `last_event_id` (header), every
    /// event as logged (`delta_flush_interval_ms=0`: the stream merges deltas by default).
    pub async fn stream(
        &self,
        session: &str,
        after_id: Option<&str>,
        last_event_id: Option<&str>,
    ) -> reqwest::Response {
        let mut path = format!("/sessions/{session}/events/stream?delta_flush_interval_ms=0");
        if let Some(after) = after_id {
            path.push_str(&format!("&after_id={after}"));
        }
        let mut request = self.get(&path);
        if let Some(id) = last_event_id {
            request = request.header("Last-Event-ID", id);
        }
        request.send().await.unwrap()
    }

    pub async fn metric(&self, name: &str) -> f64 {
        let text = self.api().metrics().await.unwrap();
        text.lines()
            .filter(|l| l.starts_with(name) && !l.starts_with('#'))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }
}

/// One SSE event as a test sees it.
#[derive(Debug, Clone)]
pub struct Sse {
    pub id: String,
    pub event: String,
    pub data: Value,
}

/// POSTs `body` as JSON: the status and the JSON answer (`null` when it is none).
pub async fn post_json(app: &TestApp, path: &str, body: Value) -> (u16, Value) {
    let response = app.post(path).json(&body).send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// GETs `path`: the status and the JSON answer (`null` when it is none).
pub async fn get_json(app: &TestApp, path: &str) -> (u16, Value) {
    let response = app.get(path).send().await.unwrap();
    (response.status().as_u16(), response.json().await.unwrap_or(Value::Null))
}

/// The SSE events of a response, parsed by `eventsource-stream`.
pub fn sse(response: reqwest::Response) -> impl Stream<Item = Sse> + Unpin {
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    Box::pin(response.bytes_stream().eventsource().map(|event| {
        let event = event.expect("well-formed SSE");
        Sse { id: event.id, event: event.event, data: serde_json::from_str(&event.data).expect("JSON data") }
    }))
}

/// Reads `n` events, failing after `secs` seconds of waiting.
pub async fn take(stream: &mut (impl Stream<Item = Sse> + Unpin), n: usize, secs: u64) -> Vec<Sse> {
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        match tokio::time::timeout(Duration::from_secs(secs), stream.next()).await {
            Ok(Some(event)) => out.push(event),
            Ok(None) => panic!("stream ended after {} of {n} events", out.len()),
            Err(_) => panic!("timed out after {} of {n} events", out.len()),
        }
    }
    out
}

pub fn ids(events: &[Value]) -> Vec<String> {
    events.iter().map(|e| e["id"].as_str().unwrap().to_string()).collect()
}

pub fn texts(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i}")).collect()
}
