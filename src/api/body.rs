//! Request bodies and query strings, with errors that name what was wrong: the field path
//! for a wrong type or a missing or unknown field, line and column for broken JSON, and
//! 413 for a body over the limit. Each extractor answers in the shape of its view's
//! renderer `R`.

use std::future::{ready, Ready};
use std::marker::PhantomData;

use actix_web::{dev::Payload, web, FromRequest, HttpRequest};
use futures_util::{future::LocalBoxFuture, StreamExt};
use serde::de::DeserializeOwned;

use super::error::{Error, Render, Standard};
use super::State;
use crate::domain::RequestKey;
use crate::error::{ApiError, Code};

/// Parses JSON, naming the failing field (`events[0].content`) in the error. Every body is
/// an object: serde would read a struct from an array too.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let first = bytes.iter().find(|b| !b.is_ascii_whitespace());
    if first.is_some_and(|b| *b != b'{') {
        return Err(ApiError::invalid("invalid body: a JSON object is required"));
    }
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|error| {
        let mut path = error.path().to_string();
        let inner = error.into_inner();
        let mut message = inner.to_string();
        // A field read by `objects` names where inside it the error is.
        if let Some((within, rest)) = message.strip_prefix(WITHIN).and_then(|m| m.split_once("` ")) {
            let dot = if within.starts_with('[') { "" } else { "." };
            (path, message) = (format!("{path}{dot}{within}"), rest.to_string());
        }
        if inner.is_syntax() || inner.is_eof() {
            ApiError::new(Code::InvalidJson, format!("the body is not valid JSON: {inner}"))
        } else if path == "." {
            ApiError::invalid(format!("invalid body: {message}"))
        } else {
            ApiError::invalid(format!("invalid field `{path}`: {message}"))
        }
    })?;
    de.end().map_err(|e| ApiError::new(Code::InvalidJson, format!("the body is not valid JSON: {e}")))?;
    Ok(value)
}

/// A field that holds an object, or a list of objects (or null), as the field's type reads
/// it: serde would read a struct from an array, and `[null, null]` is no agent.
pub fn objects<'de, D: serde::Deserializer<'de>, T: DeserializeOwned>(d: D) -> Result<T, D::Error> {
    use serde::de::Error as _;
    use serde::Deserialize as _;
    use serde_json::Value;
    let value = Value::deserialize(d)?;
    let shaped = match &value {
        Value::Null | Value::Object(_) => true,
        Value::Array(items) => items.iter().all(Value::is_object),
        _ => false,
    };
    if !shaped {
        return Err(D::Error::custom(format!("expected an object or a list of objects, got {value}")));
    }
    serde_path_to_error::deserialize(value).map_err(|error| match error.path().to_string().as_str() {
        "." => D::Error::custom(error.into_inner()),
        within => D::Error::custom(format!("{WITHIN}{within}` {}", error.into_inner())),
    })
}

/// A list of objects tagged by `field` (`role`, `type`), each read only if its tag is a
/// string: serde reads an internally tagged enum's tag from a number too (as the variant's
/// index), and `{"type": 0}` is no text block.
pub fn tagged<'de, D: serde::Deserializer<'de>, T: DeserializeOwned>(d: D, field: &str) -> Result<Vec<T>, D::Error> {
    use serde::de::Error as _;
    use serde::Deserialize as _;
    use serde_json::Value;
    let items = Vec::<Value>::deserialize(d)?;
    let at = |i: usize, path: &str| match path {
        "." => format!("{WITHIN}[{i}]`"),
        path => format!("{WITHIN}[{i}].{path}`"),
    };
    let read = |(i, item): (usize, Value)| {
        if !item.get(field).is_some_and(Value::is_string) {
            return Err(D::Error::custom(format!("{} `{field}` must be a string", at(i, "."))));
        }
        serde_path_to_error::deserialize(item)
            .map_err(|error| D::Error::custom(format!("{} {}", at(i, &error.path().to_string()), error.into_inner())))
    };
    items.into_iter().enumerate().map(read).collect()
}

/// An integer of a body, as JSON has them: `3` or `3.0` (a number with no fraction is an
/// integer to JSON Schema, and to clients that write every number as a float), or null.
pub fn integer<'de, D: serde::Deserializer<'de>, N: TryFrom<u64>>(d: D) -> Result<Option<N>, D::Error> {
    use serde::de::Error as _;
    use serde::Deserialize as _;
    let Some(number) = Option::<serde_json::Number>::deserialize(d)? else { return Ok(None) };
    let whole = match (number.as_u64(), number.as_f64()) {
        (Some(n), _) => Some(n),
        (None, Some(f)) if f.fract() == 0.0 && (0.0..=u64::MAX as f64).contains(&f) => Some(f as u64),
        _ => None,
    };
    let invalid = || D::Error::custom(format!("invalid value: {number}, expected a whole number in range"));
    whole.ok_or_else(invalid).and_then(|n| N::try_from(n).map_err(|_| invalid())).map(Some)
}

