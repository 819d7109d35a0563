//! The way `turnlog acp` reaches the session layer: in this process ([`Embedded`], on a
//! data dir) or through a running server's HTTP API ([`Bridge`]). Both speak in domain
//! terms (input in, decoded log events out), so the ACP view above is the same for both.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures_util::stream::BoxStream;
use futures_util::StreamExt;
use serde_json::{json, Map, Value};

use crate::agent::mcp::McpServerConfig;
use crate::client::{
    AgentChoice, Client, ClientError, Followed, NewSession, PageQuery, Reconnect, SessionQuery, ToolTrust,
};
use crate::domain::event::{AgentSpec, ClientTool, SessionSpec};
use crate::domain::{Block, Event, EventId, RequestKey};
use crate::service::Service;
use crate::session::{
    rules, Caller, Cursor, EventQuery, Input, ListFilter, McpPrompt, McpPromptArgument, ModeInfo, ModelInfo, Models,
    Modes, SessionError, SessionPrompts, Submission, Unavailable,
};

/// The metadata key of the working directory an ACP client gave `session/new`.
pub const CWD: &str = "acp_cwd";

/// What the session layer answered, in the terms the ACP view renders.
#[derive(Debug, thiserror::Error)]
pub enum DoorError {
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Invalid(String),
    /// A turn runs, and the input needs the session idle.
    #[error("{0}")]
    Busy(String),
    /// The session's state refuses the input (calls wait, a call is not waiting, ...).
    #[error("{0}")]
    Refused(String),
    #[error("{0}")]
    Unauthorized(String),
    #[error("{0}")]
    Unavailable(String),
}

impl From<SessionError> for DoorError {
    fn from(error: SessionError) -> Self {
        let message = error.to_string();
        match error {
            SessionError::NotFound(_) | SessionError::TurnNotFound { .. } | SessionError::CatalogNotFound(_) => {
                DoorError::NotFound(message)
            }
            SessionError::Invalid(_)
            | SessionError::Limit(_)
            | SessionError::TooLarge(_)
            | SessionError::UnknownCursor(_)
            | SessionError::KeyReused(_) => DoorError::Invalid(message),
            SessionError::Busy(_) => DoorError::Busy(message),
            SessionError::Conflict(_) | SessionError::PreviousTurn(_) | SessionError::Forbidden(_) => {
                DoorError::Refused(message)
            }
            SessionError::ShuttingDown
            | SessionError::Storage(_)
            | SessionError::Unavailable(_)
            | SessionError::FateUnknown(_) => DoorError::Unavailable(message),
        }
    }
}

pub type Events = BoxStream<'static, Result<Event, DoorError>>;

/// A session as `session/list` shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct Listed {
    pub id: String,
    pub title: Option<String>,
    /// The working directory an ACP client made it in (metadata `acp_cwd`); other views'
    /// sessions have none.
    pub cwd: Option<String>,
    pub updated_at: Option<String>,
}

/// Sessions per `session/list` page.
const LIST_PAGE: usize = 50;

