//! The managed view's request bodies as the OpenAPI document says them: exactly what the
//! handlers take (the SDK's shapes, less what this server refuses by name: resources,
//! vaults, budgets, skills, threads), so that a request the document allows is one the
//! view accepts, and one it does not allow is refused.

use serde_json::{json, Value};
use utoipa::openapi::schema::Schema;

use super::wire::content_block_schema;
use crate::api::schema::schema;

fn object(required: &[&str], properties: Value) -> Value {
    let mut object = json!({"type": "object", "properties": properties, "additionalProperties": false});
    if !required.is_empty() {
        object["required"] = json!(required);
    }
    object
}

fn typed(kind: &str, required: &[&str], mut properties: Value) -> Value {
    properties["type"] = json!({"type": "string", "enum": [kind]});
    let mut all = vec!["type"];
    all.extend(required);
    object(&all, properties)
}

fn nullable(value: Value) -> Value {
    json!({"anyOf": [value, {"type": "null"}]})
}

/// What this server refuses by name when it has something in it: absent, null, or empty.
fn empty_list() -> Value {
    nullable(json!({"type": "array", "maxItems": 0, "items": crate::api::schema::any()}))
}

/// String values only (null deletes a key, where `patch`).
fn metadata(patch: bool) -> Value {
    let value = if patch { json!({"type": ["string", "null"]}) } else { json!({"type": "string"}) };
    nullable(json!({"type": "object", "additionalProperties": value}))
}

/// A name: something other than blanks.
fn name() -> Value {
    json!({"type": "string", "pattern": "\\S"})
}

/// Content as the SDK sends it: a string, or blocks its unions hold.
fn content(search_results: bool) -> Value {
    let mut blocks = content_block_schema();
    if !search_results {
        blocks["oneOf"]
            .as_array_mut()
            .expect("a union")
            .retain(|b| b["properties"]["type"]["enum"][0] != "search_result");
    }
    json!({"anyOf": [{"type": "string"}, {"type": "array", "items": blocks}]})
}

/// The SDK's user events (of the types `allowed`): each as this view reads it.
pub fn user_events(allowed: &[&str]) -> Value {
    let string = json!({"type": "string"});
    let thread = json!({"type": "null", "description": "A turnlog session has one thread"});
    let events = [
        typed("user.message", &["content"], json!({"content": content(false)})),
        typed("user.interrupt", &[], json!({"session_thread_id": thread})),
        // A deny may say why; an allow may not.
        json!({"oneOf": [
            typed("user.tool_confirmation", &["tool_use_id", "result"], json!({
                "tool_use_id": string, "result": {"type": "string", "enum": ["allow"]},
                "deny_message": {"type": "null"}, "session_thread_id": thread,
            })),
            typed("user.tool_confirmation", &["tool_use_id", "result"], json!({
                "tool_use_id": string, "result": {"type": "string", "enum": ["deny"]},
                "deny_message": {"type": ["string", "null"]}, "session_thread_id": thread,
            })),
        ]}),
        typed(
            "user.custom_tool_result",
            &["custom_tool_use_id"],
            json!({
                "custom_tool_use_id": string, "content": content(true), "is_error": {"type": ["boolean", "null"]},
                "session_thread_id": thread,
            }),
        ),
        typed(
            "user.define_outcome",
            &["description", "rubric"],
            json!({
                "description": string,
                "rubric": {"oneOf": [
                    {"type": "object", "required": ["type", "content"],
                     "properties": {"type": {"type": "string", "enum": ["text"]}, "content": string}},
                    {"type": "object", "required": ["type", "file_id"],
                     "properties": {"type": {"type": "string", "enum": ["file"]}, "file_id": string}},
                ]},
                "max_iterations": {"type": ["integer", "null"], "minimum": 0, "maximum": u32::MAX},
            }),
        ),
    ];
    let kinds =
        ["user.message", "user.interrupt", "user.tool_confirmation", "user.custom_tool_result", "user.define_outcome"];
    let shown: Vec<Value> = kinds.iter().zip(events).filter(|(k, _)| allowed.contains(k)).map(|(_, e)| e).collect();
    json!({"oneOf": shown})
}

