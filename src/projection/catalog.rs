//! The catalog's projections: every version of each agent made through an API, and each
//! environment as it stands, keyed by their ids in the catalog's log.

use serde::{Deserialize, Serialize};

use crate::domain::catalog::{AgentDefinition, Environment};
use crate::domain::{Event, EventBody};
use crate::store::{Key, Projection};

/// Where the catalog keeps `id`: the ULID after its prefix (`agent_`, `env_`), if it is one.
pub fn catalog_key(prefix: &str, id: &str) -> Option<Key> {
    let item = ulid::Ulid::from_string(id.strip_prefix(prefix)?).ok()?;
    Some(Key { session: crate::domain::catalog::CATALOG, item: Some(item) })
}

/// Every version of one agent, oldest first.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct AgentVersions {
    pub versions: Vec<AgentDefinition>,
}

pub struct CatalogAgents;

impl CatalogAgents {
    pub const NAME: &'static str = "catalog_agents";
}

impl Projection for CatalogAgents {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn wants(&self, kind: &str) -> bool {
        kind == "catalog.agent"
    }

    fn keys(&self, event: &Event) -> Vec<Key> {
        match &event.body {
            EventBody::CatalogAgent { agent } => catalog_key("agent_", &agent.id).into_iter().collect(),
            _ => Vec::new(),
        }
    }

    fn apply(&self, _key: Key, current: Option<&[u8]>, event: &Event) -> Option<Vec<u8>> {
        let EventBody::CatalogAgent { agent } = &event.body else { return None };
        let mut all: AgentVersions = current.and_then(|bytes| serde_json::from_slice(bytes).ok()).unwrap_or_default();
        // A version is made once; one that is stored again (an archive) replaces it.
        all.versions.retain(|v| v.version != agent.version);
        all.versions.push(agent.clone());
        all.versions.sort_by_key(|v| v.version);
        Some(serde_json::to_vec(&all).expect("serialises"))
    }
}

pub struct CatalogEnvironments;

impl CatalogEnvironments {
    pub const NAME: &'static str = "catalog_environments";
}

impl Projection for CatalogEnvironments {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn wants(&self, kind: &str) -> bool {
        kind == "catalog.environment"
    }

    fn keys(&self, event: &Event) -> Vec<Key> {
        match &event.body {
            EventBody::CatalogEnvironment { environment } => catalog_key("env_", &environment.id).into_iter().collect(),
            _ => Vec::new(),
        }
    }

    fn apply(&self, _key: Key, _current: Option<&[u8]>, event: &Event) -> Option<Vec<u8>> {
        let EventBody::CatalogEnvironment { environment } = &event.body else { return None };
        Some(serde_json::to_vec::<Environment>(environment).expect("serialises"))
    }
}
