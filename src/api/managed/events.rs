//! `/v1/sessions/{id}/events`: send user events (a message sent while a turn runs waits
//! for the next turn, as Anthropic's API does), list them, and stream them: live from the
//! moment of connect, or after a cursor (`after_id`, `Last-Event-ID`) from the durable log,
//! with `event_start`/`event_delta` previews when asked.

use std::collections::HashSet;
use std::time::Duration;

use actix_web::{get, post, HttpRequest, HttpResponse};
use bytes::BytesMut;
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::event::{self, Event, Frame, Preview};
use super::wire::{self, TimeQuery};
use super::{limit, page, time_bounds, CallerSession, Error, Json, Managed, Query};
use crate::api::sse::{self, Flow, Follow};
use crate::api::State;
use crate::domain::event::Confirmation;
use crate::domain::ids::prefixed;
use crate::domain::{Block, EventBody, RawEvent};
use crate::error::ApiError;
use crate::session::{Cursor, EventQuery, Input, Submission, WhenBusy};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SendEvents {
    events: Vec<Value>,
}

#[utoipa::path(
    tag = "managed",
    operation_id = "managed_events_send",
    params(("Idempotency-Key" = Option<String>, Header, description = "Names this write: sent again with the same key and body, it is answered as the first time and stored once (docs/idempotency.md)", min_length = 1, max_length = 255, pattern = "^[ -~]+$"), ("session_id" = String, Path, description = "The session's id")),
    request_body(content = super::request::SendEvents, description = "`{events: [user events]}`", example = json!({"events": [{"type": "user.define_outcome", "description": "done", "rubric": {"type": "text", "content": "done"}}]})),
    responses((status = 200, description = "`{data: [events as sent]}`", body = event::Sent)),
)]
#[post("/sessions/{session_id}/events")]
pub async fn send(
    state: State,
    CallerSession { summary, .. }: CallerSession<Managed>,
    body: Json<SendEvents>,
) -> Result<HttpResponse, Error> {
    let request = body.request_key();
    let events = body.0.events;
    if events.is_empty() {
        return Err(ApiError::invalid("invalid field `events`: at least one event is needed").into());
    }
    let allowed =
        ["user.message", "user.interrupt", "user.tool_confirmation", "user.custom_tool_result", "user.define_outcome"];
    let inputs = inputs("events", events, &allowed)?;
    let submission = Submission { inputs, when_busy: WhenBusy::Queue, request, ..Submission::default() };
    let submitted = state.sessions.submit(&summary, submission).await?;
    let data = submitted.events.iter().filter(|e| e.kind().starts_with("user.")).filter_map(render).collect();
    Ok(HttpResponse::Ok().json(event::Sent { data }))
}

fn render(raw: &RawEvent) -> Option<Event> {
    event::event(&raw.decode().ok()?)
}