/// `{"events": [...]}`: user messages (a message sent while a turn runs waits for the
/// next), or answers to waiting calls, never both in one request.
pub fn send_events() -> Schema {
    let list = |kinds: &[&str]| json!({"type": "array", "minItems": 1, "items": user_events(kinds)});
    let talking = list(&["user.message", "user.interrupt", "user.define_outcome"]);
    let answering =
        list(&["user.interrupt", "user.tool_confirmation", "user.custom_tool_result", "user.define_outcome"]);
    schema(object(&["events"], json!({"events": {"anyOf": [talking, answering]}})))
}

/// A `custom` tool.
fn custom_tool() -> Value {
    typed(
        "custom",
        &["name", "input_schema"],
        json!({
            "name": name(),
            "description": {"type": "string"},
            "input_schema": {
                "type": "object", "required": ["type"],
                "properties": {
                    "type": {"type": "string", "enum": ["object"]},
                    "properties": {"type": ["object", "null"]},
                    "required": {"anyOf": [{"type": "array", "items": {"type": "string"}}, {"type": "null"}]},
                },
            },
        }),
    )
}

/// `POST /v1/sessions`: an agent by id (or a configured agent's name), pinned to a version,
/// or with custom tools of the session's own; an environment; initial events.
pub fn create_session() -> Schema {
    let version = json!({"type": ["integer", "null"], "minimum": 0, "maximum": u32::MAX});
    let agent = json!({"oneOf": [
        {"type": "string", "description": "An agent's id, or a configured agent's name"},
        typed("agent", &["id"], json!({
            "id": {"type": "string"}, "version": version,
            "tools": {"type": "null"}, "model": {"type": "null"}, "system": {"type": "null"},
            "mcp_servers": {"type": "null"}, "skills": {"type": "null"},
        })),
        typed("agent_with_overrides", &["id"], json!({
            "id": {"type": "string"}, "version": version,
            "tools": nullable(json!({"type": "array", "items": custom_tool()})),
            "model": {"type": "null"}, "system": {"type": "null"},
            "mcp_servers": empty_list(), "skills": empty_list(),
        })),
    ]});
    let initial =
        json!({"type": "array", "maxItems": 50, "items": user_events(&["user.message", "user.define_outcome"])});
    schema(object(
        &["agent", "environment_id"],
        json!({
            "agent": agent,
            "environment_id": {"type": "string"},
            "title": {"type": ["string", "null"]},
            "metadata": metadata(false),
            "initial_events": nullable(initial),
            "resources": empty_list(),
            "vault_ids": empty_list(),
            "budget": {"type": "null"},
        }),
    ))
}

/// `POST /v1/sessions/{id}`: a title, a metadata patch, the session's own custom tools.
pub fn update_session() -> Schema {
    let agent = nullable(object(
        &[],
        json!({
            "tools": nullable(json!({"type": "array", "items": custom_tool()})),
            "mcp_servers": empty_list(),
        }),
    ));
    schema(object(
        &[],
        json!({
            "title": {"type": ["string", "null"]},
            "metadata": metadata(true),
            "agent": agent,
            "budget": {"type": "null"},
            "vault_ids": {"type": "null"},
        }),
    ))
}

/// An agent's tools: custom tools, and MCP servers' toolsets.
fn agent_tools() -> Value {
    let policy = nullable(json!({
        "type": "object", "required": ["type"], "additionalProperties": false,
        "properties": {"type": {"type": "string", "enum": ["always_allow", "always_ask"]}},
    }));
    let flag = json!({"type": ["boolean", "null"]});
    let toolset = typed(
        "mcp_toolset",
        &["mcp_server_name"],
        json!({
            "mcp_server_name": {"type": "string"},
            "default_config": nullable(object(&[], json!({"enabled": flag, "permission_policy": policy}))),
            "configs": {"type": "array", "items": object(&["name"], json!({
                "name": {"type": "string", "minLength": 1}, "enabled": flag, "permission_policy": policy,
            }))},
        }),
    );
    nullable(json!({"type": "array", "items": {"oneOf": [custom_tool(), toolset]}}))
}

