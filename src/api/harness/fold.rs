//! One turn of the log as the harness shows it. [`TurnFold`] takes the turn's events in log
//! order and gives, for each, the harness events it makes: the frames of the turn's stream
//! and the events its lists show. The stream, the lists and the `Turn` object are all this
//! one fold, so they never disagree.
//!
//! A harness event's sequence number is the turn sequence number of the log event it comes
//! from × 10, plus its place among the events that log event makes (at most four: from one
//! `session.status_idle`, a turn that stops for the client gives its last message whole,
//! `tool.approval_required`, `tool.response_required` and `turn.done`). Numbers are unique,
//! increase along the stream, and name the same event on every replay, so resuming after
//! any of them is exact; `id / 10` is the native `turn_sequence_number`.
//!
//! A turn ends at its first `turn.done`. What other views add to it later (answers to some
//! of its calls, or closing them) changes its state but shows in no stream or list.

use std::collections::HashMap;

use serde_json::{json, Map, Value};

use crate::domain::event::{Confirmation, ModelStop, Permission, StopReason};
use crate::domain::{Block, Event, EventBody, EventId, RawEvent, TurnId, Usage};
use crate::projection::SessionSummary;

/// The one thread of a turnlog session (the harness names sub-agents' threads otherwise).
pub const THREAD: &str = "main";

/// A harness event of a turn, with its sequence number and where it shows.
#[derive(Debug, Clone)]
pub struct Item {
    pub id: u64,
    pub place: Place,
    pub event: Value,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// The stream only: a message's empty first `model.message` and its deltas.
    Stream,
    /// The lists only: a `model.message` as a whole.
    Listed,
    /// The stream and both lists: tool responses and the actions a turn waits for.
    Both,
    /// The stream and the session's list: `turn.created` and `turn.done`.
    Lifecycle,
}

impl Place {
    pub fn streamed(self) -> bool {
        self != Place::Listed
    }

    /// In a turn's own event list (no lifecycle events, no deltas).
    pub fn in_turn_list(self) -> bool {
        matches!(self, Place::Listed | Place::Both)
    }

    /// In the session's event list (lifecycle events, no deltas).
    pub fn in_session_list(self) -> bool {
        self != Place::Stream
    }
}

pub struct TurnFold {
    turn: TurnId,
    session: String,
    previous: Option<TurnId>,
    created_by: Value,
    started: Option<(EventId, String, u32)>,
    /// `turn.created` has been given: the turn's input is whole.
    created: bool,
    input: Vec<Value>,
    /// What came before `turn.created` could (a denied call's result, written as the turn
    /// starts): given right after it.
    held: Vec<Item>,
    message: Option<Assembly>,
    /// The last message of the turn, whole.
    output: Option<Value>,
    calls: HashMap<EventId, Call>,
    /// Messages stored while an earlier turn ran, that this one may take (`turn.input`).
    queued: HashMap<EventId, Vec<Block>>,
    interrupted: bool,
    error: Option<String>,
    usage: Usage,
    state: Option<Value>,
}

/// A model message being put together: one model request (its span), as the harness has
/// one message per model response.
struct Assembly {
    id: String,
    created_at: String,
    text: String,
    thinking: String,
    calls: Vec<Value>,
    usage: Option<Usage>,
    finish: Option<&'static str>,
}

/// A call that may wait for the client, and the message that carried it.
struct Call {
    tool_call_id: String,
    source: String,
    client: bool,
}

/// The events one log event makes, numbered as they come.
struct Out {
    base: u64,
    items: Vec<Item>,
}

impl Out {
    fn push(&mut self, place: Place, event: Value) {
        let id = self.base + self.items.len() as u64;
        debug_assert!(self.items.len() < 10, "a log event makes at most four harness events");
        self.items.push(Item { id, place, event });
    }
}

impl TurnFold {
    pub fn new(session: &SessionSummary, turn: TurnId, previous: Option<TurnId>) -> TurnFold {
        TurnFold {
            turn,
            session: session.id.to_string(),
            previous,
            created_by: subject(&session.created_by),
            started: None,
            created: false,
            input: Vec::new(),
            held: Vec::new(),
            message: None,
            output: None,
            calls: HashMap::new(),
            queued: HashMap::new(),
            interrupted: false,
            error: None,
            usage: Usage::default(),
            state: None,
        }
    }

