//! `model`: what turnlog adds to a real model's stream. llama.cpp's `llama-server` with
//! SmolLM2-135M (from `scripts/llama`) answers the same prompts three ways, one turn at a
//! time: asked directly, and through turnlog's OpenAI provider, watched on the AAP delta
//! stream and on the native event stream, each turn on a new session.
//!
//! How the added time is measured: turnlog reaches the model through a recording proxy
//! here, which timestamps every read of the model's response as it forwards it. Each delta
//! a client receives carries text the model sent in one or more tokens; what turnlog adds
//! to it is the time from the proxy forwarding the token that completed the delta to the
//! client receiving it (append, fsync, fan-out, rendering, loopback). The first delta's is
//! what turnlog adds to the time to first token. The wait of a delta's oldest token is
//! reported beside it: within the coalescing window (`engine.delta_coalesce_ms`) a token
//! waits for the window's end, and with a window the newest token of a delta may wait for it
//! too. The window is a setting, measured at each value given (`--coalesce-ms`); at 0 both
//! figures are turnlog's own.
//!
//! Each way starts with one turn that is not counted, which warms the model's slot and
//! turnlog's first session and connection to the model.
//!
//! Correctness: every turn ends `end_turn` or `max_tokens`, and its deltas joined are
//! exactly the text the model sent.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use clap::Args;
use serde::Serialize;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::process::{Child, Command};

use super::{Ctx, Deadline};
use crate::client::EventStream;
use crate::report::Report;
use crate::server::Launcher;
use crate::stats::Latency;

const PROMPTS: &[&str] = &[
    "Tell me about the sea.",
    "What is the capital of France?",
    "Write a short poem about autumn.",
    "How do birds fly?",
    "Explain what a computer is.",
    "Give me three tips for sleeping well.",
    "Describe a walk in a forest.",
    "Why is the sky blue?",
];
const SYSTEM: &str = "You are a helpful assistant.";

#[derive(Args, Debug, Clone, Serialize)]
pub struct Params {
    /// Turns per way of asking (direct, AAP, native) and per coalescing window.
    #[arg(long, default_value_t = 24)]
    pub turns: usize,
    /// The model's `max_tokens` per reply.
    #[arg(long, default_value_t = 64)]
    pub max_tokens: u32,
    /// turnlog's `engine.delta_coalesce_ms` values to measure, one server each.
    #[arg(long, value_delimiter = ',', default_value = "25,0")]
    pub coalesce_ms: Vec<u64>,
    /// Threads llama-server computes with (the rest of the machine is turnlog's and the
    /// client's).
    #[arg(long, default_value_t = 1)]
    pub llama_threads: usize,
    /// Hard stop for the whole scenario, in seconds.
    #[arg(long, default_value_t = 600.0)]
    pub deadline: f64,
}

pub async fn run(ctx: &Ctx, p: &Params) -> anyhow::Result<Report> {
    let mut report = Report::new("model", p);
    let deadline = Deadline::after(p.deadline);
    let Launcher::Binary { path, data_root, extra } = &ctx.launcher else {
        bail!("the model scenario starts its own turnlog (not --url): it sets the agent and the coalescing");
    };
    let llama = Llama::start(&data_root.join("llama"), p.llama_threads).await?;
    let proxy = Proxy::start(llama.addr).await?;
    let http = reqwest::Client::builder().tcp_nodelay(true).build()?;

    let direct = deadline
        .run(direct(&http, &llama, p))
        .await
        .ok_or_else(|| anyhow!("the deadline passed asking the model directly"))??;
    report.figure("direct: time to first token p50", direct.first.ms(0.5), "ms");
    report.figure("direct: time to first token p99", direct.first.ms(0.99), "ms");
    report.figure("direct: time between tokens p50", direct.gap.ms(0.5), "ms");
    report.figure("direct: time between tokens p99", direct.gap.ms(0.99), "ms");

    for &coalesce in &p.coalesce_ms {
        let agent = format!(
            "\n[engine]\ndelta_coalesce_ms = {coalesce}\n[agents.real]\nsystem = \"{SYSTEM}\"\n\
             model = {{ provider = \"openai\", base_url = \"http://{}/v1\", name = \"smol\", temperature = 0, max_tokens = {} }}\n",
            proxy.addr, p.max_tokens
        );
        let launcher =
            Launcher::Binary { path: path.clone(), data_root: data_root.clone(), extra: format!("{extra}{agent}") };
        let server = launcher.start().await?;
        for way in [Way::Aap, Way::Native] {
            let cpu_before = server.cpu_seconds();
            let measured = deadline
                .run(through(&http, &server.url, &proxy, way, p))
                .await
                .ok_or_else(|| anyhow!("the deadline passed on the {way:?} turns"))??;
            let cpu = server.cpu_seconds().zip(cpu_before).map(|(after, before)| after - before);
            let name = format!("{}, coalesce {coalesce} ms", way.name());
            report.figure(&format!("{name}: time to first token p50"), measured.first_seen.ms(0.5), "ms");
            let first_p99 = measured.first_added.ms(0.99) * 1000.0;
            let delta_p99 = measured.added.ms(0.99) * 1000.0;
            report.figure(
                &format!("{name}: added to the first token p50"),
                measured.first_added.ms(0.5) * 1000.0,
                "µs",
            );
            report.below(&format!("{name}: added to the first token p99"), first_p99, "µs", 1000.0, "< 1 ms");
            report.figure(
                &format!("{name}: added to each delta (its newest token) p50"),
                measured.added.ms(0.5) * 1000.0,
                "µs",
            );
            report.below(
                &format!("{name}: added to each delta (its newest token) p99"),
                delta_p99,
                "µs",
                100.0,
                "< 100 µs",
            );
            report.figure(&format!("{name}: its oldest token's wait p50"), measured.hold.ms(0.5), "ms");
            report.figure(&format!("{name}: its oldest token's wait p99"), measured.hold.ms(0.99), "ms");
            report.figure(
                &format!("{name}: tokens per delta"),
                measured.tokens as f64 / measured.deltas.max(1) as f64,
                "",
            );
            if let Some(cpu) = cpu {
                report.figure(
                    &format!("{name}: server CPU per token"),
                    cpu * 1e6 / measured.tokens.max(1) as f64,
                    "µs",
                );
            }
            report.violations.extend(measured.violations);
        }
        server.stop().await;
    }
    report.note(format!(
        "llama-server ({} thread(s)) with SmolLM2-135M, temperature 0, {} tokens at most; {} turns per way",
        p.llama_threads, p.max_tokens, p.turns
    ));
    llama.stop().await;
    Ok(report)
}

