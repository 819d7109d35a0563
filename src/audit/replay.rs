//! Replay sessions: a past session's events re-emitted into a new session at their original
//! pace (divided by a speed), so that any client of any view watches it happen again: a
//! demo, or a bug followed as it unfolded.
//!
//! A replay starts at a turn's start (a replay asked to start inside a turn starts at that
//! turn's `turn.started`), or after the source's creation. The new session is made as the
//! source stood there: its settings then, and its history then as the seed (so the seed's
//! calls that wait for the client wait in the copy too). A task then copies each later
//! event, when it is due, through the session's actor ([`Engine::copy`]):
//! the same types and fields, in new turns (one per source turn), with the event ids that
//! fields name (a call's, a queued message's) changed to the copies'. While it runs the
//! session takes no input (409) and its actor stays; when it ends (done, or stopped by an
//! error) a copied turn it left open is closed, as a restart closes one. Deleting the
//! session stops the replay; so does a restart (whose recovery closes the copied turn that
//! was open). Afterwards the session is like any other.

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::Value;

use super::export::Pages;
use super::{event_from, pages, unknown_from, Audit};
use crate::domain::event::{ReplayOf, SessionSpec};
use crate::domain::{Caller, Draft, EventBody, EventId, RawEvent, SessionId, TurnId};
use crate::engine::Engine;
use crate::error::SessionError;
use crate::projection::history::History;
use crate::projection::SessionSummary;
use crate::store::{self, Position, ReadRange};

/// Kinds a replay does not copy: the new session has its own start, and the source's end
/// (or archiving) would end the replay's session.
const NOT_COPIED: &[&str] = &["session.created", "session.deleted", "terminated", "session.archived"];

/// Fields that name events of the log (their ids are the copies' in a replay).
const ID_FIELDS: &[&str] = &["tool_use_id", "custom_tool_use_id", "event_ids", "model_request_start_id"];

/// The tool call id of a call's event.
fn call_id(body: &EventBody) -> Option<&str> {
    match body {
        EventBody::AgentToolUse { tool_call_id, .. } | EventBody::AgentCustomToolUse { tool_call_id, .. } => {
            Some(tool_call_id)
        }
        _ => None,
    }
}

/// Kinds whose ids other events name.
const NAMED: &[&str] = &["agent.tool_use", "agent.custom_tool_use", "user.message", "span.model_request_start"];

impl Audit {
    /// A new session of `caller`'s into which `source`'s events, from event `from` on (see
    /// the module's account of where a replay starts), are re-emitted at their original pace
    /// divided by `speed`; answered once the session exists, while the replay runs on.
    pub async fn replay_into(
        &self,
        caller: &Caller,
        source: &SessionSummary,
        from: Option<&str>,
        speed: f64,
    ) -> Result<SessionSummary, SessionError> {
        let pace = Pace::new(speed)?;
        let from = event_from(from)?;
        let start = self.replay_start(source.id, from).await?.ok_or_else(|| unknown_from(from))?;
        let (mut spec, calls) = self.as_it_stood(source.id, start).await?;
        spec.replay_of = Some(ReplayOf { session_id: source.id, from, speed });
        let created = self.sessions.create(caller, spec, None).await?;
        let mut copier = Copier::new(created.id, pace);
        // The seed's calls, by the source's ids: the copy's creation made its own of them.
        let all = ReadRange { after: None, before: None, limit: 10_000, newest_first: false };
        for copy in self.store.log.read(created.id, all).await? {
            let event = copy.decode().ok();
            if let Some(original) = event.as_ref().and_then(|e| call_id(&e.body)).and_then(|id| calls.get(id)) {
                copier.ids.insert(original.clone(), copy.id.to_string());
            }
        }
        if let Some(first) = start.first {
            let replay = pages(self.store.log.as_ref(), source.id, Some(&first.to_string())).await?;
            tokio::spawn(self.copy_all(replay, copier));
        }
        Ok(created)
    }

    /// The source as it stood at the start: its settings, with its history as the seed;
    /// and the calls of that history (to know the copy's by), by tool call id.
    async fn as_it_stood(
        &self,
        source: SessionId,
        start: Start,
    ) -> Result<(SessionSpec, HashMap<String, String>), SessionError> {
        let (mut summary, mut history, mut calls) = (None, History::default(), HashMap::new());
        store::fold(self.store.log.as_ref(), source, Position::default(), |raw| {
            if raw.seq >= start.seq {
                return;
            }
            let Ok(event) = raw.decode() else { return };
            history.apply(&event);
            if let Some(next) = SessionSummary::apply(summary.take(), &event) {
                summary = Some(next);
            }
            if let Some(tool_call_id) = call_id(&event.body) {
                calls.insert(tool_call_id.to_string(), event.id.to_string());
            }
        })
        .await?;
        let mut spec = summary.ok_or_else(|| SessionError::NotFound(source.to_string()))?.spec;
        spec.messages = history.messages.into_iter().map(Arc::unwrap_or_clone).collect();
        spec.forked_from = None;
        Ok((spec, calls))
    }

