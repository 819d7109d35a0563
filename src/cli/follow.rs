//! `turnlog tail` (follow a session in the terminal, across drops and restarts) and
//! `turnlog replay` (a session's events again, at their original pace).

use std::io::Write;
use std::time::Duration;

use futures_util::StreamExt;
use serde_json::Value;

use super::args::{ReplayArgs, ServeArgs, TailArgs};
use super::{data_dir, input, open_data_dir, run, Failure};
use crate::audit::{pages, Pace};
use crate::client::{Client, Followed, Reconnect};
use crate::domain::SessionId;
use crate::store::Log;

/// `turnlog tail` (the server at `127.0.0.1:8787` unless named).
pub fn tail_command(args: TailArgs) -> i32 {
    run("tail", async move {
        let server = args.remote.server.unwrap_or_else(|| "http://127.0.0.1:8787".into());
        let client = Client::new(&server, args.remote.api_key);
        let mut printer = Printer::new(std::io::stdout().lock(), args.json, args.types);
        tail(&client, &args.session, args.after, &mut printer).await
    })
}

/// `turnlog replay`: printed, or (`--into-session`) re-emitted into a new session.
pub fn replay_command(serve: &ServeArgs, args: ReplayArgs) -> i32 {
    run("replay", async move {
        let client = args.remote.client();
        if args.into_session {
            let client = client.ok_or_else(|| input("--into-session needs --server"))?;
            println!("{}", client.replay_into(&args.session, args.speed, args.from.as_deref()).await?);
            return Ok(());
        }
        let source = match client {
            Some(client) => From::Server(client),
            None => From::DataDir(data_dir(serve)?),
        };
        let mut printer = Printer::new(std::io::stdout().lock(), args.json, args.types);
        replay(&source, &args.session, args.from.as_deref(), args.speed, &mut printer).await.map(|_| ())
    })
}

/// How events are printed: raw JSON lines, or one readable line per event with text
/// deltas joined into one line.
pub struct Printer<W: Write> {
    out: W,
    json: bool,
    types: Vec<String>,
    /// A line of deltas is open (the message's id).
    open: Option<String>,
    /// Messages whose deltas were printed: their whole `agent.message` or `agent.thinking`
    /// says nothing new. (A turn interleaves a thinking block's deltas and a message's.)
    said: Vec<String>,
}

/// Messages remembered as said by their deltas, at most.
const SAID: usize = 16;

impl<W: Write> Printer<W> {
    pub fn new(out: W, json: bool, types: Vec<String>) -> Printer<W> {
        Printer { out, json, types, open: None, said: Vec::new() }
    }

    pub fn print(&mut self, event: &Value, raw: &str) -> std::io::Result<()> {
        let kind = event["type"].as_str().unwrap_or("?");
        if !self.types.is_empty() && !self.types.iter().any(|t| t == kind) {
            return Ok(());
        }
        if self.json {
            writeln!(self.out, "{raw}")?;
            return self.out.flush();
        }
        let message = event["message_id"].as_str().map(str::to_string);
        if kind.ends_with(".delta") {
            if self.open.is_some() && self.open != message {
                writeln!(self.out)?;
                self.open = None;
            }
            if self.open.is_none() {
                write!(self.out, "{} ", head(event))?;
                if let Some(id) = &message {
                    if self.said.len() == SAID {
                        self.said.remove(0);
                    }
                    self.said.push(id.clone());
                }
                self.open = message;
            }
            write!(self.out, "{}", event["delta"].as_str().unwrap_or(""))?;
            return self.out.flush();
        }
        if self.open.take().is_some() {
            writeln!(self.out)?;
        }
        // The deltas said it already.
        let whole = matches!(kind, "agent.message" | "agent.thinking");
        if let Some(at) = message.filter(|_| whole).and_then(|id| self.said.iter().position(|s| *s == id)) {
            self.said.remove(at);
            return self.out.flush();
        }
        writeln!(self.out, "{} {}", head(event), summary(kind, event))?;
        self.out.flush()
    }
}

/// `#seq HH:MM:SS.mmm type`
fn head(event: &Value) -> String {
    let at = event["created_at"].as_str().unwrap_or("");
    let time = at.split('T').nth(1).map_or("", |t| t.get(..12).unwrap_or(t));
    format!("#{} {time} {}", event["sequence_number"], event["type"].as_str().unwrap_or("?"))
}

fn text(blocks: &Value) -> String {
    let texts = blocks.as_array().into_iter().flatten().filter_map(|b| b["text"].as_str());
    texts.collect::<Vec<_>>().join(" ")
}

fn clip(text: String, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text,
    }
}

