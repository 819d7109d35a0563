//! Claims ([`Claims`]) in a key-value bucket of their own, whose entries expire with the
//! bucket's `max_age`: the first `create` of a name wins, and a later claim reads it.

use async_nats::jetstream::kv;
use bytes::Bytes;

use super::{patiently, store_error, JetStreamLog};
use crate::store::{claim_record, live_claim, Claims, StoreError};

#[async_trait::async_trait]
impl Claims for JetStreamLog {
    async fn claim(&self, name: &str, value: Bytes, ttl: std::time::Duration) -> Result<Bytes, StoreError> {
        let (claims, wait) = (&self.inner.claims, self.inner.config.failover_wait);
        let record = Bytes::from(claim_record(&value, ttl));
        let exists = |e: &kv::CreateError| e.kind() == kv::CreateErrorKind::AlreadyExists;
        for _ in 0..4 {
            match patiently(wait, "a claim", || claims.create(name, record.clone()), exists).await {
                Ok(_) => return Ok(value),
                Err(error) if exists(&error) => {}
                Err(error) => return Err(store_error("could not claim a request's key", error)),
            }
            let entry = patiently(wait, "a claim", || claims.entry(name), |_| false)
                .await
                .map_err(|e| store_error("could not read a request's key", e))?;
            let Some(entry) = entry.filter(|entry| entry.operation == kv::Operation::Put) else { continue };
            if let Some(held) = live_claim(&entry.value) {
                return Ok(Bytes::copy_from_slice(held));
            }
            // Expired, and not yet removed: taken if nobody changed it since it was read.
            if claims.update(name, record.clone(), entry.revision).await.is_ok() {
                return Ok(value);
            }
        }
        Err(StoreError::unavailable(format!("the claim {name} keeps changing; try again")))
    }
}
