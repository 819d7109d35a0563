//! Key layout of the `events` tree: session ULID ++ event ULID, both big endian, so one
//! session's log is one contiguous range in append order.

use std::ops::Bound;

use ulid::Ulid;

use crate::domain::{EventId, SessionId};

pub type Key = [u8; 32];

pub fn event_key(session: SessionId, event: EventId) -> Key {
    let mut key = [0u8; 32];
    key[..16].copy_from_slice(&u128::from(session.ulid()).to_be_bytes());
    key[16..].copy_from_slice(&u128::from(event.ulid()).to_be_bytes());
    key
}

pub fn session_key(session: SessionId) -> [u8; 16] {
    u128::from(session.ulid()).to_be_bytes()
}

pub fn session_from_key(key: &[u8]) -> Option<SessionId> {
    let bytes: [u8; 16] = key.get(..16)?.try_into().ok()?;
    Some(SessionId(Ulid::from(u128::from_be_bytes(bytes))))
}

pub fn event_from_key(key: &[u8]) -> Option<EventId> {
    let bytes: [u8; 16] = key.get(16..32)?.try_into().ok()?;
    Some(EventId(Ulid::from(u128::from_be_bytes(bytes))))
}

/// The key range of `session`'s events strictly after `after` (or from the start) up to
/// and including `upto`.
pub fn range(session: SessionId, after: Option<EventId>, upto: EventId) -> (Bound<Key>, Bound<Key>) {
    let lower = match after {
        Some(after) => Bound::Excluded(event_key(session, after)),
        None => Bound::Included(event_key(session, EventId(Ulid::nil()))),
    };
    (lower, Bound::Included(event_key(session, upto)))
}
