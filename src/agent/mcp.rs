//! Tools from MCP servers, through the official Rust SDK (`rmcp`): servers over stdio (a
//! command) or Streamable HTTP (a URL), declared per agent. Each server is connected on
//! first use and shared by every session of its agent; one that has died is started again
//! on the next use (at most once every few seconds). Its tools reach the model as
//! `<server>__<tool>`, each with the permission the config gives it.

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
use crate::domain::event::Permission;
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
    /// The config's mistakes, named.
    pub fn check(&self, agent: &str, name: &str) -> Result<(), String> {
        let at = format!("agents.{agent}.mcp_servers.{name}");
        if name.is_empty()
            || name.contains(SEPARATOR)
            || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            return Err(format!("{at}: a server name is letters, digits, `_` and `-`, without `{SEPARATOR}`"));
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
        Ok(())
    }
}

/// One of a server's tools, as the turn offers it.
#[derive(Debug, Clone)]
pub struct McpTool {
    pub server: String,
    pub tool: String,
    /// Named `<server>__<tool>`, with the tool's input schema.
    pub def: ToolDef,
    pub permission: Permission,
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

/// An agent's MCP servers.
#[derive(Default)]
pub struct McpServers {
    servers: Vec<Server>,
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

    /// Every tool of every server, listed afresh (`tools/list`: a server's list may change,
    /// and a server that has died is found here and started again), minus those the config
    /// denies. A server that cannot be reached is an error: the turn says so.
    pub async fn tools(&self) -> Result<Vec<McpTool>, McpError> {
        let mut out = Vec::new();
        for server in &self.servers {
            for tool in &server.list().await? {
                let permission =
                    server.config.tools.get(tool.name.as_ref()).copied().unwrap_or(server.config.permission);
                if permission == Permission::Deny {
                    continue;
                }
                let description = tool.description.as_deref().unwrap_or_default().to_string();
                out.push(McpTool {
                    server: server.name.clone(),
                    tool: tool.name.to_string(),
                    def: ToolDef {
                        name: format!("{}{SEPARATOR}{}", server.name, tool.name),
                        description,
                        parameters: Value::Object((*tool.input_schema).clone()),
                    },
                    permission,
                });
            }
        }
        Ok(out)
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

/// `time__get_current_time` → (`time`, `get_current_time`).
pub fn split(name: &str) -> Option<(&str, &str)> {
    name.split_once(SEPARATOR)
}
