//! How an append batch is one JetStream message, so that a batch is stored whole or not
//! at all: headers that say where it goes in the session's log (read without the payload
//! when a node indexes a session), and a payload of the events exactly as stored, each
//! with its chain hash.
//!
//! Payload, per event: its id (16 bytes, big-endian ULID), the length of its JSON (4 bytes,
//! big-endian), the JSON, and its chain hash (32 bytes).

use async_nats::HeaderMap;
use bytes::{Buf, BufMut, Bytes, BytesMut};

use crate::domain::{EventId, RawEvent};
use crate::store::chain::Hash;

pub const FIRST_SEQ: &str = "Turnlog-First-Seq";
pub const COUNT: &str = "Turnlog-Count";
pub const FIRST_ID: &str = "Turnlog-First-Id";
pub const LAST_ID: &str = "Turnlog-Last-Id";
/// `open` if the session's turn is open after the message, `closed` if not: what its last
/// turn event did (`turn.started` opens, an idle status or the session deleted closes), or
/// without one what the message before it said. Every node reads it without decoding the
/// events, live and, from the last message of each session, when it starts (see
/// `Log::turns_seen_open`). Absent from messages of binaries before it.
pub const TURN: &str = "Turnlog-Turn";

/// Where a message's events lie in its session's log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    /// The message's sequence number in the stream.
    pub stream_seq: u64,
    pub first_seq: u64,
    pub count: u64,
    pub first_id: EventId,
    pub last_id: EventId,
    /// Whether the session's turn is open after it ([`TURN`]), if the message says.
    pub open: Option<bool>,
}

impl Entry {
    pub fn last_seq(&self) -> u64 {
        self.first_seq + self.count - 1
    }
}

/// The headers and payload of a batch of events with their hashes (at least one), after a
/// message that left the session's turn `open_before` (if it said).
pub fn encode(events: &[(RawEvent, Hash)], open_before: Option<bool>) -> (HeaderMap, Bytes) {
    let (first, last) = (&events[0].0, &events[events.len() - 1].0);
    let mut headers = HeaderMap::new();
    headers.insert(FIRST_SEQ, first.seq.to_string().as_str());
    headers.insert(COUNT, events.len().to_string().as_str());
    headers.insert(FIRST_ID, first.id.ulid().to_string().as_str());
    headers.insert(LAST_ID, last.id.ulid().to_string().as_str());
    if let Some(open) = turn_left_open(events).or(open_before) {
        headers.insert(TURN, if open { "open" } else { "closed" });
    }
    let size = events.iter().map(|(e, _)| 16 + 4 + e.json.len() + 32).sum();
    let mut payload = BytesMut::with_capacity(size);
    for (event, hash) in events {
        payload.put_u128(u128::from(event.id.ulid()));
        payload.put_u32(event.json.len() as u32);
        payload.put_slice(&event.json);
        payload.put_slice(hash);
    }
    (headers, payload.freeze())
}

/// The entry a message's headers describe, if they are turnlog's.
/// Whether events leave their session's turn open or closed; `None` if they say neither.
fn turn_left_open(events: &[(RawEvent, Hash)]) -> Option<bool> {
    events.iter().rev().find_map(|(event, _)| match event.kind() {
        "turn.started" => Some(true),
        "session.status_idle" | "session.deleted" => Some(false),
        _ => None,
    })
}

/// What a message's [`TURN`] header says.
pub fn turn(headers: Option<&HeaderMap>) -> Option<bool> {
    match headers?.get(TURN)?.as_str() {
        "open" => Some(true),
        "closed" => Some(false),
        _ => None,
    }
}

