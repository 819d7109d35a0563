//! The write side: every append to a session's log is decided here. One actor per active
//! session takes its commands one at a time, decides what they do with no IO
//! ([`decide`]), appends that, and runs the session's turn ([`turn`]). Actors are started
//! from the log on demand and dropped when idle, so an idle session costs no memory.
//!
//! - [`command`]: the vocabulary a view speaks to the engine (a [`Submission`] of
//!   [`Input`], a [`Closing`]) and what it gets back ([`Submitted`]).
//! - `registry`: this node's actors; `forward` and `remote`: commands for sessions another
//!   node holds, behind the [`cluster::Cluster`] port; `reap` and `recover`: turns left
//!   open by a node or a process that stopped.
//! - `actor` (with `env`, all it may use, and `mailbox`, what it takes), [`decide`] (the
//!   pure decisions), [`turn`] (the turn loop: IO only), `writer` and `log` (appends).
//! - [`rules`]: what a session's setup may hold, whichever view asks.

mod actor;
pub mod cluster;
pub mod command;
pub mod decide;
mod env;
mod expire;
mod forward;
mod log;
mod mailbox;
pub mod plan;
mod reap;
mod recover;
mod registry;
mod remote;
pub mod rules;
pub mod turn;
mod writer;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

pub use command::{
    AgentChanges, Closing, EngineSettings, Follows, Input, InputLimits, SessionUpdate, Submission, Submitted,
    TurnSettings, WhenBusy,
};

use self::cluster::Cluster;
use self::env::Env;
use self::mailbox::{Command, Recall, Reply};
use self::registry::{Registry, Route};
use crate::agent::Agents;
use crate::domain::{Draft, RawEvent, RequestKey, SessionId};
use crate::error::SessionError;
use crate::store::{Appended, Store};

/// How long a stop past its grace waits for the actors to leave their turns.
const LEAVE_WAIT: Duration = Duration::from_secs(5);

/// How many times a command is sent again when the actor that took it stopped first (and
/// how many actors a command is offered to: each found stopped as it is sent is replaced).
const ATTEMPTS: usize = 8;

#[derive(Clone)]
pub struct Engine {
    env: Arc<Env>,
    registry: Arc<Registry>,
    /// Other nodes on the same log, if any: a session's actor then runs where its lease is.
    cluster: Option<Arc<dyn Cluster>>,
}

impl Engine {
    pub fn new(
        store: &Store,
        agents: Arc<Agents>,
        settings: EngineSettings,
        limits: InputLimits,
        cluster: Option<Arc<dyn Cluster>>,
    ) -> Engine {
        let env = Env::new(log::EngineLog::new(store), agents, settings, limits, cluster.is_some());
        Engine { env: Arc::new(env), registry: Arc::default(), cluster }
    }

