//! What an actor does with each command: it asks the decision step, appends what comes
//! back, and starts, cancels or ends the session's turn accordingly.

use std::sync::Arc;

use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use super::{exists, Actor, AfterTurn, Running};
use crate::agent::Agent;
use crate::domain::event::StopReason;
use crate::domain::{Draft, RawEvent, TurnId};
use crate::engine::command::{Closing, Follows, Input, Submission, Submitted};
use crate::engine::decide::{self, Decision, Outcome, Resume, ResumePoint};
use crate::engine::mailbox::{Answer, Command, Pending, Recall, Reply};
use crate::engine::plan::ToolPlan;
use crate::engine::rules;
use crate::engine::turn::{self, TurnContext};
use crate::engine::writer::Durable;
use crate::error::SessionError;
use crate::metrics;
use crate::projection::progress::TurnProgress;
use crate::projection::turns::Phase;
use crate::store::Position;

/// How many times a resume decides again when another writer appended as it decided.
const RESUME_ATTEMPTS: usize = 3;

impl Actor {
    pub(super) async fn handle(&mut self, command: Command) {
        match command {
            Command::Submit(submission, reply) => {
                self.senders.note(submission.forwarded_by.as_deref());
                self.submit(*submission, reply).await
            }
            Command::TurnEnded(turn, outcome) => self.end_turn(turn, outcome).await,
            Command::Create(_, reply) => drop(reply.send(Err(exists(self.session)))),
            Command::Wake(loaded) => drop(loaded.map(|loaded| loaded.send(()))),
            Command::Copy(drafts, reply) => self.copy(drafts, reply).await,
            Command::EndReplay(reply) => {
                let ended = match (&self.folded.state.phase, &self.running) {
                    (&Phase::Running(turn), None) if !self.folded.summary.deleted => {
                        Some(decide::abandoned(turn, "the replay ended before this turn did"))
                    }
                    _ => None,
                };
                let closed = match ended {
                    Some(drafts) => self.append_durably(drafts).await,
                    None => Ok(()),
                };
                let _ = reply.send(closed);
            }
            Command::Close(closing, reply) => match &self.running {
                Some(running) => {
                    running.cancel.cancel();
                    self.after_turn.push(AfterTurn::Close(closing, reply));
                }
                None => self.close(closing, reply).await,
            },
            // The running turn goes on to its end (unless the stop's grace ends first).
            Command::Stop(reply) => match &self.running {
                Some(_) => self.after_turn.push(AfterTurn::Stop(reply)),
                None => {
                    self.done = true;
                    let _ = reply.send(());
                }
            },
            Command::Leave(reply) => self.leave(reply),
        }
    }

    async fn submit(&mut self, submission: Submission, reply: oneshot::Sender<Reply>) {
        self.fold_ordered();
        if let Some(key) = &submission.request {
            let retention = self.env.idempotency_retention_ms();
            if let Some(recalled) = self.folded.requests.recall(&key.key, retention) {
                let answer = match key.matches(&recalled.fingerprint) {
                    Ok(()) => Reply::Recalled(Recall {
                        first: recalled.first,
                        events: recalled.events,
                        durable: self.writer.last(),
                    }),
                    Err(conflict) => Reply::Refused(SessionError::KeyReused(conflict)),
                };
                return drop(reply.send(answer));
            }
        }
        let cancels = submission.inputs.iter().any(|input| matches!(input, Input::Cancel));
        match self.decide_submission(submission).await {
            // Answered once the turn's end is recorded, which is durable after these.
            Ok((submitted, _)) if cancels && self.running.is_some() && !submitted.events.is_empty() => {
                self.after_turn.push(AfterTurn::Answer(reply, submitted))
            }
            Ok((submitted, durable)) => drop(reply.send(Reply::Done(Pending { submitted, durable: Some(durable) }))),
            Err(error) => drop(reply.send(Reply::Refused(error))),
        }
    }

