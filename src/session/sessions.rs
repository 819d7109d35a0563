//! [`Sessions`]: the front door. Each call that names a session takes the summary that
//! [`Sessions::get`] gave the caller, so ownership is checked once, where the id arrives.

use std::sync::Arc;

use ulid::Ulid;

use super::decide::seed_waiting;
use super::log::SessionLog;
use super::turn::ToolPlan;
use super::{rules, Caller, Cursor, Engine, Follower, SessionError, Submission, Submitted};
use crate::agent::Agents;
use crate::domain::event::SessionSpec;
use crate::domain::{Draft, EventBody, EventId, Message, RawEvent, SessionId, TurnId};
use crate::projection::history::History;
use crate::projection::{SessionIndex, SessionSummary, TurnIndex, TurnSummary};
use crate::store::{Key, Position, ReadRange, Scan};

#[derive(Debug, Clone, Default)]
pub struct ListFilter {
    pub agent: Option<String>,
    pub created_by: Option<String>,
    /// RFC 3339 in UTC with microseconds, as stored.
    pub created_after: Option<String>,
    pub created_before: Option<String>,
    /// Continue after this session (newest first).
    pub after: Option<SessionId>,
    pub limit: usize,
}

pub struct Page<T> {
    pub items: Vec<T>,
    pub has_more: bool,
}

/// A page of a session's events: after and before cursors (exclusive), in either order,
/// of the given types only (all when empty).
#[derive(Debug, Clone, Default)]
pub struct EventQuery {
    pub after: Option<Cursor>,
    pub before: Option<Cursor>,
    pub limit: usize,
    pub newest_first: bool,
    pub kinds: Vec<String>,
}

pub struct EventPage {
    pub events: Vec<RawEvent>,
    pub has_more: bool,
}

/// A page of a session's turns, newest first, strictly before `before`.
#[derive(Debug, Clone, Copy, Default)]
pub struct TurnQuery {
    pub before: Option<TurnId>,
    pub limit: usize,
}

/// Projected values read per step of a filtered listing.
const SCAN_CHUNK: usize = 256;

#[derive(Clone)]
pub struct Sessions {
    log: SessionLog,
    engine: Engine,
    agents: Arc<Agents>,
}

impl Sessions {
    pub(crate) fn new(log: SessionLog, engine: Engine, agents: Arc<Agents>) -> Sessions {
        Sessions { log, engine, agents }
    }

    /// The configured agents and server tools.
    pub fn agents(&self) -> &Agents {
        &self.agents
    }

    /// Checks `spec` against its agent and starts the session's log. A seed history that
    /// ends with tool calls leaves them waiting for the client, as if the model had just
    /// made them.
    pub async fn create(&self, caller: &Caller, mut spec: SessionSpec) -> Result<SessionSummary, SessionError> {
        let Some(agent) = self.agents.get(&spec.agent.name) else {
            let known: Vec<&str> = self.agents.all().map(|a| a.name.as_str()).collect();
            return Err(SessionError::Invalid(format!(
                "invalid field `agent.name`: no agent named {:?}; this server has: {}",
                spec.agent.name,
                known.join(", ")
            )));
        };
        rules::check_new(&agent, &self.agents.tools, &mut spec)?;
        let id = SessionId::generate();
        let waiting =
            seed_waiting(&spec.messages, &ToolPlan::new(&agent, &self.agents.tools, &spec), TurnId::generate());
        let mut drafts =
            vec![Draft::new(None, &EventBody::SessionCreated { spec, created_by: caller.subject.clone() })];
        if waiting.is_empty() {
            // One append, at the start of a log no one else knows: nothing can come between.
            self.log
                .append(id, 0, drafts)
                .await?
                .map_err(|_| SessionError::Conflict(format!("session {id} exists")))?;
        } else {
            // Two appends (the second names the calls by the ids the first gives them): made
            // by the session's actor, its one writer from the start.
            drafts.extend(waiting);
            self.engine.create(id, drafts).await?;
        }
        let summary = self.log.summary(id).await?.ok_or_else(|| SessionError::NotFound(id.to_string()))?;
        Ok(self.redacted(summary))
    }

    /// The session if it exists, is not deleted, and the caller may see it: one answer
    /// (not found) for all three, so ids of other subjects are not disclosed. Secret
    /// option values are redacted.
    pub async fn get(&self, caller: &Caller, id: &str) -> Result<SessionSummary, SessionError> {
        let not_found = || SessionError::NotFound(id.to_string());
        let session: SessionId = id.parse().map_err(|_| not_found())?;
        match self.log.summary(session).await? {
            Some(summary) if !summary.deleted && caller.may_see(&summary) => Ok(self.redacted(summary)),
            _ => Err(not_found()),
        }
    }

