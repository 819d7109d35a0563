//! Agents: declared in config (model, system prompt, server tools and their permissions,
//! limits, options), each with its model built once at start.

pub mod anthropic;
mod config;
mod http;
pub mod mcp;
pub mod model;
pub mod openai;
pub mod scripted;
pub mod tools;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use crate::domain::catalog::AgentDefinition;
use crate::domain::event::Permission;
use crate::domain::SessionId;
use config::{default_max_turn_requests, known_window};
pub use config::{
    AgentConfig, ContextBudget, ContextConfig, ModeConfig, ModelConfig, OptionKind, OptionSpec, Provider, ToolChoice,
};
pub use model::{Model, ModelError, ModelEvent, ModelRequest, ModelStop, ModelStream, ToolDef};
use parking_lot::RwLock;
pub use tools::Tools;

pub use crate::domain::event::DEFAULT_MODEL;

/// The model a session runs, as chosen: its config and the model itself.
#[derive(Clone)]
pub struct ChosenModel {
    pub config: ModelConfig,
    pub model: Arc<dyn Model>,
    /// The agent's own model (`default`).
    pub own: bool,
}

/// Builds the model an agent's config names.
pub fn build_model(config: &ModelConfig) -> Result<Arc<dyn Model>, String> {
    match config.provider {
        Provider::Scripted => Ok(Arc::new(scripted::ScriptedModel::new(&config.name))),
        Provider::Openai => Ok(Arc::new(openai::OpenAiModel::new(config)?)),
        Provider::Anthropic => Ok(Arc::new(anthropic::AnthropicModel::new(config)?)),
    }
}

/// A catalog agent's MCP servers as a config declares them: each server with its
/// toolset's permissions.
fn mcp_configs(definition: &AgentDefinition) -> BTreeMap<String, mcp::McpServerConfig> {
    let mut out = BTreeMap::new();
    for server in &definition.mcp_servers {
        let mut config = mcp::McpServerConfig::http(server.url.clone(), BTreeMap::new());
        if let Some(toolset) = definition.mcp_toolsets.iter().find(|t| t.server == server.name) {
            config.permission = if toolset.enabled { toolset.permission } else { Permission::Deny };
            config.tools = toolset.rules.iter().map(|r| (r.name.clone(), toolset.permission_of(&r.name))).collect();
        }
        out.insert(server.name.clone(), config);
    }
    out
}

/// An agent ready to run: its config, its model and its tools.
pub struct Agent {
    /// A configured agent's name, or a catalog agent's id.
    pub name: String,
    pub config: AgentConfig,
    pub model: Arc<dyn Model>,
    /// The catalog definition this version was built from (none for configured agents).
    pub definition: Option<AgentDefinition>,
    /// Its MCP servers, connected on first use and shared by its sessions.
    pub mcp: Arc<mcp::McpServers>,
    /// The other models its sessions may choose (its `models`), by id.
    pub choices: BTreeMap<String, ChosenModel>,
}

impl Agent {
    /// The mode a session of this agent runs in (its `spec.mode`, else the default), with
    /// its id; `None` for an agent without modes. A mode the config no longer has (renamed
    /// or removed since the session chose it) is the default: never no mode at all.
    pub fn mode(&self, chosen: Option<&str>) -> Option<(&str, &ModeConfig)> {
        let modes = &self.config.modes;
        if let Some((id, mode)) = chosen.and_then(|id| modes.get_key_value(id)) {
            return Some((id.as_str(), mode));
        }
        if let Some(gone) = chosen {
            tracing::warn!(agent = %self.name, mode = gone, "a session's mode is no longer configured; it runs in the default");
        }
        let id = self.config.default_mode.as_deref()?;
        modes.get_key_value(id).map(|(id, mode)| (id.as_str(), mode))
    }

