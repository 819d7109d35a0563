//! A session's actor: it owns the session's turn state (folded from the log), checks each
//! submission against it, appends the input as events, and starts, resumes or cancels
//! turns. Decisions live here; everything it knows it re-reads from the log.

use std::sync::Arc;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::engine::{Command, Engine, Input, Submission, Submitted};
use super::turn::{self, Outcome, ToolPlan, TurnContext};
use super::SessionError;
use crate::agent::Agent;
use crate::domain::event::{Confirmation, StopInfo, StopReason};
use crate::domain::{Block, Draft, EventBody, EventId, SessionId, TurnId, Usage};
use crate::metrics;
use crate::projection::history::History;
use crate::projection::turns::{CallKind, PendingCall, Phase, TurnState};
use crate::projection::SessionSummary;
use crate::store::ReadRange;

pub(super) struct Actor {
    engine: Engine,
    session: SessionId,
    me: mpsc::WeakSender<Command>,
    summary: SessionSummary,
    agent: Arc<Agent>,
    history: History,
    state: TurnState,
    seen: Option<EventId>,
    running: Option<(TurnId, CancellationToken)>,
}

/// A submission's resolutions, matched to the calls they resolve.
struct Resolved {
    call: PendingCall,
    input: Input,
}

impl Actor {
    /// Loads the session from its log and runs; if it cannot be loaded, answers what was
    /// already queued with the reason and leaves the registry.
    pub async fn start(
        engine: Engine,
        session: SessionId,
        generation: u64,
        me: mpsc::WeakSender<Command>,
        mut commands: mpsc::Receiver<Command>,
    ) {
        let failure = match Actor::load(engine.clone(), session, me) {
            Ok(actor) => return actor.run(generation, commands).await,
            Err(error) => error,
        };
        engine.retire(session, generation);
        commands.close();
        while let Ok(command) = commands.try_recv() {
            if let Command::Submit(_, reply) = command {
                let error = match &failure {
                    SessionError::NotFound(id) => SessionError::NotFound(id.clone()),
                    other => SessionError::Invalid(other.to_string()),
                };
                let _ = reply.send(Err(error));
            }
        }
    }

    fn load(engine: Engine, session: SessionId, me: mpsc::WeakSender<Command>) -> Result<Actor, SessionError> {
        let summary = engine.inner.sessions.summary_of(session)?;
        let agent = engine.inner.agents.get(&summary.spec.agent.name).ok_or_else(|| {
            SessionError::Invalid(format!("the session's agent {:?} is not configured", summary.spec.agent.name))
        })?;
        let mut actor = Actor {
            engine,
            session,
            me,
            summary,
            agent,
            history: History::default(),
            state: TurnState::default(),
            seen: None,
            running: None,
        };
        actor.catch_up()?;
        Ok(actor)
    }

    async fn run(mut self, generation: u64, mut commands: mpsc::Receiver<Command>) {
        let idle = self.engine.idle_after();
        loop {
            let next = if self.running.is_some() {
                commands.recv().await
            } else {
                match tokio::time::timeout(idle, commands.recv()).await {
                    Ok(next) => next,
                    Err(_) => break,
                }
            };
            match next {
                Some(command) => self.handle(command).await,
                None => return,
            }
        }
        // Idle: leave the registry, then bounce whatever was already queued so that it
        // goes to the next actor; nothing is running, so nothing else can arrive.
        self.engine.retire(self.session, generation);
        commands.close();
        while let Ok(command) = commands.try_recv() {
            if let Command::Submit(submission, reply) = command {
                let _ = reply.send(Err(SessionError::Retry(Box::new(submission))));
            }
        }
    }

    async fn handle(&mut self, command: Command) {
        match command {
            Command::Submit(submission, reply) => {
                let result = self.submit(submission).await;
                let _ = reply.send(result);
            }
            Command::TurnEnded(turn, outcome) => self.end_turn(turn, outcome).await,
            Command::Cancel => {
                if let Some((_, cancel)) = &self.running {
                    cancel.cancel();
                }
            }
        }
    }