    fn redacted(&self, mut summary: SessionSummary) -> SessionSummary {
        rules::redact(self.agents.get(&summary.spec.agent.name).as_deref(), &mut summary.spec);
        summary
    }

    /// The caller's sessions, newest first, filtered.
    pub async fn list(&self, caller: &Caller, filter: &ListFilter) -> Result<Page<SessionSummary>, SessionError> {
        let mut items = Vec::new();
        let mut after = filter.after.map(Key::session);
        // Enough for the page when nothing is filtered out; more per step when much is.
        let mut chunk = (filter.limit + 1).min(SCAN_CHUNK);
        loop {
            let scan = Scan { session: None, after, newest_first: true, limit: chunk };
            chunk = SCAN_CHUNK;
            let page = self.log.scan::<SessionSummary>(SessionIndex::NAME, scan).await?;
            let Some((last, _)) = page.last() else { return Ok(Page { items, has_more: false }) };
            after = Some(*last);
            for (_, summary) in page {
                if summary.deleted || !caller.may_see(&summary) || !matches(filter, &summary) {
                    continue;
                }
                if filter.created_after.as_deref().is_some_and(|after| summary.created_at.as_str() <= after) {
                    // Newest first: everything further is older still.
                    return Ok(Page { items, has_more: false });
                }
                if items.len() == filter.limit {
                    return Ok(Page { items, has_more: true });
                }
                items.push(self.redacted(summary));
            }
        }
    }

    /// Cancels what runs in the session and records its end, then appends
    /// `session.deleted` and `terminated`; every open stream ends after the latter.
    pub async fn delete(&self, caller: &Caller, id: &str) -> Result<(), SessionError> {
        let summary = self.get(caller, id).await?;
        self.engine.delete(summary.id).await
    }

    /// Hands input to the session's engine. Refusals come back before anything is stored.
    pub async fn submit(&self, session: &SessionSummary, submission: Submission) -> Result<Submitted, SessionError> {
        self.engine.submit(session.id, submission).await
    }

    /// The session's history, folded from its whole log.
    pub async fn history(&self, session: &SessionSummary) -> Result<Vec<Message>, SessionError> {
        let mut history = History::default();
        self.log
            .fold(session.id, Position::default(), |raw| {
                if let Ok(event) = raw.decode() {
                    history.apply(&event);
                }
            })
            .await?;
        Ok(history.messages)
    }

    /// A page of the session's events.
    pub async fn events(&self, session: &SessionSummary, query: EventQuery) -> Result<EventPage, SessionError> {
        let mut after = self.after(session, query.after).await?.last;
        let mut before = None;
        if let Some(cursor) = query.before {
            match self.position(session, cursor).await?.last {
                Some(id) => before = Some(id),
                // Before the start of the log: nothing.
                None => return Ok(EventPage { events: Vec::new(), has_more: false }),
            }
        }
        // Read one more than asked to know whether there is more; with a type filter, read
        // on in chunks until enough events match.
        let wanted = |e: &RawEvent| query.kinds.is_empty() || query.kinds.iter().any(|k| k == e.kind());
        let mut found: Vec<RawEvent> = Vec::new();
        loop {
            let chunk = query.limit.max(256);
            let range = ReadRange { after, before, limit: chunk, newest_first: query.newest_first };
            let events = self.log.read(session.id, range).await?;
            let exhausted = events.len() < chunk;
            if let Some(last) = events.last() {
                if query.newest_first {
                    before = Some(last.id);
                } else {
                    after = Some(last.id);
                }
            }
            found.extend(events.into_iter().filter(wanted));
            if found.len() > query.limit || exhausted {
                break;
            }
        }
        let has_more = found.len() > query.limit;
        found.truncate(query.limit);
        Ok(EventPage { events: found, has_more })
    }

    /// A follower of the session's log after `after` (from the start when `None`).
    pub async fn follow(&self, session: &SessionSummary, after: Option<Cursor>) -> Result<Follower, SessionError> {
        let position = self.after(session, after).await?;
        self.log.follower(session.id, position).await
    }

    /// A follower that starts at the current end of the log (live only).
    pub async fn follow_live(&self, session: &SessionSummary) -> Result<Follower, SessionError> {
        self.log.live(session.id).await
    }

