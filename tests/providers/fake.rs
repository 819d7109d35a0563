//! A fake model server on loopback, on a raw `TcpListener` so that a test controls every
//! byte: status, headers, a body sent in HTTP/1.1 chunks as the real APIs send their
//! streams, a stream that stops sending but stays open, and whether the client closed
//! the connection. It records every request it received.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

/// One scripted answer.
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Body,
}

pub enum Body {
    /// One piece, with `content-length` (how the APIs send error bodies).
    Full(String),
    /// `transfer-encoding: chunked`, one HTTP chunk per piece, then the last chunk.
    Chunks(Vec<String>),
    /// These chunks, then nothing more: the connection stays open until the client
    /// closes it.
    Hang(Vec<String>),
    /// These chunks, then the connection is closed without the last chunk.
    Cut(Vec<String>),
    /// These chunks, each after this pause, then the last chunk.
    Slow(Vec<String>, Duration),
}

impl Reply {
    /// A 200 `text/event-stream` made of these pieces.
    pub fn sse(pieces: Vec<String>) -> Reply {
        Reply::stream(Body::Chunks(pieces))
    }

    pub fn stream(body: Body) -> Reply {
        Reply {
            status: 200,
            headers: vec![
                ("content-type".into(), "text/event-stream; charset=utf-8".into()),
                ("cache-control".into(), "no-cache".into()),
            ],
            body,
        }
    }

    /// An error status with a JSON body and extra headers (`retry-after`, ...).
    pub fn error(status: u16, body: &str, headers: &[(&str, &str)]) -> Reply {
        let mut all = vec![("content-type".to_string(), "application/json".to_string())];
        all.extend(headers.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        Reply { status, headers: all, body: Body::Full(body.to_string()) }
    }
}

/// A request as the fake server read it.
#[derive(Debug, Clone)]
pub struct Received {
    pub method: String,
    pub path: String,
    /// Names in lower case.
    pub headers: Vec<(String, String)>,
    pub raw_body: String,
    pub body: Value,
}

impl Received {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }
}

#[derive(Default)]
struct State {
    replies: Mutex<VecDeque<Reply>>,
    received: Mutex<Vec<Received>>,
    closed: Mutex<usize>,
    closed_notify: Notify,
}

pub struct FakeServer {
    /// `http://127.0.0.1:PORT`
    pub url: String,
    state: Arc<State>,
}

impl FakeServer {
    /// Serves `replies` in order, one per request; after them, 418.
    pub async fn start(replies: Vec<Reply>) -> FakeServer {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().unwrap());
        let state = Arc::new(State::default());
        state.replies.lock().extend(replies);
        let serving = state.clone();
        tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                tokio::spawn(connection(socket, serving.clone()));
            }
        });
        FakeServer { url, state }
    }

    pub fn received(&self) -> Vec<Received> {
        self.state.received.lock().clone()
    }

    /// Waits until a hanging response's connection was closed by the client.
    pub async fn wait_closed(&self, within: Duration) -> bool {
        let wait = async {
            loop {
                let notified = self.state.closed_notify.notified();
                if *self.state.closed.lock() > 0 {
                    return;
                }
                notified.await;
            }
        };
        tokio::time::timeout(within, wait).await.is_ok()
    }
}

/// Serves requests on one connection (kept alive, as the client's pool expects).
async fn connection(mut socket: TcpStream, state: Arc<State>) {
    let mut buffer = Vec::new();
    while let Some(request) = read_request(&mut socket, &mut buffer).await {
        state.received.lock().push(request);
        let reply = state.replies.lock().pop_front();
        let reply = reply.unwrap_or_else(|| Reply::error(418, r#"{"error":"no reply scripted"}"#, &[]));
        if !respond(&mut socket, reply, &state).await {
            return;
        }
    }
}

async fn read_request(socket: &mut TcpStream, buffer: &mut Vec<u8>) -> Option<Received> {
    let head_end = loop {
        if let Some(end) = find(buffer, b"\r\n\r\n") {
            break end;
        }
        let mut chunk = [0u8; 8192];
        let n = socket.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buffer.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buffer[..head_end]).to_string();
    let mut lines = head.split("\r\n");
    let mut start = lines.next()?.split(' ');
    let (method, path) = (start.next()?.to_string(), start.next()?.to_string());
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let length: usize =
        headers.iter().find(|(k, _)| k == "content-length").and_then(|(_, v)| v.parse().ok()).unwrap_or(0);
    let body_start = head_end + 4;
    while buffer.len() < body_start + length {
        let mut chunk = [0u8; 8192];
        let n = socket.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buffer.extend_from_slice(&chunk[..n]);
    }
    let raw_body = String::from_utf8_lossy(&buffer[body_start..body_start + length]).to_string();
    buffer.drain(..body_start + length);
    Some(Received { body: serde_json::from_str(&raw_body).unwrap_or(Value::Null), method, path, headers, raw_body })
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Writes the reply; `false` when the connection must not be reused.
async fn respond(socket: &mut TcpStream, reply: Reply, state: &State) -> bool {
    let mut head = format!("HTTP/1.1 {} {}\r\n", reply.status, reason(reply.status));
    for (name, value) in &reply.headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    let (pieces, ending) = match reply.body {
        Body::Full(body) => {
            head.push_str(&format!("content-length: {}\r\n\r\n{body}", body.len()));
            return socket.write_all(head.as_bytes()).await.is_ok();
        }
        Body::Chunks(pieces) => (pieces, Ending::LastChunk),
        Body::Slow(pieces, pause) => {
            tokio::time::sleep(pause).await;
            (pieces, Ending::Paced(pause))
        }
        Body::Hang(pieces) => (pieces, Ending::Hang),
        Body::Cut(pieces) => (pieces, Ending::Cut),
    };
    head.push_str("transfer-encoding: chunked\r\n\r\n");
    if socket.write_all(head.as_bytes()).await.is_err() {
        return false;
    }
    for piece in &pieces {
        let chunk = format!("{:x}\r\n{piece}\r\n", piece.len());
        if socket.write_all(chunk.as_bytes()).await.is_err() {
            return false;
        }
        // Separate reads on the client, as a real stream arrives.
        let pause = match ending {
            Ending::Paced(pause) => pause,
            _ => Duration::from_millis(2),
        };
        tokio::time::sleep(pause).await;
    }
    match ending {
        Ending::LastChunk | Ending::Paced(_) => socket.write_all(b"0\r\n\r\n").await.is_ok(),
        Ending::Cut => false,
        Ending::Hang => {
            wait_for_close(socket).await;
            *state.closed.lock() += 1;
            state.closed_notify.notify_waiters();
            false
        }
    }
}

#[derive(Clone, Copy)]
enum Ending {
    LastChunk,
    Paced(Duration),
    Hang,
    Cut,
}

async fn wait_for_close(socket: &mut TcpStream) {
    let mut sink = [0u8; 1024];
    while let Ok(n) = socket.read(&mut sink).await {
        if n == 0 {
            return;
        }
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        418 => "I'm a teapot",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        529 => "Site Overloaded",
        _ => "Status",
    }
}
