//! A session's model (its agent's own, `default`, or one of the agent's `models`:
//! docs/configuration.md) and the models it may change to. The choice is in the log
//! (`session.created`, then `session.updated`), and holds from the session's next turn on.

use serde::Serialize;

use super::{SessionError, SessionUpdate, Sessions};
use crate::agent::{Agent, DEFAULT_MODEL};
use crate::domain::RequestKey;
use crate::projection::SessionSummary;

/// The session's model and those its agent offers (its own first, then its `models`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Models {
    pub current: String,
    pub available: Vec<ModelInfo>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelInfo {
    pub id: String,
    /// The model's own name (what the provider calls it).
    pub name: String,
}

impl Sessions {
    /// The session's model and those it may change to (its agent's own alone, for an
    /// agent that offers no others).
    pub fn models(&self, session: &SessionSummary) -> Result<Models, SessionError> {
        let spec = &session.spec;
        let agent = self.agents().get_version(&spec.agent.name, spec.agent.version).ok_or_else(|| {
            SessionError::Unavailable(format!("session {}'s agent {:?} is not configured", session.id, spec.agent.name))
        })?;
        let (current, _) = agent.model_for(spec.model.as_deref());
        Ok(Models { current: current.to_string(), available: offered(&agent) })
    }

    /// Changes the session's model (from its next turn on: a turn running keeps the one it
    /// started with), recorded in its log; its models as they are then.
    pub async fn set_model(
        &self,
        session: &SessionSummary,
        model: &str,
        request: Option<RequestKey>,
    ) -> Result<Models, SessionError> {
        let update = SessionUpdate { model: Some(model.to_string()), ..SessionUpdate::default() };
        let updated = self.update(session, update, request).await?;
        self.models(&updated)
    }
}

fn offered(agent: &Agent) -> Vec<ModelInfo> {
    let own = ModelInfo { id: DEFAULT_MODEL.to_string(), name: agent.model.name().to_string() };
    let others =
        agent.choices.iter().map(|(id, choice)| ModelInfo { id: id.clone(), name: choice.model.name().to_string() });
    std::iter::once(own).chain(others).collect()
}
