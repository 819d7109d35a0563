//! The read side: a session's history, pages of its events, its turns and their events,
//! and followers, each from a cursor of any dialect.

use std::sync::Arc;

use ulid::Ulid;

use super::{Cursor, Follower, SessionError, Sessions};
use crate::domain::{EventId, Message, RawEvent, TurnId, Usage};
use crate::projection::history::History;
use crate::projection::turns::{OpenTurn, OpenTurns, Processed, ProcessedInput};
use crate::projection::{Page, SessionSummary, TimeBounds, TurnIndex, TurnSummary};
use crate::store::{Key, Position, ReadRange, Scan};

/// A page of a session's events: after and before cursors (exclusive), in either order,
/// of the given types only (all when empty).
#[derive(Debug, Clone, Default)]
pub struct EventQuery {
    pub after: Option<Cursor>,
    pub before: Option<Cursor>,
    pub limit: usize,
    pub newest_first: bool,
    pub kinds: Vec<String>,
    /// Bounds on the events' times.
    pub created: TimeBounds,
}

pub struct EventPage {
    pub events: Vec<RawEvent>,
    pub has_more: bool,
}

/// What a session is doing, from the log.
#[derive(Debug, Clone, Default)]
pub struct Activity {
    /// A turn runs (started, not yet stopped).
    pub running: bool,
    /// The usage of all its turns.
    pub usage: Usage,
    /// The latest evaluation of each outcome evaluated.
    pub outcomes: Vec<crate::projection::turns::Evaluated>,
}

/// A page of a session's turns, newest first, strictly before `before`.
#[derive(Debug, Clone, Copy, Default)]
pub struct TurnQuery {
    pub before: Option<TurnId>,
    pub limit: usize,
}

impl Sessions {
    /// The session's history, folded from its whole log: every message (`full`), or as the
    /// model reads it, compactions applied.
    pub async fn history(&self, session: &SessionSummary, full: bool) -> Result<Vec<Message>, SessionError> {
        let mut history = if full { History::default() } else { History::compacted() };
        self.log
            .fold(session.id, Position::default(), |raw| {
                if let Ok(event) = raw.decode() {
                    history.apply(&event);
                }
            })
            .await?;
        Ok(history.messages.into_iter().map(Arc::unwrap_or_clone).collect())
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
        let wanted = |e: &RawEvent| {
            (query.kinds.is_empty() || query.kinds.iter().any(|k| k == e.kind()))
                && (query.created.is_empty() || e.created_at().is_some_and(|t| query.created.contains(t)))
        };
        let filtered = !(query.kinds.is_empty() && query.created.is_empty());
        let mut found: Vec<RawEvent> = Vec::new();
        loop {
            // Unfiltered, one read of one more than asked answers the page and `has_more`.
            let chunk = if filtered { (query.limit + 1).max(256) } else { query.limit + 1 };
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
        for event in found.iter_mut().filter(|e| e.is_queued()) {
            *event = self.as_processed(session, event).await?;
        }
        Ok(EventPage { events: found, has_more })
    }

    /// A queued message as it reads once a turn has taken it (`processed_at` set), or as
    /// it is while it still waits.
    async fn as_processed(&self, session: &SessionSummary, event: &RawEvent) -> Result<RawEvent, SessionError> {
        let key = Key { session: session.id, item: Some(event.id.ulid()) };
        let processed: Option<Processed> = self.log.projected(ProcessedInput::NAME, key).await?;
        Ok(processed.map_or_else(|| event.clone(), |p| event.processed(&p.at)))
    }

    /// What the session is doing: whether a turn runs, and the usage of all its turns.
    pub async fn activity(&self, session: &SessionSummary) -> Result<Activity, SessionError> {
        let open: Option<OpenTurn> = self.log.projected(OpenTurns::NAME, Key::session(session.id)).await?;
        let open = open.unwrap_or_default();
        Ok(Activity { running: open.turn.is_some(), usage: open.usage, outcomes: open.outcomes })
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

    /// The session's events with these ids, in the order given (ids not in its log are
    /// left out): the queued messages a `turn.input` names, say.
    pub async fn events_by_id(&self, session: &SessionSummary, ids: &[EventId]) -> Result<Vec<RawEvent>, SessionError> {
        let mut found = Vec::with_capacity(ids.len());
        for id in ids {
            if let Some(event) = self.log.event(session.id, *id).await? {
                found.push(self.as_processed(session, &event).await?);
            }
        }
        Ok(found)
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
            Cursor::Message(message) => self.message(session, message).await?.map(at).ok_or_else(unknown),
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

impl Sessions {
    /// The final event of agent message (or thinking) `msg_<message>`, found from the end of
    /// the log back: a client resumes after a message it saw lately, so the search is short
    /// where it matters, and the write path keeps no index for it.
    async fn message(&self, session: &SessionSummary, message: Ulid) -> Result<Option<RawEvent>, SessionError> {
        let field = format!(",\"message_id\":\"msg_{message}\"");
        let mut before = None;
        loop {
            let range = ReadRange { after: None, before, limit: 512, newest_first: true };
            let events = self.log.read(session.id, range).await?;
            let Some(last) = events.last() else { return Ok(None) };
            before = Some(last.id);
            let final_event = |e: &&RawEvent| matches!(e.kind(), "agent.message" | "agent.thinking");
            let named = |e: &&RawEvent| memchr::memmem::find(&e.json, field.as_bytes()).is_some();
            if let Some(found) = events.iter().filter(final_event).find(named) {
                return Ok(Some(found.clone()));
            }
        }
    }
}

/// The id just before `event`: reading strictly after it starts at `event`. (Ids are
/// strictly increasing, so every earlier event is at or before it.)
fn just_before(event: EventId) -> EventId {
    EventId(Ulid::from(u128::from(event.ulid()) - 1))
}