    /// Reads and folds every event after the last one seen.
    fn catch_up(&mut self) -> Result<(), SessionError> {
        let store = self.engine.inner.sessions.store();
        loop {
            let range = ReadRange { after: self.seen, before: None, limit: 1024, newest_first: false };
            let events = store.read(self.session, range)?;
            let Some(last) = events.last() else { return Ok(()) };
            self.seen = Some(last.id);
            for raw in &events {
                match raw.decode() {
                    Ok(event) => {
                        self.history.apply(&event);
                        self.state.apply(&event);
                        if let Some(summary) = SessionSummary::apply(Some(self.summary.clone()), &event) {
                            self.summary = summary;
                        }
                    }
                    Err(error) => tracing::error!(%error, id = %raw.id, "an event of the log does not decode"),
                }
            }
        }
    }

    async fn append(&mut self, drafts: Vec<Draft>) -> Result<Vec<crate::domain::RawEvent>, SessionError> {
        let events = self.engine.inner.sessions.append_to(self.session, drafts).await?;
        self.catch_up()?;
        Ok(events)
    }

    async fn submit(&mut self, submission: Submission) -> Result<Submitted, SessionError> {
        self.catch_up()?;
        if self.summary.deleted {
            return Err(SessionError::NotFound(self.session.to_string()));
        }
        let Submission { update, inputs, all_at_once } = submission;
        let messages: Vec<&Vec<Block>> =
            inputs.iter().filter_map(|i| if let Input::Message(m) = i { Some(m) } else { None }).collect();
        let resolving = inputs.iter().any(|i| matches!(i, Input::Result { .. } | Input::Permission { .. }));
        if messages.len() > 1 {
            return Err(SessionError::Invalid("send one user message per request".into()));
        }
        if !messages.is_empty() && resolving {
            return Err(SessionError::Conflict(format!(
                "a user message cannot be mixed with tool results or permissions; {}",
                self.pending_text()
            )));
        }
        if !messages.is_empty() {
            self.check_idle()?;
        }
        let resolved = if resolving { self.match_resolutions(&inputs, all_at_once)? } else { Vec::new() };

        let mut drafts = Vec::new();
        if !update.is_empty() {
            drafts.push(Draft::new(
                None,
                &EventBody::SessionUpdated { agent: update.agent, tools: update.tools, title: None, metadata: None },
            ));
        }
        // Input becomes events in the order it came; the resolutions go where the first
        // of them stood.
        let current = self.current_turn();
        let mut cancel_running = false;
        let mut started = None;
        let mut resolutions_written = resolved.is_empty();
        for input in &inputs {
            match input {
                // As the Qoder event catalog has it, an outcome belongs to no turn.
                Input::Outcome(outcome) => {
                    drafts.push(Draft::new(None, &EventBody::UserDefineOutcome { outcome: outcome.clone() }))
                }
                Input::Interrupt => {
                    drafts.push(Draft::new(current, &EventBody::UserInterrupt {}));
                    match self.state.phase {
                        Phase::Running(_) => cancel_running = true,
                        Phase::Waiting(turn) if resolved.is_empty() => drafts.extend(self.close_waiting(turn)),
                        _ => {}
                    }
                }
                Input::Message(content) => {
                    let turn = TurnId::generate();
                    drafts.push(Draft::new(Some(turn), &EventBody::TurnStarted {}));
                    drafts.push(Draft::new(Some(turn), &EventBody::UserMessage { content: content.clone() }));
                    drafts.push(Draft::new(Some(turn), &running()));
                    started = Some(turn);
                }
                Input::Result { .. } | Input::Permission { .. } if !resolutions_written => {
                    resolutions_written = true;
                    let (events, turn) = self.resolve(&resolved);
                    drafts.extend(events);
                    started = turn;
                }
                Input::Result { .. } | Input::Permission { .. } => {}
            }
        }
        let events = self.append(drafts).await?;
        if cancel_running {
            if let Some((_, cancel)) = &self.running {
                cancel.cancel();
            }
        }
        if let Some(turn) = started {
            self.start_turn(turn);
        }
        Ok(Submitted { events, turn: started })
    }

