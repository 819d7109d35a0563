//! What an actor knows of its session: the summary, the history and the turn state folded
//! from the log, up to the last event it has seen; and how it decides on that state and
//! appends the decision, deciding again when another writer got there first.

use super::Actor;
use crate::domain::ids::now_ms;
use crate::domain::{RawEvent, SessionId};
use crate::engine::decide::Decision;
use crate::engine::turn::outcome::Outcomes;
use crate::engine::writer::Durable;
use crate::error::SessionError;
use crate::projection::history::History;
use crate::projection::sessions::SessionIndex;
use crate::projection::turns::TurnState;
use crate::projection::SessionSummary;
use crate::store::{Position, Projection};

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

/// How many times a decision is made again when another writer got to the log first.
const ATTEMPTS: usize = 3;

/// How long a decision waits for another writer's events to be durable before it gives up.
const CONFLICT_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

pub(super) struct Folded {
    pub summary: SessionSummary,
    pub history: History,
    pub state: TurnState,
    /// The last event folded.
    pub seen: Position,
    /// The keyed writes stored in the session, by key.
    pub requests: Requests,
    /// The session's outcome and its evaluations.
    pub outcomes: Outcomes,
}

/// A keyed write the log holds: its fingerprint, its events (by sequence number) and when
/// it was stored.
#[derive(Debug, Clone)]
pub(super) struct Recalled {
    pub fingerprint: String,
    pub first: u64,
    pub events: u32,
    pub at_ms: u64,
}

/// The session's keyed writes, by key (those older than the retention are dropped as more
/// come).
#[derive(Debug, Default)]
pub(super) struct Requests(std::collections::HashMap<String, Recalled>);

/// Keys kept before the old ones are looked for and dropped.
const REQUESTS_KEPT: usize = 1024;

impl Requests {
    fn note(&mut self, raw: &RawEvent, retention_ms: u64) {
        if raw.is_delta() {
            return;
        }
        let Some(mark) = raw.request_mark() else { return };
        let at_ms = raw.id.0.timestamp_ms();
        if self.0.len() >= REQUESTS_KEPT {
            let now = now_ms();
            self.0.retain(|_, recalled| now.saturating_sub(recalled.at_ms) <= retention_ms);
        }
        let recalled = Recalled { fingerprint: mark.fingerprint, first: raw.seq, events: mark.events, at_ms };
        self.0.insert(mark.idempotency_key, recalled);
    }

    /// The write stored under `key` within the retention, if there is one.
    pub fn recall(&self, key: &str, retention_ms: u64) -> Option<&Recalled> {
        self.0.get(key).filter(|recalled| now_ms().saturating_sub(recalled.at_ms) <= retention_ms)
    }
}

impl Folded {
    pub fn new(summary: SessionSummary) -> Folded {
        Folded {
            summary,
            history: History::compacted(),
            state: TurnState::default(),
            seen: Position::default(),
            requests: Requests::default(),
            outcomes: Outcomes::default(),
        }
    }

    /// Folds events the session's writer ordered, in hand: nothing is read back.
    fn fold_ordered(&mut self, session: SessionId, ordered: Vec<RawEvent>, retention_ms: u64) {
        for raw in ordered {
            // Already folded when a read of the log (after a conflict) got there first.
            if raw.seq <= self.seen.seq {
                continue;
            }
            if raw.seq > self.seen.seq + 1 {
                // The writer orders only at the end of what was folded: a gap is a bug, and
                // folding past it would decide on a state with events missing.
                tracing::error!(session_id = %session, seen = self.seen.seq, next = raw.seq,
                    "events ordered past a gap in what the actor folded; not folded");
                continue;
            }
            self.fold(&raw, retention_ms);
        }
    }

    fn fold(&mut self, raw: &RawEvent, retention_ms: u64) {
        self.seen = Position { last: Some(raw.id), seq: raw.seq };
        self.requests.note(raw, retention_ms);
        if raw.kind() == "user.define_outcome" {
            self.outcomes.define(raw);
        }
        if UNFOLDED.contains(&raw.kind()) {
            return;
        }
        match raw.decode() {
            Ok(event) => {
                self.history.apply(&event);
                self.state.apply(&event);
                self.outcomes.apply(&event);
                if SessionIndex.wants(raw.kind()) {
                    if let Some(next) = SessionSummary::apply(Some(self.summary.clone()), &event) {
                        self.summary = next;
                    }
                }
            }
            Err(error) => tracing::error!(%error, id = %raw.id, "an event of the log does not decode"),
        }
    }
}

