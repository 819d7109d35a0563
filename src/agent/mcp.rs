//! Tools from MCP servers, through the official Rust SDK (`rmcp`): servers over stdio (a
//! command) or Streamable HTTP (a URL), declared per agent (in config or through an API)
//! or per session (by an ACP client). Each server is connected on first use and shared by
//! every session of its agent; one that has died is started again on the next use (at
//! most once every few seconds). Its tools reach the model as `<server>__<tool>` (made
//! into a name every provider takes), each with the permission its declaration gives it.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::service::{RunningService, ServiceError};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{RoleClient, ServiceExt};
use serde::Deserialize;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::model::ToolDef;
use crate::domain::event::{McpServerTools, Permission};
use crate::domain::Block;

/// What joins a server's name and its tool's name towards the model.
pub const SEPARATOR: &str = "__";

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpServerConfig {
    /// A command that speaks MCP on its stdin/stdout ...
    #[serde(default)]
    pub command: Option<String>,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// ... or a Streamable HTTP endpoint.
    #[serde(default)]
    pub url: Option<String>,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// For every tool of the server, unless `tools` says otherwise.
    #[serde(default = "ask")]
    pub permission: Permission,
    #[serde(default)]
    pub tools: BTreeMap<String, Permission>,
    /// A call that takes longer fails (and is cancelled on the server).
    #[serde(default = "default_call_timeout")]
    pub timeout_secs: u64,
}

fn ask() -> Permission {
    Permission::Ask
}

fn default_call_timeout() -> u64 {
    60
}

impl McpServerConfig {
    /// A server over Streamable HTTP, as an API declares one (no headers: those are secrets).
    pub fn url(url: &str) -> McpServerConfig {
        McpServerConfig {
            command: None,
            args: Vec::new(),
            env: BTreeMap::new(),
            url: Some(url.to_string()),
            headers: BTreeMap::new(),
            permission: Permission::Ask,
            tools: BTreeMap::new(),
            timeout_secs: default_call_timeout(),
        }
    }

    /// The declaration's mistakes, named (`at` says where it is).
    pub fn check(&self, at: &str, name: &str) -> Result<(), String> {
        if name.trim().is_empty() || name.len() > 255 || name.chars().any(char::is_control) {
            return Err(format!("{at}: a server's name is 1 to 255 characters, none of them control characters"));
        }
        match (&self.command, &self.url) {
            (Some(_), None) | (None, Some(_)) => {}
            _ => return Err(format!("{at}: give either `command` (stdio) or `url` (Streamable HTTP)")),
        }
        if self.url.is_some() && (!self.args.is_empty() || !self.env.is_empty()) {
            return Err(format!("{at}: `args` and `env` are for a `command`"));
        }
        if self.command.is_some() && !self.headers.is_empty() {
            return Err(format!("{at}: `headers` are for a `url`"));
        }
        if self.timeout_secs == 0 {
            return Err(format!("{at}: `timeout_secs` must be at least 1"));
        }
        if let Some(url) = &self.url {
            let parsed = reqwest::Url::parse(url).map_err(|e| format!("{at}: `url` {url:?}: {e}"))?;
            if !matches!(parsed.scheme(), "http" | "https") {
                return Err(format!("{at}: `url` {url:?}: an MCP server is reached over http or https"));
            }
        }
        Ok(())
    }

    /// Whether a caller that is not an admin may have turnlog start or reach this server:
    /// never a command (it would run on turnlog's machine), and a URL only on a host the
    /// config allows (`tools.mcp.allowed_hosts`).
    pub fn check_reach(&self, at: &str, allowed_hosts: &[String]) -> Result<(), String> {
        if let Some(command) = &self.command {
            return Err(format!("{at}: only an admin may have turnlog run a command ({command:?})"));
        }
        let url = self.url.as_deref().unwrap_or_default();
        let host = reqwest::Url::parse(url).ok().and_then(|u| u.host_str().map(str::to_ascii_lowercase));
        match host {
            Some(host) if super::tools::host_allowed(allowed_hosts, &host) => Ok(()),
            _ => Err(format!(
                "{at}: the host of {url:?} is not one this server may reach for you (tools.mcp.allowed_hosts)"
            )),
        }
    }

