//! API keys: `Authorization: Bearer KEY` or `X-Api-Key: KEY`, looked up by SHA-256 hash.
//! With no keys configured every request is the admin subject `local` (and the server
//! only listens on loopback).
//!
//! A browser's `EventSource` cannot send headers, so the console exchanges a key once for
//! a console token in an HttpOnly, SameSite=Strict cookie: the subject, an expiry and the
//! key it came from, signed (HMAC-SHA-256) with a secret kept in the data dir, so tokens
//! survive a restart and die with their key. A write made with the cookie must also carry
//! `X-Turnlog-Console: 1`, which no other site's form can send.

use std::collections::HashMap;
use std::future::{ready, Ready};
use std::marker::PhantomData;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use actix_web::{dev::Payload, FromRequest, HttpRequest};
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

use super::error::{Error, Render, Standard};
use super::State;
use crate::config::ApiKey;
use crate::error::{ApiError, Code};
use crate::session::Caller;

pub struct Keys {
    by_hash: HashMap<[u8; 32], Caller>,
    /// Signs console tokens; `None` until [`Keys::with_secret`].
    secret: Option<[u8; 32]>,
}

/// The cookie that carries a console token.
pub const CONSOLE_COOKIE: &str = "turnlog_console";
/// The header a cookie-authenticated write must carry.
pub const CONSOLE_HEADER: &str = "x-turnlog-console";
/// How long a console token lasts; the console renews it while it is open.
pub const CONSOLE_TOKEN_TTL: Duration = Duration::from_secs(30 * 60);

/// A console token, issued for a key.
#[derive(Debug)]
pub struct Token {
    pub value: String,
    pub caller: Caller,
    pub expires: SystemTime,
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
        Keys { by_hash, secret: None }
    }

    /// With this secret to sign console tokens.
    pub fn with_secret(self, secret: [u8; 32]) -> Keys {
        Keys { secret: Some(secret), ..self }
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

/// The console's signing secret in `dir` (`console.secret`), made on first use.
pub fn console_secret(dir: &Path) -> std::io::Result<[u8; 32]> {
    let path = dir.join("console.secret");
    match std::fs::read_to_string(&path) {
        Ok(text) => hex::decode(text.trim()).ok().and_then(|bytes| bytes.try_into().ok()).ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::InvalidData, format!("{} is not 64 hex digits", path.display()))
        }),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            let secret: [u8; 32] = rand::random();
            std::fs::create_dir_all(dir)?;
            let mut options = std::fs::OpenOptions::new();
            options.write(true).create_new(true);
            #[cfg(unix)]
            std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
            std::io::Write::write_all(&mut options.open(&path)?, hex::encode(secret).as_bytes())?;
            Ok(secret)
        }
        Err(error) => Err(error),
    }
}

impl Keys {
    /// A console token for `key` (the caller it names), valid for `ttl`.
    pub fn issue(&self, key: &str, ttl: Duration) -> Result<Token, ApiError> {
        let caller = self.caller(Some(key))?;
        let hash: [u8; 32] = Sha256::digest(key.as_bytes()).into();
        let expires = SystemTime::now() + ttl;
        let value = self.sign(&caller.subject, unix(expires), &hash[..8]);
        Ok(Token { value, caller, expires })
    }

    /// A new token for the same caller and key as `token`, if it is still good.
    pub fn renew(&self, token: &str, ttl: Duration) -> Result<Token, ApiError> {
        let (caller, key) = self.verify(token)?;
        let expires = SystemTime::now() + ttl;
        Ok(Token { value: self.sign(&caller.subject, unix(expires), &key), caller, expires })
    }

    /// `subject.expiry.key.mac`, each part hex or decimal, so it needs no quoting.
    fn sign(&self, subject: &str, expires: u64, key: &[u8]) -> String {
        let payload = format!("{}.{expires}.{}", hex::encode(subject), hex::encode(key));
        format!("{payload}.{}", hex::encode(self.mac(&payload).finalize().into_bytes()))
    }

    fn mac(&self, payload: &str) -> Hmac<Sha256> {
        let secret = self.secret.as_ref().expect("console tokens need Keys::with_secret");
        let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("any key length");
        mac.update(payload.as_bytes());
        mac
    }

