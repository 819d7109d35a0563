//! Replay sessions: a past session's events re-emitted into a new session at their original
//! pace (divided by a speed), so that any client of any view watches it happen again: a
//! demo, or a bug followed as it unfolded.
//!
//! The new session starts with the source's settings (and, when the replay starts at an
//! event, the source's history before it as its seed). A task then copies each event after
//! that, when it is due, through the session's actor ([`super::engine::Engine::copy`]): the
//! same types and fields, in new turns (one per source turn), with every event id the
//! fields name (a tool call's, a queued message's) changed to the copy's; a message the
//! source queued for a turn is copied as taken when it came. While it runs the session takes
//! no input (409). Deleting the session stops the replay; so does a restart (whose recovery
//! then closes the copied turn that was open, as it closes any). Afterwards the session is
//! like any other.

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::Value;

use super::audit::{start_replay, Pace};
use super::{Caller, SessionError, Sessions};
use crate::domain::event::ReplayOf;
use crate::domain::{Draft, Event, EventId, RawEvent, SessionId, TurnId};
use crate::projection::history::History;
use crate::projection::SessionSummary;
use crate::store::Position;

/// Kinds a replay does not copy: the new session has its own start, and the source's end
/// (or archiving) would end the replay's session.
const NOT_COPIED: &[&str] = &["session.created", "session.deleted", "terminated", "session.archived"];

impl Sessions {
    /// A new session of `caller`'s into which `source`'s events, from event `from` on (after
    /// its `session.created` when none), are re-emitted at their original pace divided by
    /// `speed`; answered once the session exists, while the replay runs on.
    pub async fn replay_into(
        &self,
        caller: &Caller,
        source: &SessionSummary,
        from: Option<&str>,
        speed: f64,
    ) -> Result<SessionSummary, SessionError> {
        let pace = Pace::new(speed)?;
        let mut replay = start_replay(self.log.raw(), source.id, from).await?;
        let from: Option<EventId> = from.and_then(|f| f.parse().ok());
        // The source as stored (not redacted), and its history before `from` as the seed.
        let stored = self.log.summary(source.id).await?.ok_or_else(|| SessionError::NotFound(source.id.to_string()))?;
        let mut spec = stored.spec;
        if let Some(from) = from {
            let mut history = History::default();
            self.log
                .fold(source.id, Position::default(), |raw| {
                    if raw.id < from {
                        if let Ok(event) = raw.decode() {
                            history.apply(&event);
                        }
                    }
                })
                .await?;
            spec.messages = history.messages.into_iter().map(Arc::unwrap_or_clone).collect();
        }
        spec.forked_from = None;
        spec.replay_of = Some(ReplayOf { session_id: source.id, from, speed });
        let created = self.create(caller, spec).await?;
        let (engine, log, session) = (self.engine.clone(), self.log.raw_arc(), created.id);
        engine.replaying(session, true);
        tokio::spawn(async move {
            let mut copier = Copier::new(session, pace);
            let copied = async {
                loop {
                    let page = replay.next(log.as_ref()).await?;
                    if page.is_empty() {
                        return Ok(());
                    }
                    for raw in page {
                        copier.copy(&engine, raw).await?;
                    }
                }
            };
            let result: Result<(), SessionError> = copied.await;
            engine.replaying(session, false);
            match result {
                Ok(()) => tracing::info!(session_id = %session, copied = copier.copied, "replay done"),
                Err(error) => tracing::warn!(%error, session_id = %session, copied = copier.copied, "replay stopped"),
            }
        });
        Ok(created)
    }
}

/// Copies a source's events into the replay session, one at a time, each when it is due.
struct Copier {
    session: SessionId,
    pace: Pace,
    /// The source's event ids and the copies' (as strings, as fields name them).
    ids: HashMap<String, String>,
    /// The source's turns and the copies'.
    turns: HashMap<TurnId, TurnId>,
    copied: usize,
}

impl Copier {
    fn new(session: SessionId, pace: Pace) -> Copier {
        Copier { session, pace, ids: HashMap::new(), turns: HashMap::new(), copied: 0 }
    }

    async fn copy(&mut self, engine: &super::engine::Engine, raw: RawEvent) -> Result<(), SessionError> {
        if NOT_COPIED.contains(&raw.kind()) {
            return Ok(());
        }
        let Ok(event) = raw.decode() else {
            tracing::warn!(id = %raw.id, "a replayed event does not decode; skipped");
            return Ok(());
        };
        let draft = self.draft(&event)?;
        self.pace.wait(&raw).await;
        let stored = engine.copy(self.session, vec![draft]).await?;
        if let Some(copy) = stored.first() {
            self.ids.insert(raw.id.to_string(), copy.id.to_string());
        }
        self.copied += 1;
        Ok(())
    }

    /// The event as a draft of the replay session: its turn mapped to the copy's, and every
    /// id of a copied event its fields name changed to the copy's.
    fn draft(&mut self, event: &Event) -> Result<Draft, SessionError> {
        let turn = event.turn_id.map(|turn| *self.turns.entry(turn).or_insert_with(TurnId::generate));
        let mut body = serde_json::to_value(&event.body).map_err(|e| SessionError::Invalid(e.to_string()))?;
        rename(&mut body, &self.ids);
        let body = serde_json::from_value(body).map_err(|e| SessionError::Invalid(e.to_string()))?;
        // A message the source queued for a turn is copied as taken when it came: copied
        // as queued, this session's actor would run a turn of its own to answer it.
        Ok(Draft::new(turn, &body))
    }
}

/// Changes every string in `value` that is a key of `ids` to its value.
fn rename(value: &mut Value, ids: &HashMap<String, String>) {
    match value {
        Value::String(text) => {
            if let Some(copy) = ids.get(text.as_str()) {
                *text = copy.clone();
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|item| rename(item, ids)),
        Value::Object(fields) => fields.values_mut().for_each(|field| rename(field, ids)),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn ids_are_renamed_wherever_a_field_names_them() {
        let ids = HashMap::from([("evt_A".to_string(), "evt_B".to_string())]);
        let mut value = json!({"tool_use_id": "evt_A", "stop_reason": {"event_ids": ["evt_A", "evt_C"]}, "n": 1});
        rename(&mut value, &ids);
        assert_eq!(value, json!({"tool_use_id": "evt_B", "stop_reason": {"event_ids": ["evt_B", "evt_C"]}, "n": 1}));
    }
}
