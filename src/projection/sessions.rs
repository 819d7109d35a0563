//! The session index: what listing, filtering and ownership checks need, one entry per
//! session, folded from `session.*` events and `terminated`.

use serde::{Deserialize, Serialize};

use crate::domain::event::SessionSpec;
use crate::domain::{Event, EventBody, SessionId};
use crate::store::{Key, Projection};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionSummary {
    pub id: SessionId,
    pub spec: SessionSpec,
    pub created_by: String,
    pub created_at: String,
    pub updated_at: String,
    pub deleted: bool,
    /// When it was archived: it keeps its log and takes no more input.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub archived_at: Option<String>,
    /// When it ended on its own (its idle timeout) and why: its log ends with `terminated`;
    /// it is kept and readable, takes no more input, and may still be deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended: Option<Ended>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ended {
    pub at: String,
    pub reason: String,
}

impl SessionSummary {
    /// The fold: the summary after `event`, or `None` when `event` does not change it.
    pub fn apply(current: Option<SessionSummary>, event: &Event) -> Option<SessionSummary> {
        match (&event.body, current) {
            (EventBody::SessionCreated { spec, created_by }, _) => Some(SessionSummary {
                id: event.session_id,
                spec: spec.clone(),
                created_by: created_by.clone(),
                created_at: event.created_at.clone(),
                updated_at: event.created_at.clone(),
                deleted: false,
                archived_at: None,
                ended: None,
            }),
            (EventBody::SessionUpdated { agent, tools, title, metadata, mode, model }, Some(mut summary)) => {
                if let Some(mode) = mode {
                    summary.spec.mode = Some(mode.clone());
                }
                if let Some(model) = model {
                    // (`default`: the agent's own, as a session that never chose one.)
                    summary.spec.model = Some(model.clone()).filter(|m| m != crate::domain::event::DEFAULT_MODEL);
                }
                if let Some(agent) = agent {
                    summary.spec.agent = agent.clone();
                }
                if let Some(tools) = tools {
                    summary.spec.tools = tools.clone();
                }
                if let Some(title) = title {
                    summary.spec.title = Some(title.clone());
                }
                if let Some(metadata) = metadata {
                    summary.spec.metadata = metadata.clone();
                }
                summary.updated_at = event.created_at.clone();
                Some(summary)
            }
            (EventBody::SessionArchived {}, Some(mut summary)) => {
                summary.archived_at = Some(event.created_at.clone());
                summary.updated_at = event.created_at.clone();
                Some(summary)
            }
            (EventBody::SessionDeleted {}, Some(mut summary)) => {
                summary.deleted = true;
                summary.updated_at = event.created_at.clone();
                Some(summary)
            }
            // A delete's `terminated` follows its `session.deleted`; any other ends a session
            // that stays.
            (EventBody::Terminated { .. }, Some(summary)) if summary.deleted => Some(summary),
            (EventBody::Terminated { reason }, Some(mut summary)) => {
                summary.ended = Some(Ended { at: event.created_at.clone(), reason: reason.clone() });
                summary.updated_at = event.created_at.clone();
                Some(summary)
            }
            _ => None,
        }
    }
}

pub struct SessionIndex;

impl SessionIndex {
    pub const NAME: &'static str = "sessions";
}

impl Projection for SessionIndex {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn wants(&self, kind: &str) -> bool {
        matches!(kind, "session.created" | "session.updated" | "session.archived" | "session.deleted" | "terminated")
    }

    fn lists_sessions(&self) -> bool {
        true
    }

    fn keys(&self, event: &Event) -> Vec<Key> {
        vec![Key::session(event.session_id)]
    }

    fn apply(&self, _key: Key, current: Option<&[u8]>, event: &Event) -> Option<Vec<u8>> {
        let current = current.and_then(|bytes| serde_json::from_slice(bytes).ok());
        SessionSummary::apply(current, event).map(|s| serde_json::to_vec(&s).expect("summaries serialise"))
    }
}
