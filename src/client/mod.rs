//! A typed client of a turnlog server's HTTP API, for the programs that drive one from
//! outside: the command line (`--server`), `turnlog acp --server`, the load harness and the
//! integration tests. It holds the server's address and the key (`Authorization: Bearer`),
//! reads the server's error shape once ([`ClientError`]), and follows a session's native
//! stream across drops ([`Follow`]).
//!
//! Verbs answer typed values. The `_raw` ones hand back the [`reqwest::Response`] unread
//! (its status checked), for a caller that reads the bytes itself, as the load harness
//! does on the paths it measures.

mod error;
mod follow;
mod wire;

use std::time::Duration;

use reqwest::{Method, RequestBuilder, Response};
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

pub use error::{ClientError, Refusal};
pub use follow::{Follow, Followed, Frame, Frames, Reconnect};
pub use wire::{
    AgentChoice, AgentMeta, AgentName, ImportStatus, ImportedSession, ModeMeta, ModelMeta, NewSession, Page, PageQuery,
    PromptArgumentMeta, PromptMeta, PromptsUnavailable, Session, SessionModels, SessionModes, SessionPage,
    SessionPrompts, SessionQuery, StreamFrom, ToolMeta, ToolTrust,
};

/// How long a keyed write is sent again while the server cannot store it (a restart, a
/// failover of the engine underneath).
pub const KEYED_RETRIES: Duration = Duration::from_secs(60);

/// A server's API, with a key.
#[derive(Clone)]
pub struct Client {
    base: String,
    key: Option<String>,
    http: reqwest::Client,
    /// A bound on each call that answers at once (none on streams).
    call_timeout: Option<Duration>,
}

impl Client {
    /// A client of the server at `base` (`http://127.0.0.1:8787`), with no timeouts.
    pub fn new(base: &str, key: Option<String>) -> Client {
        Client::with_http(base, key, reqwest::Client::new())
    }

    /// A client that makes its requests with `http` (its own timeouts, pool, ...).
    pub fn with_http(base: &str, key: Option<String>, http: reqwest::Client) -> Client {
        Client { base: base.trim_end_matches('/').to_string(), key, http, call_timeout: None }
    }

    /// Bounds each call but the streams to `timeout`.
    pub fn call_timeout(self, timeout: Duration) -> Client {
        Client { call_timeout: Some(timeout), ..self }
    }

    pub fn base(&self) -> &str {
        &self.base
    }

    /// A request of `path` with the key, for a route that has no verb here.
    pub fn request(&self, method: Method, path: &str) -> RequestBuilder {
        let request = self.http.request(method, format!("{}{path}", self.base));
        match &self.key {
            Some(key) => request.bearer_auth(key),
            None => request,
        }
    }

    /// A call that answers at once.
    fn call(&self, method: Method, path: &str) -> RequestBuilder {
        let request = self.request(method, path);
        match self.call_timeout {
            Some(timeout) => request.timeout(timeout),
            None => request,
        }
    }

    /// Sends `request`: the answer if it succeeded, else why not.
    pub async fn send(&self, request: RequestBuilder) -> Result<Response, ClientError> {
        let response =
            request.send().await.map_err(|error| ClientError::Unreachable { base: self.base.clone(), error })?;
        if response.status().is_success() {
            return Ok(response);
        }
        Err(ClientError::Refused(Refusal::read(response).await))
    }

    async fn json<T: DeserializeOwned>(&self, request: RequestBuilder) -> Result<T, ClientError> {
        self.send(request).await?.json().await.map_err(ClientError::Body)
    }

    /// The agents the caller may start sessions of (`GET /meta`).
    pub async fn agents(&self) -> Result<Vec<AgentMeta>, ClientError> {
        let meta: wire::Meta = self.json(self.call(Method::GET, "/meta")).await?;
        Ok(meta.agents)
    }

    /// Starts a session (`POST /sessions`); its id.
    pub async fn create_session(&self, new: &NewSession) -> Result<String, ClientError> {
        let created: wire::Created = self.json(self.call(Method::POST, "/sessions").json(new)).await?;
        Ok(created.session_id)
    }

    /// [`Client::create_session`] with an idempotency key, sent again (with it) while the
    /// server cannot be reached or answers that it could not store it, for up to
    /// [`KEYED_RETRIES`]: made once, whatever failed over in between.
    pub async fn create_session_keyed(&self, new: &NewSession, key: &str) -> Result<String, ClientError> {
        let send = || self.call(Method::POST, "/sessions").json(new);
        let created: wire::Created = self.keyed(send, key).await?.json().await.map_err(ClientError::Body)?;
        Ok(created.session_id)
    }

    /// [`Client::post_events`] with an idempotency key, sent again as
    /// [`Client::create_session_keyed`] is.
    pub async fn post_events_keyed<T: DeserializeOwned>(
        &self,
        session: &str,
        events: &[Value],
        key: &str,
    ) -> Result<Vec<T>, ClientError> {
        let body = serde_json::json!({ "events": events });
        let path = format!("/sessions/{session}/events");
        let send = || self.call(Method::POST, &path).json(&body);
        let stored: wire::Stored<T> = self.keyed(send, key).await?.json().await.map_err(ClientError::Body)?;
        Ok(stored.data)
    }

