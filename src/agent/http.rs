//! What the real providers share: the API key (read from the environment, never shown),
//! one HTTP client per model, and the request loop that retries with backoff, watches the
//! stream for stalls and the request for its deadline, and stops at once on cancellation.
//!
//! The providers are thin clients on `reqwest` plus `eventsource-stream` for SSE framing,
//! not an SDK crate. The Rust SDKs for these APIs are either OpenAI-only with strict wire
//! types that reject what OpenAI-compatible servers (vLLM, llama.cpp, Ollama) send, or
//! unofficial for Anthropic; and none lets us retry only before the first event, honour
//! `retry-after-ms`, time out a stalled stream, and drop the connection on cancellation,
//! which is most of what this code is for. The wire format we need is small.

use std::fmt;
use std::time::Duration;

use eventsource_stream::{Event, EventStreamError, Eventsource};
use futures_util::{Stream, StreamExt};
use rand::Rng;
use reqwest::header::HeaderMap;
use reqwest::{RequestBuilder, Response, StatusCode};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::model::{ModelError, ModelEvent, ModelStream};
use super::ModelConfig;

/// The first wait of the exponential backoff; it doubles per retry up to [`BACKOFF_CAP`].
const BACKOFF_BASE: Duration = Duration::from_millis(500);
const BACKOFF_CAP: Duration = Duration::from_secs(8);
/// The longest `retry-after` we wait; a longer one is a give-up.
const RETRY_AFTER_CAP: Duration = Duration::from_secs(60);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How much of a provider's error message goes into a `ModelError`.
const MESSAGE_LIMIT: usize = 500;

/// An API key. `Debug` and `Display` never show it.
#[derive(Clone)]
pub struct Secret(String);

impl Secret {
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// `text` with every occurrence of the key masked: a provider may echo what it got.
    pub fn redact(&self, text: &str) -> String {
        text.replace(&self.0, "[redacted]")
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret([redacted])")
    }
}

/// Reads the key from the variable `env` names, at request time, so a rotated key is
/// picked up without a restart. Missing or empty: `model_auth_error` naming the variable.
pub fn read_key(provider: &str, env: &str) -> Result<Secret, ModelError> {
    match std::env::var(env) {
        Ok(key) if !key.trim().is_empty() => Ok(Secret(key.trim().to_string())),
        _ => Err(ModelError::new(
            "model_auth_error",
            format!("{provider}: the environment variable {env} that should hold the API key is not set"),
        )),
    }
}

/// The key in the variable `env` names, if the model names one (`None`: a server of the
/// user's own that takes no key).
pub fn optional_key(provider: &str, env: Option<&str>) -> Result<Option<Secret>, ModelError> {
    env.map(|env| read_key(provider, env)).transpose()
}

/// A model stream that is only `error`: a request that fails before it is sent.
pub fn failed(error: ModelError) -> ModelStream {
    Box::pin(futures_util::stream::once(async { Err(error) }))
}

/// Why one attempt failed, and whether another attempt may succeed.
#[derive(Debug)]
pub struct Failure {
    pub error: ModelError,
    pub retryable: bool,
    /// What the server asked us to wait (`retry-after-ms`, `retry-after`).
    pub wait: Option<Duration>,
}

impl Failure {
    pub fn fatal(code: &str, message: impl Into<String>) -> Failure {
        Failure { error: ModelError::new(code, message), retryable: false, wait: None }
    }

    pub fn retryable(code: &str, message: impl Into<String>) -> Failure {
        Failure { retryable: true, ..Failure::fatal(code, message) }
    }
}

/// What a provider decoded from one SSE event (or from the end of the body).
pub enum Step {
    More(Vec<ModelEvent>),
    /// The response is complete: these are its last events, `Stop` included.
    Done(Vec<ModelEvent>),
}