    /// The queued messages the turn's `turn.input` names (they lie before the turn in the
    /// log): its input begins with them.
    pub fn knowing(mut self, queued: &[RawEvent]) -> TurnFold {
        for raw in queued {
            if let Ok(Event { id, body: EventBody::UserMessage { content }, .. }) = raw.decode() {
                self.queued.insert(id, content);
            }
        }
        self
    }

    /// Whether the turn has ended (its first `turn.done` is given).
    pub fn ended(&self) -> bool {
        self.state.is_some()
    }

    /// The harness events `raw` makes, if it is an event of this turn.
    pub fn push(&mut self, raw: &RawEvent) -> Vec<Item> {
        let Some((turn, number)) = raw.turn() else { return Vec::new() };
        if turn != self.turn {
            return Vec::new();
        }
        let Ok(event) = raw.decode() else {
            tracing::error!(id = %raw.id, "an event of the log does not decode");
            return Vec::new();
        };
        let at = event.created_at.as_str();
        let ended = self.ended();
        let mut out = Out { base: u64::from(number) * 10, items: Vec::new() };
        let mut given = Vec::new();
        match &event.body {
            EventBody::TurnStarted {} => self.started = Some((event.id, event.created_at.clone(), number)),
            EventBody::TurnInput { event_ids } if !self.created => {
                for content in event_ids.iter().filter_map(|id| self.queued.get(id)) {
                    self.input.push(json!({"type": "user.message", "content": content_out(content)}));
                }
            }
            EventBody::UserMessage { content } if !self.created => {
                self.input.push(json!({"type": "user.message", "content": content_out(content)}))
            }
            EventBody::UserToolConfirmation { tool_use_id, result, deny_message, tool_call_id, .. }
                if !self.created =>
            {
                let approval = match (result, deny_message) {
                    (Confirmation::Allow, _) => json!({"status": "allow"}),
                    (Confirmation::Deny, Some(reason)) => json!({"status": "deny", "reason": reason}),
                    (Confirmation::Deny, None) => json!({"status": "deny"}),
                };
                self.input.push(json!({
                    "type": "user.tool_approval", "thread_id": THREAD,
                    "tool_call_id": tool_call_id.as_deref().unwrap_or(tool_use_id), "approval": approval,
                }));
            }
            EventBody::UserCustomToolResult { custom_tool_use_id, content, tool_call_id, .. } if !self.created => {
                self.input.push(json!({
                    "type": "user.tool_response", "thread_id": THREAD,
                    "tool_call_id": tool_call_id.as_deref().unwrap_or(custom_tool_use_id),
                    "content": Block::join_text(content),
                }));
            }
            EventBody::UserInterrupt {} => self.interrupted = true,
            EventBody::StatusRunning { .. } => given = self.create(),
            EventBody::ModelRequestStart { .. } => {
                given = self.create();
                self.close_message(&mut out);
                self.open_message(&mut out, event.id, true, at);
            }
            EventBody::AgentThinkingDelta { delta, .. } => {
                let message = self.open_message(&mut out, event.id, false, at);
                message.thinking.push_str(delta);
                let delta = json!({"reasoning_content": delta});
                out.push(Place::Stream, message.delta(at, delta));
            }
            EventBody::AgentMessageDelta { delta, .. } => {
                let message = self.open_message(&mut out, event.id, false, at);
                message.text.push_str(delta);
                out.push(Place::Stream, message.delta(at, json!({"content": delta})));
            }
            // The final events hold what the deltas said; anything the deltas did not say
            // goes out as one more delta.
            EventBody::AgentThinking { thinking, .. } => {
                let message = self.open_message(&mut out, event.id, false, at);
                if let Some(rest) = thinking.strip_prefix(message.thinking.as_str()).filter(|r| !r.is_empty()) {
                    let delta = message.delta(at, json!({"reasoning_content": rest}));
                    message.thinking = thinking.clone();
                    out.push(Place::Stream, delta);
                }
            }
            EventBody::AgentMessage { content, .. } => {
                let text = Block::join_text(content);
                let message = self.open_message(&mut out, event.id, false, at);
                if let Some(rest) = text.strip_prefix(message.text.as_str()).filter(|r| !r.is_empty()) {
                    let delta = message.delta(at, json!({"content": rest}));
                    message.text = text.clone();
                    out.push(Place::Stream, delta);
                }
            }
            EventBody::AgentMcpTools { servers } => {
                let servers: Vec<Value> = servers
                    .iter()
                    .map(|s| {
                        let mut server = json!({"id": s.server, "name": s.server});
                        // The SDK knows the HTTP transports only; stdio goes unnamed.
                        if s.transport != "stdio" {
                            server["transport_type"] = json!(s.transport);
                        }
                        server
                    })
                    .collect();
                out.push(
                    Place::Both,
                    json!({
                        "type": "mcp.initialize", "id": event.id.to_string(), "thread_id": THREAD,
                        "created_at": at, "mcp_servers": servers,
                    }),
                );
            }
            EventBody::AgentToolUse { tool_call_id, name, input, evaluated_permission, mcp } => {
                let waits = *evaluated_permission == Permission::Ask;
                let info = match mcp {
                    Some(mcp) => {
                        json!({"type": "mcp", "server_id": mcp.server, "server_name": mcp.server, "name": mcp.tool})
                    }
                    None => json!({"type": "truefoundry-system", "name": name}),
                };
                self.call(&mut out, event.id, at, (tool_call_id, name, input, info), waits.then_some(false));
            }
            EventBody::AgentCustomToolUse { tool_call_id, name, input } => {
                let info = json!({"type": "truefoundry-system", "name": name});
                self.call(&mut out, event.id, at, (tool_call_id, name, input, info), Some(true));
            }
            EventBody::ModelRequestEnd { usage, is_error, stop_reason, .. } => {
                if let Some(message) = &mut self.message {
                    message.usage = Some(*usage);
                    message.finish = (!is_error).then(|| finish_reason(*stop_reason, !message.calls.is_empty()));
                    let mut fields = json!({"usage": usage_out(*usage)});
                    if let Some(finish) = message.finish {
                        fields["finish_reason"] = json!(finish);
                    }
                    out.push(Place::Stream, message.delta(at, fields));
                }
                self.close_message(&mut out);
            }
            EventBody::AgentToolResult { tool_call_id, content, .. } => out.push(
                Place::Both,
                json!({
                    "type": "tool.response", "id": event.id.to_string(), "thread_id": THREAD, "created_at": at,
                    "tool_call_id": tool_call_id, "content": Block::join_text(content),
                }),
            ),
            EventBody::SessionError { error, .. } => self.error = Some(error.clone()),
            EventBody::StatusIdle { stop_reason, usage, .. } => {
                given = self.create();
                self.close_message(&mut out);
                self.usage += *usage;
                let waiting = match stop_reason.kind {
                    StopReason::RequiresAction => self.waiting(&stop_reason.event_ids, at),
                    _ => Vec::new(),
                };
                let first = self.state.is_none();
                let state = self.stopped(stop_reason.kind, waiting.clone(), at);
                // A turn that stops again (another view answered some of its calls) keeps
                // its one `turn.done`; its state is the latest.
                if first {
                    for action in waiting {
                        out.push(Place::Both, action);
                    }
                    let done = json!({
                        "type": "turn.done", "id": event.id.to_string(), "state": state,
                        "created_at": at, "thread_id": null,
                    });
                    out.push(Place::Lifecycle, done);
                }
                self.state = Some(state);
            }
            _ => {}
        }
        if ended {
            return Vec::new();
        }
        if !self.created {
            self.held.append(&mut out.items);
        }
        given.append(&mut out.items);
        given
    }

