//! Turns, folded from the log. [`TurnState`]: whether a turn runs, which tool calls wait
//! for the client, and which were granted and wait to run; the engine decides with it.
//! [`TurnIndex`]: every turn of a session with how it went, for listing and resuming turns.
//! [`OpenTurns`]: the turn each session has open, to close turns a crash left running.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::domain::event::{Confirmation, McpRef, Permission, StopInfo, StopReason};
use crate::domain::{Block, Event, EventBody, EventId, SessionId, TurnId, Usage};
use crate::store::{Key, Projection};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum CallKind {
    /// A client tool: the client runs it and sends the result.
    Client,
    /// A server tool that needs a permission decision.
    Ask,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PendingCall {
    pub event_id: EventId,
    pub tool_call_id: String,
    pub name: String,
    pub input: Value,
    pub kind: CallKind,
    /// The MCP server and tool the call was made of, if it was: a granted call runs that
    /// tool, whatever name it has by then.
    pub mcp: Option<McpRef>,
    /// Whether it may run twice (see [`EventBody::AgentToolUse`]).
    #[serde(default)]
    pub idempotent: bool,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub enum Phase {
    #[default]
    Idle,
    Running(TurnId),
    /// The turn stopped for the client; these calls need its results or decisions.
    Waiting(TurnId),
}

#[derive(Debug, Clone, Default)]
pub struct TurnState {
    pub phase: Phase,
    /// Calls waiting for the client, by event id, in call order.
    pub pending: BTreeMap<EventId, PendingCall>,
    /// Calls granted permission that have not run yet.
    pub granted: Vec<PendingCall>,
    pub last_turn: Option<TurnId>,
    /// User messages stored while a turn ran, that no turn has answered yet, in order.
    pub queued: Vec<EventId>,
    /// Permission decisions the client asked to keep, by tool name: the last one wins.
    pub remembered: BTreeMap<String, Confirmation>,
    /// The last turn started compacts the conversation (`user.compact`), and nothing else.
    pub compacting: bool,
}

impl TurnState {
    pub fn apply(&mut self, event: &Event) {
        match &event.body {
            EventBody::TurnStarted {} => {
                if let Some(turn) = event.turn_id {
                    self.phase = Phase::Running(turn);
                    self.last_turn = Some(turn);
                }
                self.compacting = false;
            }
            EventBody::UserCompact {} => self.compacting = true,
            EventBody::UserMessage { .. } if event.processed_at.is_none() => self.queued.push(event.id),
            EventBody::TurnInput { event_ids } => self.queued.retain(|id| !event_ids.contains(id)),
            EventBody::AgentToolUse {
                tool_call_id,
                name,
                input,
                evaluated_permission: Permission::Ask,
                mcp,
                idempotent,
            } => {
                let mut call = call(event.id, tool_call_id, name, input, CallKind::Ask);
                call.mcp = mcp.clone();
                call.idempotent = *idempotent;
                self.pending.insert(event.id, call);
            }
            EventBody::AgentCustomToolUse { tool_call_id, name, input, .. } => {
                self.pending.insert(event.id, call(event.id, tool_call_id, name, input, CallKind::Client));
            }
            EventBody::UserToolConfirmation { tool_use_id, result, remember, .. } => {
                let id = tool_use_id.parse().ok();
                if let Some(call) = id.and_then(|id| self.pending.remove(&id)) {
                    if *remember {
                        self.remembered.insert(call.name.clone(), *result);
                    }
                    if *result == Confirmation::Allow {
                        self.granted.push(call);
                    }
                }
            }
            EventBody::UserCustomToolResult { custom_tool_use_id, .. } => {
                if let Ok(id) = custom_tool_use_id.parse() {
                    self.pending.remove(&id);
                }
            }
            EventBody::AgentToolResult { tool_use_id, .. } => {
                self.pending.remove(tool_use_id);
                self.granted.retain(|c| c.event_id != *tool_use_id);
            }
            EventBody::StatusIdle { stop_reason, .. } => {
                let turn = event.turn_id.or(self.last_turn);
                match (stop_reason.kind, turn) {
                    (StopReason::RequiresAction, Some(turn)) => self.phase = Phase::Waiting(turn),
                    _ => {
                        self.phase = Phase::Idle;
                        self.pending.clear();
                        self.granted.clear();
                    }
                }
            }
            _ => {}
        }
    }
}

fn call(event_id: EventId, tool_call_id: &str, name: &str, input: &Value, kind: CallKind) -> PendingCall {
    PendingCall {
        event_id,
        tool_call_id: tool_call_id.into(),
        name: name.into(),
        input: input.clone(),
        kind,
        mcp: None,
        idempotent: false,
    }
}

/// On disk, per session: the turn it has open (started, not yet stopped), if any, the
/// usage of all its turns, and the messages that wait for a turn.
pub struct OpenTurns;

#[derive(Debug, Default, Serialize, Deserialize)]
pub struct OpenTurn {
    pub turn: Option<TurnId>,
    #[serde(default)]
    pub usage: Usage,
    /// User messages stored while a turn ran that no turn has taken yet.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub queued: Vec<EventId>,
    /// The latest evaluation of each outcome evaluated, oldest first (the last
    /// [`OUTCOMES_KEPT`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub outcomes: Vec<Evaluated>,
}

/// Outcomes whose evaluations a session's summary keeps.
pub const OUTCOMES_KEPT: usize = 20;

/// An outcome's latest evaluation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Evaluated {
    pub outcome_id: String,
    pub description: String,
    /// Evaluations so far, less one (the SDK's 0-indexed `iteration`).
    pub iteration: u32,
    pub result: String,
    pub explanation: String,
    pub at: String,
}

impl OpenTurns {
    pub const NAME: &'static str = "open_turns";
}

impl Projection for OpenTurns {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    /// 2: usage added; 3: queued messages; 4: outcome evaluations.
    fn version(&self) -> u32 {
        4
    }

    fn wants(&self, kind: &str) -> bool {
        matches!(
            kind,
            "turn.started" | "session.status_idle" | "user.message" | "turn.input" | "span.outcome_evaluation_end"
        )
    }

    fn keys(&self, event: &Event) -> Vec<Key> {
        match &event.body {
            // Only a queued message changes anything: skip reading the value for the rest.
            EventBody::UserMessage { .. } if event.processed_at.is_some() => Vec::new(),
            _ => vec![Key::session(event.session_id)],
        }
    }

    fn apply(&self, _key: Key, current: Option<&[u8]>, event: &Event) -> Option<Vec<u8>> {
        let mut open: OpenTurn = current.and_then(|bytes| serde_json::from_slice(bytes).ok()).unwrap_or_default();
        match &event.body {
            EventBody::TurnStarted {} => open.turn = event.turn_id,
            EventBody::StatusIdle { usage, .. } => {
                open.turn = None;
                open.usage += *usage;
            }
            EventBody::UserMessage { .. } if event.processed_at.is_none() => open.queued.push(event.id),
            EventBody::TurnInput { event_ids } => open.queued.retain(|id| !event_ids.contains(id)),
            EventBody::OutcomeEvaluationEnd { outcome_id, iteration, description, result, explanation, .. } => {
                open.outcomes.retain(|o| &o.outcome_id != outcome_id);
                open.outcomes.push(Evaluated {
                    outcome_id: outcome_id.clone(),
                    iteration: *iteration,
                    description: description.clone(),
                    result: result.clone(),
                    explanation: explanation.clone(),
                    at: event.created_at.clone(),
                });
                let over = open.outcomes.len().saturating_sub(OUTCOMES_KEPT);
                open.outcomes.drain(..over);
            }
            _ => return None,
        }
        Some(serde_json::to_vec(&open).expect("serialises"))
    }
}

/// One turn as the turn index keeps it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TurnSummary {
    pub id: TurnId,
    pub session: SessionId,
    /// The turn's first event (`turn.started`) and its sequence number in the session.
    pub first_event: EventId,
    pub first_sequence: u64,
    pub created_at: String,
    /// The user message that started the turn; empty for a turn that goes on after the
    /// client resolved tool calls.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub input: Vec<Block>,
    /// How the turn stopped; `None` while it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop: Option<StopInfo>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<TurnError>,
    pub usage: Usage,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<String>,
    /// The earlier turn this one goes on from, when it is not the one before it (a branch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branched_from: Option<TurnId>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TurnError {
    pub code: String,
    pub message: String,
}

