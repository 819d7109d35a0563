//! The turn engine: one actor per active session decides what happens to input (start a
//! turn, resolve tool calls, cancel, delete), one thing at a time. Actors are rebuilt from
//! the log on demand and dropped when idle, so an idle session costs no memory.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use dashmap::DashMap;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use tokio::sync::{mpsc, oneshot};

use super::actor::Actor;
use super::cluster::{self, Answer, Claim, Cluster, ForwardError, Lease, Remote, Request, WireDraft, WireError};
use super::decide::idle;
use super::log::{Durable, SessionLog};
use super::SessionError;
use crate::agent::Agents;
use crate::domain::event::{ClientTool, StopReason, ToolTrust};
use crate::domain::{Block, Draft, EventBody, RawEvent, SessionId, TurnId, Usage};
use crate::projection::turns::{OpenTurn, OpenTurns};
use crate::store::Scan;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineSettings {
    /// Model tokens are merged into at most one delta event per message this often.
    pub delta_coalesce_ms: u64,
    /// An actor with nothing to do for this long is dropped (its state is in the log).
    pub actor_idle_secs: u64,
}

/// How much input one submission may carry, whichever view it came through (`[limits]`).
#[derive(Debug, Clone, Copy)]
pub struct InputLimits {
    /// Pieces of input (events) in one submission.
    pub max_events_per_request: usize,
    /// The size of each event that input is stored as: its body's JSON, the envelope aside.
    pub max_event_bytes: usize,
}

/// One piece of input for a session.
#[derive(Debug, Clone, Serialize, Deserialize)]
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
    /// `remember` applies it to every later call of the same tool in the session (ACP's
    /// allow-always and reject-always), including calls of it that wait now.
    Permission {
        call: String,
        granted: bool,
        reason: Option<String>,
        remember: bool,
    },
    /// Cancels the running turn (or the calls waiting for the client).
    Interrupt,
    /// Cancels the running turn, if one runs, and is answered once the turn's end is
    /// recorded; nothing else. Calls that wait for the client keep waiting (the harness sees
    /// a turn that waits as ended).
    Cancel,
    Outcome(Value),
}

/// How a session ends: deleted (its log ends with `terminated`, and every view answers 404
/// for it), or archived (kept and readable, but it takes no more input).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Closing {
    Delete,
    Archive,
}

/// Changes a submission makes to the session before its input: `tools` and the agent's
/// `tools` replace, its `options` merge by key, `title` replaces, and `metadata` is a
/// patch (a `null` value deletes its key).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct SessionUpdate {
    pub agent: Option<AgentChanges>,
    pub tools: Option<Vec<ClientTool>>,
    pub title: Option<String>,
    pub metadata: Option<Map<String, Value>>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct AgentChanges {
    pub tools: Option<Vec<ToolTrust>>,
    pub options: Option<Map<String, Value>>,
}

impl SessionUpdate {
    pub fn is_empty(&self) -> bool {
        self.agent.is_none() && self.tools.is_none() && self.title.is_none() && self.metadata.is_none()
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Submission {
    pub update: SessionUpdate,
    pub inputs: Vec<Input>,
    /// Every waiting call must be resolved in one request (AAP).
    pub all_at_once: bool,
    /// What a user message does while a turn runs.
    pub when_busy: WhenBusy,
    /// The turn a turn this submission starts must follow.
    pub follows: Follows,
}

/// The turn a new turn must follow: the session's last, whichever it is (every view but the
/// harness), or one the client names (the harness's `previous_turn_id`), so that two
/// clients that both saw turn A cannot both chain a turn to it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Follows {
    #[default]
    Latest,
    /// No turn: the new turn must be the session's first.
    Nothing,
    Turn(TurnId),
}

/// What a user message does while a turn runs: refused (AAP, native), or stored and
/// answered by the next turn once the running one ends (managed agents, as Anthropic's
/// API does).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum WhenBusy {
    #[default]
    Refuse,
    Queue,
}

/// What a submission did: the events it stored and the turn it started, if any.
#[derive(Debug, Clone)]
pub struct Submitted {
    pub events: Vec<RawEvent>,
    pub turn: Option<TurnId>,
}

