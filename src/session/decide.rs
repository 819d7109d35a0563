//! The decision step, with no IO: given a session's turn state and a submission, the
//! events to append (and whether they start a turn or cancel the running one), or the
//! refusal. The actor folds the log, calls this, and appends what it returns.

use super::engine::{Follows, Input, InputLimits, Submission, WhenBusy};
use super::turn::{Mode, ToolPlan};
use super::SessionError;
use crate::domain::event::{Confirmation, Permission, StopInfo, StopReason};
use crate::domain::{Block, Draft, Event, EventBody, EventId, Message, RawEvent, TurnId, Usage};
use crate::projection::turns::{CallKind, PendingCall, Phase, TurnState};

/// What to append, and what the actor does once it is stored.
#[derive(Debug, Default)]
pub struct Decision {
    pub drafts: Vec<Draft>,
    /// The turn these events start.
    pub start: Option<TurnId>,
    /// Whether the running turn is to be cancelled.
    pub cancel: bool,
}

/// A resolution of a waiting call, matched to the call.
struct Resolved<'a> {
    call: &'a PendingCall,
    input: &'a Input,
    /// The input's place in the submission.
    index: usize,
}

/// Decides a submission. `update` is the `session.updated` its changes make (checked by the
/// caller); `new_turn` is the id of the turn it starts, if it starts one. Input is held to
/// `limits`: the events per request (as many as there are waiting calls to answer at
/// least), and the size of the event each piece of input is stored as.
pub fn decide(
    state: &TurnState,
    submission: &Submission,
    update: Option<EventBody>,
    new_turn: TurnId,
    limits: InputLimits,
) -> Result<Decision, SessionError> {
    let (sent, max) = (submission.inputs.len(), limits.max_events_per_request);
    if sent > max.max(state.pending.len()) {
        return Err(SessionError::Invalid(format!("at most {max} events per request; this one has {sent}")));
    }
    let with_remembered = remembered(state, &submission.inputs);
    let (inputs, copied_from) = match &with_remembered {
        Some((inputs, copied_from)) => (inputs.as_slice(), copied_from.as_slice()),
        None => (submission.inputs.as_slice(), &[][..]),
    };
    // Where input `k` stood in the request: a remembered decision's copy, where its original did.
    let place = |k: usize| k.checked_sub(sent).and_then(|copy| copied_from.get(copy).copied()).unwrap_or(k);
    let queue = submission.when_busy == WhenBusy::Queue;
    let messages = inputs.iter().filter(|i| matches!(i, Input::Message(_))).count();
    let resolving = inputs.iter().any(|i| matches!(i, Input::Result { .. } | Input::Permission { .. }));
    if messages > 1 && !queue {
        return Err(SessionError::Invalid("send one user message per request".into()));
    }
    if messages > 0 && resolving {
        return Err(SessionError::Invalid(format!(
            "a user message cannot be mixed with tool results or permissions; {}",
            pending_text(state)
        )));
    }
    check_follows(state, submission.follows)?;
    match state.phase {
        Phase::Running(_) if queue => {}
        _ if messages > 0 => check_idle(state)?,
        _ => {}
    }
    let resolved =
        if resolving { match_resolutions(state, inputs, &place, submission.all_at_once)? } else { Vec::new() };
    let check = |i, draft| fits(i, draft, limits.max_event_bytes);

    let mut decision =
        Decision { drafts: update.iter().map(|body| Draft::new(None, body)).collect(), ..Decision::default() };
    // Input becomes events in the order it came; the resolutions go where the first of
    // them stood. An interrupt belongs to the turn current when it comes: one that follows
    // input starting a turn cancels that turn as it starts.
    let mut current = current_turn(state);
    let mut resolutions_written = resolved.is_empty();
    for (k, input) in inputs.iter().enumerate() {
        let i = place(k);
        match input {
            // As the Qoder event catalog has it, an outcome belongs to no turn.
            Input::Outcome(outcome) => {
                let draft = Draft::new(None, &EventBody::UserDefineOutcome { outcome: outcome.clone() });
                decision.drafts.push(check(i, draft)?);
            }
            Input::Cancel => {
                if decision.start.is_some() || matches!(state.phase, Phase::Running(_)) {
                    decision.drafts.push(Draft::new(current, &EventBody::UserInterrupt {}));
                    decision.cancel = true;
                }
            }
            Input::Interrupt => {
                decision.drafts.push(Draft::new(current, &EventBody::UserInterrupt {}));
                match state.phase {
                    _ if decision.start.is_some() => decision.cancel = true,
                    Phase::Running(_) => decision.cancel = true,
                    Phase::Waiting(turn) if resolved.is_empty() => decision.drafts.extend(close_waiting(state, turn)),
                    _ => {}
                }
            }
            // While a turn runs (or once this request has started one), a message waits
            // for the next turn.
            Input::Message(content) if queue && (decision.start.is_some() || state.phase != Phase::Idle) => {
                decision.drafts.push(check(i, Draft::queued(&EventBody::UserMessage { content: content.clone() }))?);
            }
            Input::Message(content) => {
                let message =
                    check(i, Draft::new(Some(new_turn), &EventBody::UserMessage { content: content.clone() }))?;
                decision.drafts.push(Draft::new(Some(new_turn), &EventBody::TurnStarted {}));
                // Messages queued before this one come first.
                if !state.queued.is_empty() {
                    decision.drafts.push(Draft::new(Some(new_turn), &turn_input(state)));
                }
                decision.drafts.push(message);
                decision.drafts.push(Draft::new(Some(new_turn), &running()));
                decision.start = Some(new_turn);
                current = decision.start;
            }
            Input::Result { .. } | Input::Permission { .. } if !resolutions_written => {
                resolutions_written = true;
                let (drafts, start) = resolve(state, &resolved, new_turn, limits.max_event_bytes)?;
                decision.drafts.extend(drafts);
                decision.start = start;
                current = start.or(current);
            }
            Input::Result { .. } | Input::Permission { .. } => {}
        }
    }
    Ok(decision)
}

