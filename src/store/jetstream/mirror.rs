//! The projections in a JetStream key-value bucket, and each node's copy of them.
//!
//! A projected value lives under `<projection>.<session>` (or `<projection>.<session>.<item>`);
//! `_projected.<session>` holds the last sequence number folded into the session's values,
//! and `_meta.signature` the set of projections the bucket was built for. The node that
//! appends to a session folds its events and puts the values; every node watches the
//! bucket and keeps a copy in memory, from which it answers lookups and pages in key order.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use async_nats::jetstream::kv;
use bytes::Bytes;
use futures_util::StreamExt;
use parking_lot::RwLock;
use tokio::sync::watch;

use crate::domain::SessionId;
use crate::store::{Key, Projection, StoreError, Values};

pub const SIGNATURE: &str = "_meta.signature";

pub fn value_key(projection: &str, key: Key) -> String {
    match key.item {
        Some(item) => format!("{projection}.{}.{item}", key.session.ulid()),
        None => format!("{projection}.{}", key.session.ulid()),
    }
}

/// A value as stored: the last event folded into it, then the projection's own bytes.
pub fn stamp(seq: u64, value: &[u8]) -> Bytes {
    let mut stored = Vec::with_capacity(8 + value.len());
    stored.extend_from_slice(&seq.to_be_bytes());
    stored.extend_from_slice(value);
    Bytes::from(stored)
}

/// A stored value's sequence number and the projection's own bytes.
pub fn unstamp(stored: Bytes) -> (u64, Bytes) {
    match stored.get(..8) {
        Some(seq) => (u64::from_be_bytes(seq.try_into().expect("8 bytes")), stored.slice(8..)),
        None => (0, stored),
    }
}

pub fn watermark_key(session: SessionId) -> String {
    format!("_projected.{}", session.ulid())
}

/// Whether `key` is a session's watermark (its value the last event projected, as text).
pub fn is_watermark(key: &str) -> bool {
    key.starts_with("_projected.")
}

fn parse_key(key: &str) -> Option<(&str, Key)> {
    let mut parts = key.split('.');
    let projection = parts.next()?;
    let session = SessionId(parts.next()?.parse::<ulid::Ulid>().ok()?);
    let item = match parts.next() {
        Some(item) => Some(item.parse::<ulid::Ulid>().ok()?),
        None => None,
    };
    (parts.next().is_none() && !projection.starts_with('_')).then_some((projection, Key { session, item }))
}

/// A node's copy of the projections bucket.
pub struct Mirror {
    values: RwLock<HashMap<String, BTreeMap<Key, Bytes>>>,
    /// The bucket's revision of each value held (or removed), so that an older one, from
    /// the watch or from this node's own puts, never replaces a newer one; and the last
    /// event folded into it.
    revisions: RwLock<HashMap<String, (u64, u64)>>,
    /// The bucket's revision this copy has applied from the watch.
    applied: watch::Sender<u64>,
    /// The projection of the sessions' summaries ([`Projection::lists_sessions`]): a session
    /// whose summary changed goes to the service's feed of changed sessions.
    sessions_projection: Option<&'static str>,
}

impl Mirror {
    pub fn new(projections: &[Arc<dyn Projection>]) -> Arc<Mirror> {
        let sessions_projection = projections.iter().find(|p| p.lists_sessions()).map(|p| p.name());
        Arc::new(Mirror {
            values: RwLock::default(),
            revisions: RwLock::default(),
            applied: watch::channel(0).0,
            sessions_projection,
        })
    }

    pub fn get(&self, projection: &str, key: Key) -> Option<Bytes> {
        self.values.read().get(projection)?.get(&key).cloned()
    }

    /// The bucket's revision of the value under `bucket_key` this copy holds (0: none).
    pub fn revision(&self, bucket_key: &str) -> u64 {
        self.revisions.read().get(bucket_key).map_or(0, |(revision, _)| *revision)
    }