/// An actor's answer to a submission, which may not be durable yet: the caller waits for
/// that itself (one wake from the writer, no task in between), while the actor goes on to
/// its next command.
pub(super) struct Pending {
    pub submitted: Submitted,
    pub durable: Option<Durable>,
}

impl Pending {
    /// An answer whose events are durable already (or that stored none).
    pub fn settled(submitted: Submitted) -> Pending {
        Pending { submitted, durable: None }
    }

    async fn settle(self) -> Result<Submitted, SessionError> {
        if let Some(durable) = self.durable {
            durable.wait().await?;
        }
        Ok(self.submitted)
    }
}

pub(super) enum Command {
    /// The first events of a new session (the first command its actor takes).
    Create(Vec<Draft>, oneshot::Sender<Result<(), SessionError>>),
    Submit(Box<Submission>, oneshot::Sender<Result<Pending, SessionError>>),
    TurnEnded(TurnId, super::turn::Outcome),
    /// Cancel what runs, record how it ended, then delete or archive the session.
    Close(Closing, oneshot::Sender<Result<(), SessionError>>),
    /// Cancel what runs, record how it ended, and stop (the service is shutting down).
    Stop(oneshot::Sender<()>),
    /// Nothing to do but load: the actor then answers the messages that wait.
    Wake,
    /// Events of another session's log, re-emitted as they are (a replay session's):
    /// appended after the session's last, answered with them once durable.
    Copy(Vec<Draft>, oneshot::Sender<Result<Vec<RawEvent>, SessionError>>),
    /// A replay has ended (done, or stopped): a copied turn it left open is closed.
    EndReplay(oneshot::Sender<Result<(), SessionError>>),
}

/// How many actors a command is offered to before the engine gives up (each one it finds
/// stopped as it sends is replaced by a new one).
const SEND_ATTEMPTS: usize = 8;

#[derive(Clone)]
pub(crate) struct Engine {
    pub(super) inner: Arc<EngineInner>,
}

pub(super) struct EngineInner {
    pub log: SessionLog,
    pub agents: Arc<Agents>,
    pub settings: EngineSettings,
    pub limits: InputLimits,
    actors: DashMap<SessionId, (u64, mpsc::Sender<Command>)>,
    generation: AtomicU64,
    stopping: AtomicBool,
    /// Other nodes on the same log, if any: a session's actor then runs where its lease is.
    cluster: Option<Arc<dyn Cluster>>,
    /// One claim of a session's lease at a time on this node.
    claiming: DashMap<SessionId, Arc<tokio::sync::Mutex<()>>>,
    /// Sessions a replay is re-emitting events into now, and what stops it: a turn their
    /// log shows running is the replay's, not one a stopped actor left behind.
    replaying: DashMap<SessionId, tokio_util::sync::CancellationToken>,
}

/// Where a session's commands go: to its actor here, or to the node that holds its lease.
enum Route {
    Local(u64, mpsc::Sender<Command>),
    Remote(String),
}

/// Where the answer to a forwarded command goes.
enum ReplyTo {
    Done(oneshot::Sender<Result<(), SessionError>>),
    Submitted(oneshot::Sender<Result<Pending, SessionError>>),
    Nothing,
}

impl ReplyTo {
    fn answer(self, answer: Answer) {
        match self {
            ReplyTo::Done(reply) => drop(reply.send(answer.into_done())),
            ReplyTo::Submitted(reply) => drop(reply.send(answer.into_submitted().map(Pending::settled))),
            ReplyTo::Nothing => {}
        }
    }

    fn fail(self, error: SessionError) {
        self.answer(Answer::Failed(WireError::from_error(&error)));
    }
}

/// How long a command forwarded to a node that does not answer waits for its lease to
/// expire, beyond the lease's time to live.
const FORWARD_GRACE: Duration = Duration::from_secs(5);

/// The closing events of a turn that nothing runs any more (a crash, or a node that died).
pub(super) fn interrupted(turn: TurnId) -> Vec<Draft> {
    abandoned(turn, "the server stopped while this turn was running")
}