    /// The turn as the harness's `Turn` object: running until it has stopped.
    pub fn turn(&self) -> Value {
        let created_at = self.started.as_ref().map(|(_, at, _)| at.as_str());
        json!({
            "id": self.turn.to_string(),
            "session_id": self.session,
            "previous_turn_id": self.previous.map(|t| t.to_string()),
            "input": self.input,
            "state": self.state.clone().unwrap_or_else(|| json!({"status": "running"})),
            "created_by_subject": self.created_by,
            "created_at": created_at,
        })
    }

    /// `turn.created`, once the turn's input is whole, then what waited for it.
    fn create(&mut self) -> Vec<Item> {
        if self.created {
            return Vec::new();
        }
        self.created = true;
        let Some((id, created_at, number)) = &self.started else { return std::mem::take(&mut self.held) };
        let created = json!({
            "type": "turn.created", "id": id.to_string(), "turn_id": self.turn.to_string(),
            "previous_turn_id": self.previous.map(|t| t.to_string()), "input": self.input,
            "state": {"status": "running"}, "created_by": self.created_by, "created_at": created_at,
            "thread_id": null,
        });
        let mut given = vec![Item { id: u64::from(*number) * 10, place: Place::Lifecycle, event: created }];
        given.append(&mut self.held);
        given
    }

