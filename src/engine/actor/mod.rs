//! A session's actor: it owns the session's state (folded from the log, [`folded`]),
//! hands each command to the decision step, appends what is decided, and starts, cancels
//! and ends turns ([`commands`]). It and its running turn are the session's one writer.
//! It sees only its [`Env`], never the engine around it.

mod commands;
mod folded;

use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use self::folded::Folded;
use super::cluster::Lease;
use super::command::Closing;
use super::decide;
use super::env::Env;
use super::mailbox::{Command, Reply};
use super::writer::Writer;
use crate::domain::SessionId;
use crate::error::SessionError;
use crate::metrics;
use crate::store::StoreError;

pub(super) struct Actor {
    env: Arc<Env>,
    session: SessionId,
    me: mpsc::WeakSender<Command>,
    folded: Folded,
    writer: Arc<Writer>,
    running: Option<Running>,
    /// What waits for the running turn's end to be recorded.
    after_turn: Vec<AfterTurn>,
    /// Set once the actor is done (deleted or stopped); it exits after this command.
    done: bool,
    /// Cancelled if this node loses the session's lease: another node runs it from then on.
    lost: CancellationToken,
    /// Where the session's recent submissions came from.
    senders: Senders,
}

/// How many submissions in a row one other node forwards before this node lets the session
/// go (once no turn runs), so that the node its clients talk to takes it: a load balancer
/// that keeps a session's requests on one node (docs/cluster.md) then has them run there,
/// even after this node took the session over from a node that died. Eight, so that
/// requests spread at random over three nodes almost never move a session (with four, round
/// robin over three nodes moved one in about 80 appends, and each move cost more than it
/// saved: load/JOURNAL.md).
const HAND_OVER_AFTER: u32 = 8;

/// The other node that forwarded the session's last submissions, and how many in a row.
#[derive(Default)]
struct Senders {
    node: Option<String>,
    in_a_row: u32,
}

impl Senders {
    fn note(&mut self, forwarded_by: Option<&str>) {
        match forwarded_by {
            Some(node) if self.node.as_deref() == Some(node) => self.in_a_row += 1,
            Some(node) => (self.node, self.in_a_row) = (Some(node.to_string()), 1),
            None => (self.node, self.in_a_row) = (None, 0),
        }
    }

    /// The node the session's clients talk to, if it is another.
    fn elsewhere(&self) -> Option<&str> {
        self.node.as_deref().filter(|_| self.in_a_row >= HAND_OVER_AFTER)
    }
}

/// The turn an actor runs: cancelled, it records how it ended; aborted (a stop past its
/// grace), it records nothing more and is resumed by the session's next actor.
struct Running {
    cancel: CancellationToken,
    task: tokio::task::AbortHandle,
}

/// An actor's place in this node's registry, which it leaves when it stops (if it still
/// holds it: a newer actor may have taken the session's place).
pub(super) struct Slot {
    session: SessionId,
    retire: Box<dyn Fn() + Send + Sync>,
}

impl Slot {
    pub fn new(session: SessionId, retire: impl Fn() + Send + Sync + 'static) -> Slot {
        Slot { session, retire: Box::new(retire) }
    }

    pub fn session(&self) -> SessionId {
        self.session
    }

    pub fn retire(&self) {
        (self.retire)()
    }
}

enum AfterTurn {
    Close(Closing, oneshot::Sender<Result<(), SessionError>>),
    Stop(oneshot::Sender<()>),
    /// The answer to a cancel: given once the turn's end is recorded, so that the session
    /// takes a new turn as soon as the cancel is answered.
    Answer(oneshot::Sender<Reply>, super::command::Submitted),
}

impl Actor {
    /// Loads the session from its log and runs; if it cannot be loaded, answers what was
    /// already queued with the reason and leaves the registry.
    pub async fn start(
        env: Arc<Env>,
        slot: Slot,
        me: mpsc::WeakSender<Command>,
        mut commands: mpsc::Receiver<Command>,
        lease: Option<Box<dyn Lease>>,
    ) {
        // Without a lease (one node), nothing is ever lost.
        let lost = lease.as_ref().map(|lease| lease.lost()).unwrap_or_default();
        let session = slot.session();
        match Actor::open(&env, session, me, &mut commands).await {
            Ok(mut actor) => {
                actor.lost = lost;
                actor.run(&mut commands).await;
            }
            Err(failure) => {
                commands.close();
                while let Ok(command) = commands.try_recv() {
                    command.refuse(|| again(&failure));
                }
            }
        }
        // What this actor prepared goes before another actor can start and prepare again.
        env.log.release(session);
        slot.retire();
        commands.close();
        // Nothing runs now, so nothing else can arrive: what was queued goes to the next actor.
        while let Ok(command) = commands.try_recv() {
            bounce(command, session);
        }
        if let Some(lease) = lease {
            lease.release().await;
        }
    }

