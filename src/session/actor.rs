//! A session's actor: it owns the session's state (folded from the log), hands each
//! submission to the decision step, appends what it decides, and starts, cancels and ends
//! turns. It and its running turn are the session's one writer.

use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::cluster::Lease;
use super::decide::{self, decide, idle, Decision};
use super::engine::{abandoned, interrupted, Closing, Command, Engine, Input, Pending, Submission, Submitted};
use super::log::{Durable, Writer};
use super::turn::{self, Outcome, ToolPlan, TurnContext};
use super::{rules, SessionError};
use crate::agent::Agent;
use crate::domain::event::StopReason;
use crate::domain::{Draft, EventBody, RawEvent, SessionId, TurnId};
use crate::metrics;
use crate::projection::history::History;
use crate::projection::sessions::SessionIndex;
use crate::projection::turns::{Phase, TurnState};
use crate::projection::SessionSummary;
use crate::store::Projection;
use crate::store::{Position, StoreError};

/// Kinds that none of the actor's folds (history, turn state, summary) reads, so they are
/// not decoded: a turn's deltas and spans, and outcomes, are most of a busy log.
/// `tests::the_folds_ignore_the_kinds_the_actor_skips` holds the folds to this list.
const UNFOLDED: &[&str] = &[
    "agent.message.delta",
    "agent.thinking.delta",
    "user.define_outcome",
    "span.model_request_end",
    "session.status_running",
];

pub(super) struct Actor {
    engine: Engine,
    session: SessionId,
    me: mpsc::WeakSender<Command>,
    summary: SessionSummary,
    history: History,
    state: TurnState,
    seen: Position,
    writer: Arc<Writer>,
    running: Option<(TurnId, CancellationToken)>,
    /// What waits for the running turn's end to be recorded.
    after_turn: Vec<AfterTurn>,
    /// Set once the actor is done (deleted or stopped); it exits after this command.
    done: bool,
    /// Cancelled if this node loses the session's lease: another node runs it from then on.
    lost: CancellationToken,
}

enum AfterTurn {
    Close(Closing, oneshot::Sender<Result<(), SessionError>>),
    Stop(oneshot::Sender<()>),
    /// The answer to a cancel: given once the turn's end is recorded, so that the session
    /// takes a new turn as soon as the cancel is answered.
    Answer(oneshot::Sender<Result<Pending, SessionError>>, Submitted),
}

/// How many times a decision is made again when another writer got to the log first.
const ATTEMPTS: usize = 3;

/// How long a decision waits for another writer's events to be durable before it gives up.
const CONFLICT_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

impl Actor {
    /// Loads the session from its log and runs; if it cannot be loaded, answers what was
    /// already queued with the reason and leaves the registry.
    pub async fn start(
        engine: Engine,
        session: SessionId,
        generation: u64,
        me: mpsc::WeakSender<Command>,
        commands: mpsc::Receiver<Command>,
        lease: Option<Box<dyn Lease>>,
    ) {
        // Without a lease (one node), nothing is ever lost.
        let lost = lease.as_ref().map(|lease| lease.lost()).unwrap_or_default();
        Actor::serve(engine, session, generation, me, commands, lost).await;
        if let Some(lease) = lease {
            lease.release().await;
        }
    }

    async fn serve(
        engine: Engine,
        session: SessionId,
        generation: u64,
        me: mpsc::WeakSender<Command>,
        mut commands: mpsc::Receiver<Command>,
        lost: CancellationToken,
    ) {
        let prepared = engine.inner.log.prepare(session).await;
        let loaded = match prepared {
            Ok(()) => Actor::load(engine.clone(), session, me.clone()).await,
            Err(error) => Err(error),
        };
        let failure = match loaded {
            Ok(mut actor) => {
                actor.lost = lost;
                actor.close_orphan().await;
                return actor.run(generation, commands).await;
            }
            // No such session: if the first command creates it, this actor is its one writer
            // from its first event.
            Err(SessionError::NotFound(_)) => match Actor::create(&engine, session, &mut commands).await {
                Ok(()) => match Actor::load(engine.clone(), session, me).await {
                    Ok(mut actor) => {
                        actor.lost = lost;
                        return actor.run(generation, commands).await;
                    }
                    Err(error) => error,
                },
                Err(error) => error,
            },
            Err(error) => error,
        };
        engine.inner.log.release(session);
        engine.retire(session, generation);
        commands.close();
        while let Ok(command) = commands.try_recv() {
            refuse(command, &failure);
        }
    }