    /// Copies every page of `replay` into the copier's session, unless the session is
    /// closed meanwhile; then closes a copied turn left open.
    fn copy_all(&self, mut replay: Pages, mut copier: Copier) -> impl std::future::Future<Output = ()> + 'static {
        let (engine, log, session) = (self.engine.clone(), self.store.log.clone(), copier.session);
        let cancel = engine.start_replaying(session);
        let replaying = Replaying { engine: engine.clone(), session };
        async move {
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
            let result: Result<(), SessionError> = tokio::select! {
                result = copied => result,
                _ = cancel.cancelled() => Err(SessionError::NotFound(session.to_string())),
            };
            match &result {
                Ok(()) => tracing::info!(session_id = %session, copied = copier.copied, "replay done"),
                Err(error) => tracing::warn!(%error, session_id = %session, copied = copier.copied, "replay stopped"),
            }
            if !cancel.is_cancelled() {
                if let Err(error) = engine.end_replay(session).await {
                    tracing::warn!(%error, session_id = %session, "could not close the replay's open turn");
                }
            }
            drop(replaying);
        }
    }

    /// Where a replay of `source` from event `from` starts: that event, or the start of its
    /// turn if it is inside one, or after the source's creation (the turn its seed history
    /// made with it included); `None` if `from` is not an event of the source.
    async fn replay_start(&self, source: SessionId, from: Option<EventId>) -> Result<Option<Start>, SessionError> {
        let created = self.first(source).await?;
        // A seed history that ends with calls makes a turn with the session, through its idle.
        let mut seed_open = created.decode().ok().is_some_and(|event| {
            matches!(&event.body, EventBody::SessionCreated { spec, .. }
                if crate::domain::message::waiting_calls(&spec.messages).next().is_some())
        });
        let (mut seed, mut in_seed) = (None, false);
        let mut starts: HashMap<TurnId, Start> = HashMap::new();
        let (mut after_creation, mut found) = (None, None);
        store::fold(self.store.log.as_ref(), source, Position::default(), |raw| {
            let turn = raw.turn().map(|(turn, _)| turn);
            if raw.seq == 1 {
                return;
            }
            if seed_open {
                seed = seed.or(turn);
                if turn.is_some() && turn == seed {
                    seed_open = raw.kind() != "session.status_idle";
                    in_seed |= Some(raw.id) == from;
                    return;
                }
                seed_open = false;
            }
            let here = Start { first: Some(raw.id), seq: raw.seq };
            after_creation = after_creation.or(Some(here));
            if let (Some(turn), "turn.started") = (turn, raw.kind()) {
                starts.insert(turn, here);
            }
            if Some(raw.id) == from {
                found = Some(turn.and_then(|turn| starts.get(&turn).copied()).unwrap_or(here));
            }
        })
        .await?;
        let from_creation = after_creation.unwrap_or(Start { first: None, seq: u64::MAX });
        Ok(match from {
            None => Some(from_creation),
            Some(from) if from == created.id || in_seed => Some(from_creation),
            Some(_) => found,
        })
    }

    /// The source's first event, its creation.
    async fn first(&self, source: SessionId) -> Result<RawEvent, SessionError> {
        let first = ReadRange { after: None, before: None, limit: 1, newest_first: false };
        let event = self.store.log.read(source, first).await?.into_iter().next();
        event.ok_or_else(|| SessionError::NotFound(source.to_string()))
    }
}

/// Where a replay starts: the first event it copies (none: it copies nothing), whose
/// sequence number is where the source's history and settings are taken.
#[derive(Debug, Clone, Copy)]
struct Start {
    first: Option<EventId>,
    seq: u64,
}

/// While it lives, its session is replayed into; dropped (however the task ends), it is not.
struct Replaying {
    engine: Engine,
    session: SessionId,
}

impl Drop for Replaying {
    fn drop(&mut self) {
        self.engine.stop_replaying(self.session);
    }
}

/// Copies a source's events into the replay session, one at a time, each when it is due.
struct Copier {
    session: SessionId,
    pace: Pace,
    /// The source's ids of events that others name, and the copies'.
    ids: HashMap<String, String>,
    /// The source's turns and the copies'.
    turns: HashMap<TurnId, TurnId>,
    copied: usize,
}