    /// The session from its log, with the turn it shows running resumed (nothing runs it);
    /// or, if there is no such session and the first command creates it, the new session.
    async fn open(
        env: &Arc<Env>,
        session: SessionId,
        me: mpsc::WeakSender<Command>,
        commands: &mut mpsc::Receiver<Command>,
    ) -> Result<Actor, SessionError> {
        env.log.prepare(session).await?;
        match Actor::load(env.clone(), session, me.clone()).await {
            Ok(mut actor) => {
                actor.resume_orphan().await;
                Ok(actor)
            }
            // This actor is the new session's one writer from its first event.
            Err(SessionError::NotFound(_)) => {
                Actor::create(env, session, commands).await?;
                Actor::load(env.clone(), session, me).await
            }
            Err(error) => Err(error),
        }
    }

    /// Makes a new session if the first command asks for it: its first events, then what
    /// settles the calls a seed history left waiting (which names them by the ids the
    /// first append gave them). Any other first command is for a session that does not exist.
    async fn create(env: &Env, session: SessionId, commands: &mut mpsc::Receiver<Command>) -> Result<(), SessionError> {
        let not_found = || SessionError::NotFound(session.to_string());
        let (drafts, reply) = match commands.recv().await {
            Some(Command::Create(drafts, reply)) => (drafts, reply),
            Some(other) => {
                other.refuse(not_found);
                return Err(not_found());
            }
            None => return Err(not_found()),
        };
        let created = async {
            let conflict = || SessionError::Conflict(format!("session {session} was written to as it was created"));
            let first = env.log.append(session, 0, drafts).await?.map_err(|_| conflict())?;
            let settled = decide::seed_settled(&first, &seed_plan(env, &first));
            if !settled.is_empty() {
                env.log.append(session, first.len() as u64, settled).await?.map_err(|_| conflict())?;
            }
            Ok::<_, SessionError>(())
        };
        let result = created.await;
        let answer = result.as_ref().map(drop).map_err(|error| SessionError::Invalid(error.to_string()));
        let _ = reply.send(result);
        answer
    }

    async fn load(env: Arc<Env>, session: SessionId, me: mpsc::WeakSender<Command>) -> Result<Actor, SessionError> {
        let summary = env.log.summary(session).await?.ok_or_else(|| SessionError::NotFound(session.to_string()))?;
        let writer = Arc::new(Writer::new(env.log.clone(), session, 0, env.clustered));
        let mut actor = Actor {
            env,
            session,
            me,
            folded: Folded::new(summary),
            writer,
            running: None,
            after_turn: Vec::new(),
            done: false,
            lost: CancellationToken::new(),
            senders: Senders::default(),
        };
        actor.catch_up().await?;
        Ok(actor)
    }

    /// Takes commands one at a time until the session is done, idle, or no longer this
    /// node's (its lease lost, or an append failed and it must be loaded again).
    async fn run(mut self, commands: &mut mpsc::Receiver<Command>) {
        let idle = self.env.idle_after();
        while !self.done {
            // A replay may wait long between its copies: its session stays here meanwhile.
            let busy = self.running.is_some() || self.env.replays.contains(self.session);
            let next = async {
                match busy {
                    true => Some(commands.recv().await),
                    false => tokio::time::timeout(idle, commands.recv()).await.ok(),
                }
            };
            let writer = self.writer.clone();
            let command = tokio::select! {
                biased;
                _ = self.lost.cancelled() => {
                    tracing::warn!(session_id = %self.session, "this node lost the session's lease; its next holder runs it");
                    metrics::LEASE_CHANGES.with_label_values(&["lost"]).inc();
                    // Nothing more of the turn is written here: its next holder resumes it.
                    self.abort_turn();
                    return;
                }
                // An append failed after its command was handled (one whose client went, or
                // a turn's): leave the session to a new actor before the next command.
                _ = writer.failing() => return self.reload(),
                // Idle, or every sender gone.
                next = next => match next.flatten() {
                    Some(command) => command,
                    None => return,
                },
            };
            self.handle(command).await;
            if self.writer.failed() {
                return self.reload();
            }
            // Whatever left the session idle (a turn's end, an interrupt while calls
            // waited, a wake after a restart), messages that wait get their turn.
            if self.running.is_none() {
                self.answer_queued().await;
            }
            let elsewhere = self.senders.elsewhere().filter(|_| self.running.is_none() && !self.done);
            if let Some(node) = elsewhere.filter(|_| !self.env.replays.contains(self.session)).map(str::to_string) {
                tracing::debug!(session_id = %self.session, node, "handing the session to the node that sends its commands");
                // What was ordered here is published before the tail is let go.
                tokio::select! {
                    biased;
                    _ = self.lost.cancelled() => return,
                    settled = self.writer.settled() => if settled.is_err() {
                        return self.reload();
                    },
                }
                metrics::LEASE_CHANGES.with_label_values(&["handed_over"]).inc();
                self.env.handed.note(self.session, node);
                return;
            }
        }
    }

