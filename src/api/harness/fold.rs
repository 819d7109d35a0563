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

use super::event::{
    Action, Approval, CallRef, FinishReason, Function, FunctionTag, InputItem, McpInitialize, McpServer,
    MessageContent, MessageDelta, Metrics, ModelMessage, ModelMessageTag, Output, RequiredAction, Subject, ToolCall,
    ToolCallDelta, ToolInfo, ToolResponse, Turn, TurnCreated, TurnDone, TurnEvent, TurnState, THREAD,
};
use crate::domain::event::{Confirmation, McpRef, ModelStop, Permission, StopInfo, StopReason};
use crate::domain::{Block, Event, EventBody, EventId, RawEvent, TurnId, Usage};
use crate::projection::SessionSummary;

/// A harness event of a turn, with its sequence number and where it shows.
#[derive(Debug, Clone)]
pub struct Item {
    pub id: u64,
    pub place: Place,
    pub event: TurnEvent,
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
    created_by: Subject,
    started: Option<(EventId, String, u32)>,
    /// `turn.created` has been given: the turn's input is whole.
    created: bool,
    input: Vec<InputItem>,
    /// What came before `turn.created` could (a denied call's result, written as the turn
    /// starts): given right after it.
    held: Vec<Item>,
    message: Option<Assembly>,
    /// The last message of the turn, whole.
    output: Option<ModelMessage>,
    calls: HashMap<EventId, Call>,
    /// Messages stored while an earlier turn ran, that this one may take (`turn.input`).
    queued: HashMap<EventId, Vec<Block>>,
    interrupted: bool,
    error: Option<String>,
    usage: Usage,
    state: Option<TurnState>,
}

/// A model message being put together: one model request (its span), as the harness has
/// one message per model response.
struct Assembly {
    id: String,
    created_at: String,
    text: String,
    thinking: String,
    calls: Vec<ToolCall>,
    usage: Option<Usage>,
    finish: Option<FinishReason>,
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
    fn push(&mut self, place: Place, event: TurnEvent) {
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
            created_by: Subject::named(&session.created_by),
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
        let ended = self.ended();
        let mut out = Out { base: u64::from(number) * 10, items: Vec::new() };
        let mut given = self.apply(&event, number, &mut out);
        if ended {
            return Vec::new();
        }
        if !self.created {
            self.held.append(&mut out.items);
        }
        given.append(&mut out.items);
        given
    }

    /// What one event of the turn does: the events it makes go to `out`; what it gives at
    /// once is returned (`turn.created`, once the input is whole, and what waited for it).
    fn apply(&mut self, event: &Event, number: u32, out: &mut Out) -> Vec<Item> {
        let at = event.created_at.as_str();
        match &event.body {
            EventBody::TurnStarted {} => self.started = Some((event.id, event.created_at.clone(), number)),
            EventBody::TurnInput { .. }
            | EventBody::UserMessage { .. }
            | EventBody::UserToolConfirmation { .. }
            | EventBody::UserCustomToolResult { .. }
                if !self.created =>
            {
                self.take_input(&event.body)
            }
            EventBody::UserInterrupt {} => self.interrupted = true,
            EventBody::StatusRunning { .. } => return self.create(),
            EventBody::ModelRequestStart { .. } => {
                let given = self.create();
                self.close_message(out);
                self.open_message(out, event.id, true, at);
                return given;
            }
            EventBody::AgentThinkingDelta { .. }
            | EventBody::AgentMessageDelta { .. }
            | EventBody::AgentThinking { .. }
            | EventBody::AgentMessage { .. } => self.said(out, event),
            EventBody::AgentMcpTools { servers } => {
                let servers = servers
                    .iter()
                    .map(|s| McpServer {
                        id: s.server.clone(),
                        name: s.server.clone(),
                        transport_type: (s.transport != "stdio").then(|| s.transport.clone()),
                    })
                    .collect();
                let id = event.id.to_string();
                let init = McpInitialize { id, thread_id: THREAD, created_at: at.into(), mcp_servers: servers };
                out.push(Place::Both, TurnEvent::McpInitialize(init));
            }
            EventBody::AgentToolUse { .. } | EventBody::AgentCustomToolUse { .. } => self.called(out, event),
            EventBody::ModelRequestEnd { usage, is_error, stop_reason, .. } => {
                self.request_ended(out, *usage, *is_error, *stop_reason, at)
            }
            EventBody::AgentToolResult { tool_call_id, content, .. } => {
                let response = ToolResponse {
                    id: event.id.to_string(),
                    thread_id: THREAD,
                    created_at: at.into(),
                    tool_call_id: tool_call_id.clone(),
                    content: Block::join_text(content),
                };
                out.push(Place::Both, TurnEvent::ToolResponse(response));
            }
            EventBody::SessionError { error, .. } => self.error = Some(error.clone()),
            // The turn goes on after its process stopped: the message it was putting
            // together is void (no whole message is listed of it); the next attempt opens
            // its own.
            EventBody::TurnResumed { .. } => self.message = None,
            EventBody::StatusIdle { stop_reason, usage, .. } => {
                return self.stopped(out, event.id, stop_reason, *usage, at)
            }
            _ => {}
        }
        Vec::new()
    }

