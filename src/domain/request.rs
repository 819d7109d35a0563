//! Idempotency keys: a client's name for one write, so that the write sent again (after a
//! lost answer, a 503, a failover) is done once. A keyed write leaves a [`RequestMark`] on
//! the first event it stores, in the same append: the log itself says which writes were
//! made, so no side table can disagree with it.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::RawEvent;

/// The longest key taken (the IETF draft sets no limit; payment APIs take 255).
pub const MAX_KEY_LEN: usize = 255;

/// A keyed write as a view hands it down: the client's key, and the fingerprint of what it
/// asked (method, path and body), which a second use of the key must match.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestKey {
    pub key: String,
    pub fingerprint: String,
}

impl RequestKey {
    /// The key from an `Idempotency-Key` header, fingerprinted with the request it came
    /// with. A key must be 1 to 255 printable ASCII characters (space included).
    pub fn new(key: &str, method: &str, path: &str, body: &[u8]) -> Result<RequestKey, String> {
        let visible = key.bytes().all(|b| b.is_ascii_graphic() || b == b' ');
        if key.is_empty() || key.len() > MAX_KEY_LEN || !visible {
            return Err(format!(
                "invalid header `Idempotency-Key`: 1 to {MAX_KEY_LEN} printable ASCII characters are required"
            ));
        }
        Ok(RequestKey { key: key.to_string(), fingerprint: fingerprint(&[method.as_bytes(), path.as_bytes(), body]) })
    }

    /// A key a program makes for itself (the ACP bridge: its connection and the JSON-RPC id).
    pub fn derived(key: String, parts: &[&[u8]]) -> RequestKey {
        RequestKey { key, fingerprint: fingerprint(parts) }
    }

    /// A name for this key as `subject` used it, fit for any store's keys (hex).
    pub fn scoped(&self, subject: &str) -> String {
        fingerprint(&[subject.as_bytes(), self.key.as_bytes()])
    }

    /// The mark a write with this key leaves on the first of its `events`.
    pub fn mark(&self, events: usize) -> RequestMark {
        RequestMark {
            idempotency_key: self.key.clone(),
            fingerprint: self.fingerprint.clone(),
            events: u32::try_from(events).unwrap_or(u32::MAX),
        }
    }

    /// Whether `mark` was left by this very request (same key, same fingerprint); an error
    /// naming the conflict if the key was used for another.
    pub fn matches(&self, fingerprint: &str) -> Result<(), String> {
        match self.fingerprint == fingerprint {
            true => Ok(()),
            false => Err(format!(
                "the Idempotency-Key {:?} was used for a different request (another route or body); \
                 a key names one request",
                self.key
            )),
        }
    }
}

/// 128 bits of SHA-256 over `parts`, each length-prefixed, as hex.
fn fingerprint(parts: &[&[u8]]) -> String {
    let mut hash = Sha256::new();
    for part in parts {
        hash.update((part.len() as u64).to_be_bytes());
        hash.update(part);
    }
    hex::encode(&hash.finalize()[..16])
}

/// What a keyed write leaves in its first event's envelope (`"request": {...}`): the key,
/// the fingerprint, and how many events the write stored (this one and those after it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestMark {
    pub idempotency_key: String,
    pub fingerprint: String,
    pub events: u32,
}

/// Where the envelope writer puts a mark: right after `schema_version`, before the body.
pub(super) const MARK_FIELD: &[u8] = b",\"request\":{\"idempotency_key\":";

/// How far into an event a mark can start: an envelope is shorter than this.
const ENVELOPE_SPAN: usize = 512;

impl RawEvent {
    /// The mark of the keyed write this event is the first of, if it is one. (A body's
    /// strings escape their quotes, so the field is found only where the envelope put it.)
    pub fn request_mark(&self) -> Option<RequestMark> {
        let head = &self.json[..self.json.len().min(ENVELOPE_SPAN)];
        let at = memchr::memmem::find(head, MARK_FIELD)?;
        let object = &self.json[at + b",\"request\":".len()..];
        let mut stream = serde_json::Deserializer::from_slice(object).into_iter::<RequestMark>();
        stream.next()?.ok()
    }
}