/// How `objects` tells `parse_json` the path inside its field.
const WITHIN: &str = "within `";

/// A JSON body read up to `server.max_body_bytes`, and the request's idempotency key.
pub struct JsonBody<T, R: Render = Standard>(pub T, pub PhantomData<fn() -> R>, Option<RequestKey>);

impl<T, R: Render> JsonBody<T, R> {
    /// The request's `Idempotency-Key`, fingerprinted with its method, path and body.
    pub fn request_key(&self) -> Option<RequestKey> {
        self.2.clone()
    }
}

/// The header a client names a write with, so that sending it again does it once.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// The request's `Idempotency-Key`, if it has one, fingerprinted with its method, path
/// (and query) and `body`; 400 for a key that is not 1 to 255 visible characters.
pub fn request_key(req: &HttpRequest, body: &[u8]) -> Result<Option<RequestKey>, ApiError> {
    let Some(header) = req.headers().get(IDEMPOTENCY_KEY) else { return Ok(None) };
    let key = header.to_str().map_err(|_| ApiError::invalid("invalid header `Idempotency-Key`: not visible ASCII"))?;
    let target = req.uri().path_and_query().map_or(req.path(), |p| p.as_str());
    RequestKey::new(key, req.method().as_str(), target, body).map(Some).map_err(ApiError::invalid)
}

impl<T: DeserializeOwned + 'static, R: Render> FromRequest for JsonBody<T, R> {
    type Error = Error<R>;
    type Future = LocalBoxFuture<'static, Result<Self, Error<R>>>;

    fn from_request(req: &HttpRequest, payload: &mut Payload) -> Self::Future {
        let read = read_limited(req, payload);
        let req = req.clone();
        Box::pin(async move {
            let body = read.await.map_err(Error::new)?;
            let key = request_key(&req, &body).map_err(Error::new)?;
            if body.is_empty() {
                return Err(Error::new(ApiError::new(
                    Code::InvalidJson,
                    "the body is empty; a JSON object is expected",
                )));
            }
            parse_json(&body).map(|body| JsonBody(body, PhantomData, key)).map_err(Error::new)
        })
    }
}

/// A body as it came, read up to `server.max_body_bytes`.
pub struct RawBody<R: Render = Standard>(pub web::Bytes, pub PhantomData<fn() -> R>);

impl<R: Render> FromRequest for RawBody<R> {
    type Error = Error<R>;
    type Future = LocalBoxFuture<'static, Result<Self, Error<R>>>;

    fn from_request(req: &HttpRequest, payload: &mut Payload) -> Self::Future {
        let read = read_limited(req, payload);
        Box::pin(async move { read.await.map(|body| RawBody(body.freeze(), PhantomData)).map_err(Error::new) })
    }
}

/// Reads the body, refusing one larger than `server.max_body_bytes` (by its declared length
/// at once, else as it comes) and one that has not all come within `server.body_timeout_ms`
/// (a client that never finishes its body holds nothing for long).
fn read_limited(req: &HttpRequest, payload: &mut Payload) -> LocalBoxFuture<'static, Result<web::BytesMut, ApiError>> {
    let (limit, timeout) = req
        .app_data::<State>()
        .map_or((1 << 20, 30_000), |s| (s.settings.server.max_body_bytes, s.settings.server.body_timeout_ms));
    let declared =
        req.headers().get("content-length").and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<usize>().ok());
    // Kept to name its route if its body times out (matched then: matching costs).
    let request = req.clone();
    let mut payload = payload.take();
    Box::pin(async move {
        let too_large =
            || ApiError::new(Code::PayloadTooLarge, format!("the body is larger than the limit of {limit} bytes"));
        if declared.is_some_and(|n| n > limit) {
            return Err(too_large());
        }
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_millis(timeout);
        let mut body = web::BytesMut::new();
        loop {
            let Ok(next) = tokio::time::timeout_at(deadline, payload.next()).await else {
                crate::metrics::CLIENTS_CUT_OFF.with_label_values(&["body_timeout"]).inc();
                let route = request.match_pattern().unwrap_or_default();
                tracing::warn!(%route, received = body.len(), declared, "cut off a request whose body did not arrive in {timeout} ms");
                return Err(ApiError::new(
                    Code::RequestTimeout,
                    format!("the body did not arrive within {timeout} ms (server.body_timeout_ms)"),
                ));
            };
            let Some(chunk) = next else { break };
            let chunk = chunk.map_err(|e| ApiError::invalid(format!("could not read the body: {e}")))?;
            if body.len() + chunk.len() > limit {
                return Err(too_large());
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body)
    })
}

