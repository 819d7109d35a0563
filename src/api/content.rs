//! Content blocks as clients send them (native, managed agents, AAP): a string (one text
//! block), or a list of blocks, each with a string `type` (and a string `text` for text).

use serde::{Deserialize, Deserializer};
use serde_json::Value;

use crate::domain::Block;

/// Content as a string or an array of blocks, each with a string `type`, and a string
/// `text` for text blocks.
pub fn blocks<'de, D: Deserializer<'de>>(de: D) -> Result<Vec<Block>, D::Error> {
    use serde::de::Error;
    match Value::deserialize(de)? {
        Value::String(text) => Ok(vec![Block::text(text)]),
        Value::Array(items) => items
            .into_iter()
            .enumerate()
            .map(|(i, item)| {
                let block: Block =
                    serde_json::from_value(item).map_err(|e| D::Error::custom(format!("block {i}: {e}")))?;
                if block.kind == "text" && block.text.is_none() {
                    return Err(D::Error::custom(format!("block {i}: a text block needs a string `text`")));
                }
                Ok(block)
            })
            .collect(),
        other => Err(D::Error::custom(format!("expected a string or an array of content blocks, got {other}"))),
    }
}