    fn transport(&self) -> &'static str {
        if self.command.is_some() {
            "stdio"
        } else {
            "streamable-http"
        }
    }
}

/// One of a server's tools, as the turn offers it.
#[derive(Debug, Clone)]
pub struct McpTool {
    pub server: String,
    pub tool: String,
    /// Named `<server>__<tool>` (see [`model_names`]), with the tool's input schema.
    pub def: ToolDef,
    pub permission: Permission,
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
}

#[derive(Default)]
struct State {
    connection: Option<Arc<Connection>>,
    /// When it was last started: one that dies is not started again sooner than [`RESTART_AFTER`].
    started: Option<Instant>,
}

struct Connection {
    client: RunningService<RoleClient, ()>,
}

const RESTART_AFTER: Duration = Duration::from_secs(2);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

impl McpServers {
    pub fn new(configs: &BTreeMap<String, McpServerConfig>) -> McpServers {
        let servers = configs
            .iter()
            .map(|(name, config)| Server { name: name.clone(), config: config.clone(), state: Default::default() })
            .collect();
        McpServers { servers }
    }

    pub fn is_empty(&self) -> bool {
        self.servers.is_empty()
    }

    pub fn has(&self, server: &str) -> bool {
        self.servers.iter().any(|s| s.name == server)
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.servers.iter().map(|s| s.name.as_str())
    }

    /// Every tool of every server, listed afresh (`tools/list`: a server's list may change,
    /// and a server that has died is found here and started again), minus those its
    /// declaration denies, with what was found per server. A server that cannot be reached
    /// is an error: the turn says so.
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
        let names = model_names(found.iter().map(|(server, tool, _)| (server.name.as_str(), tool.name.as_ref())));
        let tools = found
            .into_iter()
            .zip(names)
            .map(|((server, tool, permission), name)| McpTool {
                server: server.name.clone(),
                tool: tool.name.to_string(),
                def: ToolDef {
                    name,
                    description: tool.description.as_deref().unwrap_or_default().to_string(),
                    parameters: Value::Object((*tool.input_schema).clone()),
                },
                permission,
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
                ToolAnswer::failed(format!("MCP server {server}: the call of {tool} failed: {error}"))
            }
            Err(_) => ToolAnswer::failed(format!("MCP server {server}: {tool} took longer than {} s", limit.as_secs())),
        }
    }

    /// Stops every server (their processes end with their connections).
    pub async fn shutdown(&self) {
        for server in &self.servers {
            let connection = server.state.lock().await.connection.take();
            if let Some(connection) = connection.and_then(Arc::into_inner) {
                let _ = connection.client.cancel().await;
            }
        }
    }
}

