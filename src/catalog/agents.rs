//! The catalog's agents: made, changed (each change its next version) and archived
//! through an API, each checked to run here; and configured agents described alike.

use serde_json::Map;

use super::{not_found, AgentChange, Catalog, CatalogFilter, NewAgent};
use crate::agent::mcp::McpServerConfig;
use crate::agent::{Agent, Agents};
use crate::domain::catalog::AgentDefinition;
use crate::domain::event::timestamp_now;
use crate::domain::{Caller, EventBody, RequestKey};
use crate::error::SessionError;
use crate::projection::catalog::{catalog_key, AgentVersions, CatalogAgents};
use crate::projection::Page;

impl Catalog {
    /// Stores a new agent (version 1) and makes it runnable. A keyed request sent again
    /// answers the agent its first copy made (as it is now), or makes it with the id that
    /// copy claimed.
    pub async fn create_agent(
        &self,
        caller: &Caller,
        new: NewAgent,
        request: Option<&RequestKey>,
    ) -> Result<AgentDefinition, SessionError> {
        let id = self.new_id(caller, "agent_", request).await?;
        if let (Some(_), Ok(made)) = (request, self.stored_agent(caller, &id).await) {
            return Ok(made);
        }
        let now = timestamp_now();
        let definition = AgentDefinition {
            id,
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
                crate::domain::metadata::apply_patch(&mut next.metadata, patch.clone());
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
        let all: Option<AgentVersions> = self.projected(CatalogAgents::NAME, key).await?;
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
            // Another subject's agent is as absent as one that never was.
            Some(latest) if !caller.may_use(&latest.created_by) => {
                Err(SessionError::CatalogNotFound(format!("agent {:?}", definition.id)))
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