    /// The last event of `session` whose projections are all put, as its watermark in this
    /// copy says (0: none).
    pub fn watermark(&self, session: SessionId) -> u64 {
        self.revisions.read().get(&watermark_key(session)).map_or(0, |(_, seq)| *seq)
    }

    /// The last event folded into the value under `key` (0: none).
    pub fn folded(&self, projection: &str, key: Key) -> u64 {
        self.revisions.read().get(&value_key(projection, key)).map_or(0, |(_, seq)| *seq)
    }

    /// A page in key order, as [`crate::store::Projections::scan`] answers it.
    pub fn scan(&self, projection: &str, scan: crate::store::Scan) -> Vec<(Key, Bytes)> {
        let values = self.values.read();
        values.get(projection).map(|values| crate::store::page(values, scan)).unwrap_or_default()
    }

    /// Waits until the copy has applied the bucket up to `revision`.
    pub async fn applied(&self, revision: u64) {
        let mut applied = self.applied.subscribe();
        let _ = applied.wait_for(|applied| *applied >= revision).await;
    }

    /// Applies one entry of the bucket's watch; answers the session whose summary changed.
    fn apply(&self, entry: &kv::Entry) -> Option<SessionId> {
        let value = match entry.operation {
            kv::Operation::Put => Some(entry.value.clone()),
            kv::Operation::Delete | kv::Operation::Purge => None,
        };
        self.applied_at(&entry.key, value, entry.revision)
    }

    /// Applies a value (`None`: removed) of the bucket at `revision`, from its watch or
    /// fetched while there is none.
    fn applied_at(&self, key: &str, value: Option<Bytes>, revision: u64) -> Option<SessionId> {
        let changed = self.set(key, value, revision);
        self.passed(revision);
        changed
    }

    /// Records that the copy has applied the bucket up to `revision`.
    fn passed(&self, revision: u64) {
        self.applied.send_if_modified(|applied| {
            let moved = revision > *applied;
            *applied = (*applied).max(revision);
            moved
        });
    }

    /// Applies the bucket's entries after revision `applied` that its stream's leader holds
    /// (as many as [`super::quiet::FETCH_ROUND`]), one request each, while there is no watch (the
    /// node's consumer of the events stream does the same).
    async fn fetch_after(&self, bucket: &kv::Store, changed: &impl Fn(SessionId)) {
        let stream = &bucket.stream;
        let wait = super::quiet::QUIET_WAIT;
        let Ok(Ok(info)) = tokio::time::timeout(wait, stream.get_info()).await else { return };
        let prefix = format!("$KV.{}.", bucket.name);
        let last = info.state.last_sequence.min(*self.applied.borrow() + super::quiet::FETCH_ROUND);
        loop {
            let revision = *self.applied.borrow() + 1;
            if revision > last {
                return;
            }
            match tokio::time::timeout(wait, stream.get_raw_message(revision)).await {
                Ok(Ok(message)) => {
                    let removed = message.headers.get("KV-Operation").is_some_and(|op| op.as_str() != "PUT");
                    let key = message.subject.as_str().strip_prefix(&prefix).unwrap_or_default();
                    if let Some(session) = self.applied_at(key, (!removed).then_some(message.payload), revision) {
                        changed(session);
                    }
                }
                // Removed from the stream (a purge): nothing to apply, only to pass.
                Ok(Err(error))
                    if error.kind() == async_nats::jetstream::stream::RawMessageErrorKind::NoMessageFound =>
                {
                    self.passed(revision)
                }
                _ => return,
            }
        }
    }

    /// Holds what this node has just put at `revision`, without waiting for the watch to
    /// bring it back (the watch may be recovering from a lost server meanwhile).
    pub fn put(&self, key: &str, value: Bytes, revision: u64) {
        self.set(key, Some(value), revision);
    }