impl TurnSummary {
    /// The fold: the turn after `event`, or `None` when `event` does not change it.
    pub fn apply(current: Option<TurnSummary>, event: &Event) -> Option<TurnSummary> {
        let turn = event.turn_id?;
        match (&event.body, current) {
            (EventBody::TurnStarted {}, _) => Some(TurnSummary {
                id: turn,
                session: event.session_id,
                first_event: event.id,
                first_sequence: event.sequence_number,
                created_at: event.created_at.clone(),
                input: Vec::new(),
                stop: None,
                error: None,
                usage: Usage::default(),
                ended_at: None,
                branched_from: None,
            }),
            (EventBody::TurnBranched { from }, Some(mut summary)) => {
                summary.branched_from = Some(*from);
                Some(summary)
            }
            (EventBody::UserMessage { content }, Some(mut summary)) => {
                summary.input = content.clone();
                Some(summary)
            }
            (EventBody::SessionError { error, code, .. }, Some(mut summary)) => {
                summary.error = Some(TurnError { code: code.clone(), message: error.clone() });
                Some(summary)
            }
            // A turn that waits for the client may stop again as calls are resolved one at
            // a time (or cancelled): the last stop holds, and usage adds up.
            (EventBody::StatusIdle { stop_reason, usage, .. }, Some(mut summary)) => {
                summary.stop = Some(stop_reason.clone());
                summary.usage += *usage;
                summary.ended_at = Some(event.created_at.clone());
                Some(summary)
            }
            _ => None,
        }
    }
}