    /// The session's turns, newest first.
    pub async fn turns(&self, session: &SessionSummary, query: TurnQuery) -> Result<Page<TurnSummary>, SessionError> {
        let after = query.before.map(|turn| Key { session: session.id, item: Some(turn.ulid()) });
        let scan = Scan { session: Some(session.id), after, newest_first: true, limit: query.limit + 1 };
        let mut items: Vec<TurnSummary> =
            self.log.scan(TurnIndex::NAME, scan).await?.into_iter().map(|(_, turn)| turn).collect();
        let has_more = items.len() > query.limit;
        items.truncate(query.limit);
        Ok(Page { items, has_more })
    }

    /// One turn of the session, by its id as a client sent it.
    pub async fn turn(&self, session: &SessionSummary, id: &str) -> Result<TurnSummary, SessionError> {
        let not_found = || SessionError::TurnNotFound { turn: id.to_string(), session: session.id.to_string() };
        let turn: TurnId = id.parse().map_err(|_| not_found())?;
        self.turn_by_id(session, turn).await?.ok_or_else(not_found)
    }

    async fn turn_by_id(&self, session: &SessionSummary, turn: TurnId) -> Result<Option<TurnSummary>, SessionError> {
        self.log.projected(TurnIndex::NAME, Key { session: session.id, item: Some(turn.ulid()) }).await
    }

    /// A turn's events after its turn sequence number `after` (0: from its start), at most
    /// `limit`. A turn's events lie between its `turn.started` and the next turn's.
    pub async fn turn_events(
        &self,
        session: &SessionSummary,
        turn: &TurnSummary,
        after: u32,
        limit: usize,
    ) -> Result<Vec<RawEvent>, SessionError> {
        let mut from = Some(just_before(turn.first_event));
        let mut out = Vec::new();
        while out.len() < limit {
            let range = ReadRange { after: from, before: None, limit: 512, newest_first: false };
            let events = self.log.read(session.id, range).await?;
            let Some(last) = events.last() else { break };
            from = Some(last.id);
            for event in events {
                match event.turn() {
                    Some((of, n)) if of == turn.id && n > after && out.len() < limit => out.push(event),
                    Some((of, _)) if of != turn.id && event.kind() == "turn.started" => return Ok(out),
                    _ => {}
                }
            }
        }
        Ok(out)
    }

    /// The position from which to read after `cursor` (the start when `None`).
    async fn after(&self, session: &SessionSummary, cursor: Option<Cursor>) -> Result<Position, SessionError> {
        match cursor {
            Some(cursor) => self.position(session, cursor).await,
            None => Ok(Position::default()),
        }
    }

    /// The position of `cursor`, which must name a point in this session's log.
    async fn position(&self, session: &SessionSummary, cursor: Cursor) -> Result<Position, SessionError> {
        let unknown = || SessionError::UnknownCursor(cursor.to_string());
        let at = |event: RawEvent| Position { last: Some(event.id), seq: event.seq };
        match cursor {
            Cursor::Event(id) => self.log.event(session.id, id).await?.map(at).ok_or_else(unknown),
            Cursor::Sequence(0) => Ok(Position::default()),
            Cursor::Sequence(n) => self.log.event_at(session.id, n).await?.map(at).ok_or_else(unknown),
            Cursor::Turn { turn, sequence } => {
                let summary = self.turn_by_id(session, turn).await?.ok_or_else(unknown)?;
                if sequence == 0 {
                    return Ok(Position {
                        last: Some(just_before(summary.first_event)),
                        seq: summary.first_sequence - 1,
                    });
                }
                let events = self.turn_events(session, &summary, sequence - 1, 1).await?;
                events.into_iter().find(|e| e.turn() == Some((turn, sequence))).map(at).ok_or_else(unknown)
            }
        }
    }
}

/// The id just before `event`: reading strictly after it starts at `event`. (Ids are
/// strictly increasing, so every earlier event is at or before it.)
fn just_before(event: EventId) -> EventId {
    EventId(Ulid::from(u128::from(event.ulid()) - 1))
}

fn matches(filter: &ListFilter, summary: &SessionSummary) -> bool {
    filter.agent.as_ref().is_none_or(|agent| &summary.spec.agent.name == agent)
        && filter.created_by.as_ref().is_none_or(|by| &summary.created_by == by)
        && filter.created_before.as_deref().is_none_or(|before| summary.created_at.as_str() < before)
}
