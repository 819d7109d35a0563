//! What native clients send: the user event types, checked strictly (unknown fields and
//! wrong types are refused with the field named).

use std::borrow::Cow;

use serde::de::IgnoredAny;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};
use utoipa::{IntoParams, ToSchema};

use crate::api::content::blocks;
use crate::domain::event::{ClientRun, Confirmation, Diff, Location, StopReason, TerminalRun};
use crate::domain::{Block, EventBody, RawEvent};
use crate::error::ApiError;

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PostEvents {
    /// User events: `user.message`, `user.interrupt`, `user.compact`, `user.define_outcome`,
    /// `user.tool_confirmation`, `user.custom_tool_result`.
    /// Kept as sent until each is read by its type, so that the body is parsed once.
    #[schema(schema_with = user_events)]
    pub events: Vec<Box<RawValue>>,
}

/// `events` in the OpenAPI document: user events, each as its type reads it (no other
/// fields); at most one user message, and none beside tool results or permissions.
fn user_events() -> utoipa::openapi::schema::Schema {
    use crate::api::schema::{any_of, schema, with_keywords};
    let event = |kind: &str, required: &[&str], properties: Value| {
        let mut properties = properties;
        properties["type"] = json!({"type": "string", "enum": [kind]});
        let mut all = vec!["type"];
        all.extend(required);
        json!({"type": "object", "required": all, "properties": properties, "additionalProperties": false})
    };
    let string = json!({"type": "string"});
    let content = crate::api::content::schema_json();
    let message = event("user.message", &["content"], json!({"content": content}));
    let interrupt = event("user.interrupt", &[], json!({}));
    let outcome = event("user.define_outcome", &["outcome"], json!({"outcome": crate::api::schema::any()}));
    let confirmation = event(
        "user.tool_confirmation",
        &["tool_use_id", "result"],
        json!({
            "tool_use_id": string,
            "result": {"type": "string", "enum": ["allow", "deny"]},
            "deny_message": {"type": ["string", "null"]},
            "remember": {"type": "boolean"},
        }),
    );
    let result = event(
        "user.custom_tool_result",
        &["custom_tool_use_id"],
        json!({
            "custom_tool_use_id": string, "content": content, "is_error": {"type": "boolean"}, "ran": client_run(),
        }),
    );
    let list = |items: Vec<&Value>| json!({"type": "array", "minItems": 1, "items": {"oneOf": items}});
    let talking = schema(list(vec![&message, &interrupt, &outcome]));
    let talking = with_keywords(talking, json!({"contains": message, "maxContains": 1}));
    let answering = schema(list(vec![&interrupt, &outcome, &confirmation, &result]));
    let compact = event("user.compact", &[], json!({}));
    let compacting = schema(json!({"type": "array", "minItems": 1, "maxItems": 1, "items": compact}));
    any_of([talking, answering, compacting])
}

/// `ran` on a `user.custom_tool_result`: how the client ran the call (see [`ClientRun`]).
fn client_run() -> Value {
    let string = json!({"type": "string"});
    // (An optional field may be null, as serde reads it.)
    let maybe_string = json!({"type": ["string", "null"]});
    let maybe_u32 = json!({"type": ["integer", "null"], "minimum": 0, "maximum": u32::MAX});
    let boolean = json!({"type": "boolean"});
    let object = |required: &[&str], properties: Value| {
        let mut object = json!({"type": "object", "properties": properties, "additionalProperties": false});
        if !required.is_empty() {
            object["required"] = json!(required);
        }
        object
    };
    let location = object(&["path"], json!({"path": string, "line": maybe_u32}));
    let diff = object(&["path", "new_text"], json!({"path": string, "old_text": maybe_string, "new_text": string}));
    let terminal = object(
        &["command"],
        json!({
            "command": string, "args": {"type": "array", "items": string}, "cwd": maybe_string,
            "truncated": boolean, "exit_code": maybe_u32, "signal": maybe_string, "timed_out": boolean,
        }),
    );
    let ran = object(
        &[],
        json!({
            "by": maybe_string, "permission": {"oneOf": [{"type": "string", "enum": ["allow", "deny"]}, {"type": "null"}]},
            "locations": {"type": "array", "items": location},
            "diff": {"oneOf": [diff, {"type": "null"}]}, "terminal": {"oneOf": [terminal, {"type": "null"}]},
        }),
    );
    json!({"oneOf": [ran, {"type": "null"}]})
}

