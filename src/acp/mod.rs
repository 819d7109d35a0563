//! `turnlog acp`: the Agent Client Protocol (v1) on stdin/stdout, as a view of the log.
//! An editor starts it as its agent; each ACP session is a turnlog session, so it is
//! durable, loads exactly (`session/load` replays the log), and can be watched live
//! through any other view while the editor drives it.
//!
//! The official Rust SDK (`agent-client-protocol`) does the JSON-RPC: framing, ids,
//! malformed lines (`-32700`), unknown methods and ill-typed params. This module maps
//! requests to the session layer ([`door`]) and log events to updates ([`render`]); a
//! session's load, resume, close, delete, fork and mode are in [`lifecycle`], prompts in
//! [`prompt`], and the editor's files and terminals as the model's tools in [`editor`].

mod commands;
pub mod door;
mod editor;
mod lifecycle;
mod line;
mod prompt;
pub mod render;
mod settings;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use agent_client_protocol::schema::ProtocolVersion;
use agent_client_protocol::v1::schema::{
    self as acp, AgentCapabilities, CancelNotification, CloseSessionRequest, CloseSessionResponse, ContentBlock,
    DeleteSessionRequest, DeleteSessionResponse, ForkSessionRequest, ForkSessionResponse, Implementation,
    InitializeRequest, InitializeResponse, ListSessionsRequest, ListSessionsResponse, LoadSessionRequest,
    LoadSessionResponse, McpCapabilities, NewSessionRequest, NewSessionResponse, PromptCapabilities, PromptRequest,
    PromptResponse, ResumeSessionRequest, ResumeSessionResponse, SessionCapabilities, SessionCloseCapabilities,
    SessionDeleteCapabilities, SessionForkCapabilities, SessionInfo, SessionListCapabilities,
    SessionResumeCapabilities, SetSessionConfigOptionRequest, SetSessionConfigOptionResponse, SetSessionModeRequest,
    SetSessionModeResponse,
};
use agent_client_protocol::v1::{ConnectionTo, Responder};
use agent_client_protocol::{Agent, Client, ConnectTo, Error, Stdio};
use parking_lot::Mutex;
use serde_json::{json, Map, Value};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::agent::mcp::McpServerConfig;
use crate::domain::Block;
use door::{Door, DoorError};
use prompt::{Ended, Prompt};

/// How long a prompt still running when stdin closes gets to record its end.
const CLOSE_WAIT: Duration = Duration::from_secs(5);

/// The ACP view on one connection: the door to the session layer, the agent new sessions
/// run, the prompts in flight (to cancel them), the turns it follows for a client that
/// loaded or resumed a session mid-turn, and the sessions the client closed.
#[derive(Clone)]
pub struct Acp {
    door: Arc<dyn Door>,
    agent: String,
    prompts: Arc<Mutex<HashMap<String, Running>>>,
    following: Arc<Mutex<HashMap<String, JoinHandle<()>>>>,
    /// Closed by `session/close`: no prompt until a `session/load` or `session/resume`.
    closed: Arc<Mutex<HashSet<String>>>,
    /// This connection's id, in the keys of the writes it makes (see [`door::write_key`]).
    connection: ulid::Ulid,
    /// What the client said of itself at `initialize`.
    client: Arc<Mutex<ClientSide>>,
    /// Each session's working directory, as the client last gave it (new, load, resume).
    cwds: Arc<Mutex<HashMap<String, PathBuf>>>,
}

/// The client, as it introduced itself: the editor's tools it can run, and its name.
#[derive(Debug, Clone, Default)]
struct ClientSide {
    offered: editor::Offered,
    name: Option<String>,
}

/// A prompt in flight. No other prompt of its session starts until it has taken itself off
/// (or its task has ended some other way).
struct Running {
    /// Which prompt this is: a task takes itself off only if it is still the one listed.
    id: ulid::Ulid,
    cancel: CancellationToken,
    task: JoinHandle<()>,
}

impl Acp {
    pub fn new(door: Arc<dyn Door>, agent: String) -> Acp {
        Acp {
            door,
            agent,
            prompts: Default::default(),
            following: Default::default(),
            closed: Default::default(),
            connection: ulid::Ulid::new(),
            client: Default::default(),
            cwds: Default::default(),
        }
    }

