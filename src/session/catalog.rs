//! The catalog: agents and environments made through an API, kept durably in the
//! catalog's own log and folded into projections. Each change is read, checked, made and
//! appended under one lock, from the stored state (so two changes of one version cannot
//! both land, and another node's write makes the next one decide again). A change to an
//! agent appends its next version; the agent registry learns each version as it is stored,
//! and at start-up from the projection. What a subject makes, only it (and admins) sees.

use std::future::Future;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use super::log::SessionLog;
use super::{Caller, Page, SessionError, TimeBounds};
use crate::agent::mcp::McpServerConfig;
use crate::agent::{Agent, Agents};
use crate::domain::catalog::{AgentDefinition, Environment, McpServerDecl, McpToolset, CATALOG};
use crate::domain::event::{timestamp_now, ClientTool};
use crate::domain::ids::prefixed;
use crate::domain::{Draft, Event, EventBody};
use crate::projection::catalog::{catalog_key, AgentVersions, CatalogAgents, CatalogEnvironments};
use crate::store::{Key, Scan};

/// A new agent, as a view hands it over.
#[derive(Debug, Clone, Default)]
pub struct NewAgent {
    pub name: String,
    pub description: Option<String>,
    pub model: String,
    pub system: Option<String>,
    pub tools: Vec<ClientTool>,
    pub mcp_servers: Vec<McpServerDecl>,
    pub mcp_toolsets: Vec<McpToolset>,
    pub metadata: Map<String, Value>,
}

/// Changes to an agent: each field given replaces (`Some(None)` clears), `metadata` is a
/// patch (a `null` value deletes its key). With `version`, the change is made only if that
/// is still the agent's latest version.
#[derive(Debug, Clone, Default)]
pub struct AgentChange {
    pub version: Option<u32>,
    pub name: Option<String>,
    pub description: Option<Option<String>>,
    pub model: Option<String>,
    pub system: Option<Option<String>>,
    pub tools: Option<Vec<ClientTool>>,
    pub mcp_servers: Option<Vec<McpServerDecl>>,
    pub mcp_toolsets: Option<Vec<McpToolset>>,
    pub metadata: Option<Map<String, Value>>,
}

#[derive(Debug, Clone, Default)]
pub struct NewEnvironment {
    pub name: String,
    pub description: Option<String>,
    pub config: Value,
    pub metadata: Map<String, Value>,
}

/// Changes to an environment, as [`AgentChange`] has them.
#[derive(Debug, Clone, Default)]
pub struct EnvironmentChange {
    pub name: Option<String>,
    pub description: Option<Option<String>>,
    pub config: Option<Value>,
    pub metadata: Option<Map<String, Value>>,
}

/// Which entries to list, newest first: archived ones too when asked, made within
/// `created`, strictly past the entry `after` (the last one of the previous page).
#[derive(Debug, Clone, Default)]
pub struct CatalogFilter {
    pub include_archived: bool,
    pub created: TimeBounds,
    pub after: Option<String>,
    pub limit: usize,
}

pub struct Catalog {
    log: SessionLog,
    agents: Arc<Agents>,
    /// The catalog's changes, one at a time.
    writing: tokio::sync::Mutex<()>,
}

/// How many times a change is made again when another node appended first.
const ATTEMPTS: usize = 3;

/// Projected values read per step of a filtered listing.
const SCAN_CHUNK: usize = 256;

impl Catalog {
    /// Opens the catalog and teaches the registry every stored agent version.
    pub(crate) async fn open(log: SessionLog, agents: Arc<Agents>) -> Result<Catalog, SessionError> {
        let catalog = Catalog { log, agents, writing: tokio::sync::Mutex::new(()) };
        // Followed from before the scan, so that nothing made meanwhile is missed.
        let follower = catalog.log.live(CATALOG).await?;
        tokio::spawn(learn(follower, catalog.agents.clone()));
        let mut after = None;
        loop {
            let scan = Scan { session: Some(CATALOG), after, newest_first: false, limit: SCAN_CHUNK };
            let page = catalog.log.scan::<AgentVersions>(CatalogAgents::NAME, scan).await?;
            let Some((last, _)) = page.last() else { return Ok(catalog) };
            after = Some(*last);
            for definition in page.iter().flat_map(|(_, all)| &all.versions) {
                if let Err(error) = catalog.agents.define(definition) {
                    tracing::warn!(agent = %definition.id, version = definition.version, %error, "a stored agent cannot run here");
                }
            }
        }
    }