/// The event types a client sends: the log's `user.*` types.
fn user_event_types() -> impl Iterator<Item = &'static str> {
    EventBody::TYPES.iter().copied().filter(|kind| kind.starts_with("user."))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Message {
    #[serde(rename = "type")]
    _kind: IgnoredAny,
    #[serde(deserialize_with = "blocks")]
    content: Vec<Block>,
}

/// An event with no fields but its type (`user.interrupt`, `user.compact`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Bare {
    #[serde(rename = "type")]
    _kind: IgnoredAny,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DefineOutcome {
    #[serde(rename = "type")]
    _kind: IgnoredAny,
    outcome: Value,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ToolConfirmation {
    #[serde(rename = "type")]
    _kind: IgnoredAny,
    tool_use_id: String,
    result: Confirmation,
    #[serde(default)]
    deny_message: Option<String>,
    #[serde(default)]
    remember: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CustomToolResult {
    #[serde(rename = "type")]
    _kind: IgnoredAny,
    custom_tool_use_id: String,
    #[serde(default, deserialize_with = "blocks")]
    content: Vec<Block>,
    #[serde(default)]
    is_error: bool,
    /// How the client ran the call (who, the user's answer, the files, edit and command).
    #[serde(default)]
    ran: Option<RanIn>,
}

/// `ran` as the native API takes it: [`ClientRun`]'s fields and no others (the stored form
/// reads fields it does not know, for a later version's events).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RanIn {
    #[serde(default)]
    by: Option<String>,
    #[serde(default)]
    permission: Option<Confirmation>,
    #[serde(default)]
    locations: Vec<LocationIn>,
    #[serde(default)]
    diff: Option<DiffIn>,
    #[serde(default)]
    terminal: Option<TerminalIn>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LocationIn {
    path: String,
    #[serde(default, deserialize_with = "crate::api::body::integer")]
    line: Option<u32>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DiffIn {
    path: String,
    #[serde(default)]
    old_text: Option<String>,
    new_text: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TerminalIn {
    command: String,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    cwd: Option<String>,
    #[serde(default)]
    truncated: bool,
    #[serde(default, deserialize_with = "crate::api::body::integer")]
    exit_code: Option<u32>,
    #[serde(default)]
    signal: Option<String>,
    #[serde(default)]
    timed_out: bool,
}

impl From<RanIn> for ClientRun {
    fn from(ran: RanIn) -> ClientRun {
        ClientRun {
            by: ran.by,
            permission: ran.permission,
            locations: ran.locations.into_iter().map(|l| Location { path: l.path, line: l.line }).collect(),
            diff: ran.diff.map(|d| Diff { path: d.path, old_text: d.old_text, new_text: d.new_text }),
            terminal: ran.terminal.map(|t| TerminalRun {
                command: t.command,
                args: t.args,
                cwd: t.cwd,
                truncated: t.truncated,
                exit_code: t.exit_code,
                signal: t.signal,
                timed_out: t.timed_out,
            }),
        }
    }
}

/// Just an event's type, read past everything else.
#[derive(Deserialize)]
struct Kind<'a> {
    #[serde(rename = "type", borrow, default)]
    kind: Option<Cow<'a, str>>,
}

/// Reads event `i` of a request, naming the failing field (`events[0].content`): its type
/// first (a scan, nothing kept), then the event, straight into that type's fields.
pub fn user_event(i: usize, event: &RawValue) -> Result<EventBody, ApiError> {
    let text = event.get();
    if !text.starts_with('{') {
        return Err(ApiError::invalid(format!("invalid field `events[{i}]`: expected an event object")));
    }
    let kind = match serde_json::from_str::<Kind>(text) {
        Ok(Kind { kind: Some(kind) }) => kind,
        _ => return Err(ApiError::invalid(format!("invalid field `events[{i}].type`: a string is required"))),
    };
    if !user_event_types().any(|known| known == kind) {
        let known: Vec<&str> = user_event_types().collect();
        return Err(ApiError::invalid(format!(
            "invalid field `events[{i}].type`: {kind:?} is not a user event type; expected one of {}",
            known.join(", ")
        )));
    }
    let parse = || -> Result<EventBody, serde_path_to_error::Error<serde_json::Error>> {
        let mut fields = serde_json::Deserializer::from_str(text);
        Ok(match kind.as_ref() {
            "user.message" => {
                let Message { content, .. } = serde_path_to_error::deserialize(&mut fields)?;
                EventBody::UserMessage { content }
            }
            "user.interrupt" => {
                let Bare { .. } = serde_path_to_error::deserialize(&mut fields)?;
                EventBody::UserInterrupt {}
            }
            "user.compact" => {
                let Bare { .. } = serde_path_to_error::deserialize(&mut fields)?;
                EventBody::UserCompact {}
            }
            "user.define_outcome" => {
                let DefineOutcome { outcome, .. } = serde_path_to_error::deserialize(&mut fields)?;
                EventBody::UserDefineOutcome { outcome }
            }
            "user.tool_confirmation" => {
                let ToolConfirmation { tool_use_id, result, deny_message, remember, .. } =
                    serde_path_to_error::deserialize(&mut fields)?;
                EventBody::UserToolConfirmation { tool_use_id, result, deny_message, tool_call_id: None, remember }
            }
            _ => {
                let CustomToolResult { custom_tool_use_id, content, is_error, ran, .. } =
                    serde_path_to_error::deserialize(&mut fields)?;
                let ran = ran.map(ClientRun::from);
                EventBody::UserCustomToolResult { custom_tool_use_id, content, is_error, tool_call_id: None, ran }
            }
        })
    };
    parse().map_err(|error| {
        let path = error.path().to_string();
        let at = if path == "." { format!("events[{i}]") } else { format!("events[{i}].{path}") };
        ApiError::invalid(format!("invalid field `{at}`: {}", error.into_inner()))
    })
}

#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    pub after_id: Option<String>,
    pub before_id: Option<String>,
    pub limit: Option<usize>,
    pub order: Option<String>,
    /// One type, or several separated by commas.
    #[serde(rename = "type")]
    pub kind: Option<String>,
    #[serde(default, deserialize_with = "crate::api::body::query_list")]
    pub types: Vec<String>,
}

#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct StreamQuery {
    pub after_id: Option<String>,
    /// Text and thinking deltas of one message are merged into one event per this many
    /// milliseconds (default 50, as the event-stream seed says); `0` sends every delta.
    pub delta_flush_interval_ms: Option<u64>,
    /// Only events of these types are sent (`types[]=a&types[]=b`); cursors
    /// stay ids of the whole log, so a filtered stream resumes exactly.
    #[serde(default, deserialize_with = "crate::api::body::query_list")]
    pub types: Vec<String>,
}

/// The merge window of a stream when the client names none.
pub const DEFAULT_DELTA_FLUSH_MS: u64 = 50;

/// The event-stream seed's stop reasons (`end_turn`, `cancel`, `max_turns`, `error`,
/// `requires_action`), from the log's. The seed has no name for a reply cut at the model's
/// output limit or refused by the model: the turn ended, and the client may go on, so they
/// are `end_turn` (the model's own reason is in the span's `span.model_request_end`).
pub fn stop_reason(reason: StopReason) -> &'static str {
    match reason {
        StopReason::EndTurn | StopReason::MaxTokens | StopReason::Refusal => "end_turn",
        StopReason::RequiresAction => "requires_action",
        StopReason::MaxTurnRequests => "max_turns",
        StopReason::Cancelled => "cancel",
        StopReason::Error => "error",
    }
}