impl Copier {
    fn new(session: SessionId, pace: Pace) -> Copier {
        Copier { session, pace, ids: HashMap::new(), turns: HashMap::new(), copied: 0 }
    }

    async fn copy(&mut self, engine: &Engine, raw: RawEvent) -> Result<(), SessionError> {
        if NOT_COPIED.contains(&raw.kind()) {
            return Ok(());
        }
        let Ok(event) = raw.decode() else {
            tracing::warn!(id = %raw.id, "a replayed event does not decode; skipped");
            return Ok(());
        };
        let turn = event.turn_id.map(|turn| *self.turns.entry(turn).or_insert_with(TurnId::generate));
        let mut body = serde_json::to_value(&event.body).map_err(|e| SessionError::Invalid(e.to_string()))?;
        rename(&mut body, &self.ids);
        let body = serde_json::from_value(body).map_err(|e| SessionError::Invalid(e.to_string()))?;
        let draft = match (event.processed_at, &body) {
            (None, EventBody::UserMessage { .. }) => Draft::queued(&body),
            _ => Draft::new(turn, &body),
        };
        self.pace.wait(&raw).await;
        let stored = engine.copy(self.session, vec![draft]).await?;
        if let Some(copy) = stored.first().filter(|_| NAMED.contains(&raw.kind())) {
            self.ids.insert(raw.id.to_string(), copy.id.to_string());
        }
        self.copied += 1;
        Ok(())
    }
}

/// Changes the ids that [`ID_FIELDS`] in `value` hold (at any depth) to their copies'.
fn rename(value: &mut Value, ids: &HashMap<String, String>) {
    let renamed = |value: &mut Value| match value {
        Value::String(id) => {
            if let Some(copy) = ids.get(id.as_str()) {
                *id = copy.clone();
            }
        }
        Value::Array(items) => {
            for item in items {
                if let Some(copy) = item.as_str().and_then(|id| ids.get(id)) {
                    *item = Value::String(copy.clone());
                }
            }
        }
        _ => {}
    };
    match value {
        Value::Object(fields) => {
            for (name, field) in fields.iter_mut() {
                if ID_FIELDS.contains(&name.as_str()) {
                    renamed(field);
                } else {
                    rename(field, ids);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|item| rename(item, ids)),
        _ => {}
    }
}

/// The pace of a replay: each event is due as long after the first as it was made after
/// it (its `created_at`), divided by the speed. Sleeping until an absolute time, not for
/// each gap, so that a slow reader does not make the replay drift.
/// The longest a replay waits for one event, whatever its speed.
const MAX_WAIT: std::time::Duration = std::time::Duration::from_secs(365 * 24 * 3600);

pub struct Pace {
    speed: f64,
    origin: Option<(tokio::time::Instant, chrono::DateTime<chrono::Utc>)>,
}

impl Pace {
    pub fn new(speed: f64) -> Result<Pace, SessionError> {
        if !(speed > 0.0 && speed.is_finite()) {
            return Err(SessionError::Invalid(format!("invalid `speed`: must be a positive number, not {speed}")));
        }
        Ok(Pace { speed, origin: None })
    }

    /// Waits until the event is due (the first one at once; one without a time, at once).
    pub async fn wait(&mut self, event: &RawEvent) {
        #[derive(serde::Deserialize)]
        struct At {
            created_at: chrono::DateTime<chrono::Utc>,
        }
        let Ok(At { created_at }) = serde_json::from_slice::<At>(&event.json) else { return };
        let (started, origin) = *self.origin.get_or_insert((tokio::time::Instant::now(), created_at));
        let gap = (created_at - origin).to_std().unwrap_or_default().as_secs_f64() / self.speed;
        // However slow the speed asked, no wait is longer than a year (or overflows).
        let offset = std::time::Duration::try_from_secs_f64(gap).unwrap_or(MAX_WAIT).min(MAX_WAIT);
        tokio::time::sleep_until(started.checked_add(offset).unwrap_or(started + MAX_WAIT)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn only_the_fields_that_name_events_are_renamed() {
        let ids = HashMap::from([("evt_A".to_string(), "evt_B".to_string())]);
        let mut value = json!({
            "tool_use_id": "evt_A",
            "stop_reason": {"type": "requires_action", "event_ids": ["evt_A", "evt_C"]},
            "content": [{"type": "text", "text": "evt_A"}],
        });
        rename(&mut value, &ids);
        assert_eq!(
            value,
            json!({
                "tool_use_id": "evt_B",
                "stop_reason": {"type": "requires_action", "event_ids": ["evt_B", "evt_C"]},
                "content": [{"type": "text", "text": "evt_A"}],
            })
        );
    }
}
