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
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use actix_web::HttpRequest;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

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
            // Written aside and renamed into place, so a crash never leaves half a secret.
            let secret: [u8; 32] = rand::random();
            std::fs::create_dir_all(dir)?;
            let aside = dir.join("console.secret.new");
            let mut options = std::fs::OpenOptions::new();
            options.write(true).create(true).truncate(true);
            #[cfg(unix)]
            std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
            let mut file = options.open(&aside)?;
            std::io::Write::write_all(&mut file, hex::encode(secret).as_bytes())?;
            file.sync_all()?;
            std::fs::rename(&aside, &path)?;
            Ok(secret)
        }
        Err(error) => Err(error),
    }
}

/// How long a console login lasts at most, however often it is renewed.
pub const CONSOLE_LOGIN_MAX: Duration = Duration::from_secs(12 * 60 * 60);

/// What a console token says, once its signature is checked.
#[derive(Debug)]
struct Claims {
    caller: Caller,
    issued: u64,
    /// Which key it came from: the first bytes of HMAC(secret, the key's hash), so that a
    /// token reveals nothing that helps guess the key.
    key: Vec<u8>,
}

impl Keys {
    /// A console token for `key` (the caller it names), valid for `ttl`.
    pub fn issue(&self, key: &str, ttl: Duration) -> Result<Token, ApiError> {
        let caller = self.caller(Some(key))?;
        let hash: [u8; 32] = Sha256::digest(key.as_bytes()).into();
        let claims = Claims { caller, issued: unix(SystemTime::now()), key: self.key_id(&hash)? };
        self.token(claims, ttl)
    }

    /// A new token for the same login as `token`, if it is still good, until
    /// [`CONSOLE_LOGIN_MAX`] after the login.
    pub fn renew(&self, token: &str, ttl: Duration) -> Result<Token, ApiError> {
        self.token(self.verify(token)?, ttl)
    }

    fn token(&self, claims: Claims, ttl: Duration) -> Result<Token, ApiError> {
        let end = UNIX_EPOCH + Duration::from_secs(claims.issued) + CONSOLE_LOGIN_MAX;
        let expires = (SystemTime::now() + ttl).min(end);
        if expires <= SystemTime::now() {
            return Err(ApiError::new(Code::Unauthorized, "the console login has reached its limit: log in again"));
        }
        // `subject.issued.expires.key.mac`, each part hex or decimal, so it needs no quoting.
        let payload = format!(
            "{}.{}.{}.{}",
            hex::encode(&claims.caller.subject),
            claims.issued,
            unix(expires),
            hex::encode(&claims.key)
        );
        let mac = hex::encode(self.mac(&payload)?.finalize().into_bytes());
        Ok(Token { value: format!("{payload}.{mac}"), caller: claims.caller, expires })
    }

    fn mac(&self, payload: &str) -> Result<Hmac<Sha256>, ApiError> {
        let secret = self.secret.as_ref().ok_or_else(|| ApiError::new(Code::Internal, "console logins are off"))?;
        let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("any key length");
        mac.update(payload.as_bytes());
        Ok(mac)
    }

    fn key_id(&self, hash: &[u8; 32]) -> Result<Vec<u8>, ApiError> {
        let mut mac = self.mac("key")?;
        mac.update(hash);
        Ok(mac.finalize().into_bytes()[..8].to_vec())
    }