    /// Makes one change under the lock: `change` reads the stored state and says what to
    /// append; if another node appended first, it is asked again.
    async fn change<T, F, Fut>(&self, change: F) -> Result<T, SessionError>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<(EventBody, T), SessionError>>,
    {
        let _one_at_a_time = self.writing.lock().await;
        for _ in 0..ATTEMPTS {
            let at = self.log.position(CATALOG).await?;
            let (body, made) = change().await?;
            if self.log.append(CATALOG, at.seq, vec![Draft::new(None, &body)]).await?.is_ok() {
                if let EventBody::CatalogAgent { agent } = &body {
                    self.agents.define(agent).map_err(SessionError::Invalid)?;
                }
                return Ok(made);
            }
        }
        Err(SessionError::Conflict("the catalog kept changing under this request; send it again".into()))
    }

    /// Stores a new agent (version 1) and makes it runnable.
    pub async fn create_agent(&self, caller: &Caller, new: NewAgent) -> Result<AgentDefinition, SessionError> {
        let now = timestamp_now();
        let definition = AgentDefinition {
            id: prefixed("agent_"),
            version: 1,
            name: new.name,
            description: new.description,
            model: new.model,
            system: new.system,
            tools: new.tools,
            mcp_servers: new.mcp_servers,
            mcp_toolsets: new.mcp_toolsets,
            metadata: new.metadata,
            created_at: now.clone(),
            updated_at: now,
            archived_at: None,
            created_by: caller.subject.clone(),
        };
        check_agent(&self.agents, caller, &definition)?;
        self.change(|| async { Ok((EventBody::CatalogAgent { agent: definition.clone() }, definition.clone())) }).await
    }

    /// Stores the agent's next version with `change` made.
    pub async fn update_agent(
        &self,
        caller: &Caller,
        id: &str,
        change: AgentChange,
    ) -> Result<AgentDefinition, SessionError> {
        self.change(|| async {
            let current = self.stored_agent(caller, id).await?;
            if current.archived_at.is_some() {
                return Err(SessionError::Conflict(format!("agent {id} is archived: it takes no changes")));
            }
            if let Some(expected) = change.version.filter(|&v| v != current.version) {
                return Err(SessionError::Conflict(format!(
                    "agent {id} is at version {}, not {expected}; retrieve it and apply the change again",
                    current.version
                )));
            }
            let mut next = current.clone();
            next.version += 1;
            next.updated_at = timestamp_now();
            next.name = change.name.clone().unwrap_or(next.name);
            next.description = change.description.clone().unwrap_or(next.description);
            next.model = change.model.clone().unwrap_or(next.model);
            next.system = change.system.clone().unwrap_or(next.system);
            next.tools = change.tools.clone().unwrap_or(next.tools);
            next.mcp_servers = change.mcp_servers.clone().unwrap_or(next.mcp_servers);
            next.mcp_toolsets = change.mcp_toolsets.clone().unwrap_or(next.mcp_toolsets);
            if let Some(patch) = &change.metadata {
                apply_patch(&mut next.metadata, patch.clone());
            }
            check_agent(&self.agents, caller, &next)?;
            Ok((EventBody::CatalogAgent { agent: next.clone() }, next))
        })
        .await
    }

    /// Archives the agent (its latest version records when): it stays readable and its
    /// sessions go on, but it is listed no more, takes no new sessions and no changes.
    pub async fn archive_agent(&self, caller: &Caller, id: &str) -> Result<AgentDefinition, SessionError> {
        let current = self.stored_agent(caller, id).await?;
        if current.archived_at.is_some() {
            return Ok(current);
        }
        self.change(|| async {
            let mut current = self.stored_agent(caller, id).await?;
            current.archived_at.get_or_insert_with(timestamp_now);
            Ok((EventBody::CatalogAgent { agent: current.clone() }, current))
        })
        .await
    }

    async fn stored_versions(&self, caller: &Caller, id: &str) -> Result<Vec<AgentDefinition>, SessionError> {
        let key = catalog_key("agent_", id).ok_or_else(|| not_found("agent", id))?;
        let all: Option<AgentVersions> = self.log.projected(CatalogAgents::NAME, key).await?;
        let all = all.map(|all| all.versions).unwrap_or_default();
        match all.last() {
            Some(latest) if caller.may_use(&latest.created_by) => Ok(all),
            _ => Err(not_found("agent", id)),
        }
    }

