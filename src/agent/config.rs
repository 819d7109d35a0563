//! An agent's config as the config file declares it: its model, tools, modes, models,
//! context budget and options, with their defaults.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::mcp;
use crate::domain::event::{ClientTool, Permission};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentConfig {
    #[serde(default)]
    pub title: Option<String>,
    #[serde(default = "default_version")]
    pub version: String,
    #[serde(default)]
    pub description: String,
    #[serde(default)]
    pub system: String,
    #[serde(default = "default_max_turn_requests")]
    pub max_turn_requests: u32,
    pub model: ModelConfig,
    /// Server tools this agent may use, with their permission.
    #[serde(default)]
    pub tools: BTreeMap<String, Permission>,
    #[serde(default)]
    pub options: Vec<OptionSpec>,
    /// Tools the client runs, for dialects whose clients cannot declare their own.
    #[serde(default)]
    pub client_tools: Vec<ClientTool>,
    /// MCP servers whose tools the agent has, by server name.
    #[serde(default)]
    pub mcp_servers: BTreeMap<String, mcp::McpServerConfig>,
    /// Keeping long sessions inside the model's context window (docs/compaction.md).
    #[serde(default)]
    pub context: ContextConfig,
    /// Its sessions end after this long with no event and no turn running (0: never);
    /// unset, `[engine] session_idle_timeout_secs` holds.
    #[serde(default)]
    pub idle_timeout_secs: Option<u64>,
    /// Modes a session of this agent can run in, by id (an editor's mode picker): each
    /// changes what its tools may do. None: the tools run as `tools` says.
    #[serde(default)]
    pub modes: BTreeMap<String, ModeConfig>,
    /// The mode a session starts in; needed when there are modes.
    #[serde(default)]
    pub default_mode: Option<String>,
    /// Other models a session of this agent may switch to (an editor's model picker), by
    /// id in `[models]`; its own `model` is the one it starts with, [`DEFAULT_MODEL`].
    #[serde(default)]
    pub models: Vec<String>,
}

/// A mode of an agent's sessions: its name and description for a picker, and what the
/// tools may do in it, by tool name, `"*"` for every tool not named. `deny` keeps the tool
/// offered and refuses each call, saying that the mode does not allow it; `ask` asks
/// before each call (unless the user chose to always allow the tool); `allow` runs it.
/// A tool the mode does not name (and no `"*"`) runs as the agent's `tools` say.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModeConfig {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub description: String,
    #[serde(default)]
    pub tools: BTreeMap<String, Permission>,
}

impl ModeConfig {
    /// What the mode says of `tool`, if anything.
    pub fn permission(&self, tool: &str) -> Option<Permission> {
        self.tools.get(tool).or_else(|| self.tools.get("*")).copied()
    }
}

/// When and how a session's history is compacted. With no `window` (and no known window
/// for the model's name), never.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ContextConfig {
    /// The model's context window, in tokens.
    #[serde(default)]
    pub window: Option<u64>,
    /// A request estimated past this share of the window is compacted first.
    #[serde(default = "default_compact_at")]
    pub compact_at: f64,
    /// What a compaction aims for: the kept history and the summary within this share.
    #[serde(default = "default_keep")]
    pub keep: f64,
    /// The most a summary may take, in tokens (default: an eighth of the window).
    #[serde(default)]
    pub summary_tokens: Option<u64>,
    /// Cut old tool outputs before summarising anything.
    #[serde(default)]
    pub drop_tool_outputs: bool,
}

impl Default for ContextConfig {
    fn default() -> ContextConfig {
        ContextConfig {
            window: None,
            compact_at: default_compact_at(),
            keep: default_keep(),
            summary_tokens: None,
            drop_tool_outputs: false,
        }
    }
}

fn default_compact_at() -> f64 {
    0.8
}

fn default_keep() -> f64 {
    0.5
}

