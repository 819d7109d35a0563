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