    /// Makes a new session if the first command asks for it: its first events, then what
    /// settles the calls a seed history left waiting (which names them by the ids the
    /// first append gave them). Any other first command is for a session that does not exist.
    async fn create(
        engine: &Engine,
        session: SessionId,
        commands: &mut mpsc::Receiver<Command>,
    ) -> Result<(), SessionError> {
        let not_found = SessionError::NotFound(session.to_string());
        let (drafts, reply) = match commands.recv().await {
            Some(Command::Create(drafts, reply)) => (drafts, reply),
            Some(other) => {
                refuse(other, &not_found);
                return Err(not_found);
            }
            None => return Err(not_found),
        };
        let log = &engine.inner.log;
        let created = async {
            let conflict = || SessionError::Conflict(format!("session {session} was written to as it was created"));
            let first = log.append(session, 0, drafts).await?.map_err(|_| conflict())?;
            let settled = decide::seed_settled(&first);
            if !settled.is_empty() {
                log.append(session, first.len() as u64, settled).await?.map_err(|_| conflict())?;
            }
            Ok::<_, SessionError>(())
        };
        let result = created.await;
        let answer = result.as_ref().map(drop).map_err(|error| SessionError::Invalid(error.to_string()));
        let _ = reply.send(result);
        answer
    }

    async fn load(engine: Engine, session: SessionId, me: mpsc::WeakSender<Command>) -> Result<Actor, SessionError> {
        let log = engine.inner.log.clone();
        let summary = log.summary(session).await?.ok_or_else(|| SessionError::NotFound(session.to_string()))?;
        let writer = Arc::new(Writer::new(log, session, 0, engine.clustered()));
        let mut actor = Actor {
            engine,
            session,
            me,
            summary,
            history: History::default(),
            state: TurnState::default(),
            seen: Position::default(),
            writer,
            running: None,
            after_turn: Vec::new(),
            done: false,
            lost: CancellationToken::new(),
        };
        actor.catch_up().await?;
        Ok(actor)
    }

    async fn run(mut self, generation: u64, mut commands: mpsc::Receiver<Command>) {
        let idle = self.engine.idle_after();
        while !self.done {
            // A replay may wait long between its copies: its session stays here meanwhile.
            let running = self.running.is_some() || self.engine.is_replaying(self.session);
            let next = async {
                if running {
                    Some(commands.recv().await)
                } else {
                    tokio::time::timeout(idle, commands.recv()).await.ok()
                }
            };
            let writer = self.writer.clone();
            let next = tokio::select! {
                biased;
                _ = self.lost.cancelled() => {
                    tracing::warn!(session_id = %self.session, "this node lost the session's lease; another node runs it");
                    metrics::LEASE_CHANGES.with_label_values(&["lost"]).inc();
                    if let Some((_, cancel)) = self.running.take() {
                        cancel.cancel();
                    }
                    break;
                }
                // An append failed after its command was handled (one whose client went, or
                // a turn's): leave the session to a new actor before the next command.
                _ = writer.failing() => {
                    self.reload();
                    break;
                }
                next = next => match next {
                    Some(next) => next,
                    // Idle.
                    None => break,
                },
            };
            match next {
                Some(command) => {
                    self.handle(command).await;
                    if self.writer.failed() {
                        self.reload();
                        break;
                    }
                    // Whatever left the session idle (a turn's end, an interrupt while calls
                    // waited, a wake after a restart), messages that wait get their turn.
                    if self.running.is_none() {
                        self.answer_queued().await;
                    }
                }
                None => return,
            }
        }
        // Idle or done: leave the registry, then bounce whatever was already queued so that
        // it goes to the next actor; nothing is running, so nothing else can arrive.
        // What this actor prepared goes before another actor can start and prepare again.
        self.engine.inner.log.release(self.session);
        self.engine.retire(self.session, generation);
        commands.close();
        while let Ok(command) = commands.try_recv() {
            match command {
                Command::Submit(submission, reply) => drop(reply.send(Err(SessionError::Retry(submission)))),
                // Dropping the reply sends these on to the next actor.
                Command::Close(..) | Command::TurnEnded(..) | Command::Wake => {}
                Command::Create(_, reply) => drop(reply.send(Err(exists(self.session)))),
                Command::Stop(reply) => drop(reply.send(())),
                Command::Copy(_, reply) => drop(reply.send(Err(SessionError::ShuttingDown))),
                Command::EndReplay(reply) => drop(reply.send(Err(SessionError::ShuttingDown))),
            }
        }
    }

