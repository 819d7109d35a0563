//! How far a turn got, folded from its own events: what a turn whose process stopped goes
//! on from ([`crate::engine::decide::resume`]). Read once, when such a turn is found; the
//! actor's everyday folds skip the deltas and spans this one reads.

use crate::domain::event::{ModelStop, Permission};
use crate::domain::{Event, EventBody, EventId, TurnId, Usage};
use crate::projection::turns::{CallKind, PendingCall};

/// One turn's progress.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TurnProgress {
    pub turn: Option<TurnId>,
    /// How many times the turn was resumed already.
    pub resumes: u32,
    /// Model requests started.
    pub requests: u32,
    /// What the ended requests used.
    pub usage: Usage,
    /// The request whose end is not in the log.
    pub open_span: Option<OpenSpan>,
    /// How the last ended request stopped (`None`: it failed), and whether it made calls.
    pub last_stop: Option<(Option<ModelStop>, bool)>,
    /// Messages with deltas and no final event, not yet discarded, in the order they began.
    pub unfinished: Vec<String>,
    /// Calls the server runs (allowed at once) with no result yet, in call order.
    pub running_calls: Vec<PendingCall>,
    /// Whether the user interrupted the turn (its end as cancelled is not recorded).
    pub interrupted: bool,
    /// Calls denied at once whose denial is not recorded yet.
    pub denied: Vec<(EventId, String, String)>,
    /// Whether the request open (or last ended) made calls: they are recorded before its end.
    called: bool,
}

/// A model request whose end is not in the log.
#[derive(Debug, Clone, PartialEq)]
pub struct OpenSpan {
    pub span_id: String,
    pub model: String,
    /// Its `span.model_request_start`.
    pub start: EventId,
    /// Its input, as its start estimated it (0 in a log from before the estimate).
    pub input_tokens: u64,
    /// The bytes of text and thinking it streamed (the log's deltas).
    pub streamed_bytes: usize,
}

impl OpenSpan {
    /// What the request is counted to have used, had it been cut short now.
    pub fn estimated_usage(&self) -> Usage {
        Usage { input_tokens: self.input_tokens, output_tokens: Usage::estimated_tokens(self.streamed_bytes) }
    }
}

impl TurnProgress {
    pub fn new(turn: TurnId) -> TurnProgress {
        TurnProgress { turn: Some(turn), ..TurnProgress::default() }
    }

    /// Folds one event; events of other turns are ignored.
    pub fn apply(&mut self, event: &Event) {
        if event.turn_id.is_none() || event.turn_id != self.turn {
            return;
        }
        match &event.body {
            EventBody::ModelRequestStart { model, span_id, input_tokens } => {
                self.requests += 1;
                self.open_span = Some(OpenSpan {
                    span_id: span_id.clone(),
                    model: model.clone(),
                    start: event.id,
                    input_tokens: input_tokens.unwrap_or(0),
                    streamed_bytes: 0,
                });
                self.last_stop = None;
                self.called = false;
            }
            EventBody::ModelRequestEnd { span_id, usage, is_error, stop_reason, .. } => {
                if self.open_span.as_ref().is_some_and(|open| open.span_id == *span_id) {
                    self.open_span = None;
                }
                self.usage += *usage;
                self.last_stop = Some((if *is_error { None } else { *stop_reason }, self.called));
            }
            EventBody::AgentMessageDelta { message_id, delta }
            | EventBody::AgentThinkingDelta { message_id, delta } => {
                if let Some(open) = &mut self.open_span {
                    open.streamed_bytes += delta.len();
                }
                if !self.unfinished.contains(message_id) {
                    self.unfinished.push(message_id.clone());
                }
            }
            EventBody::AgentMessage { message_id, .. } | EventBody::AgentThinking { message_id, .. } => {
                self.unfinished.retain(|id| id != message_id);
            }
            EventBody::AgentToolUse { tool_call_id, name, input, evaluated_permission, mcp, idempotent } => {
                self.called = true;
                let call = PendingCall {
                    event_id: event.id,
                    tool_call_id: tool_call_id.clone(),
                    name: name.clone(),
                    input: input.clone(),
                    kind: CallKind::Ask,
                    mcp: mcp.clone(),
                    idempotent: *idempotent,
                };
                match evaluated_permission {
                    Permission::Allow => self.running_calls.push(call),
                    Permission::Deny => self.denied.push((event.id, tool_call_id.clone(), name.clone())),
                    Permission::Ask => {}
                }
            }
            EventBody::AgentCustomToolUse { .. } => self.called = true,
            EventBody::AgentToolResult { tool_use_id, .. } => {
                self.running_calls.retain(|call| call.event_id != *tool_use_id);
                self.denied.retain(|(id, ..)| id != tool_use_id);
            }
            EventBody::UserInterrupt {} => self.interrupted = true,
            EventBody::TurnResumed { attempt, discarded, .. } => {
                self.resumes = self.resumes.max(*attempt);
                self.unfinished.retain(|id| !discarded.contains(id));
            }
            _ => {}
        }
    }
}