    /// Serves stdin/stdout until stdin closes (or a signal comes), then cancels the prompts
    /// still running and waits (a while) for their end to be recorded.
    pub async fn serve(self) -> Result<(), Error> {
        // Stdin closing ends it, and so does SIGTERM or Ctrl-C, the same way.
        let served = tokio::select! {
            served = self.clone().serve_on(Stdio::new()) => served,
            _ = crate::app::wait_for_signal() => Ok(()),
        };
        self.close().await;
        served
    }

    /// Serves one client's lines, from `transport` (stdin/stdout, or bytes in memory), until
    /// it closes, then cancels the prompts still running as [`Acp::serve`] does.
    pub async fn serve_until_closed(self, transport: impl ConnectTo<Agent> + 'static) -> Result<(), Error> {
        let served = self.clone().serve_on(transport).await;
        self.close().await;
        served
    }

    async fn serve_on(self, transport: impl ConnectTo<Agent> + 'static) -> Result<(), Error> {
        Agent
            .v1()
            .name("turnlog")
            .on_receive_request(
                {
                    let acp = self.clone();
                    async move |request: InitializeRequest, responder: Responder<InitializeResponse>, _cx| {
                        *acp.client.lock() = ClientSide {
                            offered: editor::Offered::of(&request.client_capabilities),
                            name: request.client_info.as_ref().map(|info| info.name.clone()),
                        };
                        responder.respond(initialize(&request))
                    }
                },
                agent_client_protocol::on_receive_request!(),
            )
            .on_receive_request(
                {
                    let acp = self.clone();
                    async move |request: NewSessionRequest, responder: Responder<NewSessionResponse>, cx| {
                        let key = door::write_key(&acp.connection, Some(responder.raw_id()));
                        let created = acp.new_session(request, &key).await;
                        acp.tell_after(responder, created, |c| &c.session_id, &cx)
                    }
                },
                agent_client_protocol::on_receive_request!(),
            )
            .on_receive_request(
                {
                    let acp = self.clone();
                    async move |request: LoadSessionRequest, responder: Responder<LoadSessionResponse>, cx| {
                        responder.respond_with_result(acp.load_session(&request, &cx).await)
                    }
                },
                agent_client_protocol::on_receive_request!(),
            )
            .on_receive_request(
                {
                    let acp = self.clone();
                    async move |request: PromptRequest,
                                responder: Responder<PromptResponse>,
                                cx: ConnectionTo<Client>| { acp.prompt(request, responder, cx) }
                },
                agent_client_protocol::on_receive_request!(),
            )
            .on_receive_request(
                {
                    let acp = self.clone();
                    async move |request: ListSessionsRequest, responder: Responder<ListSessionsResponse>, _cx| {
                        responder.respond_with_result(acp.list_sessions(&request).await)
                    }
                },
                agent_client_protocol::on_receive_request!(),
            )
            .on_receive_request(
                {
                    let acp = self.clone();
                    async move |request: ResumeSessionRequest, responder: Responder<ResumeSessionResponse>, cx| {
                        responder.respond_with_result(acp.resume_session(&request, &cx).await)
                    }
                },
                agent_client_protocol::on_receive_request!(),
            )
            .on_receive_request(
                {
                    let acp = self.clone();
                    async move |request: CloseSessionRequest, responder: Responder<CloseSessionResponse>, _cx| {
                        // Closed at once, for the requests after this one; the rest in a task
                        // of its own, as a prompt is: the prompt it cancels may still talk to
                        // the client before it ends.
                        let session = request.session_id.0.to_string();
                        let running = acp.begin_close(&session);
                        let acp = acp.clone();
                        answer_later(responder, async move {
                            acp.finish_close(&session, running).await;
                            Ok(CloseSessionResponse::new())
                        });
                        Ok(())
                    }
                },
                agent_client_protocol::on_receive_request!(),
            )
            .on_receive_request(
                {
                    let acp = self.clone();
                    async move |request: DeleteSessionRequest, responder: Responder<DeleteSessionResponse>, _cx| {
                        // Closed at once, then deleted in a task of its own, as a close is.
                        let session = request.session_id.0.to_string();
                        let running = acp.begin_close(&session);
                        let acp = acp.clone();
                        answer_later(responder, async move { acp.delete_session(&session, running).await });
                        Ok(())
                    }
                },
                agent_client_protocol::on_receive_request!(),
            )
            .on_receive_request(
                {
                    let acp = self.clone();
                    async move |request: ForkSessionRequest, responder: Responder<ForkSessionResponse>, cx| {
                        let forked = acp.fork_session(&request).await;
                        acp.tell_after(responder, forked, |f| &f.session_id, &cx)
                    }
                },
                agent_client_protocol::on_receive_request!(),
            )
            .on_receive_request(
                {
                    let acp = self.clone();
                    async move |request: SetSessionModeRequest, responder: Responder<SetSessionModeResponse>, _cx| {
                        let key = door::write_key(&acp.connection, Some(responder.raw_id()));
                        responder.respond_with_result(acp.set_mode(&request, &key).await)
                    }
                },
                agent_client_protocol::on_receive_request!(),
            )
            .on_receive_request(
                {
                    let acp = self.clone();
                    async move |request: SetSessionConfigOptionRequest,
                                responder: Responder<SetSessionConfigOptionResponse>,
                                _cx| {
                        let key = door::write_key(&acp.connection, Some(responder.raw_id()));
                        responder.respond_with_result(acp.set_option(&request, &key).await)
                    }
                },
                agent_client_protocol::on_receive_request!(),
            )
            .on_receive_notification(
                {
                    let acp = self.clone();
                    async move |notification: CancelNotification, _cx: ConnectionTo<Client>| {
                        acp.cancel(&notification.session_id.0);
                        Ok(())
                    }
                },
                agent_client_protocol::on_receive_notification!(),
            )
            .connect_to(transport)
            .await
    }

