//! The harness's verbs over turnlog's HTTP API, a thin layer on turnlog's own client
//! ([`turnlog::client`]), and its SSE streams parsed by `sse-stream`.
//!
//! On the paths it measures the harness does the HTTP work itself, so that what it times
//! is the server's: an append's body is written by hand and its answer read as bytes
//! ([`Client::post_events_raw`]), and streams are read from the unread response
//! ([`Client::stream_raw`]).
//!
//! Event ids travel as `u128` (the ULID after `evt_`): compact, and ordered exactly as the
//! log orders a session's events.

use std::pin::Pin;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use futures_util::{Stream, StreamExt};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use sse_stream::{Sse, SseStream};
use turnlog::client::{Client, ClientError, NewSession, StreamFrom};
use ulid::Ulid;

use crate::server::Metrics;

pub fn event_id(id: u128) -> String {
    format!("evt_{}", Ulid(id))
}

pub fn parse_event_id(id: &str) -> Option<u128> {
    Some(Ulid::from_string(id.strip_prefix("evt_")?).ok()?.0)
}

/// Where a stream starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cursor {
    Start,
    /// `?after_id=` in the query.
    AfterId(u128),
    /// The `Last-Event-ID` header, as a reconnecting browser sends it.
    LastEventId(u128),
}

impl std::fmt::Display for Cursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Cursor::Start => write!(f, "the start"),
            Cursor::AfterId(id) => write!(f, "after_id {}", event_id(*id)),
            Cursor::LastEventId(id) => write!(f, "Last-Event-ID {}", event_id(*id)),
        }
    }
}

impl Cursor {
    pub fn id(&self) -> Option<u128> {
        match self {
            Cursor::Start => None,
            Cursor::AfterId(id) | Cursor::LastEventId(id) => Some(*id),
        }
    }

    fn from(&self) -> StreamFrom {
        match self {
            Cursor::Start => StreamFrom::Start,
            Cursor::AfterId(id) => StreamFrom::AfterId(event_id(*id)),
            Cursor::LastEventId(id) => StreamFrom::LastEventId(event_id(*id)),
        }
    }
}

/// An event as an append acknowledges it.
#[derive(Debug, Clone, Deserialize)]
pub struct Acked {
    pub id: String,
    pub sequence_number: u64,
}

/// An event as the list API returns it (the fields the checks need).
#[derive(Debug, Clone, Deserialize)]
pub struct LogEvent {
    pub id: String,
    pub sequence_number: u64,
    #[serde(rename = "type")]
    pub kind: String,
}

#[derive(Deserialize)]
struct Data<T> {
    data: Vec<T>,
}

#[derive(Clone)]
pub struct Api {
    pub client: Client,
}

impl Api {
    pub fn new(base: &str) -> Api {
        let http = reqwest::Client::builder()
            .tcp_nodelay(true)
            .connect_timeout(Duration::from_secs(10))
            .pool_idle_timeout(Duration::from_secs(30))
            .build()
            .expect("an HTTP client");
        Api { client: Client::with_http(base, None, http) }
    }

    pub async fn create_session(&self) -> anyhow::Result<String> {
        self.client.create_session(&NewSession::of("default")).await.context("POST /sessions")
    }

    /// Appends one `user.define_outcome` per text (`{"outcome": text}`): a user event the
    /// engine only records, so the log can be driven at full speed without starting turns
    /// (a `user.message` starts one, and a second while it runs is refused). Answers the
    /// stored events (once durable) and the size of the response body.
    pub async fn post_events(&self, session: &str, texts: &[String]) -> anyhow::Result<(Vec<Acked>, usize)> {
        self.post_events_keyed(session, texts, None).await
    }