/// The event that records input `i`, unless it is larger than `limit`.
fn fits(i: usize, draft: Draft, limit: usize) -> Result<Draft, SessionError> {
    let size = draft.len();
    if size > limit {
        return Err(SessionError::TooLarge(format!(
            "event {i} ({}) is {size} bytes; the limit is {limit}",
            draft.kind()
        )));
    }
    Ok(draft)
}

/// The turn that answers the messages queued while the last one ran, once the session is
/// idle; `None` when nothing waits (or the session is not idle).
pub fn answer_queued(state: &TurnState, new_turn: TurnId) -> Option<Decision> {
    if state.phase != Phase::Idle || state.queued.is_empty() {
        return None;
    }
    let drafts = vec![
        Draft::new(Some(new_turn), &EventBody::TurnStarted {}),
        Draft::new(Some(new_turn), &turn_input(state)),
        Draft::new(Some(new_turn), &running()),
    ];
    Some(Decision { drafts, start: Some(new_turn), cancel: false })
}

fn turn_input(state: &TurnState) -> EventBody {
    EventBody::TurnInput { event_ids: state.queued.clone() }
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
            let permission = match plan.modes.get(&name) {
                Some(Mode::Client) => {
                    return Draft::new(Some(turn), &EventBody::AgentCustomToolUse { tool_call_id, name, input })
                }
                Some(Mode::Inline | Mode::Ask) => Permission::Ask,
                Some(Mode::Rejected) | None => Permission::Deny,
            };
            let mcp = plan.mcp_ref(&name);
            let body = EventBody::AgentToolUse { tool_call_id, name, input, evaluated_permission: permission, mcp };
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

/// What follows [`seed_waiting`]'s events once stored: the denied calls' results, and the
/// status that names the calls waiting for the client (or ends the turn if none waits).
pub fn seed_settled(stored: &[RawEvent]) -> Vec<Draft> {
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
                let result = EventBody::AgentToolResult {
                    tool_use_id: event.id,
                    tool_call_id: tool_call_id.clone(),
                    content: vec![Block::text(format!("Tool call denied: no tool named {name:?} is available"))],
                    is_error: true,
                    structured_content: None,
                    mcp: None,
                };
                drafts.push(Draft::new(Some(turn), &result));
            }
            EventBody::AgentToolUse { .. } | EventBody::AgentCustomToolUse { .. } => waiting.push(event.id),
            _ => {}
        }
    }
    let stop = if waiting.is_empty() { StopReason::EndTurn } else { StopReason::RequiresAction };
    drafts.push(Draft::new(Some(turn), &idle(stop, waiting, Usage::default())));
    drafts
}