    async fn decide_submission(&mut self, submission: Submission) -> Result<(Submitted, Durable), SessionError> {
        // An actor that started after the engine sent its stops would run a turn that no
        // one stops.
        if self.env.stopping() {
            return Err(SessionError::ShuttingDown);
        }
        let replaying = self.env.replays.contains(self.session);
        let (env, session) = (self.env.clone(), self.session);
        let mut agent = None;
        let (decision, events, durable) = self
            .apply(|folded| {
                let branched;
                let submission = match branch_of(folded, submission.follows) {
                    Some(from) => {
                        branched = Submission { follows: Follows::Branch(from), ..submission.clone() };
                        &branched
                    }
                    None => &submission,
                };
                decide::admit(session, &folded.summary, submission, replaying)?;
                let of_session = agent.insert(session_agent(&env.agents, &folded.summary)?);
                let content = submission.inputs.iter().filter_map(Input::content);
                rules::check_content(of_session, &folded.summary.spec, content)?;
                let update = rules::update(of_session, &env.agents.tools, &folded.summary.spec, &submission.update)?;
                let mut decision = decide::decide(&folded.state, submission, update, TurnId::generate(), env.limits)?;
                // A keyed write says so on its first event, in the same append.
                let count = decision.drafts.len();
                if let (Some(key), Some(first)) = (&submission.request, decision.drafts.first_mut()) {
                    *first = first.clone().marked(key.mark(count));
                }
                Ok(decision)
            })
            .await?;
        if let (Some(turn), Some(agent)) = (decision.start, agent) {
            self.start_turn(turn, agent, None);
        }
        // After starting: an interrupt that came with the input that started a turn cancels it.
        if decision.cancel {
            if let Some(running) = &self.running {
                running.cancel.cancel();
            }
        }
        Ok((Submitted { events, turn: decision.start, recalled: false }, durable))
    }

    async fn copy(&mut self, drafts: Vec<Draft>, reply: Answer<Vec<RawEvent>>) {
        let session = self.session;
        let copied = self.apply(|folded| decide::copy(session, &folded.summary, &drafts)).await;
        match copied {
            Ok((_, events, durable)) => {
                tokio::spawn(async move { drop(reply.send(durable.wait().await.map(|()| events))) });
            }
            Err(error) => drop(reply.send(Err(error))),
        }
    }

    /// Deletes (`session.deleted`, then `terminated`, after which every open stream ends)
    /// or archives (`session.archived`, once) the session; answers once that is durable.
    pub(super) async fn close(&mut self, closing: Closing, reply: Answer<()>) {
        // A replay into the session stops; a turn it copied and left open ends first.
        self.env.replays.cancel(self.session);
        let (session, running_here) = (self.session, self.running.is_some());
        let closed = self.apply(|folded| {
            let last = folded.seen.last.map_or(0, |id| id.ulid().timestamp_ms());
            let idle_for_ms = crate::domain::ids::now_ms().saturating_sub(last);
            decide::close(session, &folded.summary, &folded.state, closing, running_here, idle_for_ms)
        });
        match closed.await {
            // The actor stops after a delete, and stopping gives up what it prepared to
            // append (on JetStream, the position its appends are published at): not before
            // these are stored.
            Ok((_, _, durable)) if closing == Closing::Delete => drop(reply.send(durable.wait().await)),
            Ok((_, _, durable)) => answer_when(durable, reply),
            Err(error) => drop(reply.send(Err(error))),
        }
        self.done |= closing == Closing::Delete;
    }

