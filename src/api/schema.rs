//! Schemas for the OpenAPI document written as JSON, where a derived one cannot say what a
//! handler takes (unions by a field's value, patterns): read into utoipa's types, and
//! checked to read back as written, so that no keyword is dropped on the way.

use serde_json::Value;
use utoipa::openapi::schema::Schema;

/// `value` as a schema. Panics (when the document is built, at start-up and in every test
/// that builds it) if utoipa cannot hold all of it.
pub fn schema(value: Value) -> Schema {
    match read(&value) {
        Some(schema) => schema,
        None => panic!("utoipa does not hold this schema whole: {}", culprit(&value)),
    }
}

/// `schema` with JSON Schema keywords utoipa has no field for (`contains`, `maxContains`),
/// kept beside its own as it writes extensions.
pub fn with_keywords(mut schema: Schema, keywords: Value) -> Schema {
    let extensions = match &mut schema {
        Schema::Array(array) => &mut array.extensions,
        Schema::Object(object) => &mut object.extensions,
        Schema::OneOf(one_of) => &mut one_of.extensions,
        Schema::AnyOf(any_of) => &mut any_of.extensions,
        _ => panic!("no place for more keywords in this schema"),
    };
    let extensions = extensions.get_or_insert_with(Default::default);
    for (key, value) in keywords.as_object().expect("keywords are an object") {
        extensions.insert(key.clone(), value.clone());
    }
    schema
}

/// Any of `schemas`.
pub fn any_of(schemas: impl IntoIterator<Item = Schema>) -> Schema {
    let mut any_of = utoipa::openapi::schema::AnyOfBuilder::new();
    for schema in schemas {
        any_of = any_of.item(schema);
    }
    Schema::AnyOf(any_of.build())
}

fn read(value: &Value) -> Option<Schema> {
    let schema: Schema = serde_json::from_value(value.clone()).ok()?;
    (serde_json::to_value(&schema).ok()? == *value).then_some(schema)
}

/// The innermost part of `value` that does not read back, to name in the panic.
fn culprit(value: &Value) -> &Value {
    let children: Vec<&Value> = match value {
        Value::Object(map) => map.values().collect(),
        Value::Array(items) => items.iter().collect(),
        _ => Vec::new(),
    };
    for child in children {
        // A child that is a schema (or a list of them, or a map of properties) and fails.
        let fails = match child {
            Value::Object(map) if map.values().all(Value::is_object) && !map.is_empty() => {
                map.values().any(|v| read(v).is_none())
            }
            Value::Object(_) => read(child).is_none(),
            Value::Array(items) => items.iter().any(|v| v.is_object() && read(v).is_none()),
            _ => false,
        };
        if fails {
            return culprit(child);
        }
    }
    value
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