    /// The new session's commands come with the answer, to be sent once the client has it.
    async fn new_session(
        &self,
        request: NewSessionRequest,
        key: &str,
    ) -> Result<(NewSessionResponse, acp::SessionUpdate), Error> {
        let cwd = absolute(&request.cwd)?;
        let mcp = mcp_servers(&request.mcp_servers)?;
        let metadata = Map::from_iter([(door::CWD.to_string(), json!(cwd))]);
        // The editor's tools the client can run are the session's, for its whole life.
        let tools = self.client.lock().offered.tools();
        let id = self.door.create(&self.agent, metadata, tools, mcp, key).await.map_err(|e| error(e, None))?;
        tracing::info!(session_id = %id, agent = %self.agent, "session created");
        self.cwds.lock().insert(id.clone(), request.cwd.clone());
        let settings = self.settings(&id).await?;
        Ok((NewSessionResponse::new(id).modes(settings.modes).config_options(settings.options), settings.commands))
    }

    /// A page of this agent's sessions made through ACP, newest first (those of other views
    /// have no working directory to show; they load by id), in `cwd` if it is given.
    async fn list_sessions(&self, request: &ListSessionsRequest) -> Result<ListSessionsResponse, Error> {
        let cwd = request.cwd.as_deref().map(absolute).transpose()?;
        let (listed, next) =
            self.door.list(&self.agent, request.cursor.as_deref()).await.map_err(|e| error(e, None))?;
        let sessions = listed
            .into_iter()
            .filter_map(|s| {
                let here = s.cwd.filter(|c| cwd.as_ref().is_none_or(|wanted| wanted == c))?;
                Some(SessionInfo::new(s.id, here).title(s.title).updated_at(s.updated_at))
            })
            .collect();
        Ok(ListSessionsResponse::new(sessions).next_cursor(next))
    }

    /// Starts the prompt's task (the dispatch loop must go on: the task asks the client for
    /// permissions and this connection takes cancels meanwhile).
    fn prompt(
        &self,
        request: PromptRequest,
        responder: Responder<PromptResponse>,
        cx: ConnectionTo<Client>,
    ) -> Result<(), Error> {
        let session = request.session_id.0.to_string();
        if self.closed.lock().contains(&session) {
            let message = format!("session {session} was closed (session/close): load or resume it to prompt it again");
            return responder.respond_with_error(Error::invalid_request().data(json!(message)));
        }
        let content = match prompt_content(&request.prompt) {
            Ok(content) => content,
            Err(error) => return responder.respond_with_error(error),
        };
        let mut prompts = self.prompts.lock();
        // (A prompt takes itself off before it answers; `is_finished` covers one that panicked.)
        if prompts.get(&session).is_some_and(|running| !running.task.is_finished()) {
            let message = format!("a prompt is already running on session {session}; cancel it or wait for its answer");
            return responder.respond_with_error(Error::new(BUSY, message).data(json!({"sessionId": session})));
        }
        let cancel = CancellationToken::new();
        let key = door::write_key(&self.connection, Some(responder.raw_id()));
        let (door, connection, client) = (self.door.clone(), self.connection, self.client.lock().clone());
        let cwd = self.cwds.lock().get(&session).cloned();
        let prompt = Prompt {
            door,
            cx,
            session: session.clone(),
            cancel: cancel.clone(),
            key,
            connection,
            editor: editor::Editor { offered: client.offered, client_name: client.name, cwd },
        };
        let id = ulid::Ulid::new();
        let task = tokio::spawn(self.clone().answer(id, prompt, content, responder));
        prompts.insert(session, Running { id, cancel, task });
        Ok(())
    }