/// Turns a provider's SSE events into model events; one per attempt.
pub trait Decoder: Send + 'static {
    fn event(&mut self, event: &Event) -> Result<Step, Failure>;
    /// The body ended without the provider's end marker.
    fn end(&mut self) -> Result<Vec<ModelEvent>, Failure>;
}

/// The transport of one model: client, limits, retries.
pub struct Http {
    pub provider: &'static str,
    client: reqwest::Client,
    timeout: Duration,
    stall: Duration,
    max_retries: u32,
}

impl Http {
    pub fn new(provider: &'static str, config: &ModelConfig) -> Result<Http, String> {
        let timeout = Duration::from_secs(config.timeout_secs.max(1));
        let client = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT.min(timeout))
            .user_agent(concat!("turnlog/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| format!("cannot build the HTTP client: {e}"))?;
        Ok(Http {
            provider,
            client,
            timeout,
            stall: Duration::from_secs(config.stall_timeout_secs.max(1)),
            max_retries: config.max_retries,
        })
    }

    pub fn client(&self) -> &reqwest::Client {
        &self.client
    }

    /// Sends the request `build` makes (once per attempt) and streams the decoded events.
    /// A failure is retried only while nothing of the response has been yielded.
    pub fn stream<B, D, N>(
        &self,
        build: B,
        new_decoder: N,
        key: Option<Secret>,
        cancel: CancellationToken,
    ) -> ModelStream
    where
        B: Fn() -> RequestBuilder + Send + Sync + 'static,
        D: Decoder,
        N: Fn() -> D + Send + 'static,
    {
        let limits = Limits {
            provider: self.provider,
            deadline: Instant::now() + self.timeout,
            stall: self.stall,
            max_retries: self.max_retries,
        };
        Box::pin(async_stream::stream! {
            let mut attempt = 0;
            loop {
                let failure = {
                    let mut events =
                        std::pin::pin!(attempt_events(&limits, &build, new_decoder(), &cancel));
                    let mut yielded = false;
                    loop {
                        match events.next().await {
                            None => return,
                            Some(Ok(event)) => {
                                yielded = true;
                                yield Ok(event);
                            }
                            Some(Err(failure)) if yielded => {
                                yield Err(redacted(failure.error, key.as_ref()));
                                return;
                            }
                            Some(Err(failure)) => break failure,
                        }
                    }
                };
                let Some(wait) = limits.retry_wait(&failure, attempt) else {
                    yield Err(redacted(failure.error, key.as_ref()));
                    return;
                };
                tracing::warn!(
                    provider = limits.provider,
                    code = %failure.error.code,
                    attempt = attempt + 1,
                    wait_ms = wait.as_millis() as u64,
                    "model request failed; retrying"
                );
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = tokio::time::sleep(wait) => {}
                }
                attempt += 1;
            }
        })
    }
}

fn redacted(error: ModelError, key: Option<&Secret>) -> ModelError {
    match key {
        Some(key) => ModelError::new(error.code, key.redact(&error.message)),
        None => error,
    }
}

/// The limits of one model request, across its attempts.
struct Limits {
    provider: &'static str,
    deadline: Instant,
    stall: Duration,
    max_retries: u32,
}

impl Limits {
    /// How long to wait before the next attempt, or `None` to give up.
    fn retry_wait(&self, failure: &Failure, attempt: u32) -> Option<Duration> {
        if !failure.retryable || attempt >= self.max_retries {
            return None;
        }
        let wait = failure.wait.unwrap_or_else(|| backoff(attempt));
        let fits = Instant::now() + wait < self.deadline;
        (wait <= RETRY_AFTER_CAP && fits).then_some(wait)
    }

    fn timeout(&self) -> Failure {
        Failure::fatal("model_timeout_error", format!("{}: the model request took too long", self.provider))
    }
}

/// Exponential backoff with equal jitter: half the step fixed, half random, so that many
/// sessions failing together do not retry together.
fn backoff(attempt: u32) -> Duration {
    let step = BACKOFF_BASE.saturating_mul(1 << attempt.min(16)).min(BACKOFF_CAP);
    let half = step / 2;
    half + half.mul_f64(rand::rng().random::<f64>())
}

