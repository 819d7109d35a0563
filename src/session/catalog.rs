//! The catalog: agents and environments made through an API, kept durably in the
//! catalog's own log (appended here, one writer at a time) and folded into projections.
//! A change to an agent appends its next version; the agent registry learns each version
//! as it is stored, and at start-up from the projection.

use std::sync::Arc;

use serde_json::{Map, Value};

use super::log::SessionLog;
use super::SessionError;
use crate::agent::{Agent, Agents};
use crate::domain::catalog::{AgentDefinition, Environment, CATALOG};
use crate::domain::event::{timestamp_now, ClientTool};
use crate::domain::ids::prefixed;
use crate::domain::{Draft, EventBody};
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
    pub metadata: Option<Map<String, Value>>,
}

#[derive(Debug, Clone, Default)]
pub struct NewEnvironment {
    pub name: String,
    pub description: Option<String>,
    pub config: Value,
    pub metadata: Map<String, Value>,
}

/// A page of the catalog in id order (so creation order), strictly past `after`.
#[derive(Debug, Clone, Default)]
pub struct CatalogPage {
    pub after: Option<String>,
    pub limit: usize,
    pub newest_first: bool,
}

pub struct Catalog {
    log: SessionLog,
    agents: Arc<Agents>,
    /// The catalog's appends, one at a time: each goes at the position the last one left.
    writing: tokio::sync::Mutex<()>,
}

/// How many times an append is tried again when another node appended first.
const ATTEMPTS: usize = 3;