impl Server {
    /// The live connection, made (again) if there is none or it has closed.
    async fn connection(&self) -> Result<Arc<Connection>, McpError> {
        let mut state = self.state.lock().await;
        if let Some(connection) = state.connection.as_ref().filter(|c| !c.client.is_closed()) {
            return Ok(connection.clone());
        }
        if let Some(started) = state.started.filter(|at| at.elapsed() < RESTART_AFTER) {
            tokio::time::sleep(RESTART_AFTER - started.elapsed()).await;
        }
        state.started = Some(Instant::now());
        let connection = match tokio::time::timeout(CONNECT_TIMEOUT, self.connect()).await {
            Ok(connection) => Arc::new(connection?),
            Err(_) => return Err(self.error(format!("no answer within {} s", CONNECT_TIMEOUT.as_secs()))),
        };
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
                let mut headers = HashMap::new();
                for (name, value) in &self.config.headers {
                    let name = reqwest::header::HeaderName::try_from(name.as_str())
                        .map_err(|e| self.error(format!("header {name:?}: {e}")))?;
                    let value = reqwest::header::HeaderValue::try_from(value.as_str())
                        .map_err(|e| self.error(format!("the value of header {name}: {e}")))?;
                    headers.insert(name, value);
                }
                let config = StreamableHttpClientTransportConfig::with_uri(url.as_str()).custom_headers(headers);
                let transport = StreamableHttpClientTransport::from_config(config);
                ().serve(transport).await.map_err(|e| self.error(format!("{url} did not start MCP: {e}")))?
            }
            (None, None) => return Err(self.error("neither `command` nor `url` is set".into())),
        };
        Ok(Connection { client })
    }

    /// The server's tools. A connection that has closed is made again, once.
    async fn list(&self) -> Result<Vec<rmcp::model::Tool>, McpError> {
        let connection = self.connection().await?;
        match connection.client.peer().list_all_tools().await {
            Ok(tools) => Ok(tools),
            Err(ServiceError::TransportClosed | ServiceError::TransportSend(_)) => {
                tracing::warn!(server = %self.name, "MCP server gone; starting it again");
                self.forget(&connection).await;
                let connection = self.connection().await?;
                connection
                    .client
                    .peer()
                    .list_all_tools()
                    .await
                    .map_err(|e| self.error(format!("tools/list failed: {e}")))
            }
            Err(error) => Err(self.error(format!("tools/list failed: {error}"))),
        }
    }

    /// Drops `connection` if it is still the server's (a newer one stays).
    async fn forget(&self, connection: &Arc<Connection>) {
        let mut state = self.state.lock().await;
        if state.connection.as_ref().is_some_and(|c| Arc::ptr_eq(c, connection)) {
            state.connection = None;
        }
    }

    fn error(&self, message: String) -> McpError {
        McpError { server: self.name.clone(), message }
    }
}

/// The server's content blocks as the log keeps them (MCP's `text`, `image`, `resource`...
/// are the shapes the log's blocks already take).
fn answer_of(result: CallToolResult) -> ToolAnswer {
    let content = result
        .content
        .iter()
        .filter_map(|block| serde_json::to_value(block).ok())
        .filter_map(|value| serde_json::from_value::<Block>(value).ok())
        .collect();
    ToolAnswer { content, structured: result.structured_content, is_error: result.is_error.unwrap_or(false) }
}

/// The longest tool name the model providers take (Anthropic and OpenAI: 64).
const MAX_NAME: usize = 64;

/// The names the model sees for `(server, tool)` pairs: `<server>__<tool>`, made into a
/// name every provider takes (`[a-zA-Z0-9_-]{1,64}`): another character becomes `_`, and a
/// name that is too long, or that another pair's name became, is cut and given a hash of
/// the pair, so each name stays the same from turn to turn and tells its pair apart.
pub fn model_names<'a>(pairs: impl Iterator<Item = (&'a str, &'a str)>) -> Vec<String> {
    let mut taken = std::collections::HashSet::new();
    let mut out = Vec::new();
    for (server, tool) in pairs {
        let full = format!("{server}{SEPARATOR}{tool}");
        let clean: String =
            full.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' || c == '-' { c } else { '_' }).collect();
        let name = if clean.len() <= MAX_NAME && !taken.contains(&clean) {
            clean
        } else {
            // FNV-1a: small, and the same in every build.
            let hash = full.bytes().fold(0x811c_9dc5_u32, |h, b| (h ^ u32::from(b)).wrapping_mul(0x0100_0193));
            format!("{}_{hash:08x}", &clean[..clean.len().min(MAX_NAME - 9)])
        };
        taken.insert(name.clone());
        out.push(name);
    }
    out
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
        assert_eq!(names[1], "files__read_file");
        // `read_file` would clash with what `read.file` became: it is told apart by a hash.
        assert!(names[2].starts_with("files__read_file_") && names[2] != names[1], "{names:?}");
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
    }
}