/// One attempt: send, check the status, then decode the SSE body until the response is
/// done, fails, or `cancel` fires (the stream then ends and the connection is dropped).
fn attempt_events<'a, B, D>(
    limits: &'a Limits,
    build: &'a B,
    mut decoder: D,
    cancel: &'a CancellationToken,
) -> impl Stream<Item = Result<ModelEvent, Failure>> + Send + 'a
where
    B: Fn() -> RequestBuilder + Send + Sync,
    D: Decoder,
{
    async_stream::stream! {
        let response = tokio::select! {
            _ = cancel.cancelled() => return,
            response = open(limits, build()) => response,
        };
        let response = match response {
            Ok(response) => response,
            Err(failure) => {
                yield Err(failure);
                return;
            }
        };
        let mut events = Box::pin(sse(limits, response));
        loop {
            let next = tokio::select! {
                _ = cancel.cancelled() => return,
                next = events.next() => next,
            };
            let step = match next {
                None => decoder.end().map(Step::Done),
                Some(Ok(event)) => decoder.event(&event),
                Some(Err(failure)) => Err(failure),
            };
            match step {
                Ok(Step::More(out)) => {
                    for event in out {
                        yield Ok(event);
                    }
                }
                Ok(Step::Done(out)) => {
                    for event in out {
                        yield Ok(event);
                    }
                    return;
                }
                Err(failure) => {
                    yield Err(failure);
                    return;
                }
            }
        }
    }
}

/// Sends the request and waits for a success status, within the deadline.
async fn open(limits: &Limits, request: RequestBuilder) -> Result<Response, Failure> {
    let sent = tokio::time::timeout_at(limits.deadline, request.send()).await;
    let response = match sent {
        Err(_) => return Err(limits.timeout()),
        Ok(Err(e)) => return Err(send_failure(limits.provider, &e)),
        Ok(Ok(response)) => response,
    };
    if response.status().is_success() {
        return Ok(response);
    }
    let status = response.status();
    let wait = retry_after(response.headers());
    let read = tokio::time::timeout(limits.stall, response.text());
    let body = read.await.ok().and_then(Result::ok).unwrap_or_default();
    Err(status_failure(limits.provider, status, &body, wait))
}

fn send_failure(provider: &str, error: &reqwest::Error) -> Failure {
    if error.is_timeout() {
        return Failure::retryable(
            "model_connection_error",
            format!("{provider}: connecting to the model server timed out"),
        );
    }
    // The source chain says why (refused, reset, DNS); the URL carries no secret.
    let mut why = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        why = format!("{why}: {cause}");
        source = cause.source();
    }
    Failure::retryable("model_connection_error", format!("{provider}: {why}"))
}

/// Maps an HTTP error status to a failure, with the provider's own message where it says
/// one (and never on auth errors, whose message may quote part of the key).
pub fn status_failure(provider: &str, status: StatusCode, body: &str, wait: Option<Duration>) -> Failure {
    let said = error_message(body);
    let what = format!("{provider} answered {status}");
    let with_said = if said.is_empty() { what.clone() } else { format!("{what}: {said}") };
    let (code, retryable, message) = match status.as_u16() {
        401 | 403 => ("model_auth_error", false, format!("{what}: the API key was refused")),
        400 | 413 if context_exceeded(body) => ("model_context_exceeded_error", false, with_said),
        429 => ("model_rate_limited_error", true, with_said),
        408 => ("model_timeout_error", true, with_said),
        409 | 500..=599 => ("model_overloaded_error", true, with_said),
        _ => ("model_request_error", false, with_said),
    };
    Failure { error: ModelError::new(code, message), retryable, wait }
}

