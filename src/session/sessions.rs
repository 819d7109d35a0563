//! [`Sessions`]: the front door. Each call that names a session takes the summary that
//! [`Sessions::get`] gave the caller, so ownership is checked once, where the id arrives.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::log::SessionLog;
use super::{Caller, SessionError};
use crate::agent::mcp::{name_tools, McpServerConfig};
use crate::agent::Agents;
use crate::catalog::Catalog;
use crate::domain::event::SessionSpec;
use crate::domain::message::waiting_calls;
use crate::domain::{Draft, EventBody, RequestKey, SessionId, TurnId};
use crate::engine::decide::seed_waiting;
use crate::engine::plan::ToolPlan;
use crate::engine::{rules, Closing, Engine, SessionUpdate, Submission, Submitted};
use crate::projection::turns::TurnState;
use crate::projection::SessionSummary;

#[derive(Clone)]
pub struct Sessions {
    pub(super) log: SessionLog,
    pub(super) engine: Engine,
    agents: Arc<Agents>,
    catalog: Arc<Catalog>,
}

impl Sessions {
    /// The engine underneath the log, if it is a client of one (see [`crate::store::SharedLog::health`]).
    pub fn health(&self) -> Option<crate::store::Health> {
        self.log.health()
    }

    pub(crate) fn new(log: SessionLog, engine: Engine, agents: Arc<Agents>, catalog: Arc<Catalog>) -> Sessions {
        Sessions { log, engine, agents, catalog }
    }

    /// Every agent (configured and made through an API) and the server tools.
    pub fn agents(&self) -> &Agents {
        &self.agents
    }

    /// Checks `spec` against its agent and starts the session's log. A seed history that
    /// ends with tool calls leaves them waiting for the client, as if the model had just
    /// made them. A keyed request (see [`crate::domain::request`]) sent again answers the
    /// session its first copy made (or makes it, if the first was cut short).
    pub async fn create(
        &self,
        caller: &Caller,
        mut spec: SessionSpec,
        request: Option<&RequestKey>,
    ) -> Result<SessionSummary, SessionError> {
        // An agent that is not there is not found (404), as a session that is not there is:
        // which agents exist is the server's to say, not a fault of the request's shape.
        let Some(agent) = self.agents.get_version(&spec.agent.name, spec.agent.version) else {
            return Err(SessionError::CatalogNotFound(match spec.agent.version {
                Some(version) => format!("agent {:?} version {version}", spec.agent.name),
                None => format!("agent {:?}", spec.agent.name),
            }));
        };
        // A catalog agent's session runs the version it was created with.
        spec.agent.version = agent.definition.as_ref().map(|d| d.version);
        self.catalog.usable(caller, &agent)?;
        if let Some(environment) = &spec.environment_id {
            let environment = self.catalog.environment(caller, environment).await?;
            if environment.archived_at.is_some() {
                let id = environment.id;
                return Err(SessionError::Invalid(format!("invalid field `environment_id`: {id} is archived")));
            }
        }
        rules::check_new(&agent, &self.agents.tools, &mut spec)?;
        rules::check_content(&agent, &spec, spec.messages.iter().filter_map(|m| m.content()))?;
        let id = match request {
            Some(key) => {
                let id = self.engine.session_for(&caller.subject, key).await?;
                if let Some(made) = self.log.summary(id).await? {
                    // Made, and deleted since: gone, as everywhere else.
                    if made.deleted {
                        return Err(SessionError::NotFound(id.to_string()));
                    }
                    return Ok(self.redacted(made));
                }
                id
            }
            None => SessionId::generate(),
        };
        let mut plan = ToolPlan::new(&agent, &self.agents.tools, &spec, &Default::default());
        // A seed history's calls of the agent's MCP tools wait like any other: the tools
        // are listed to know them (so the servers start here), and a server that cannot
        // be reached refuses the session rather than deny its calls.
        let unknown = waiting_calls(&spec.messages).any(|(_, name, _)| !plan.modes.contains_key(&name));
        if unknown && !agent.mcp.is_empty() {
            let (mut tools, _) = agent.mcp.tools().await.map_err(|e| {
                SessionError::Unavailable(format!("the history ends with tool calls, and to know them: {e}"))
            })?;
            name_tools(&mut tools);
            plan.add_mcp(tools);
        }
        let waiting = seed_waiting(&spec.messages, &plan, TurnId::generate());
        let created = Draft::new(None, &EventBody::SessionCreated { spec, created_by: caller.subject.clone() });
        match self.engine.start(id, created, waiting).await {
            // A copy of this keyed request made it meanwhile.
            Err(SessionError::Conflict(_)) if request.is_some() => {}
            started => started?,
        }
        let summary = self.log.summary(id).await?.ok_or_else(|| SessionError::NotFound(id.to_string()))?;
        Ok(self.redacted(summary))
    }

    /// Gives the session MCP servers its client declared (ACP's `mcpServers`), in place of
    /// any it had (none: it has none), until the session is archived or deleted or this
    /// process stops. They are never stored: their `env` and `headers` may hold secrets;
    /// the log records the server of each call. A caller that is not an admin may declare
    /// only URLs on hosts the config allows. A name the agent's own servers use is refused,
    /// and so is an archived session (it takes no more turns).
    pub async fn attach_mcp(
        &self,
        caller: &Caller,
        id: &str,
        servers: BTreeMap<String, McpServerConfig>,
    ) -> Result<(), SessionError> {
        let summary = self.get(caller, id).await?;
        if summary.archived_at.is_some() && !servers.is_empty() {
            return Err(SessionError::Conflict(format!("session {id} is archived: it takes no MCP servers")));
        }
        let mut servers = servers;
        self.check_mcp(caller, &summary.spec.agent.name, summary.spec.agent.version, &mut servers)?;
        match servers.is_empty() {
            true => self.agents.detach(summary.id).await,
            false => self.agents.attach(summary.id, servers).await,
        }
        Ok(())
    }