/// The events that resolve waiting calls; when none is left waiting, they start the turn
/// that goes on, else the session stays waiting for the rest.
fn resolve(
    state: &TurnState,
    resolved: &[Resolved],
    new_turn: TurnId,
    limit: usize,
) -> Result<(Vec<Draft>, Option<TurnId>), SessionError> {
    let Phase::Waiting(waiting) = state.phase else { return Ok((Vec::new(), None)) };
    let remaining: Vec<EventId> =
        state.pending.keys().filter(|id| !resolved.iter().any(|r| r.call.event_id == **id)).copied().collect();
    let turn = if remaining.is_empty() { new_turn } else { waiting };
    let mut drafts = Vec::with_capacity(resolved.len() + 2);
    if remaining.is_empty() {
        drafts.push(Draft::new(Some(new_turn), &EventBody::TurnStarted {}));
    }
    for r in resolved {
        // A denial's tool result carries the reason given, as its confirmation does.
        for draft in resolution_events(turn, r) {
            drafts.push(fits(r.index, draft, limit)?);
        }
    }
    if remaining.is_empty() {
        drafts.push(Draft::new(Some(new_turn), &running()));
        Ok((drafts, Some(new_turn)))
    } else {
        drafts.push(Draft::new(Some(waiting), &idle(StopReason::RequiresAction, remaining, Usage::default())));
        Ok((drafts, None))
    }
}

fn current_turn(state: &TurnState) -> Option<TurnId> {
    match state.phase {
        Phase::Running(turn) | Phase::Waiting(turn) => Some(turn),
        Phase::Idle => None,
    }
}

/// Whether the session's last turn is the one the client says a new turn follows.
fn check_follows(state: &TurnState, follows: Follows) -> Result<(), SessionError> {
    let last = state.last_turn;
    let wanted = match follows {
        Follows::Latest => return Ok(()),
        Follows::Nothing => None,
        Follows::Turn(turn) => Some(turn),
    };
    if wanted == last {
        return Ok(());
    }
    let named = wanted.map_or_else(|| "no turn".to_string(), |t| format!("turn {t}"));
    let last = last.map_or_else(|| "it has none".to_string(), |t| format!("it is {t}"));
    Err(SessionError::PreviousTurn(format!(
        "a new turn here follows the session's last turn, and {named} is not it ({last})"
    )))
}

fn check_idle(state: &TurnState) -> Result<(), SessionError> {
    match state.phase {
        Phase::Idle => Ok(()),
        Phase::Running(turn) => {
            Err(SessionError::Busy(format!("a turn is running ({turn}); wait for it to end or interrupt it")))
        }
        Phase::Waiting(_) => Err(SessionError::Conflict(pending_text(state))),
    }
}

/// Names the calls that wait for the client, and what each needs.
fn pending_text(state: &TurnState) -> String {
    if state.pending.is_empty() {
        return "no tool calls are waiting".into();
    }
    let calls: Vec<String> = state
        .pending
        .values()
        .map(|c| {
            let need = if c.kind == CallKind::Client { "a result" } else { "a permission" };
            format!("{} ({}, event {}, needs {need})", c.tool_call_id, c.name, c.event_id)
        })
        .collect();
    format!("tool calls wait for the client: {}", calls.join(", "))
}