    async fn handle(&mut self, command: Command) {
        match command {
            Command::Submit(submission, reply) => {
                let cancels = submission.inputs.iter().any(|input| matches!(input, Input::Cancel));
                match self.submit(*submission).await {
                    // Answered once the turn's end is recorded, which is durable after these.
                    Ok((submitted, _)) if cancels && self.running.is_some() && !submitted.events.is_empty() => {
                        self.after_turn.push(AfterTurn::Answer(reply, submitted))
                    }
                    Ok((submitted, durable)) => drop(reply.send(Ok(Pending { submitted, durable: Some(durable) }))),
                    Err(error) => drop(reply.send(Err(error))),
                }
            }
            Command::TurnEnded(turn, outcome) => self.end_turn(turn, outcome).await,
            Command::Create(_, reply) => drop(reply.send(Err(exists(self.session)))),
            Command::Wake => {}
            Command::Copy(drafts, reply) => {
                let copied = self.apply(|actor| {
                    if actor.summary.deleted {
                        return Err(SessionError::NotFound(actor.session.to_string()));
                    }
                    Ok(Decision { drafts: drafts.clone(), ..Decision::default() })
                });
                match copied.await {
                    Ok((_, events, durable)) => {
                        tokio::spawn(async move { drop(reply.send(durable.wait().await.map(|()| events))) });
                    }
                    Err(error) => drop(reply.send(Err(error))),
                }
            }
            Command::EndReplay(reply) => {
                let closed = match (&self.state.phase, &self.running) {
                    (&Phase::Running(turn), None) if !self.summary.deleted => {
                        let ended = abandoned(turn, "the replay ended before this turn did");
                        match self.apply(|_| Ok(Decision { drafts: ended.clone(), ..Decision::default() })).await {
                            Ok((_, _, durable)) => durable.wait().await,
                            Err(error) => Err(error),
                        }
                    }
                    _ => Ok(()),
                };
                let _ = reply.send(closed);
            }
            Command::Close(closing, reply) => match &self.running {
                Some((_, cancel)) => {
                    cancel.cancel();
                    self.after_turn.push(AfterTurn::Close(closing, reply));
                }
                None => self.close(closing, reply).await,
            },
            Command::Stop(reply) => match &self.running {
                Some((_, cancel)) => {
                    cancel.cancel();
                    self.after_turn.push(AfterTurn::Stop(reply));
                }
                None => {
                    self.done = true;
                    let _ = reply.send(());
                }
            },
        }
    }

    /// Folds what this session's writer (the actor and its turn) ordered since the last
    /// fold, in hand: nothing is read back.
    fn fold_ordered(&mut self) {
        for raw in self.writer.take_ordered() {
            // Already folded when a read of the log (after a conflict) got there first.
            if raw.seq <= self.seen.seq {
                continue;
            }
            if raw.seq > self.seen.seq + 1 {
                // The writer orders only at the end of what was folded: a gap is a bug, and
                // folding past it would decide on a state with events missing.
                tracing::error!(session_id = %self.session, seen = self.seen.seq, next = raw.seq,
                    "events ordered past a gap in what the actor folded; not folded");
                continue;
            }
            self.fold(&raw);
        }
    }

    fn fold(&mut self, raw: &RawEvent) {
        self.seen = Position { last: Some(raw.id), seq: raw.seq };
        if UNFOLDED.contains(&raw.kind()) {
            return;
        }
        match raw.decode() {
            Ok(event) => {
                self.history.apply(&event);
                self.state.apply(&event);
                if SessionIndex.wants(raw.kind()) {
                    if let Some(next) = SessionSummary::apply(Some(self.summary.clone()), &event) {
                        self.summary = next;
                    }
                }
            }
            Err(error) => tracing::error!(%error, id = %raw.id, "an event of the log does not decode"),
        }
    }

    /// Reads and folds every durable event after the last one folded (at load, and after
    /// another writer appended), then appends after it.
    async fn catch_up(&mut self) -> Result<(), SessionError> {
        self.fold_ordered();
        let log = self.engine.inner.log.clone();
        log.fold(self.session, self.seen, |raw| self.fold(raw)).await?;
        self.writer.caught_up(self.seen.seq);
        Ok(())
    }

