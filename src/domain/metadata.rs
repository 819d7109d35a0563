//! Metadata: a free map of JSON values on sessions, agents and environments, changed by
//! patches.

use serde_json::{Map, Value};

/// A metadata patch: a value sets its key, `null` deletes it.
pub fn apply_patch(metadata: &mut Map<String, Value>, patch: Map<String, Value>) {
    for (key, value) in patch {
        match value {
            Value::Null => metadata.remove(&key),
            value => metadata.insert(key, value),
        };
    }
}