fn summary(kind: &str, event: &Value) -> String {
    let line = match kind {
        "user.message" | "agent.message" => text(&event["content"]),
        "agent.thinking" => event["thinking"].as_str().unwrap_or("").to_string(),
        "agent.tool_use" | "agent.custom_tool_use" => {
            format!("{}({})", event["name"].as_str().unwrap_or("?"), event["input"])
        }
        "agent.tool_result" | "user.custom_tool_result" => {
            format!("{}{}", if event["is_error"] == true { "error: " } else { "" }, text(&event["content"]))
        }
        "user.tool_confirmation" => format!("{} {}", event["result"].as_str().unwrap_or("?"), event["tool_use_id"]),
        "session.status_idle" => format!(
            "{} (in {} · out {})",
            // The log's own reason where the native view names the seed's beside it.
            event["stop_reason"]["detail"].as_str().or(event["stop_reason"]["type"].as_str()).unwrap_or("?"),
            event["usage"]["input_tokens"],
            event["usage"]["output_tokens"]
        ),
        "session.error" => {
            format!("{}: {}", event["code"].as_str().unwrap_or("?"), event["error"].as_str().unwrap_or(""))
        }
        "terminated" => event["reason"].as_str().unwrap_or("").to_string(),
        "turn.resumed" => {
            let count = |field: &str| event[field].as_array().map_or(0, Vec::len);
            format!(
                "attempt {}: {} message(s) discarded, {} call(s) run again, {} interrupted",
                event["attempt"],
                count("discarded"),
                count("rerun"),
                count("interrupted")
            )
        }
        _ => String::new(),
    };
    clip(line.replace('\n', " "), 200)
}

/// How `tail` reopens a stream: for as long as it takes, 100 ms after a drop and up to 2 s
/// apart.
const TAIL: Reconnect =
    Reconnect { pause: Duration::from_millis(100), max_pause: Duration::from_secs(2), attempts: None };

/// Follows `session` on a server until it ends (`terminated`), reconnecting with
/// `Last-Event-ID` after the last event printed whenever the stream drops, for as long as
/// it takes; events come once each, in order. The session not there (or not the
/// caller's), or a cursor the log does not hold, ends it.
pub async fn tail<W: Write>(
    client: &Client,
    session: &str,
    after: Option<String>,
    printer: &mut Printer<W>,
) -> Result<(), Failure> {
    let mut follow = client.follow(session, after, TAIL);
    while let Some(followed) = follow.next().await? {
        match followed {
            Followed::Event(frame) => {
                let Ok(event) = serde_json::from_str::<Value>(&frame.data) else { continue };
                printer.print(&event, &frame.data).map_err(input)?;
            }
            Followed::Dropped { after, .. } => eprintln!(
                "turnlog tail: the stream dropped; reconnecting after {}",
                after.as_deref().unwrap_or("the start")
            ),
        }
    }
    Ok(())
}

/// Where a replay reads a session's log from.
pub enum From {
    DataDir(std::path::PathBuf),
    /// The server paces it (`GET /sessions/{id}/replay`).
    Server(Client),
}

/// Prints `session`'s events (from event `from` on, if given) with the gaps between their
/// `created_at` times divided by `speed`.
pub async fn replay<W: Write>(
    source: &From,
    session: &str,
    from: Option<&str>,
    speed: f64,
    printer: &mut Printer<W>,
) -> Result<usize, Failure> {
    let mut printed = 0;
    match source {
        From::Server(client) => {
            let mut frames = client.replay(session, speed, from).await?;
            while let Some(frame) = frames.next().await {
                let frame = frame.map_err(|e| Failure::Input(format!("the replay stream broke: {e}")))?;
                let event: Value = serde_json::from_str(&frame.data).map_err(input)?;
                printer.print(&event, &frame.data).map_err(input)?;
                printed += 1;
            }
        }
        From::DataDir(dir) => {
            let mut pace = Pace::new(speed).map_err(input)?;
            let id: SessionId =
                session.parse().map_err(|_| Failure::Input(format!("{session:?} is not a session id")))?;
            let log = open_data_dir(dir, false)?;
            let replayed = replay_log(log.as_ref(), id, from, &mut pace, printer).await;
            log.close().await.map_err(input)?;
            printed = replayed?;
        }
    }
    if printed == 0 {
        return Err(Failure::Input(format!("no session {session}")));
    }
    Ok(printed)
}

/// Prints a log's replay at `pace`, page by page; the number of events printed.
async fn replay_log<W: Write>(
    log: &dyn Log,
    session: SessionId,
    from: Option<&str>,
    pace: &mut Pace,
    printer: &mut Printer<W>,
) -> Result<usize, Failure> {
    let mut replay = pages(log, session, from).await.map_err(input)?;
    let mut printed = 0;
    loop {
        let page = replay.next(log).await.map_err(input)?;
        if page.is_empty() {
            return Ok(printed);
        }
        for event in &page {
            pace.wait(event).await;
            let text = String::from_utf8_lossy(&event.json);
            printer.print(&serde_json::from_str(&text).map_err(input)?, &text).map_err(input)?;
            printed += 1;
        }
    }
}