    /// Sets (or removes) the value under a bucket key (as stored: with its sequence number)
    /// if `revision` is newer than the one held; answers the session whose summary changed.
    fn set(&self, bucket_key: &str, stored: Option<Bytes>, revision: u64) -> Option<SessionId> {
        let Some((projection, key)) = parse_key(bucket_key) else {
            // A watermark: its revision (for the next conditional put of it) and its value.
            if is_watermark(bucket_key) {
                let mut revisions = self.revisions.write();
                let held = revisions.entry(bucket_key.to_string()).or_default();
                if revision > held.0 {
                    let seq = stored.as_deref().and_then(|v| std::str::from_utf8(v).ok()).and_then(|v| v.parse().ok());
                    *held = (revision, seq.unwrap_or(0));
                }
            }
            return None;
        };
        let mut revisions = self.revisions.write();
        let held = revisions.entry(bucket_key.to_string()).or_default();
        if revision <= held.0 {
            return None;
        }
        let value = stored.map(unstamp);
        *held = (revision, value.as_ref().map_or(0, |(seq, _)| *seq));
        let mut values = self.values.write();
        match value {
            Some((_, value)) => {
                values.entry(projection.to_string()).or_default().insert(key, value);
            }
            None => {
                if let Some(values) = values.get_mut(projection) {
                    values.remove(&key);
                }
            }
        }
        (Some(projection) == self.sessions_projection).then_some(key.session)
    }

    /// Keeps the copy current from the bucket's watch, from its current values on; calls
    /// `changed` for each session whose summary changes. Answers once the copy holds the
    /// bucket as it stood (its last revision, `upto`). A watch that has gone quiet is
    /// replaced by one from the revision after the last applied (see [`super::quiet::Quiet`]).
    pub async fn follow(
        self: &Arc<Mirror>,
        bucket: &kv::Store,
        upto: u64,
        changed: impl Fn(SessionId) + Send + Sync + 'static,
    ) -> Result<tokio::task::JoinHandle<()>, StoreError> {
        let mut watch = bucket.watch_with_history(">").await.map_err(StoreError::new)?;
        let (mirror, bucket) = (self.clone(), bucket.clone());
        let task = tokio::spawn(async move {
            let mut quiet = super::quiet::Quiet::new(*mirror.applied.borrow());
            let mut tick = super::quiet::quiet_ticks();
            loop {
                tokio::select! {
                    entry = watch.next() => match entry {
                        Some(Ok(entry)) => {
                            if let Some(session) = mirror.apply(&entry) {
                                changed(session);
                            }
                        }
                        Some(Err(error)) => tracing::warn!(%error, "the projections watch failed; it resumes"),
                        None => break,
                    },
                    _ = tick.tick() => {
                        let applied = *mirror.applied.borrow();
                        if !quiet.stalled(applied, &bucket.stream).await {
                            continue;
                        }
                        tracing::warn!(from = applied + 1, "the projections watch brings nothing the bucket holds; watching it again");
                        crate::metrics::JETSTREAM_FOLLOWERS_REPLACED.with_label_values(&["projections"]).inc();
                        // As the node's consumer of the events stream does: fetch, then watch.
                        loop {
                            mirror.fetch_after(&bucket, &changed).await;
                            let from = *mirror.applied.borrow() + 1;
                            match tokio::time::timeout(2 * super::quiet::QUIET_WAIT, bucket.watch_all_from_revision(from)).await {
                                Ok(Ok(new)) => break watch = new,
                                Ok(Err(error)) => {
                                    tracing::warn!(%error, "could not watch the projections again; fetching meanwhile")
                                }
                                Err(_) => tracing::warn!("could not watch the projections again in time; fetching meanwhile"),
                            }
                        }
                        tick.reset();
                    }
                }
            }
            tracing::warn!("the projections watch ended");
        });
        self.applied(upto).await;
        Ok(task)
    }
}

/// Projected values as [`crate::store::project`] folds a batch: read from what this batch
/// already changed, then from the node's copy; written to the batch's puts, each with the
/// event it folds in.
pub struct Staged<'a> {
    pub mirror: &'a Mirror,
    pub puts: BTreeMap<String, (u64, Vec<u8>)>,
    pub projections: &'a [Arc<dyn Projection>],
    /// The event being folded.
    pub seq: u64,
}

