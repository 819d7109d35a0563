//! What a model has said in one response, and how it goes out: its text and thinking are
//! held back and sent as one delta event per message at most every `delta_coalesce`, so
//! the log stays small; once the response is whole, the final events carry all of it.

use std::time::Duration;

use tokio::time::Instant;

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

/// When what is said goes out: a piece that comes after a quiet spell at once (a reply's
/// first token waits for nothing), the pieces that come within `window` of a delta going out
/// together at the window's end; so at most one delta event per window.
pub(super) struct Pace {
    window: Duration,
    sent: Option<Instant>,
}

impl Pace {
    pub fn new(window: Duration) -> Pace {
        Pace { window, sent: None }
    }

    /// A piece came at `now` with nothing waiting to go out: `None` if it goes out now
    /// (which is noted), else when it goes out.
    pub fn send_at(&mut self, now: Instant) -> Option<Instant> {
        let due = self.sent.map(|at| at + self.window).filter(|due| *due > now);
        if due.is_none() {
            self.sent = Some(now);
        }
        due
    }

    /// What waited went out at `now`.
    pub fn sent(&mut self, now: Instant) {
        self.sent = Some(now);
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

    /// The bytes of text and thinking said so far.
    pub fn bytes(&self) -> usize {
        self.text.len() + self.thinking.len()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_piece_after_a_quiet_spell_goes_out_at_once_and_those_in_the_window_at_its_end() {
        let ms = Duration::from_millis;
        let start = Instant::now();
        let mut pace = Pace::new(ms(25));
        assert_eq!(pace.send_at(start), None, "a reply's first piece goes out at once");
        assert_eq!(pace.send_at(start + ms(10)), Some(start + ms(25)), "within the window: at its end");
        pace.sent(start + ms(25));
        assert_eq!(pace.send_at(start + ms(30)), Some(start + ms(50)), "the window starts again where it went out");
        pace.sent(start + ms(50));
        assert_eq!(pace.send_at(start + ms(90)), None, "after a quiet spell: at once");
        assert_eq!(pace.send_at(start + ms(115)), None, "a whole window later: at once");
        let mut unpaced = Pace::new(Duration::ZERO);
        assert_eq!((unpaced.send_at(start), unpaced.send_at(start)), (None, None), "no window: every piece at once");
    }
}