/// An event as the native view sends it: as stored, but for a turn's end, whose
/// `stop_reason.type` is the seed's, with the log's own beside it as `detail` where the two
/// differ (so that nothing is lost to a client that knows turnlog's names).
pub fn wire_json(event: &RawEvent) -> Cow<'_, [u8]> {
    if event.kind() != "session.status_idle" {
        return Cow::Borrowed(&event.json);
    }
    let Ok(body) = serde_json::from_slice::<IdleStop>(&event.json) else { return Cow::Borrowed(&event.json) };
    let (ours, theirs) = (body.stop_reason.kind.as_str(), stop_reason(body.stop_reason.kind));
    if ours == theirs {
        return Cow::Borrowed(&event.json);
    }
    let stored = format!(r#""stop_reason":{{"type":"{ours}""#);
    let sent = format!(r#""stop_reason":{{"type":"{theirs}","detail":"{ours}""#);
    let Some(at) = memchr::memmem::find(&event.json, stored.as_bytes()) else {
        return Cow::Borrowed(&event.json);
    };
    let mut out = Vec::with_capacity(event.json.len() + sent.len());
    out.extend_from_slice(&event.json[..at]);
    out.extend_from_slice(sent.as_bytes());
    out.extend_from_slice(&event.json[at + stored.len()..]);
    Cow::Owned(out)
}

#[derive(Deserialize)]
struct IdleStop {
    stop_reason: crate::domain::event::StopInfo,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::body::parse_json;

    fn parse(body: &str) -> Result<Vec<EventBody>, ApiError> {
        let request: PostEvents = parse_json(body.as_bytes())?;
        request.events.iter().enumerate().map(|(i, e)| user_event(i, e)).collect()
    }

    #[test]
    fn a_turn_s_end_names_the_seed_s_stop_reason_and_keeps_the_log_s_as_detail() {
        use crate::domain::event::{Envelope, StopInfo, Usage};
        use crate::domain::{Draft, EventId, SessionId, StopReason::*};
        let sent = |kind| {
            let stop = StopInfo { kind, event_ids: vec![] };
            let body = EventBody::StatusIdle { status: "idle".into(), stop_reason: stop, usage: Usage::default() };
            let id = EventId(ulid::Ulid::new());
            let envelope = Envelope { id, session: SessionId(ulid::Ulid::new()), turn: None, seq: 4, now: "t" };
            let raw = RawEvent::stored(id, envelope.write(&Draft::new(None, &body)));
            let wire: Value = serde_json::from_slice(&wire_json(&raw)).unwrap();
            let read: crate::domain::Event = serde_json::from_value(wire.clone()).unwrap();
            assert_eq!(read.body, body, "the log's reason is read back from what was sent");
            assert_eq!(wire["sequence_number"], 4);
            wire["stop_reason"].clone()
        };
        let seed = ["end_turn", "cancel", "max_turns", "error", "requires_action"];
        for (ours, theirs) in [
            (EndTurn, json!({"type": "end_turn"})),
            (RequiresAction, json!({"type": "requires_action"})),
            (Error, json!({"type": "error"})),
            (Cancelled, json!({"type": "cancel", "detail": "cancelled"})),
            (MaxTurnRequests, json!({"type": "max_turns", "detail": "max_turn_requests"})),
            (MaxTokens, json!({"type": "end_turn", "detail": "max_tokens"})),
            (Refusal, json!({"type": "end_turn", "detail": "refusal"})),
        ] {
            let wire = sent(ours);
            assert_eq!(wire, theirs, "{ours:?}");
            assert!(seed.contains(&wire["type"].as_str().unwrap()));
        }
    }

    #[test]
    fn unknown_fields_and_types_are_named() {
        let error = parse(r#"{"events":[{"type":"user.message","content":"hi","extra":1}]}"#).unwrap_err();
        assert!(error.message.contains("events[0]") && error.message.contains("extra"), "{}", error.message);
        let error = parse(r#"{"events":[{"type":"agent.message","content":[]}]}"#).unwrap_err();
        assert!(
            error.message.contains("events[0].type") && error.message.contains("agent.message"),
            "{}",
            error.message
        );
        let error = parse(r#"{"events":[{"type":"user.interrupt"},{"type":"user.message","content":5}]}"#).unwrap_err();
        assert!(error.message.contains("events[1].content"), "{}", error.message);
        let error = parse(r#"{"events":[{"type":"user.message","content":[{"type":"text"}]}]}"#).unwrap_err();
        assert!(error.message.contains("text"), "{}", error.message);
    }

    #[test]
    fn string_content_becomes_a_text_block() {
        let parsed = parse(r#"{"events":[{"type":"user.message","content":"hi"}]}"#).unwrap();
        assert_eq!(parsed, vec![EventBody::UserMessage { content: vec![Block::text("hi")] }]);
    }
}