#[async_trait]
pub trait Door: Send + Sync + 'static {
    /// Starts a session of `agent`, with `metadata`, the tools the client runs (the
    /// editor's) and the MCP servers the client declared for it; its id. `key` names the request (see [`write_key`]): asked again
    /// with it, the session it made is answered.
    async fn create(
        &self,
        agent: &str,
        metadata: Map<String, Value>,
        tools: Vec<ClientTool>,
        mcp: McpDeclared,
        key: &str,
    ) -> Result<String, DoorError>;
    /// Gives the session the MCP servers the client declared (none: it has none).
    async fn attach_mcp(&self, session: &str, mcp: McpDeclared) -> Result<(), DoorError>;
    /// Every event of the session, in log order (deltas left out).
    async fn events(&self, session: &str) -> Result<Vec<Event>, DoorError>;
    /// Stores input; the events it stored. `key` names the write (see [`write_key`]): sent
    /// again with it, it is stored once.
    async fn submit(&self, session: &str, inputs: Vec<Input>, key: &str) -> Result<Vec<Event>, DoorError>;
    /// The session's events after `after`, then live ones as they are stored.
    async fn follow(&self, session: &str, after: EventId) -> Result<Events, DoorError>;
    /// A page of the sessions of `agent`, newest first, after the session `after`; and the
    /// cursor of the next page, if there is one.
    async fn list(&self, agent: &str, after: Option<&str>) -> Result<(Vec<Listed>, Option<String>), DoorError>;
    /// A new session whose conversation is `session`'s up to its event `at` (turnlog's
    /// fork), with `metadata` set over the source's; its id.
    async fn fork(&self, session: &str, at: EventId, metadata: Map<String, Value>) -> Result<String, DoorError>;
    /// Deletes the session: what runs in it is cancelled, its log kept (for audit), and it
    /// is gone from lists and reads.
    async fn delete(&self, session: &str) -> Result<(), DoorError>;
    /// The session's mode and the modes it may change to (`None`: its agent has none).
    async fn modes(&self, session: &str) -> Result<Option<Modes>, DoorError>;
    /// Changes the session's mode (from its next turn on); its modes then. `key` names the
    /// write (see [`write_key`]).
    async fn set_mode(&self, session: &str, mode: &str, key: &str) -> Result<Modes, DoorError>;
    /// The session's model and those its agent offers.
    async fn models(&self, session: &str) -> Result<Models, DoorError>;
    /// Changes the session's model (from its next turn on); its models then. `key` names
    /// the write (see [`write_key`]).
    async fn set_model(&self, session: &str, model: &str, key: &str) -> Result<Models, DoorError>;
    /// The prompts of the session's MCP servers, and those that cannot be reached now.
    async fn prompts(&self, session: &str) -> Result<SessionPrompts, DoorError>;
    /// `server`'s prompt `name` written out from `arguments`: the content of the user
    /// message it makes (nothing is stored).
    async fn write_prompt(
        &self,
        session: &str,
        server: &str,
        name: &str,
        arguments: &BTreeMap<String, String>,
    ) -> Result<Vec<Block>, DoorError>;
}

/// The idempotency key of a write the ACP view makes: the connection's and the JSON-RPC
/// request's ids (a request is one write), or a fresh id for a write no request names (an
/// interrupt, an answer to the client's permission prompt). Over the bridge, the key makes
/// the HTTP retries of a write (a server restarting, failing over) safe.
pub fn write_key(connection: &ulid::Ulid, request: Option<&dyn std::fmt::Display>) -> String {
    match request {
        Some(id) => format!("acp-{connection}-{id}"),
        None => format!("acp-{connection}-{}", ulid::Ulid::new()),
    }
}

/// MCP servers a client declared for a session, by name.
pub type McpDeclared = BTreeMap<String, McpServerConfig>;

/// The engine in this process, as the local admin (as a server with no keys sees it).
pub struct Embedded {
    service: Arc<Service>,
    caller: Caller,
}

impl Embedded {
    pub fn new(service: Arc<Service>) -> Embedded {
        Embedded { service, caller: Caller { subject: "local".into(), admin: true } }
    }
}

fn decoded(raw: &crate::domain::RawEvent) -> Result<Event, DoorError> {
    raw.decode().map_err(|e| DoorError::Unavailable(format!("event {} does not decode: {e}", raw.id)))
}

#[async_trait]
impl Door for Embedded {
    async fn list(&self, agent: &str, after: Option<&str>) -> Result<(Vec<Listed>, Option<String>), DoorError> {
        let after = match after {
            Some(cursor) => Some(
                cursor
                    .parse()
                    .map_err(|_| DoorError::Invalid(format!("cursor {cursor:?} is not one of this agent's")))?,
            ),
            None => None,
        };
        let filter = ListFilter {
            agent: Some(agent.to_string()),
            archived: Some(false),
            after,
            limit: LIST_PAGE,
            ..ListFilter::default()
        };
        let page = self.service.sessions().list(&self.caller, &filter).await?;
        let next = if page.has_more { page.items.last().map(|s| s.id.to_string()) } else { None };
        let listed = page
            .items
            .into_iter()
            .map(|s| Listed {
                id: s.id.to_string(),
                cwd: s.spec.metadata.get(CWD).and_then(Value::as_str).map(str::to_string),
                title: s.spec.title,
                updated_at: Some(s.updated_at),
            })
            .collect();
        Ok((listed, next))
    }