    async fn stored_agent(&self, caller: &Caller, id: &str) -> Result<AgentDefinition, SessionError> {
        let mut all = self.stored_versions(caller, id).await?;
        all.pop().ok_or_else(|| not_found("agent", id))
    }

    /// An agent as the caller may see it: a catalog agent's version (the latest when
    /// `None`), or a configured agent by name (which has one version).
    pub fn agent(&self, caller: &Caller, id: &str, version: Option<u32>) -> Option<AgentDefinition> {
        let agent = self.agents.get_version(id, version)?;
        match &agent.definition {
            Some(definition) => {
                let latest = self.agents.get(id).and_then(|a| a.definition.clone())?;
                caller.may_use(&latest.created_by).then(|| definition.clone())
            }
            None => version.is_none_or(|v| v == 1).then(|| describe(&agent)),
        }
    }

    /// Whether the caller may start a session of this agent: a configured one, or a
    /// catalog agent of its own that is not archived.
    pub fn usable(&self, caller: &Caller, agent: &Agent) -> Result<(), SessionError> {
        let Some(definition) = &agent.definition else { return Ok(()) };
        let latest = self.agents.get(&definition.id).and_then(|a| a.definition.clone());
        match latest {
            Some(latest) if !caller.may_use(&latest.created_by) => {
                Err(SessionError::Invalid(format!("invalid field `agent`: no agent named {:?}", definition.id)))
            }
            Some(latest) if latest.archived_at.is_some() => {
                Err(SessionError::Invalid(format!("invalid field `agent`: agent {} is archived", definition.id)))
            }
            _ => Ok(()),
        }
    }

    /// The agent a session was made with, whoever asks (the session's owner may see it).
    pub fn snapshot(&self, id: &str, version: Option<u32>) -> Option<AgentDefinition> {
        self.agents.get_version(id, version).map(|agent| describe(&agent))
    }

    /// The caller's catalog agents (their latest versions), newest first.
    pub async fn agents(&self, caller: &Caller, filter: &CatalogFilter) -> Result<Page<AgentDefinition>, SessionError> {
        self.list(CatalogAgents::NAME, "agent_", filter, |all: AgentVersions| {
            let latest = all.versions.last()?.clone();
            let shown = caller.may_use(&latest.created_by)
                && (filter.include_archived || latest.archived_at.is_none())
                && filter.created.contains(&latest.created_at);
            shown.then_some(latest)
        })
        .await
    }

    /// Every version of a catalog agent, oldest first.
    pub async fn agent_versions(&self, caller: &Caller, id: &str) -> Result<Vec<AgentDefinition>, SessionError> {
        self.stored_versions(caller, id).await
    }

    pub async fn create_environment(&self, caller: &Caller, new: NewEnvironment) -> Result<Environment, SessionError> {
        let now = timestamp_now();
        let environment = Environment {
            id: prefixed("env_"),
            name: new.name,
            description: new.description,
            config: new.config,
            metadata: new.metadata,
            created_at: now.clone(),
            updated_at: now,
            archived_at: None,
            deleted: false,
            created_by: caller.subject.clone(),
        };
        self.change(|| async {
            Ok((EventBody::CatalogEnvironment { environment: environment.clone() }, environment.clone()))
        })
        .await
    }

    /// Changes an environment: name, description and config replace, metadata is a patch.
    pub async fn update_environment(
        &self,
        caller: &Caller,
        id: &str,
        change: EnvironmentChange,
    ) -> Result<Environment, SessionError> {
        self.change_environment(caller, id, |environment| {
            environment.name = change.name.clone().unwrap_or(environment.name.clone());
            environment.description = change.description.clone().unwrap_or(environment.description.take());
            environment.config = change.config.clone().unwrap_or(environment.config.take());
            if let Some(patch) = &change.metadata {
                apply_patch(&mut environment.metadata, patch.clone());
            }
        })
        .await
    }

    pub async fn archive_environment(&self, caller: &Caller, id: &str) -> Result<Environment, SessionError> {
        let current = self.environment(caller, id).await?;
        if current.archived_at.is_some() {
            return Ok(current);
        }
        self.change_environment(caller, id, |environment| {
            environment.archived_at.get_or_insert_with(timestamp_now);
        })
        .await
    }