    /// The events that resolve waiting calls; when none is left waiting, they start the turn
    /// that goes on, else the session stays waiting for the rest.
    fn resolve(&self, resolved: &[Resolved]) -> (Vec<Draft>, Option<TurnId>) {
        let Phase::Waiting(waiting) = self.state.phase else { return (Vec::new(), None) };
        let remaining: Vec<EventId> =
            self.state.pending.keys().filter(|id| !resolved.iter().any(|r| r.call.event_id == **id)).copied().collect();
        if remaining.is_empty() {
            let turn = TurnId::generate();
            let mut drafts = vec![Draft::new(Some(turn), &EventBody::TurnStarted {})];
            drafts.extend(resolved.iter().flat_map(|r| resolution_events(turn, r)));
            drafts.push(Draft::new(Some(turn), &running()));
            (drafts, Some(turn))
        } else {
            let mut drafts: Vec<Draft> = resolved.iter().flat_map(|r| resolution_events(waiting, r)).collect();
            drafts.push(Draft::new(Some(waiting), &idle(StopReason::RequiresAction, remaining, Usage::default())));
            (drafts, None)
        }
    }

    fn current_turn(&self) -> Option<TurnId> {
        match self.state.phase {
            Phase::Running(turn) | Phase::Waiting(turn) => Some(turn),
            Phase::Idle => None,
        }
    }

    fn check_idle(&self) -> Result<(), SessionError> {
        match self.state.phase {
            Phase::Idle => Ok(()),
            Phase::Running(turn) => {
                Err(SessionError::Conflict(format!("a turn is running ({turn}); wait for it to end or interrupt it")))
            }
            Phase::Waiting(_) => Err(SessionError::Conflict(self.pending_text())),
        }
    }

    /// Names the calls that wait for the client, and what each needs.
    fn pending_text(&self) -> String {
        if self.state.pending.is_empty() {
            return "no tool calls are waiting".into();
        }
        let calls: Vec<String> = self
            .state
            .pending
            .values()
            .map(|c| {
                let need = if c.kind == CallKind::Client { "a result" } else { "a permission" };
                format!("{} ({}, event {}, needs {need})", c.tool_call_id, c.name, c.event_id)
            })
            .collect();
        format!("tool calls wait for the client: {}", calls.join(", "))
    }

