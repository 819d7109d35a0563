//! Deciding a client's input: a message starts a turn (or waits for the next one, where
//! the view queues it), results and permissions resolve the calls that wait, an interrupt
//! or a cancel ends what runs, each checked against the session's state and the limits.

use super::calls::error_result;
use super::ends::turn_input;
use super::{idle, running, Decision};
use crate::domain::event::{Confirmation, StopReason};
use crate::domain::{Block, Draft, EventBody, EventId, TurnId, Usage};
use crate::engine::command::{Follows, Input, InputLimits, Submission, WhenBusy};
use crate::error::SessionError;
use crate::projection::turns::{CallKind, PendingCall, Phase, TurnState};

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
    let resolving = check_together(state, submission, inputs)?;
    let resolved =
        if resolving { match_resolutions(state, inputs, &place, submission.all_at_once)? } else { Vec::new() };
    let mut record = Record {
        state,
        resolved: &resolved,
        new_turn,
        limit: limits.max_event_bytes,
        queue: submission.when_busy == WhenBusy::Queue,
        decision: Decision {
            drafts: update.iter().map(|body| Draft::new(None, body)).collect(),
            ..Decision::default()
        },
        current: current_turn(state),
        resolutions_written: resolved.is_empty(),
        branch: match submission.follows {
            Follows::Branch(from) => Some(from),
            _ => None,
        },
    };
    for (k, input) in inputs.iter().enumerate() {
        record.input(place(k), input)?;
    }
    Ok(record.decision)
}

/// Whether the input may come together, as the session stands: one user message (unless
/// the view queues them), never mixed with results or permissions, after the turn the
/// client names, and only when the session takes one. Answers whether it resolves calls.
fn check_together(state: &TurnState, submission: &Submission, inputs: &[Input]) -> Result<bool, SessionError> {
    let queue = submission.when_busy == WhenBusy::Queue;
    let messages = inputs.iter().filter(|i| matches!(i, Input::Message(_))).count();
    let resolving = inputs.iter().any(|i| matches!(i, Input::Result { .. } | Input::Permission { .. }));
    if inputs.iter().any(|i| matches!(i, Input::Compact)) {
        if inputs.len() > 1 {
            return Err(SessionError::Invalid("a compaction is asked for alone, with no other input".into()));
        }
        check_follows(state, submission.follows)?;
        check_idle(state)?;
        return Ok(false);
    }
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
    let branching = matches!(submission.follows, Follows::Branch(_));
    if branching && (resolving || messages == 0) {
        return Err(SessionError::Invalid(
            "a turn that branches from an earlier turn starts with a user message; answers go to the last turn".into(),
        ));
    }
    match state.phase {
        Phase::Running(_) if queue => {}
        // A branch leaves the calls the last turn waits for: they are cancelled.
        Phase::Waiting(_) if branching => {}
        _ if messages > 0 => check_idle(state)?,
        _ => {}
    }
    Ok(resolving)
}

/// The events a submission's input becomes, in the order it came; the resolutions go
/// where the first of them stood. An interrupt belongs to the turn current when it comes:
/// one that follows input starting a turn cancels that turn as it starts.
struct Record<'a> {
    state: &'a TurnState,
    resolved: &'a [Resolved<'a>],
    new_turn: TurnId,
    limit: usize,
    queue: bool,
    decision: Decision,
    current: Option<TurnId>,
    resolutions_written: bool,
    /// The earlier turn the new turn branches from, if it does.
    branch: Option<TurnId>,
}