    /// The caller a console token names and the key (its hash's first bytes) it came from.
    fn verify(&self, token: &str) -> Result<(Caller, Vec<u8>), ApiError> {
        let invalid =
            || ApiError::new(Code::Unauthorized, "the console session is invalid or has expired: log in again");
        if self.secret.is_none() || self.is_open() {
            return Err(invalid());
        }
        let (payload, mac) = token.rsplit_once('.').ok_or_else(invalid)?;
        let mac = hex::decode(mac).map_err(|_| invalid())?;
        self.mac(payload).verify_slice(&mac).map_err(|_| invalid())?;
        let mut parts = payload.split('.');
        let (Some(subject), Some(expires), Some(key), None) = (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(invalid());
        };
        let subject = String::from_utf8(hex::decode(subject).map_err(|_| invalid())?).map_err(|_| invalid())?;
        let expires: u64 = expires.parse().map_err(|_| invalid())?;
        let key = hex::decode(key).map_err(|_| invalid())?;
        if expires <= unix(SystemTime::now()) {
            return Err(invalid());
        }
        // The key must still be configured, for the same subject.
        let caller = self
            .by_hash
            .iter()
            .find(|(hash, caller)| hash.starts_with(&key) && caller.subject == subject)
            .map(|(_, caller)| caller.clone())
            .ok_or_else(invalid)?;
        Ok((caller, key))
    }
}

fn unix(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// The caller of a request: its key, else its console cookie (a write made with the cookie
/// must carry [`CONSOLE_HEADER`]), else none.
pub fn request_caller(keys: &Keys, req: &HttpRequest) -> Result<Caller, ApiError> {
    if keys.is_open() {
        return keys.caller(None);
    }
    if let Some(key) = presented_key(req) {
        return keys.caller(Some(key));
    }
    let Some(cookie) = req.cookie(CONSOLE_COOKIE) else {
        return keys.caller(None);
    };
    let (caller, _) = keys.verify(cookie.value())?;
    if !req.method().is_safe() && req.headers().get(CONSOLE_HEADER).is_none_or(|v| v.as_bytes() != b"1") {
        return Err(ApiError::new(
            Code::Forbidden,
            "a write made with the console's cookie must carry the header `X-Turnlog-Console: 1`",
        ));
    }
    Ok(caller)
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
        ready(request_caller(&state.auth, req).map(|caller| Auth(caller, PhantomData)).map_err(Error::new))
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

    fn alice() -> Keys {
        Keys::new(&[ApiKey { subject: "alice".into(), sha256: hash_key("secret"), admin: false }]).with_secret([7; 32])
    }

    #[test]
    fn console_tokens_name_their_caller_until_they_expire() {
        let keys = alice();
        let token = keys.issue("secret", Duration::from_secs(60)).unwrap();
        assert!(!token.value.contains("secret"));
        assert_eq!(keys.verify(&token.value).unwrap().0.subject, "alice");
        let renewed = keys.renew(&token.value, Duration::from_secs(60)).unwrap();
        assert_eq!(keys.verify(&renewed.value).unwrap().0.subject, "alice");
        assert_eq!(keys.issue("wrong", Duration::from_secs(60)).unwrap_err().code, Code::Unauthorized);
        let expired = keys.issue("secret", Duration::ZERO).unwrap();
        assert_eq!(keys.verify(&expired.value).unwrap_err().code, Code::Unauthorized);
    }

    #[test]
    fn a_forged_or_orphaned_console_token_is_refused() {
        let keys = alice();
        let token = keys.issue("secret", Duration::from_secs(60)).unwrap().value;
        // Another subject in the payload, the same signature.
        let (payload, mac) = token.rsplit_once('.').unwrap();
        let forged = format!("{}.{}.{mac}", hex::encode("bob"), payload.split_once('.').unwrap().1);
        assert_eq!(keys.verify(&forged).unwrap_err().code, Code::Unauthorized);
        // Another server's secret.
        let other = Keys::new(&[ApiKey { subject: "alice".into(), sha256: hash_key("secret"), admin: false }])
            .with_secret([8; 32]);
        assert!(other.verify(&token).is_err());
        // The key was removed from the config: its tokens die with it.
        let rekeyed = Keys::new(&[ApiKey { subject: "alice".into(), sha256: hash_key("new"), admin: false }])
            .with_secret([7; 32]);
        assert!(rekeyed.verify(&token).is_err());
        assert!(keys.verify("garbage").is_err());
    }

    #[test]
    fn no_keys_means_local_admin() {
        let caller = Keys::new(&[]).caller(None).unwrap();
        assert!(caller.admin);
    }
}