/// The submission's input, plus, for each decision to remember, the same decision on every
/// other waiting call of its tool that the input does not answer, with the place in the
/// input of the decision each copies; `None` when nothing is to remember.
fn remembered(state: &TurnState, inputs: &[Input]) -> Option<(Vec<Input>, Vec<usize>)> {
    if !inputs.iter().any(|i| matches!(i, Input::Permission { remember: true, .. })) {
        return None;
    }
    let named = |call: &str, p: &PendingCall| p.tool_call_id == call || p.event_id.to_string() == call;
    let answers = |i: &Input, p: &PendingCall| matches!(i, Input::Permission { call, .. } | Input::Result { call, .. } if named(call, p));
    let mut out = inputs.to_vec();
    let mut copied_from = Vec::new();
    for (i, input) in inputs.iter().enumerate() {
        let Input::Permission { call, granted, reason, remember: true } = input else { continue };
        let Some(tool) = state.pending.values().find(|p| named(call, p)).map(|p| &p.name) else { continue };
        let same: Vec<Input> = state
            .pending
            .values()
            .filter(|p| p.kind == CallKind::Ask && &p.name == tool && !out.iter().any(|i| answers(i, p)))
            .map(|p| Input::Permission {
                call: p.event_id.to_string(),
                granted: *granted,
                reason: reason.clone(),
                remember: false,
            })
            .collect();
        copied_from.extend(std::iter::repeat_n(i, same.len()));
        out.extend(same);
    }
    (out.len() > inputs.len()).then_some((out, copied_from))
}

fn match_resolutions<'a>(
    state: &'a TurnState,
    inputs: &'a [Input],
    place: &dyn Fn(usize) -> usize,
    all_at_once: bool,
) -> Result<Vec<Resolved<'a>>, SessionError> {
    match state.phase {
        Phase::Waiting(_) => {}
        Phase::Running(turn) => {
            return Err(SessionError::Busy(format!(
                "no tool calls are waiting for results: a turn is running ({turn})"
            )))
        }
        Phase::Idle => {
            return Err(SessionError::Conflict("no tool calls are waiting for results: the session is idle".into()))
        }
    }
    let mut resolved: Vec<Resolved> = Vec::new();
    for (index, input) in inputs.iter().enumerate() {
        let (call, wants_result) = match input {
            Input::Result { call, .. } => (call, true),
            Input::Permission { call, .. } => (call, false),
            _ => continue,
        };
        let Some(pending) = state.pending.values().find(|p| p.tool_call_id == *call || p.event_id.to_string() == *call)
        else {
            return Err(SessionError::Conflict(format!("{call} is not a waiting tool call; {}", pending_text(state))));
        };
        if resolved.iter().any(|r| r.call.event_id == pending.event_id) {
            return Err(SessionError::Conflict(format!("{call} is answered twice in one request")));
        }
        match (pending.kind, wants_result) {
            (CallKind::Ask, true) => {
                return Err(SessionError::Conflict(format!(
                    "{call} ({}) is a server tool that needs a permission decision, not a result",
                    pending.name
                )))
            }
            (CallKind::Client, false) => {
                return Err(SessionError::Conflict(format!(
                    "{call} ({}) is a client tool: send its result, not a permission",
                    pending.name
                )))
            }
            _ => {}
        }
        resolved.push(Resolved { call: pending, input, index: place(index) });
    }
    if all_at_once && resolved.len() < state.pending.len() {
        let missing: Vec<&str> = state
            .pending
            .values()
            .filter(|p| !resolved.iter().any(|r| r.call.event_id == p.event_id))
            .map(|p| p.tool_call_id.as_str())
            .collect();
        return Err(SessionError::Conflict(format!(
            "every waiting call must be answered in one request; missing: {}; {}",
            missing.join(", "),
            pending_text(state)
        )));
    }
    Ok(resolved)
}

/// An interrupt while calls wait for the client: close them and end the turn.
fn close_waiting(state: &TurnState, turn: TurnId) -> Vec<Draft> {
    let mut drafts: Vec<Draft> = state
        .pending
        .values()
        .map(|call| Draft::new(Some(turn), &tool_result(call, "Tool call cancelled".into())))
        .collect();
    drafts.push(Draft::new(Some(turn), &idle(StopReason::Cancelled, vec![], Usage::default())));
    drafts
}

fn tool_result(call: &PendingCall, text: String) -> EventBody {
    EventBody::AgentToolResult {
        tool_use_id: call.event_id,
        tool_call_id: call.tool_call_id.clone(),
        content: vec![Block::text(text)],
        is_error: true,
        structured_content: None,
        mcp: None,
    }
}