impl Actor {
    /// Folds what this session's writer (the actor and its turn) ordered since the last fold.
    pub(super) fn fold_ordered(&mut self) {
        let retention = self.env.idempotency_retention_ms();
        self.folded.fold_ordered(self.session, self.writer.take_ordered(), retention);
    }

    /// Reads and folds every durable event after the last one folded (at load, and after
    /// another writer appended), then appends after it.
    pub(super) async fn catch_up(&mut self) -> Result<(), SessionError> {
        self.fold_ordered();
        let (folded, retention) = (&mut self.folded, self.env.idempotency_retention_ms());
        self.env.log.fold(self.session, folded.seen, |raw| folded.fold(raw, retention)).await?;
        self.writer.caught_up(self.folded.seen.seq);
        Ok(())
    }

    /// Decides on the state as folded so far and orders the decision's events; if another
    /// writer got there first, waits for its events, reads them and decides again. Answers
    /// the decision, its events and what resolves once they are durable, which whoever
    /// answers a client waits for.
    pub(super) async fn apply(
        &mut self,
        mut decide: impl FnMut(&Folded) -> Result<Decision, SessionError>,
    ) -> Result<(Decision, Vec<RawEvent>, Durable), SessionError> {
        for _ in 0..ATTEMPTS {
            self.fold_ordered();
            // A shared log lets go of this node's place at the end of the session when a batch
            // another node ordered lands there, and tells no actor. With no turn running and
            // nothing of its own in flight, the actor takes its place again first: the batch
            // then comes back as a conflict below, read and decided on again, not as a refusal
            // to the client (a 503 on a quiet cluster). A running turn never saw the batch, so
            // then the refusal stands and the turn ends on it. (On one node, one check of an
            // Option: the append path of sled is as it was.)
            if self.env.log.is_shared() && self.running.is_none() && self.writer.idle() {
                self.env.log.prepare(self.session).await?;
            }
            let mut decision = decide(&self.folded)?;
            let (appended, durable) = self.writer.order(std::mem::take(&mut decision.drafts))?;
            self.fold_ordered();
            let conflict = match appended {
                Ok(events) => return Ok((decision, events, durable)),
                Err(conflict) => conflict,
            };
            // The log ends before what was folded here: appends ordered here were not
            // stored (a full disk). Nothing decided on that state may be appended.
            if conflict.actual.seq < self.folded.seen.seq {
                tracing::warn!(session_id = %self.session, folded = self.folded.seen.seq, stored = conflict.actual.seq,
                    "appends to this session were not stored; loading it again");
                self.writer.invalidate();
                return Err(SessionError::Unavailable(format!(
                    "appends to session {} could not be stored; send it again",
                    self.session
                )));
            }
            tracing::warn!(session_id = %self.session, expected = conflict.expected, found = conflict.actual.seq,
                "another writer appended to this session; deciding again");
            let waited = self.env.log.durable_to(self.session, conflict.actual.seq);
            match tokio::time::timeout(CONFLICT_WAIT, waited).await {
                Ok(waited) => waited?,
                Err(_) => break,
            }
            self.catch_up().await?;
        }
        Err(SessionError::Conflict("the session's log kept changing under this request; send it again".into()))
    }

    /// Appends what a decision made without looking at the state (a turn's end, a copy).
    pub(super) async fn append(
        &mut self,
        drafts: Vec<crate::domain::Draft>,
    ) -> Result<(Vec<RawEvent>, Durable), SessionError> {
        let (_, events, durable) =
            self.apply(|_| Ok(Decision { drafts: drafts.clone(), ..Decision::default() })).await?;
        Ok((events, durable))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::event::Usage;
    use crate::domain::{Draft, Event, EventBody, EventId, TurnId};

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
                context_window: None,
                usage_estimated: false,
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
