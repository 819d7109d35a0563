//! The turn engine: one actor per active session decides what happens to input (start a
//! turn, resolve tool calls, cancel), one turn at a time. Actors are rebuilt from the log
//! on demand and dropped when idle, so an idle session costs no memory.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use dashmap::DashMap;
use serde::Deserialize;
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};

use super::actor::Actor;
use super::{SessionError, Sessions};
use crate::agent::Agents;
use crate::domain::event::{AgentSpec, StopReason};
use crate::domain::{Block, Draft, EventBody, RawEvent, SessionId, TurnId, Usage};
use crate::projection::turns::{OpenTurn, OpenTurns};
use crate::projection::SessionSummary;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineSettings {
    /// Model tokens are merged into at most one delta event per message this often.
    pub delta_coalesce_ms: u64,
    /// An actor with nothing to do for this long is dropped (its state is in the log).
    pub actor_idle_secs: u64,
}

/// One piece of input for a session.
#[derive(Debug, Clone)]
pub enum Input {
    /// Starts a turn.
    Message(Vec<Block>),
    /// The result of a client tool call, by event id or tool call id.
    Result {
        call: String,
        content: Vec<Block>,
        is_error: bool,
    },
    /// A permission decision on a server tool call, by event id or tool call id.
    Permission {
        call: String,
        granted: bool,
        reason: Option<String>,
    },
    /// Cancels the running turn (or the calls waiting for the client).
    Interrupt,
    Outcome(Value),
}

/// Changes a turn request makes to the session before its input (AAP `agent`, `tools`).
#[derive(Debug, Clone, Default)]
pub struct SessionUpdate {
    pub agent: Option<AgentSpec>,
    pub tools: Option<Vec<Value>>,
}

impl SessionUpdate {
    pub fn is_empty(&self) -> bool {
        self.agent.is_none() && self.tools.is_none()
    }
}

#[derive(Debug, Clone)]
pub struct Submission {
    pub update: SessionUpdate,
    pub inputs: Vec<Input>,
    /// AAP: every waiting call must be resolved in one request.
    pub all_at_once: bool,
}

/// What a submission did: the events it stored and the turn it started, if any.
#[derive(Debug, Clone)]
pub struct Submitted {
    pub events: Vec<RawEvent>,
    pub turn: Option<TurnId>,
}

pub(super) enum Command {
    Submit(Submission, oneshot::Sender<Result<Submitted, SessionError>>),
    TurnEnded(TurnId, super::turn::Outcome),
    Cancel,
}

#[derive(Clone)]
pub struct Engine {
    pub(super) inner: Arc<EngineInner>,
}

pub(super) struct EngineInner {
    pub sessions: Sessions,
    pub agents: Arc<Agents>,
    pub settings: EngineSettings,
    actors: DashMap<SessionId, (u64, mpsc::Sender<Command>)>,
    generation: AtomicU64,
}

impl Engine {
    pub fn new(sessions: Sessions, agents: Arc<Agents>, settings: EngineSettings) -> Engine {
        let inner = EngineInner { sessions, agents, settings, actors: DashMap::new(), generation: AtomicU64::new(0) };
        Engine { inner: Arc::new(inner) }
    }

    pub fn agents(&self) -> &Arc<Agents> {
        &self.inner.agents
    }

    /// Hands input to the session's actor and waits for its decision. Errors (a turn is
    /// running, unknown calls, ...) come back before anything is stored.
    pub async fn submit(
        &self,
        summary: &SessionSummary,
        mut submission: Submission,
    ) -> Result<Submitted, SessionError> {
        loop {
            let (reply, answer) = oneshot::channel();
            self.send(summary.id, Command::Submit(submission, reply)).await?;
            match answer.await.map_err(|_| SessionError::ShuttingDown)? {
                Err(SessionError::Retry(returned)) => submission = *returned,
                other => return other,
            }
        }
    }

    /// Cancels whatever runs in the session (used before deleting it).
    pub async fn cancel(&self, session: SessionId) {
        if let Some(sender) = self.inner.actors.get(&session).map(|entry| entry.1.clone()) {
            let _ = sender.send(Command::Cancel).await;
        }
    }

    async fn send(&self, session: SessionId, mut command: Command) -> Result<(), SessionError> {
        for _ in 0..8 {
            let (generation, sender) = self.actor(session)?;
            match sender.send(command).await {
                Ok(()) => return Ok(()),
                // The actor stopped as we sent: forget it and start a new one.
                Err(mpsc::error::SendError(returned)) => {
                    command = returned;
                    self.inner.actors.remove_if(&session, |_, (g, _)| *g == generation);
                }
            }
        }
        Err(SessionError::ShuttingDown)
    }

    fn actor(&self, session: SessionId) -> Result<(u64, mpsc::Sender<Command>), SessionError> {
        if let Some(entry) = self.inner.actors.get(&session) {
            return Ok(entry.clone());
        }
        let entry = self.inner.actors.entry(session).or_insert_with(|| {
            let generation = self.inner.generation.fetch_add(1, Ordering::Relaxed);
            let (sender, receiver) = mpsc::channel(64);
            // The actor reads the session's log in its own task, not under the registry's lock.
            tokio::spawn(Actor::start(self.clone(), session, generation, sender.downgrade(), receiver));
            (generation, sender)
        });
        Ok(entry.clone())
    }

    /// Called by an actor that is about to stop: it leaves the registry only if it is
    /// still the registered one.
    pub(super) fn retire(&self, session: SessionId, generation: u64) {
        self.inner.actors.remove_if(&session, |_, (g, _)| *g == generation);
    }

    pub(super) fn idle_after(&self) -> Duration {
        Duration::from_secs(self.inner.settings.actor_idle_secs.max(1))
    }

    /// Closes turns that a stop left running: `session.error` (code `interrupted`) and an
    /// idle status, so no turn stays "running" forever.
    pub async fn recover(&self) -> Result<usize, SessionError> {
        let store = self.inner.sessions.store();
        let mut open = Vec::new();
        for entry in store.projected_scan(OpenTurns::NAME, None, false) {
            let (session, bytes) = entry?;
            if let Ok(OpenTurn { turn: Some(turn) }) = serde_json::from_slice(&bytes) {
                open.push((session, turn));
            }
        }
        for (session, turn) in &open {
            let drafts = vec![
                Draft::new(
                    Some(*turn),
                    &EventBody::SessionError {
                        error: "the server stopped while this turn was running".into(),
                        code: "interrupted".into(),
                    },
                ),
                Draft::new(Some(*turn), &super::actor::idle(StopReason::Error, vec![], Usage::default())),
            ];
            match store.append(*session, drafts).await {
                Ok(_) => tracing::warn!(session_id = %session, turn_id = %turn, "closed a turn interrupted by a stop"),
                Err(crate::store::AppendError::Closed) => {}
                Err(error) => return Err(error.into()),
            }
        }
        Ok(open.len())
    }
}