    /// Decides on the state as folded so far and orders the decision's events; if another
    /// writer got there first, waits for its events, reads them and decides again. Answers
    /// the decision, its events and what resolves once they are durable, which whoever
    /// answers a client waits for.
    async fn apply(
        &mut self,
        mut decide: impl FnMut(&Actor) -> Result<Decision, SessionError>,
    ) -> Result<(Decision, Vec<RawEvent>, Durable), SessionError> {
        for _ in 0..ATTEMPTS {
            self.fold_ordered();
            let mut decision = decide(self)?;
            let (appended, durable) = self.writer.order(std::mem::take(&mut decision.drafts))?;
            self.fold_ordered();
            match appended {
                Ok(events) => return Ok((decision, events, durable)),
                // The log ends before what was folded here: appends ordered here were not
                // stored (a full disk). Nothing decided on that state may be appended.
                Err(conflict) if conflict.actual.seq < self.seen.seq => {
                    tracing::warn!(session_id = %self.session, folded = self.seen.seq, stored = conflict.actual.seq,
                        "appends to this session were not stored; loading it again");
                    self.writer.invalidate();
                    return Err(SessionError::Unavailable(format!(
                        "appends to session {} could not be stored; send it again",
                        self.session
                    )));
                }
                Err(conflict) => {
                    tracing::warn!(session_id = %self.session, expected = conflict.expected, found = conflict.actual.seq,
                        "another writer appended to this session; deciding again");
                    let log = &self.engine.inner.log;
                    match tokio::time::timeout(CONFLICT_WAIT, log.durable_to(self.session, conflict.actual.seq)).await {
                        Ok(waited) => waited?,
                        Err(_) => break,
                    }
                    self.catch_up().await?;
                }
            }
        }
        Err(SessionError::Conflict("the session's log kept changing under this request; send it again".into()))
    }

    /// An append failed (another node appended first, or its fate is unknown): what was
    /// folded here may not be the log. Stops, leaving the session to a new actor, which
    /// loads it again.
    fn reload(&mut self) {
        tracing::warn!(session_id = %self.session, "an append to this session failed; reloading it");
        if let Some((_, cancel)) = self.running.take() {
            cancel.cancel();
        }
    }

    /// Closes the turn the log shows running, as a restart does: nothing runs it, since
    /// this actor has just started (its node stopped, or lost the session's lease).
    async fn close_orphan(&mut self) {
        let Phase::Running(turn) = self.state.phase else { return };
        // A replay's copied turn runs nowhere: the replay goes on with it.
        if self.engine.is_replaying(self.session) {
            return;
        }
        let closed = self.apply(|_| Ok(Decision { drafts: interrupted(turn), ..Decision::default() })).await;
        let closed = match closed {
            Ok((_, _, durable)) => durable.wait().await,
            Err(error) => Err(error),
        };
        match closed {
            Ok(()) => {
                tracing::warn!(session_id = %self.session, turn_id = %turn, "closed a turn nothing runs any more")
            }
            Err(error) => tracing::warn!(%error, session_id = %self.session, "could not close a turn left running"),
        }
    }

    fn agent(&self) -> Result<Arc<Agent>, SessionError> {
        let spec = &self.summary.spec.agent;
        let agent = self.engine.inner.agents.get_version(&spec.name, spec.version);
        agent.ok_or_else(|| SessionError::Invalid(format!("the session's agent {:?} is not configured", spec.name)))
    }

    async fn submit(&mut self, submission: Submission) -> Result<(Submitted, Durable), SessionError> {
        // An actor that started after the engine sent its stops would run a turn that no
        // one stops.
        if self.engine.stopping() {
            return Err(SessionError::ShuttingDown);
        }
        if self.engine.is_replaying(self.session) {
            return Err(SessionError::Conflict(format!(
                "session {} is replaying another session's events: it takes input once the replay is done",
                self.session
            )));
        }
        let tools = self.engine.inner.agents.tools.clone();
        let mut agent = None;
        let (decision, events, durable) = self
            .apply(|actor| {
                if actor.summary.deleted {
                    return Err(SessionError::NotFound(actor.session.to_string()));
                }
                // An archived session runs nothing: a cancel has nothing to do.
                let only_cancels = submission.update.is_empty()
                    && !submission.inputs.is_empty()
                    && submission.inputs.iter().all(|input| matches!(input, Input::Cancel));
                if actor.summary.archived_at.is_some() && !only_cancels {
                    return Err(SessionError::Conflict(format!(
                        "session {} is archived: it takes no input",
                        actor.session
                    )));
                }
                let of_session = agent.insert(actor.agent()?);
                let update = rules::update(of_session, &tools, &actor.summary.spec, &submission.update)?;
                decide(&actor.state, &submission, update, TurnId::generate(), actor.engine.inner.limits)
            })
            .await?;
        if let (Some(turn), Some(agent)) = (decision.start, agent) {
            self.start_turn(turn, agent);
        }
        // After starting: an interrupt that came with the input that started a turn cancels it.
        if decision.cancel {
            if let Some((_, cancel)) = &self.running {
                cancel.cancel();
            }
        }
        Ok((Submitted { events, turn: decision.start }, durable))
    }