/// The SDK's user events as input for the session, each checked strictly (`field[i]`
/// names the one that is wrong).
pub(super) fn inputs(field: &str, events: Vec<Value>, allowed: &[&str]) -> Result<Vec<Input>, ApiError> {
    events.into_iter().enumerate().map(|(i, event)| input(&format!("{field}[{i}]"), event, allowed)).collect()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Message {
    #[serde(rename = "type")]
    _kind: String,
    #[serde(deserialize_with = "crate::api::content::blocks")]
    content: Vec<Block>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Interrupt {
    #[serde(rename = "type")]
    _kind: String,
    #[serde(default)]
    session_thread_id: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ToolConfirmation {
    #[serde(rename = "type")]
    _kind: String,
    tool_use_id: String,
    result: Confirmation,
    #[serde(default)]
    deny_message: Option<String>,
    #[serde(default)]
    session_thread_id: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CustomToolResult {
    #[serde(rename = "type")]
    _kind: String,
    custom_tool_use_id: String,
    #[serde(default, deserialize_with = "crate::api::content::blocks")]
    content: Vec<Block>,
    #[serde(default)]
    is_error: Option<bool>,
    #[serde(default)]
    session_thread_id: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DefineOutcome {
    #[serde(rename = "type")]
    _kind: String,
    description: String,
    rubric: Value,
    #[serde(default, deserialize_with = "crate::api::body::integer")]
    max_iterations: Option<u32>,
}

fn input(at: &str, event: Value, allowed: &[&str]) -> Result<Input, ApiError> {
    let kind = event.get("type").and_then(Value::as_str).unwrap_or_default().to_string();
    if !allowed.contains(&kind.as_str()) {
        let why = match kind.as_str() {
            "user.tool_result" => {
                "this server runs its built-in tools itself; answer custom tools with user.custom_tool_result"
            }
            "system.message" => "this server takes no system messages in a session",
            _ => "not a user event type this takes",
        };
        return Err(ApiError::invalid(format!(
            "invalid field `{at}.type`: {kind:?}: {why}; it takes {}",
            allowed.join(", ")
        )));
    }
    read(at, &kind, event)
}

/// A user event of type `kind`, read by its type's fields.
fn read(at: &str, kind: &str, event: Value) -> Result<Input, ApiError> {
    let invalid = |e: serde_json::Error| ApiError::invalid(format!("invalid field `{at}`: {e}"));
    let thread = |thread: &Option<String>| match thread {
        Some(thread) => Err(ApiError::invalid(format!(
            "invalid field `{at}.session_thread_id`: {thread:?} is not a thread of this session (it has one)"
        ))),
        None => Ok(()),
    };
    let blocks = |content: &[Block], search_results: bool| {
        let problem = content.iter().enumerate().find_map(|(j, b)| Some((j, wire::block_problem(b, search_results)?)));
        match problem {
            Some((j, why)) => Err(ApiError::invalid(format!("invalid field `{at}.content[{j}]`: {why}"))),
            None => Ok(()),
        }
    };
    Ok(match kind {
        "user.message" => {
            let content = serde_json::from_value::<Message>(event).map_err(invalid)?.content;
            blocks(&content, false)?;
            Input::Message(content)
        }
        "user.interrupt" => {
            thread(&serde_json::from_value::<Interrupt>(event).map_err(invalid)?.session_thread_id)?;
            Input::Interrupt
        }
        "user.tool_confirmation" => {
            let c: ToolConfirmation = serde_json::from_value(event).map_err(invalid)?;
            thread(&c.session_thread_id)?;
            if c.result == Confirmation::Allow && c.deny_message.is_some() {
                return Err(ApiError::invalid(format!("invalid field `{at}.deny_message`: only a deny has a message")));
            }
            Input::Permission {
                call: c.tool_use_id,
                granted: c.result == Confirmation::Allow,
                reason: c.deny_message,
                remember: false,
            }
        }
        "user.custom_tool_result" => {
            let r: CustomToolResult = serde_json::from_value(event).map_err(invalid)?;
            thread(&r.session_thread_id)?;
            blocks(&r.content, true)?;
            Input::Result {
                call: r.custom_tool_use_id,
                content: r.content,
                is_error: r.is_error.unwrap_or(false),
                ran: None,
            }
        }
        _ => {
            let o: DefineOutcome = serde_json::from_value(event).map_err(invalid)?;
            if let Some(why) = wire::rubric_problem(&o.rubric) {
                return Err(ApiError::invalid(format!("invalid field `{at}.rubric`: {why}")));
            }
            let mut outcome = Map::new();
            outcome.insert("outcome_id".into(), json!(prefixed("outc_")));
            outcome.insert("description".into(), json!(o.description));
            outcome.insert("rubric".into(), o.rubric);
            if let Some(max) = o.max_iterations {
                outcome.insert("max_iterations".into(), json!(max));
            }
            Input::Outcome(Value::Object(outcome))
        }
    })
}

#[derive(Debug, Default, Deserialize)]
pub struct ListQuery {
    limit: Option<usize>,
    order: Option<String>,
    page: Option<String>,
    #[serde(default, deserialize_with = "crate::api::body::query_list")]
    types: Vec<String>,
    created_at: Option<TimeQuery>,
}

#[utoipa::path(
    tag = "managed",
    operation_id = "managed_events_list",
    params(("session_id" = String, Path, description = "The session's id"), ("limit" = Option<u32>, Query, description = "Page size (cut to the server's page size)"), ("order" = Option<String>, Query, description = "`asc` or `desc`"), ("page" = Option<String>, Query, description = "The `next_page` of the previous page"), ("types[]" = Option<Vec<String>>, Query), ("created_at[gt]" = Option<String>, Query, description = "RFC 3339"), ("created_at[gte]" = Option<String>, Query, description = "RFC 3339"), ("created_at[lt]" = Option<String>, Query, description = "RFC 3339"), ("created_at[lte]" = Option<String>, Query, description = "RFC 3339")),
    responses((status = 200, description = "`{data, next_page, prev_page}`", body = wire::Page<Event>)),
)]
#[get("/sessions/{session_id}/events")]
pub async fn list(
    state: State,
    CallerSession { summary, .. }: CallerSession<Managed>,
    query: Query<ListQuery>,
) -> Result<HttpResponse, Error> {
    let query = query.0;
    let limit = limit(query.limit, 1000, state.settings.limits.max_page_size)?;
    let newest_first = crate::api::body::newest_first(query.order.as_deref(), false)?;
    let shown = |t: &str| query.types.is_empty() || query.types.iter().any(|asked| asked == t);
    let mut kinds: Vec<String> =
        event::TYPES.iter().filter(|t| shown(t)).map(|t| event::log_kind(t).to_string()).collect();
    kinds.sort();
    kinds.dedup();
    // Every part of the query is checked, even when the types asked for leave nothing to show.
    let cursor = query.page.as_deref().map(Cursor::event).transpose()?;
    let (after, before) = if newest_first { (None, cursor) } else { (cursor, None) };
    let created = time_bounds("created_at", query.created_at.unwrap_or_default())?;
    if kinds.is_empty() {
        return Ok(page(Vec::<Event>::new(), None));
    }
    let events = EventQuery { after, before, limit, newest_first, kinds, created };
    let found = state.sessions.events(&summary, events).await?;
    let next = found.has_more.then(|| found.events.last().map(|e| e.id.to_string())).flatten();
    // A log type may render as two SDK types (a tool call, or an MCP server's): only those asked for.
    let rendered = found.events.iter().filter_map(render).filter(|e| shown(e.kind()));
    Ok(page(rendered.collect(), next))
}

#[derive(Debug, Default, Deserialize)]
pub struct StreamQuery {
    #[serde(default, deserialize_with = "crate::api::body::query_list")]
    event_deltas: Vec<String>,
    after_id: Option<String>,
    /// Only events of these types (as this view names them), as the list route takes them;
    /// previews asked for with `event_deltas` come whatever this says.
    #[serde(default, deserialize_with = "crate::api::body::query_list")]
    types: Vec<String>,
}

#[utoipa::path(
    tag = "managed",
    operation_id = "managed_events_stream",
    params(("session_id" = String, Path, description = "The session's id"), ("event_deltas[]" = Option<Vec<String>>, Query), ("types[]" = Option<Vec<String>>, Query, description = "Only events of these types"), ("after_id" = Option<String>, Query), ("Last-Event-ID" = Option<String>, Header)),
    responses((status = 200, description = "Events as SSE, each frame's `data` a `ManagedFrame`", body = String, content_type = "text/event-stream")),
)]
#[get("/sessions/{session_id}/events/stream")]
pub async fn stream(
    state: State,
    CallerSession { caller, summary, .. }: CallerSession<Managed>,
    query: Query<StreamQuery>,
    req: HttpRequest,
) -> Result<HttpResponse, Error> {
    let query = query.0;
    if let Some(other) = query.event_deltas.iter().find(|d| !matches!(d.as_str(), "agent.message" | "agent.thinking")) {
        let message = format!("invalid query `event_deltas`: {other:?} is not agent.message or agent.thinking");
        return Err(ApiError::invalid(message).into());
    }
    let header = req.headers().get("last-event-id").and_then(|v| v.to_str().ok());
    // Live from now, as the SDK's users expect; from the log after a cursor, when given.
    let follower = match Cursor::resume(query.after_id.as_deref(), header)? {
        Some(cursor) => state.sessions.follow(&summary, Some(cursor)).await?,
        None => state.sessions.follow_live(&summary).await?,
    };
    let settings = &state.settings.streams;
    let guard = state.streams.open(&caller.subject, settings.max_streams_per_subject)?;
    let mut previews = Previews::new(&query.event_deltas, query.types);
    let body = sse::follow(
        Follow {
            preamble: sse::retry(settings.retry_ms, b": connected\n\n"),
            follower,
            heartbeat: Duration::from_millis(settings.heartbeat_ms),
            merge_window: None,
            shutdown: state.shutdown.clone(),
            guard,
        },
        move |out, raw| previews.frame(out, raw),
    );
    Ok(sse::response().streaming(body))
}

/// The stream's frames: each event with `event:` (the SDK drops frames without one) and
/// its log id as `id:` (a cursor to resume after), deltas as previews when asked.
struct Previews {
    text: bool,
    thinking: bool,
    /// Messages announced with `event_start` on this stream.
    started: HashSet<String>,
    /// The event types asked for (all, when empty).
    types: Vec<String>,
}

impl Previews {
    fn new(asked: &[String], types: Vec<String>) -> Previews {
        let asks = |kind: &str| asked.iter().any(|a| a == kind);
        Previews { text: asks("agent.message"), thinking: asks("agent.thinking"), started: HashSet::new(), types }
    }

    fn frame(&mut self, out: &mut BytesMut, raw: &RawEvent) -> Flow {
        let Ok(event) = raw.decode() else { return Flow::Continue };
        let id = raw.id.to_string();
        let mut write = |frame: Frame| {
            let kind = match &frame {
                Frame::Event(event) => event.kind(),
                Frame::Preview(preview) => preview.kind(),
            };
            sse::frame(out, Some(&id), kind, &serde_json::to_vec(&frame).expect("serialises"));
        };
        match &event.body {
            EventBody::AgentMessageDelta { message_id, delta } if self.text => {
                if self.started.insert(message_id.clone()) {
                    write(Frame::Preview(Preview::start("agent.message", message_id)));
                }
                write(Frame::Preview(Preview::delta(message_id, delta)));
            }
            // Thinking previews are announcements only, as Anthropic's are.
            EventBody::AgentThinkingDelta { message_id, .. } if self.thinking => {
                if self.started.insert(message_id.clone()) {
                    write(Frame::Preview(Preview::start("agent.thinking", message_id)));
                }
            }
            _ => {
                let asked =
                    |event: &event::Event| self.types.is_empty() || self.types.iter().any(|t| t == event.kind());
                if let Some(event) = event::event(&event).filter(asked) {
                    write(Frame::Event(event));
                }
            }
        }
        if raw.kind() == "terminated" {
            return Flow::End;
        }
        Flow::Continue
    }
}
