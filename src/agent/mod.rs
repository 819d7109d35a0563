//! Agents: declared in config (model, system prompt, server tools and their permissions,
//! limits, options), each with its model built once at start.

pub mod anthropic;
mod http;
pub mod model;
pub mod openai;
pub mod scripted;
pub mod tools;

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::domain::event::Permission;
pub use model::{Model, ModelError, ModelEvent, ModelRequest, ModelStop, ModelStream, ToolDef};
pub use tools::Tools;

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
}

fn default_version() -> String {
    "1.0.0".into()
}

fn default_max_turn_requests() -> u32 {
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

/// Builds the model an agent's config names.
pub fn build_model(config: &ModelConfig) -> Result<Arc<dyn Model>, String> {
    match config.provider {
        Provider::Scripted => Ok(Arc::new(scripted::ScriptedModel::new(&config.name))),
        Provider::Openai => Ok(Arc::new(openai::OpenAiModel::new(config)?)),
        Provider::Anthropic => Ok(Arc::new(anthropic::AnthropicModel::new(config)?)),
    }
}

/// An agent ready to run: its config, its model and its tools.
pub struct Agent {
    pub name: String,
    pub config: AgentConfig,
    pub model: Arc<dyn Model>,
}

impl Agent {
    /// The server tools a client may see and enable: the agent's, less those it denies and
    /// those configured `exposed = false` (which run, unlisted, whenever the agent has them).
    pub fn exposed_tools<'a>(&'a self, tools: &'a Tools) -> impl Iterator<Item = &'a str> + 'a {
        self.config
            .tools
            .iter()
            .filter(|(name, permission)| **permission != Permission::Deny && tools.exposed(name))
            .map(|(name, _)| name.as_str())
    }
}

/// Every configured agent, by name.
pub struct Agents {
    agents: BTreeMap<String, Arc<Agent>>,
    pub tools: Arc<Tools>,
}

impl Agents {
    pub fn build(configs: &BTreeMap<String, AgentConfig>, tools: Tools) -> Result<Agents, String> {
        let mut agents = BTreeMap::new();
        for (name, config) in configs {
            for tool in config.tools.keys() {
                if !tools.has(tool) {
                    return Err(format!("agents.{name}.tools: there is no server tool named {tool:?}"));
                }
            }
            let model = build_model(&config.model).map_err(|e| format!("agents.{name}.model: {e}"))?;
            agents.insert(name.clone(), Arc::new(Agent { name: name.clone(), config: config.clone(), model }));
        }
        Ok(Agents { agents, tools: Arc::new(tools) })
    }

    pub fn get(&self, name: &str) -> Option<Arc<Agent>> {
        self.agents.get(name).cloned()
    }

    pub fn all(&self) -> impl Iterator<Item = &Arc<Agent>> {
        self.agents.values()
    }
}