    /// The model a session of this agent runs (its `spec.model`, else the agent's own),
    /// with its id. A model the config no longer offers is the agent's own.
    pub fn model_for(&self, chosen: Option<&str>) -> (&str, ChosenModel) {
        if let Some((id, choice)) = self.choice(chosen) {
            return (id, choice.clone());
        }
        if let Some(gone) = chosen.filter(|id| *id != DEFAULT_MODEL) {
            tracing::warn!(agent = %self.name, model = gone, "a session's model is no longer offered; it runs the agent's own");
        }
        (DEFAULT_MODEL, ChosenModel { config: self.config.model.clone(), model: self.model.clone(), own: true })
    }

    /// The config of the model a session runs, as [`Agent::model_for`] picks it (read on
    /// every submission: nothing is cloned).
    pub fn model_config(&self, chosen: Option<&str>) -> &ModelConfig {
        self.choice(chosen).map_or(&self.config.model, |(_, choice)| &choice.config)
    }

    /// The session's choice among the agent's `models`, if it made one still offered.
    fn choice(&self, chosen: Option<&str>) -> Option<(&str, &ChosenModel)> {
        let (id, choice) = self.choices.get_key_value(chosen?)?;
        Some((id.as_str(), choice))
    }

    /// The context window in tokens of `model` as this agent runs it: for its own model,
    /// the agent's `context.window`, else the known window of the model's name; for one of
    /// its `models`, the known window of its name, else the agent's `context.window`.
    pub fn context_window(&self, model: &ChosenModel) -> Option<u64> {
        let (configured, known) = (self.config.context.window, known_window(&model.config.name));
        match model.own {
            true => configured.or(known),
            false => known.or(configured),
        }
    }