    /// [`Api::post_events`], with `Idempotency-Key: key` if given (docs/idempotency.md).
    pub async fn post_events_keyed(
        &self,
        session: &str,
        texts: &[String],
        key: Option<&str>,
    ) -> anyhow::Result<(Vec<Acked>, usize)> {
        let mut body = String::with_capacity(texts.iter().map(|t| t.len() + 48).sum());
        body.push_str("{\"events\":[");
        for (i, text) in texts.iter().enumerate() {
            if i > 0 {
                body.push(',');
            }
            body.push_str("{\"type\":\"user.define_outcome\",\"outcome\":");
            body.push_str(&serde_json::to_string(text)?);
            body.push('}');
        }
        body.push_str("]}");
        let path = format!("/sessions/{session}/events");
        let mut request = self.client.request(reqwest::Method::POST, &path).header("content-type", "application/json");
        if let Some(key) = key {
            request = request.header("idempotency-key", key);
        }
        let response = self.client.send(request.body(body)).await.context("POST /sessions/{id}/events")?;
        let bytes = response.bytes().await?;
        let acked: Data<Acked> = serde_json::from_slice(&bytes).context("the append's answer")?;
        if acked.data.len() != texts.len() {
            bail!("POST /sessions/{session}/events: sent {} events, {} acknowledged", texts.len(), acked.data.len());
        }
        Ok((acked.data, bytes.len()))
    }

    /// The whole log of `session` through the list API, page by page.
    pub async fn log(&self, session: &str) -> anyhow::Result<Vec<LogEvent>> {
        self.log_as(session).await
    }

    pub async fn log_as<T: DeserializeOwned>(&self, session: &str) -> anyhow::Result<Vec<T>> {
        self.client.all_events(session, 1000).await.with_context(|| format!("listing the events of {session}"))
    }

    /// The native stream of `session` from the start as bytes, unparsed (see
    /// `scenarios::replay`); fails unless it is a 200.
    pub async fn stream_bytes(&self, session: &str) -> anyhow::Result<reqwest::Response> {
        self.client.stream_raw(session, &StreamFrom::Start).await.context("opening a stream")
    }

    /// Opens the native stream of `session` at `cursor`; fails unless it is a 200 SSE.
    pub async fn stream(&self, session: &str, cursor: Cursor) -> anyhow::Result<EventStream> {
        let response = self.client.stream_raw(session, &cursor.from()).await.context("opening a stream")?;
        EventStream::new(response).await
    }

    /// The status and the error (its code and message) of a stream request that is
    /// expected to fail.
    pub async fn stream_refusal(&self, session: &str, cursor: Cursor) -> anyhow::Result<(u16, String)> {
        match self.client.stream_raw(session, &cursor.from()).await {
            Ok(_) => Ok((200, String::new())),
            Err(ClientError::Refused(refusal)) => {
                let code = refusal.code.as_deref().unwrap_or("no code");
                Ok((refusal.status.as_u16(), format!("{code}: {}", refusal.message())))
            }
            Err(error) => Err(error.into()),
        }
    }

    pub async fn metrics(&self) -> anyhow::Result<Metrics> {
        Ok(Metrics::parse(&self.client.metrics().await?))
    }
}

pub async fn text(response: reqwest::Response) -> String {
    let mut body = response.text().await.unwrap_or_default();
    body.truncate(500);
    body
}

type Events = Pin<Box<dyn Stream<Item = Result<Sse, sse_stream::Error>> + Send>>;

/// An open SSE response.
pub struct EventStream {
    events: Events,
}

/// One SSE event: its `id:`, `event:` and `data:` fields (empty where the frame had none).
#[derive(Debug, Clone, Default)]
pub struct Event {
    pub id: String,
    pub event: String,
    pub data: String,
}

/// One log event as a stream delivered it, and when.
#[derive(Debug, Clone, Copy)]
pub struct Frame {
    pub id: u128,
    pub at: Instant,
}

