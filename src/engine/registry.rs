//! The actors of this node, one per active session: found by id, started on demand (with
//! the session's lease when other nodes share the log, claimed one claim at a time), and
//! forgotten when they stop.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use dashmap::DashMap;
use tokio::sync::mpsc;

use super::actor::{Actor, Slot};
use super::cluster::{Claim, Cluster, Lease};
use super::env::Env;
use super::mailbox::Command;
use crate::domain::SessionId;
use crate::error::SessionError;

#[derive(Default)]
pub(super) struct Registry {
    actors: DashMap<SessionId, (u64, mpsc::Sender<Command>)>,
    generation: AtomicU64,
    /// One claim of a session's lease at a time on this node.
    claiming: DashMap<SessionId, Arc<tokio::sync::Mutex<()>>>,
}

/// Where a session's commands go: to its actor here, or to the node that holds its lease.
pub(super) enum Route {
    Local(u64, mpsc::Sender<Command>),
    Remote(String),
}

impl Registry {
    /// Every actor's mailbox now.
    pub fn senders(&self) -> Vec<mpsc::Sender<Command>> {
        self.actors.iter().map(|entry| entry.1.clone()).collect()
    }

    pub fn contains(&self, session: SessionId) -> bool {
        self.actors.contains_key(&session)
    }

    /// Forgets the actor of `session` started as `generation`, if it is still the one here
    /// (it stopped as a command was sent to it).
    pub fn forget(&self, session: SessionId, generation: u64) {
        self.actors.remove_if(&session, |_, (g, _)| *g == generation);
    }

    /// The session's actor here (started if need be, with its lease when other nodes share
    /// the log), or the node that holds its lease.
    pub async fn route(
        self: &Arc<Self>,
        env: &Arc<Env>,
        cluster: Option<&Arc<dyn Cluster>>,
        session: SessionId,
    ) -> Result<Route, SessionError> {
        if let Some(entry) = self.actors.get(&session) {
            return Ok(Route::Local(entry.0, entry.1.clone()));
        }
        let Some(cluster) = cluster else {
            let (generation, sender) = self.spawn(env, session, None);
            return Ok(Route::Local(generation, sender));
        };
        // Let go a moment ago for the node that sends its commands: sent there, which takes
        // it, rather than taken back here (a command still in flight here, a reaper's wake,
        // a client of this node). Nothing starts an actor here meanwhile.
        if let Some(node) = env.handed.to(session) {
            return Ok(Route::Remote(node));
        }
        let gate = self.claiming.entry(session).or_default().clone();
        let held = gate.lock().await;
        let route = match self.actors.get(&session).map(|entry| entry.clone()) {
            Some((generation, sender)) => Ok(Route::Local(generation, sender)),
            None => match cluster.claim(session).await {
                Ok(Claim::Mine(lease)) => {
                    let (generation, sender) = self.spawn(env, session, Some(lease));
                    Ok(Route::Local(generation, sender))
                }
                Ok(Claim::Theirs(node)) => Ok(Route::Remote(node)),
                Err(error) => Err(error),
            },
        };
        drop(held);
        self.claiming.remove_if(&session, |_, gate| Arc::strong_count(gate) <= 2);
        route
    }

    fn spawn(
        self: &Arc<Self>,
        env: &Arc<Env>,
        session: SessionId,
        lease: Option<Box<dyn Lease>>,
    ) -> (u64, mpsc::Sender<Command>) {
        let entry = self.actors.entry(session).or_insert_with(|| {
            let generation = self.generation.fetch_add(1, Ordering::Relaxed);
            let (sender, receiver) = mpsc::channel(64);
            let registry = self.clone();
            let slot = Slot::new(session, move || registry.forget(session, generation));
            // The actor reads the session's log in its own task, not under the registry's lock.
            tokio::spawn(Actor::start(env.clone(), slot, sender.downgrade(), receiver, lease));
            (generation, sender)
        });
        entry.clone()
    }
}
