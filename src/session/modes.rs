//! A session's mode (one of its agent's `modes`: docs/configuration.md) and the modes it
//! may change to. The mode is in the log (`session.created`, then `session.updated`), and
//! decides what the session's tools may do from its next turn on.

use serde::Serialize;

use super::{SessionError, SessionUpdate, Sessions};
use crate::domain::RequestKey;
use crate::projection::SessionSummary;

/// The session's mode and its agent's modes, in config order (by id).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Modes {
    pub current: String,
    pub available: Vec<ModeInfo>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModeInfo {
    pub id: String,
    pub name: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub description: String,
}

impl Sessions {
    /// The session's mode and those it may change to; `None` if its agent has no modes.
    pub fn modes(&self, session: &SessionSummary) -> Result<Option<Modes>, SessionError> {
        let spec = &session.spec;
        let agent = self.agents().get_version(&spec.agent.name, spec.agent.version).ok_or_else(|| {
            SessionError::Unavailable(format!("session {}'s agent {:?} is not configured", session.id, spec.agent.name))
        })?;
        let Some((current, _)) = agent.mode(session.spec.mode.as_deref()) else { return Ok(None) };
        let available = agent
            .config
            .modes
            .iter()
            .map(|(id, mode)| ModeInfo {
                id: id.clone(),
                name: mode.name.clone().unwrap_or_else(|| id.clone()),
                description: mode.description.clone(),
            })
            .collect();
        Ok(Some(Modes { current: current.to_string(), available }))
    }

    /// Changes the session's mode (from its next turn on: a turn running keeps the one it
    /// started in), recorded in its log; its modes as they are then.
    pub async fn set_mode(
        &self,
        session: &SessionSummary,
        mode: &str,
        request: Option<RequestKey>,
    ) -> Result<Modes, SessionError> {
        let update = SessionUpdate { mode: Some(mode.to_string()), ..SessionUpdate::default() };
        let updated = self.update(session, update, request).await?;
        let modes = self.modes(&updated)?;
        // (`update` refused a mode its agent does not have, and an agent without modes.)
        modes.ok_or_else(|| SessionError::Invalid(format!("agent {:?} has no modes", session.spec.agent.name)))
    }
}