/// The events that record one resolution. A denial also writes the tool result the
/// model will read: `Tool call denied`, or `Tool call denied: <reason>`.
fn resolution_events(turn: TurnId, resolved: &Resolved) -> Vec<Draft> {
    let call = resolved.call;
    let tool_use_id = call.event_id.to_string();
    let tool_call_id = Some(call.tool_call_id.clone());
    let bodies = match resolved.input {
        Input::Result { content, is_error, .. } => vec![EventBody::UserCustomToolResult {
            custom_tool_use_id: tool_use_id,
            content: content.clone(),
            is_error: *is_error,
            tool_call_id,
        }],
        Input::Permission { granted: true, remember, .. } => vec![EventBody::UserToolConfirmation {
            tool_use_id,
            result: Confirmation::Allow,
            deny_message: None,
            tool_call_id,
            remember: *remember,
        }],
        Input::Permission { granted: false, reason, remember, .. } => {
            let text = match reason.as_deref().filter(|r| !r.is_empty()) {
                Some(reason) => format!("Tool call denied: {reason}"),
                None => "Tool call denied".to_string(),
            };
            vec![
                EventBody::UserToolConfirmation {
                    tool_use_id,
                    result: Confirmation::Deny,
                    deny_message: reason.clone(),
                    tool_call_id,
                    remember: *remember,
                },
                tool_result(call, text),
            ]
        }
        _ => Vec::new(),
    };
    bodies.iter().map(|body| Draft::new(Some(turn), body)).collect()
}

pub fn running() -> EventBody {
    EventBody::StatusRunning { status: "running".into() }
}

