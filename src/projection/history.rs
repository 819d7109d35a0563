//! History: the conversation folded from the log. User messages, each model response as
//! one assistant message (thinking, text and tool calls in order), and tool results.
//! Permission decisions and deltas never appear; a denial appears as the tool result the
//! engine wrote for it. Tool calls that a seed history ends with are in it once: the events
//! that make them wait for the client do not repeat them.
//!
//! A turn may branch from an earlier one (`turn.branched`): the history then goes on from
//! the messages as they stood at that turn's end, kept for the last [`BRANCH_DEPTH`] turns.
//!
//! Two folds: the full history (every message, [`History::default`]) and the compacted one
//! the model reads ([`History::compacted`]), where each `history.compacted` replaces the
//! messages it names by its summary, or cuts their tool outputs.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

use crate::domain::event::Compaction;
use crate::domain::{Block, Event, EventBody, TurnId};
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
    /// Whether compactions apply.
    compacted: bool,
    /// The turn the last events belong to, and the messages at the end of each of the
    /// [`BRANCH_DEPTH`] turns before it, oldest first: what a branch goes on from.
    turn: Option<TurnId>,
    ends: VecDeque<(TurnId, Vec<Arc<Message>>)>,
}

/// How many of a session's last turns a new turn may branch from.
pub const BRANCH_DEPTH: usize = 32;

/// What a tool output cut by a compaction reads as.
pub const CUT_TOOL_OUTPUT: &str = "[tool output removed to fit the context window]";

impl History {
    /// The history as the model reads it: compactions applied.
    pub fn compacted() -> History {
        History { compacted: true, ..History::default() }
    }

    /// The message a summary of earlier messages stands as.
    pub fn summary_message(summary: &str) -> Message {
        let text = format!("Summary of the conversation before this point (the earlier messages were compacted to fit the context window):\n\n{summary}");
        Message::User { content: vec![Block::text(text)] }
    }

    /// Replaces the first `n` messages by a summary of them.
    pub fn summarise(messages: &mut Vec<Arc<Message>>, n: usize, summary: &str) {
        let n = n.min(messages.len());
        messages.splice(..n, [Arc::new(History::summary_message(summary))]);
    }

    /// Cuts the tool outputs of the first `n` messages.
    pub fn cut_tool_outputs(messages: &mut [Arc<Message>], n: usize) {
        let n = n.min(messages.len());
        for message in &mut messages[..n] {
            if let Message::Tool { tool_call_id, is_error, .. } = &**message {
                let content = vec![Block::text(CUT_TOOL_OUTPUT)];
                *message = Arc::new(Message::Tool { tool_call_id: tool_call_id.clone(), content, is_error: *is_error });
            }
        }
    }

    /// Whether a turn may branch from `turn`: one of the last turns before the current one,
    /// that did not end waiting for the client (its calls' answers went on in the next turn,
    /// and a conversation that ends with calls unanswered is not one a model takes).
    pub fn can_branch_from(&self, turn: TurnId) -> bool {
        let Some((_, messages)) = self.ends.iter().find(|(ended, _)| *ended == turn) else { return false };
        let calls = |message: &Arc<Message>| match &**message {
            Message::Assistant { content } => content.iter().any(|part| matches!(part, Part::ToolUse { .. })),
            _ => false,
        };
        !messages.last().is_some_and(calls)
    }

    pub fn apply(&mut self, event: &Event) {
        match &event.body {
            EventBody::TurnStarted {} => {
                if let Some(ended) = self.turn.filter(|turn| Some(*turn) != event.turn_id) {
                    if self.ends.len() == BRANCH_DEPTH {
                        self.ends.pop_front();
                    }
                    self.ends.push_back((ended, self.messages.clone()));
                }
                self.turn = event.turn_id;
            }
            EventBody::TurnBranched { from } => {
                if let Some((_, messages)) = self.ends.iter().find(|(ended, _)| ended == from) {
                    self.messages = messages.clone();
                    self.assistant_open = false;
                }
            }
            EventBody::HistoryCompacted { strategy, messages, summary, .. } if self.compacted => {
                self.assistant_open = false;
                match strategy {
                    Compaction::Summary => History::summarise(&mut self.messages, *messages as usize, summary),
                    Compaction::ToolOutputs => History::cut_tool_outputs(&mut self.messages, *messages as usize),
                }
            }
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
            | EventBody::AgentCustomToolUse { tool_call_id, name, input, .. } => {
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
