//! Audit and time travel through the session layer: a session's chain head, its export,
//! imports of exported sessions, and forks.

use std::sync::Arc;

use super::{Caller, SessionError, Sessions};
use crate::domain::event::ForkPoint;
use crate::domain::{EventId, SessionId};
use crate::projection::history::History;
use crate::projection::SessionSummary;
use crate::store::audit::{self, Export, Head, ImportError, Imported};
use crate::store::chain::{Broken, Line};
use crate::store::{Position, ReadRange};

impl Sessions {
    /// The session's chain head: its last event and that event's hash; with `verify`, the
    /// whole chain checked against the events first (the first broken link, if any).
    pub async fn audit(&self, session: &SessionSummary, verify: bool) -> Result<Result<Head, Broken>, SessionError> {
        if verify {
            return Ok(audit::verify(self.log.raw(), session.id).await?);
        }
        let newest = ReadRange { after: None, before: None, limit: 1, newest_first: true };
        let (last, hash) = self
            .log
            .raw()
            .hashes(session.id, newest)
            .await?
            .pop()
            .ok_or_else(|| SessionError::NotFound(session.id.to_string()))?;
        let event = self.log.event(session.id, last).await?.ok_or_else(|| SessionError::NotFound(last.to_string()))?;
        Ok(Ok(Head { seq: event.seq, last: Some(last), hash }))
    }

    /// The session's export, page by page (see [`Export`]).
    pub fn export(&self, session: &SessionSummary) -> Export {
        Export::new(session.id)
    }

    /// The next page of an export: empty at the end.
    pub async fn export_page(&self, export: &mut Export) -> Result<Vec<u8>, SessionError> {
        Ok(export.next(self.log.raw()).await?)
    }

    /// Brings exported sessions in, as their lines (grouped by session, in order) say: only
    /// an admin may, since the sessions keep the subjects that made them.
    pub async fn import(&self, caller: &Caller, lines: Vec<Line>) -> Result<Vec<(SessionId, Imported)>, SessionError> {
        if !caller.admin {
            return Err(SessionError::Forbidden("only an admin may import sessions".into()));
        }
        let mut done = Vec::new();
        for group in group_by_session(lines)? {
            let session = group[0].session_id;
            let imported = audit::import(self.log.raw(), &group).await.map_err(|error| match error {
                ImportError::Exists(_) => SessionError::Conflict(error.to_string()),
                ImportError::Store(error) => SessionError::Storage(error),
                other => SessionError::Invalid(other.to_string()),
            })?;
            done.push((session, imported));
        }
        Ok(done)
    }

    /// A new session whose history is `source`'s up to the event `at` (recorded as its seed,
    /// with where it was forked from): the next turn goes on from there, with any agent.
    pub async fn fork(
        &self,
        caller: &Caller,
        source: &SessionSummary,
        at: &str,
    ) -> Result<SessionSummary, SessionError> {
        let invalid = || SessionError::Invalid(format!("invalid `at`: {at:?} is not an event of this session"));
        let at: EventId = at.parse().map_err(|_| invalid())?;
        let point = self.log.event(source.id, at).await?.ok_or_else(invalid)?;
        let mut history = History::default();
        self.log
            .fold(source.id, Position::default(), |raw| {
                if raw.seq <= point.seq {
                    if let Ok(event) = raw.decode() {
                        history.apply(&event);
                    }
                }
            })
            .await?;
        let upto = ReadRange { after: None, before: None, limit: 1, newest_first: true };
        let past = EventId(ulid::Ulid::from(u128::from(at.ulid()).saturating_add(1)));
        let (_, hash) = self
            .log
            .raw()
            .hashes(source.id, ReadRange { before: Some(past), ..upto })
            .await?
            .pop()
            .ok_or_else(invalid)?;
        // The source as stored (not redacted), so that the fork keeps its options.
        let stored = self.log.summary(source.id).await?.ok_or_else(|| SessionError::NotFound(source.id.to_string()))?;
        let mut spec = stored.spec;
        spec.messages = history.messages.into_iter().map(Arc::unwrap_or_clone).collect();
        spec.forked_from = Some(ForkPoint {
            session_id: source.id,
            event_id: at,
            sequence_number: point.seq,
            hash: hex::encode(hash),
        });
        self.create(caller, spec).await
    }
}

impl Sessions {
    /// The session's events from event `from` on (all, without it), for a replay.
    pub async fn replay(
        &self,
        session: &SessionSummary,
        from: Option<&str>,
    ) -> Result<Vec<crate::domain::RawEvent>, SessionError> {
        let mut events = Vec::new();
        self.log.fold(session.id, Position::default(), |raw| events.push(raw.clone())).await?;
        if let Some(from) = from {
            let invalid = || SessionError::Invalid(format!("invalid `from`: {from:?} is not an event of this session"));
            let id: EventId = from.parse().map_err(|_| invalid())?;
            let start = events.iter().position(|e| e.id == id).ok_or_else(invalid)?;
            events.drain(..start);
        }
        Ok(events)
    }
}

/// Lines grouped by session; a session's lines must come together.
fn group_by_session(lines: Vec<Line>) -> Result<Vec<Vec<Line>>, SessionError> {
    let mut groups: Vec<Vec<Line>> = Vec::new();
    for line in lines {
        match groups.last_mut() {
            Some(group) if group[0].session_id == line.session_id => group.push(line),
            _ => {
                if groups.iter().any(|g| g[0].session_id == line.session_id) {
                    return Err(SessionError::Invalid(format!(
                        "session {}'s lines are not together in the file",
                        line.session_id
                    )));
                }
                groups.push(vec![line]);
            }
        }
    }
    Ok(groups)
}