    /// Runs `round` every `period` (the first at once) until the engine stops: the engine's
    /// background sweeps.
    async fn every<F, R>(&self, period: Duration, mut round: F)
    where
        F: FnMut() -> R,
        R: std::future::Future<Output = ()>,
    {
        let mut ticks = tokio::time::interval(period);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            if self.env.stopping() {
                return;
            }
            round().await;
        }
    }

    /// The limits every submission is held to.
    pub fn limits(&self) -> InputLimits {
        self.env.limits
    }

    /// Starts a new session's log: its `session.created`, then the calls its seed history
    /// leaves waiting (if any), through the session's actor, which then settles them.
    pub async fn start(&self, session: SessionId, created: Draft, waiting: Vec<Draft>) -> Result<(), SessionError> {
        if !waiting.is_empty() {
            // Two appends (the second names the calls by the ids the first gives them): made
            // by the session's actor, its one writer from the start.
            return self.create(session, std::iter::once(created).chain(waiting).collect()).await;
        }
        // One append, at the start of a log no one else knows: nothing can come between.
        let appended = self.env.log.append(session, 0, vec![created]).await?;
        appended.map(drop).map_err(|_| SessionError::Conflict(format!("session {session} exists")))
    }

    /// Starts a new session's log with `drafts` through the session's actor, so that no
    /// other writer comes between its first appends.
    async fn create(&self, session: SessionId, drafts: Vec<Draft>) -> Result<(), SessionError> {
        let (reply, answer) = oneshot::channel();
        self.send(session, Command::Create(drafts, reply)).await?;
        answer.await.map_err(|_| SessionError::ShuttingDown)?
    }

    /// The session a keyed write that makes one makes (or made): the id its first copy
    /// claimed for `subject`'s key, this copy's if it is the first. A key once used for
    /// another request (another route or body) is refused.
    pub async fn session_for(&self, subject: &str, key: &RequestKey) -> Result<SessionId, SessionError> {
        let id = self.claim(subject, key, SessionId::generate().to_string()).await?;
        id.parse().map_err(|_| SessionError::Storage(crate::store::StoreError::new(format!("a claimed id: {id}"))))
    }

    /// The id a keyed write that makes something (a session, an agent) gives it: `fresh`
    /// if this is the key's first use by `subject`, else the one its first copy claimed
    /// (see [`crate::store::Claims`]); a key once used for another request is refused.
    pub async fn claim(&self, subject: &str, key: &RequestKey, fresh: String) -> Result<String, SessionError> {
        #[derive(serde::Serialize, serde::Deserialize)]
        struct Claimed {
            id: String,
            fingerprint: String,
        }
        let name = key.scoped(subject);
        let mine = Claimed { id: fresh, fingerprint: key.fingerprint.clone() };
        let mine = bytes::Bytes::from(serde_json::to_vec(&mine).expect("a claim serialises"));
        let ttl = Duration::from_millis(self.env.idempotency_retention_ms());
        let held = self.env.log.claim(&name, mine, ttl).await?;
        let held: Claimed = serde_json::from_slice(&held)
            .map_err(|e| SessionError::Storage(crate::store::StoreError::new(format!("a stored claim: {e}"))))?;
        key.matches(&held.fingerprint).map_err(SessionError::KeyReused)?;
        Ok(held.id)
    }

    /// Appends to a log that no session's actor writes (the catalog's), at `expected`:
    /// the stored events or the conflict, once durable.
    pub async fn append(&self, log: SessionId, expected: u64, drafts: Vec<Draft>) -> Result<Appended, SessionError> {
        self.env.log.append(log, expected, drafts).await
    }

    /// Hands input to the session's actor and waits for its decision. Refusals (a turn is
    /// running, unknown calls, ...) come back before anything is stored.
    pub async fn submit(&self, session: SessionId, mut submission: Submission) -> Result<Submitted, SessionError> {
        for _ in 0..ATTEMPTS {
            let (reply, answer) = oneshot::channel();
            self.send(session, Command::Submit(Box::new(submission), reply)).await?;
            match answer.await.map_err(|_| SessionError::ShuttingDown)? {
                Reply::Again(returned) => submission = *returned,
                Reply::Refused(error) => return Err(error),
                Reply::Done(pending) => return pending.settle().await,
                Reply::Recalled(recall) => return self.recalled(session, recall).await,
            }
        }
        Err(SessionError::ShuttingDown)
    }

    /// A keyed submission sent again: the events the first one stored, once durable, and
    /// the turn it started, as the first answer had them.
    async fn recalled(&self, session: SessionId, recall: Recall) -> Result<Submitted, SessionError> {
        if let Some(durable) = recall.durable {
            durable.wait().await?;
        }
        let events = self.env.log.events_from(session, recall.first, recall.events as usize).await?;
        let turn = events.iter().find(|event| event.kind() == "turn.started").and_then(|event| event.turn());
        Ok(Submitted { events, turn: turn.map(|(turn, _)| turn), recalled: true })
    }

    /// Cancels whatever runs in the session, records its end, then deletes or archives it.
    pub async fn close(&self, session: SessionId, closing: Closing) -> Result<(), SessionError> {
        for _ in 0..ATTEMPTS {
            let (reply, answer) = oneshot::channel();
            self.send(session, Command::Close(closing, reply)).await?;
            // An actor that stopped before it took the command dropped it: ask the next.
            if let Ok(result) = answer.await {
                return result;
            }
        }
        Err(SessionError::ShuttingDown)
    }

    /// Appends events re-emitted from another log (see [`Command::Copy`]) through the
    /// session's actor: the stored events, once durable.
    pub async fn copy(&self, session: SessionId, drafts: Vec<Draft>) -> Result<Vec<RawEvent>, SessionError> {
        let (reply, answer) = oneshot::channel();
        self.send(session, Command::Copy(drafts, reply)).await?;
        answer.await.map_err(|_| SessionError::ShuttingDown)?
    }

    /// Closes a copied turn a replay left open (see [`Command::EndReplay`]).
    pub async fn end_replay(&self, session: SessionId) -> Result<(), SessionError> {
        let (reply, answer) = oneshot::channel();
        self.send(session, Command::EndReplay(reply)).await?;
        answer.await.map_err(|_| SessionError::ShuttingDown)?
    }

    /// Marks `session` as one a replay re-emits events into: it takes no input, and its
    /// actor stays, until [`Engine::stop_replaying`]. Answers what cancels the replay (a
    /// close of the session does).
    pub fn start_replaying(&self, session: SessionId) -> CancellationToken {
        self.env.replays.start(session)
    }

    pub fn stop_replaying(&self, session: SessionId) {
        self.env.replays.stop(session);
    }

    /// Stops every actor: running turns have `grace` to finish, and those still running
    /// then are left as the log shows them, to be resumed by the session's next actor (after
    /// a restart, or on another node). From the start of this no submission is taken
    /// (`ShuttingDown`), so no new turn starts. Answers how many turns finished in the
    /// grace, and how many were left.
    pub async fn shutdown(&self, grace: Duration) -> (usize, usize) {
        self.env.stop();
        let senders = self.registry.senders();
        let stopped = AtomicUsize::new(0);
        let stops = senders.iter().map(|sender| async {
            let (reply, answer) = oneshot::channel();
            if sender.send(Command::Stop(reply)).await.is_ok() && answer.await.is_ok() {
                stopped.fetch_add(1, Ordering::Relaxed);
            }
        });
        if tokio::time::timeout(grace, futures_util::future::join_all(stops)).await.is_ok() {
            return (senders.len(), 0);
        }
        let finished = stopped.load(Ordering::Relaxed);
        let leaves = senders.iter().map(|sender| async {
            let (reply, answer) = oneshot::channel();
            if sender.send(Command::Leave(reply)).await.is_ok() {
                let _ = answer.await;
            }
        });
        // An actor stuck (on a log out of reach) does not hold the stop up: what it did not
        // write is resumed all the same.
        if tokio::time::timeout(LEAVE_WAIT, futures_util::future::join_all(leaves)).await.is_err() {
            tracing::warn!("some actors did not stop in time");
        }
        let left = senders.len() - finished;
        tracing::warn!(
            left,
            grace_ms = grace.as_millis() as u64,
            "turns still running at the end of the grace are left to be resumed"
        );
        (finished, left)
    }

    /// Hands `command` to the session's actor, wherever it runs.
    async fn send(&self, session: SessionId, mut command: Command) -> Result<(), SessionError> {
        for _ in 0..ATTEMPTS {
            let (generation, sender) = match self.route(session).await? {
                Route::Local(generation, sender) => (generation, sender),
                Route::Remote(node) => return self.forward(session, node, command).await,
            };
            match sender.send(command).await {
                Ok(()) => return Ok(()),
                // The actor stopped as we sent: forget it and start a new one.
                Err(mpsc::error::SendError(returned)) => {
                    command = returned;
                    self.registry.forget(session, generation);
                }
            }
        }
        Err(SessionError::ShuttingDown)
    }

    /// The session's actor here, or the node that holds its lease.
    async fn route(&self, session: SessionId) -> Result<Route, SessionError> {
        if self.env.stopping() {
            return Err(SessionError::ShuttingDown);
        }
        self.registry.route(&self.env, self.cluster.as_ref(), session).await
    }
}
