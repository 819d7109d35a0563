//! The correctness checks every scenario runs at the end.
//!
//! The log (read through the list API) must be well formed: sequence numbers 1, 2, 3, ...
//! with no gap, ids strictly increasing. And each client's events, concatenated across all
//! its connections, must be exactly the log's suffix after the client's first cursor:
//! every event once, none skipped, none repeated, in log order.

use std::collections::HashMap;

use crate::client::{event_id, parse_event_id, LogEvent};

/// A session's log as the list API returned it, indexed by id.
#[derive(Debug, Clone, Default)]
pub struct Log {
    pub session: String,
    pub ids: Vec<u128>,
    index: HashMap<u128, usize>,
}

impl Log {
    /// Checks that the log is well formed and indexes it.
    pub fn new(session: &str, events: &[LogEvent]) -> Result<Log, String> {
        let mut ids = Vec::with_capacity(events.len());
        for (i, event) in events.iter().enumerate() {
            let id = parse_event_id(&event.id)
                .ok_or_else(|| format!("log of {session}: event {i} has id {:?}", event.id))?;
            if event.sequence_number != i as u64 + 1 {
                return Err(format!(
                    "log of {session}: event {} has sequence_number {}, expected {} (a gap or a repeat)",
                    event.id,
                    event.sequence_number,
                    i + 1
                ));
            }
            if ids.last().is_some_and(|&last| id <= last) {
                return Err(format!("log of {session}: event {} does not sort after the event before it", event.id));
            }
            ids.push(id);
        }
        Ok(Log::from_ids(session, ids))
    }

    pub fn from_ids(session: &str, ids: Vec<u128>) -> Log {
        let index = ids.iter().enumerate().map(|(i, &id)| (id, i)).collect();
        Log { session: session.to_string(), ids, index }
    }

    pub fn len(&self) -> usize {
        self.ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    pub fn last(&self) -> Option<u128> {
        self.ids.last().copied()
    }

    pub fn position(&self, id: u128) -> Option<usize> {
        self.index.get(&id).copied()
    }

    /// The events strictly after `cursor` (`None`: from the start).
    pub fn suffix(&self, cursor: Option<u128>) -> Result<&[u128], String> {
        match cursor {
            None => Ok(&self.ids),
            Some(id) => match self.position(id) {
                Some(at) => Ok(&self.ids[at + 1..]),
                None => Err(format!("its first cursor {} is not in the log of {}", event_id(id), self.session)),
            },
        }
    }

    /// Whether `received` is exactly the suffix of the log after `first_cursor`.
    pub fn check(&self, who: &str, first_cursor: Option<u128>, received: &[u128]) -> Result<(), String> {
        let expected = self.suffix(first_cursor).map_err(|e| format!("{who}: {e}"))?;
        for (i, (&got, &want)) in received.iter().zip(expected).enumerate() {
            if got != want {
                return Err(format!("{who}: {}", self.explain(i, got, want, received)));
            }
        }
        if received.len() > expected.len() {
            let extra = received[expected.len()];
            return Err(format!(
                "{who}: received {} events but the log has {} after its cursor; the first extra is {} ({})",
                received.len(),
                expected.len(),
                event_id(extra),
                self.describe(extra, &received[..expected.len()])
            ));
        }
        if received.len() < expected.len() {
            return Err(format!(
                "{who}: received {} of the {} events after its cursor; the first missing is {}",
                received.len(),
                expected.len(),
                event_id(expected[received.len()])
            ));
        }
        Ok(())
    }

    fn explain(&self, i: usize, got: u128, want: u128, received: &[u128]) -> String {
        format!(
            "event {i} after its cursor should be {} but was {} ({})",
            event_id(want),
            event_id(got),
            self.describe(got, &received[..i])
        )
    }

    fn describe(&self, got: u128, before: &[u128]) -> String {
        if before.contains(&got) {
            return "a duplicate of an event it had already received".into();
        }
        match (self.position(got), before.last().and_then(|&l| self.position(l))) {
            (None, _) => "an event that is not in the log".into(),
            (Some(at), Some(prev)) if at <= prev => "out of order: an earlier event".into(),
            (Some(at), Some(prev)) => format!("{} events skipped", at - prev - 1),
            (Some(at), None) => format!("{at} events of the log skipped at its start"),
        }
    }
}

/// Collects violations, keeping the first few of each kind readable.
#[derive(Debug, Default)]
pub struct Violations {
    pub list: Vec<String>,
    pub total: usize,
}

impl Violations {
    const SHOWN: usize = 20;

    pub fn push(&mut self, violation: impl Into<String>) {
        self.total += 1;
        if self.list.len() < Self::SHOWN {
            self.list.push(violation.into());
        }
    }

    pub fn check(&mut self, result: Result<(), String>) -> bool {
        match result {
            Ok(()) => true,
            Err(violation) => {
                self.push(violation);
                false
            }
        }
    }

    pub fn into_vec(mut self) -> Vec<String> {
        if self.total > self.list.len() {
            self.list.push(format!("... and {} more violations", self.total - self.list.len()));
        }
        self.list
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log(n: u128) -> Log {
        Log::from_ids("s", (1..=n).collect())
    }

    #[test]
    fn the_exact_suffix_passes() {
        let log = log(5);
        assert!(log.check("c", None, &[1, 2, 3, 4, 5]).is_ok());
        assert!(log.check("c", Some(2), &[3, 4, 5]).is_ok());
        assert!(log.check("c", Some(5), &[]).is_ok());
    }

    #[test]
    fn gaps_duplicates_reorders_and_strangers_fail() {
        let log = log(5);
        let gap = log.check("c", None, &[1, 2, 4, 5]).unwrap_err();
        assert!(gap.contains("1 events skipped"), "{gap}");
        let dup = log.check("c", None, &[1, 2, 2, 3, 4, 5]).unwrap_err();
        assert!(dup.contains("duplicate"), "{dup}");
        let back = log.check("c", Some(2), &[3, 4, 2, 5]).unwrap_err();
        assert!(back.contains("earlier event"), "{back}");
        let stranger = log.check("c", None, &[1, 9]).unwrap_err();
        assert!(stranger.contains("not in the log"), "{stranger}");
        let short = log.check("c", Some(1), &[2, 3]).unwrap_err();
        assert!(short.contains("received 2 of the 4"), "{short}");
        let long = log.check("c", Some(4), &[5, 5]).unwrap_err();
        assert!(long.contains("duplicate"), "{long}");
        let cursor = log.check("c", Some(42), &[]).unwrap_err();
        assert!(cursor.contains("not in the log"), "{cursor}");
    }

    #[test]
    fn malformed_logs_are_refused() {
        let event =
            |id: u128, seq: u64| LogEvent { id: event_id(id), sequence_number: seq, kind: "user.message".into() };
        assert!(Log::new("s", &[event(1, 1), event(2, 2)]).is_ok());
        assert!(Log::new("s", &[event(1, 1), event(2, 3)]).unwrap_err().contains("sequence_number"));
        assert!(Log::new("s", &[event(2, 1), event(1, 2)]).unwrap_err().contains("does not sort"));
    }
}
