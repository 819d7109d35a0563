//! The per-session hash chain that makes a log tamper-evident, and the export format that
//! carries it. Event `n` of a session (sequence number `n`) has the hash
//!
//! ```text
//! hash(n) = SHA-256(hash(n - 1) || the event's stored bytes)     hash(0) = 32 zero bytes
//! ```
//!
//! over the exact bytes the log stores (the JSON a native page or stream shows, byte for
//! byte, unless the event was queued and is shown with its `processed_at`). The log
//! records each event's hash beside it as it writes the event; an export line carries the
//! event's bytes verbatim with its predecessor's hash and its own.

use serde::Deserialize;
use serde_json::value::RawValue;
use sha2::{Digest, Sha256};

use crate::domain::SessionId;

pub type Hash = [u8; 32];

/// The hash before a session's first event.
pub const GENESIS: Hash = [0; 32];

/// The hash of an event whose predecessor's hash is `prev`.
pub fn link(prev: &Hash, stored: &[u8]) -> Hash {
    let mut hasher = Sha256::new();
    hasher.update(prev);
    hasher.update(stored);
    hasher.finalize().into()
}

/// One line of an export: `{"session_id","sequence_number","prev","hash","event"}`, with
/// the event last and exactly as stored.
pub fn export_line(session: SessionId, seq: u64, prev: &Hash, hash: &Hash, stored: &[u8]) -> Vec<u8> {
    let mut line = Vec::with_capacity(stored.len() + 220);
    line.extend_from_slice(b"{\"session_id\":\"");
    line.extend_from_slice(session.to_string().as_bytes());
    line.extend_from_slice(format!("\",\"sequence_number\":{seq},\"prev\":\"").as_bytes());
    line.extend_from_slice(hex::encode(prev).as_bytes());
    line.extend_from_slice(b"\",\"hash\":\"");
    line.extend_from_slice(hex::encode(hash).as_bytes());
    line.extend_from_slice(b"\",\"event\":");
    line.extend_from_slice(stored);
    line.extend_from_slice(b"}\n");
    line
}

/// An export line, read back: the event's bytes are exactly those of the line.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Line {
    pub session_id: SessionId,
    pub sequence_number: u64,
    #[serde(with = "hex_hash")]
    pub prev: Hash,
    #[serde(with = "hex_hash")]
    pub hash: Hash,
    pub event: Box<RawValue>,
}

impl Line {
    /// Line `number` (from 1) of an export, parsed; the error names the line and the fault.
    pub fn parse(number: usize, text: &str) -> Result<Line, String> {
        serde_json::from_str(text).map_err(|e| format!("line {number}: not an export line: {e}"))
    }

    pub fn stored(&self) -> &[u8] {
        self.event.get().as_bytes()
    }
}

/// Export lines (numbered from 1) grouped by session, in order: each session's lines must
/// come together. The error names the line and the fault.
pub fn group<E: std::fmt::Display>(
    lines: impl IntoIterator<Item = Result<(usize, String), E>>,
) -> Result<Vec<Vec<Line>>, String> {
    let mut groups: Vec<Vec<Line>> = Vec::new();
    for item in lines {
        let (number, text) = item.map_err(|e| e.to_string())?;
        if text.trim().is_empty() {
            continue;
        }
        let line = Line::parse(number, &text)?;
        let same = groups.last().is_some_and(|group| group[0].session_id == line.session_id);
        if same {
            groups.last_mut().expect("a group").push(line);
        } else if groups.iter().any(|g| g[0].session_id == line.session_id) {
            return Err(format!("line {number}: session {}'s lines are not together", line.session_id));
        } else {
            groups.push(vec![line]);
        }
    }
    Ok(groups)
}

mod hex_hash {
    use serde::{Deserialize, Deserializer};

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<super::Hash, D::Error> {
        let text = String::deserialize(deserializer)?;
        let bytes = hex::decode(&text).map_err(serde::de::Error::custom)?;
        bytes.try_into().map_err(|_| serde::de::Error::custom("a hash is 64 hex digits"))
    }
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

    fn session() -> SessionId {
        SessionId::generate()
    }

    #[test]
    fn the_hash_is_sha256_of_the_previous_hash_and_the_bytes() {
        // Recomputable with any SHA-256: sha256(32 zero bytes ++ b"{}").
        let expected = Sha256::digest([&[0u8; 32][..], b"{}"].concat());
        assert_eq!(link(&GENESIS, b"{}").as_slice(), expected.as_slice());
    }

    #[test]
    fn an_export_line_round_trips_the_exact_bytes() {
        let s = session();
        let stored = br#"{"id":"evt_x","type":"user.message","content":[{"type":"text","text":"a  b"}]}"#;
        let hash = link(&GENESIS, stored);
        let line = export_line(s, 1, &GENESIS, &hash, stored);
        let parsed = Line::parse(1, std::str::from_utf8(&line).unwrap().trim_end()).unwrap();
        assert_eq!((parsed.session_id, parsed.sequence_number, parsed.prev, parsed.hash), (s, 1, GENESIS, hash));
        assert_eq!(parsed.stored(), stored);
        assert!(Line::parse(7, "{\"session_id\":").unwrap_err().starts_with("line 7: "));
    }

    #[test]
    fn the_verifier_names_the_first_broken_link() {
        let s = session();
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