pub fn entry(stream_seq: u64, headers: Option<&HeaderMap>) -> Result<Entry, String> {
    let headers = headers.ok_or("a message without turnlog's headers")?;
    let text = |name: &str| -> Result<&str, String> {
        headers.get(name).map(|value| value.as_str()).ok_or_else(|| format!("a message without the {name} header"))
    };
    let number = |name: &str| text(name)?.parse::<u64>().map_err(|_| format!("a malformed {name} header"));
    let id = |name: &str| -> Result<EventId, String> {
        let ulid = text(name)?.parse::<ulid::Ulid>().map_err(|_| format!("a malformed {name} header"))?;
        Ok(EventId(ulid))
    };
    let count = number(COUNT)?;
    if count == 0 {
        return Err("a message of no events".into());
    }
    Ok(Entry {
        stream_seq,
        first_seq: number(FIRST_SEQ)?,
        count,
        first_id: id(FIRST_ID)?,
        last_id: id(LAST_ID)?,
        open: turn(Some(headers)),
    })
}

/// A message's events and their hashes, in order.
pub fn decode(payload: &Bytes) -> Result<Vec<(RawEvent, Hash)>, String> {
    let mut rest = payload.clone();
    let mut events = Vec::new();
    while rest.has_remaining() {
        if rest.remaining() < 20 {
            return Err("a truncated event in a message".into());
        }
        let id = EventId(ulid::Ulid::from(rest.get_u128()));
        let len = rest.get_u32() as usize;
        if rest.remaining() < len + 32 {
            return Err("a truncated event in a message".into());
        }
        let json = rest.split_to(len);
        let hash: Hash = rest.split_to(32).as_ref().try_into().expect("32 bytes");
        events.push((RawEvent::stored(id, json), hash));
    }
    Ok(events)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{Draft, EventBody, SessionId};
    use crate::store::numbering::{Clock, Tail};

    #[test]
    fn a_batch_decodes_to_the_bytes_it_was_made_of() {
        let session = SessionId::generate();
        let drafts: Vec<Draft> = (0..3)
            .map(|i| {
                Draft::new(None, &EventBody::UserMessage { content: vec![crate::domain::Block::text(i.to_string())] })
            })
            .collect();
        let events = Tail::default().stage(session, 0, &drafts, &Clock::now(), 10).unwrap().unwrap();
        let hashed: Vec<(RawEvent, Hash)> = events.iter().map(|e| (e.clone(), [e.seq as u8; 32])).collect();
        let (headers, payload) = encode(&hashed, None);
        assert_eq!(decode(&payload).unwrap(), hashed);
        let entry = entry(7, Some(&headers)).unwrap();
        assert_eq!((entry.stream_seq, entry.first_seq, entry.count, entry.last_seq()), (7, 1, 3, 3));
        assert_eq!((entry.first_id, entry.last_id), (events[0].id, events[2].id));
        assert!(decode(&payload.slice(..payload.len() - 1)).is_err(), "a truncated payload is refused");
    }

    #[test]
    fn the_turn_header_says_what_the_last_turn_event_of_a_message_did() {
        let turn = |bodies: &[EventBody], before: Option<bool>| {
            let drafts: Vec<Draft> = bodies.iter().map(|body| Draft::new(None, body)).collect();
            let events = Tail::default().stage(SessionId::generate(), 0, &drafts, &Clock::now(), 10).unwrap().unwrap();
            let hashed: Vec<(RawEvent, Hash)> = events.into_iter().map(|e| (e, [0; 32])).collect();
            let headers = encode(&hashed, before).0;
            assert_eq!(entry(1, Some(&headers)).unwrap().open, super::turn(Some(&headers)), "the entry reads it");
            super::turn(Some(&headers))
        };
        let message = EventBody::UserMessage { content: vec![crate::domain::Block::text("hi")] };
        assert_eq!(turn(std::slice::from_ref(&message), None), None);
        assert_eq!(turn(std::slice::from_ref(&message), Some(true)), Some(true), "as the message before");
        assert_eq!(turn(std::slice::from_ref(&message), Some(false)), Some(false), "as the message before");
        assert_eq!(turn(&[message.clone(), EventBody::TurnStarted {}], Some(false)), Some(true));
        assert_eq!(turn(&[EventBody::TurnStarted {}, message], None), Some(true));
        assert_eq!(turn(&[EventBody::TurnStarted {}, EventBody::SessionDeleted {}], Some(true)), Some(false));
        assert_eq!(super::turn(None), None);
    }
}
