//! How an MCP server is declared (in config, through an API, or by an ACP client), and the
//! declaration's checks: one transport, valid headers, and where a caller that is not an
//! admin may have turnlog reach.

use std::collections::{BTreeMap, HashMap};

use serde::Deserialize;

use crate::domain::event::Permission;

#[derive(Debug, Clone, PartialEq, Deserialize)]
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
    /// The operator's word that every tool of the server may run twice: a turn resumed
    /// after a crash runs such a call again rather than answering that it was interrupted
    /// (as it does for tools the server annotates `readOnlyHint` or `idempotentHint`).
    #[serde(default)]
    pub idempotent: bool,
}

fn ask() -> Permission {
    Permission::Ask
}

fn default_call_timeout() -> u64 {
    60
}

impl McpServerConfig {
    /// A server over stdio, every tool asking, with the default timeout.
    pub fn stdio(command: String, args: Vec<String>, env: BTreeMap<String, String>) -> McpServerConfig {
        McpServerConfig {
            command: Some(command),
            args,
            env,
            url: None,
            ..McpServerConfig::http(String::new(), BTreeMap::new())
        }
    }

    /// A server over Streamable HTTP, every tool asking, with the default timeout.
    pub fn http(url: String, headers: BTreeMap<String, String>) -> McpServerConfig {
        McpServerConfig {
            command: None,
            args: Vec::new(),
            env: BTreeMap::new(),
            url: Some(url),
            headers,
            permission: Permission::Ask,
            tools: BTreeMap::new(),
            timeout_secs: default_call_timeout(),
            idempotent: false,
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
            let shown = shown_url(url);
            let parsed = reqwest::Url::parse(url).map_err(|e| format!("{at}: `url` {shown:?}: {e}"))?;
            if !matches!(parsed.scheme(), "http" | "https") {
                return Err(format!("{at}: `url` {shown:?}: an MCP server is reached over http or https"));
            }
        }
        self.header_map().map_err(|e| format!("{at}: {e}"))?;
        Ok(())
    }

    /// The headers as HTTP takes them; a name or value it cannot take is named (the value
    /// is not shown: it may be a secret).
    pub(super) fn header_map(
        &self,
    ) -> Result<HashMap<reqwest::header::HeaderName, reqwest::header::HeaderValue>, String> {
        let mut headers = HashMap::new();
        for (name, value) in &self.headers {
            let key = reqwest::header::HeaderName::try_from(name.as_str())
                .map_err(|_| format!("header {name:?} is not a valid header name"))?;
            let value = reqwest::header::HeaderValue::try_from(value.as_str())
                .map_err(|_| format!("the value of header {name:?} is not a valid header value"))?;
            headers.insert(key, value);
        }
        Ok(headers)
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
            Some(host) if crate::agent::tools::host_allowed(allowed_hosts, &host) => Ok(()),
            _ => Err(format!(
                "{at}: the host of {:?} is not one this server may reach for you (tools.mcp.allowed_hosts)",
                shown_url(url)
            )),
        }
    }

    pub(super) fn transport(&self) -> &'static str {
        if self.command.is_some() {
            "stdio"
        } else {
            "streamable-http"
        }
    }
}

/// A URL as messages and logs show it: no user, password, query or fragment (they may
/// hold secrets).
pub fn shown_url(url: &str) -> String {
    match reqwest::Url::parse(url) {
        Ok(parsed) => {
            let port = parsed.port().map(|p| format!(":{p}")).unwrap_or_default();
            format!("{}://{}{port}{}", parsed.scheme(), parsed.host_str().unwrap_or_default(), parsed.path())
        }
        Err(_) => "(an invalid URL)".into(),
    }
}
