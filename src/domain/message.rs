//! A conversation as the model sees it and history shows it: system, user, assistant and
//! tool messages. Views render these in their own shapes.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::Block;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "snake_case")]
pub enum Message {
    System {
        content: String,
    },
    User {
        content: Vec<Block>,
    },
    Assistant {
        content: Vec<Part>,
    },
    Tool {
        tool_call_id: String,
        content: Vec<Block>,
        #[serde(default)]
        is_error: bool,
    },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Part {
    Text { text: String },
    Thinking { thinking: String },
    ToolUse { tool_call_id: String, name: String, input: Value },
}

/// So that a history can be given as messages or as shared ones (`Arc<Message>`).
impl AsRef<Message> for Message {
    fn as_ref(&self) -> &Message {
        self
    }
}

impl Message {
    /// The blocks of a user or tool message.
    pub fn content(&self) -> Option<&[Block]> {
        match self {
            Message::User { content } | Message::Tool { content, .. } => Some(content),
            _ => None,
        }
    }

    /// How long [`Message::text`] is, in bytes, measured without making it.
    pub fn text_len(&self) -> usize {
        match self {
            Message::System { content } => content.len(),
            Message::User { content } | Message::Tool { content, .. } => {
                content.iter().filter_map(|b| b.text.as_deref()).map(str::len).sum()
            }
            Message::Assistant { content } => content
                .iter()
                .map(|p| match p {
                    Part::Text { text } => text.len(),
                    _ => 0,
                })
                .sum(),
        }
    }

    /// The text of a user or tool message, or of an assistant message's text parts.
    pub fn text(&self) -> String {
        match self {
            Message::System { content } => content.clone(),
            Message::User { content } | Message::Tool { content, .. } => Block::join_text(content),
            Message::Assistant { content } => content
                .iter()
                .filter_map(|p| match p {
                    Part::Text { text } => Some(text.as_str()),
                    _ => None,
                })
                .collect(),
        }
    }
}

/// The tool calls a history ends with: those of its last message, if that is an assistant
/// message, that no later message answers. `(tool_call_id, name, input)`, in call order.
pub fn waiting_calls(messages: &[Message]) -> impl Iterator<Item = (String, String, Value)> + '_ {
    let last = match messages.last() {
        Some(Message::Assistant { content }) => content.as_slice(),
        _ => &[],
    };
    last.iter().filter_map(|part| match part {
        Part::ToolUse { tool_call_id, name, input } => Some((tool_call_id.clone(), name.clone(), input.clone())),
        _ => None,
    })
}
