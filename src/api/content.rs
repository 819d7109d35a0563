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

/// [`blocks`] as the OpenAPI document says it: a string, or a list of blocks, each an object
/// with a string `type`; a text block has a string `text`.
pub fn schema() -> utoipa::openapi::schema::Schema {
    crate::api::schema::schema(schema_json())
}

/// [`schema`], as JSON, to build others from.
pub fn schema_json() -> Value {
    serde_json::json!({"anyOf": [{"type": "string"}, {"type": "array", "items": block_schema(true)}]})
}

/// A block as [`crate::domain::Block`] reads it: any block's `text` is a string or null;
/// `with_text` says whether a text block must have a string `text` (as content does; a
/// tool's result in the AAP takes blocks as they come).
pub fn block_schema(with_text: bool) -> Value {
    let text = serde_json::json!({"type": ["string", "null"]});
    if !with_text {
        return serde_json::json!({
            "type": "object", "required": ["type"],
            "properties": {"type": {"type": "string"}, "text": text},
        });
    }
    serde_json::json!({"oneOf": [
        {"type": "object", "required": ["type", "text"],
         "properties": {"type": {"type": "string", "enum": ["text"]}, "text": {"type": "string"}}},
        {"type": "object", "required": ["type"],
         "properties": {"type": {"type": "string", "pattern": anything_but("text")}, "text": text}},
    ]})
}

/// A pattern for any string but `word`, without lookaround (which not every generator of
/// examples reads): `""`, a string that differs at some place of `word`, or `word` and more.
pub fn anything_but(word: &str) -> String {
    let mut pattern = String::from("[\\s\\S]+");
    for c in word.chars().rev() {
        let c = regex_escape(c);
        pattern = format!("(?:|[^{c}][\\s\\S]*|{c}{pattern})");
    }
    // `word` and more: the innermost alternative, once `word` is matched whole.
    format!("^{pattern}$")
}

fn regex_escape(c: char) -> String {
    if c.is_ascii_alphanumeric() {
        c.to_string()
    } else {
        format!("\\{c}")
    }
}
