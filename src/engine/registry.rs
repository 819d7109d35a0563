//! The actors of this node, one per active session: found by id, started on demand (with
//! the session's lease when other nodes share the log), and forgotten when they stop.
//! A command for a session whose lease another node holds goes there ([`super::forward`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use dashmap::DashMap;
use tokio::sync::mpsc;

use super::actor::Actor;
use super::cluster::{Claim, Lease};
use super::mailbox::Command;
use super::Engine;
use crate::domain::SessionId;
use crate::error::SessionError;

/// How many actors a command is offered to before the engine gives up (each one it finds
/// stopped as it sends is replaced by a new one).
const SEND_ATTEMPTS: usize = 8;

#[derive(Default)]
pub(super) struct Registry {
    actors: DashMap<SessionId, (u64, mpsc::Sender<Command>)>,
    generation: AtomicU64,
    /// One claim of a session's lease at a time on this node.
    claiming: DashMap<SessionId, Arc<tokio::sync::Mutex<()>>>,
}

/// An actor's place in the registry: it leaves it when it stops, if it still holds it.
pub(super) struct Slot {
    registry: Arc<Registry>,
    session: SessionId,
    generation: u64,
}

impl Slot {
    pub fn session(&self) -> SessionId {
        self.session
    }

    pub fn retire(&self) {
        self.registry.actors.remove_if(&self.session, |_, (g, _)| *g == self.generation);
    }
}

impl Registry {
    /// Every actor's mailbox now.
    pub fn senders(&self) -> Vec<mpsc::Sender<Command>> {
        self.actors.iter().map(|entry| entry.1.clone()).collect()
    }

    pub fn contains(&self, session: SessionId) -> bool {
        self.actors.contains_key(&session)
    }
}

/// Where a session's commands go: to its actor here, or to the node that holds its lease.
pub(super) enum Route {
    Local(u64, mpsc::Sender<Command>),
    Remote(String),
}

impl Engine {
    /// Hands `command` to the session's actor, wherever it runs.
    pub(super) async fn send(&self, session: SessionId, mut command: Command) -> Result<(), SessionError> {
        for _ in 0..SEND_ATTEMPTS {
            let (generation, sender) = match self.route(session).await? {
                Route::Local(generation, sender) => (generation, sender),
                Route::Remote(node) => return self.forward(session, node, command).await,
            };
            match sender.send(command).await {
                Ok(()) => return Ok(()),
                // The actor stopped as we sent: forget it and start a new one.
                Err(mpsc::error::SendError(returned)) => {
                    command = returned;
                    self.registry.actors.remove_if(&session, |_, (g, _)| *g == generation);
                }
            }
        }
        Err(SessionError::ShuttingDown)
    }

    /// The session's actor here (started if need be, with its lease when nodes share the
    /// log), or the node that holds its lease.
    pub(super) async fn route(&self, session: SessionId) -> Result<Route, SessionError> {
        if self.env.stopping() {
            return Err(SessionError::ShuttingDown);
        }
        let registry = &self.registry;
        if let Some(entry) = registry.actors.get(&session) {
            return Ok(Route::Local(entry.0, entry.1.clone()));
        }
        let Some(cluster) = self.cluster.clone() else {
            let (generation, sender) = self.spawn(session, None);
            return Ok(Route::Local(generation, sender));
        };
        let gate = registry.claiming.entry(session).or_default().clone();
        let held = gate.lock().await;
        let route = match registry.actors.get(&session).map(|entry| entry.clone()) {
            Some((generation, sender)) => Ok(Route::Local(generation, sender)),
            None => match cluster.claim(session).await {
                Ok(Claim::Mine(lease)) => {
                    let (generation, sender) = self.spawn(session, Some(lease));
                    Ok(Route::Local(generation, sender))
                }
                Ok(Claim::Theirs(node)) => Ok(Route::Remote(node)),
                Err(error) => Err(error),
            },
        };
        drop(held);
        registry.claiming.remove_if(&session, |_, gate| Arc::strong_count(gate) <= 2);
        route
    }

    fn spawn(&self, session: SessionId, lease: Option<Box<dyn Lease>>) -> (u64, mpsc::Sender<Command>) {
        let registry = &self.registry;
        let entry = registry.actors.entry(session).or_insert_with(|| {
            let generation = registry.generation.fetch_add(1, Ordering::Relaxed);
            let (sender, receiver) = mpsc::channel(64);
            let slot = Slot { registry: registry.clone(), session, generation };
            // The actor reads the session's log in its own task, not under the registry's lock.
            tokio::spawn(Actor::start(self.env.clone(), slot, sender.downgrade(), receiver, lease));
            (generation, sender)
        });
        entry.clone()
    }
}