    fn match_resolutions(&self, inputs: &[Input], all_at_once: bool) -> Result<Vec<Resolved>, SessionError> {
        if !matches!(self.state.phase, Phase::Waiting(_)) {
            let why = match self.state.phase {
                Phase::Running(turn) => format!("a turn is running ({turn})"),
                _ => "the session is idle".into(),
            };
            return Err(SessionError::Conflict(format!("no tool calls are waiting for results: {why}")));
        }
        let mut resolved: Vec<Resolved> = Vec::new();
        for input in inputs {
            let (call, wants_result) = match input {
                Input::Result { call, .. } => (call, true),
                Input::Permission { call, .. } => (call, false),
                _ => continue,
            };
            let Some(pending) =
                self.state.pending.values().find(|p| p.tool_call_id == *call || p.event_id.to_string() == *call)
            else {
                return Err(SessionError::Conflict(format!(
                    "{call} is not a waiting tool call; {}",
                    self.pending_text()
                )));
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
            resolved.push(Resolved { call: pending.clone(), input: input.clone() });
        }
        if all_at_once && resolved.len() < self.state.pending.len() {
            let missing: Vec<&str> = self
                .state
                .pending
                .values()
                .filter(|p| !resolved.iter().any(|r| r.call.event_id == p.event_id))
                .map(|p| p.tool_call_id.as_str())
                .collect();
            return Err(SessionError::Conflict(format!(
                "every waiting call must be answered in one request; missing: {}; {}",
                missing.join(", "),
                self.pending_text()
            )));
        }
        Ok(resolved)
    }

    /// An interrupt while calls wait for the client: close them and end the turn.
    fn close_waiting(&self, turn: TurnId) -> Vec<Draft> {
        let mut drafts: Vec<Draft> = self
            .state
            .pending
            .values()
            .map(|call| {
                Draft::new(
                    Some(turn),
                    &EventBody::AgentToolResult {
                        tool_use_id: call.event_id,
                        tool_call_id: call.tool_call_id.clone(),
                        content: vec![Block::text("Tool call cancelled")],
                        is_error: true,
                    },
                )
            })
            .collect();
        drafts.push(Draft::new(Some(turn), &idle(StopReason::Cancelled, vec![], Usage::default())));
        drafts
    }

    fn start_turn(&mut self, turn: TurnId) {
        let Some(me) = self.me.upgrade() else { return };
        let cancel = CancellationToken::new();
        let inner = &self.engine.inner;
        let context = TurnContext {
            store: inner.sessions.store().clone(),
            session: self.session,
            turn,
            agent: self.agent.clone(),
            tools: inner.agents.tools.clone(),
            plan: ToolPlan::new(&self.agent, &inner.agents.tools, &self.summary.spec),
            history: self.history.messages.clone(),
            granted: self.state.granted.clone(),
            cancel: cancel.clone(),
            delta_coalesce: std::time::Duration::from_millis(inner.settings.delta_coalesce_ms),
        };
        let span = tracing::info_span!("turn", session_id = %self.session, turn_id = %turn);
        tokio::spawn(tracing::Instrument::instrument(
            async move {
                let outcome = turn::run(context).await;
                let _ = me.send(Command::TurnEnded(turn, outcome)).await;
            },
            span,
        ));
        self.running = Some((turn, cancel));
    }

    /// Writes how the turn ended; the session is idle (or waiting) from here on.
    async fn end_turn(&mut self, turn: TurnId, outcome: Outcome) {
        self.running = None;
        let mut drafts = Vec::new();
        let (reason, pending) = match outcome.stop {
            Ok((reason, pending)) => (reason, pending),
            Err(error) => {
                drafts
                    .push(Draft::new(Some(turn), &EventBody::SessionError { error: error.message, code: error.code }));
                (StopReason::Error, vec![])
            }
        };
        metrics::TURNS.with_label_values(&[stop_label(reason)]).inc();
        drafts.push(Draft::new(Some(turn), &idle(reason, pending, outcome.usage)));
        if let Err(error) = self.append(drafts).await {
            tracing::warn!(%error, session_id = %self.session, turn_id = %turn, "could not record the end of a turn");
        }
    }
}

fn running() -> EventBody {
    EventBody::StatusRunning { status: "running".into() }
}

pub(super) fn idle(reason: StopReason, event_ids: Vec<EventId>, usage: Usage) -> EventBody {
    EventBody::StatusIdle { status: "idle".into(), stop_reason: StopInfo { kind: reason, event_ids }, usage }
}

fn stop_label(reason: StopReason) -> &'static str {
    match reason {
        StopReason::EndTurn => "end_turn",
        StopReason::RequiresAction => "requires_action",
        StopReason::MaxTokens => "max_tokens",
        StopReason::MaxTurnRequests => "max_turn_requests",
        StopReason::Refusal => "refusal",
        StopReason::Cancelled => "cancelled",
        StopReason::Error => "error",
    }
}

/// The events that record one resolution. A denial also writes the tool result the
/// model will read: `Tool call denied`, or `Tool call denied: <reason>`.
fn resolution_events(turn: TurnId, resolved: &Resolved) -> Vec<Draft> {
    let call = &resolved.call;
    let tool_use_id = call.event_id.to_string();
    match &resolved.input {
        Input::Result { content, is_error, .. } => vec![Draft::new(
            Some(turn),
            &EventBody::UserCustomToolResult {
                custom_tool_use_id: tool_use_id,
                content: content.clone(),
                is_error: *is_error,
            },
        )],
        Input::Permission { granted: true, .. } => vec![Draft::new(
            Some(turn),
            &EventBody::UserToolConfirmation { tool_use_id, result: Confirmation::Allow, deny_message: None },
        )],
        Input::Permission { granted: false, reason, .. } => {
            let text = match reason.as_deref().filter(|r| !r.is_empty()) {
                Some(reason) => format!("Tool call denied: {reason}"),
                None => "Tool call denied".to_string(),
            };
            vec![
                Draft::new(
                    Some(turn),
                    &EventBody::UserToolConfirmation {
                        tool_use_id,
                        result: Confirmation::Deny,
                        deny_message: reason.clone(),
                    },
                ),
                Draft::new(
                    Some(turn),
                    &EventBody::AgentToolResult {
                        tool_use_id: call.event_id,
                        tool_call_id: call.tool_call_id.clone(),
                        content: vec![Block::text(text)],
                        is_error: true,
                    },
                ),
            ]
        }
        _ => Vec::new(),
    }
}