    /// What the client sent the turn, before it started: its input.
    fn take_input(&mut self, body: &EventBody) {
        match body {
            EventBody::TurnInput { event_ids } => {
                for content in event_ids.iter().filter_map(|id| self.queued.get(id)) {
                    self.input.push(InputItem::Message { content: MessageContent::of(content) });
                }
            }
            EventBody::UserMessage { content } => {
                self.input.push(InputItem::Message { content: MessageContent::of(content) })
            }
            EventBody::UserToolConfirmation { tool_use_id, result, deny_message, tool_call_id, .. } => {
                let approval = match result {
                    Confirmation::Allow => Approval::Allow,
                    Confirmation::Deny => Approval::Deny { reason: deny_message.clone() },
                };
                let tool_call_id = tool_call_id.clone().unwrap_or_else(|| tool_use_id.clone());
                self.input.push(InputItem::ToolApproval { thread_id: THREAD, tool_call_id, approval });
            }
            EventBody::UserCustomToolResult { custom_tool_use_id, content, tool_call_id, .. } => {
                let tool_call_id = tool_call_id.clone().unwrap_or_else(|| custom_tool_use_id.clone());
                let content = Block::join_text(content);
                self.input.push(InputItem::ToolResponse { thread_id: THREAD, tool_call_id, content });
            }
            _ => {}
        }
    }

    /// Text and thinking, as deltas of the message being put together. The final events
    /// hold what the deltas said; anything the deltas did not say goes out as one more delta.
    fn said(&mut self, out: &mut Out, event: &Event) {
        let at = event.created_at.as_str();
        let message = self.open_message(out, event.id, false, at);
        let (text, thinking) = match &event.body {
            EventBody::AgentThinkingDelta { delta, .. } => {
                message.thinking.push_str(delta);
                (None, Some(delta.clone()))
            }
            EventBody::AgentMessageDelta { delta, .. } => {
                message.text.push_str(delta);
                (Some(delta.clone()), None)
            }
            EventBody::AgentThinking { thinking, .. } => {
                let rest = thinking.strip_prefix(message.thinking.as_str()).filter(|r| !r.is_empty()).map(String::from);
                if rest.is_some() {
                    message.thinking = thinking.clone();
                }
                (None, rest)
            }
            EventBody::AgentMessage { content, .. } => {
                let text = Block::join_text(content);
                let rest = text.strip_prefix(message.text.as_str()).filter(|r| !r.is_empty()).map(String::from);
                if rest.is_some() {
                    message.text = text;
                }
                (rest, None)
            }
            _ => (None, None),
        };
        if text.is_some() || thinking.is_some() {
            let delta = MessageDelta { content: text, reasoning_content: thinking, ..message.delta(at) };
            out.push(Place::Stream, TurnEvent::ModelMessageDelta(delta));
        }
    }