/// `POST /v1/agents` (`create`) and `POST /v1/agents/{id}` (a change: `version` is the
/// latest's, else 409).
pub fn agent_body(create: bool) -> Schema {
    let mut properties = json!({
        "name": name(),
        "model": {"anyOf": [{"type": "string"}, {"type": "object", "required": ["id"], "properties": {"id": {"type": "string"}}}]},
        "description": {"type": ["string", "null"]},
        "system": {"type": ["string", "null"]},
        "tools": agent_tools(),
        "metadata": metadata(!create),
        // Each named once, with an `mcp_toolset` in `tools` that names it (a rule no schema
        // says); a URL on `tools.mcp.allowed_hosts` unless the caller is an admin.
        "mcp_servers": nullable(json!({"type": "array", "maxItems": 20, "items": typed("url", &["name", "url"], json!({
            "name": {"type": "string", "maxLength": 255, "pattern": "^[^\\u0000-\\u001f\\u007f-\\u009f]*\\S[^\\u0000-\\u001f\\u007f-\\u009f]*$"},
            "url": {"type": "string", "pattern": "^[Hh][Tt][Tt][Pp][Ss]?://"},
        }))})),
        "skills": empty_list(),
        "execution_identity": nullable(typed("service_account", &[], json!({}))),
        "multiagent": {"type": "null"},
    });
    // A new agent starts at version 1; a change names the version it changes.
    properties["version"] = match create {
        true => json!({"type": "null"}),
        false => json!({"type": ["integer", "null"], "minimum": 0, "maximum": u32::MAX}),
    };
    if !create {
        for field in ["name", "model"] {
            properties[field] = nullable(properties[field].take());
        }
    }
    schema(object(if create { &["name", "model"] } else { &[] }, properties))
}

/// `POST /v1/environments` and `POST /v1/environments/{id}`.
pub fn environment_body(create: bool) -> Schema {
    let strings = json!({"type": "array", "items": {"type": "string"}});
    let networking = json!({"oneOf": [
        {"type": "object", "required": ["type"], "properties": {"type": {"type": "string", "enum": ["unrestricted"]}}},
        json!({"type": "object", "required": ["type"], "properties": {
            "type": {"type": "string", "enum": ["limited"]},
            "allowed_hosts": strings, "allow_mcp_servers": {"type": "boolean"}, "allow_package_managers": {"type": "boolean"},
        }}),
    ]});
    let managers = ["apt", "cargo", "gem", "go", "npm", "pip"].map(|m| (m.to_string(), strings.clone()));
    let packages = json!({"type": "object", "properties": serde_json::Map::from_iter(managers)});
    let config = nullable(json!({"oneOf": [
        {"type": "object", "required": ["type"], "properties": {"type": {"type": "string", "enum": ["self_hosted"]}}},
        {"type": "object", "required": ["type"], "properties": {
            "type": {"type": "string", "enum": ["cloud"]},
            "networking": nullable(networking), "packages": nullable(packages),
        }},
    ]}));
    let name = if create { name() } else { json!({"type": ["string", "null"]}) };
    schema(object(
        if create { &["name"] } else { &[] },
        json!({
            "name": name,
            "config": config,
            "description": {"type": ["string", "null"]},
            "metadata": metadata(!create),
            "scope": {"type": ["string", "null"], "enum": ["organization", null]},
        }),
    ))
}

/// The request bodies, as types the handlers' documentation names (each handler reads its
/// body into a struct of its own; these say what that struct takes).
macro_rules! bodies {
    ($($name:ident = $schema:expr),* $(,)?) => {$(
        pub struct $name;

        impl utoipa::PartialSchema for $name {
            fn schema() -> utoipa::openapi::RefOr<Schema> {
                utoipa::openapi::RefOr::T($schema)
            }
        }

        impl utoipa::ToSchema for $name {
            fn name() -> std::borrow::Cow<'static, str> {
                concat!("Managed", stringify!($name)).into()
            }
        }
    )*};
}

bodies!(
    CreateSession = create_session(),
    UpdateSession = update_session(),
    SendEvents = send_events(),
    CreateAgent = agent_body(true),
    ChangeAgent = agent_body(false),
    CreateEnvironment = environment_body(true),
    ChangeEnvironment = environment_body(false),
);
