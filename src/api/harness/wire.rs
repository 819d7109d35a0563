//! The harness's request shapes, as `truefoundry-gateway-sdk` sends them, and the input of a
//! turn read into the session layer's [`Input`].

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use utoipa::{IntoParams, ToSchema};

use super::event::{Subject, TurnEvent, THREAD};
use crate::domain::{Block, TurnId};
use crate::error::ApiError;
use crate::projection::SessionSummary;
use crate::session::{Follows, Input};

/// Named apart from the AAP view's `CreateSession` in the OpenAPI document.
#[derive(Debug, Deserialize, ToSchema)]
#[schema(as = HarnessCreateSession)]
#[serde(deny_unknown_fields)]
pub struct CreateSession {
    /// A configured agent's name, or a catalog agent's id (one that is not there is not
    /// found: 404).
    pub agent_name: String,
    #[serde(default)]
    pub title: Option<String>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListSessions {
    pub agent_name: String,
    /// Only sessions this subject created (the `subject_slug` of `created_by_subject`).
    pub created_by_subject_slug: Option<String>,
    /// Sessions per page: 1 to 100, 100 when absent.
    pub limit: Option<usize>,
    pub order: Option<String>,
    pub page_token: Option<String>,
    pub start_timestamp: Option<String>,
    pub end_timestamp: Option<String>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateTurn {
    /// One user message, or an approval or a response for each call the last turn waits
    /// for.
    #[serde(default)]
    #[schema(schema_with = input_schema, required = true)]
    pub input: Option<Vec<Value>>,
    /// `auto` (the last turn), `none`, or a turn id.
    #[serde(default)]
    #[schema(pattern = "^(auto|none|turn_[0-7][0-9A-HJKMNP-TV-Z]{25})$")]
    pub previous_turn_id: Option<String>,
    #[serde(default = "streamed")]
    pub stream: bool,
}

fn streamed() -> bool {
    true
}

/// `input` as [`inputs`] reads it.
fn input_schema() -> utoipa::openapi::schema::Schema {
    let string = json!({"type": "string"});
    let item = |kind: &str, required: &[&str], mut properties: Value| {
        properties["type"] = json!({"type": "string", "enum": [kind]});
        let mut all = vec!["type"];
        all.extend(required);
        json!({"type": "object", "required": all, "properties": properties, "additionalProperties": false})
    };
    let base64 = "(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?";
    let parts = json!({"type": "array", "minItems": 1, "items": {"oneOf": [
        item("text", &["text"], json!({"text": string})),
        item("file", &["name", "data"], json!({
            "name": string,
            "data": {"type": "string", "pattern": format!("^data:[^,]*/[^,]*;base64,{base64}$")},
        })),
        item("file_upload", &["file"], json!({"file": {
            "type": "object", "required": ["filename", "file_data"], "additionalProperties": false,
            "properties": {
                "filename": string,
                "file_data": {"type": "string", "pattern": format!("^data:[^,]*/[^,]*;base64,{base64}$")},
            },
        }})),
    ]}});
    let thread = json!({"type": "string", "enum": [THREAD]});
    let message = item("user.message", &["content"], json!({"content": {"anyOf": [string, parts]}}));
    let approval = item(
        "user.tool_approval",
        &["thread_id", "tool_call_id", "approval"],
        json!({
            "thread_id": thread, "tool_call_id": string,
            "approval": {"oneOf": [
                {"type": "object", "required": ["status"], "additionalProperties": false,
                 "properties": {"status": {"type": "string", "enum": ["allow"]}}},
                {"type": "object", "required": ["status"], "additionalProperties": false,
                 "properties": {"status": {"type": "string", "enum": ["deny"]}, "reason": {"type": ["string", "null"]}}},
            ]},
        }),
    );
    let response = item(
        "user.tool_response",
        &["thread_id", "tool_call_id", "content"],
        json!({
            "thread_id": thread, "tool_call_id": string, "content": string,
        }),
    );
    crate::api::schema::schema(json!({"oneOf": [
        {"type": "array", "minItems": 1, "maxItems": 1, "items": message},
        {"type": "array", "minItems": 1, "items": {"oneOf": [approval, response]}},
    ]}))
}

#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Subscribe {
    #[serde(default, deserialize_with = "crate::api::body::integer")]
    pub after_sequence_number: Option<u64>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListTurns {
    pub limit: Option<usize>,
    pub page_token: Option<String>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListTurnEvents {
    pub limit: Option<usize>,
    pub order: Option<String>,
    pub page_token: Option<String>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListSessionEvents {
    pub limit: Option<usize>,
    pub last_turn_id: Option<String>,
    pub page_token: Option<String>,
}

/// A session as the SDK's `Session` model has it.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = HarnessSession)]
pub struct Session {
    #[serde(rename = "type")]
    pub kind: SessionTag,
    pub id: String,
    pub agent_name: String,
    pub created_by_subject: Subject,
    pub created_at: String,
    pub updated_at: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
}

#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
#[schema(as = HarnessSessionTag)]
pub enum SessionTag {
    #[serde(rename = "session")]
    Session,
}

/// A session as the SDK's `Session` model has it.
pub fn session(summary: &SessionSummary) -> Session {
    Session {
        kind: SessionTag::Session,
        id: summary.id.to_string(),
        agent_name: summary.spec.agent.name.clone(),
        created_by_subject: Subject::named(&summary.created_by),
        created_at: summary.created_at.clone(),
        updated_at: summary.updated_at.clone(),
        title: summary.spec.title.clone(),
    }
}

/// `{"data": ...}`: how the harness answers with one object.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = HarnessData)]
pub struct Data<T: ToSchema> {
    pub data: T,
}

/// A page: `pagination.limit` always (the SDK needs it), `next_page_token` only when more
/// exists.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = HarnessPage)]
pub struct Page<T: ToSchema> {
    pub data: Vec<T>,
    pub pagination: Pagination,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Pagination {
    pub limit: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_page_token: Option<String>,
}

/// An event of the session's list: the turn it belongs to, and the event.
#[derive(Debug, Serialize, ToSchema)]
pub struct SessionEvent {
    pub turn_id: String,
    pub event: TurnEvent,
}

/// What a cancel answers: `{}`.
#[derive(Debug, Default, Serialize, ToSchema)]
pub struct Cancelled {}

/// The turn a new one follows: `auto` (the default), `none` (the session has no turn yet),
/// or a turn id.
pub fn follows(previous_turn_id: Option<&str>) -> Result<Follows, ApiError> {
    match previous_turn_id {
        None | Some("auto") => Ok(Follows::Latest),
        Some("none") => Ok(Follows::Nothing),
        Some(id) => id.parse::<TurnId>().map(Follows::Turn).map_err(|_| {
            ApiError::invalid(format!(
                "invalid field `previous_turn_id`: {id:?} is not \"auto\", \"none\" or a turn id (turn_…)"
            ))
        }),
    }
}

#[derive(Deserialize)]
#[serde(tag = "type", deny_unknown_fields)]
enum Item {
    #[serde(rename = "user.message")]
    Message { content: Value },
    #[serde(rename = "user.tool_approval")]
    Approval { thread_id: String, tool_call_id: String, approval: Approval },
    #[serde(rename = "user.tool_response")]
    Response { thread_id: String, tool_call_id: String, content: String },
}

#[derive(Deserialize)]
#[serde(tag = "status", deny_unknown_fields)]
enum Approval {
    #[serde(rename = "allow")]
    Allow {},
    #[serde(rename = "deny")]
    Deny {
        #[serde(default)]
        reason: Option<String>,
    },
}

/// A turn's input: one user message, or a tool approval or response per waiting call (the
/// session layer checks the calls and refuses a message mixed with them).
pub fn inputs(items: Option<Vec<Value>>) -> Result<Vec<Input>, ApiError> {
    let items = items.unwrap_or_default();
    if items.is_empty() {
        return Err(ApiError::invalid(
            "invalid field `input`: give a user.message, or a user.tool_approval or user.tool_response for each \
             waiting tool call (turnlog has no MCP authorization to resume with an empty input)",
        ));
    }
    items.into_iter().enumerate().map(|(i, item)| input(i, item)).collect()
}

fn input(i: usize, item: Value) -> Result<Input, ApiError> {
    let field = |path: &str| if path == "." { format!("input[{i}]") } else { format!("input[{i}].{path}") };
    // serde reads a tag from a number too (the variant's index): `type` and `status` are names.
    for (tag, at) in
        [(item.get("type"), "type"), (item.get("approval").and_then(|a| a.get("status")), "approval.status")]
    {
        if tag.is_some_and(|tag| !tag.is_string()) {
            return Err(ApiError::invalid(format!("invalid field `{}`: a string is required", field(at))));
        }
    }
    let item: Item = serde_path_to_error::deserialize(item).map_err(|error| {
        let path = error.path().to_string();
        ApiError::invalid(format!("invalid field `{}`: {}", field(&path), error.into_inner()))
    })?;
    let thread = |thread_id: &str| {
        if thread_id == THREAD {
            Ok(())
        } else {
            Err(ApiError::invalid(format!(
                "invalid field `input[{i}].thread_id`: {thread_id:?}: a turnlog session has one thread, {THREAD:?}"
            )))
        }
    };
    Ok(match item {
        Item::Message { content } => Input::Message(message_content(i, content)?),
        Item::Approval { thread_id, tool_call_id, approval } => {
            thread(&thread_id)?;
            match approval {
                Approval::Allow {} => {
                    Input::Permission { call: tool_call_id, granted: true, reason: None, remember: false }
                }
                Approval::Deny { reason } => {
                    Input::Permission { call: tool_call_id, granted: false, reason, remember: false }
                }
            }
        }
        Item::Response { thread_id, tool_call_id, content } => {
            thread(&thread_id)?;
            Input::Result { call: tool_call_id, content: vec![Block::text(content)], is_error: false, ran: None }
        }
    })
}

/// A message's content: a string, or `text` and `file` parts (a file's `data` a base64
/// data URI), stored as given, or the seed's `file_upload` parts
/// (`{"type":"file_upload","file":{"filename","file_data"}}`), stored as the `file` part the
/// SDK reads back (`name` and `data`).
fn message_content(i: usize, content: Value) -> Result<Vec<Block>, ApiError> {
    let bad = |at: String, why: &str| ApiError::invalid(format!("invalid field `input[{i}].content{at}`: {why}"));
    let parts = match content {
        Value::String(text) => return Ok(vec![Block::text(text)]),
        Value::Array(parts) if !parts.is_empty() => parts,
        Value::Array(_) => return Err(bad(String::new(), "at least one part is needed")),
        _ => return Err(bad(String::new(), "a string or a list of text and file parts is expected")),
    };
    parts
        .into_iter()
        .enumerate()
        .map(|(n, part)| {
            let at = format!("[{n}]");
            let part = upload_as_file(part).map_err(|why| bad(at.clone(), why))?;
            let block: Block = serde_json::from_value(part).map_err(|e| bad(at.clone(), &e.to_string()))?;
            let string = |field: &str| block.rest.get(field).and_then(Value::as_str);
            let fields: Vec<&str> = block.rest.keys().map(String::as_str).collect();
            match block.kind.as_str() {
                "text" if block.text.is_some() && fields.is_empty() => Ok(block),
                "text" => Err(bad(at, "a text part is {\"type\":\"text\",\"text\":string}")),
                "file" if fields.len() == 2 && string("name").is_some() => match string("data").map(data_uri) {
                    Some(Ok(())) => Ok(block),
                    Some(Err(why)) => Err(bad(format!("{at}.data"), &why)),
                    None => Err(bad(format!("{at}.data"), "a string is required")),
                },
                "file" => Err(bad(at, "a file part is {\"type\":\"file\",\"name\":string,\"data\":string}")),
                other => {
                    Err(bad(format!("{at}.type"), &format!("{other:?} is not \"text\", \"file\" or \"file_upload\"")))
                }
            }
        })
        .collect()
}

/// A `file_upload` part as the `file` part it is stored as; any other part as it came.
fn upload_as_file(part: Value) -> Result<Value, &'static str> {
    const SHAPE: &str =
        "a file_upload part is {\"type\":\"file_upload\",\"file\":{\"filename\":string,\"file_data\":string}}";
    if part.get("type").and_then(Value::as_str) != Some("file_upload") {
        return Ok(part);
    }
    let Value::Object(mut fields) = part else { return Err(SHAPE) };
    let Some(Value::Object(mut file)) = fields.remove("file") else { return Err(SHAPE) };
    fields.remove("type");
    let (Some(Value::String(name)), Some(Value::String(data))) = (file.remove("filename"), file.remove("file_data"))
    else {
        return Err(SHAPE);
    };
    if !fields.is_empty() || !file.is_empty() {
        return Err(SHAPE);
    }
    Ok(json!({"type": "file", "name": name, "data": data}))
}

/// Checks `data:<mime>;base64,<payload>`.
fn data_uri(data: &str) -> Result<(), String> {
    let expected = "a data URI `data:<mime>;base64,<payload>` is expected";
    let Some((mime, payload)) = data.strip_prefix("data:").and_then(|rest| rest.split_once(";base64,")) else {
        return Err(expected.to_string());
    };
    if !mime.contains('/') || mime.contains(',') {
        return Err(format!("{mime:?} is not a MIME type; {expected}"));
    }
    let valid = payload.len() % 4 == 0
        && payload.trim_end_matches('=').bytes().all(|b| b.is_ascii_alphanumeric() || b == b'+' || b == b'/')
        && payload.len() - payload.trim_end_matches('=').len() <= 2;
    if !valid {
        return Err("the payload is not base64".to_string());
    }
    Ok(())
}

/// The harness's error body: `{"error":{"message","type","code"}}`.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = HarnessError)]
pub struct ErrorBody {
    #[schema(inline)]
    pub error: ErrorDetail,
}

#[derive(Debug, Serialize, ToSchema)]
#[schema(as = HarnessErrorDetail)]
pub struct ErrorDetail {
    pub message: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub code: &'static str,
}