    /// A tool call: a delta of its message, and remembered if it may wait for the client
    /// (a client tool's result, or a permission).
    fn called(&mut self, out: &mut Out, event: &Event) {
        let (tool_call_id, name, input, info, waits) = match &event.body {
            EventBody::AgentToolUse { tool_call_id, name, input, evaluated_permission, mcp, .. } => {
                let waits = *evaluated_permission == Permission::Ask;
                (tool_call_id, name, input, tool_info(name, mcp.as_ref()), waits.then_some(false))
            }
            EventBody::AgentCustomToolUse { tool_call_id, name, input, .. } => {
                (tool_call_id, name, input, tool_info(name, None), Some(true))
            }
            _ => return,
        };
        let at = event.created_at.as_str();
        let message = self.open_message(out, event.id, false, at);
        let call = ToolCall {
            id: tool_call_id.clone(),
            kind: FunctionTag::Function,
            function: Function { name: name.clone(), arguments: input.to_string() },
            tool_info: info,
        };
        let delta = ToolCallDelta { index: message.calls.len(), call: call.clone() };
        message.calls.push(call);
        let delta = MessageDelta { tool_calls: vec![delta], ..message.delta(at) };
        let source = message.id.clone();
        out.push(Place::Stream, TurnEvent::ModelMessageDelta(delta));
        if let Some(client) = waits {
            self.calls.insert(event.id, Call { tool_call_id: tool_call_id.clone(), source, client });
        }
    }

    /// A model request's end: the message's usage and how it ended, as its last delta; then
    /// the message whole, for the lists.
    fn request_ended(&mut self, out: &mut Out, usage: Usage, is_error: bool, stop: Option<ModelStop>, at: &str) {
        if let Some(message) = &mut self.message {
            message.usage = Some(usage);
            message.finish = (!is_error).then(|| finish_reason(stop, !message.calls.is_empty()));
            let delta = MessageDelta { usage: Some(usage.into()), finish_reason: message.finish, ..message.delta(at) };
            out.push(Place::Stream, TurnEvent::ModelMessageDelta(delta));
        }
        self.close_message(out);
    }

    /// The turn has stopped: the actions it waits for, and its one `turn.done`. A turn that
    /// stops again (another view answered some of its calls) keeps its one `turn.done`;
    /// its state is the latest.
    fn stopped(&mut self, out: &mut Out, id: EventId, stop: &StopInfo, usage: Usage, at: &str) -> Vec<Item> {
        let given = self.create();
        self.close_message(out);
        self.usage += usage;
        let waiting = match stop.kind {
            StopReason::RequiresAction => self.waiting(&stop.event_ids, at),
            _ => Vec::new(),
        };
        let first = self.state.is_none();
        let state = self.state_after(stop.kind, waiting.clone(), at);
        if first {
            for action in waiting {
                out.push(
                    Place::Both,
                    match action {
                        RequiredAction::Approval(action) => TurnEvent::ApprovalRequired(action),
                        RequiredAction::Response(action) => TurnEvent::ResponseRequired(action),
                    },
                );
            }
            let done = TurnDone { id: id.to_string(), state: state.clone(), created_at: at.into(), thread_id: None };
            out.push(Place::Lifecycle, TurnEvent::TurnDone(done));
        }
        self.state = Some(state);
        given
    }

    /// The turn as the harness's `Turn` object: running until it has stopped.
    pub fn turn(&self) -> Turn {
        Turn {
            id: self.turn.to_string(),
            session_id: self.session.clone(),
            previous_turn_id: self.previous.map(|t| t.to_string()),
            input: self.input.clone(),
            state: self.state.clone().unwrap_or(TurnState::Running),
            created_by_subject: self.created_by.clone(),
            created_at: self.started.as_ref().map(|(_, at, _)| at.clone()),
        }
    }

