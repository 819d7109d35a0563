//! API keys: `Authorization: Bearer KEY` or `X-Api-Key: KEY`, looked up by SHA-256 hash.
//! With no keys configured every request is the admin subject `local` (and the server
//! only listens on loopback).

use std::collections::HashMap;
use std::future::{ready, Ready};
use std::marker::PhantomData;

use actix_web::{dev::Payload, FromRequest, HttpRequest};
use sha2::{Digest, Sha256};

use super::error::{Error, Render, Standard};
use super::State;
use crate::config::ApiKey;
use crate::error::{ApiError, Code};
use crate::session::Caller;

pub struct Keys {
    by_hash: HashMap<[u8; 32], Caller>,
}

impl Keys {
    pub fn new(keys: &[ApiKey]) -> Keys {
        let by_hash = keys
            .iter()
            .filter_map(|key| {
                let hash: [u8; 32] = hex::decode(&key.sha256).ok()?.try_into().ok()?;
                Some((hash, Caller { subject: key.subject.clone(), admin: key.admin }))
            })
            .collect();
        Keys { by_hash }
    }

    pub fn is_open(&self) -> bool {
        self.by_hash.is_empty()
    }

    pub fn caller(&self, presented: Option<&str>) -> Result<Caller, ApiError> {
        if self.is_open() {
            return Ok(Caller { subject: "local".into(), admin: true });
        }
        let Some(key) = presented else {
            return Err(ApiError::new(
                Code::Unauthorized,
                "missing API key: send `Authorization: Bearer <key>` or `X-Api-Key: <key>`",
            ));
        };
        let hash: [u8; 32] = Sha256::digest(key.as_bytes()).into();
        self.by_hash.get(&hash).cloned().ok_or_else(|| ApiError::new(Code::Unauthorized, "invalid API key"))
    }
}

pub fn hash_key(key: &str) -> String {
    hex::encode(Sha256::digest(key.as_bytes()))
}

/// The key a request presents, if any.
pub fn presented_key(req: &HttpRequest) -> Option<&str> {
    let headers = req.headers();
    if let Some(value) = headers.get("authorization").and_then(|v| v.to_str().ok()) {
        let value = value.trim();
        if let Some(token) = value.strip_prefix("Bearer ").or_else(|| value.strip_prefix("bearer ")) {
            return Some(token.trim());
        }
    }
    headers.get("x-api-key").and_then(|v| v.to_str().ok()).map(str::trim)
}

/// The caller a request's key names; a missing or unknown key is answered (401) in the
/// shape of the view's renderer `R`.
pub struct Auth<R: Render = Standard>(pub Caller, pub PhantomData<fn() -> R>);

impl<R: Render> FromRequest for Auth<R> {
    type Error = Error<R>;
    type Future = Ready<Result<Auth<R>, Error<R>>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        let state = req.app_data::<State>().expect("app state is registered");
        ready(state.auth.caller(presented_key(req)).map(|caller| Auth(caller, PhantomData)).map_err(Error::new))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_matched_by_hash() {
        let keys = Keys::new(&[ApiKey { subject: "alice".into(), sha256: hash_key("secret"), admin: false }]);
        assert_eq!(keys.caller(Some("secret")).unwrap().subject, "alice");
        assert_eq!(keys.caller(Some("wrong")).unwrap_err().code, Code::Unauthorized);
        assert_eq!(keys.caller(None).unwrap_err().code, Code::Unauthorized);
    }

    #[test]
    fn no_keys_means_local_admin() {
        let caller = Keys::new(&[]).caller(None).unwrap();
        assert!(caller.admin);
    }
}
