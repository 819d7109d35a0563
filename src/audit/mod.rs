//! Audit and time travel: what every log's hash chain allows. A session's chain head (and
//! its verification), its export, imports of exported sessions, forks from any event, and
//! replays, read page by page or re-emitted into a new session at their original pace.
//! The server's faces are `api::audit` (HTTP) and `cli::audit` (the command line, on a
//! data dir or a server); the log computes the chain itself ([`crate::store::chain`]).
//!
//! - [`format`](mod@format): the export's JSON Lines; [`verify`]: a chain checked link by link;
//! - [`export`]: a log read out again; [`import`]: exported sessions brought in;
//! - `fork` and [`replay`]: new sessions from a past one.

pub mod export;
mod fork;
pub mod format;
pub mod import;
pub mod replay;
pub mod verify;

use self::export::{Export, Pages};
use self::format::Line;
use self::import::{ImportError, Imported};
use self::verify::{Broken, Head};
use crate::domain::{Caller, EventId, RawEvent, SessionId};
use crate::engine::Engine;
use crate::error::SessionError;
use crate::projection::SessionSummary;
use crate::session::Sessions;
use crate::store::chain::Hash;
use crate::store::{Log, ReadRange, Store, StoreError};

pub use replay::Pace;

/// The audit side of the service: sessions through the front door, the log for their
/// chains, and the engine for what a replay re-emits.
#[derive(Clone)]
pub struct Audit {
    sessions: Sessions,
    store: Store,
    engine: Engine,
}

impl Audit {
    pub fn new(sessions: Sessions, store: Store, engine: Engine) -> Audit {
        Audit { sessions, store, engine }
    }

    /// The session's chain head: its last event and that event's hash; with `verify`, the
    /// whole chain checked against the events first (the first broken link, if any).
    pub async fn head(&self, session: &SessionSummary, verify: bool) -> Result<Result<Head, Broken>, SessionError> {
        if verify {
            return Ok(verify::verify(self.store.audit.as_ref(), session.id).await?);
        }
        let newest = ReadRange { after: None, before: None, limit: 1, newest_first: true };
        let (last, hash) =
            self.chained_at(session.id, newest).await?.ok_or_else(|| SessionError::NotFound(session.id.to_string()))?;
        Ok(Ok(Head { seq: last.seq, last: Some(last.id), hash }))
    }

    /// The first event of `range` and its chain hash, which every event the server wrote has.
    async fn chained_at(&self, session: SessionId, range: ReadRange) -> Result<Option<(RawEvent, Hash)>, SessionError> {
        let Some((event, hash)) = self.store.audit.chained(session, range).await?.into_iter().next() else {
            return Ok(None);
        };
        let hash = hash.ok_or_else(|| {
            let message = format!("event {} of session {session} has no chain hash", event.id);
            SessionError::Storage(StoreError::new(message))
        })?;
        Ok(Some((event, hash)))
    }

    /// The session's export, page by page (see [`Export`]).
    pub fn export(&self, session: &SessionSummary) -> Export {
        Export::new(session.id)
    }

    /// The next page of an export: empty at the end.
    pub async fn export_page(&self, export: &mut Export) -> Result<Vec<u8>, SessionError> {
        Ok(export.next(self.store.audit.as_ref()).await?)
    }

    /// Whether the caller may import: only an admin may, since the sessions keep the
    /// subjects that made them.
    pub fn may_import(caller: &Caller) -> Result<(), SessionError> {
        match caller.admin {
            true => Ok(()),
            false => Err(SessionError::Forbidden("only an admin may import sessions".into())),
        }
    }

    /// Brings exported sessions in, each session's lines in order (see [`format::group`]);
    /// sessions before a refused one stay imported.
    pub async fn import(
        &self,
        caller: &Caller,
        groups: Vec<Vec<Line>>,
    ) -> Result<Vec<(SessionId, Imported)>, SessionError> {
        Audit::may_import(caller)?;
        let mut done = Vec::new();
        for group in groups {
            let session = group[0].session_id;
            import::at_rest(&group)?;
            let imported = import::import(&self.store, &group).await.map_err(|error| match error {
                ImportError::Exists(_) => SessionError::Conflict(error.to_string()),
                ImportError::Store(error) => SessionError::Storage(error),
                ImportError::Append(error) => SessionError::from_append(session, error),
                ImportError::Broken(_) | ImportError::Invalid(_) => SessionError::Invalid(error.to_string()),
            })?;
            done.push((session, imported));
        }
        Ok(done)
    }

    /// The session's log from event `from` on (from the start, without it), page by page.
    pub async fn pages(&self, session: &SessionSummary, from: Option<&str>) -> Result<Pages, SessionError> {
        pages(self.store.log.as_ref(), session.id, from).await
    }

    /// The next page: empty at the end.
    pub async fn next_page(&self, pages: &mut Pages) -> Result<Vec<RawEvent>, SessionError> {
        Ok(pages.next(self.store.log.as_ref()).await?)
    }
}

/// `session`'s log in `log` from event `from` on, which must be one of its events.
pub async fn pages(log: &dyn Log, session: SessionId, from: Option<&str>) -> Result<Pages, SessionError> {
    let id = event_from(from)?;
    Pages::start(log, session, id).await?.ok_or_else(|| unknown_from(id))
}

/// A `from` as a client sent it, if one is given (empty is none): an event id, else 400.
fn event_from(from: Option<&str>) -> Result<Option<EventId>, SessionError> {
    let from = from.filter(|from| !from.is_empty());
    from.map(|from| {
        from.parse().map_err(|_| SessionError::Invalid(format!("invalid `from`: {from:?} is not an event id")))
    })
    .transpose()
}

/// A `from` that is not an event of the session: as an unknown cursor is (409).
fn unknown_from(from: Option<EventId>) -> SessionError {
    SessionError::UnknownCursor(format!("`from` {}", from.map(|id| id.to_string()).unwrap_or_default()))
}