/// A query string, with bracket arrays (`types[]=a&types[]=b`) as some clients send them.
pub struct Query<T, R: Render = Standard>(pub T, pub PhantomData<fn() -> R>);

impl<T: DeserializeOwned, R: Render> FromRequest for Query<T, R> {
    type Error = Error<R>;
    type Future = Ready<Result<Self, Error<R>>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        ready(parse_query(req.query_string()).map(|query| Query(query, PhantomData)).map_err(Error::new))
    }
}

/// Parses a query string, naming the failing parameter.
pub fn parse_query<T: DeserializeOwned>(query: &str) -> Result<T, ApiError> {
    // Not strict: clients percent-encode the brackets (`types%5B%5D=`).
    let config = serde_qs::Config::new(5, false);
    let query = repeated_as_brackets(query);
    let de = serde_qs::Deserializer::with_config(&config, query.as_bytes())
        .map_err(|e| ApiError::invalid(format!("invalid query string: {e}")))?;
    serde_path_to_error::deserialize(de).map_err(|error| {
        let path = error.path().to_string();
        let inner = error.into_inner();
        if path == "." {
            ApiError::invalid(format!("invalid query string: {inner}"))
        } else {
            ApiError::invalid(format!("invalid query `{path}`: {inner}"))
        }
    })
}

/// `key=a&key=b` (a list as OpenAPI's form style sends it) as `key[]=a&key[]=b`, which is
/// how serde_qs reads a list; a key given once stays as it is.
fn repeated_as_brackets(query: &str) -> std::borrow::Cow<'_, str> {
    let key = |pair: &str| pair.split_once('=').map_or(pair, |(key, _)| key).to_string();
    let mut seen = std::collections::HashMap::<String, usize>::new();
    for pair in query.split('&') {
        *seen.entry(key(pair)).or_default() += 1;
    }
    if seen.iter().all(|(key, n)| *n == 1 || key.contains('[') || key.contains('%')) {
        return query.into();
    }
    let pairs: Vec<String> = query
        .split('&')
        .map(|pair| {
            let key = key(pair);
            match seen[&key] > 1 && !key.contains('[') && !key.contains('%') && !key.is_empty() {
                true => format!("{key}[]{}", &pair[key.len()..]),
                false => pair.to_string(),
            }
        })
        .collect();
    pairs.join("&").into()
}

/// A list in a query string, as clients send one: `key[]=a&key[]=b` (or indexed), `key=a`,
/// or `key=a&key=b`; an empty value is no value.
pub fn query_list<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    use serde::Deserialize as _;
    #[derive(serde::Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
    }
    let list = match OneOrMany::deserialize(d)? {
        OneOrMany::One(one) => vec![one],
        OneOrMany::Many(many) => many,
    };
    Ok(list.into_iter().filter(|value| !value.is_empty()).collect())
}

/// `order=asc|desc`: whether newest first (`default` when absent).
pub fn newest_first(order: Option<&str>, default: bool) -> Result<bool, ApiError> {
    match order {
        None => Ok(default),
        Some("asc") => Ok(false),
        Some("desc") => Ok(true),
        Some(other) => Err(ApiError::invalid(format!("invalid query `order`: {other:?} is not asc or desc"))),
    }
}

/// An RFC 3339 time from query parameter `name`, as stored (UTC, microseconds), so that
/// times compare as text.
pub fn utc_time(name: &str, time: &str) -> Result<String, ApiError> {
    chrono::DateTime::parse_from_rfc3339(time)
        .map(|t| t.with_timezone(&chrono::Utc).to_rfc3339_opts(chrono::SecondsFormat::Micros, true))
        .map_err(|e| ApiError::invalid(format!("invalid query `{name}`: not an RFC 3339 time: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    struct Listed {
        #[serde(default, deserialize_with = "query_list")]
        types: Vec<String>,
    }

    fn types(query: &str) -> Vec<String> {
        parse_query::<Listed>(query).unwrap().types
    }

    #[test]
    fn a_query_list_takes_every_form_clients_send() {
        assert_eq!(types("types[]=a&types[]=b"), ["a", "b"]);
        assert_eq!(types("types%5B%5D=a&types%5B%5D=b"), ["a", "b"]);
        assert_eq!(types("types[0]=a&types[1]=b"), ["a", "b"]);
        assert_eq!(types("types=a"), ["a"]);
        assert_eq!(types("types=a&types=b"), ["a", "b"]);
        assert!(types("types=").is_empty());
        assert!(types("types[]=").is_empty());
        assert!(types("").is_empty());
    }
}
