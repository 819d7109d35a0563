//! Tools from MCP servers, through the official Rust SDK (`rmcp`): servers over stdio (a
//! command) or Streamable HTTP (a URL), declared per agent (in config or through an API)
//! or per session (by an ACP client). Each server is connected on first use and shared by
//! every session of its agent; one that has died is started again on the next use (after
//! 2 s, and longer each time if it keeps dying). Its tools reach the model as
//! `<server>__<tool>` (made into a name every provider takes), each with the permission
//! its declaration gives it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::service::{RunningService, ServiceError};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{RoleClient, ServiceExt};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

mod config;
mod prompts;

pub use config::{shown_url, McpServerConfig};
pub use prompts::{McpPrompt, McpPromptArgument, PromptError, PromptPart, PROMPTS_WAIT};

use super::model::ToolDef;
use crate::domain::event::{McpServerTools, Permission};
use crate::domain::Block;

/// What joins a server's name and its tool's name towards the model.
pub const SEPARATOR: &str = "__";

/// Whether the server says running the tool twice does no more than running it once.
fn annotated_idempotent(tool: &rmcp::model::Tool) -> bool {
    let hints = tool.annotations.as_ref();
    hints.is_some_and(|h| h.read_only_hint == Some(true) || h.idempotent_hint == Some(true))
}

/// One of a server's tools, as the turn offers it.
#[derive(Debug, Clone)]
pub struct McpTool {
    pub server: String,
    pub tool: String,
    /// Named `<server>__<tool>` (see [`model_names`]), with the tool's input schema.
    pub def: ToolDef,
    pub permission: Permission,
    /// Whether a call may run twice: the server annotates the tool `readOnlyHint` or
    /// `idempotentHint`, or the declaration says `idempotent = true`.
    pub idempotent: bool,
    /// The servers that answer its calls.
    pub servers: Arc<McpServers>,
}

/// What a server tool answered (built-in or an MCP server's): its content blocks and
/// structured content as it gave them, and whether it is an error.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolAnswer {
    pub content: Vec<Block>,
    pub structured: Option<Value>,
    pub is_error: bool,
}

impl ToolAnswer {
    /// A built-in tool's text answer, or its failure.
    pub fn text(result: Result<String, String>) -> ToolAnswer {
        let (text, is_error) = match result {
            Ok(text) => (text, false),
            Err(text) => (text, true),
        };
        ToolAnswer { content: vec![Block::text(text)], structured: None, is_error }
    }

    fn failed(text: String) -> ToolAnswer {
        ToolAnswer::text(Err(text))
    }
}

#[derive(Debug, thiserror::Error)]
#[error("MCP server {server}: {message}")]
pub struct McpError {
    pub server: String,
    pub message: String,
}

/// An agent's (or a session's) MCP servers.
#[derive(Default)]
pub struct McpServers {
    servers: Vec<Server>,
    /// Stopped for good: nothing connects again (a turn that still holds them gets errors).
    stopped: Arc<std::sync::atomic::AtomicBool>,
}

impl std::fmt::Debug for McpServers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.servers.iter().map(|s| &s.name)).finish()
    }
}

struct Server {
    name: String,
    config: McpServerConfig,
    state: tokio::sync::Mutex<State>,
    /// Its set's stop flag: once set, nothing connects again.
    stopped: Arc<std::sync::atomic::AtomicBool>,
}

#[derive(Default)]
struct State {
    connection: Option<Arc<Connection>>,
    /// When it was last started, and how many starts in a row came soon after the one
    /// before: a server that keeps dying waits longer each time (see [`restart_wait`]).
    started: Option<Instant>,
    quick_restarts: u32,
    /// Why the last start failed, if it did ...
    failed: Option<String>,
    /// ... or since when what it started has been up.
    up_since: Option<Instant>,
}

struct Connection {
    client: RunningService<RoleClient, ()>,
}

/// The wait before a server is started again, from its last start: 2 s, doubled for each
/// start in a row that failed or did not last a minute, up to a minute.
const RESTART_AFTER: Duration = Duration::from_secs(2);
const RESTART_MAX: Duration = Duration::from_secs(60);

