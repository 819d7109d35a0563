//! Typed reads of projected values: what the log keeps under a projection's name, decoded.
//! A value that does not decode is logged and read as absent.

use serde::de::DeserializeOwned;

use crate::store::{Key, Projections, Scan, StoreError};

/// The value under `key`, decoded.
pub async fn get<T: DeserializeOwned>(
    projections: &dyn Projections,
    projection: &str,
    key: Key,
) -> Result<Option<T>, StoreError> {
    let Some(bytes) = projections.get(projection, key).await? else { return Ok(None) };
    Ok(decode(projection, &bytes))
}

/// A page of values, decoded (those that do not decode are left out).
pub async fn scan<T: DeserializeOwned>(
    projections: &dyn Projections,
    projection: &str,
    scan: Scan,
) -> Result<Vec<(Key, T)>, StoreError> {
    let page = projections.scan(projection, scan).await?;
    Ok(page.into_iter().filter_map(|(key, bytes)| Some((key, decode(projection, &bytes)?))).collect())
}

/// Stored bytes of `projection`, decoded.
pub fn decode<T: DeserializeOwned>(projection: &str, bytes: &[u8]) -> Option<T> {
    serde_json::from_slice(bytes)
        .map_err(|error| tracing::error!(%error, projection, "a projected value does not decode"))
        .ok()
}