    /// Runs the prompt (or the command it is), takes it off the running ones, then answers:
    /// in that order, since the client may send the session's next prompt as soon as it
    /// reads the answer.
    async fn answer(self, id: ulid::Ulid, prompt: Prompt, content: Vec<Block>, responder: Responder<PromptResponse>) {
        let session = prompt.session.clone();
        let ended = match commands::asked(&*self.door, &session, &content).await {
            Some(command) => self.run_command(prompt, command).await,
            None => prompt.run(content).await,
        };
        {
            // (A close took it off already, and a new prompt may be listed since.)
            let mut prompts = self.prompts.lock();
            if prompts.get(&session).is_some_and(|running| running.id == id) {
                prompts.remove(&session);
            }
        }
        let answer = match ended {
            Ended::Stopped(reason) => responder.respond(PromptResponse::new(reason)),
            Ended::Failed { code, message } => responder.respond_with_error(
                Error::new(agent_client_protocol::ErrorCode::INTERNAL_ERROR, format!("the turn failed: {message}"))
                    .data(json!({"code": code})),
            ),
            Ended::Refused(refused) => responder.respond_with_error(error(refused, Some(&session))),
        };
        if let Err(error) = answer {
            tracing::debug!(%error, "the prompt's answer was not sent (the client has gone)");
        }
    }

    fn cancel(&self, session: &str) {
        if let Some(running) = self.prompts.lock().get(session) {
            running.cancel.cancel();
        }
    }

    /// The client has gone: no one can answer a permission or read a reply, so the prompts
    /// still running are cancelled, and their end recorded before the log closes.
    async fn close(&self) {
        self.following.lock().drain().for_each(|(_, following)| following.abort());
        let running: Vec<Running> = self.prompts.lock().drain().map(|(_, running)| running).collect();
        for prompt in &running {
            prompt.cancel.cancel();
        }
        let all = futures_util::future::join_all(running.into_iter().map(|r| r.task));
        if tokio::time::timeout(CLOSE_WAIT, all).await.is_err() {
            tracing::warn!("prompts still running {} s after stdin closed", CLOSE_WAIT.as_secs());
        }
    }
}

impl Acp {
    /// Answers with what made a session, then tells the client `update` about it (the
    /// session's commands: after the answer that names it, since the client knows the
    /// session by then), and its MCP servers' prompts once they are listed.
    fn tell_after<T: agent_client_protocol::JsonRpcResponse>(
        &self,
        responder: Responder<T>,
        made: Result<(T, acp::SessionUpdate), Error>,
        session: impl FnOnce(&T) -> &acp::SessionId,
        cx: &ConnectionTo<Client>,
    ) -> Result<(), Error> {
        match made {
            Ok((answer, update)) => {
                let session = session(&answer).clone();
                responder.respond(answer)?;
                cx.send_notification(acp::SessionNotification::new(session.clone(), update))?;
                self.offer_prompts(&session.0, cx);
                Ok(())
            }
            Err(error) => responder.respond_with_error(error),
        }
    }
}

/// Answers `responder` from a task of its own, once `answer` is done (for a request that
/// waits on what the dispatch loop must go on serving meanwhile).
fn answer_later<T: agent_client_protocol::JsonRpcResponse>(
    responder: Responder<T>,
    answer: impl std::future::Future<Output = Result<T, Error>> + Send + 'static,
) {
    tokio::spawn(async move {
        if let Err(error) = responder.respond_with_result(answer.await) {
            tracing::debug!(%error, "a request was not answered (the client has gone)");
        }
    });
}

/// A prompt refused because one runs on the session: not one of JSON-RPC's or ACP's
/// reserved codes (those are -32768..=-32000 and -32899..=-32800).
const BUSY: i32 = 1409;