fn restart_wait(quick_restarts: u32) -> Duration {
    RESTART_AFTER.saturating_mul(1 << quick_restarts.min(5)).min(RESTART_MAX)
}
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

impl McpServers {
    pub fn new(configs: &BTreeMap<String, McpServerConfig>) -> McpServers {
        let stopped = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let servers = configs
            .iter()
            .map(|(name, config)| Server {
                name: name.clone(),
                config: config.clone(),
                state: Default::default(),
                stopped: stopped.clone(),
            })
            .collect();
        McpServers { servers, stopped }
    }

    /// Whether these are the servers `configs` declares.
    pub fn declared_as(&self, configs: &BTreeMap<String, McpServerConfig>) -> bool {
        self.servers.len() == configs.len()
            && self.servers.iter().all(|s| configs.get(&s.name).is_some_and(|c| *c == s.config))
    }

    pub fn is_empty(&self) -> bool {
        self.servers.is_empty()
    }

    pub fn has(&self, server: &str) -> bool {
        self.servers.iter().any(|s| s.name == server)
    }

    /// The servers' names, as declared.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.servers.iter().map(|s| s.name.as_str())
    }

    /// Every tool of every server, listed afresh (`tools/list`: a server's list may change,
    /// and a server that has died is found here and started again), minus those its
    /// declaration denies, with what was found per server; each tool's model name is left
    /// for [`name_tools`] to give, across all the servers a turn has. A server that cannot
    /// be reached is an error: the turn says so.
    pub async fn tools(self: &Arc<Self>) -> Result<(Vec<McpTool>, Vec<McpServerTools>), McpError> {
        let mut found = Vec::new();
        let mut listings = Vec::new();
        for server in &self.servers {
            let mut listing = McpServerTools {
                server: server.name.clone(),
                transport: server.config.transport().into(),
                tools: vec![],
            };
            for tool in server.list().await? {
                let permission =
                    server.config.tools.get(tool.name.as_ref()).copied().unwrap_or(server.config.permission);
                if permission != Permission::Deny {
                    listing.tools.push(tool.name.to_string());
                    found.push((server, tool, permission));
                }
            }
            listings.push(listing);
        }
        let tools = found
            .into_iter()
            .map(|(server, tool, permission)| McpTool {
                server: server.name.clone(),
                tool: tool.name.to_string(),
                def: ToolDef {
                    name: String::new(),
                    description: tool.description.as_deref().unwrap_or_default().to_string(),
                    parameters: Value::Object((*tool.input_schema).clone()),
                },
                permission,
                idempotent: server.config.idempotent || annotated_idempotent(&tool),
                servers: self.clone(),
            })
            .collect();
        Ok((tools, listings))
    }

    /// Calls `tool` of `server`. A cancel reaches the server at once (`notifications/cancelled`);
    /// a failure of any kind is an error answer the model reads.
    pub async fn call(&self, server: &str, tool: &str, input: &Value, cancel: &CancellationToken) -> ToolAnswer {
        let Some(found) = self.servers.iter().find(|s| s.name == server) else {
            return ToolAnswer::failed(format!("no MCP server named {server:?}"));
        };
        let connection = match found.connection().await {
            Ok(connection) => connection,
            Err(error) => return ToolAnswer::failed(error.to_string()),
        };
        let arguments = match input {
            Value::Object(map) => map.clone(),
            Value::Null => Default::default(),
            other => return ToolAnswer::failed(format!("the input of {tool} must be an object, not {other}")),
        };
        let request = CallToolRequestParams::new(tool.to_string()).with_arguments(arguments);
        let limit = Duration::from_secs(found.config.timeout_secs);
        // Dropping the call (on a cancel or the timeout) sends `notifications/cancelled`.
        let answer = tokio::select! {
            _ = cancel.cancelled() => return ToolAnswer::failed("Tool call cancelled".into()),
            answer = tokio::time::timeout(limit, connection.client.peer().call_tool(request)) => answer,
        };
        match answer {
            Ok(Ok(result)) => answer_of(result),
            Ok(Err(error)) => {
                // A closed connection is made again on next use.
                if connection.client.is_closed() {
                    found.forget(&connection).await;
                }
                let error = found.scrub(error.to_string());
                ToolAnswer::failed(format!("MCP server {server}: the call of {tool} failed: {error}"))
            }
            Err(_) => ToolAnswer::failed(format!("MCP server {server}: {tool} took longer than {} s", limit.as_secs())),
        }
    }

    /// Stops every server for good (their processes end with their connections, even
    /// one a call still holds: the call fails).
    pub async fn shutdown(&self) {
        self.stopped.store(true, std::sync::atomic::Ordering::SeqCst);
        for server in &self.servers {
            let connection = server.state.lock().await.connection.take();
            if let Some(connection) = connection {
                connection.client.cancellation_token().cancel();
            }
        }
    }
}