/// Whether an error body says the request is longer than the model's context window, in
/// the words of llama.cpp (`exceed_context_size_error`), OpenAI (`context_length_exceeded`),
/// vLLM ("maximum context length") or Anthropic ("prompt is too long").
fn context_exceeded(body: &str) -> bool {
    let value: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
    let error = &value["error"];
    let named = |name: &str| error["type"] == name || error["code"] == name;
    let message = error_message(body).to_ascii_lowercase();
    named("exceed_context_size_error")
        || named("context_length_exceeded")
        || message.contains("maximum context length")
        || message.contains("prompt is too long")
}

/// The message in an error body: `{"error":{"message"}}` (OpenAI, Anthropic),
/// `{"error":"..."}` (Ollama), `{"message"}` (vLLM), else the start of the text.
pub fn error_message(body: &str) -> String {
    let value: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
    let said = value["error"]["message"]
        .as_str()
        .or_else(|| value["error"].as_str())
        .or_else(|| value["message"].as_str())
        .unwrap_or(body)
        .trim();
    let mut said = said.to_string();
    if said.len() > MESSAGE_LIMIT {
        let mut end = MESSAGE_LIMIT;
        while !said.is_char_boundary(end) {
            end -= 1;
        }
        said.truncate(end);
        said.push('…');
    }
    said
}

/// `retry-after-ms` (OpenAI) or `retry-after` in seconds or as an HTTP date.
pub fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if let Some(ms) = header("retry-after-ms").and_then(|v| v.trim().parse::<f64>().ok()) {
        return Duration::try_from_secs_f64(ms / 1000.0).ok();
    }
    let value = header("retry-after")?.trim();
    if let Ok(secs) = value.parse::<f64>() {
        return Duration::try_from_secs_f64(secs).ok();
    }
    let date = chrono::DateTime::parse_from_rfc2822(value).ok()?;
    let secs = (date.with_timezone(&chrono::Utc) - chrono::Utc::now()).num_milliseconds();
    Some(Duration::from_millis(secs.max(0) as u64))
}

/// The SSE events of a response body. A gap longer than the stall timeout between two
/// chunks, or the end of the request's deadline, is a `model_timeout_error`.
fn sse(limits: &Limits, response: Response) -> impl Stream<Item = Result<Event, Failure>> + Send {
    let provider = limits.provider;
    let stall = limits.stall;
    let deadline = limits.deadline;
    let mut body = response.bytes_stream();
    let chunks = async_stream::stream! {
        loop {
            let until = deadline.min(Instant::now() + stall);
            match tokio::time::timeout_at(until, body.next()).await {
                Err(_) if Instant::now() >= deadline => {
                    yield Err(Failure::fatal("model_timeout_error", format!("{provider}: the model request took too long")));
                    return;
                }
                Err(_) => {
                    // Not retried: the server may still be working on it, and a second
                    // stall would double the wait before the turn learns of it.
                    yield Err(Failure::fatal("model_timeout_error", format!("{provider}: the model stream stalled for {}s", stall.as_secs())));
                    return;
                }
                Ok(None) => return,
                Ok(Some(Ok(bytes))) => yield Ok(bytes),
                Ok(Some(Err(e))) => {
                    yield Err(Failure::retryable("model_connection_error", format!("{provider}: the model stream broke: {e}")));
                    return;
                }
            }
        }
    };
    chunks.eventsource().map(move |event| {
        event.map_err(|e| match e {
            EventStreamError::Transport(failure) => failure,
            EventStreamError::Utf8(e) => invalid_sse(provider, &e),
            EventStreamError::Parser(e) => invalid_sse(provider, &e),
        })
    })
}

