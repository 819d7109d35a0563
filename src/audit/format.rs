//! The export format: JSON Lines, one event a line with its chain links, the event's bytes
//! exactly as stored; and reading it back, grouped by session.

use serde::Deserialize;
use serde_json::value::RawValue;

use crate::domain::SessionId;
use crate::store::chain::Hash;

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::chain::{link, GENESIS};

    #[test]
    fn an_export_line_round_trips_the_exact_bytes() {
        let s = SessionId::generate();
        let stored = br#"{"id":"evt_x","type":"user.message","content":[{"type":"text","text":"a  b"}]}"#;
        let hash = link(&GENESIS, stored);
        let line = export_line(s, 1, &GENESIS, &hash, stored);
        let parsed = Line::parse(1, std::str::from_utf8(&line).unwrap().trim_end()).unwrap();
        assert_eq!((parsed.session_id, parsed.sequence_number, parsed.prev, parsed.hash), (s, 1, GENESIS, hash));
        assert_eq!(parsed.stored(), stored);
        assert!(Line::parse(7, "{\"session_id\":").unwrap_err().starts_with("line 7: "));
    }
}