impl Record<'_> {
    /// Records input `i` (its place in the request).
    fn input(&mut self, i: usize, input: &Input) -> Result<(), SessionError> {
        let (state, current) = (self.state, self.current);
        match input {
            // As the Qoder event catalog has it, an outcome belongs to no turn.
            Input::Outcome(outcome) => {
                let draft = Draft::new(None, &EventBody::UserDefineOutcome { outcome: outcome.clone() });
                self.push(i, draft)?;
            }
            Input::Cancel => {
                if self.decision.start.is_some() || matches!(state.phase, Phase::Running(_)) {
                    self.decision.drafts.push(Draft::new(current, &EventBody::UserInterrupt {}));
                    self.decision.cancel = true;
                }
            }
            Input::Interrupt => {
                self.decision.drafts.push(Draft::new(current, &EventBody::UserInterrupt {}));
                match state.phase {
                    _ if self.decision.start.is_some() => self.decision.cancel = true,
                    Phase::Running(_) => self.decision.cancel = true,
                    Phase::Waiting(turn) if self.resolved.is_empty() => {
                        self.decision.drafts.extend(close_waiting(state, turn))
                    }
                    _ => {}
                }
            }
            // While a turn runs (or once this request has started one), a message waits
            // for the next turn.
            Input::Message(content) if self.queue && (self.decision.start.is_some() || state.phase != Phase::Idle) => {
                self.push(i, Draft::queued(&EventBody::UserMessage { content: content.clone() }))?;
            }
            Input::Message(content) => self.start_turn(i, content)?,
            Input::Compact => {
                let turn = self.new_turn;
                let drafts = &mut self.decision.drafts;
                drafts.push(Draft::new(Some(turn), &EventBody::TurnStarted {}));
                drafts.push(Draft::new(Some(turn), &EventBody::UserCompact {}));
                drafts.push(Draft::new(Some(turn), &running()));
                self.decision.start = Some(turn);
                self.current = Some(turn);
            }
            Input::Result { .. } | Input::Permission { .. } if !self.resolutions_written => {
                self.resolutions_written = true;
                let (drafts, start) = resolve(state, self.resolved, self.new_turn, self.limit)?;
                self.decision.drafts.extend(drafts);
                self.decision.start = start;
                self.current = start.or(current);
            }
            Input::Result { .. } | Input::Permission { .. } => {}
        }
        Ok(())
    }

    /// A user message that starts a turn, after the messages queued before it.
    fn start_turn(&mut self, i: usize, content: &[Block]) -> Result<(), SessionError> {
        let turn = self.new_turn;
        let message =
            fits(i, Draft::new(Some(turn), &EventBody::UserMessage { content: content.to_vec() }), self.limit)?;
        let drafts = &mut self.decision.drafts;
        if let (Some(_), Phase::Waiting(waiting)) = (self.branch, &self.state.phase) {
            drafts.extend(close_waiting(self.state, *waiting));
        }
        drafts.push(Draft::new(Some(turn), &EventBody::TurnStarted {}));
        if let Some(from) = self.branch {
            drafts.push(Draft::new(Some(turn), &EventBody::TurnBranched { from }));
        }
        if !self.state.queued.is_empty() {
            drafts.push(Draft::new(Some(turn), &turn_input(self.state)));
        }
        drafts.push(message);
        drafts.push(Draft::new(Some(turn), &running()));
        self.decision.start = Some(turn);
        self.current = Some(turn);
        Ok(())
    }

    /// Input `i`'s event, held to the limit.
    fn push(&mut self, i: usize, draft: Draft) -> Result<(), SessionError> {
        self.decision.drafts.push(fits(i, draft, self.limit)?);
        Ok(())
    }
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
        Follows::Latest | Follows::Branch(_) => return Ok(()),
        Follows::Nothing => None,
        Follows::Turn(turn) => Some(turn),
    };
    if wanted == last {
        return Ok(());
    }
    let named = wanted.map_or_else(|| "no turn".to_string(), |t| format!("turn {t}"));
    let last = last.map_or_else(|| "it has none".to_string(), |t| format!("it is {t}"));
    let depth = crate::projection::history::BRANCH_DEPTH;
    Err(SessionError::PreviousTurn(format!(
        "a new turn follows the session's last turn ({last}) or branches from one of the {depth} turns before it \
         that did not end waiting for the client, and {named} is neither"
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
pub(super) fn close_waiting(state: &TurnState, turn: TurnId) -> Vec<Draft> {
    let mut drafts: Vec<Draft> = state
        .pending
        .values()
        .map(|call| Draft::new(Some(turn), &error_result(call.event_id, &call.tool_call_id, "Tool call cancelled")))
        .collect();
    drafts.push(Draft::new(Some(turn), &idle(StopReason::Cancelled, vec![], Usage::default())));
    drafts
}

/// The events that record one resolution. A denial also writes the tool result the
/// model will read: `Tool call denied`, or `Tool call denied: <reason>`.
fn resolution_events(turn: TurnId, resolved: &Resolved) -> Vec<Draft> {
    let call = resolved.call;
    let tool_use_id = call.event_id.to_string();
    let tool_call_id = Some(call.tool_call_id.clone());
    let bodies = match resolved.input {
        Input::Result { content, is_error, ran, .. } => vec![EventBody::UserCustomToolResult {
            custom_tool_use_id: tool_use_id,
            content: content.clone(),
            is_error: *is_error,
            tool_call_id,
            ran: ran.as_deref().cloned(),
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
                error_result(call.event_id, &call.tool_call_id, &text),
            ]
        }
        _ => Vec::new(),
    };
    bodies.iter().map(|body| Draft::new(Some(turn), body)).collect()
}