    /// The message being put together, opened (with its empty first frame) if none is. A
    /// message is named by its model request's start; one with none (tool calls a seed
    /// history left) by `msg_` and the id of its first event, which names nothing else.
    fn open_message(&mut self, out: &mut Out, first: EventId, spanned: bool, at: &str) -> &mut Assembly {
        if self.message.is_none() {
            let id = if spanned { first.to_string() } else { format!("msg_{}", first.ulid()) };
            let message = Assembly {
                id,
                created_at: at.to_string(),
                text: String::new(),
                thinking: String::new(),
                calls: Vec::new(),
                usage: None,
                finish: None,
            };
            let first = json!({"type": "model.message", "id": message.id, "thread_id": THREAD, "created_at": at});
            out.push(Place::Stream, first);
            self.message = Some(message);
        }
        self.message.as_mut().expect("just opened")
    }

    /// The message as a whole, for the lists, once its request has ended.
    fn close_message(&mut self, out: &mut Out) {
        if let Some(message) = self.message.take() {
            let whole = message.whole();
            out.push(Place::Listed, whole.clone());
            self.output = Some(whole);
        }
    }

    /// A tool call: a delta of its message, and remembered if it may wait for the client
    /// (`Some(true)` for a client tool's result, `Some(false)` for a permission).
    fn call(&mut self, out: &mut Out, id: EventId, at: &str, call: (&str, &str, &Value, Value), waits: Option<bool>) {
        let (tool_call_id, name, input, info) = call;
        let message = self.open_message(out, id, false, at);
        let index = message.calls.len();
        let arguments = input.to_string();
        message.calls.push(json!({
            "id": tool_call_id, "type": "function", "function": {"name": name, "arguments": arguments},
            "tool_info": info.clone(),
        }));
        let delta = message.delta(
            at,
            json!({"tool_calls": [{
                "index": index, "id": tool_call_id, "type": "function",
                "function": {"name": name, "arguments": arguments},
                "tool_info": info,
            }]}),
        );
        let source = message.id.clone();
        out.push(Place::Stream, delta);
        if let Some(client) = waits {
            self.calls.insert(id, Call { tool_call_id: tool_call_id.to_string(), source, client });
        }
    }

    /// The actions a stopped turn waits for: one `tool.approval_required` for the calls
    /// that need a permission, one `tool.response_required` for those that need a result.
    /// Each is named by the first call's event id.
    fn waiting(&self, ids: &[EventId], at: &str) -> Vec<Value> {
        let mut actions = Vec::new();
        for (kind, client) in [("tool.approval_required", false), ("tool.response_required", true)] {
            let calls: Vec<(&EventId, &Call)> = ids
                .iter()
                .filter_map(|id| self.calls.get(id).map(|c| (id, c)))
                .filter(|(_, c)| c.client == client)
                .collect();
            let Some((first, _)) = calls.first() else { continue };
            let refs: Vec<Value> =
                calls.iter().map(|(_, c)| json!({"id": c.tool_call_id, "source_event_id": c.source})).collect();
            actions.push(json!({
                "type": kind, "id": first.to_string(), "created_at": at, "thread_id": THREAD, "tool_calls": refs,
            }));
        }
        actions
    }