    /// What a console token says, if it is signed, unexpired, and its key is still
    /// configured for its subject.
    fn verify(&self, token: &str) -> Result<Claims, ApiError> {
        let invalid =
            || ApiError::new(Code::Unauthorized, "the console session is invalid or has expired: log in again");
        if self.secret.is_none() || self.is_open() {
            return Err(invalid());
        }
        let (payload, mac) = token.rsplit_once('.').ok_or_else(invalid)?;
        let mac = hex::decode(mac).map_err(|_| invalid())?;
        self.mac(payload)?.verify_slice(&mac).map_err(|_| invalid())?;
        let parts: Vec<&str> = payload.split('.').collect();
        let [subject, issued, expires, key] = parts[..] else { return Err(invalid()) };
        let subject = String::from_utf8(hex::decode(subject).map_err(|_| invalid())?).map_err(|_| invalid())?;
        let issued: u64 = issued.parse().map_err(|_| invalid())?;
        let expires: u64 = expires.parse().map_err(|_| invalid())?;
        let key = hex::decode(key).map_err(|_| invalid())?;
        if expires <= unix(SystemTime::now()) {
            return Err(invalid());
        }
        for (hash, caller) in &self.by_hash {
            if caller.subject == subject && self.key_id(hash)? == key {
                return Ok(Claims { caller: caller.clone(), issued, key });
            }
        }
        Err(invalid())
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
    let claims = keys.verify(cookie.value())?;
    if !req.method().is_safe() {
        from_console(req)?;
    }
    Ok(claims.caller)
}

/// A write made with the console's cookie, and every request to the console's own routes
/// that changes something, must carry `X-Turnlog-Console: 1`: a form on another site cannot
/// send it.
pub fn from_console(req: &HttpRequest) -> Result<(), ApiError> {
    match req.headers().get(CONSOLE_HEADER) {
        Some(value) if value.as_bytes() == b"1" => Ok(()),
        _ => Err(ApiError::new(
            Code::Forbidden,
            "a write made with the console's cookie must carry the header `X-Turnlog-Console: 1`",
        )),
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
        assert_eq!(keys.verify(&token.value).unwrap().caller.subject, "alice");
        let renewed = keys.renew(&token.value, Duration::from_secs(60)).unwrap();
        assert_eq!(keys.verify(&renewed.value).unwrap().caller.subject, "alice");
        assert_eq!(keys.issue("wrong", Duration::from_secs(60)).unwrap_err().code, Code::Unauthorized);
        // The same token, signed, but with an expiry a second ago.
        let parts: Vec<&str> = token.value.split('.').collect();
        let payload = format!("{}.{}.{}.{}", parts[0], parts[1], unix(SystemTime::now()) - 1, parts[3]);
        let expired = format!("{payload}.{}", hex::encode(keys.mac(&payload).unwrap().finalize().into_bytes()));
        assert!(keys.verify(&token.value).is_ok());
        assert_eq!(keys.verify(&expired).unwrap_err().code, Code::Unauthorized);
    }

    #[test]
    fn a_forged_or_orphaned_console_token_is_refused() {
        let keys = alice();
        let token = keys.issue("secret", Duration::from_secs(60)).unwrap().value;
        // Another subject in the payload, the same signature.
        let (payload, mac) = token.rsplit_once('.').unwrap();
        let forged = format!("{}.{}.{mac}", hex::encode("alicf"), payload.split_once('.').unwrap().1);
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
    fn a_console_login_ends_at_its_limit_however_often_it_is_renewed() {
        let keys = alice();
        let token = keys.issue("secret", Duration::from_secs(60)).unwrap();
        // A login made longer ago than the limit, signed as the server would have.
        let old = Claims {
            issued: unix(SystemTime::now()) - CONSOLE_LOGIN_MAX.as_secs() - 1,
            ..keys.verify(&token.value).unwrap()
        };
        assert_eq!(keys.token(old, Duration::from_secs(60)).unwrap_err().code, Code::Unauthorized);
        // A renewal never reaches past the limit.
        let recent = Claims {
            issued: unix(SystemTime::now()) - CONSOLE_LOGIN_MAX.as_secs() + 10,
            ..keys.verify(&token.value).unwrap()
        };
        let renewed = keys.token(recent, Duration::from_secs(60)).unwrap();
        assert!(renewed.expires <= SystemTime::now() + Duration::from_secs(11));
    }

    #[test]
    fn no_keys_means_local_admin() {
        let caller = Keys::new(&[]).caller(None).unwrap();
        assert!(caller.admin);
    }
}