impl ContextConfig {
    /// Checks the shares and sizes, naming the field at `at`.
    pub(super) fn check(&self, at: &str) -> Result<(), String> {
        if !(self.keep > 0.0 && self.keep < self.compact_at && self.compact_at <= 1.0) {
            return Err(format!(
                "{at}: keep ({}) and compact_at ({}) must hold 0 < keep < compact_at <= 1",
                self.keep, self.compact_at
            ));
        }
        if self.window.is_some_and(|w| w < 256) {
            return Err(format!("{at}.window: at least 256 tokens"));
        }
        Ok(())
    }
}

/// An agent's context budget, in tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContextBudget {
    /// A request estimated past this is compacted first.
    pub compact_above: u64,
    /// What a compaction aims for: the kept history and the summary within this.
    pub keep: u64,
    /// The most a summary may take.
    pub summary: u64,
    /// Whether old tool outputs are cut before anything is summarised.
    pub drop_tool_outputs: bool,
}

/// The context windows of models known by name, for agents whose config gives none.
pub(super) fn known_window(model: &str) -> Option<u64> {
    let windows: [(&str, u64); 4] =
        [("claude-", 200_000), ("gpt-4.1", 1_047_576), ("gpt-4o", 128_000), ("gpt-4-turbo", 128_000)];
    windows.iter().find(|(prefix, _)| model.starts_with(prefix)).map(|(_, window)| *window)
}

fn default_version() -> String {
    "1.0.0".into()
}

pub(super) fn default_max_turn_requests() -> u32 {
    16
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Provider {
    Scripted,
    Openai,
    Anthropic,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    pub provider: Provider,
    /// The model name sent to the provider (and recorded in spans).
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub base_url: Option<String>,
    /// The environment variable that holds the API key (the key itself is never in config).
    #[serde(default)]
    pub api_key_env: Option<String>,
    #[serde(default = "default_timeout")]
    pub timeout_secs: u64,
    /// A stream with no data for this long is treated as failed.
    #[serde(default = "default_stall")]
    pub stall_timeout_secs: u64,
    #[serde(default)]
    pub max_tokens: Option<u32>,
    #[serde(default)]
    pub temperature: Option<f32>,
    #[serde(default)]
    pub top_p: Option<f32>,
    #[serde(default = "default_retries")]
    pub max_retries: u32,
    /// Whether each response must call one of the tools offered (sent only when tools are).
    #[serde(default)]
    pub tool_choice: ToolChoice,
    /// Whether the model takes images. A message with one, to a model that does not, is
    /// refused at the request (400), never dropped on the way.
    #[serde(default = "yes")]
    pub images: bool,
}

fn yes() -> bool {
    true
}

/// `auto`: the model decides (nothing is sent, the APIs' default); `required`: every
/// response calls a tool (OpenAI's `required`, Anthropic's `any`), so a turn ends only when a
/// call waits for the client or at `max_turn_requests`; `none`: no response calls one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolChoice {
    #[default]
    Auto,
    Required,
    None,
}

impl ModelConfig {
    /// The embedded scripted model, recorded under `name`.
    pub fn scripted(name: &str) -> ModelConfig {
        ModelConfig {
            provider: Provider::Scripted,
            name: name.into(),
            base_url: None,
            api_key_env: None,
            timeout_secs: default_timeout(),
            stall_timeout_secs: default_stall(),
            max_tokens: None,
            temperature: None,
            top_p: None,
            max_retries: default_retries(),
            tool_choice: ToolChoice::Auto,
            images: true,
        }
    }
}

fn default_timeout() -> u64 {
    120
}

fn default_stall() -> u64 {
    60
}

fn default_retries() -> u32 {
    3
}

/// An option a client may set per session (AAP `options`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OptionSpec {
    #[serde(rename = "type")]
    pub kind: OptionKind,
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
    #[serde(default)]
    pub default: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OptionKind {
    Text,
    Secret,
    Select,
}
