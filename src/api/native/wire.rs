//! What native clients send: the user event types, checked strictly (unknown fields and
//! wrong types are refused with the field named).

use serde::{Deserialize, Deserializer};
use serde_json::Value;

use crate::domain::event::Confirmation;
use crate::domain::{Block, EventBody};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PostEvents {
    pub events: Vec<UserEvent>,
}

#[derive(Debug, Deserialize)]
#[serde(tag = "type", deny_unknown_fields)]
pub enum UserEvent {
    #[serde(rename = "user.message")]
    Message {
        #[serde(deserialize_with = "content")]
        content: Vec<Block>,
    },
    #[serde(rename = "user.interrupt")]
    Interrupt {},
    #[serde(rename = "user.define_outcome")]
    DefineOutcome { outcome: Value },
    #[serde(rename = "user.tool_confirmation")]
    ToolConfirmation {
        tool_use_id: String,
        result: Confirmation,
        #[serde(default)]
        deny_message: Option<String>,
    },
    #[serde(rename = "user.custom_tool_result")]
    CustomToolResult {
        custom_tool_use_id: String,
        #[serde(default, deserialize_with = "content")]
        content: Vec<Block>,
        #[serde(default)]
        is_error: bool,
    },
}

impl From<UserEvent> for EventBody {
    fn from(event: UserEvent) -> EventBody {
        match event {
            UserEvent::Message { content } => EventBody::UserMessage { content },
            UserEvent::Interrupt {} => EventBody::UserInterrupt {},
            UserEvent::DefineOutcome { outcome } => EventBody::UserDefineOutcome { outcome },
            UserEvent::ToolConfirmation {
                tool_use_id,
                result,
                deny_message,
            } => EventBody::UserToolConfirmation {
                tool_use_id,
                result,
                deny_message,
            },
            UserEvent::CustomToolResult {
                custom_tool_use_id,
                content,
                is_error,
            } => EventBody::UserCustomToolResult {
                custom_tool_use_id,
                content,
                is_error,
            },
        }
    }
}

/// Content as a string or an array of blocks, each with a string `type`, and a string
/// `text` for text blocks.
pub fn content<'de, D: Deserializer<'de>>(de: D) -> Result<Vec<Block>, D::Error> {
    use serde::de::Error;
    match Value::deserialize(de)? {
        Value::String(text) => Ok(vec![Block::text(text)]),
        Value::Array(items) => items
            .into_iter()
            .enumerate()
            .map(|(i, item)| {
                let block: Block = serde_json::from_value(item)
                    .map_err(|e| D::Error::custom(format!("block {i}: {e}")))?;
                if block.kind == "text" && block.text.is_none() {
                    return Err(D::Error::custom(format!(
                        "block {i}: a text block needs a string `text`"
                    )));
                }
                Ok(block)
            })
            .collect(),
        other => Err(D::Error::custom(format!(
            "expected a string or an array of content blocks, got {other}"
        ))),
    }
}

#[derive(Debug, Default, Deserialize)]
pub struct ListQuery {
    pub after_id: Option<String>,
    pub before_id: Option<String>,
    pub limit: Option<usize>,
    pub order: Option<String>,
    /// One type, or several separated by commas.
    #[serde(rename = "type")]
    pub kind: Option<String>,
    #[serde(default)]
    pub types: Vec<String>,
}

#[derive(Debug, Default, Deserialize)]
pub struct StreamQuery {
    pub after_id: Option<String>,
    pub delta_flush_interval_ms: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::body::parse_json;

    #[test]
    fn unknown_fields_and_types_are_named() {
        let error = parse_json::<PostEvents>(
            br#"{"events":[{"type":"user.message","content":"hi","extra":1}]}"#,
        )
        .unwrap_err();
        assert!(
            error.message.contains("events[0]") && error.message.contains("extra"),
            "{}",
            error.message
        );
        let error =
            parse_json::<PostEvents>(br#"{"events":[{"type":"agent.message","content":[]}]}"#)
                .unwrap_err();
        assert!(error.message.contains("agent.message"), "{}", error.message);
        let error = parse_json::<PostEvents>(
            br#"{"events":[{"type":"user.message","content":[{"type":"text"}]}]}"#,
        )
        .unwrap_err();
        assert!(error.message.contains("text"), "{}", error.message);
    }

    #[test]
    fn string_content_becomes_a_text_block() {
        let parsed =
            parse_json::<PostEvents>(br#"{"events":[{"type":"user.message","content":"hi"}]}"#)
                .unwrap();
        let UserEvent::Message { content } = &parsed.events[0] else {
            panic!()
        };
        assert_eq!(content, &vec![Block::text("hi")]);
    }
}
