//! What a model has said in one response, and how it goes out: its text and thinking are
//! held back and sent as one delta event per message at most every `delta_coalesce`, so
//! the log stays small; once the response is whole, the final events carry all of it.

use crate::domain::ids::prefixed;
use crate::domain::{Block, EventBody, Part};

/// The ids of one response's thinking and text, each carried by its deltas and its final
/// event: made up front, so a view can announce a message before it is whole (the
/// managed-agents previews name the final event by it).
pub(super) struct MessageIds {
    thinking: String,
    text: String,
}

impl MessageIds {
    pub fn new() -> MessageIds {
        MessageIds { thinking: prefixed("msg_"), text: prefixed("msg_") }
    }
}

/// Text and thinking so far, and what has not yet gone out as a delta event.
#[derive(Default)]
pub(super) struct Said {
    text: String,
    thinking: String,
    unsent_text: String,
    unsent_thinking: String,
}

impl Said {
    pub fn text(&mut self, text: &str) {
        self.text.push_str(text);
        self.unsent_text.push_str(text);
    }

    pub fn thinking(&mut self, text: &str) {
        self.thinking.push_str(text);
        self.unsent_thinking.push_str(text);
    }

    /// Whether something said has not gone out as a delta yet.
    pub fn unsent(&self) -> bool {
        !(self.unsent_text.is_empty() && self.unsent_thinking.is_empty())
    }

    /// The deltas of what has not gone out yet (thinking first), which then has.
    pub fn deltas(&mut self, ids: &MessageIds) -> Vec<EventBody> {
        let mut out = Vec::new();
        if !self.unsent_thinking.is_empty() {
            let delta = std::mem::take(&mut self.unsent_thinking);
            out.push(EventBody::AgentThinkingDelta { message_id: ids.thinking.clone(), delta });
        }
        if !self.unsent_text.is_empty() {
            let delta = std::mem::take(&mut self.unsent_text);
            out.push(EventBody::AgentMessageDelta { message_id: ids.text.clone(), delta });
        }
        out
    }

    /// The last deltas, then the final events of the thinking and the text; and the same
    /// as parts of the assistant's message in the history.
    pub fn finish(mut self, ids: &MessageIds) -> (Vec<EventBody>, Vec<Part>) {
        let mut bodies = self.deltas(ids);
        let mut parts = Vec::new();
        if !self.thinking.is_empty() {
            bodies.push(EventBody::AgentThinking { message_id: ids.thinking.clone(), thinking: self.thinking.clone() });
            parts.push(Part::Thinking { thinking: self.thinking });
        }
        if !self.text.is_empty() {
            bodies
                .push(EventBody::AgentMessage { message_id: ids.text.clone(), content: vec![Block::text(&self.text)] });
            parts.push(Part::Text { text: self.text });
        }
        (bodies, parts)
    }
}