    /// The agent's context budget with `model`: from its `context` config, with the window
    /// it names or the one the model is known to have; `None` if neither.
    pub fn context_budget(&self, model: &ChosenModel) -> Option<ContextBudget> {
        let context = &self.config.context;
        let window = self.context_window(model)?;
        let share = |share: f64| (window as f64 * share) as u64;
        Some(ContextBudget {
            compact_above: share(context.compact_at),
            keep: share(context.keep),
            summary: context.summary_tokens.unwrap_or(window / 8).min(share(context.keep) / 2),
            drop_tool_outputs: context.drop_tool_outputs,
        })
    }

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

/// Every agent: those configured, by name, and those defined in the catalog through an
/// API, by id and version (each with a model picked by id from `[models]`).
pub struct Agents {
    configured: BTreeMap<String, Arc<Agent>>,
    defined: RwLock<BTreeMap<String, BTreeMap<u32, Arc<Agent>>>>,
    models: BTreeMap<String, ModelConfig>,
    pub tools: Arc<Tools>,
    /// MCP servers a client declared for one session (ACP's `mcpServers`), held until it
    /// declares others, the session is archived or deleted, or this process stops: never
    /// stored, as their `env` and `headers` may hold secrets.
    attached: parking_lot::Mutex<HashMap<SessionId, Arc<mcp::McpServers>>>,
}

/// An agent with modes names its default one, among them.
fn check_modes(name: &str, config: &AgentConfig) -> Result<(), String> {
    let modes: Vec<&str> = config.modes.keys().map(String::as_str).collect();
    match (&config.default_mode, modes.is_empty()) {
        (None, true) => Ok(()),
        (Some(default), true) => Err(format!("agents.{name}.default_mode: {default:?}, but the agent has no modes")),
        (None, false) => Err(format!("agents.{name}.default_mode: needed with modes (one of {})", modes.join(", "))),
        (Some(default), false) if !modes.contains(&default.as_str()) => {
            Err(format!("agents.{name}.default_mode: {default:?} is not one of its modes ({})", modes.join(", ")))
        }
        (Some(_), false) => Ok(()),
    }
}

/// The models an agent's sessions may choose besides its own: each of its `models`, one of
/// `[models]` (and not `default`, its own model's id).
fn choices(
    name: &str,
    config: &AgentConfig,
    models: &BTreeMap<String, ModelConfig>,
) -> Result<BTreeMap<String, ChosenModel>, String> {
    let mut out = BTreeMap::new();
    for id in &config.models {
        let at = format!("agents.{name}.models");
        let Some(model) = models.get(id).filter(|_| id != DEFAULT_MODEL) else {
            let known: Vec<&str> = models.keys().map(String::as_str).collect();
            return Err(format!("{at}: {id:?} is not one of [models] ({})", known.join(", ")));
        };
        let built = build_model(model).map_err(|e| format!("{at}: {id:?}: {e}"))?;
        if out.insert(id.clone(), ChosenModel { config: model.clone(), model: built, own: false }).is_some() {
            return Err(format!("{at}: {id:?} is listed twice"));
        }
    }
    Ok(out)
}

/// The model id that always exists: the embedded scripted model.
pub const SCRIPTED: &str = "scripted";

impl Agents {
    pub fn build(
        configs: &BTreeMap<String, AgentConfig>,
        models: &BTreeMap<String, ModelConfig>,
        tools: Tools,
    ) -> Result<Agents, String> {
        let mut models = models.clone();
        models.entry(SCRIPTED.into()).or_insert_with(|| ModelConfig::scripted(SCRIPTED));
        let mut configured = BTreeMap::new();
        for (name, config) in configs {
            for tool in config.tools.keys() {
                if !tools.has(tool) {
                    return Err(format!("agents.{name}.tools: there is no server tool named {tool:?}"));
                }
            }
            for (server, mcp) in &config.mcp_servers {
                mcp.check(&format!("agents.{name}.mcp_servers.{server}"), server)?;
            }
            config.context.check(&format!("agents.{name}.context"))?;
            check_modes(name, config)?;
            let model = build_model(&config.model).map_err(|e| format!("agents.{name}.model: {e}"))?;
            let mcp = Arc::new(mcp::McpServers::new(&config.mcp_servers));
            let choices = choices(name, config, &models)?;
            let agent = Agent { name: name.clone(), config: config.clone(), model, definition: None, mcp, choices };
            configured.insert(name.clone(), Arc::new(agent));
        }
        for (id, config) in &models {
            build_model(config).map_err(|e| format!("models.{id}: {e}"))?;
        }
        Ok(Agents {
            configured,
            defined: RwLock::default(),
            models,
            tools: Arc::new(tools),
            attached: Default::default(),
        })
    }

    /// A configured agent by name, or the latest version of a catalog agent by id.
    pub fn get(&self, name: &str) -> Option<Arc<Agent>> {
        self.get_version(name, None)
    }

    /// A catalog agent's given version (any version of a configured agent is itself).
    pub fn get_version(&self, name: &str, version: Option<u32>) -> Option<Arc<Agent>> {
        if let Some(agent) = self.configured.get(name) {
            return Some(agent.clone());
        }
        let defined = self.defined.read();
        let versions = defined.get(name)?;
        match version {
            Some(version) => versions.get(&version).cloned(),
            None => versions.values().next_back().cloned(),
        }
    }

    /// Whether any configured agent sets its own idle timeout.
    pub fn any_idle_timeout(&self) -> bool {
        self.configured.values().any(|agent| agent.config.idle_timeout_secs.is_some_and(|secs| secs > 0))
    }

    /// Every agent, configured first, then the catalog's latest versions (archived ones left out).
    pub fn all(&self) -> Vec<Arc<Agent>> {
        let defined = self.defined.read();
        let latest = defined.values().filter_map(|versions| versions.values().next_back());
        let live = latest.filter(|a| a.definition.as_ref().is_some_and(|d| d.archived_at.is_none()));
        self.configured.values().cloned().chain(live.cloned()).collect()
    }

