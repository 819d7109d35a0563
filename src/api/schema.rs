//! Schemas for the OpenAPI document written as JSON, where a derived one cannot say what a
//! handler takes (unions by a field's value, patterns): read into utoipa's types, and
//! checked to read back as written, so that no keyword is dropped on the way.

use serde_json::Value;
use utoipa::openapi::schema::Schema;

/// `value` as a schema. Panics (when the document is built, at start-up and in every test
/// that builds it) if utoipa cannot hold all of it.
pub fn schema(value: Value) -> Schema {
    let schema: Schema = serde_json::from_value(value.clone()).expect("a valid schema");
    let back = serde_json::to_value(&schema).expect("a schema serialises");
    assert_eq!(back, value, "the schema reads back as written");
    schema
}

/// Any JSON value.
pub fn any() -> Value {
    serde_json::json!({"type": ["object", "array", "string", "number", "boolean", "null"]})
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn the_keywords_the_views_use_read_back() {
        for value in [
            json!({"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": false}),
            any(),
            json!({"type": ["string", "null"]}),
            json!({"type": "array", "minItems": 1, "items": {"type": "string"}}),
            json!({"type": "array", "items": {"oneOf": [{"type": "string"}, {"type": "boolean"}]}}),
        ] {
            let parsed: Schema = serde_json::from_value(value.clone()).unwrap();
            assert_eq!(serde_json::to_value(&parsed).unwrap(), value);
        }
    }

    #[test]
    fn the_document_builds() {
        crate::api::openapi::document(100);
    }
}
