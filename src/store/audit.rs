//! What audit tools do with any log: export a session with its chain, verify a session's
//! chain against its events, and bring exported sessions into a log. The command line runs
//! these on a data dir; the server, through the session layer.

use bytes::Bytes;
use serde::Deserialize;

use super::chain::{self, Broken, Hash, Line, Verifier};
use super::{AppendError, Log, ReadRange, StoreError};
use crate::domain::{EventId, RawEvent, SessionId};

/// Events read per step.
const PAGE: usize = 1000;

/// One session's export, page by page.
pub struct Export {
    session: SessionId,
    after: Option<EventId>,
    prev: Hash,
}

impl Export {
    pub fn new(session: SessionId) -> Export {
        Export { session, after: None, prev: chain::GENESIS }
    }

    /// The next page of export lines; empty at the end of the log.
    pub async fn next(&mut self, log: &dyn Log) -> Result<Vec<u8>, StoreError> {
        let range = ReadRange { after: self.after, before: None, limit: PAGE, newest_first: false };
        let mut out = Vec::new();
        for (event, hash) in log.chained(self.session, range).await? {
            let hash = hash.ok_or_else(|| {
                StoreError::new(format!(
                    "session {}: event {} has no chain hash (see `turnlog verify`)",
                    self.session, event.id
                ))
            })?;
            out.extend(chain::export_line(self.session, event.seq, &self.prev, &hash, &event.json));
            (self.after, self.prev) = (Some(event.id), hash);
        }
        Ok(out)
    }
}

/// One session's log read again page by page, from an event on: for a replay, which holds
/// one page at a time, however long the log.
pub struct Replay {
    session: SessionId,
    after: Option<EventId>,
}

impl Replay {
    /// From event `from` (the start, without it); `None` when the log has no such event.
    pub async fn start(log: &dyn Log, session: SessionId, from: Option<EventId>) -> Result<Option<Replay>, StoreError> {
        let Some(from) = from else { return Ok(Some(Replay { session, after: None })) };
        if log.event(session, from).await?.is_none() {
            return Ok(None);
        }
        let before = ReadRange { after: None, before: Some(from), limit: 1, newest_first: true };
        let after = log.read(session, before).await?.pop().map(|event| event.id);
        Ok(Some(Replay { session, after }))
    }

    /// The next page of events; empty at the end of the log.
    pub async fn next(&mut self, log: &dyn Log) -> Result<Vec<RawEvent>, StoreError> {
        let range = ReadRange { after: self.after, before: None, limit: PAGE, newest_first: false };
        let events = log.read(self.session, range).await?;
        if let Some(last) = events.last() {
            self.after = Some(last.id);
        }
        Ok(events)
    }
}

/// A session's chain checked against its events: the head (last sequence number, last id,
/// hash), or the first broken link.
pub async fn verify(log: &dyn Log, session: SessionId) -> Result<Result<Head, Broken>, StoreError> {
    let mut verifier = Verifier::new(session);
    let mut after = None;
    loop {
        let range = ReadRange { after, before: None, limit: PAGE, newest_first: false };
        let events = log.chained(session, range).await?;
        let Some(last) = events.last().map(|(event, _)| event.id) else { break };
        for (event, hash) in &events {
            let Some(hash) = hash else {
                return Ok(Err(Broken {
                    session,
                    seq: event.seq,
                    what: "the chain has no hash for it",
                    expected: "a recorded hash".into(),
                    found: "none".into(),
                }));
            };
            if let Err(broken) = verifier.next(event.seq, &event.json, hash, None) {
                return Ok(Err(broken));
            }
        }
        after = Some(last);
    }
    let (seq, hash) = verifier.head();
    Ok(Ok(Head { seq, last: after, hash }))
}

/// A chain's head: its last sequence number and event, and that event's hash.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Head {
    pub seq: u64,
    pub last: Option<EventId>,
    pub hash: Hash,
}

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
pub async fn import(log: &dyn Log, lines: &[Line]) -> Result<Imported, ImportError> {
    let events = events_of(lines)?;
    adopt(log, lines[0].session_id, events).await
}

/// Stores `events` (checked by [`events_of`]) as `session`'s log in `log`, or finds them
/// there already.
pub async fn adopt(log: &dyn Log, session: SessionId, events: Vec<RawEvent>) -> Result<Imported, ImportError> {
    let count = events.len();
    log.prepare(session).await?;
    match log.adopt(session, events.clone())?.durable().await? {
        Ok(_) => Ok(Imported::New { events: count }),
        Err(_) => match compare(log, session, &events).await? {
            Some(imported) => Ok(imported),
            // Emptied meanwhile: not something a log does; say it as it is.
            None => Err(ImportError::Invalid(format!("session {session} changed while it was imported"))),
        },
    }
}