fn initialize(request: &InitializeRequest) -> InitializeResponse {
    if request.protocol_version != ProtocolVersion::V1 {
        tracing::info!(asked = ?request.protocol_version, "the client asked another protocol version; answering with 1");
    }
    let capabilities = AgentCapabilities::new()
        .load_session(true)
        .session_capabilities(
            SessionCapabilities::new()
                .list(SessionListCapabilities::new())
                .resume(SessionResumeCapabilities::new())
                .close(SessionCloseCapabilities::new())
                .delete(SessionDeleteCapabilities::new())
                .fork(SessionForkCapabilities::new()),
        )
        .prompt_capabilities(PromptCapabilities::new().image(true).embedded_context(true))
        .mcp_capabilities(McpCapabilities::new().http(true));
    InitializeResponse::new(ProtocolVersion::V1)
        .agent_capabilities(capabilities)
        .auth_methods(Vec::new())
        .agent_info(Implementation::new("turnlog", env!("CARGO_PKG_VERSION")).title("turnlog"))
}

/// The MCP servers a client declared, as turnlog declares them: each asks before every
/// call (the editor's permission prompt), over stdio or Streamable HTTP (not SSE).
fn mcp_servers(servers: &[acp::McpServer]) -> Result<door::McpDeclared, Error> {
    let invalid = |message: String| Error::invalid_params().data(Value::String(message));
    let mut out = door::McpDeclared::new();
    for server in servers {
        let (name, config) = match server {
            acp::McpServer::Stdio(stdio) => {
                let env = stdio.env.iter().map(|v| (v.name.clone(), v.value.clone())).collect();
                (&stdio.name, McpServerConfig::stdio(stdio.command.display().to_string(), stdio.args.clone(), env))
            }
            acp::McpServer::Http(http) => {
                let headers = http.headers.iter().map(|h| (h.name.clone(), h.value.clone())).collect();
                (&http.name, McpServerConfig::http(http.url.clone(), headers))
            }
            acp::McpServer::Sse(sse) => {
                return Err(invalid(format!("MCP server {:?}: turnlog speaks Streamable HTTP, not SSE", sse.name)))
            }
            _ => return Err(invalid("an MCP server of a transport turnlog does not speak".into())),
        };
        if out.insert(name.clone(), config).is_some() {
            return Err(invalid(format!("MCP server {name:?} is declared twice")));
        }
    }
    Ok(out)
}

fn absolute(cwd: &Path) -> Result<String, Error> {
    match cwd.is_absolute() {
        true => Ok(cwd.display().to_string()),
        false => {
            Err(Error::invalid_params().data(json!(format!("cwd must be an absolute path, got {}", cwd.display()))))
        }
    }
}

/// The prompt's blocks as the log stores them: as the client sent them.
fn prompt_content(prompt: &[ContentBlock]) -> Result<Vec<Block>, Error> {
    if prompt.is_empty() {
        return Err(Error::invalid_params().data(json!("prompt: at least one content block is needed")));
    }
    prompt
        .iter()
        .enumerate()
        .map(|(i, block)| {
            if matches!(block, ContentBlock::Audio(_)) {
                return Err(Error::invalid_params()
                    .data(json!(format!("prompt[{i}]: audio is not taken (promptCapabilities.audio is false)"))));
            }
            let value = serde_json::to_value(block).map_err(Error::into_internal_error)?;
            serde_json::from_value::<Block>(value)
                .map_err(|e| Error::invalid_params().data(json!(format!("prompt[{i}]: {e}"))))
        })
        .collect()
}

/// The session layer's answer as a JSON-RPC error.
fn error(error: DoorError, session: Option<&str>) -> Error {
    match (error, session) {
        (DoorError::NotFound(_), Some(session)) => acp::Error::session_not_found(session.to_string()).into(),
        (DoorError::NotFound(message), None) => {
            Error::new(agent_client_protocol::ErrorCode::RESOURCE_NOT_FOUND, message)
        }
        (DoorError::Invalid(message), _) => Error::invalid_params().data(Value::String(message)),
        (DoorError::Busy(message) | DoorError::Refused(message), session) => {
            Error::new(BUSY, message).data(session.map(|id| json!({"sessionId": id})))
        }
        // Not `auth_required`: this agent offers no way to authenticate; the key is its
        // command line's.
        (DoorError::Unauthorized(message) | DoorError::Unavailable(message), _) => {
            Error::internal_error().data(Value::String(message))
        }
    }
}
