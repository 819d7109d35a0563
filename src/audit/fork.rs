//! Forks: a new session whose history is a past one's up to any event of it, recorded with
//! where it was forked from (the event and its chain hash), so the next turn goes on from
//! there, with any agent.

use std::sync::Arc;

use serde_json::{Map, Value};

use super::Audit;
use crate::domain::event::{AgentSpec, ForkPoint};
use crate::domain::{Caller, EventId};
use crate::error::SessionError;
use crate::projection::history::History;
use crate::projection::{read, SessionIndex, SessionSummary};
use crate::store::{self, Key, Position, ReadRange};

impl Audit {
    /// A new session whose history is `source`'s up to the event `at` (recorded as its seed,
    /// with where it was forked from): the next turn goes on from there, with any agent, and
    /// with `metadata` set over the source's.
    pub async fn fork(
        &self,
        caller: &Caller,
        source: &SessionSummary,
        at: &str,
        agent: Option<AgentSpec>,
        metadata: Map<String, Value>,
    ) -> Result<SessionSummary, SessionError> {
        let at: EventId =
            at.parse().map_err(|_| SessionError::Invalid(format!("invalid `at`: {at:?} is not an event id")))?;
        // Well formed, but not this session's: as an unknown cursor is.
        let invalid = || SessionError::UnknownCursor(format!("`at` {at}"));
        // The event itself, found as the newest one up to it.
        let past = EventId(ulid::Ulid::from(u128::from(at.ulid()).saturating_add(1)));
        let upto = ReadRange { after: None, before: Some(past), limit: 1, newest_first: true };
        let (point, hash) = self.chained_at(source.id, upto).await?.filter(|(e, _)| e.id == at).ok_or_else(invalid)?;
        let mut history = History::default();
        store::fold(self.store.log.as_ref(), source.id, Position::default(), |raw| {
            if raw.seq <= point.seq {
                if let Ok(event) = raw.decode() {
                    history.apply(&event);
                }
            }
        })
        .await?;
        // The source as stored (not redacted), so that the fork keeps its options.
        let stored: Option<SessionSummary> =
            read::get(self.store.projections.as_ref(), SessionIndex::NAME, Key::session(source.id)).await?;
        let stored = stored.ok_or_else(|| SessionError::NotFound(source.id.to_string()))?;
        let mut spec = stored.spec;
        if let Some(agent) = agent {
            spec.agent = agent;
        }
        // A mode or a model the fork's agent does not have (another agent's, or one its
        // config has dropped since): the fork starts with its agent's default.
        let agent = self.sessions.agents().get_version(&spec.agent.name, spec.agent.version);
        if spec
            .mode
            .as_ref()
            .is_some_and(|mode| agent.as_ref().is_none_or(|agent| !agent.config.modes.contains_key(mode)))
        {
            spec.mode = None;
        }
        if spec
            .model
            .as_ref()
            .is_some_and(|model| agent.as_ref().is_none_or(|agent| !agent.choices.contains_key(model)))
        {
            spec.model = None;
        }
        crate::domain::metadata::apply_patch(&mut spec.metadata, metadata);
        spec.messages = history.messages.into_iter().map(Arc::unwrap_or_clone).collect();
        spec.forked_from = Some(ForkPoint {
            session_id: source.id,
            event_id: at,
            sequence_number: point.seq,
            hash: hex::encode(hash),
        });
        self.sessions.create(caller, spec, None).await
    }
}
