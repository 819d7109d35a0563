//! Verifying a session's hash chain against its events, link by link: the chain's head, or
//! the first broken link, named.

use crate::domain::{EventId, SessionId};
use crate::store::chain::{link, Hash, GENESIS};
use crate::store::{AuditLog, ReadRange, StoreError};

/// Events read per step.
const PAGE: usize = 1000;

/// A session's chain checked against its events: the head (last sequence number, last id,
/// hash), or the first broken link.
pub async fn verify(log: &dyn AuditLog, session: SessionId) -> Result<Result<Head, Broken>, StoreError> {
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

/// The first broken link of a chain: where, and what was expected and found there.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("session {session}, sequence number {seq}: {what} (expected {expected}, found {found})")]
pub struct Broken {
    pub session: SessionId,
    pub seq: u64,
    pub what: &'static str,
    pub expected: String,
    pub found: String,
}

/// Checks one session's chain, event by event in log order.
#[derive(Debug, Clone)]
pub struct Verifier {
    session: SessionId,
    seq: u64,
    head: Hash,
}

impl Verifier {
    pub fn new(session: SessionId) -> Verifier {
        Verifier { session, seq: 0, head: GENESIS }
    }

    /// The chain head so far: the last sequence number and its hash.
    pub fn head(&self) -> (u64, Hash) {
        (self.seq, self.head)
    }

    /// The next event: its sequence number, its bytes, and the hash the record gives it
    /// (and its predecessor's, for an export line). The first error is the first broken link.
    pub fn next(&mut self, seq: u64, stored: &[u8], recorded: &Hash, prev: Option<&Hash>) -> Result<(), Broken> {
        let broken =
            |what, expected: String, found: String| Broken { session: self.session, seq, what, expected, found };
        if seq != self.seq + 1 {
            let what = if seq > self.seq + 1 { "events are missing before it" } else { "out of order" };
            return Err(broken(what, format!("sequence number {}", self.seq + 1), format!("{seq}")));
        }
        if let Some(prev) = prev.filter(|prev| **prev != self.head) {
            return Err(broken("its link to the event before is wrong", hex::encode(self.head), hex::encode(prev)));
        }
        let found = link(&self.head, stored);
        if found != *recorded {
            return Err(broken(
                "its bytes are not those the chain recorded",
                hex::encode(recorded),
                hex::encode(found),
            ));
        }
        self.seq = seq;
        self.head = found;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_verifier_names_the_first_broken_link() {
        let s = SessionId::generate();
        let events: Vec<&[u8]> = vec![b"{\"a\":1}", b"{\"a\":2}", b"{\"a\":3}"];
        let mut hashes = vec![];
        let mut head = GENESIS;
        for event in &events {
            head = link(&head, event);
            hashes.push(head);
        }
        let mut ok = Verifier::new(s);
        for (i, event) in events.iter().enumerate() {
            ok.next(i as u64 + 1, event, &hashes[i], None).unwrap();
        }
        assert_eq!(ok.head(), (3, hashes[2]));

        let mut flipped = Verifier::new(s);
        flipped.next(1, events[0], &hashes[0], None).unwrap();
        let broken = flipped.next(2, b"{\"a\":9}", &hashes[1], None).unwrap_err();
        assert_eq!((broken.seq, broken.expected), (2, hex::encode(hashes[1])));

        let mut gap = Verifier::new(s);
        gap.next(1, events[0], &hashes[0], None).unwrap();
        let broken = gap.next(3, events[2], &hashes[2], None).unwrap_err();
        assert_eq!((broken.seq, broken.what), (3, "events are missing before it"));

        let mut relinked = Verifier::new(s);
        let broken = relinked.next(1, events[0], &hashes[0], Some(&hashes[1])).unwrap_err();
        assert_eq!(broken.what, "its link to the event before is wrong");
    }
}