impl Server {
    /// The live connection, made (again) if there is none or it has closed.
    async fn connection(&self) -> Result<Arc<Connection>, McpError> {
        let mut state = self.state.lock().await;
        if self.stopped.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(self.error("it has been stopped".into()));
        }
        if let Some(connection) = state.connection.as_ref().filter(|c| !c.client.is_closed()) {
            return Ok(connection.clone());
        }
        // A start that failed, or a server that did not last a minute, makes this start a
        // quick one again; the state changes only when the start is made (a turn cancelled
        // while it waits leaves no trace).
        let quick = match (state.started, &state.failed, state.up_since) {
            (None, ..) => 0,
            (Some(_), Some(_), _) => state.quick_restarts + 1,
            (Some(_), None, Some(up)) if up.elapsed() < RESTART_MAX => state.quick_restarts + 1,
            _ => 0,
        };
        if let Some(started) = state.started {
            match restart_wait(quick.saturating_sub(1)).checked_sub(started.elapsed()) {
                // A short wait is waited; a longer one fails at once rather than hold the turn.
                Some(left) if left > RESTART_AFTER => {
                    let last = state.failed.as_deref().unwrap_or("it died");
                    return Err(self.error(format!(
                        "it keeps failing ({last}); it is started again in {} s at the earliest",
                        left.as_secs().max(1)
                    )));
                }
                Some(left) => tokio::time::sleep(left).await,
                None => {}
            }
        }
        (state.quick_restarts, state.started) = (quick, Some(Instant::now()));
        let connected = match tokio::time::timeout(CONNECT_TIMEOUT, self.connect()).await {
            Ok(connected) => connected,
            Err(_) => Err(self.error(format!("no answer within {} s", CONNECT_TIMEOUT.as_secs()))),
        };
        state.failed = connected.as_ref().err().map(|e| e.message.clone());
        state.up_since = connected.is_ok().then(Instant::now);
        let connection = Arc::new(connected?);
        tracing::info!(server = %self.name, "MCP server connected");
        state.connection = Some(connection.clone());
        Ok(connection)
    }

    async fn connect(&self) -> Result<Connection, McpError> {
        let client = match (&self.config.command, &self.config.url) {
            (Some(command), _) => {
                let mut process = tokio::process::Command::new(command);
                process.args(&self.config.args).envs(&self.config.env).kill_on_drop(true);
                let (transport, _) = TokioChildProcess::builder(process)
                    .stderr(std::process::Stdio::inherit())
                    .spawn()
                    .map_err(|e| self.error(format!("could not start `{command}`: {e}")))?;
                ().serve(transport).await.map_err(|e| self.error(format!("`{command}` did not start MCP: {e}")))?
            }
            (None, Some(url)) => {
                let headers = self.config.header_map().map_err(|e| self.error(e))?;
                let config = StreamableHttpClientTransportConfig::with_uri(url.as_str()).custom_headers(headers);
                install_crypto_provider();
                let transport = StreamableHttpClientTransport::from_config(config);
                // Not the error's own text: it may quote the URL whole, query and all.
                ().serve(transport).await.map_err(|e| {
                    tracing::debug!(server = %self.name, error = %self.scrub(e.to_string()), "MCP over HTTP did not start");
                    self.error(format!("{} did not start MCP: {}", shown_url(url), error_kind(&e)))
                })?
            }
            (None, None) => return Err(self.error("neither `command` nor `url` is set".into())),
        };
        Ok(Connection { client })
    }

    /// The server's tools. A connection that has closed is made again, once.
    async fn list(&self) -> Result<Vec<rmcp::model::Tool>, McpError> {
        let connection = self.connection().await?;
        let listed = tokio::time::timeout(CONNECT_TIMEOUT, connection.client.peer().list_all_tools()).await;
        let Ok(listed) = listed else {
            self.forget(&connection).await;
            return Err(self.error(format!("tools/list got no answer within {} s", CONNECT_TIMEOUT.as_secs())));
        };
        match listed {
            Ok(tools) => Ok(tools),
            Err(ServiceError::TransportClosed | ServiceError::TransportSend(_)) => {
                tracing::warn!(server = %self.name, "MCP server gone; starting it again");
                self.forget(&connection).await;
                let connection = self.connection().await?;
                match tokio::time::timeout(CONNECT_TIMEOUT, connection.client.peer().list_all_tools()).await {
                    Ok(listed) => {
                        listed.map_err(|e| self.error(format!("tools/list failed: {}", self.scrub(e.to_string()))))
                    }
                    Err(_) => Err(self.error("tools/list got no answer".into())),
                }
            }
            Err(error) => Err(self.error(format!("tools/list failed: {}", self.scrub(error.to_string())))),
        }
    }

    /// Drops `connection` if it is still the server's (a newer one stays).
    async fn forget(&self, connection: &Arc<Connection>) {
        let mut state = self.state.lock().await;
        if state.connection.as_ref().is_some_and(|c| Arc::ptr_eq(c, connection)) {
            state.connection = None;
        }
    }

    /// `text` with the server's URL, wherever it is quoted whole, shown without its secrets.
    fn scrub(&self, text: String) -> String {
        let Some(url) = &self.config.url else { return text };
        let shown = shown_url(url);
        let parsed = reqwest::Url::parse(url).map(|u| u.to_string()).unwrap_or_default();
        let text = if parsed.is_empty() { text } else { text.replace(&parsed, &shown) };
        text.replace(url.as_str(), &shown)
    }

    fn error(&self, message: String) -> McpError {
        McpError { server: self.name.clone(), message }
    }
}