    async fn create(
        &self,
        agent: &str,
        metadata: Map<String, Value>,
        tools: Vec<ClientTool>,
        mcp: McpDeclared,
        key: &str,
    ) -> Result<String, DoorError> {
        let sessions = self.service.sessions();
        let declared = serde_json::to_string(&tools).map_err(|e| DoorError::Invalid(e.to_string()))?;
        let request = RequestKey::derived(
            key.to_string(),
            &[agent.as_bytes(), Value::Object(metadata.clone()).to_string().as_bytes(), declared.as_bytes()],
        );
        let configured = sessions.agents().get(agent).ok_or_else(|| {
            let known: Vec<String> = sessions.agents().all().iter().map(|a| a.name.clone()).collect();
            DoorError::Unavailable(format!("no agent named {agent:?} (--agent); the config has: {}", known.join(", ")))
        })?;
        // An editor has no say in which server tools run: the agent runs as configured.
        let (client_tools, tools) = (tools, rules::configured_tools(&configured, &sessions.agents().tools));
        let spec = SessionSpec {
            agent: AgentSpec { name: agent.to_string(), tools, ..AgentSpec::default() },
            tools: client_tools,
            metadata,
            ..SessionSpec::default()
        };
        Ok(sessions.create_with_mcp(&self.caller, spec, mcp, Some(&request)).await?.id.to_string())
    }

    /// The editor's servers run here, as the user who started this process.
    async fn attach_mcp(&self, session: &str, mcp: McpDeclared) -> Result<(), DoorError> {
        Ok(self.service.sessions().attach_mcp(&self.caller, session, mcp).await?)
    }

    async fn events(&self, session: &str) -> Result<Vec<Event>, DoorError> {
        let sessions = self.service.sessions();
        let summary = sessions.get(&self.caller, session).await?;
        let mut out = Vec::new();
        let mut after = None;
        loop {
            let query = EventQuery { after, limit: 1000, ..EventQuery::default() };
            let page = sessions.events(&summary, query).await?;
            after = page.events.last().map(|e| Cursor::Event(e.id));
            for raw in page.events.iter().filter(|e| !e.is_delta()) {
                out.push(decoded(raw)?);
            }
            if !page.has_more {
                return Ok(out);
            }
        }
    }

    async fn submit(&self, session: &str, inputs: Vec<Input>, key: &str) -> Result<Vec<Event>, DoorError> {
        let sessions = self.service.sessions();
        let summary = sessions.get(&self.caller, session).await?;
        let asked = serde_json::to_vec(&inputs).map_err(|e| DoorError::Invalid(e.to_string()))?;
        let request = Some(RequestKey::derived(key.to_string(), &[session.as_bytes(), &asked]));
        let submitted = sessions.submit(&summary, Submission { inputs, request, ..Submission::default() }).await?;
        submitted.events.iter().map(decoded).collect()
    }

    async fn delete(&self, session: &str) -> Result<(), DoorError> {
        Ok(self.service.sessions().delete(&self.caller, session).await?)
    }

    async fn modes(&self, session: &str) -> Result<Option<Modes>, DoorError> {
        let sessions = self.service.sessions();
        Ok(sessions.modes(&sessions.get(&self.caller, session).await?)?)
    }

    async fn set_mode(&self, session: &str, mode: &str, key: &str) -> Result<Modes, DoorError> {
        let sessions = self.service.sessions();
        let summary = sessions.get(&self.caller, session).await?;
        let request = RequestKey::derived(key.to_string(), &[session.as_bytes(), mode.as_bytes()]);
        Ok(sessions.set_mode(&summary, mode, Some(request)).await?)
    }

    async fn models(&self, session: &str) -> Result<Models, DoorError> {
        let sessions = self.service.sessions();
        Ok(sessions.models(&sessions.get(&self.caller, session).await?)?)
    }

    async fn prompts(&self, session: &str) -> Result<SessionPrompts, DoorError> {
        let sessions = self.service.sessions();
        Ok(sessions.prompts(&sessions.get(&self.caller, session).await?).await?)
    }

    async fn write_prompt(
        &self,
        session: &str,
        server: &str,
        name: &str,
        arguments: &BTreeMap<String, String>,
    ) -> Result<Vec<Block>, DoorError> {
        let sessions = self.service.sessions();
        let summary = sessions.get(&self.caller, session).await?;
        Ok(sessions.write_prompt(&summary, server, name, arguments).await?)
    }

    async fn set_model(&self, session: &str, model: &str, key: &str) -> Result<Models, DoorError> {
        let sessions = self.service.sessions();
        let summary = sessions.get(&self.caller, session).await?;
        let request = RequestKey::derived(key.to_string(), &[session.as_bytes(), b"model", model.as_bytes()]);
        Ok(sessions.set_model(&summary, model, Some(request)).await?)
    }