    fn stopped(&self, stop: StopReason, waiting: Vec<Value>, at: &str) -> Value {
        let metrics = json!({
            "total_input_tokens": self.usage.input_tokens,
            "total_output_tokens": self.usage.output_tokens,
            "total_tokens": self.usage.input_tokens + self.usage.output_tokens,
        });
        match stop {
            StopReason::Cancelled => {
                // A client's cancel leaves a `user.interrupt` in the turn; a turn the server
                // stopped (shutting down, or deleting the session) has none.
                let reason = if self.interrupted { "client-cancelled" } else { "abandoned" };
                json!({"status": "cancelled", "reason": reason, "completed_at": at, "metrics": metrics})
            }
            StopReason::Error => {
                let message = self.error.as_deref().unwrap_or("the turn failed");
                json!({"status": "error", "message": message, "completed_at": at, "metrics": metrics})
            }
            _ => json!({
                "status": "done", "output": self.output, "required_actions": waiting, "completed_at": at,
                "metrics": metrics,
            }),
        }
    }
}

impl Assembly {
    fn delta(&self, at: &str, fields: Value) -> Value {
        let mut delta = json!({"type": "model.message.delta", "id": self.id, "thread_id": THREAD, "created_at": at});
        if let (Some(delta), Value::Object(fields)) = (delta.as_object_mut(), fields) {
            delta.extend(fields);
        }
        delta
    }

    fn whole(&self) -> Value {
        let mut message = Map::new();
        message.insert("type".into(), json!("model.message"));
        message.insert("id".into(), json!(self.id));
        message.insert("thread_id".into(), json!(THREAD));
        message.insert("created_at".into(), json!(self.created_at));
        if !self.text.is_empty() {
            message.insert("content".into(), json!(self.text));
        }
        if !self.thinking.is_empty() {
            message.insert("reasoning_content".into(), json!(self.thinking));
        }
        if !self.calls.is_empty() {
            message.insert("tool_calls".into(), json!(self.calls));
        }
        if let Some(finish) = self.finish {
            message.insert("finish_reason".into(), json!(finish));
        }
        if let Some(usage) = self.usage {
            message.insert("usage".into(), usage_out(usage));
        }
        Value::Object(message)
    }
}

/// How a model response ended, in the chat-completions words the harness uses. Logs from
/// before the model's own reason was kept say only whether it called tools.
fn finish_reason(stop: Option<ModelStop>, called: bool) -> &'static str {
    match stop {
        Some(ModelStop::MaxTokens) => "length",
        Some(ModelStop::Refusal) => "content_filter",
        Some(ModelStop::ToolUse) => "tool_calls",
        Some(ModelStop::EndTurn) => "stop",
        None if called => "tool_calls",
        None => "stop",
    }
}

/// Usage as the harness reports it. turnlog does not break input tokens down by where they
/// came from: all of them count as `messages`.
fn usage_out(usage: Usage) -> Value {
    json!({
        "input_tokens": usage.input_tokens,
        "output_tokens": usage.output_tokens,
        "input_tokens_breakdown": {
            "harness": 0, "skills": 0, "instructions": 0, "tool_definitions": 0, "messages": usage.input_tokens,
        },
    })
}

/// Who made a session, as a harness subject.
pub fn subject(name: &str) -> Value {
    json!({"subject_id": name, "subject_type": "user", "subject_slug": name})
}

/// A user message's content as the harness reads it: one text block as a string (as it was
/// most likely sent), else text and `file` parts. Content other views stored (images and
/// documents with their data inline) shows as `file` parts; what has no such form is left out.
pub fn content_out(blocks: &[Block]) -> Value {
    if let [block] = blocks {
        if block.kind == "text" {
            return json!(block.text.as_deref().unwrap_or_default());
        }
    }
    let part = |block: &Block| -> Option<Value> {
        let string = |field: &str| block.rest.get(field).and_then(Value::as_str);
        match block.kind.as_str() {
            "text" => Some(json!({"type": "text", "text": block.text.as_deref().unwrap_or_default()})),
            "file" => Some(json!({"type": "file", "name": string("name")?, "data": string("data")?})),
            "image" | "document" => {
                let source = block.rest.get("source")?;
                if source.get("type")?.as_str()? != "base64" {
                    return None;
                }
                let (mime, data) = (source.get("media_type")?.as_str()?, source.get("data")?.as_str()?);
                Some(json!({"type": "file", "name": block.kind, "data": format!("data:{mime};base64,{data}")}))
            }
            _ => None,
        }
    };
    Value::Array(blocks.iter().filter_map(part).collect())
}
