//! Reading a session's log out again, page by page: as export lines with their chain, or
//! as its events from one of them on (what a replay reads).

use super::format::export_line;
use crate::domain::{EventId, RawEvent, SessionId};
use crate::store::chain::{self, Hash};
use crate::store::{AuditLog, Log, ReadRange, StoreError};

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
    pub async fn next(&mut self, log: &dyn AuditLog) -> Result<Vec<u8>, StoreError> {
        let range = ReadRange { after: self.after, before: None, limit: PAGE, newest_first: false };
        let mut out = Vec::new();
        for (event, hash) in log.chained(self.session, range).await? {
            let hash = hash.ok_or_else(|| {
                StoreError::new(format!(
                    "session {}: event {} has no chain hash (see `turnlog verify`)",
                    self.session, event.id
                ))
            })?;
            out.extend(export_line(self.session, event.seq, &self.prev, &hash, &event.json));
            (self.after, self.prev) = (Some(event.id), hash);
        }
        Ok(out)
    }
}

/// One session's log read again page by page, from an event on: for a replay, which holds
/// one page at a time, however long the log.
pub struct Pages {
    session: SessionId,
    after: Option<EventId>,
}

impl Pages {
    /// From event `from` (the start, without it); `None` when the log has no such event.
    pub async fn start(log: &dyn Log, session: SessionId, from: Option<EventId>) -> Result<Option<Pages>, StoreError> {
        let Some(from) = from else { return Ok(Some(Pages { session, after: None })) };
        if log.event(session, from).await?.is_none() {
            return Ok(None);
        }
        let before = ReadRange { after: None, before: Some(from), limit: 1, newest_first: true };
        let after = log.read(session, before).await?.pop().map(|event| event.id);
        Ok(Some(Pages { session, after }))
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
