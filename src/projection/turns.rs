//! Turn state, folded from the log: whether a turn runs, which tool calls wait for the
//! client, and which were granted and wait to run. The engine decides with it; the
//! `open_turns` projection keeps just enough of it on disk to close turns a crash left
//! running.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::domain::event::{Confirmation, Permission, StopReason};
use crate::domain::{Event, EventBody, EventId, TurnId};
use crate::store::Projection;

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
}

impl TurnState {
    pub fn apply(&mut self, event: &Event) {
        match &event.body {
            EventBody::TurnStarted {} => {
                self.phase = Phase::Running(event.turn_id.expect("turn.started has a turn"));
                self.last_turn = event.turn_id;
            }
            EventBody::AgentToolUse { tool_call_id, name, input, evaluated_permission: Permission::Ask } => {
                self.pending.insert(event.id, call(event.id, tool_call_id, name, input, CallKind::Ask));
            }
            EventBody::AgentCustomToolUse { tool_call_id, name, input } => {
                self.pending.insert(event.id, call(event.id, tool_call_id, name, input, CallKind::Client));
            }
            EventBody::UserToolConfirmation { tool_use_id, result, .. } => {
                let id = tool_use_id.parse().ok();
                if let Some(call) = id.and_then(|id| self.pending.remove(&id)) {
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
    PendingCall { event_id, tool_call_id: tool_call_id.into(), name: name.into(), input: input.clone(), kind }
}

/// On disk: the turn each session has open (started, not yet idle), if any.
pub struct OpenTurns;

#[derive(Debug, Serialize, Deserialize)]
pub struct OpenTurn {
    pub turn: Option<TurnId>,
}

impl OpenTurns {
    pub const NAME: &'static str = "open_turns";
}

impl Projection for OpenTurns {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn wants(&self, kind: &str) -> bool {
        matches!(kind, "turn.started" | "session.status_idle")
    }

    fn apply(&self, _current: Option<&[u8]>, event: &Event) -> Option<Vec<u8>> {
        let turn = match event.body {
            EventBody::TurnStarted {} => event.turn_id,
            _ => None,
        };
        Some(serde_json::to_vec(&OpenTurn { turn }).expect("serialises"))
    }
}