pub fn idle(reason: StopReason, event_ids: Vec<EventId>, usage: Usage) -> EventBody {
    EventBody::StatusIdle { status: "idle".into(), stop_reason: StopInfo { kind: reason, event_ids }, usage }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::event::Envelope;
    use crate::domain::{RawEvent, SessionId};

    /// Room for any input these tests make.
    const ROOM: InputLimits = InputLimits { max_events_per_request: 100, max_event_bytes: 1 << 20 };

    /// Room for events of at most `max_event_bytes`.
    fn bytes(max_event_bytes: usize) -> InputLimits {
        InputLimits { max_event_bytes, ..ROOM }
    }

    fn kinds(decision: &Decision) -> Vec<&str> {
        decision.drafts.iter().map(Draft::kind).collect()
    }

    /// Drafts as a log stores them (ids and numbers in order).
    fn stored(drafts: &[Draft]) -> Vec<RawEvent> {
        let session = SessionId::generate();
        let event = |(i, draft): (usize, &Draft)| {
            let (id, seq) = (EventId(ulid::Ulid::from_parts(1_000, i as u128)), i as u64 + 1);
            let turn = draft.turn.map(|t| (t, seq as u32));
            RawEvent { id, seq, json: Envelope { id, session, turn, seq, now: "t" }.write(draft) }
        };
        drafts.iter().enumerate().map(event).collect()
    }

    /// The state after these drafts.
    fn fold(drafts: &[Draft]) -> TurnState {
        let mut state = TurnState::default();
        for raw in stored(drafts) {
            state.apply(&raw.decode().unwrap());
        }
        state
    }

    fn submission(inputs: Vec<Input>) -> Submission {
        Submission { inputs, all_at_once: true, ..Submission::default() }
    }

    #[test]
    fn a_message_starts_a_turn_and_a_second_is_refused_while_it_runs() {
        let turn = TurnId::generate();
        let message = submission(vec![Input::Message(vec![Block::text("hi")])]);
        let decision = decide(&TurnState::default(), &message, None, turn, ROOM).unwrap();
        assert_eq!(kinds(&decision), ["turn.started", "user.message", "session.status_running"]);
        assert_eq!((decision.start, decision.cancel), (Some(turn), false));
        let running = fold(&decision.drafts);
        let refused = decide(&running, &message, None, TurnId::generate(), ROOM).unwrap_err();
        assert!(matches!(refused, SessionError::Busy(ref m) if m.contains("a turn is running")), "{refused}");
        let interrupt = decide(&running, &submission(vec![Input::Interrupt]), None, TurnId::generate(), ROOM).unwrap();
        assert_eq!((kinds(&interrupt), interrupt.cancel), (vec!["user.interrupt"], true));
    }

    #[test]
    fn input_larger_than_the_limit_is_refused_naming_its_place() {
        let text = |n: usize| vec![Block::text("x".repeat(n))];
        let (outcome, message) = (Input::Outcome(serde_json::json!("done")), Input::Message(text(50)));
        let fits = decide(
            &TurnState::default(),
            &submission(vec![outcome.clone(), message]),
            None,
            TurnId::generate(),
            bytes(150),
        );
        assert_eq!(
            kinds(&fits.unwrap()),
            ["user.define_outcome", "turn.started", "user.message", "session.status_running"]
        );
        let over = submission(vec![outcome, Input::Message(text(200))]);
        let refused = decide(&TurnState::default(), &over, None, TurnId::generate(), bytes(150)).unwrap_err();
        assert!(
            matches!(refused, SessionError::TooLarge(ref m) if m.starts_with("event 1 (user.message) is ")),
            "{refused}"
        );
        assert!(refused.to_string().ends_with("; the limit is 150"), "{refused}");
    }

    #[test]
    fn an_interrupt_after_input_that_starts_a_turn_cancels_that_turn() {
        let turn = TurnId::generate();
        let both = submission(vec![Input::Message(vec![Block::text("hi")]), Input::Interrupt]);
        let decision = decide(&TurnState::default(), &both, None, turn, ROOM).unwrap();
        assert_eq!(kinds(&decision), ["turn.started", "user.message", "session.status_running", "user.interrupt"]);
        assert!(decision.drafts.iter().all(|d| d.turn == Some(turn)), "the interrupt is the new turn's");
        assert_eq!((decision.start, decision.cancel), (Some(turn), true));
    }

    #[test]
    fn a_seed_that_ends_with_calls_waits_for_their_answers() {
        let plan = ToolPlan {
            modes: [("calculator".to_string(), Mode::Inline), ("get_weather".to_string(), Mode::Client)].into(),
            ..ToolPlan::default()
        };
        let call = |id: &str, name: &str| crate::domain::Part::ToolUse {
            tool_call_id: id.into(),
            name: name.into(),
            input: serde_json::json!({}),
        };
        let seed = [Message::Assistant {
            content: vec![call("a", "get_weather"), call("b", "calculator"), call("c", "launch_rockets")],
        }];
        let turn = TurnId::generate();
        let mut drafts = seed_waiting(&seed, &plan, turn);
        let kinds: Vec<&str> = drafts.iter().map(Draft::kind).collect();
        assert_eq!(kinds, ["turn.started", "agent.custom_tool_use", "agent.tool_use", "agent.tool_use"]);
        let settled = seed_settled(&stored(&drafts));
        let kinds: Vec<&str> = settled.iter().map(Draft::kind).collect();
        assert_eq!(kinds, ["agent.tool_result", "session.status_idle"]);
        drafts.extend(settled);
        let state = fold(&drafts);
        let kinds: Vec<CallKind> = state.pending.values().map(|c| c.kind).collect();
        assert_eq!(kinds, [CallKind::Client, CallKind::Ask], "the unknown tool's call was denied, not left waiting");
        let answer = submission(vec![
            Input::Result { call: "a".into(), content: vec![Block::text("cold")], is_error: false },
            Input::Permission { call: "b".into(), granted: true, reason: None, remember: false },
        ]);
        let next = TurnId::generate();
        let decision = decide(&state, &answer, None, next, ROOM).unwrap();
        assert_eq!(decision.start, Some(next));
        // A result larger than the limit is refused, naming its place in the input.
        let large = submission(vec![
            Input::Permission { call: "b".into(), granted: true, reason: None, remember: false },
            Input::Result { call: "a".into(), content: vec![Block::text("x".repeat(200))], is_error: false },
        ]);
        let refused = decide(&state, &large, None, next, bytes(150)).unwrap_err();
        assert!(
            matches!(refused, SessionError::TooLarge(ref m) if m.starts_with("event 1 (user.custom_tool_result) is ")),
            "{refused}"
        );
        assert!(seed_waiting(&[Message::User { content: vec![] }], &plan, turn).is_empty());
        assert!(seed_settled(&[]).is_empty());
    }

    /// A session waiting for permissions on calls of one server tool, by these call ids.
    fn waiting_for(ids: &[&str]) -> TurnState {
        let plan = ToolPlan { modes: [("calculator".to_string(), Mode::Inline)].into(), ..ToolPlan::default() };
        let call = |id: &&str| crate::domain::Part::ToolUse {
            tool_call_id: id.to_string(),
            name: "calculator".into(),
            input: serde_json::json!({}),
        };
        let mut drafts =
            seed_waiting(&[Message::Assistant { content: ids.iter().map(call).collect() }], &plan, TurnId::generate());
        drafts.extend(seed_settled(&stored(&drafts)));
        fold(&drafts)
    }

    #[test]
    fn every_event_of_a_resolution_is_held_to_the_limit_under_the_place_of_its_input() {
        let long = "a-call-id-much-longer-than-the-other-one-0123456789";
        let state = waiting_for(&["b", long]);
        let allow = |remember| Input::Permission { call: "b".into(), granted: true, reason: None, remember };
        // Remembered, the decision is copied to the other call, whose longer id makes the
        // copy the larger event: it is refused under the place of the decision it copies.
        let decision = decide(&state, &submission(vec![allow(true)]), None, TurnId::generate(), ROOM).unwrap();
        let confirmations: Vec<usize> =
            decision.drafts.iter().filter(|d| d.kind() == "user.tool_confirmation").map(Draft::len).collect();
        assert!(confirmations.len() == 2 && confirmations[1] > confirmations[0], "{confirmations:?}");
        let limit = bytes(confirmations[0]);
        let refused = decide(&state, &submission(vec![allow(true)]), None, TurnId::generate(), limit).unwrap_err();
        assert!(matches!(refused, SessionError::TooLarge(ref m) if m.starts_with("event 0 ")), "{refused}");
        // A denial's tool result repeats its reason: it is held to the limit too.
        let reason = Some("r".repeat(100));
        let deny = Input::Permission { call: "b".into(), granted: false, reason: reason.clone(), remember: false };
        let deny = Submission { inputs: vec![deny], ..Submission::default() };
        let decision = decide(&state, &deny, None, TurnId::generate(), ROOM).unwrap();
        let size = |kind| decision.drafts.iter().find(|d| d.kind() == kind).map(Draft::len).unwrap();
        let (confirmation, result) = (size("user.tool_confirmation"), size("agent.tool_result"));
        assert!(result > confirmation, "{result} > {confirmation}");
        let refused = decide(&state, &deny, None, TurnId::generate(), bytes(confirmation));
        assert!(matches!(refused, Err(SessionError::TooLarge(ref m)) if m.starts_with("event 0 (agent.tool_result)")));
    }

    #[test]
    fn a_request_may_answer_every_waiting_call_even_past_the_events_per_request() {
        let state = waiting_for(&["c1", "c2", "c3"]);
        let allow = |call: &str| Input::Permission { call: call.into(), granted: true, reason: None, remember: false };
        let two = InputLimits { max_events_per_request: 2, ..ROOM };
        let all = submission(vec![allow("c1"), allow("c2"), allow("c3")]);
        assert!(decide(&state, &all, None, TurnId::generate(), two).unwrap().start.is_some());
        let more = submission(vec![allow("c1"), allow("c2"), allow("c3"), Input::Interrupt]);
        let refused = decide(&state, &more, None, TurnId::generate(), two).unwrap_err();
        assert!(matches!(refused, SessionError::Invalid(ref m) if m == "at most 2 events per request; this one has 4"));
        let idle = submission(vec![Input::Interrupt; 3]);
        assert!(decide(&TurnState::default(), &idle, None, TurnId::generate(), two).is_err());
    }
}