    /// `turn.created`, once the turn's input is whole, then what waited for it.
    fn create(&mut self) -> Vec<Item> {
        if self.created {
            return Vec::new();
        }
        self.created = true;
        let Some((id, created_at, number)) = &self.started else { return std::mem::take(&mut self.held) };
        let created = TurnCreated {
            id: id.to_string(),
            turn_id: self.turn.to_string(),
            previous_turn_id: self.previous.map(|t| t.to_string()),
            input: self.input.clone(),
            state: TurnState::Running,
            created_by: self.created_by.clone(),
            created_at: created_at.clone(),
            thread_id: None,
        };
        let event = TurnEvent::TurnCreated(created);
        let mut given = vec![Item { id: u64::from(*number) * 10, place: Place::Lifecycle, event }];
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
            let empty = ModelMessage {
                id: message.id.clone(),
                thread_id: THREAD,
                created_at: at.into(),
                content: None,
                reasoning_content: None,
                tool_calls: Vec::new(),
                finish_reason: None,
                usage: None,
            };
            out.push(Place::Stream, TurnEvent::ModelMessage(empty));
            self.message = Some(message);
        }
        self.message.as_mut().expect("just opened")
    }

    /// The message as a whole, for the lists, once its request has ended.
    fn close_message(&mut self, out: &mut Out) {
        if let Some(message) = self.message.take() {
            let whole = message.whole();
            out.push(Place::Listed, TurnEvent::ModelMessage(whole.clone()));
            self.output = Some(whole);
        }
    }

    /// The actions a stopped turn waits for: one `tool.approval_required` for the calls
    /// that need a permission, one `tool.response_required` for those that need a result.
    /// Each is named by the first call's event id.
    fn waiting(&self, ids: &[EventId], at: &str) -> Vec<RequiredAction> {
        let mut actions = Vec::new();
        for client in [false, true] {
            let calls: Vec<(&EventId, &Call)> = ids
                .iter()
                .filter_map(|id| self.calls.get(id).map(|c| (id, c)))
                .filter(|(_, c)| c.client == client)
                .collect();
            let Some((first, _)) = calls.first() else { continue };
            let refs = calls
                .iter()
                .map(|(_, c)| CallRef { id: c.tool_call_id.clone(), source_event_id: c.source.clone() })
                .collect();
            let action = Action { id: first.to_string(), created_at: at.into(), thread_id: THREAD, tool_calls: refs };
            actions.push(if client { RequiredAction::Response(action) } else { RequiredAction::Approval(action) });
        }
        actions
    }

    fn state_after(&self, stop: StopReason, waiting: Vec<RequiredAction>, at: &str) -> TurnState {
        let metrics = Metrics {
            total_input_tokens: self.usage.input_tokens,
            total_output_tokens: self.usage.output_tokens,
            total_tokens: self.usage.input_tokens + self.usage.output_tokens,
        };
        let completed_at = at.to_string();
        match stop {
            // A client's cancel leaves a `user.interrupt` in the turn; a turn the server
            // stopped (shutting down, or deleting the session) has none.
            StopReason::Cancelled => {
                let reason = if self.interrupted { "client-cancelled" } else { "abandoned" };
                TurnState::Cancelled { reason, completed_at, metrics }
            }
            StopReason::Error => {
                let message = self.error.clone().unwrap_or_else(|| "the turn failed".into());
                TurnState::Error { message, completed_at, metrics }
            }
            _ => TurnState::Done {
                output: self
                    .output
                    .clone()
                    .map(|message| Box::new(Output { kind: ModelMessageTag::ModelMessage, message })),
                required_actions: waiting,
                completed_at,
                metrics,
            },
        }
    }
}

impl Assembly {
    /// A delta of this message, with nothing in it yet.
    fn delta(&self, at: &str) -> MessageDelta {
        MessageDelta {
            id: self.id.clone(),
            thread_id: THREAD,
            created_at: at.into(),
            content: None,
            reasoning_content: None,
            tool_calls: Vec::new(),
            usage: None,
            finish_reason: None,
        }
    }

    fn whole(&self) -> ModelMessage {
        let text = |text: &String| Some(text.clone()).filter(|t| !t.is_empty());
        ModelMessage {
            id: self.id.clone(),
            thread_id: THREAD,
            created_at: self.created_at.clone(),
            content: text(&self.text),
            reasoning_content: text(&self.thinking),
            tool_calls: self.calls.clone(),
            finish_reason: self.finish,
            usage: self.usage.map(Into::into),
        }
    }
}

fn tool_info(name: &str, mcp: Option<&McpRef>) -> ToolInfo {
    match mcp {
        Some(mcp) => {
            ToolInfo::Mcp { server_id: mcp.server.clone(), server_name: mcp.server.clone(), name: mcp.tool.clone() }
        }
        None => ToolInfo::System { name: name.to_string() },
    }
}

/// How a model response ended, in the chat-completions words the harness uses. Logs from
/// before the model's own reason was kept say only whether it called tools.
fn finish_reason(stop: Option<ModelStop>, called: bool) -> FinishReason {
    match stop {
        Some(ModelStop::MaxTokens) => FinishReason::Length,
        Some(ModelStop::Refusal) => FinishReason::ContentFilter,
        Some(ModelStop::ToolUse) => FinishReason::ToolCalls,
        Some(ModelStop::EndTurn) => FinishReason::Stop,
        None if called => FinishReason::ToolCalls,
        None => FinishReason::Stop,
    }
}
