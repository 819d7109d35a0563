//! Audit and time travel through the session layer: a session's chain head, its export,
//! imports of exported sessions, and forks.

use std::sync::Arc;

use super::{Caller, SessionError, Sessions};
use crate::domain::event::{AgentSpec, ForkPoint};
use crate::domain::{EventId, RawEvent, SessionId};
use crate::projection::history::History;
use crate::projection::SessionSummary;
use crate::store::audit::{self, Export, Head, ImportError, Imported, Replay};
use crate::store::chain::{Broken, Line};
use crate::store::{Log, Position, ReadRange};

impl Sessions {
    /// The session's chain head: its last event and that event's hash; with `verify`, the
    /// whole chain checked against the events first (the first broken link, if any).
    pub async fn audit(&self, session: &SessionSummary, verify: bool) -> Result<Result<Head, Broken>, SessionError> {
        if verify {
            return Ok(audit::verify(self.log.raw(), session.id).await?);
        }
        let newest = ReadRange { after: None, before: None, limit: 1, newest_first: true };
        let (last, hash) =
            self.chained_at(session.id, newest).await?.ok_or_else(|| SessionError::NotFound(session.id.to_string()))?;
        Ok(Ok(Head { seq: last.seq, last: Some(last.id), hash }))
    }

    /// The first event of `range` and its chain hash, which every event the server wrote has.
    async fn chained_at(
        &self,
        session: SessionId,
        range: ReadRange,
    ) -> Result<Option<(RawEvent, crate::store::chain::Hash)>, SessionError> {
        let Some((event, hash)) = self.log.raw().chained(session, range).await?.into_iter().next() else {
            return Ok(None);
        };
        let hash = hash.ok_or_else(|| {
            let message = format!("event {} of session {session} has no chain hash", event.id);
            SessionError::Storage(crate::store::StoreError::new(message))
        })?;
        Ok(Some((event, hash)))
    }

    /// The session's export, page by page (see [`Export`]).
    pub fn export(&self, session: &SessionSummary) -> Export {
        Export::new(session.id)
    }

    /// The next page of an export: empty at the end.
    pub async fn export_page(&self, export: &mut Export) -> Result<Vec<u8>, SessionError> {
        Ok(export.next(self.log.raw()).await?)
    }

    /// Whether the caller may import: only an admin may, since the sessions keep the
    /// subjects that made them.
    pub fn may_import(caller: &Caller) -> Result<(), SessionError> {
        match caller.admin {
            true => Ok(()),
            false => Err(SessionError::Forbidden("only an admin may import sessions".into())),
        }
    }

