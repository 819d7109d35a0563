//! The projections' side of the log: putting an append's values in the bucket, repairing
//! what a writer that stopped left unprojected, and rebuilding them all from the stream when
//! the bucket was made for another set of projections.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use async_nats::jetstream::{consumer, kv};
use bytes::Bytes;
use futures_util::{StreamExt, TryStreamExt};

use super::mirror::{self, Mirror};
use super::{patiently, store_error, wire, JetStreamLog, Session};
use crate::domain::{RawEvent, SessionId};
use crate::store::{chain, project, signature, Key, Log, ReadRange, StoreError};

/// How many times a projection's value is put again after it changed under the put.
const PUT_ATTEMPTS: usize = 4;

impl JetStreamLog {
    pub(super) async fn bucket_revision(&self) -> Result<u64, StoreError> {
        let name = format!("KV_{}", self.inner.config.projections_bucket);
        let mut stream = self.inner.js.get_stream(&name).await.map_err(|e| store_error("the bucket's stream", e))?;
        let info = stream.info().await.map_err(|e| store_error("the bucket's stream", e))?;
        Ok(info.state.last_sequence)
    }

    /// [`Projections::get`](crate::store::Projections::get): from this node's copy of the
    /// bucket, else from the bucket.
    pub(super) async fn projected_value(&self, projection: &str, key: Key) -> Result<Option<Bytes>, StoreError> {
        if !self.inner.projections.iter().any(|p| p.name() == projection) {
            return Err(crate::store::unknown_projection(projection));
        }
        if let Some(value) = self.inner.mirror.get(projection, key) {
            return Ok(Some(value));
        }
        // Not in this node's copy: perhaps made on another node a moment ago, and the
        // watch has not brought it yet. The bucket itself has the answer.
        let bucket_key = mirror::value_key(projection, key);
        let bucket = &self.inner.bucket;
        let entry = patiently(self.inner.config.failover_wait, "a projection", || bucket.entry(&bucket_key), |_| false)
            .await
            .map_err(|e| store_error("could not read a projection", e))?;
        if let Some(entry) = entry.filter(|entry| entry.operation == kv::Operation::Put) {
            self.inner.mirror.put(&bucket_key, entry.value.clone(), entry.revision);
            return Ok(Some(mirror::unstamp(entry.value).1));
        }
        // Nowhere: a session's value missing while its log has events (a node stopped between
        // storing its first events and putting their projections) is made whole now, here.
        if key.item.is_none() && self.repair_missing(key.session).await? {
            return Ok(self.inner.mirror.get(projection, key));
        }
        Ok(None)
    }

    /// Repairs the projections of `session` if its log has events (answers whether it has):
    /// for a session-wide value found nowhere, which would otherwise answer "no such session"
    /// on every node until someone appended to it.
    async fn repair_missing(&self, session: SessionId) -> Result<bool, StoreError> {
        let last = self.last_message(&self.subject(session)).await;
        if last.map_err(|error| store_error("could not read a session's last message", error))?.is_none() {
            return Ok(false);
        }
        let loaded = self.session(session).await?;
        self.repair(&loaded).await?;
        Ok(true)
    }

    /// Folds `events` into the projections and puts what changed, then the session's
    /// watermark; answers the bucket's revision after the last put.
    pub(super) async fn project(
        &self,
        session: SessionId,
        events: &[(RawEvent, chain::Hash)],
    ) -> Result<u64, StoreError> {
        let mut staged = mirror::Staged::new(&self.inner.mirror, &self.inner.projections);
        for (event, _) in events {
            project(&self.inner.projections, event, &mut staged)?;
        }
        let last = events.last().map_or(0, |(event, _)| event.seq);
        let puts = staged.stored();
        let puts = puts.into_iter().map(|(key, value)| async move {
            let folded = mirror::unstamp(value.clone()).0;
            self.put_if_newer(&key, value, folded).await
        });
        let revisions = futures_util::future::try_join_all(puts).await?;
        // Only once every value is in: the watermark says they all are.
        let key = mirror::watermark_key(session);
        let watermark = self.put_if_newer(&key, Bytes::from(last.to_string()), last).await?;
        Ok(revisions.into_iter().max().unwrap_or(0).max(watermark))
    }