    async fn fork(&self, session: &str, at: EventId, metadata: Map<String, Value>) -> Result<String, DoorError> {
        let source = self.service.sessions().get(&self.caller, session).await?;
        let forked = self.service.audit().fork(&self.caller, &source, &at.to_string(), None, metadata).await?;
        Ok(forked.id.to_string())
    }

    async fn follow(&self, session: &str, after: EventId) -> Result<Events, DoorError> {
        let sessions = self.service.sessions();
        let summary = sessions.get(&self.caller, session).await?;
        let mut follower = sessions.follow(&summary, Some(Cursor::Event(after))).await?;
        Ok(async_stream::stream! {
            loop {
                match follower.next().await {
                    Ok(Some(batch)) => {
                        for raw in &batch {
                            yield decoded(raw);
                        }
                    }
                    Ok(None) => break,
                    Err(error) => {
                        yield Err(DoorError::Unavailable(error.to_string()));
                        break;
                    }
                }
            }
        }
        .boxed())
    }
}

/// A running turnlog server, through its HTTP API ([`Client`]): sessions are made with
/// the turn API (`POST /sessions`, with the agent's tools from `GET /meta`), input is
/// posted and the log read and followed through the native event API.
#[derive(Clone)]
pub struct Bridge {
    client: Client,
}

/// How a dropped stream is opened again: a second apart, 30 times, before the prompt that
/// follows it fails.
const RECONNECT: Reconnect =
    Reconnect { pause: Duration::from_secs(1), max_pause: Duration::from_secs(1), attempts: Some(30) };

impl Bridge {
    pub fn new(base: &str, key: Option<String>) -> Result<Bridge, DoorError> {
        // A stream that stays silent past three heartbeats is dead (a half-open connection
        // after a sleep): reading it fails, and it is opened again.
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .read_timeout(Duration::from_secs(45))
            .build()
            .map_err(|e| DoorError::Unavailable(format!("an HTTP client: {e}")))?;
        Ok(Bridge { client: Client::with_http(base, key, http).call_timeout(Duration::from_secs(30)) })
    }
}

/// What the server answered, by its status.
impl From<ClientError> for DoorError {
    fn from(error: ClientError) -> DoorError {
        let refusal = match error {
            ClientError::Refused(refusal) => refusal,
            ClientError::Unreachable { base, error } => {
                return DoorError::Unavailable(format!("turnlog server {base} is unreachable: {error}"))
            }
            ClientError::GaveUp { .. } => return DoorError::Unavailable("the server's event stream is gone".into()),
            other => return DoorError::Unavailable(format!("the server's answer: {}", with_causes(&other))),
        };
        let message = refusal.message().to_string();
        match refusal.status.as_u16() {
            404 => DoorError::NotFound(message),
            400 | 413 | 422 => DoorError::Invalid(message),
            401 => DoorError::Unauthorized(format!("the server refused the API key: {message}")),
            403 => DoorError::Refused(message),
            409 if refusal.is("turn_running") => DoorError::Busy(message),
            409 | 412 => DoorError::Refused(message),
            _ => DoorError::Unavailable(format!("the server answered {}: {message}", refusal.status)),
        }
    }
}

/// An error and what caused it (a body that does not decode says where), one after another.
fn with_causes(error: &dyn std::error::Error) -> String {
    let mut said = error.to_string();
    let mut cause = error.source();
    while let Some(error) = cause {
        said = format!("{said}: {error}");
        cause = error.source();
    }
    said
}

/// Only ids go into paths: anything else names no session.
fn session_id(session: &str) -> Result<String, DoorError> {
    match session.parse::<crate::domain::SessionId>() {
        Ok(id) => Ok(id.to_string()),
        Err(_) => Err(DoorError::NotFound(format!("session {session} not found"))),
    }
}