    /// Brings exported sessions in, each session's lines in order (see
    /// [`crate::store::chain::group`]); sessions before a refused one stay imported.
    pub async fn import(
        &self,
        caller: &Caller,
        groups: Vec<Vec<Line>>,
    ) -> Result<Vec<(SessionId, Imported)>, SessionError> {
        Sessions::may_import(caller)?;
        let mut done = Vec::new();
        for group in groups {
            let session = group[0].session_id;
            Sessions::at_rest(&group)?;
            let imported = audit::import(self.log.raw(), &group).await.map_err(|error| match error {
                ImportError::Exists(_) => SessionError::Conflict(error.to_string()),
                ImportError::Store(error) => SessionError::Storage(error),
                ImportError::Append(error) => super::log::append_error(session, error),
                ImportError::Broken(_) | ImportError::Invalid(_) => SessionError::Invalid(error.to_string()),
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
        agent: Option<AgentSpec>,
    ) -> Result<SessionSummary, SessionError> {
        let at: EventId =
            at.parse().map_err(|_| SessionError::Invalid(format!("invalid `at`: {at:?} is not an event id")))?;
        // Well formed, but not this session's: as an unknown cursor is.
        let invalid = || SessionError::UnknownCursor(format!("`at` {at}"));
        // The event itself, found as the newest one up to it.
        let past = EventId(ulid::Ulid::from(u128::from(at.ulid()).saturating_add(1)));
        let upto = ReadRange { after: None, before: Some(past), limit: 1, newest_first: true };
        let (point, hash) = self.chained_at(source.id, upto).await?.filter(|(e, _)| e.id == at).ok_or_else(invalid)?;
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
        // The source as stored (not redacted), so that the fork keeps its options.
        let stored = self.log.summary(source.id).await?.ok_or_else(|| SessionError::NotFound(source.id.to_string()))?;
        let mut spec = stored.spec;
        if let Some(agent) = agent {
            spec.agent = agent;
        }
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
    /// A replay of the session's log from event `from` on (from the start, without it).
    pub async fn replay(&self, session: &SessionSummary, from: Option<&str>) -> Result<Replay, SessionError> {
        start_replay(self.log.raw(), session.id, from).await
    }

    /// The next page of a replay: empty at the end.
    pub async fn replay_page(&self, replay: &mut Replay) -> Result<Vec<RawEvent>, SessionError> {
        Ok(replay.next(self.log.raw()).await?)
    }
}

/// A replay of `session` in `log` from event `from` on, which must be one of its events.
pub async fn start_replay(log: &dyn Log, session: SessionId, from: Option<&str>) -> Result<Replay, SessionError> {
    let id = replay_from(from)?;
    Replay::start(log, session, id).await?.ok_or_else(|| unknown_from(id))
}

/// A replay's `from`, if one is given (empty is none): an event id, else 400.
pub(super) fn replay_from(from: Option<&str>) -> Result<Option<EventId>, SessionError> {
    let from = from.filter(|from| !from.is_empty());
    from.map(|from| {
        from.parse().map_err(|_| SessionError::Invalid(format!("invalid `from`: {from:?} is not an event id")))
    })
    .transpose()
}

/// A replay's `from` that is not an event of the session: as an unknown cursor is (409).
pub(super) fn unknown_from(from: Option<EventId>) -> SessionError {
    SessionError::UnknownCursor(format!("`from` {}", from.map(|id| id.to_string()).unwrap_or_default()))
}

/// The pace of a replay: each event is due as long after the first as it was made after
/// it (its `created_at`), divided by the speed. Sleeping until an absolute time, not for
/// each gap, so that a slow reader does not make the replay drift.
/// The longest a replay waits for one event, whatever its speed.
const MAX_WAIT: std::time::Duration = std::time::Duration::from_secs(365 * 24 * 3600);

pub struct Pace {
    speed: f64,
    origin: Option<(tokio::time::Instant, chrono::DateTime<chrono::Utc>)>,
}

impl Pace {
    pub fn new(speed: f64) -> Result<Pace, SessionError> {
        if !(speed > 0.0 && speed.is_finite()) {
            return Err(SessionError::Invalid(format!("invalid `speed`: must be a positive number, not {speed}")));
        }
        Ok(Pace { speed, origin: None })
    }

    /// Waits until the event is due (the first one at once; one without a time, at once).
    pub async fn wait(&mut self, event: &RawEvent) {
        #[derive(serde::Deserialize)]
        struct At {
            created_at: chrono::DateTime<chrono::Utc>,
        }
        let Ok(At { created_at }) = serde_json::from_slice::<At>(&event.json) else { return };
        let (started, origin) = *self.origin.get_or_insert((tokio::time::Instant::now(), created_at));
        let gap = (created_at - origin).to_std().unwrap_or_default().as_secs_f64() / self.speed;
        // However slow the speed asked, no wait is longer than a year (or overflows).
        let offset = std::time::Duration::try_from_secs_f64(gap).unwrap_or(MAX_WAIT).min(MAX_WAIT);
        tokio::time::sleep_until(started.checked_add(offset).unwrap_or(started + MAX_WAIT)).await;
    }
}

impl Sessions {
    /// A session imported with a turn running, or with messages no turn has taken yet, would
    /// have a turn run on it at this server's next start: it is refused until it is at rest.
    pub fn at_rest(lines: &[Line]) -> Result<(), SessionError> {
        use crate::projection::turns::{OpenTurn, OpenTurns};
        use crate::store::{Key, Projection};
        let session = lines[0].session_id;
        let mut open: Option<Vec<u8>> = None;
        for line in lines {
            let Ok(event) = serde_json::from_slice::<crate::domain::Event>(line.stored()) else { continue };
            if let Some(value) = OpenTurns.apply(Key::session(session), open.as_deref(), &event) {
                open = Some(value);
            }
        }
        let open: OpenTurn = open.and_then(|bytes| serde_json::from_slice(&bytes).ok()).unwrap_or_default();
        if open.turn.is_some() || !open.queued.is_empty() {
            return Err(SessionError::Invalid(format!(
                "session {session} has a turn running or messages waiting for one: export it once it is idle"
            )));
        }
        Ok(())
    }
}
