//! Prefixed ULID identifiers (`sess_`, `evt_`, `turn_`, ...) and the monotonic rule that
//! keeps a session's event ids strictly increasing, even when the wall clock steps back.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use ulid::Ulid;

macro_rules! prefixed_id {
    ($name:ident, $prefix:literal) => {
        #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name(pub Ulid);

        const _: () = assert!($prefix.len() <= IdText::MAX_PREFIX, "an id prefix longer than IdText holds");

        impl $name {
            pub const PREFIX: &'static str = $prefix;

            pub fn ulid(self) -> Ulid {
                self.0
            }

            /// The id as text, on the stack.
            pub fn text(self) -> IdText {
                IdText::new($prefix, self.0)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.text().as_str())
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(self, f)
            }
        }

        impl FromStr for $name {
            type Err = IdError;

            fn from_str(s: &str) -> Result<Self, IdError> {
                let raw = s.strip_prefix($prefix).ok_or(IdError::Prefix($prefix))?;
                Ulid::from_string(raw).map($name).map_err(|_| IdError::Ulid($prefix))
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.text().as_str())
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
                s.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}

/// A prefixed id as text, on the stack: what the native stream writes for every event it
/// sends, and what `Display` and `Serialize` write.
pub struct IdText {
    buf: [u8; IdText::CAPACITY],
    len: usize,
}

impl IdText {
    /// The longest prefix an id type may have (checked where each is declared).
    const MAX_PREFIX: usize = 8;
    const CAPACITY: usize = IdText::MAX_PREFIX + ulid::ULID_LEN;

    fn new(prefix: &str, ulid: Ulid) -> IdText {
        let mut buf = [0; IdText::CAPACITY];
        let (head, tail) = buf.split_at_mut(prefix.len());
        head.copy_from_slice(prefix.as_bytes());
        let encoded: &mut [u8; ulid::ULID_LEN] = (&mut tail[..ulid::ULID_LEN]).try_into().expect("room for a ULID");
        ulid.array_to_str(encoded);
        IdText { buf, len: prefix.len() + ulid::ULID_LEN }
    }

    pub fn as_str(&self) -> &str {
        std::str::from_utf8(&self.buf[..self.len]).expect("a prefix and a ULID are ASCII")
    }
}

prefixed_id!(SessionId, "sess_");
prefixed_id!(EventId, "evt_");
prefixed_id!(TurnId, "turn_");

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    #[error("expected an id starting with `{0}`")]
    Prefix(&'static str),
    #[error("the part after `{0}` is not a valid ULID")]
    Ulid(&'static str),
}

/// The next id after `last`: `max(now, last's time)`, and inside one millisecond the
/// previous id plus one, so ids sort in append order whatever the clock does.
pub fn next_ulid(last: Option<Ulid>, now_ms: u64) -> Ulid {
    match last {
        Some(last) if last.timestamp_ms() >= now_ms => {
            last.increment().unwrap_or_else(|| Ulid::from_parts(last.timestamp_ms() + 1, 0))
        }
        _ => Ulid::from_parts(now_ms, rand::random::<u128>() >> 48),
    }
}

pub fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// A process-wide monotonic generator for ids that are not per-session (sessions, turns,
/// spans, tool calls), so that listing sessions by id is listing them by creation.
pub struct Generator(parking_lot::Mutex<Option<Ulid>>);

impl Generator {
    pub const fn new() -> Self {
        Generator(parking_lot::Mutex::new(None))
    }

    pub fn next(&self) -> Ulid {
        let mut last = self.0.lock();
        let id = next_ulid(*last, now_ms());
        *last = Some(id);
        id
    }
}

impl Default for Generator {
    fn default() -> Self {
        Self::new()
    }
}

pub static IDS: Generator = Generator::new();

impl SessionId {
    pub fn generate() -> Self {
        SessionId(IDS.next())
    }
}

impl TurnId {
    pub fn generate() -> Self {
        TurnId(IDS.next())
    }
}

/// A short random id with a prefix, for things that only need to be unique (`call_`, `msg_`).
pub fn prefixed(prefix: &str) -> String {
    format!("{prefix}{}", IDS.next())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_through_text() {
        let id = SessionId::generate();
        let text = id.to_string();
        assert!(text.starts_with("sess_"));
        assert_eq!(text.parse::<SessionId>().unwrap(), id);
        assert_eq!("evt_x".parse::<SessionId>(), Err(IdError::Prefix("sess_")));
        assert_eq!("sess_x".parse::<SessionId>(), Err(IdError::Ulid("sess_")));
    }

    #[test]
    fn ids_as_text_are_the_prefix_and_the_ulid_in_every_form() {
        let ulid = Ulid::from_parts(1_700_000_000_000, u128::MAX);
        let texts = [
            (
                EventId(ulid).text().as_str().to_owned(),
                EventId(ulid).to_string(),
                serde_json::to_string(&EventId(ulid)),
            ),
            (TurnId(ulid).text().as_str().to_owned(), TurnId(ulid).to_string(), serde_json::to_string(&TurnId(ulid))),
        ];
        for (prefix, (text, display, json)) in ["evt_", "turn_"].into_iter().zip(texts) {
            assert_eq!(text, format!("{prefix}{ulid}"));
            assert_eq!(display, text);
            assert_eq!(json.unwrap(), format!("\"{text}\""));
        }
    }

    #[test]
    fn next_id_increases_when_the_clock_steps_back() {
        let first = next_ulid(None, 10_000);
        let second = next_ulid(Some(first), 9_000);
        let third = next_ulid(Some(second), 10_000);
        let fourth = next_ulid(Some(third), 10_001);
        assert!(first < second && second < third && third < fourth);
        assert_eq!(fourth.timestamp_ms(), 10_001);
    }

    #[test]
    fn next_id_survives_a_full_millisecond() {
        let max = Ulid::from_parts(5, (1u128 << 80) - 1);
        let next = next_ulid(Some(max), 5);
        assert!(next > max);
    }
}