/// An input as the native event API takes it.
fn native(input: Input) -> Value {
    match input {
        Input::Message(content) => json!({"type": "user.message", "content": content}),
        Input::Permission { call, granted, reason, remember } => {
            let mut event = json!({
                "type": "user.tool_confirmation",
                "tool_use_id": call,
                "result": if granted { "allow" } else { "deny" },
            });
            if let Some(reason) = reason {
                event["deny_message"] = json!(reason);
            }
            // Only when set: a server older than the field refuses it.
            if remember {
                event["remember"] = json!(true);
            }
            event
        }
        Input::Result { call, content, is_error, ran } => {
            let mut event = json!({"type": "user.custom_tool_result", "custom_tool_use_id": call, "content": content, "is_error": is_error});
            // Only when set: a server older than the field refuses it.
            if let Some(ran) = ran {
                event["ran"] = json!(ran);
            }
            event
        }
        Input::Outcome(outcome) => json!({"type": "user.define_outcome", "outcome": outcome}),
        Input::Interrupt | Input::Cancel => json!({"type": "user.interrupt"}),
        Input::Compact => json!({"type": "user.compact"}),
    }
}

/// A session's modes as the server's mode route gives them.
fn modes(answer: crate::client::SessionModes) -> Option<Modes> {
    let available = answer
        .modes
        .into_iter()
        .map(|mode| ModeInfo { id: mode.id, name: mode.name, description: mode.description })
        .collect();
    Some(Modes { current: answer.mode?, available })
}

/// A session's models as the server's model route gives them.
fn models(answer: crate::client::SessionModels) -> Models {
    let available = answer.models.into_iter().map(|model| ModelInfo { id: model.id, name: model.name }).collect();
    Models { current: answer.model, available }
}

/// A prompt as the server's prompts route lists it.
fn prompt(listed: crate::client::PromptMeta) -> McpPrompt {
    let arguments = listed.arguments.into_iter().map(|a| McpPromptArgument {
        name: a.name,
        description: a.description,
        required: a.required,
    });
    McpPrompt {
        server: listed.server,
        name: listed.name,
        description: listed.description,
        arguments: arguments.collect(),
    }
}

const BRIDGE_MCP: &str = "MCP servers from the editor run only when `turnlog acp` runs the engine itself \
(without --server): a turnlog server does not start its clients' commands or reach their URLs. Declare them on \
the agent in the server's config ([agents.NAME.mcp_servers.SERVER]) instead.";

#[async_trait]
impl Door for Bridge {
    async fn list(&self, agent: &str, after: Option<&str>) -> Result<(Vec<Listed>, Option<String>), DoorError> {
        let query = SessionQuery {
            agent: Some(agent.to_string()),
            limit: Some(LIST_PAGE),
            after: after.map(str::to_string),
            ..SessionQuery::default()
        };
        let page = self.client.sessions(&query).await?;
        let listed = page
            .sessions
            .into_iter()
            .map(|s| Listed {
                cwd: s.metadata.get(CWD).and_then(Value::as_str).map(str::to_string),
                id: s.session_id,
                title: s.title,
                // The turn API shows when a session was made, not when it last changed.
                updated_at: None,
            })
            .collect();
        Ok((listed, page.next))
    }

    /// A server does not run its clients' commands or reach their URLs for them.
    async fn attach_mcp(&self, _session: &str, mcp: McpDeclared) -> Result<(), DoorError> {
        match mcp.is_empty() {
            true => Ok(()),
            false => Err(DoorError::Invalid(BRIDGE_MCP.into())),
        }
    }

    async fn create(
        &self,
        agent: &str,
        metadata: Map<String, Value>,
        tools: Vec<ClientTool>,
        mcp: McpDeclared,
        key: &str,
    ) -> Result<String, DoorError> {
        self.attach_mcp("", mcp).await?;
        let agents = self.client.agents().await?;
        let Some(found) = agents.iter().find(|a| a.name == agent) else {
            let known: Vec<&str> = agents.iter().map(|a| a.name.as_str()).collect();
            return Err(DoorError::Unavailable(format!(
                "no agent named {agent:?} (--agent); the server has: {}",
                known.join(", ")
            )));
        };
        // Every tool the agent offers, trusted as far as the server's config allows.
        let trusted = found.tools.iter().map(|tool| ToolTrust { name: tool.name.clone(), trust: true }).collect();
        let new = NewSession {
            agent: AgentChoice { name: agent.to_string(), tools: Some(trusted) },
            tools,
            metadata,
            ..NewSession::default()
        };
        Ok(self.client.create_session_keyed(&new, key).await?)
    }