fn invalid_sse(provider: &str, error: &dyn fmt::Display) -> Failure {
    Failure::fatal("model_response_error", format!("{provider}: the model stream is not valid SSE: {error}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;

    #[test]
    fn retry_after_reads_milliseconds_seconds_and_dates() {
        let mut headers = HeaderMap::new();
        assert_eq!(retry_after(&headers), None);
        headers.insert("retry-after", HeaderValue::from_static("2"));
        assert_eq!(retry_after(&headers), Some(Duration::from_secs(2)));
        headers.insert("retry-after-ms", HeaderValue::from_static("150"));
        assert_eq!(retry_after(&headers), Some(Duration::from_millis(150)));
        let mut dated = HeaderMap::new();
        dated.insert("retry-after", HeaderValue::from_static("Wed, 21 Oct 2015 07:28:00 GMT"));
        assert_eq!(retry_after(&dated), Some(Duration::ZERO));
    }

    #[test]
    fn backoff_grows_with_jitter_and_is_capped() {
        for attempt in 0..20 {
            let step = BACKOFF_BASE.saturating_mul(1 << attempt.min(16)).min(BACKOFF_CAP);
            let wait = backoff(attempt);
            assert!(wait >= step / 2 && wait <= step, "{attempt}: {wait:?}");
        }
    }

    #[test]
    fn statuses_map_to_codes_and_auth_errors_do_not_echo_the_body() {
        let code = |status: u16, body: &str| {
            let f = status_failure("p", StatusCode::from_u16(status).unwrap(), body, None);
            (f.error.code, f.retryable, f.error.message)
        };
        assert_eq!(code(429, "").0, "model_rate_limited_error");
        assert_eq!(code(529, "").0, "model_overloaded_error");
        assert!(code(503, "").1);
        let (c, retry, message) = code(401, r#"{"error":{"message":"bad key sk-12***"}}"#);
        assert_eq!((c.as_str(), retry), ("model_auth_error", false));
        assert!(!message.contains("sk-12"));
        let (c, retry, message) = code(400, r#"{"error":{"message":"messages: bad"}}"#);
        assert_eq!((c.as_str(), retry), ("model_request_error", false));
        assert!(message.ends_with("messages: bad"), "{message}");
    }

    #[test]
    fn a_request_past_the_context_window_has_its_own_code_in_every_servers_words() {
        let code = |body: &str| status_failure("p", StatusCode::BAD_REQUEST, body, None);
        // llama.cpp's llama-server 0.3.36, as it answered a prompt of 5,031 tokens.
        let llama = r#"{"error":{"code":400,"message":"request (5031 tokens) exceeds the available context size (2048 tokens), try increasing it","type":"exceed_context_size_error","n_prompt_tokens":5031,"n_ctx":2048}}"#;
        let openai = r#"{"error":{"message":"This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}"#;
        let vllm = r#"{"object":"error","message":"This model's maximum context length is 4096 tokens. However, you requested 5000 tokens.","type":"BadRequestError","code":400}"#;
        let anthropic = r#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 210000 tokens > 200000 maximum"}}"#;
        for body in [llama, openai, vllm, anthropic] {
            let failure = code(body);
            assert_eq!(
                (failure.error.code.as_str(), failure.retryable),
                ("model_context_exceeded_error", false),
                "{body}"
            );
        }
        let failure = code(llama);
        assert!(
            failure.error.message.contains("exceeds the available context size (2048 tokens)"),
            "{}",
            failure.error.message
        );
        assert_eq!(code(r#"{"error":{"message":"messages: bad"}}"#).error.code, "model_request_error");
    }

    #[test]
    fn error_messages_come_from_each_servers_shape() {
        assert_eq!(error_message(r#"{"error":{"message":"a"}}"#), "a");
        assert_eq!(error_message(r#"{"error":"b"}"#), "b");
        assert_eq!(error_message(r#"{"object":"error","message":"c"}"#), "c");
        assert_eq!(error_message("plain"), "plain");
        assert_eq!(error_message(&"é".repeat(400)).chars().count(), 251);
    }

    #[test]
    fn secrets_do_not_show() {
        let secret = Secret("sk-abc".into());
        assert_eq!(format!("{secret:?}"), "Secret([redacted])");
        assert_eq!(secret.redact("key sk-abc!"), "key [redacted]!");
    }
}