    /// [`Sessions::create`], the session then given the MCP servers its client declared
    /// (see [`Sessions::attach_mcp`]): checked first, so a refused server makes no session.
    pub async fn create_with_mcp(
        &self,
        caller: &Caller,
        spec: SessionSpec,
        servers: BTreeMap<String, McpServerConfig>,
        request: Option<&RequestKey>,
    ) -> Result<SessionSummary, SessionError> {
        let mut servers = servers;
        self.check_mcp(caller, &spec.agent.name, spec.agent.version, &mut servers)?;
        let summary = self.create(caller, spec, request).await?;
        if !servers.is_empty() {
            self.agents.attach(summary.id, servers).await;
        }
        Ok(summary)
    }

    /// Whether the caller may give a session of `agent` (at `version`) these MCP servers
    /// (see [`Sessions::attach_mcp`]); each is made to ask before every call, as a server
    /// the operator did not declare must.
    fn check_mcp(
        &self,
        caller: &Caller,
        agent: &str,
        version: Option<u32>,
        servers: &mut BTreeMap<String, McpServerConfig>,
    ) -> Result<(), SessionError> {
        let agent = self.agents.get_version(agent, version);
        let allowed = &self.agents.tools.settings().mcp.allowed_hosts;
        for (name, config) in servers.iter_mut() {
            config.permission = crate::domain::event::Permission::Ask;
            config.tools.clear();
            let at = format!("MCP server {name:?}");
            config.check(&at, name).map_err(SessionError::Invalid)?;
            if !caller.admin {
                config.check_reach(&at, allowed).map_err(SessionError::Invalid)?;
            }
            if agent.as_ref().is_some_and(|a| a.mcp.has(name)) {
                return Err(SessionError::Invalid(format!("{at}: the agent has a server of that name")));
            }
        }
        Ok(())
    }

    /// The session if it exists, is not deleted, and the caller may see it: one answer
    /// (not found) for all three, so ids of other subjects are not disclosed. Secret
    /// option values are redacted.
    pub async fn get(&self, caller: &Caller, id: &str) -> Result<SessionSummary, SessionError> {
        let not_found = || SessionError::NotFound(id.to_string());
        let session: SessionId = id.parse().map_err(|_| not_found())?;
        match self.log.summary(session).await? {
            Some(summary) if !summary.deleted && caller.may_use(&summary.created_by) => Ok(self.redacted(summary)),
            _ => Err(not_found()),
        }
    }

    pub(super) fn redacted(&self, mut summary: SessionSummary) -> SessionSummary {
        let agent = self.agents.get_version(&summary.spec.agent.name, summary.spec.agent.version);
        rules::redact(agent.as_deref(), &mut summary.spec);
        summary
    }

    /// Cancels what runs in the session and records its end, then appends
    /// `session.deleted` and `terminated`; every open stream ends after the latter.
    pub async fn delete(&self, caller: &Caller, id: &str) -> Result<(), SessionError> {
        let summary = self.get(caller, id).await?;
        self.engine.close(summary.id, Closing::Delete).await?;
        self.agents.detach(summary.id).await;
        Ok(())
    }

    /// Cancels what runs and records its end, then archives the session: it keeps its log,
    /// lists only when asked for, and takes no more input. Archiving twice is archiving once.
    pub async fn archive(&self, session: &SessionSummary) -> Result<SessionSummary, SessionError> {
        self.engine.close(session.id, Closing::Archive).await?;
        self.agents.detach(session.id).await;
        self.reread(session).await
    }

    /// Changes the session's setup (title, metadata patch, tools, agent options), through
    /// its actor like any input.
    pub async fn update(
        &self,
        session: &SessionSummary,
        update: SessionUpdate,
        request: Option<RequestKey>,
    ) -> Result<SessionSummary, SessionError> {
        if !update.is_empty() {
            self.engine.submit(session.id, Submission { update, request, ..Submission::default() }).await?;
        }
        self.reread(session).await
    }

    /// The session as it is now, redacted.
    async fn reread(&self, session: &SessionSummary) -> Result<SessionSummary, SessionError> {
        let summary = self.log.summary(session.id).await?.filter(|s| !s.deleted);
        Ok(self.redacted(summary.ok_or_else(|| SessionError::NotFound(session.id.to_string()))?))
    }

    /// Makes a session and hands it its first input. Input a new session would refuse (too
    /// much of it, an event too large) is refused before the session is made, so that such
    /// a request leaves nothing behind. (A seed history decides the new session's state, so
    /// with one the input is checked as it is submitted, after.)
    pub async fn create_with_input(
        &self,
        caller: &Caller,
        spec: SessionSpec,
        first: Submission,
    ) -> Result<SessionSummary, SessionError> {
        if first.inputs.is_empty() {
            return self.create(caller, spec, first.request.as_ref()).await;
        }
        if spec.messages.is_empty() {
            let new = TurnState::default();
            crate::engine::decide::decide(&new, &first, None, TurnId::generate(), self.engine.limits())?;
        }
        // A keyed request's key names its input in the new session too: sent again, neither
        // is made twice.
        let summary = self.create(caller, spec, first.request.as_ref()).await?;
        self.submit(&summary, first).await?;
        Ok(summary)
    }

    /// Hands input to the session's engine. Refusals come back before anything is stored.
    pub async fn submit(&self, session: &SessionSummary, submission: Submission) -> Result<Submitted, SessionError> {
        self.engine.submit(session.id, submission).await
    }
}