    async fn events(&self, session: &str) -> Result<Vec<Event>, DoorError> {
        let session = session_id(session)?;
        let mut out = Vec::new();
        // 100: what every server takes (`limits.max_page_size` is at least that).
        let mut query = PageQuery { limit: Some(100), after_id: None };
        loop {
            let page = self.client.events::<Event>(&session, &query).await?;
            query.after_id = page.data.last().map(|e| e.id.to_string());
            out.extend(page.data.into_iter().filter(|e| !e.body.is_delta()));
            if !page.has_more {
                return Ok(out);
            }
        }
    }

    async fn submit(&self, session: &str, inputs: Vec<Input>, key: &str) -> Result<Vec<Event>, DoorError> {
        let events: Vec<Value> = inputs.into_iter().map(native).collect();
        Ok(self.client.post_events_keyed(&session_id(session)?, &events, key).await?)
    }

    async fn fork(&self, session: &str, at: EventId, metadata: Map<String, Value>) -> Result<String, DoorError> {
        Ok(self.client.fork(&session_id(session)?, &at.to_string(), &metadata).await?)
    }

    async fn delete(&self, session: &str) -> Result<(), DoorError> {
        Ok(self.client.delete_session(&session_id(session)?).await?)
    }

    async fn modes(&self, session: &str) -> Result<Option<Modes>, DoorError> {
        Ok(modes(self.client.modes(&session_id(session)?).await?))
    }

    async fn set_mode(&self, session: &str, mode: &str, key: &str) -> Result<Modes, DoorError> {
        let answered = self.client.set_mode(&session_id(session)?, mode, key).await?;
        modes(answered).ok_or_else(|| DoorError::Unavailable("the server answered a mode change with no mode".into()))
    }

    async fn models(&self, session: &str) -> Result<Models, DoorError> {
        Ok(models(self.client.models(&session_id(session)?).await?))
    }

    async fn set_model(&self, session: &str, model: &str, key: &str) -> Result<Models, DoorError> {
        Ok(models(self.client.set_model(&session_id(session)?, model, key).await?))
    }

    async fn prompts(&self, session: &str) -> Result<SessionPrompts, DoorError> {
        let listed = self.client.prompts(&session_id(session)?).await?;
        let unavailable = listed.unavailable.into_iter().map(|u| Unavailable { server: u.server, error: u.error });
        Ok(SessionPrompts {
            prompts: listed.prompts.into_iter().map(prompt).collect(),
            unavailable: unavailable.collect(),
        })
    }

    async fn write_prompt(
        &self,
        session: &str,
        server: &str,
        name: &str,
        arguments: &BTreeMap<String, String>,
    ) -> Result<Vec<Block>, DoorError> {
        Ok(self.client.write_prompt(&session_id(session)?, server, name, arguments).await?)
    }

    async fn follow(&self, session: &str, after: EventId) -> Result<Events, DoorError> {
        let mut follow = self.client.follow(&session_id(session)?, Some(after.to_string()), RECONNECT);
        // The first open answers for the session (unknown, refused); later drops reconnect.
        // A server that cannot answer now (restarting, failing over) is asked again, as a
        // keyed write is: the prompt's turn goes on there meanwhile.
        let deadline = tokio::time::Instant::now() + crate::client::KEYED_RETRIES;
        loop {
            match follow.connect().await {
                Ok(()) => break,
                Err(error) if error.is_transient() && tokio::time::Instant::now() < deadline => {
                    tracing::debug!(%error, session_id = session, "the event stream did not open; opening it again");
                    tokio::time::sleep(RECONNECT.pause).await;
                }
                Err(error) => return Err(error.into()),
            }
        }
        Ok(async_stream::stream! {
            loop {
                match follow.next().await {
                    Ok(Some(Followed::Event(frame))) => match serde_json::from_str::<Event>(&frame.data) {
                        Ok(event) => yield Ok(event),
                        Err(error) => {
                            yield Err(DoorError::Unavailable(format!("a streamed event does not decode: {error}")));
                            break;
                        }
                    },
                    // The stream dropped (or the server restarted): it is opened again after
                    // the last event seen, as any client of the native stream resumes.
                    Ok(Some(Followed::Dropped { after, cause })) => {
                        tracing::warn!(after = after.as_deref().unwrap_or("the start"), %cause, "event stream dropped; reopening");
                    }
                    Ok(None) => break,
                    Err(error) => {
                        yield Err(error.into());
                        break;
                    }
                }
            }
        }
        .boxed())
    }
}