/// The end of a turn nothing runs any more: `session.error` (`interrupted`, saying `why`)
/// and an idle status.
pub(super) fn abandoned(turn: TurnId, why: &str) -> Vec<Draft> {
    let error = EventBody::SessionError { error: why.into(), code: "interrupted".into(), mcp_server: None };
    vec![Draft::new(Some(turn), &error), Draft::new(Some(turn), &idle(StopReason::Error, vec![], Usage::default()))]
}

impl Engine {
    pub fn new(
        log: SessionLog,
        agents: Arc<Agents>,
        settings: EngineSettings,
        limits: InputLimits,
        cluster: Option<Arc<dyn Cluster>>,
    ) -> Engine {
        let inner = EngineInner {
            log,
            agents,
            settings,
            limits,
            actors: DashMap::new(),
            generation: AtomicU64::new(0),
            stopping: AtomicBool::new(false),
            cluster,
            claiming: DashMap::new(),
            replaying: DashMap::new(),
        };
        Engine { inner: Arc::new(inner) }
    }

    /// Hands input to the session's actor and waits for its decision. Refusals (a turn is
    /// running, unknown calls, ...) come back before anything is stored.
    pub async fn submit(&self, session: SessionId, mut submission: Submission) -> Result<Submitted, SessionError> {
        loop {
            let (reply, answer) = oneshot::channel();
            self.send(session, Command::Submit(Box::new(submission), reply)).await?;
            match answer.await.map_err(|_| SessionError::ShuttingDown)? {
                Err(SessionError::Retry(returned)) => submission = *returned,
                Err(error) => return Err(error),
                Ok(pending) => return pending.settle().await,
            }
        }
    }

    /// Appends events re-emitted from another log (see [`Command::Copy`]) through the
    /// session's actor: the stored events, once durable.
    pub(super) async fn copy(&self, session: SessionId, drafts: Vec<Draft>) -> Result<Vec<RawEvent>, SessionError> {
        let (reply, answer) = oneshot::channel();
        self.send(session, Command::Copy(drafts, reply)).await?;
        answer.await.map_err(|_| SessionError::ShuttingDown)?
    }

    /// Closes a copied turn a replay left open (see [`Command::EndReplay`]).
    pub(super) async fn end_replay(&self, session: SessionId) -> Result<(), SessionError> {
        let (reply, answer) = oneshot::channel();
        self.send(session, Command::EndReplay(reply)).await?;
        answer.await.map_err(|_| SessionError::ShuttingDown)?
    }

    /// Marks `session` as one a replay re-emits events into: what cancels the replay.
    pub(super) fn start_replaying(&self, session: SessionId) -> tokio_util::sync::CancellationToken {
        let cancel = tokio_util::sync::CancellationToken::new();
        self.inner.replaying.insert(session, cancel.clone());
        cancel
    }

    /// `session` is no longer replayed into.
    pub(super) fn stop_replaying(&self, session: SessionId) {
        self.inner.replaying.remove(&session);
    }

    /// Stops the replay into `session`, if one runs (the session is being deleted).
    pub(super) fn cancel_replay(&self, session: SessionId) {
        if let Some(cancel) = self.inner.replaying.get(&session) {
            cancel.cancel();
        }
    }

    pub(super) fn is_replaying(&self, session: SessionId) -> bool {
        self.inner.replaying.contains_key(&session)
    }

    /// Starts a new session's log with `drafts` through the session's actor, so that no
    /// other writer comes between its first appends.
    pub async fn create(&self, session: SessionId, drafts: Vec<Draft>) -> Result<(), SessionError> {
        let (reply, answer) = oneshot::channel();
        self.send(session, Command::Create(drafts, reply)).await?;
        answer.await.map_err(|_| SessionError::ShuttingDown)?
    }

    /// Cancels whatever runs in the session, records its end, then deletes or archives it.
    pub async fn close(&self, session: SessionId, closing: Closing) -> Result<(), SessionError> {
        for _ in 0..SEND_ATTEMPTS {
            let (reply, answer) = oneshot::channel();
            self.send(session, Command::Close(closing, reply)).await?;
            // An actor that stopped before it took the command dropped it: ask the next.
            if let Ok(result) = answer.await {
                return result;
            }
        }
        Err(SessionError::ShuttingDown)
    }

