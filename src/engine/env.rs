//! What an actor and its turns need from the engine, and nothing more: the log, the
//! agents, the settings and limits, and two flags the whole engine shares (stopping, and
//! the sessions a replay writes into).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dashmap::DashMap;
use tokio_util::sync::CancellationToken;

use super::command::{EngineSettings, InputLimits};
use super::log::EngineLog;
use crate::agent::Agents;
use crate::domain::SessionId;

pub(super) struct Env {
    pub log: EngineLog,
    pub agents: Arc<Agents>,
    pub settings: EngineSettings,
    pub limits: InputLimits,
    /// Whether other nodes share the log (then every append is watched: see
    /// [`super::writer::Writer::new`]).
    pub clustered: bool,
    pub replays: Replays,
    pub handed: HandedOver,
    stopping: AtomicBool,
}

impl Env {
    pub fn new(
        log: EngineLog,
        agents: Arc<Agents>,
        settings: EngineSettings,
        limits: InputLimits,
        clustered: bool,
    ) -> Env {
        let (replays, stopping) = (Replays::default(), AtomicBool::new(false));
        Env { log, agents, settings, limits, clustered, replays, handed: HandedOver::default(), stopping }
    }

    /// The service is shutting down: no actor starts a turn from now on.
    pub fn stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    pub fn stop(&self) {
        self.stopping.store(true, Ordering::SeqCst);
    }

    /// An actor with nothing to do for this long is dropped (its state is in the log).
    pub fn idle_after(&self) -> Duration {
        Duration::from_secs(self.settings.actor_idle_secs.max(1))
    }

    /// How long a write's idempotency key is honoured.
    pub fn idempotency_retention_ms(&self) -> u64 {
        self.settings.idempotency_hours.saturating_mul(3_600_000)
    }

    /// Model tokens are merged into at most one delta event per message this often.
    pub fn delta_coalesce(&self) -> Duration {
        Duration::from_millis(self.settings.delta_coalesce_ms)
    }
}

/// Sessions a replay is re-emitting events into now, and what stops each replay: a turn
/// such a session's log shows running is the replay's, not one a stopped actor left behind.
#[derive(Default)]
pub(super) struct Replays {
    running: DashMap<SessionId, CancellationToken>,
}

impl Replays {
    /// Marks `session` as replayed into: answers what cancels the replay.
    pub fn start(&self, session: SessionId) -> CancellationToken {
        let cancel = CancellationToken::new();
        self.running.insert(session, cancel.clone());
        cancel
    }

    pub fn stop(&self, session: SessionId) {
        self.running.remove(&session);
    }

    /// Stops the replay into `session`, if one runs (the session is being closed).
    pub fn cancel(&self, session: SessionId) {
        if let Some(cancel) = self.running.get(&session) {
            cancel.cancel();
        }
    }

    pub fn contains(&self, session: SessionId) -> bool {
        self.running.contains_key(&session)
    }
}

/// Sessions this node let go a moment ago to the node that sends their commands (see
/// [`super::actor`]'s hand-over): meanwhile this node sends what it gets for them there,
/// rather than take the session back.
#[derive(Default)]
pub(super) struct HandedOver(DashMap<SessionId, (Instant, String)>);

impl HandedOver {
    /// Long enough for the other node to take the session's lease.
    const HOLD: Duration = Duration::from_secs(5);

    pub fn note(&self, session: SessionId, node: String) {
        if self.0.len() >= 1024 {
            self.0.retain(|_, (at, _)| at.elapsed() < Self::HOLD);
        }
        self.0.insert(session, (Instant::now(), node));
    }

    /// The node the session was handed to, if that was a moment ago.
    pub fn to(&self, session: SessionId) -> Option<String> {
        let node = self.0.get(&session).map(|entry| (entry.0.elapsed() < Self::HOLD).then(|| entry.1.clone()))?;
        if node.is_none() {
            self.0.remove_if(&session, |_, (at, _)| at.elapsed() >= Self::HOLD);
        }
        node
    }
}