/// On disk: every turn of every session, keyed by session and turn (so by start).
pub struct TurnIndex;

impl TurnIndex {
    pub const NAME: &'static str = "turns";
}

impl Projection for TurnIndex {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn wants(&self, kind: &str) -> bool {
        matches!(kind, "turn.started" | "turn.branched" | "user.message" | "session.error" | "session.status_idle")
    }

    fn keys(&self, event: &Event) -> Vec<Key> {
        event.turn_id.map(|turn| Key { session: event.session_id, item: Some(turn.ulid()) }).into_iter().collect()
    }

    fn apply(&self, _key: Key, current: Option<&[u8]>, event: &Event) -> Option<Vec<u8>> {
        let current = current.and_then(|bytes| serde_json::from_slice(bytes).ok());
        TurnSummary::apply(current, event).map(|t| serde_json::to_vec(&t).expect("turn summaries serialise"))
    }
}

/// On disk: when each queued user message was taken by a turn (`turn.input`), so that
/// reads can show it as processed.
pub struct ProcessedInput;

#[derive(Debug, Serialize, Deserialize)]
pub struct Processed {
    pub at: String,
    pub turn: Option<TurnId>,
}

impl ProcessedInput {
    pub const NAME: &'static str = "processed";
}

impl Projection for ProcessedInput {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn wants(&self, kind: &str) -> bool {
        kind == "turn.input"
    }

    fn keys(&self, event: &Event) -> Vec<Key> {
        match &event.body {
            EventBody::TurnInput { event_ids } => {
                event_ids.iter().map(|id| Key { session: event.session_id, item: Some(id.ulid()) }).collect()
            }
            _ => Vec::new(),
        }
    }

    fn apply(&self, _key: Key, _current: Option<&[u8]>, event: &Event) -> Option<Vec<u8>> {
        let processed = Processed { at: event.created_at.clone(), turn: event.turn_id };
        Some(serde_json::to_vec(&processed).expect("serialises"))
    }
}