impl Catalog {
    /// Opens the catalog and teaches the registry every stored agent version.
    pub(crate) async fn open(log: SessionLog, agents: Arc<Agents>) -> Result<Catalog, SessionError> {
        let catalog = Catalog { log, agents, writing: tokio::sync::Mutex::new(()) };
        let mut after = None;
        loop {
            let scan = Scan { session: Some(CATALOG), after, newest_first: false, limit: 256 };
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

    async fn append(&self, body: EventBody) -> Result<(), SessionError> {
        let _one_at_a_time = self.writing.lock().await;
        for _ in 0..ATTEMPTS {
            let at = self.log.position(CATALOG).await?;
            if self.log.append(CATALOG, at.seq, vec![Draft::new(None, &body)]).await?.is_ok() {
                return Ok(());
            }
        }
        Err(SessionError::Conflict("the catalog kept changing under this request; send it again".into()))
    }

    /// Stores a new agent (version 1) and makes it runnable.
    pub async fn create_agent(&self, new: NewAgent) -> Result<AgentDefinition, SessionError> {
        let now = timestamp_now();
        let definition = AgentDefinition {
            id: prefixed("agent_"),
            version: 1,
            name: new.name,
            description: new.description,
            model: new.model,
            system: new.system,
            tools: new.tools,
            metadata: new.metadata,
            created_at: now.clone(),
            updated_at: now,
            archived_at: None,
        };
        self.store(definition).await
    }

    /// Stores the agent's next version with `change` made.
    pub async fn update_agent(&self, id: &str, change: AgentChange) -> Result<AgentDefinition, SessionError> {
        let current = self.latest(id)?;
        if let Some(expected) = change.version.filter(|&v| v != current.version) {
            return Err(SessionError::Conflict(format!(
                "agent {id} is at version {}, not {expected}; retrieve it and apply the change again",
                current.version
            )));
        }
        let mut next = current.clone();
        next.version += 1;
        next.updated_at = timestamp_now();
        next.name = change.name.unwrap_or(next.name);
        next.description = change.description.unwrap_or(next.description);
        next.model = change.model.unwrap_or(next.model);
        next.system = change.system.unwrap_or(next.system);
        next.tools = change.tools.unwrap_or(next.tools);
        if let Some(patch) = change.metadata {
            apply_patch(&mut next.metadata, patch);
        }
        self.store(next).await
    }

    /// Archives the agent: it stays readable and its sessions go on, but it is listed no
    /// more and takes no new sessions.
    pub async fn archive_agent(&self, id: &str) -> Result<AgentDefinition, SessionError> {
        let mut current = self.latest(id)?;
        if current.archived_at.is_none() {
            current.archived_at = Some(timestamp_now());
            current = self.store(current).await?;
        }
        Ok(current)
    }

    async fn store(&self, definition: AgentDefinition) -> Result<AgentDefinition, SessionError> {
        check_agent(&self.agents, &definition)?;
        self.append(EventBody::CatalogAgent { agent: definition.clone() }).await?;
        self.agents.define(&definition).map_err(SessionError::Invalid)?;
        Ok(definition)
    }

    fn latest(&self, id: &str) -> Result<AgentDefinition, SessionError> {
        self.agent(id, None).ok_or_else(|| not_found("agent", id))
    }

    /// An agent as a session's snapshot shows it: a catalog agent's version (the latest
    /// when `None`), or a configured agent by name.
    pub fn agent(&self, id: &str, version: Option<u32>) -> Option<AgentDefinition> {
        self.agents.get_version(id, version).map(|agent| describe(&agent))
    }

    /// The catalog's agents (latest versions, archived ones too).
    pub async fn agents(&self, page: CatalogPage) -> Result<(Vec<AgentDefinition>, bool), SessionError> {
        let found = self.page::<AgentVersions>(CatalogAgents::NAME, page).await?;
        let (items, more) = found;
        Ok((items.into_iter().filter_map(|all| all.versions.last().cloned()).collect(), more))
    }

    /// Every version of an agent, oldest first.
    pub async fn agent_versions(&self, id: &str) -> Result<Vec<AgentDefinition>, SessionError> {
        let key = catalog_key(id).ok_or_else(|| not_found("agent", id))?;
        let all: Option<AgentVersions> = self.log.projected(CatalogAgents::NAME, key).await?;
        all.map(|all| all.versions).ok_or_else(|| not_found("agent", id))
    }

    pub async fn create_environment(&self, new: NewEnvironment) -> Result<Environment, SessionError> {
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
        };
        self.store_environment(environment).await
    }

    /// Deletes an environment: it is found no more; sessions made in it go on.
    pub async fn delete_environment(&self, id: &str) -> Result<(), SessionError> {
        let mut environment = self.environment(id).await?;
        environment.deleted = true;
        environment.updated_at = timestamp_now();
        self.store_environment(environment).await.map(drop)
    }

    /// Changes an environment: name, description and config replace, metadata is a patch.
    pub async fn update_environment(
        &self,
        id: &str,
        name: Option<String>,
        description: Option<Option<String>>,
        config: Option<Value>,
        metadata: Option<Map<String, Value>>,
    ) -> Result<Environment, SessionError> {
        let mut environment = self.environment(id).await?;
        environment.name = name.unwrap_or(environment.name);
        environment.description = description.unwrap_or(environment.description);
        environment.config = config.unwrap_or(environment.config);
        if let Some(patch) = metadata {
            apply_patch(&mut environment.metadata, patch);
        }
        environment.updated_at = timestamp_now();
        self.store_environment(environment).await
    }

    pub async fn archive_environment(&self, id: &str) -> Result<Environment, SessionError> {
        let mut environment = self.environment(id).await?;
        if environment.archived_at.is_none() {
            environment.archived_at = Some(timestamp_now());
            environment = self.store_environment(environment).await?;
        }
        Ok(environment)
    }

    async fn store_environment(&self, environment: Environment) -> Result<Environment, SessionError> {
        self.append(EventBody::CatalogEnvironment { environment: environment.clone() }).await?;
        Ok(environment)
    }

    pub async fn environment(&self, id: &str) -> Result<Environment, SessionError> {
        let key = catalog_key(id).filter(|_| id.starts_with("env_")).ok_or_else(|| not_found("environment", id))?;
        let found: Option<Environment> = self.log.projected(CatalogEnvironments::NAME, key).await?;
        found.filter(|e| !e.deleted).ok_or_else(|| not_found("environment", id))
    }

    /// Environments not deleted (a page may hold fewer than asked when some were).
    pub async fn environments(&self, page: CatalogPage) -> Result<(Vec<Environment>, bool), SessionError> {
        let (found, more) = self.page::<Environment>(CatalogEnvironments::NAME, page).await?;
        Ok((found.into_iter().filter(|e| !e.deleted).collect(), more))
    }

    async fn page<T: serde::de::DeserializeOwned>(
        &self,
        projection: &str,
        page: CatalogPage,
    ) -> Result<(Vec<T>, bool), SessionError> {
        let after = match &page.after {
            Some(id) => Some(catalog_key(id).ok_or_else(|| SessionError::UnknownCursor(id.clone()))?),
            None => None,
        };
        let scan = Scan { session: Some(CATALOG), after, newest_first: page.newest_first, limit: page.limit + 1 };
        let mut items: Vec<T> = self.log.scan(projection, scan).await?.into_iter().map(|(_, v): (Key, T)| v).collect();
        let more = items.len() > page.limit;
        items.truncate(page.limit);
        Ok((items, more))
    }
}

/// A runnable agent as a definition: a catalog agent's own, or a configured agent's
/// (named by itself, version 1, there since the epoch).
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
        metadata: Map::new(),
        created_at: since.clone(),
        updated_at: since,
        archived_at: None,
    }
}

/// What an agent definition must hold to run here.
fn check_agent(agents: &Agents, definition: &AgentDefinition) -> Result<(), SessionError> {
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
