//! History: the conversation folded from the log. User messages, each model response as
//! one assistant message (thinking, text and tool calls in order), and tool results.
//! Permission decisions and deltas never appear; a denial appears as the tool result the
//! engine wrote for it. Tool calls that a seed history ends with are in it once: the events
//! that make them wait for the client do not repeat them.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use crate::domain::{Block, Event, EventBody};
pub use crate::domain::{Message, Part};

#[derive(Debug, Clone, Default)]
pub struct History {
    /// Shared, so that a turn's copy costs a pointer per message.
    pub messages: Vec<Arc<Message>>,
    /// Whether the next agent event continues the last assistant message (same response).
    assistant_open: bool,
    /// Tool-call event id → the model's call id, to place results.
    call_ids: HashMap<String, String>,
    /// Calls the seed history ends with, not yet recorded as waiting.
    seeded: HashSet<String>,
    /// User messages stored while a turn ran: they join the conversation when a turn
    /// takes them (`turn.input`), after what that turn answered.
    queued: Vec<(crate::domain::EventId, Vec<Block>)>,
}

impl History {
    pub fn apply(&mut self, event: &Event) {
        match &event.body {
            EventBody::SessionCreated { spec, .. } => {
                self.messages.extend(spec.messages.iter().cloned().map(Arc::new));
                self.seeded = crate::domain::message::waiting_calls(&spec.messages).map(|(id, _, _)| id).collect();
            }
            EventBody::UserMessage { content } if event.processed_at.is_none() => {
                self.queued.push((event.id, content.clone()));
            }
            EventBody::UserMessage { content } => {
                self.assistant_open = false;
                self.messages.push(Arc::new(Message::User { content: content.clone() }));
            }
            EventBody::TurnInput { event_ids } => {
                self.assistant_open = false;
                let (taken, waiting) =
                    std::mem::take(&mut self.queued).into_iter().partition(|(id, _)| event_ids.contains(id));
                self.queued = waiting;
                let taken: Vec<(crate::domain::EventId, Vec<Block>)> = taken;
                self.messages.extend(taken.into_iter().map(|(_, content)| Arc::new(Message::User { content })));
            }
            EventBody::ModelRequestStart { .. } => self.assistant_open = false,
            EventBody::AgentThinking { thinking, .. } => self.part(Part::Thinking { thinking: thinking.clone() }),
            EventBody::AgentMessage { content, .. } => self.part(Part::Text { text: Block::join_text(content) }),
            EventBody::AgentToolUse { tool_call_id, name, input, .. }
            | EventBody::AgentCustomToolUse { tool_call_id, name, input } => {
                self.call_ids.insert(event.id.to_string(), tool_call_id.clone());
                if self.seeded.remove(tool_call_id) {
                    return;
                }
                self.part(Part::ToolUse {
                    tool_call_id: tool_call_id.clone(),
                    name: name.clone(),
                    input: input.clone(),
                });
            }
            EventBody::AgentToolResult { tool_call_id, content, is_error, .. } => {
                self.tool(tool_call_id.clone(), content.clone(), *is_error);
            }
            EventBody::UserCustomToolResult { custom_tool_use_id, content, is_error, .. } => {
                let call = self.call_ids.get(custom_tool_use_id).cloned().unwrap_or_else(|| custom_tool_use_id.clone());
                self.tool(call, content.clone(), *is_error);
            }
            _ => {}
        }
    }

    fn part(&mut self, part: Part) {
        if self.assistant_open {
            if let Some(Message::Assistant { content }) = self.messages.last_mut().map(Arc::make_mut) {
                content.push(part);
                return;
            }
        }
        self.assistant_open = true;
        self.messages.push(Arc::new(Message::Assistant { content: vec![part] }));
    }

    fn tool(&mut self, tool_call_id: String, content: Vec<Block>, is_error: bool) {
        self.assistant_open = false;
        self.messages.push(Arc::new(Message::Tool { tool_call_id, content, is_error }));
    }
}