/// The server's content blocks as the log keeps them (MCP's `text`, `image`, `resource`...
/// are the shapes the log's blocks already take).
fn answer_of(result: CallToolResult) -> ToolAnswer {
    let content = result.content.iter().map(block_of).collect();
    ToolAnswer { content, structured: result.structured_content, is_error: result.is_error.unwrap_or(false) }
}

/// An MCP content block as the log keeps it: every MCP block has the `type` a [`Block`]
/// needs, and the rest is kept as it came.
fn block_of(block: &rmcp::model::ContentBlock) -> Block {
    let value = serde_json::to_value(block).unwrap_or(Value::Null);
    serde_json::from_value(value).unwrap_or_else(|_| Block::text("(a content block that could not be read)"))
}

/// Gives `tools` (of all the servers a turn has, in one list) their model names.
pub fn name_tools(tools: &mut [McpTool]) {
    let names = model_names(tools.iter().map(|t| (t.server.as_str(), t.tool.as_str())));
    for (tool, name) in tools.iter_mut().zip(names) {
        tool.def.name = name;
    }
}

/// What kind of failure an MCP connection had, without the transport's own text (which
/// may quote the URL whole).
fn error_kind(error: &rmcp::service::ClientInitializeError) -> &'static str {
    use rmcp::service::ClientInitializeError as E;
    match error {
        E::ConnectionClosed(_) => "the connection closed",
        E::TransportError { .. } => "it could not be reached",
        _ => "it did not answer initialize as MCP",
    }
}

/// The longest tool name the model providers take (Anthropic and OpenAI: 64).
const MAX_NAME: usize = 64;

