//! Bringing exported sessions into a log: each session's lines are checked (the chain
//! verifies, each event is the one its line says, the session is at rest), then stored
//! byte for byte, or found there already.

use bytes::Bytes;
use serde::Deserialize;

use super::format::Line;
use super::verify::{Broken, Verifier};
use crate::domain::{EventId, RawEvent, SessionId};
use crate::error::SessionError;
use crate::projection::turns::{OpenTurn, OpenTurns};
use crate::store::{AppendError, Key, Log, Projection, ReadRange, Store, StoreError};

/// What became of one session of an import.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Imported {
    /// Its log was stored.
    New { events: usize },
    /// The log already held exactly these events.
    Unchanged { events: usize },
}

#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error("the chain is broken at {0}")]
    Broken(Broken),
    #[error("{0}")]
    Invalid(String),
    #[error("session {0} already exists with different content")]
    Exists(SessionId),
    #[error(transparent)]
    Append(#[from] AppendError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The envelope fields an import checks against its line.
#[derive(Deserialize)]
struct Envelope {
    id: EventId,
    session_id: SessionId,
    sequence_number: u64,
}

/// The id of the event on an export line, if it is an event of the session and sequence
/// number the line says.
pub fn check_line(line: &Line) -> Result<EventId, String> {
    let at = format!("session {}, sequence number {}", line.session_id, line.sequence_number);
    let envelope: Envelope = serde_json::from_slice(line.stored()).map_err(|e| format!("{at}: not an event: {e}"))?;
    if (envelope.session_id, envelope.sequence_number) != (line.session_id, line.sequence_number) {
        return Err(format!(
            "{at}: the event says session {} and sequence number {}",
            envelope.session_id, envelope.sequence_number
        ));
    }
    Ok(envelope.id)
}

/// One session's export lines (all of them, in order) as the events to import: refused
/// unless the chain verifies and each event is the one its line says.
pub fn events_of(lines: &[Line]) -> Result<Vec<RawEvent>, ImportError> {
    let Some(first) = lines.first() else { return Err(ImportError::Invalid("no lines to import".into())) };
    let mut verifier = Verifier::new(first.session_id);
    let mut events = Vec::with_capacity(lines.len());
    for line in lines {
        let id = check_line(line).map_err(ImportError::Invalid)?;
        verifier
            .next(line.sequence_number, line.stored(), &line.hash, Some(&line.prev))
            .map_err(ImportError::Broken)?;
        events.push(RawEvent::stored(id, Bytes::copy_from_slice(line.stored())));
    }
    Ok(events)
}

/// What importing `events` into `log` would do, as it holds the session now: `None` if it
/// has no events of it, `Unchanged` if exactly these, and `Exists` if others.
pub async fn compare(log: &dyn Log, session: SessionId, events: &[RawEvent]) -> Result<Option<Imported>, ImportError> {
    let count = events.len();
    let range = ReadRange { after: None, before: None, limit: count + 1, newest_first: false };
    let held = log.read(session, range).await?;
    if held.is_empty() {
        return Ok(None);
    }
    let same = held.len() == count && held.iter().zip(events).all(|(a, b)| a.json == b.json);
    if same {
        Ok(Some(Imported::Unchanged { events: count }))
    } else {
        Err(ImportError::Exists(session))
    }
}

/// Brings one session's export lines (all of them, in order) into `log`: refused unless the
/// chain verifies and each event is the one its line says; a session the log already holds
/// is left alone when its events are the same, and refused when they differ.
pub async fn import(store: &Store, lines: &[Line]) -> Result<Imported, ImportError> {
    let events = events_of(lines)?;
    adopt(store, lines[0].session_id, events).await
}

/// Stores `events` (checked by [`events_of`]) as `session`'s log in `log`, or finds them
/// there already.
pub async fn adopt(store: &Store, session: SessionId, events: Vec<RawEvent>) -> Result<Imported, ImportError> {
    let count = events.len();
    match store.audit.adopt(session, events.clone()).await? {
        Ok(_) => Ok(Imported::New { events: count }),
        Err(_) => match compare(store.log.as_ref(), session, &events).await? {
            Some(imported) => Ok(imported),
            // Emptied meanwhile: not something a log does; say it as it is.
            None => Err(ImportError::Invalid(format!("session {session} changed while it was imported"))),
        },
    }
}

/// A session imported with a turn running, or with messages no turn has taken yet, would
/// have a turn run on it at this server's next start: it is refused until it is at rest.
pub fn at_rest(lines: &[Line]) -> Result<(), SessionError> {
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