    /// Stops every MCP server: every agent's, and those attached to sessions.
    pub async fn shutdown(&self) {
        let defined: Vec<Arc<Agent>> = self.defined.read().values().flat_map(|v| v.values().cloned()).collect();
        for agent in self.configured.values().chain(&defined) {
            agent.mcp.shutdown().await;
        }
        let attached: Vec<_> = self.attached.lock().drain().map(|(_, servers)| servers).collect();
        for servers in attached {
            servers.shutdown().await;
        }
    }

    /// Gives `session` the MCP servers a client declared for it, in place of any it had.
    /// Sessions given the same servers share them (an editor declares its servers for
    /// every session), as an agent's sessions share the agent's.
    pub async fn attach(&self, session: SessionId, configs: BTreeMap<String, mcp::McpServerConfig>) {
        let old = {
            let mut attached = self.attached.lock();
            let same = attached.values().find(|s| s.declared_as(&configs)).cloned();
            let servers = same.unwrap_or_else(|| Arc::new(mcp::McpServers::new(&configs)));
            attached.insert(session, servers)
        };
        self.release(old).await;
    }

    /// Takes the MCP servers a client declared off `session`.
    pub async fn detach(&self, session: SessionId) {
        let old = self.attached.lock().remove(&session);
        self.release(old).await;
    }

    /// Stops servers no session holds any more.
    async fn release(&self, old: Option<Arc<mcp::McpServers>>) {
        let Some(old) = old else { return };
        let held = self.attached.lock().values().any(|s| Arc::ptr_eq(s, &old));
        if !held {
            old.shutdown().await;
        }
    }

    /// The MCP servers a session of `agent` has: the agent's, then those its client declared
    /// for it (each set may be empty). A turn offers their tools; the session, their prompts.
    pub fn servers_of(&self, agent: &Agent, session: SessionId) -> Vec<Arc<mcp::McpServers>> {
        [Some(agent.mcp.clone()), self.attached(session)].into_iter().flatten().collect()
    }

    /// The MCP servers a client declared for `session`, if any.
    pub fn attached(&self, session: SessionId) -> Option<Arc<mcp::McpServers>> {
        self.attached.lock().get(&session).cloned()
    }

    /// The model ids a catalog agent may name.
    pub fn model_ids(&self) -> impl Iterator<Item = &str> {
        self.models.keys().map(String::as_str)
    }

    /// Makes a catalog agent's version runnable. Its model id must be one of `[models]`.
    pub fn define(&self, definition: &AgentDefinition) -> Result<Arc<Agent>, String> {
        let Some(model) = self.models.get(&definition.model) else {
            let known: Vec<&str> = self.model_ids().collect();
            return Err(format!("no model {:?}; this server has: {}", definition.model, known.join(", ")));
        };
        let config = AgentConfig {
            title: Some(definition.name.clone()),
            version: definition.version.to_string(),
            description: definition.description.clone().unwrap_or_default(),
            system: definition.system.clone().unwrap_or_default(),
            max_turn_requests: default_max_turn_requests(),
            model: model.clone(),
            tools: BTreeMap::new(),
            options: Vec::new(),
            client_tools: definition.tools.clone(),
            mcp_servers: mcp_configs(definition),
            context: ContextConfig::default(),
            idle_timeout_secs: None,
            modes: BTreeMap::new(),
            default_mode: None,
            models: Vec::new(),
        };
        let model = build_model(&config.model)?;
        // A version with the servers of the one before shares them: its sessions and
        // theirs use one connection each.
        let before = self.defined.read().get(&definition.id).and_then(|v| v.values().next_back().cloned());
        let mcp = match before.filter(|b| b.mcp.declared_as(&config.mcp_servers)) {
            Some(before) => before.mcp.clone(),
            None => Arc::new(mcp::McpServers::new(&config.mcp_servers)),
        };
        let (name, defined, choices) = (definition.id.clone(), Some(definition.clone()), BTreeMap::new());
        let agent = Arc::new(Agent { name, config, model, definition: defined, mcp, choices });
        self.defined.write().entry(definition.id.clone()).or_default().insert(definition.version, agent.clone());
        Ok(agent)
    }
}