impl<'a> Staged<'a> {
    pub fn new(mirror: &'a Mirror, projections: &'a [Arc<dyn Projection>]) -> Staged<'a> {
        Staged { mirror, puts: BTreeMap::new(), projections, seq: 0 }
    }

    /// The puts, as stored.
    pub fn stored(self) -> Vec<(String, Bytes)> {
        self.puts.into_iter().map(|(key, (seq, value))| (key, stamp(seq, &value))).collect()
    }
}

impl Values for Staged<'_> {
    fn get(&mut self, projection: &'static str, key: Key) -> Result<Option<Bytes>, StoreError> {
        if let Some((_, value)) = self.puts.get(&value_key(projection, key)) {
            return Ok(Some(Bytes::copy_from_slice(value)));
        }
        Ok(self.mirror.get(projection, key))
    }

    fn put(&mut self, projection: &'static str, key: Key, value: Vec<u8>) -> Result<(), StoreError> {
        if !self.projections.iter().any(|p| p.name() == projection) {
            return Err(crate::store::unknown_projection(projection));
        }
        self.puts.insert(value_key(projection, key), (self.seq, value));
        Ok(())
    }

    fn folded(&mut self, projection: &'static str, key: Key, seq: u64) -> bool {
        self.seq = seq;
        let held = match self.puts.get(&value_key(projection, key)) {
            Some((held, _)) => *held,
            None => self.mirror.folded(projection, key),
        };
        held >= seq
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_name_the_projection_the_session_and_the_item() {
        let session = SessionId::generate();
        let item = ulid::Ulid::new();
        let key = Key { session, item: Some(item) };
        assert_eq!(parse_key(&value_key("turns", key)), Some(("turns", key)));
        assert_eq!(parse_key(&value_key("sessions", Key::session(session))), Some(("sessions", Key::session(session))));
        assert_eq!(parse_key(&watermark_key(session)), None, "bookkeeping keys are not values");
        assert_eq!(parse_key("sessions.not-an-id"), None);
    }

    /// A projection of each session's creation (the store's tests name no projection of
    /// the service's).
    struct Created;

    impl Projection for Created {
        fn name(&self) -> &'static str {
            "created"
        }

        fn wants(&self, kind: &str) -> bool {
            kind == "session.created"
        }

        fn keys(&self, event: &crate::domain::Event) -> Vec<Key> {
            vec![Key::session(event.session_id)]
        }

        fn apply(&self, _key: Key, _current: Option<&[u8]>, event: &crate::domain::Event) -> Option<Vec<u8>> {
            Some(event.sequence_number.to_be_bytes().to_vec())
        }
    }

    #[test]
    fn a_value_folded_again_is_left_as_it_is() {
        let projections: Vec<Arc<dyn Projection>> = vec![Arc::new(Created)];
        let mirror = Mirror::new(&projections);
        let session = SessionId::generate();
        let created = crate::domain::EventBody::SessionCreated { spec: Default::default(), created_by: "t".into() };
        let drafts = [crate::domain::Draft::new(None, &created)];
        let events = crate::store::numbering::Tail::default()
            .stage(session, 0, &drafts, &crate::store::numbering::Clock::now(), 10)
            .unwrap()
            .unwrap();
        let mut staged = Staged::new(&mirror, &projections);
        crate::store::project(&projections, &events[0], &mut staged).unwrap();
        let stored = staged.stored();
        assert!(!stored.is_empty());
        for (revision, (key, value)) in stored.iter().enumerate() {
            assert_eq!(unstamp(value.clone()).0, 1, "{key} has event 1 folded in");
            mirror.put(key, value.clone(), revision as u64 + 1);
        }
        let mut again = Staged::new(&mirror, &projections);
        crate::store::project(&projections, &events[0], &mut again).unwrap();
        assert!(again.puts.is_empty(), "nothing to put: every value has event 1 already");
    }
}
