//! Key layout. The `events` tree: session ULID ++ event ULID, both big endian, so one
//! session's log is one contiguous range in append order. Projection trees: the session
//! ULID, then the item's ULID for per-item projections, so a session's items are one range
//! in id order.

use std::ops::Bound;

use ulid::Ulid;

use crate::domain::{EventId, SessionId};
use crate::store::Key;

pub type EventKey = [u8; 32];

pub fn event_key(session: SessionId, event: EventId) -> EventKey {
    let mut key = [0u8; 32];
    key[..16].copy_from_slice(&u128::from(session.ulid()).to_be_bytes());
    key[16..].copy_from_slice(&u128::from(event.ulid()).to_be_bytes());
    key
}

pub fn session_key(session: SessionId) -> [u8; 16] {
    u128::from(session.ulid()).to_be_bytes()
}

fn ulid_at(key: &[u8], at: usize) -> Option<Ulid> {
    let bytes: [u8; 16] = key.get(at..at + 16)?.try_into().ok()?;
    Some(Ulid::from(u128::from_be_bytes(bytes)))
}

pub fn session_from_key(key: &[u8]) -> Option<SessionId> {
    ulid_at(key, 0).map(SessionId)
}

pub fn event_from_key(key: &[u8]) -> Option<EventId> {
    ulid_at(key, 16).map(EventId)
}

pub fn projection_key(key: Key) -> Vec<u8> {
    let mut bytes = session_key(key.session).to_vec();
    if let Some(item) = key.item {
        bytes.extend_from_slice(&u128::from(item).to_be_bytes());
    }
    bytes
}

pub fn key_from_bytes(bytes: &[u8]) -> Option<Key> {
    let session = session_from_key(bytes)?;
    let item = if bytes.len() == 32 { Some(ulid_at(bytes, 16)?) } else { None };
    Some(Key { session, item })
}

/// The key range of `session`'s events strictly after `after` (or from the start) up to
/// and including `upto`.
pub fn range(session: SessionId, after: Option<EventId>, upto: EventId) -> (Bound<EventKey>, Bound<EventKey>) {
    let lower = match after {
        Some(after) => Bound::Excluded(event_key(session, after)),
        None => Bound::Included(event_key(session, EventId(Ulid::nil()))),
    };
    (lower, Bound::Included(event_key(session, upto)))
}