    /// An append failed (another node appended first, or its fate is unknown): what was
    /// folded here may not be the log. Stops, leaving the session to a new actor, which
    /// loads it again.
    fn reload(&mut self) {
        tracing::warn!(session_id = %self.session, "an append to this session failed; reloading it");
        self.cancel_turn();
    }

    fn cancel_turn(&mut self) {
        if let Some(running) = self.running.take() {
            running.cancel.cancel();
        }
    }

    /// Stops the running turn where it is, writing nothing more of it: its events so far
    /// stay in the log, and the session's next actor resumes it.
    fn abort_turn(&mut self) {
        if let Some(running) = self.running.take() {
            running.task.abort();
            tracing::warn!(session_id = %self.session, "left the running turn to be resumed");
        }
    }

    /// Stops now (the service's stop is past its grace), leaving the running turn.
    fn leave(&mut self, reply: oneshot::Sender<()>) {
        self.abort_turn();
        for waiting in std::mem::take(&mut self.after_turn) {
            match waiting {
                AfterTurn::Close(_, reply) => drop(reply.send(Err(SessionError::ShuttingDown))),
                AfterTurn::Stop(reply) => drop(reply.send(())),
                AfterTurn::Answer(reply, _) => drop(reply.send(Reply::Refused(SessionError::ShuttingDown))),
            }
        }
        self.done = true;
        let _ = reply.send(());
    }
}

/// A command the actor took as it stopped, sent on to the next actor where it can be.
fn bounce(command: Command, session: SessionId) {
    match command {
        Command::Submit(submission, reply) => drop(reply.send(Reply::Again(submission))),
        // Dropping the reply sends these on to the next actor.
        Command::Close(..) | Command::TurnEnded(..) | Command::Wake(_) => {}
        Command::Create(_, reply) => drop(reply.send(Err(exists(session)))),
        Command::Stop(reply) | Command::Leave(reply) => drop(reply.send(())),
        Command::Copy(_, reply) => drop(reply.send(Err(SessionError::ShuttingDown))),
        Command::EndReplay(reply) => drop(reply.send(Err(SessionError::ShuttingDown))),
    }
}

fn exists(session: SessionId) -> SessionError {
    SessionError::Conflict(format!("session {session} already exists"))
}

/// `error` once more, for another caller.
fn again(error: &SessionError) -> SessionError {
    match error {
        SessionError::NotFound(id) => SessionError::NotFound(id.clone()),
        SessionError::ShuttingDown => SessionError::ShuttingDown,
        // An engine out of reach stays so (503: try again), not a failure of the log (500).
        SessionError::Storage(error) if error.is_unavailable() => {
            SessionError::Storage(StoreError::unavailable(error.to_string()))
        }
        SessionError::Storage(error) => SessionError::Storage(StoreError::new(error.to_string())),
        other => SessionError::Invalid(other.to_string()),
    }
}

/// The tool plan a new session's seed calls were recorded by (its agent's, in its mode), to
/// say why a denied one was: empty if the session's agent is unknown here.
fn seed_plan(env: &Env, first: &[crate::domain::RawEvent]) -> crate::engine::plan::ToolPlan {
    let created = first.first().and_then(|raw| raw.decode().ok());
    let Some(crate::domain::Event { body: crate::domain::EventBody::SessionCreated { spec, .. }, .. }) = created else {
        return Default::default();
    };
    match env.agents.get_version(&spec.agent.name, spec.agent.version) {
        Some(agent) => crate::engine::plan::ToolPlan::new(&agent, &env.agents.tools, &spec, &Default::default()),
        None => Default::default(),
    }
}
