//! The per-session hash chain that makes a log tamper-evident, as the log computes it when
//! it writes each event (the export format that carries it, and its verification, are
//! [`crate::audit`]'s). Event `n` of a session (sequence number `n`) has the hash
//!
//! ```text
//! hash(n) = SHA-256(hash(n - 1) || the event's stored bytes)     hash(0) = 32 zero bytes
//! ```
//!
//! over the exact bytes the log stores (the JSON a native page or stream shows, byte for
//! byte, unless the event was queued and is shown with its `processed_at`). The log
//! records each event's hash beside it as it writes the event; an export line carries the
//! event's bytes verbatim with its predecessor's hash and its own.

use sha2::{Digest, Sha256};

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hash_is_sha256_of_the_previous_hash_and_the_bytes() {
        // Recomputable with any SHA-256: sha256(32 zero bytes ++ b"{}").
        let expected = Sha256::digest([&[0u8; 32][..], b"{}"].concat());
        assert_eq!(link(&GENESIS, b"{}").as_slice(), expected.as_slice());
    }
}