/// The names the model sees for `(server, tool)` pairs: `<server>__<tool>`, made into a
/// name every provider takes (`[a-zA-Z0-9_-]{1,64}`): a name that needs a change (another
/// character becomes `_`, or it is too long) is cut and given a hash of the pair, so each
/// name stays the same from turn to turn, whatever else the servers list, and tells its
/// pair apart.
pub fn model_names<'a>(pairs: impl Iterator<Item = (&'a str, &'a str)>) -> Vec<String> {
    let mut taken = std::collections::HashSet::new();
    let mut out = Vec::new();
    for (server, tool) in pairs {
        let full = format!("{server}{SEPARATOR}{tool}");
        let clean: String =
            full.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' || c == '-' { c } else { '_' }).collect();
        // A name that needed no change keeps it; any other gets a hash of the pair, so no
        // pair takes another's name whatever the order they are listed in.
        // `a_` + `b` and `a` + `_b` are both `a___b`: a pair that could be read two ways is
        // hashed too, so neither takes the plain name from the other.
        let ambiguous = server.ends_with('_') || server.contains(SEPARATOR) || tool.starts_with('_');
        let name = if clean == full && !ambiguous && clean.len() <= MAX_NAME && !taken.contains(&clean) {
            clean
        } else {
            // FNV-1a of `<server>` NUL `<tool>` (one reading only): small, and the same in
            // every build. (Two pairs of one hash would need about 2^16 tools to be likely;
            // the second is then not offered, with a warning.)
            let pair = server.bytes().chain([0]).chain(tool.bytes());
            let hash = pair.fold(0x811c_9dc5_u32, |h, b| (h ^ u32::from(b)).wrapping_mul(0x0100_0193));
            format!("{}_{hash:08x}", &clean[..clean.len().min(MAX_NAME - 9)])
        };
        taken.insert(name.clone());
        out.push(name);
    }
    out
}

/// rmcp's HTTP client (its own reqwest) is built with rustls but no crypto provider of its
/// own (rmcp's `reqwest-tls-no-provider`), so that the build does not compile AWS-LC, a C
/// library, next to the `ring` the rest of turnlog's HTTPS already uses: `ring` is made the
/// process's provider before that client is first built. (Set already, by this or by
/// anyone: kept.)
fn install_crypto_provider() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_ones_every_provider_takes() {
        let long = "t".repeat(80);
        let names = model_names(
            [("time", "get_current_time"), ("files", "read.file"), ("files", "read_file"), ("my files", &long)]
                .into_iter(),
        );
        assert_eq!(names[0], "time__get_current_time");
        assert_eq!(names[2], "files__read_file");
        // `read.file` needs a change: it is told apart from `read_file` by a hash.
        assert!(names[1].starts_with("files__read_file_") && names[1] != names[2], "{names:?}");
        assert!(names[3].starts_with("my_files__ttt") && names[3].len() == MAX_NAME, "{names:?}");
        let valid =
            |n: &String| n.len() <= MAX_NAME && n.chars().all(|c| c.is_ascii_alphanumeric() || "_-".contains(c));
        assert!(names.iter().all(valid), "{names:?}");
        // The same pairs give the same names every time.
        let again = model_names(
            [("time", "get_current_time"), ("files", "read.file"), ("files", "read_file"), ("my files", &long)]
                .into_iter(),
        );
        assert_eq!(names, again);
        // Two pairs of one joined name are both told apart, whichever comes first.
        let split = model_names([("a_", "b"), ("a", "_b")].into_iter());
        assert!(split[0] != split[1] && split.iter().all(|n| n.starts_with("a___b_")), "{split:?}");
        // Listed in another order, or beside other tools, each pair keeps its name.
        let reordered = model_names(
            [("new", "tool"), ("my files", &long), ("files", "read_file"), ("files", "read.file")].into_iter(),
        );
        assert_eq!((&reordered[1], &reordered[2], &reordered[3]), (&names[3], &names[2], &names[1]));
    }

    #[test]
    fn a_server_that_keeps_dying_waits_longer_each_time() {
        let waits: Vec<u64> = (0..8).map(|n| restart_wait(n).as_secs()).collect();
        assert_eq!(waits, [2, 4, 8, 16, 32, 60, 60, 60]);
    }

    #[test]
    fn a_url_is_shown_without_its_secrets() {
        assert_eq!(shown_url("https://u:pw@mcp.example.com:8443/mcp?token=abc#x"), "https://mcp.example.com:8443/mcp");
        assert_eq!(shown_url("not a url"), "(an invalid URL)");
    }
}