    /// Resumes the turn the log shows running: nothing runs it, since this actor has just
    /// started (its process stopped, or its node lost the session's lease). The turn goes on
    /// from its log, or is closed if it was resumed `turns.max_resumes` times already.
    pub(super) async fn resume_orphan(&mut self) {
        // A replay's copied turn runs nowhere: the replay goes on with it.
        if self.env.replays.contains(self.session) {
            return;
        }
        for _ in 0..RESUME_ATTEMPTS {
            let Phase::Running(turn) = self.folded.state.phase else { return };
            match self.resume(turn).await {
                Ok(()) => return,
                // Another writer's events came (a stopped node's last append, landing late):
                // read them and decide again.
                Err(SessionError::Conflict(_) | SessionError::Unavailable(_)) => {
                    if let Err(error) = self.catch_up().await {
                        tracing::warn!(%error, session_id = %self.session, "could not read the log again to resume");
                        return;
                    }
                }
                Err(error) => {
                    tracing::warn!(%error, session_id = %self.session, turn_id = %turn, "could not resume a turn left running");
                    return;
                }
            }
        }
        tracing::warn!(session_id = %self.session, "the log kept changing under a resume; the turn is left running");
    }

    /// Decides how `turn` goes on from its events (read up to where this actor has folded
    /// the session), and appends that only if nothing was appended since.
    async fn resume(&mut self, turn: TurnId) -> Result<(), SessionError> {
        // The turn's own events, deltas and spans included, which the actor's folds skip.
        let mut progress = TurnProgress::new(turn);
        let upto = self.folded.seen.seq;
        let fold = |raw: &RawEvent| {
            if raw.seq <= upto && raw.turn().is_some_and(|(of, _)| of == turn) {
                if let Ok(event) = raw.decode() {
                    progress.apply(&event);
                }
            }
        };
        self.env.log.fold(self.session, Position::default(), fold).await?;
        let (agent, resume) = match session_agent(&self.env.agents, &self.folded.summary) {
            Ok(agent) => {
                let max_resumes = self.env.settings.turns.max_resumes;
                (Some(agent), decide::resume(turn, &progress, &self.folded.state, max_resumes))
            }
            Err(error) => (None, Resume::Close(decide::abandoned(turn, &error.to_string()))),
        };
        let (drafts, go) = match (resume, agent) {
            (Resume::Go(drafts, point), Some(agent)) => (drafts, Some((point, agent))),
            (Resume::Close(drafts), _) | (Resume::Go(drafts, _), None) => (drafts, None),
        };
        let session = self.session;
        let unchanged = |folded: &super::folded::Folded| match folded.seen.seq == upto {
            true => Ok(Decision { drafts: drafts.clone(), ..Decision::default() }),
            false => Err(SessionError::Conflict(format!("session {session}'s log changed as its turn was resumed"))),
        };
        let (_, _, durable) = self.apply(unchanged).await?;
        // Durable before the turn goes on: a crash in it counts as one more resume.
        durable.wait().await?;
        match go {
            Some((point, agent)) => {
                metrics::TURNS_RESUMED.inc();
                tracing::warn!(session_id = %self.session, turn_id = %turn, attempt = progress.resumes + 1,
                    "resuming a turn its process left running");
                self.start_turn(turn, agent, Some(point));
            }
            None => {
                let reason = if progress.interrupted { StopReason::Cancelled } else { StopReason::Error };
                metrics::TURNS.with_label_values(&[reason.as_str()]).inc();
                tracing::warn!(session_id = %self.session, turn_id = %turn, resumes = progress.resumes,
                    "closed a turn left running that does not go on");
            }
        }
        Ok(())
    }