    /// Deletes an environment: it is found no more; sessions made in it go on.
    pub async fn delete_environment(&self, caller: &Caller, id: &str) -> Result<(), SessionError> {
        self.change_environment(caller, id, |environment| environment.deleted = true).await.map(drop)
    }

    async fn change_environment(
        &self,
        caller: &Caller,
        id: &str,
        change: impl Fn(&mut Environment),
    ) -> Result<Environment, SessionError> {
        self.change(|| async {
            let mut environment = self.environment(caller, id).await?;
            change(&mut environment);
            environment.updated_at = timestamp_now();
            Ok((EventBody::CatalogEnvironment { environment: environment.clone() }, environment))
        })
        .await
    }

    /// An environment the caller may see (not deleted).
    pub async fn environment(&self, caller: &Caller, id: &str) -> Result<Environment, SessionError> {
        let key = catalog_key("env_", id).ok_or_else(|| not_found("environment", id))?;
        let found: Option<Environment> = self.log.projected(CatalogEnvironments::NAME, key).await?;
        let found = found.filter(|e| !e.deleted && caller.may_use(&e.created_by));
        found.ok_or_else(|| not_found("environment", id))
    }

    /// The caller's environments, newest first.
    pub async fn environments(
        &self,
        caller: &Caller,
        filter: &CatalogFilter,
    ) -> Result<Page<Environment>, SessionError> {
        self.list(CatalogEnvironments::NAME, "env_", filter, |e: Environment| {
            let shown = !e.deleted
                && caller.may_use(&e.created_by)
                && (filter.include_archived || e.archived_at.is_none())
                && filter.created.contains(&e.created_at);
            shown.then_some(e)
        })
        .await
    }

    /// A page of a catalog projection, newest first, of what `keep` keeps: read on past
    /// what it drops, so a page fills (or the catalog ends) whatever was dropped.
    async fn list<S: DeserializeOwned, T>(
        &self,
        projection: &str,
        prefix: &str,
        filter: &CatalogFilter,
        keep: impl Fn(S) -> Option<T>,
    ) -> Result<Page<T>, SessionError> {
        let mut after = match &filter.after {
            Some(id) => Some(catalog_key(prefix, id).ok_or_else(|| SessionError::UnknownCursor(id.clone()))?),
            None => None,
        };
        let mut items = Vec::new();
        loop {
            let scan = Scan { session: Some(CATALOG), after, newest_first: true, limit: SCAN_CHUNK };
            let page: Vec<(Key, S)> = self.log.scan(projection, scan).await?;
            let Some((last, _)) = page.last() else { return Ok(Page { items, has_more: false }) };
            after = Some(*last);
            for (_, value) in page {
                let Some(item) = keep(value) else { continue };
                if items.len() == filter.limit {
                    return Ok(Page { items, has_more: true });
                }
                items.push(item);
            }
        }
    }
}

/// A runnable agent as a definition: a catalog agent's own, or a configured agent's
/// (named by itself, version 1, there since the epoch, the server's).
pub fn describe(agent: &Agent) -> AgentDefinition {
    if let Some(definition) = &agent.definition {
        return definition.clone();
    }
    let config = &agent.config;
    let since = "1970-01-01T00:00:00.000000Z".to_string();
    AgentDefinition {
        id: agent.name.clone(),
        version: 1,
        name: config.title.clone().unwrap_or_else(|| agent.name.clone()),
        description: Some(config.description.clone()).filter(|d| !d.is_empty()),
        model: agent.model.name().to_string(),
        system: Some(config.system.clone()).filter(|s| !s.is_empty()),
        tools: config.client_tools.clone(),
        // The servers of a configured agent are the operator's: not shown.
        mcp_servers: Vec::new(),
        mcp_toolsets: Vec::new(),
        metadata: Map::new(),
        created_at: since.clone(),
        updated_at: since,
        archived_at: None,
        created_by: String::new(),
    }
}