    /// Stops every actor: running turns are cancelled and their end recorded, waiting up
    /// to `wait`. From the start of this no submission is taken (`ShuttingDown`), so an
    /// actor that starts after the stops were sent runs nothing. Answers how many actors
    /// stopped, and how many there were.
    pub async fn shutdown(&self, wait: Duration) -> (usize, usize) {
        self.inner.stopping.store(true, Ordering::SeqCst);
        let senders: Vec<mpsc::Sender<Command>> = self.inner.actors.iter().map(|entry| entry.1.clone()).collect();
        let stopped = AtomicUsize::new(0);
        let stops = senders.iter().map(|sender| async {
            let (reply, answer) = oneshot::channel();
            if sender.send(Command::Stop(reply)).await.is_ok() && answer.await.is_ok() {
                stopped.fetch_add(1, Ordering::Relaxed);
            }
        });
        if tokio::time::timeout(wait, futures_util::future::join_all(stops)).await.is_err() {
            let wait_secs = wait.as_secs();
            tracing::warn!(wait_secs, "some turns did not stop in time; the next start closes them");
        }
        (stopped.load(Ordering::Relaxed), senders.len())
    }

    /// Whether other nodes share the log.
    pub(super) fn clustered(&self) -> bool {
        self.inner.cluster.is_some()
    }

    pub(super) fn stopping(&self) -> bool {
        self.inner.stopping.load(Ordering::SeqCst)
    }