    fn start_turn(&mut self, turn: TurnId, agent: Arc<Agent>, resume: Option<ResumePoint>) {
        let Some(me) = self.me.upgrade() else { return };
        let cancel = CancellationToken::new();
        let (env, folded) = (&self.env, &self.folded);
        let context = TurnContext {
            writer: self.writer.clone(),
            turn,
            plan: ToolPlan::new(&agent, &env.agents.tools, &folded.summary.spec, &folded.state.remembered),
            mcp: env.agents.servers_of(&agent, self.session),
            model: agent.model_for(folded.summary.spec.model.as_deref()).1,
            agent,
            tools: env.agents.tools.clone(),
            history: folded.history.messages.clone(),
            // A resumed turn runs again the calls that may run twice; the granted ones among
            // them, and the others, have their answers.
            granted: match &resume {
                Some(point) => point.rerun.clone(),
                None => folded.state.granted.clone(),
            },
            resume,
            cancel: cancel.clone(),
            delta_coalesce: env.delta_coalesce(),
            outcome: folded.outcomes.pending(),
            compact: folded.state.compacting,
        };
        let span = tracing::info_span!("turn", session_id = %self.session, turn_id = %turn);
        let task = tokio::spawn(tracing::Instrument::instrument(
            async move {
                let outcome = turn::run(context).await;
                let _ = me.send(Command::TurnEnded(turn, outcome)).await;
            },
            span,
        ));
        self.running = Some(Running { cancel, task: task.abort_handle() });
    }

    /// Starts the turn that answers the messages queued while the last one ran, if the
    /// session is idle and some wait.
    pub(super) async fn answer_queued(&mut self) {
        self.fold_ordered();
        let (state, summary) = (&self.folded.state, &self.folded.summary);
        let waiting = state.phase == Phase::Idle && !state.queued.is_empty();
        let closed = summary.deleted || summary.archived_at.is_some();
        // A replay's queued messages are answered by the turns it copies.
        if !waiting || self.env.stopping() || closed || self.env.replays.contains(self.session) {
            return;
        }
        let Ok(agent) = session_agent(&self.env.agents, summary) else { return };
        let answered =
            self.apply(|folded| Ok(decide::answer_queued(&folded.state, TurnId::generate()).unwrap_or_default()));
        match answered.await {
            Ok((Decision { start: Some(turn), .. }, ..)) => self.start_turn(turn, agent, None),
            Ok(_) => {}
            Err(error) => tracing::warn!(%error, session_id = %self.session, "could not answer queued messages"),
        }
    }

    /// Writes how the turn ended; the session is idle (or waiting) from here on. Then does
    /// what waited for the end: a close, a stop, or the answer to a cancel.
    async fn end_turn(&mut self, turn: TurnId, outcome: Outcome) {
        self.running = None;
        metrics::TURNS.with_label_values(&[outcome.stop_reason().as_str()]).inc();
        let ended = self.append(decide::end_turn(turn, &outcome)).await.map(|(_, durable)| durable);
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
                        Ok(durable) => Reply::Done(Pending { submitted, durable: Some(durable.clone()) }),
                        Err(error) => Reply::Refused(super::again(error)),
                    });
                }
            }
        }
    }

    /// Appends `drafts` and waits until they are durable.
    async fn append_durably(&mut self, drafts: Vec<Draft>) -> Result<(), SessionError> {
        let (_, durable) = self.append(drafts).await?;
        durable.wait().await
    }
}

/// The agent a session runs (its version of it).
fn session_agent(
    agents: &crate::agent::Agents,
    summary: &crate::projection::SessionSummary,
) -> Result<Arc<Agent>, SessionError> {
    let spec = &summary.spec.agent;
    let agent = agents.get_version(&spec.name, spec.version);
    agent.ok_or_else(|| SessionError::Invalid(format!("the session's agent {:?} is not configured", spec.name)))
}

/// Answers `reply` once `durable` resolves (or with the reason it did not), without holding
/// up the actor: its next append can share the flush.
fn answer_when(durable: Durable, reply: Answer<()>) {
    tokio::spawn(async move {
        let _ = reply.send(durable.wait().await);
    });
}

/// The earlier turn a submission that names one branches from: one the history keeps the
/// end of, and not the last turn (which a new turn simply follows).
fn branch_of(folded: &super::folded::Folded, follows: Follows) -> Option<TurnId> {
    match follows {
        Follows::Turn(turn) if Some(turn) != folded.state.last_turn && folded.history.can_branch_from(turn) => {
            Some(turn)
        }
        _ => None,
    }
}