/// What an agent definition must hold to run here.
fn check_agent(agents: &Agents, caller: &Caller, definition: &AgentDefinition) -> Result<(), SessionError> {
    if definition.name.trim().is_empty() {
        return Err(SessionError::Invalid("invalid field `name`: must not be empty".into()));
    }
    if !agents.model_ids().any(|id| id == definition.model) {
        let known: Vec<&str> = agents.model_ids().collect();
        return Err(SessionError::Invalid(format!(
            "invalid field `model`: no model {:?} on this server; it has: {}",
            definition.model,
            known.join(", ")
        )));
    }
    for (i, tool) in definition.tools.iter().enumerate() {
        if tool.name.trim().is_empty() {
            return Err(SessionError::Invalid(format!("invalid field `tools[{i}].name`: must not be empty")));
        }
        if definition.tools[..i].iter().any(|t| t.name == tool.name) {
            return Err(SessionError::Invalid(format!(
                "invalid field `tools[{i}].name`: {:?} is declared twice",
                tool.name
            )));
        }
        if agents.tools.has(&tool.name) {
            return Err(SessionError::Invalid(format!(
                "invalid field `tools[{i}].name`: {:?} is a server tool's name",
                tool.name
            )));
        }
    }
    check_mcp(agents, caller, definition).map_err(SessionError::Invalid)
}

/// The most MCP servers one agent may have.
const MAX_MCP_SERVERS: usize = 20;

/// An agent's MCP servers: named once each, each with its toolset and each toolset with
/// its server, reachable by the caller (`tools.mcp.allowed_hosts` unless an admin).
fn check_mcp(agents: &Agents, caller: &Caller, definition: &AgentDefinition) -> Result<(), String> {
    let (servers, toolsets) = (&definition.mcp_servers, &definition.mcp_toolsets);
    if servers.len() > MAX_MCP_SERVERS {
        return Err(format!("invalid field `mcp_servers`: at most {MAX_MCP_SERVERS} servers"));
    }
    let allowed = &agents.tools.settings().mcp.allowed_hosts;
    for (i, server) in servers.iter().enumerate() {
        let at = format!("invalid field `mcp_servers[{i}]`");
        if servers[..i].iter().any(|s| s.name == server.name) {
            return Err(format!("{at}: the name {:?} is declared twice", server.name));
        }
        let config = McpServerConfig::http(server.url.clone(), Default::default());
        config.check(&at, &server.name)?;
        if !caller.admin {
            config.check_reach(&at, allowed)?;
        }
        if !toolsets.iter().any(|t| t.server == server.name) {
            return Err(format!(
                "{at}: no `mcp_toolset` in `tools` names {:?}; add one (it says which tools the agent has)",
                server.name
            ));
        }
    }
    for (i, toolset) in toolsets.iter().enumerate() {
        if !servers.iter().any(|s| s.name == toolset.server) {
            return Err(format!(
                "invalid field `tools`: the mcp_toolset for {:?} names no server of `mcp_servers`",
                toolset.server
            ));
        }
        if toolsets[..i].iter().any(|t| t.server == toolset.server) {
            return Err(format!("invalid field `tools`: two mcp_toolsets name {:?}", toolset.server));
        }
    }
    Ok(())
}

/// A metadata patch: a value sets its key, `null` deletes it.
pub fn apply_patch(metadata: &mut Map<String, Value>, patch: Map<String, Value>) {
    for (key, value) in patch {
        match value {
            Value::Null => metadata.remove(&key),
            value => metadata.insert(key, value),
        };
    }
}

fn not_found(kind: &str, id: &str) -> SessionError {
    SessionError::CatalogNotFound(format!("{kind} {id}"))
}

/// Teaches the registry the agent versions the catalog's log gains from now on, whichever
/// node made them (with several nodes on one log, another node's agents run here too).
async fn learn(mut follower: super::Follower, agents: Arc<Agents>) {
    loop {
        let events = match follower.next().await {
            Ok(Some(events)) => events,
            Ok(None) => return,
            Err(error) => {
                tracing::warn!(%error, "the catalog's follower stopped; agents made elsewhere are not learned");
                return;
            }
        };
        for event in events {
            let Ok(Event { body: EventBody::CatalogAgent { agent }, .. }) = event.decode() else { continue };
            let known = agents.get_version(&agent.id, Some(agent.version));
            if known.is_some_and(|known| known.definition.as_ref() == Some(&agent)) {
                continue;
            }
            if let Err(error) = agents.define(&agent) {
                tracing::warn!(agent = %agent.id, version = agent.version, %error, "a stored agent cannot run here");
            }
        }
    }
}