    /// Deletes (`session.deleted`, then `terminated`, after which every open stream ends)
    /// or archives (`session.archived`, once) the session; answers once that is durable.
    async fn close(&mut self, closing: Closing, reply: oneshot::Sender<Result<(), SessionError>>) {
        // A replay into the session stops; a turn it copied and left open ends first.
        self.engine.cancel_replay(self.session);
        let closed = self.apply(|actor| {
            if actor.summary.deleted {
                return Err(SessionError::NotFound(actor.session.to_string()));
            }
            let mut drafts = match (&actor.state.phase, &actor.running) {
                (&Phase::Running(turn), None) => abandoned(turn, "the session was closed before this turn ended"),
                _ => Vec::new(),
            };
            drafts.extend(match closing {
                Closing::Delete => vec![
                    Draft::new(None, &EventBody::SessionDeleted {}),
                    Draft::new(None, &EventBody::Terminated { reason: "session deleted".into() }),
                ],
                Closing::Archive if actor.summary.archived_at.is_some() => Vec::new(),
                Closing::Archive => vec![Draft::new(None, &EventBody::SessionArchived {})],
            });
            Ok(Decision { drafts, ..Decision::default() })
        });
        match closed.await {
            // The actor stops after a delete, and stopping gives up what it prepared to
            // append (on JetStream, the position its appends are published at): not before
            // these are stored.
            Ok((_, _, durable)) if closing == Closing::Delete => drop(reply.send(durable.wait().await)),
            Ok((_, _, durable)) => answer_when(durable, reply, ()),
            Err(error) => drop(reply.send(Err(error))),
        }
        self.done |= closing == Closing::Delete;
    }

