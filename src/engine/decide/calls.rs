//! Deciding what tool calls become: each call a model makes is recorded as the session's
//! plan handles its tool (one that runs inline, waits for a permission, waits for the
//! client, or is denied), and the denied ones are answered at once; a seed history that ends
//! with calls is recorded the same way, as calls that wait.

use serde_json::Value;

use super::idle;
use crate::domain::event::{Permission, StopReason};
use crate::domain::{Block, Draft, Event, EventBody, EventId, Message, RawEvent, TurnId, Usage};
use crate::engine::plan::{Mode, ToolPlan};

/// A model's call of a tool, by the id the model gave it (or one made for it), with how
/// the session handles its tool (`None`: the session has no such tool).
#[derive(Debug, Clone)]
pub struct Call {
    pub tool_call_id: String,
    pub name: String,
    pub input: Value,
    pub mode: Option<Mode>,
}

/// The events that record a model's calls, each as the plan handles its tool, and the
/// calls with their modes, in the same order.
pub fn plan_calls(plan: &ToolPlan, calls: Vec<(String, String, Value)>) -> (Vec<EventBody>, Vec<Call>) {
    calls
        .into_iter()
        .map(|(tool_call_id, name, input)| {
            let mode = plan.modes.get(&name).copied();
            let permission = match mode {
                Some(Mode::Client | Mode::ClientAsks) => {
                    let body = EventBody::AgentCustomToolUse {
                        tool_call_id: tool_call_id.clone(),
                        name: name.clone(),
                        input: input.clone(),
                        ask: mode == Some(Mode::ClientAsks),
                        editor: plan.editor.contains(&name),
                    };
                    return (body, Call { tool_call_id, name, input, mode });
                }
                Some(Mode::Ask) => Permission::Ask,
                Some(Mode::Inline) => Permission::Allow,
                Some(Mode::Rejected | Mode::OutOfMode) | None => Permission::Deny,
            };
            let body = tool_use(plan, &tool_call_id, &name, &input, permission);
            (body, Call { tool_call_id, name, input, mode })
        })
        .unzip()
}

/// The results that answer at once the calls the session denies (of a tool it does not
/// have, one the client chose to always reject, or one the session's mode does not allow),
/// each call with its event's id.
pub fn denials<'a>(plan: &ToolPlan, calls: impl IntoIterator<Item = (EventId, &'a Call)>) -> Vec<EventBody> {
    calls
        .into_iter()
        .filter_map(|(event_id, call)| {
            let why = match call.mode {
                None => format!("no tool named {:?} is available", call.name),
                Some(Mode::Rejected) => "the user rejects this tool for this session".to_string(),
                Some(Mode::OutOfMode) => plan.out_of_mode(&call.name),
                Some(_) => return None,
            };
            Some(error_result(event_id, &call.tool_call_id, &format!("Tool call denied: {why}")))
        })
        .collect()
}

fn tool_use(plan: &ToolPlan, tool_call_id: &str, name: &str, input: &Value, permission: Permission) -> EventBody {
    EventBody::AgentToolUse {
        tool_call_id: tool_call_id.into(),
        name: name.into(),
        input: input.clone(),
        evaluated_permission: permission,
        mcp: plan.mcp_ref(name),
        idempotent: plan.idempotent(name),
    }
}

/// An error result for call `event_id`, saying `text` (a denial, a cancel).
pub(super) fn error_result(event_id: EventId, tool_call_id: &str, text: &str) -> EventBody {
    EventBody::AgentToolResult {
        tool_use_id: event_id,
        tool_call_id: tool_call_id.to_string(),
        content: vec![Block::text(text)],
        is_error: true,
        structured_content: None,
        mcp: None,
    }
}

/// A new session whose seed history ends with tool calls: a turn that records them as if
/// the model had just made them. A call of a client tool waits for its result; a call of
/// one of the session's server tools waits for a permission, even a trusted one (the call
/// came from the client's history, not from the model); a call of a tool the session does
/// not have is denied, as in a turn. [`seed_settled`] then answers the denied calls and
/// says which wait, once the calls have ids.
pub fn seed_waiting(messages: &[Message], plan: &ToolPlan, turn: TurnId) -> Vec<Draft> {
    let calls: Vec<Draft> = crate::domain::message::waiting_calls(messages)
        .map(|(tool_call_id, name, input)| {
            let body = match plan.modes.get(&name) {
                Some(mode @ (Mode::Client | Mode::ClientAsks)) => {
                    let editor = plan.editor.contains(&name);
                    EventBody::AgentCustomToolUse { tool_call_id, name, input, ask: *mode == Mode::ClientAsks, editor }
                }
                Some(Mode::Inline | Mode::Ask) => tool_use(plan, &tool_call_id, &name, &input, Permission::Ask),
                Some(Mode::Rejected | Mode::OutOfMode) | None => {
                    tool_use(plan, &tool_call_id, &name, &input, Permission::Deny)
                }
            };
            Draft::new(Some(turn), &body)
        })
        .collect();
    if calls.is_empty() {
        return calls;
    }
    let mut drafts = vec![Draft::new(Some(turn), &EventBody::TurnStarted {})];
    drafts.extend(calls);
    drafts
}

/// What follows [`seed_waiting`]'s events once stored: the denied calls' results (saying
/// why, as `plan`, the session's, has it), and the status that names the calls waiting for
/// the client (or ends the turn if none waits).
pub fn seed_settled(stored: &[RawEvent], plan: &ToolPlan) -> Vec<Draft> {
    let events: Vec<Event> = stored.iter().filter_map(|raw| raw.decode().ok()).collect();
    let started = events.iter().find(|e| matches!(e.body, EventBody::TurnStarted {}));
    let Some(turn) = started.and_then(|e| e.turn_id) else {
        return Vec::new();
    };
    let mut drafts = Vec::new();
    let mut waiting = Vec::new();
    for event in &events {
        match &event.body {
            EventBody::AgentToolUse { evaluated_permission: Permission::Deny, tool_call_id, name, .. } => {
                let why = match plan.modes.get(name) {
                    Some(Mode::OutOfMode) => plan.out_of_mode(name),
                    _ => format!("no tool named {name:?} is available"),
                };
                let text = format!("Tool call denied: {why}");
                drafts.push(Draft::new(Some(turn), &error_result(event.id, tool_call_id, &text)));
            }
            EventBody::AgentToolUse { .. } | EventBody::AgentCustomToolUse { .. } => waiting.push(event.id),
            _ => {}
        }
    }
    let stop = if waiting.is_empty() { StopReason::EndTurn } else { StopReason::RequiresAction };
    drafts.push(Draft::new(Some(turn), &idle(stop, waiting, Usage::default())));
    drafts
}