#[derive(Debug, Clone, Copy)]
enum Way {
    Aap,
    Native,
}

impl Way {
    fn name(self) -> &'static str {
        match self {
            Way::Aap => "AAP delta",
            Way::Native => "native stream",
        }
    }
}

/// llama-server, started on a free loopback port.
struct Llama {
    addr: SocketAddr,
    child: Child,
}

impl Llama {
    async fn start(dir: &Path, threads: usize) -> anyhow::Result<Llama> {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/llama");
        let out = Command::new(&script).output().await.with_context(|| format!("running {}", script.display()))?;
        if !out.status.success() {
            bail!("scripts/llama failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        let found: HashMap<String, PathBuf> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|line| line.split_once('='))
            .map(|(k, v)| (k.to_string(), PathBuf::from(v)))
            .collect();
        let (server, model) = (found.get("server"), found.get("model"));
        let (Some(server), Some(model)) = (server, model) else { bail!("scripts/llama named no server and model") };
        std::fs::create_dir_all(dir)?;
        let log_path = dir.join("llama.log");
        let log = std::fs::File::create(&log_path)?;
        let child = Command::new(server)
            .arg("--model")
            .arg(model)
            .args(["--alias", "smol", "--host", "127.0.0.1", "--port", "0", "--ctx-size", "4096", "--parallel", "1"])
            .args(["--threads", &threads.to_string(), "--no-webui"])
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .kill_on_drop(true)
            .spawn()
            .context("starting llama-server")?;
        let started = Instant::now();
        let addr = loop {
            let text = std::fs::read_to_string(&log_path).unwrap_or_default();
            if let Some(at) = text.find("listening on http://") {
                let rest = &text[at + "listening on http://".len()..];
                let end = rest.find(char::is_whitespace).unwrap_or(rest.len());
                break rest[..end].parse::<SocketAddr>().context("llama-server's address")?;
            }
            if started.elapsed() > Duration::from_secs(60) {
                bail!("llama-server did not listen within 60 s: {text}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let health = format!("http://{addr}/health");
        while reqwest::get(&health).await.map(|r| r.status() != 200).unwrap_or(true) {
            if started.elapsed() > Duration::from_secs(60) {
                bail!("llama-server did not load its model within 60 s");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(Llama { addr, child })
    }

    async fn stop(mut self) {
        let _ = self.child.start_kill();
        let _ = self.child.wait().await;
    }
}

/// The bytes each connection's upstream sent, with when each read was forwarded.
type Reads = Arc<Mutex<HashMap<u64, Vec<(Instant, Vec<u8>)>>>>;

/// A TCP proxy to llama-server that records what it forwards back.
struct Proxy {
    addr: SocketAddr,
    reads: Reads,
}

impl Proxy {
    async fn start(upstream: SocketAddr) -> anyhow::Result<Proxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let reads: Reads = Arc::default();
        let record = reads.clone();
        tokio::spawn(async move {
            let mut next = 0u64;
            while let Ok((client, _)) = listener.accept().await {
                next += 1;
                tokio::spawn(forward(client, upstream, next, record.clone()));
            }
        });
        Ok(Proxy { addr, reads })
    }

    /// What was forwarded since the last take, one response per connection.
    fn take(&self) -> Vec<Vec<(Instant, Vec<u8>)>> {
        self.reads
            .lock()
            .expect("the proxy's record")
            .drain()
            .map(|(_, reads)| reads)
            .filter(|reads| !reads.is_empty())
            .collect()
    }
}

async fn forward(client: TcpStream, upstream: SocketAddr, id: u64, reads: Reads) {
    let Ok(server) = TcpStream::connect(upstream).await else { return };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    tokio::spawn(async move {
        let _ = tokio::io::copy(&mut client_read, &mut server_write).await;
        let _ = server_write.shutdown().await;
    });
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match server_read.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if client_write.write_all(&buf[..n]).await.is_err() {
            break;
        }
        reads.lock().expect("the proxy's record").entry(id).or_default().push((Instant::now(), buf[..n].to_vec()));
    }
}

/// The text tokens of one recorded response, each with when the read that completed it
/// was forwarded.
fn tokens(reads: &[(Instant, Vec<u8>)]) -> anyhow::Result<Vec<(Instant, String)>> {
    let mut raw = Vec::new();
    let mut ends = Vec::new();
    for (at, bytes) in reads {
        raw.extend_from_slice(bytes);
        ends.push((raw.len(), *at));
    }
    let when = |offset: usize| ends.iter().find(|(end, _)| *end > offset).map(|(_, at)| *at).expect("an offset read");
    let head_end = memchr::memmem::find(&raw, b"\r\n\r\n").ok_or_else(|| anyhow!("no response head"))? + 4;
    let head = String::from_utf8_lossy(&raw[..head_end]).to_ascii_lowercase();
    if !head.contains("transfer-encoding: chunked") {
        bail!("the model's response is not chunked: {head}");
    }
    // The body, de-chunked, each byte with the offset it came at.
    let (mut body, mut source) = (Vec::new(), Vec::new());
    let mut at = head_end;
    loop {
        let line_end = memchr::memmem::find(&raw[at..], b"\r\n").ok_or_else(|| anyhow!("a cut chunk"))? + at;
        let size = usize::from_str_radix(std::str::from_utf8(&raw[at..line_end])?.trim(), 16)?;
        let start = line_end + 2;
        if size == 0 {
            break;
        }
        body.extend_from_slice(&raw[start..start + size]);
        source.extend(start..start + size);
        at = start + size + 2;
    }
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(end) = memchr::memmem::find(&body[from..], b"\n\n").map(|i| i + from) {
        let event = std::str::from_utf8(&body[from..end])?;
        if let Some(data) = event.strip_prefix("data: ") {
            if data != "[DONE]" {
                let chunk: Value = serde_json::from_str(data)?;
                if let Some(text) = chunk["choices"][0]["delta"]["content"].as_str().filter(|t| !t.is_empty()) {
                    out.push((when(source[end - 1]), text.to_string()));
                }
            }
        }
        from = end + 2;
    }
    Ok(out)
}

struct Direct {
    first: Latency,
    gap: Latency,
}

async fn direct(http: &reqwest::Client, llama: &Llama, p: &Params) -> anyhow::Result<Direct> {
    let mut measured = Direct { first: Latency::new(), gap: Latency::new() };
    // One more request than measured: the first warms the server's slot and the connection.
    for i in 0..=p.turns {
        if i == 1 {
            measured = Direct { first: Latency::new(), gap: Latency::new() };
        }
        let body = json!({
            "model": "smol", "stream": true, "temperature": 0, "max_tokens": p.max_tokens,
            "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": PROMPTS[i % PROMPTS.len()]}],
        });
        let sent = Instant::now();
        let response = http.post(format!("http://{}/v1/chat/completions", llama.addr)).json(&body).send().await?;
        let mut stream = EventStream::new(response).await?;
        let mut last: Option<Instant> = None;
        while let Some(event) = stream.next_raw().await? {
            let at = Instant::now();
            if event.data == "[DONE]" {
                break;
            }
            let chunk: Value = serde_json::from_str(&event.data)?;
            if chunk["choices"][0]["delta"]["content"].as_str().is_some_and(|t| !t.is_empty()) {
                match last {
                    None => measured.first.record(at - sent),
                    Some(before) => measured.gap.record(at - before),
                }
                last = Some(at);
            }
        }
    }
    Ok(measured)
}

#[derive(Default)]
struct Through {
    first_seen: Latency,
    first_added: Latency,
    added: Latency,
    hold: Latency,
    tokens: u64,
    deltas: u64,
    violations: Vec<String>,
}

async fn through(http: &reqwest::Client, url: &str, proxy: &Proxy, way: Way, p: &Params) -> anyhow::Result<Through> {
    let mut measured = Through::default();
    // One more turn than measured: the first warms the server (its first session, its first
    // connection to the model) and is not counted.
    for i in 0..=p.turns {
        if i == 1 {
            measured = Through { violations: std::mem::take(&mut measured.violations), ..Through::default() };
        }
        let prompt = PROMPTS[i % PROMPTS.len()];
        let created = http.post(format!("{url}/sessions")).json(&json!({"agent": {"name": "real"}})).send().await?;
        let session = created.json::<Value>().await?["sessionId"].as_str().context("a sessionId")?.to_string();
        proxy.take();
        let (sent, deltas, stop) = match way {
            Way::Aap => aap_turn(http, url, &session, prompt).await?,
            Way::Native => native_turn(http, url, &session, prompt).await?,
        };
        let responses = proxy.take();
        let [reads] = responses.as_slice() else { bail!("{} model responses for one turn", responses.len()) };
        let tokens = tokens(reads)?;
        let sent_text: String = tokens.iter().map(|(_, t)| t.as_str()).collect();
        let got_text: String = deltas.iter().map(|(_, t)| t.as_str()).collect();
        if sent_text != got_text {
            measured
                .violations
                .push(format!("{}: the deltas are not the model's text: {got_text:?} vs {sent_text:?}", way.name()));
            continue;
        }
        if !matches!(stop.as_str(), "end_turn" | "max_tokens") {
            measured.violations.push(format!("{}: a turn stopped {stop}", way.name()));
        }
        // Where each token ends in the text, and where each delta does.
        let mut ends = Vec::with_capacity(tokens.len());
        let mut len = 0;
        for (at, text) in &tokens {
            len += text.len();
            ends.push((len, *at));
        }
        let (mut done, mut first_token) = (0usize, 0usize);
        for (n, (at, text)) in deltas.iter().enumerate() {
            done += text.len();
            let last_token = ends.iter().position(|(end, _)| *end >= done).expect("the texts are equal");
            let added = at.saturating_duration_since(ends[last_token].1);
            measured.added.record(added);
            measured.hold.record(at.saturating_duration_since(ends[first_token].1));
            if n == 0 {
                measured.first_added.record(added);
                measured.first_seen.record(at.saturating_duration_since(sent));
            }
            first_token = last_token + 1;
        }
        measured.tokens += tokens.len() as u64;
        measured.deltas += deltas.len() as u64;
    }
    Ok(measured)
}

type Turn = (Instant, Vec<(Instant, String)>, String);

async fn aap_turn(http: &reqwest::Client, url: &str, session: &str, prompt: &str) -> anyhow::Result<Turn> {
    let body = json!({"stream": "delta", "messages": [{"role": "user", "content": prompt}]});
    let sent = Instant::now();
    let response = http.post(format!("{url}/sessions/{session}/turns")).json(&body).send().await?;
    let mut stream = EventStream::new(response).await?;
    let mut deltas = Vec::new();
    while let Some(event) = stream.next_raw().await? {
        let at = Instant::now();
        let data: Value = serde_json::from_str(&event.data)?;
        match event.event.as_str() {
            "text_delta" => deltas.push((at, data["delta"].as_str().unwrap_or_default().to_string())),
            "turn_stop" => return Ok((sent, deltas, data["stopReason"].as_str().unwrap_or_default().to_string())),
            _ => {}
        }
    }
    bail!("the AAP stream ended before turn_stop")
}

async fn native_turn(http: &reqwest::Client, url: &str, session: &str, prompt: &str) -> anyhow::Result<Turn> {
    // Every delta as it is logged: the stream's own 50 ms merge would hide what turnlog adds.
    let response = http.get(format!("{url}/sessions/{session}/events/stream?delta_flush_interval_ms=0")).send().await?;
    let mut stream = EventStream::new(response).await?;
    let message = json!({"events": [{"type": "user.message", "content": prompt}]});
    let sent = Instant::now();
    let posted = http.post(format!("{url}/sessions/{session}/events")).json(&message).send().await?;
    if !posted.status().is_success() {
        bail!("POST events answered {}", posted.status());
    }
    let mut deltas = Vec::new();
    while let Some(event) = stream.next_raw().await? {
        let at = Instant::now();
        match event.event.as_str() {
            "agent.message.delta" => {
                let data: Value = serde_json::from_str(&event.data)?;
                deltas.push((at, data["delta"].as_str().unwrap_or_default().to_string()));
            }
            "session.status_idle" => {
                let data: Value = serde_json::from_str(&event.data)?;
                return Ok((sent, deltas, data["stop_reason"]["type"].as_str().unwrap_or_default().to_string()));
            }
            _ => {}
        }
    }
    bail!("the native stream ended before session.status_idle")
}