    /// Puts `value` (folded up to the session's event `folded`) under `key`, conditional on
    /// the revision this node's copy holds: a node that folded on an older copy (one that
    /// lost its lease, or is a moment behind) never overwrites a value folded further. On a
    /// conflict the bucket's value is read: folded as far or further, it stays (this put is
    /// done, or was made before by a copy of it whose answer was lost); else this one is
    /// put over it. Answers the key's revision after.
    async fn put_if_newer(&self, key: &str, value: Bytes, folded: u64) -> Result<u64, StoreError> {
        let (bucket, mirror, wait) = (&self.inner.bucket, &self.inner.mirror, self.inner.config.failover_wait);
        let failed = |e: &dyn std::fmt::Display| store_error(&format!("could not put {key}"), e);
        let mut held = mirror.revision(key);
        for _ in 0..PUT_ATTEMPTS {
            let put = match held {
                0 => {
                    let exists = |e: &kv::CreateError| e.kind() == kv::CreateErrorKind::AlreadyExists;
                    match patiently(wait, "a projection", || bucket.create(key, value.clone()), exists).await {
                        Ok(revision) => Ok(revision),
                        Err(e) if exists(&e) => Err(None),
                        Err(e) => Err(Some(failed(&e))),
                    }
                }
                held => {
                    let moved = |e: &kv::UpdateError| e.kind() == kv::UpdateErrorKind::WrongLastRevision;
                    match patiently(wait, "a projection", || bucket.update(key, value.clone(), held), moved).await {
                        Ok(revision) => Ok(revision),
                        Err(e) if moved(&e) => Err(None),
                        Err(e) => Err(Some(failed(&e))),
                    }
                }
            };
            match put {
                Ok(revision) => {
                    mirror.put(key, value, revision);
                    return Ok(revision);
                }
                Err(Some(error)) => return Err(error),
                // Changed since this node's copy had it: see what is there.
                Err(None) => {
                    let entry = patiently(wait, "a projection", || bucket.entry(key), |_| false)
                        .await
                        .map_err(|e| failed(&e))?;
                    let Some(entry) = entry.filter(|entry| entry.operation == kv::Operation::Put) else {
                        held = 0;
                        continue;
                    };
                    held = entry.revision;
                    mirror.put(key, entry.value.clone(), entry.revision);
                    let theirs = match mirror::is_watermark(key) {
                        true => std::str::from_utf8(&entry.value).ok().and_then(|v| v.parse().ok()).unwrap_or(0),
                        false => mirror::unstamp(entry.value.clone()).0,
                    };
                    if theirs >= folded {
                        crate::metrics::PROJECTION_PUTS_SUPERSEDED.inc();
                        tracing::debug!(key, theirs, folded, "a projection's value was folded further elsewhere; kept");
                        return Ok(entry.revision);
                    }
                }
            }
        }
        Err(StoreError::unavailable(format!("{key} kept changing as it was put")))
    }

    /// Makes the projections of `session` whole up to its last event, if the node that
    /// appended last stopped before it put them.
    pub(super) async fn repair(&self, session: &Arc<Session>) -> Result<(), StoreError> {
        let at = session.channel.durable().seq;
        let key = mirror::watermark_key(session.id);
        let projected = match self.inner.bucket.get(&key).await.map_err(|e| store_error("the watermark", e))? {
            Some(value) => std::str::from_utf8(&value).ok().and_then(|v| v.parse::<u64>().ok()).unwrap_or(0),
            None => 0,
        };
        if projected >= at {
            return Ok(());
        }
        let after = match projected {
            0 => None,
            seq => self.event_at(session.id, seq).await?.map(|event| event.id),
        };
        let events =
            self.within(session.id, ReadRange { after, before: None, limit: usize::MAX, newest_first: false }).await?;
        tracing::warn!(session_id = %session.id, from = projected, to = at, "projecting events the last writer left unprojected");
        self.project(session.id, &events).await?;
        crate::metrics::PROJECTIONS_REPAIRED.inc();
        Ok(())
    }

    /// Rebuilds every projection from the stream when the bucket was made for another set
    /// of them (or is new).
    pub(super) async fn rebuild_if_needed(&self) -> Result<(), StoreError> {
        let names = signature(&self.inner.projections);
        let bucket = &self.inner.bucket;
        let stored = bucket.get(mirror::SIGNATURE).await.map_err(|e| store_error("the projections' signature", e))?;
        if stored.as_deref() == Some(names.as_bytes()) {
            return Ok(());
        }
        let started = Instant::now();
        let mut keys = bucket.keys().await.map_err(|e| store_error("the projections' keys", e))?;
        while let Some(key) = keys.try_next().await.map_err(|e| store_error("the projections' keys", e))? {
            bucket.purge(&key).await.map_err(|e| store_error("clearing the projections", e))?;
        }
        let empty = Mirror::new(&self.inner.projections);
        let mut staged = mirror::Staged::new(&empty, &self.inner.projections);
        let mut watermarks: BTreeMap<String, u64> = BTreeMap::new();
        let mut count = 0u64;
        let last =
            self.inner.stream.clone().info().await.map_err(|e| store_error("the stream", e))?.state.last_sequence;
        if last > 0 {
            let all = consumer::DeliverPolicy::All;
            let mut messages = self.read_stream(None, all, false, "could not read the stream").await?;
            while let Some(message) = messages.next().await {
                let message = message.map_err(|e| store_error("could not read the stream", e))?;
                let stream_seq =
                    message.info().map_err(|e| store_error("could not read the stream", e))?.stream_sequence;
                if let Some(session) = self.session_of(message.subject.as_str()) {
                    let key = mirror::watermark_key(session);
                    let events = wire::decode(&message.payload).map_err(StoreError::new)?;
                    // Only the messages that are part of the log (see `follows`).
                    if events.first().map(|(event, _)| event.seq) == Some(watermarks.get(&key).map_or(1, |seq| seq + 1))
                    {
                        for (event, _) in events {
                            project(&self.inner.projections, &event, &mut staged)?;
                            watermarks.insert(key.clone(), event.seq);
                            count += 1;
                        }
                    }
                }
                if stream_seq >= last {
                    break;
                }
            }
        }
        let puts = staged.stored().into_iter();
        let marks = watermarks.into_iter().map(|(k, v)| (k, Bytes::from(v.to_string())));
        for (key, value) in puts.chain(marks) {
            bucket.put(&key, value).await.map_err(|e| store_error(&format!("could not put {key}"), e))?;
        }
        bucket
            .put(mirror::SIGNATURE, Bytes::from(names))
            .await
            .map_err(|e| store_error("the projections' signature", e))?;
        tracing::info!(
            events = count,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "rebuilt projections from the stream"
        );
        Ok(())
    }

    /// Drops the bucket's record of which projections it holds, so that the next node to
    /// open the log rebuilds them all from the stream (as after a change of projections).
    pub async fn forget_projections(&self) -> Result<(), StoreError> {
        self.inner.bucket.purge(mirror::SIGNATURE).await.map_err(|e| store_error("the projections' signature", e))
    }
}