impl EventStream {
    /// The stream of a 200 `text/event-stream` response. `sse-stream` parses it line by
    /// line, in one pass over each chunk: `eventsource-stream`, used before, parsed each
    /// line with `nom` and, fed a replay's large chunks, moved the rest of its buffer down
    /// after every line, so that the load client, not the server, bounded a replay.
    pub async fn new(response: reqwest::Response) -> anyhow::Result<EventStream> {
        let status = response.status();
        if status != 200 {
            bail!("stream answered {status}: {}", text(response).await);
        }
        let kind = response.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
        if !kind.starts_with("text/event-stream") {
            bail!("stream answered content-type {kind:?}, not text/event-stream");
        }
        Ok(EventStream { events: Box::pin(SseStream::from_bytes_stream(response.bytes_stream())) })
    }

    /// The next SSE event as it is; `None` when the server ended the stream. A block that
    /// only says `retry:` (how long a browser waits to reconnect) is no event.
    pub async fn next_raw(&mut self) -> anyhow::Result<Option<Event>> {
        loop {
            return match self.events.next().await {
                None => Ok(None),
                Some(Ok(sse)) if sse.id.is_none() && sse.event.is_none() && sse.data.is_none() => continue,
                Some(Ok(sse)) => Ok(Some(Event {
                    id: sse.id.unwrap_or_default(),
                    event: sse.event.unwrap_or_default(),
                    data: sse.data.unwrap_or_default(),
                })),
                Some(Err(error)) => Err(anyhow!("reading the stream: {error}")),
            };
        }
    }

    /// The next log event, checked: its `id:` is an event id and its data is that event
    /// (the stored JSON starts with the same id).
    pub async fn next(&mut self) -> anyhow::Result<Option<Frame>> {
        let Some(event) = self.next_raw().await? else {
            return Ok(None);
        };
        let at = Instant::now();
        let id =
            parse_event_id(&event.id).ok_or_else(|| anyhow!("an SSE event without an event id: id {:?}", event.id))?;
        if !data_is_event(&event) {
            let mut data = event.data;
            data.truncate(160);
            bail!("the data of SSE event {} (event: {}) is not that event: {data}", event.id, event.event);
        }
        Ok(Some(Frame { id, at }))
    }
}

/// Whether the data of `event` is the event its `id:` and `event:` lines name. The fast
/// path reads the head the server writes today (`{"id":…,"type":…`); anything else is
/// parsed, so key order is not part of the check.
fn data_is_event(event: &Event) -> bool {
    let head = [r#"{"id":""#, &event.id, r#"","type":""#, &event.event, "\""];
    let mut rest = event.data.as_str();
    if head.iter().all(|part| rest.strip_prefix(part).map(|r| rest = r).is_some()) {
        return true;
    }
    #[derive(Deserialize)]
    struct Head {
        id: String,
        #[serde(rename = "type")]
        kind: String,
    }
    serde_json::from_str::<Head>(&event.data).is_ok_and(|head| head.id == event.id && head.kind == event.event)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_ids_round_trip() {
        let id = Ulid::new().0;
        assert_eq!(parse_event_id(&event_id(id)), Some(id));
        assert_eq!(parse_event_id("sess_01ARZ3NDEKTSV4RRFFQ69G5FAV"), None);
        assert_eq!(parse_event_id("evt_nope"), None);
    }

    #[test]
    fn data_must_be_the_event_the_frame_names() {
        let event = |id: &str, kind: &str, data: &str| Event { id: id.into(), event: kind.into(), data: data.into() };
        assert!(data_is_event(&event("evt_1", "a", r#"{"id":"evt_1","type":"a","x":1}"#)));
        assert!(data_is_event(&event("evt_1", "a", r#"{"type":"a","id":"evt_1"}"#)));
        assert!(!data_is_event(&event("evt_1", "a", r#"{"id":"evt_2","type":"a"}"#)));
        assert!(!data_is_event(&event("evt_1", "a", r#"{"id":"evt_1","type":"b"}"#)));
        assert!(!data_is_event(&event("evt_1", "a", "not json")));
    }
}