    fn start_turn(&mut self, turn: TurnId, agent: Arc<Agent>) {
        let Some(me) = self.me.upgrade() else { return };
        let cancel = CancellationToken::new();
        let inner = &self.engine.inner;
        let context = TurnContext {
            writer: self.writer.clone(),
            turn,
            plan: ToolPlan::new(&agent, &inner.agents.tools, &self.summary.spec, &self.state.remembered),
            mcp: [Some(agent.mcp.clone()), inner.agents.attached(self.session)].into_iter().flatten().collect(),
            agent,
            tools: inner.agents.tools.clone(),
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

    /// Starts the turn that answers the messages queued while the last one ran, if the
    /// session is idle and some wait.
    async fn answer_queued(&mut self) {
        self.fold_ordered();
        let waiting = self.state.phase == Phase::Idle && !self.state.queued.is_empty();
        let closed = self.summary.deleted || self.summary.archived_at.is_some();
        // A replay's queued messages are answered by the turns it copies.
        if !waiting || self.engine.stopping() || closed || self.engine.is_replaying(self.session) {
            return;
        }
        let Ok(agent) = self.agent() else { return };
        let answered =
            self.apply(|actor| Ok(decide::answer_queued(&actor.state, TurnId::generate()).unwrap_or_default()));
        match answered.await {
            Ok((Decision { start: Some(turn), .. }, ..)) => self.start_turn(turn, agent),
            Ok(_) => {}
            Err(error) => tracing::warn!(%error, session_id = %self.session, "could not answer queued messages"),
        }
    }

    /// Writes how the turn ended; the session is idle (or waiting) from here on. Then
    /// answers queued messages, or does what waited for the end: a delete, or a stop.
    async fn end_turn(&mut self, turn: TurnId, outcome: Outcome) {
        self.running = None;
        let (reason, pending) = match &outcome.stop {
            Ok((reason, pending)) => (*reason, pending.clone()),
            Err(_) => (StopReason::Error, vec![]),
        };
        metrics::TURNS.with_label_values(&[stop_label(reason)]).inc();
        let ended = self.apply(|_| {
            let mut drafts = Vec::new();
            if let Err(error) = &outcome.stop {
                let body = EventBody::SessionError {
                    error: error.message.clone(),
                    code: error.code.clone(),
                    mcp_server: error.mcp_server.clone(),
                };
                drafts.push(Draft::new(Some(turn), &body));
            }
            drafts.push(Draft::new(Some(turn), &idle(reason, pending.clone(), outcome.usage)));
            Ok(Decision { drafts, ..Decision::default() })
        });
        let ended = ended.await.map(|(_, _, durable)| durable);
        if let Err(error) = &ended {
            tracing::warn!(%error, session_id = %self.session, turn_id = %turn, "could not record the end of a turn");
        }
        for waiting in std::mem::take(&mut self.after_turn) {
            match waiting {
                AfterTurn::Close(closing, reply) => self.close(closing, reply).await,
                AfterTurn::Stop(reply) => {
                    self.done = true;
                    let _ = reply.send(());
                }
                AfterTurn::Answer(reply, submitted) => {
                    let _ = reply.send(match &ended {
                        Ok(durable) => Ok(Pending { submitted, durable: Some(durable.clone()) }),
                        Err(error) => Err(again(error)),
                    });
                }
            }
        }
    }
}

/// Sends `answer` once `durable` resolves (or the reason it did not), without holding up
/// the actor: its next append can share the flush.
fn answer_when<T: Send + 'static>(durable: Durable, reply: oneshot::Sender<Result<T, SessionError>>, answer: T) {
    tokio::spawn(async move {
        let _ = reply.send(durable.wait().await.map(|()| answer));
    });
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

/// Answers a command that no actor will handle, with `failure`.
fn refuse(command: Command, failure: &SessionError) {
    let answer = || again(failure);
    match command {
        Command::Submit(_, reply) => drop(reply.send(Err(answer()))),
        Command::Create(_, reply) => drop(reply.send(Err(answer()))),
        Command::Close(_, reply) => drop(reply.send(Err(answer()))),
        Command::Stop(reply) => drop(reply.send(())),
        Command::Copy(_, reply) => drop(reply.send(Err(answer()))),
        Command::EndReplay(reply) => drop(reply.send(Err(answer()))),
        Command::TurnEnded(..) | Command::Wake => {}
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::event::Usage;
    use crate::domain::{Event, EventId};

    #[test]
    fn the_folds_ignore_the_kinds_the_actor_skips() {
        let bodies = [
            EventBody::AgentMessageDelta { message_id: "msg_1".into(), delta: "a".into() },
            EventBody::AgentThinkingDelta { message_id: "msg_1".into(), delta: "b".into() },
            EventBody::UserDefineOutcome { outcome: serde_json::json!({"done": true}) },
            EventBody::ModelRequestEnd {
                span_id: "span_1".into(),
                model: "scripted".into(),
                usage: Usage { input_tokens: 1, output_tokens: 2 },
                is_error: false,
                model_request_start_id: None,
                stop_reason: None,
            },
            EventBody::StatusRunning { status: "running".into() },
        ];
        let kinds: Vec<String> = bodies.iter().map(|b| Draft::new(None, b).kind().to_string()).collect();
        assert_eq!(kinds, UNFOLDED, "one body of each skipped kind, in the list's order");
        let session = SessionId(ulid::Ulid::new());
        let turn = TurnId(ulid::Ulid::new());
        let created = Event {
            id: EventId(ulid::Ulid::new()),
            session_id: session,
            turn_id: None,
            turn_sequence_number: None,
            sequence_number: 1,
            created_at: "2026-01-01T00:00:00Z".into(),
            processed_at: Some("2026-01-01T00:00:00Z".into()),
            schema_version: 1,
            body: EventBody::TurnStarted {},
        };
        let (mut history, mut state) = (History::default(), TurnState::default());
        for body in bodies {
            let event = Event { turn_id: Some(turn), body, ..created.clone() };
            let before = (format!("{history:?}"), format!("{state:?}"));
            history.apply(&event);
            state.apply(&event);
            assert_eq!(before, (format!("{history:?}"), format!("{state:?}")), "{:?} changed a fold", event.body);
            assert!(!SessionIndex.wants(Draft::new(None, &event.body).kind()));
        }
    }
}