    /// Sends the request `build` makes with `Idempotency-Key: key` until it is answered
    /// with anything but "not now" (no connection, a 5xx), or for [`KEYED_RETRIES`].
    async fn keyed(&self, build: impl Fn() -> RequestBuilder, key: &str) -> Result<Response, ClientError> {
        let deadline = tokio::time::Instant::now() + KEYED_RETRIES;
        let mut pause = Duration::from_millis(100);
        loop {
            let sent = self.send(build().header("idempotency-key", key)).await;
            let again = sent.as_ref().is_err_and(ClientError::is_transient);
            if !again || tokio::time::Instant::now() + pause > deadline {
                return sent;
            }
            tracing::debug!(key, "a keyed request was not answered; sending it again");
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(2));
        }
    }

    /// Forks `session` at its event `at` (`POST /sessions/{id}/fork`), the fork's own
    /// `metadata` set over the source's; the fork's id. Not sent again: a fork has no key.
    pub async fn fork(&self, session: &str, at: &str, metadata: &Map<String, Value>) -> Result<String, ClientError> {
        let body = serde_json::json!({ "at": at, "metadata": metadata });
        let path = format!("/sessions/{session}/fork");
        let created: wire::Created = self.json(self.call(Method::POST, &path).json(&body)).await?;
        Ok(created.session_id)
    }

    /// Deletes the session (`DELETE /sessions/{id}`): its log is kept, for audit, and it
    /// is gone from every list and read.
    pub async fn delete_session(&self, session: &str) -> Result<(), ClientError> {
        self.send(self.call(Method::DELETE, &format!("/sessions/{session}"))).await.map(drop)
    }

    /// The session's mode and its agent's modes (`GET /sessions/{id}/mode`).
    pub async fn modes(&self, session: &str) -> Result<SessionModes, ClientError> {
        self.json(self.call(Method::GET, &format!("/sessions/{session}/mode"))).await
    }

    /// Changes the session's mode (`POST /sessions/{id}/mode`), sent again with its key as
    /// [`Client::create_session_keyed`] is; its modes then.
    pub async fn set_mode(&self, session: &str, mode: &str, key: &str) -> Result<SessionModes, ClientError> {
        let body = serde_json::json!({ "mode": mode });
        let path = format!("/sessions/{session}/mode");
        let send = || self.call(Method::POST, &path).json(&body);
        self.keyed(send, key).await?.json().await.map_err(ClientError::Body)
    }

    /// The session's model and those its agent offers (`GET /sessions/{id}/model`).
    pub async fn models(&self, session: &str) -> Result<SessionModels, ClientError> {
        self.json(self.call(Method::GET, &format!("/sessions/{session}/model"))).await
    }

    /// Changes the session's model (`POST /sessions/{id}/model`), sent again with its key
    /// as [`Client::create_session_keyed`] is; its models then.
    pub async fn set_model(&self, session: &str, model: &str, key: &str) -> Result<SessionModels, ClientError> {
        let body = serde_json::json!({ "model": model });
        let path = format!("/sessions/{session}/model");
        let send = || self.call(Method::POST, &path).json(&body);
        self.keyed(send, key).await?.json().await.map_err(ClientError::Body)
    }

    /// The prompts of the session's MCP servers (`GET /sessions/{id}/prompts`).
    pub async fn prompts(&self, session: &str) -> Result<SessionPrompts, ClientError> {
        self.json(self.call(Method::GET, &format!("/sessions/{session}/prompts"))).await
    }

    /// `server`'s prompt `name` written out from `arguments`
    /// (`POST /sessions/{id}/prompts/{server}/{prompt}`): the content of the user message
    /// it makes. Nothing is stored.
    pub async fn write_prompt(
        &self,
        session: &str,
        server: &str,
        name: &str,
        arguments: &std::collections::BTreeMap<String, String>,
    ) -> Result<Vec<crate::domain::Block>, ClientError> {
        let mut url = reqwest::Url::parse("http://path.only/").expect("a valid URL");
        url.path_segments_mut().expect("a base").extend(["sessions", session, "prompts", server, name]);
        let body = serde_json::json!({ "arguments": arguments });
        let written: wire::WrittenPrompt = self.json(self.call(Method::POST, url.path()).json(&body)).await?;
        Ok(written.content)
    }

    pub async fn session(&self, session: &str) -> Result<Session, ClientError> {
        self.json(self.call(Method::GET, &format!("/sessions/{session}"))).await
    }

    /// A page of sessions (`GET /sessions`).
    pub async fn sessions(&self, query: &SessionQuery) -> Result<SessionPage, ClientError> {
        self.json(self.call(Method::GET, "/sessions").query(query)).await
    }

    /// Appends `events` (`POST /sessions/{id}/events`); the stored events, once durable.
    pub async fn post_events<T: DeserializeOwned>(
        &self,
        session: &str,
        events: &[Value],
    ) -> Result<Vec<T>, ClientError> {
        let body = serde_json::json!({ "events": events });
        let path = format!("/sessions/{session}/events");
        let stored: wire::Stored<T> = self.json(self.call(Method::POST, &path).json(&body)).await?;
        Ok(stored.data)
    }

    /// Appends a body made by the caller (`{"events":[...]}`, JSON); the answer unread.
    pub async fn post_events_raw(
        &self,
        session: &str,
        body: impl Into<reqwest::Body>,
    ) -> Result<Response, ClientError> {
        let request = self.call(Method::POST, &format!("/sessions/{session}/events"));
        self.send(request.header("content-type", "application/json").body(body)).await
    }

    /// A page of the session's events (`GET /sessions/{id}/events`).
    pub async fn events<T: DeserializeOwned>(&self, session: &str, query: &PageQuery) -> Result<Page<T>, ClientError> {
        self.json(self.call(Method::GET, &format!("/sessions/{session}/events")).query(query)).await
    }

    /// Every event of the session, `page_size` at a time.
    pub async fn all_events<T: DeserializeOwned>(
        &self,
        session: &str,
        page_size: usize,
    ) -> Result<Vec<T>, ClientError> {
        let mut all = Vec::new();
        let mut query = PageQuery { limit: Some(page_size), after_id: None };
        loop {
            let page: Page<T> = self.events(session, &query).await?;
            all.extend(page.data);
            if !page.has_more {
                return Ok(all);
            }
            let last =
                page.last_id.ok_or_else(|| ClientError::Invalid("a page with more after it and no last_id".into()))?;
            query.after_id = Some(last);
        }
    }

    /// Opens the session's native stream (`GET /sessions/{id}/events/stream`); the answer
    /// unread. Every event as the log has it: no delta is merged into the next.
    pub async fn stream_raw(&self, session: &str, from: &StreamFrom) -> Result<Response, ClientError> {
        let path = format!("/sessions/{session}/events/stream?delta_flush_interval_ms=0");
        let request = self.request(Method::GET, &path);
        let request = match from {
            StreamFrom::Start => request,
            StreamFrom::AfterId(id) => request.query(&[("after_id", id)]),
            StreamFrom::LastEventId(id) => request.header("last-event-id", id),
        };
        self.send(request).await
    }

    /// The session's native stream as it comes, until it drops.
    pub async fn stream(&self, session: &str, from: &StreamFrom) -> Result<Frames, ClientError> {
        Ok(follow::frames(self.stream_raw(session, from).await?))
    }

    /// Follows the session's native stream after `after` (the start if `None`) until the
    /// session ends, opening it again after the last event seen whenever it drops, as
    /// `reconnect` says. Nothing is sent before the first [`Follow::next`] or
    /// [`Follow::connect`].
    pub fn follow(&self, session: &str, after: Option<String>, reconnect: Reconnect) -> Follow {
        Follow::new(self.clone(), session, after, reconnect)
    }

    /// The session as JSON Lines with its hash chain (`GET /sessions/{id}/export`).
    pub async fn export(&self, session: &str) -> Result<bytes::Bytes, ClientError> {
        let response = self.send(self.call(Method::GET, &format!("/sessions/{session}/export"))).await?;
        response.bytes().await.map_err(ClientError::Body)
    }

    /// Imports export lines (`POST /sessions/import`, an admin's call); what became of
    /// each session.
    pub async fn import(&self, lines: Vec<u8>) -> Result<Vec<ImportedSession>, ClientError> {
        let request = self.call(Method::POST, "/sessions/import").header("content-type", "application/x-ndjson");
        let answer: wire::ImportAnswer = self.json(request.body(lines)).await?;
        Ok(answer.sessions)
    }

    /// The session's events again at their original pace divided by `speed`, from event
    /// `from` on (`GET /sessions/{id}/replay`), until the last.
    pub async fn replay(&self, session: &str, speed: f64, from: Option<&str>) -> Result<Frames, ClientError> {
        let mut query = vec![("speed", speed.to_string())];
        query.extend(from.map(|from| ("from", from.to_string())));
        let request = self.request(Method::GET, &format!("/sessions/{session}/replay")).query(&query);
        Ok(follow::frames(self.send(request).await?))
    }

    /// Re-emits the session into a new one (`POST /sessions/{id}/replay`); its id.
    pub async fn replay_into(&self, session: &str, speed: f64, from: Option<&str>) -> Result<String, ClientError> {
        let body = serde_json::json!({"speed": speed, "from": from});
        let path = format!("/sessions/{session}/replay");
        let created: wire::Created = self.json(self.call(Method::POST, &path).json(&body)).await?;
        Ok(created.session_id)
    }

    /// The server's metrics, as Prometheus text (`GET /metrics`).
    pub async fn metrics(&self) -> Result<String, ClientError> {
        self.send(self.call(Method::GET, "/metrics")).await?.text().await.map_err(ClientError::Body)
    }
}