    async fn send(&self, session: SessionId, mut command: Command) -> Result<(), SessionError> {
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
                    self.inner.actors.remove_if(&session, |_, (g, _)| *g == generation);
                }
            }
        }
        Err(SessionError::ShuttingDown)
    }

    /// The session's actor here (started if need be, with its lease when nodes share the
    /// log), or the node that holds its lease.
    async fn route(&self, session: SessionId) -> Result<Route, SessionError> {
        if self.inner.stopping.load(Ordering::SeqCst) {
            return Err(SessionError::ShuttingDown);
        }
        if let Some(entry) = self.inner.actors.get(&session) {
            return Ok(Route::Local(entry.0, entry.1.clone()));
        }
        let Some(cluster) = self.inner.cluster.clone() else {
            let (generation, sender) = self.spawn(session, None);
            return Ok(Route::Local(generation, sender));
        };
        let gate = self.inner.claiming.entry(session).or_default().clone();
        let held = gate.lock().await;
        let route = match self.inner.actors.get(&session).map(|entry| entry.clone()) {
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
        self.inner.claiming.remove_if(&session, |_, gate| Arc::strong_count(gate) <= 2);
        route
    }

    fn spawn(&self, session: SessionId, lease: Option<Box<dyn Lease>>) -> (u64, mpsc::Sender<Command>) {
        let entry = self.inner.actors.entry(session).or_insert_with(|| {
            let generation = self.inner.generation.fetch_add(1, Ordering::Relaxed);
            let (sender, receiver) = mpsc::channel(64);
            // The actor reads the session's log in its own task, not under the registry's lock.
            tokio::spawn(Actor::start(self.clone(), session, generation, sender.downgrade(), receiver, lease));
            (generation, sender)
        });
        entry.clone()
    }

    /// Hands `command` to the node that holds the session's lease and passes its answer on.
    /// A node that is gone (or has let the session go) is asked again where the session is,
    /// until its lease expires and this node can take it.
    async fn forward(&self, session: SessionId, mut node: String, command: Command) -> Result<(), SessionError> {
        let Some(cluster) = self.inner.cluster.clone() else { return Err(SessionError::ShuttingDown) };
        let (remote, reply) = match command {
            Command::Create(drafts, reply) => {
                (Remote::Create(drafts.iter().map(WireDraft::from_draft).collect()), ReplyTo::Done(reply))
            }
            Command::Submit(submission, reply) => (Remote::Submit(submission), ReplyTo::Submitted(reply)),
            Command::Close(closing, reply) => (Remote::Close(closing), ReplyTo::Done(reply)),
            Command::Wake => (Remote::Wake, ReplyTo::Nothing),
            // A replay re-emits into a session whose actor runs on its own node (which keeps
            // it while the replay runs); one that has moved to another node ends the replay.
            Command::Copy(_, reply) => {
                let _ = reply.send(Err(SessionError::Unavailable(format!(
                    "session {session} is held by node {node}: a replay runs where its session does"
                ))));
                return Ok(());
            }
            Command::EndReplay(reply) => {
                let _ = reply.send(Err(SessionError::Unavailable(format!("session {session} is held by node {node}"))));
                return Ok(());
            }
            // Only ever sent to an actor of this node.
            Command::TurnEnded(..) | Command::Stop(_) => return Ok(()),
        };
        let request = cluster::encode(&Request { session, command: remote });
        let deadline = std::time::Instant::now() + cluster.lease_ttl() + FORWARD_GRACE;
        loop {
            match cluster.forward(&node, request.clone()).await {
                Ok(bytes) => match cluster::decode::<Answer>(&bytes) {
                    Ok(Answer::Failed(WireError::NotHere)) => {}
                    Ok(answer) => {
                        reply.answer(answer);
                        return Ok(());
                    }
                    Err(error) => {
                        reply.fail(error);
                        return Ok(());
                    }
                },
                Err(ForwardError::Gone) => {}
                Err(ForwardError::Failed(message)) => {
                    reply.fail(SessionError::Unavailable(format!(
                        "node {node}, which runs session {session}: {message}"
                    )));
                    return Ok(());
                }
            }
            if std::time::Instant::now() >= deadline {
                reply.fail(SessionError::Unavailable(format!(
                    "node {node} holds session {session} and does not answer; try again later"
                )));
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
            match self.route(session).await? {
                Route::Remote(next) => node = next,
                Route::Local(..) => {
                    let Request { command, .. } = cluster::decode(&request)?;
                    let command = match (command, reply) {
                        (Remote::Create(drafts), ReplyTo::Done(reply)) => {
                            match drafts.into_iter().map(WireDraft::into_draft).collect::<Result<Vec<_>, _>>() {
                                Ok(drafts) => Command::Create(drafts, reply),
                                Err(error) => {
                                    let _ = reply.send(Err(error));
                                    return Ok(());
                                }
                            }
                        }
                        (Remote::Submit(submission), ReplyTo::Submitted(reply)) => Command::Submit(submission, reply),
                        (Remote::Close(closing), ReplyTo::Done(reply)) => Command::Close(closing, reply),
                        _ => Command::Wake,
                    };
                    return Box::pin(self.send(session, command)).await;
                }
            }
        }
    }

    /// Answers the commands other nodes forward to this one, for sessions whose lease this
    /// node holds (or takes); for others it answers that the session is not here.
    pub async fn serve_forwarded(&self) -> Result<tokio::task::JoinHandle<()>, SessionError> {
        let Some(cluster) = self.inner.cluster.clone() else { return Err(SessionError::ShuttingDown) };
        let mut requests = cluster.serve().await?;
        let engine = self.clone();
        Ok(tokio::spawn(async move {
            while let Some((request, answer)) = requests.recv().await {
                let engine = engine.clone();
                tokio::spawn(async move {
                    let answered = engine.answer_forwarded(&request).await;
                    let _ = answer.send(cluster::encode(&answered));
                });
            }
        }))
    }

    async fn answer_forwarded(&self, request: &[u8]) -> Answer {
        let failed = |error: SessionError| Answer::Failed(WireError::from_error(&error));
        let Request { session, command } = match cluster::decode(request) {
            Ok(request) => request,
            Err(error) => return failed(error),
        };
        match self.route(session).await {
            Ok(Route::Local(..)) => {}
            Ok(Route::Remote(_)) => return Answer::Failed(WireError::NotHere),
            Err(error) => return failed(error),
        }
        let answered = match command {
            Remote::Create(drafts) => match drafts.into_iter().map(WireDraft::into_draft).collect() {
                Ok(drafts) => self.create(session, drafts).await.map(|()| Answer::Done),
                Err(error) => Err(error),
            },
            Remote::Submit(submission) => self.submit(session, *submission).await.map(|s| Answer::submitted(&s)),
            Remote::Close(closing) => self.close(session, closing).await.map(|()| Answer::Done),
            Remote::Wake => self.send(session, Command::Wake).await.map(|()| Answer::Done),
        };
        answered.unwrap_or_else(failed)
    }

    /// With other nodes on the log: closes the turns whose node stopped (their lease has
    /// expired) and answers the messages that wait in sessions nobody holds, every lease
    /// time to live, for as long as the service runs.
    pub async fn reap(&self) {
        let Some(cluster) = self.inner.cluster.clone() else { return };
        let mut every = tokio::time::interval(cluster.lease_ttl());
        loop {
            every.tick().await;
            if self.stopping() {
                return;
            }
            let Ok(mut orphans) = self.open_sessions().await else { continue };
            // Also those whose open turn the index missed: its writer died before writing it.
            orphans.extend(self.inner.log.raw().turns_seen_open());
            orphans.sort_unstable();
            orphans.dedup();
            for session in orphans {
                if self.inner.actors.contains_key(&session) {
                    continue;
                }
                if let Ok(None) = cluster.holder(session).await {
                    if let Err(error) = self.send(session, Command::Wake).await {
                        tracing::warn!(%error, session_id = %session, "could not take over a session left running");
                    }
                }
            }
        }
    }

    /// Sessions with a turn open or messages waiting for one.
    async fn open_sessions(&self) -> Result<Vec<SessionId>, SessionError> {
        let mut sessions = Vec::new();
        let mut after = None;
        loop {
            let scan = Scan { session: None, after, newest_first: false, limit: 1024 };
            let page = self.inner.log.scan::<OpenTurn>(OpenTurns::NAME, scan).await?;
            let Some((last, _)) = page.last() else { break };
            after = Some(*last);
            sessions.extend(
                page.into_iter().filter(|(_, s)| s.turn.is_some() || !s.queued.is_empty()).map(|(k, _)| k.session),
            );
        }
        sessions.dedup();
        Ok(sessions)
    }

    /// Called by an actor that is about to stop: it leaves the registry only if it is
    /// still the registered one.
    pub(super) fn retire(&self, session: SessionId, generation: u64) {
        self.inner.actors.remove_if(&session, |_, (g, _)| *g == generation);
    }

    pub(super) fn idle_after(&self) -> Duration {
        Duration::from_secs(self.inner.settings.actor_idle_secs.max(1))
    }

    /// Closes turns that a crash left running: `session.error` (code `interrupted`) and an
    /// idle status, so no turn stays "running" forever. Runs before any actor exists; then
    /// wakes the sessions whose messages wait for a turn, which their actors answer.
    pub async fn recover(&self) -> Result<usize, SessionError> {
        // Other nodes may be running those turns: each is closed once its lease expires
        // (see [`Engine::reap`]).
        if self.inner.cluster.is_some() {
            return Ok(0);
        }
        let log = &self.inner.log;
        let mut open = Vec::new();
        let mut waiting = Vec::new();
        let mut after = None;
        loop {
            let scan = Scan { session: None, after, newest_first: false, limit: 1024 };
            let page = log.scan::<OpenTurn>(OpenTurns::NAME, scan).await?;
            let Some((last, _)) = page.last() else { break };
            after = Some(*last);
            for (key, state) in page {
                if !state.queued.is_empty() {
                    waiting.push(key.session);
                }
                if let Some(turn) = state.turn {
                    open.push((key.session, turn));
                }
            }
        }
        for (session, turn) in &open {
            let drafts = || interrupted(*turn);
            let at = log.position(*session).await?;
            match log.append(*session, at.seq, drafts()).await {
                Ok(Ok(_)) => {
                    tracing::warn!(session_id = %session, turn_id = %turn, "closed a turn interrupted by a stop")
                }
                Ok(Err(conflict)) => {
                    return Err(SessionError::Conflict(format!(
                        "another writer appended to session {session} while its interrupted turn was closed (at {})",
                        conflict.actual.seq
                    )))
                }
                Err(SessionError::NotFound(_)) => {}
                Err(error) => return Err(error),
            }
        }
        for session in waiting {
            self.send(session, Command::Wake).await?;
        }
        Ok(open.len())
    }
}
