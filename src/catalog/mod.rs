//! The catalog: agents and environments made through an API, kept durably in the
//! catalog's own log and folded into projections. Each change is read, checked, made and
//! appended under one lock, from the stored state (so two changes of one version cannot
//! both land, and another node's write makes the next one decide again). A change to an
//! agent appends its next version; the agent registry learns each version as it is stored,
//! and at start-up from the projection. What a subject makes, only it (and admins) sees.

mod agents;
mod environments;

use std::future::Future;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use crate::agent::Agents;
use crate::domain::catalog::{McpServerDecl, McpToolset, CATALOG};
use crate::domain::event::ClientTool;
use crate::domain::{Caller, Draft, Event, EventBody, RequestKey};
use crate::engine::Engine;
use crate::error::SessionError;
use crate::projection::catalog::{catalog_key, AgentVersions, CatalogAgents};
use crate::projection::{read, Page, TimeBounds};
use crate::store::follow::{FollowConfig, Follower};
use crate::store::{Key, Log, Projections, Scan, Store};

pub use agents::describe;

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
    log: Arc<dyn Log>,
    projections: Arc<dyn Projections>,
    /// What appends to the catalog's log.
    engine: Engine,
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
    pub async fn open(
        store: &Store,
        engine: Engine,
        agents: Arc<Agents>,
        follow: FollowConfig,
    ) -> Result<Catalog, SessionError> {
        let (log, projections) = (store.log.clone(), store.projections.clone());
        let catalog = Catalog { log, projections, engine, agents, writing: tokio::sync::Mutex::new(()) };
        // Followed from before the scan, so that nothing made meanwhile is missed; taught
        // from once the scan is done.
        let follower = Follower::live(catalog.log.clone(), CATALOG, follow).await?;
        let mut after = None;
        loop {
            let scan = Scan { session: Some(CATALOG), after, newest_first: false, limit: SCAN_CHUNK };
            let page = read::scan::<AgentVersions>(catalog.projections.as_ref(), CatalogAgents::NAME, scan).await?;
            let Some((last, _)) = page.last() else { break };
            after = Some(*last);
            for definition in page.iter().flat_map(|(_, all)| &all.versions) {
                if let Err(error) = catalog.agents.define(definition) {
                    tracing::warn!(agent = %definition.id, version = definition.version, %error, "a stored agent cannot run here");
                }
            }
        }
        tokio::spawn(learn(follower, catalog.agents.clone()));
        Ok(catalog)
    }

    /// Makes one change under the lock: `change` reads the stored state and says what to
    /// append; if another node appended first, it is asked again.
    /// A new entry's id: fresh, or for a keyed request the one its first copy claimed
    /// (see [`Engine::claim`]), which that copy may have made already.
    async fn new_id(
        &self,
        caller: &Caller,
        prefix: &str,
        request: Option<&RequestKey>,
    ) -> Result<String, SessionError> {
        let fresh = crate::domain::ids::prefixed(prefix);
        match request {
            Some(key) => self.engine.claim(&caller.subject, key, fresh).await,
            None => Ok(fresh),
        }
    }

    async fn change<T, F, Fut>(&self, change: F) -> Result<T, SessionError>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<(EventBody, T), SessionError>>,
    {
        let _one_at_a_time = self.writing.lock().await;
        for _ in 0..ATTEMPTS {
            let at = self.log.position(CATALOG).await?;
            let (body, made) = change().await?;
            if self.engine.append(CATALOG, at.seq, vec![Draft::new(None, &body)]).await?.is_ok() {
                if let EventBody::CatalogAgent { agent } = &body {
                    self.agents.define(agent).map_err(SessionError::Invalid)?;
                }
                return Ok(made);
            }
        }
        Err(SessionError::Conflict("the catalog kept changing under this request; send it again".into()))
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
            let page: Vec<(Key, S)> = read::scan(self.projections.as_ref(), projection, scan).await?;
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

    /// A value of a catalog projection, decoded.
    async fn projected<T: DeserializeOwned>(&self, projection: &str, key: Key) -> Result<Option<T>, SessionError> {
        Ok(read::get(self.projections.as_ref(), projection, key).await?)
    }
}

fn not_found(kind: &str, id: &str) -> SessionError {
    SessionError::CatalogNotFound(format!("{kind} {id}"))
}

/// Teaches the registry the agent versions the catalog's log gains from now on, whichever
/// node made them (with several nodes on one log, another node's agents run here too).
async fn learn(mut follower: Follower, agents: Arc<Agents>) {
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
