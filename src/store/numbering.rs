//! The numbering rules, in one place for every log implementation: where an append may go
//! (at the expected position, never after `terminated` but for the `session.deleted` of a
//! session that ended on its own, within the session's limit, a
//! turn's events after its `turn.started` and before the next turn's), and what it gets
//! (ids strictly increasing per session whatever the clock does, sequence numbers 1, 2, 3,
//! ... with no gap, turn sequence numbers from 1 at each `turn.started`).
//! An implementation keeps a [`Tail`] per session it writes to, rebuilds it from the stored
//! events after a restart, and stores exactly the events [`Tail::stage`] returns.

use super::{AppendError, Appended, Conflict, Position};
use crate::domain::event::{timestamp_now, Envelope};
use crate::domain::ids::{next_ulid, now_ms};
use crate::domain::{Draft, EventId, RawEvent, SessionId, TurnId};

/// What an appender must know of a session's log to append to it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tail {
    pub position: Position,
    /// The last turn that has events, and its last turn sequence number.
    pub turn: Option<(TurnId, u32)>,
    /// The log takes nothing more: it ends with `terminated`, or with the `session.deleted`
    /// of a session that had ended.
    pub closed: bool,
    /// The log ends with a `terminated` that no delete wrote (a session that timed out): it
    /// takes one more append, that session's `session.deleted` alone, and is closed after it.
    pub deletable: bool,
}

/// Whether an event closes the log as the last one of an append.
fn closes(kind: &str) -> bool {
    matches!(kind, "terminated" | "session.deleted")
}

/// One instant, read once per group commit: every event of a commit has the same time.
pub struct Clock {
    now: String,
    now_ms: u64,
}

impl Clock {
    pub fn now() -> Clock {
        Clock { now: timestamp_now(), now_ms: now_ms() }
    }
}

/// How far back [`Tail::recover`] looks for the last turn before giving up: a later event
/// of an older turn is then numbered by [`Tail::unknown_turn`]'s lookup.
const RECOVER_DEPTH: usize = 256;

impl Tail {
    /// The tail after `events`, a whole log brought in from elsewhere, if the numbering
    /// could have made it: sequence numbers 1, 2, 3, ..., ids strictly increasing, and no
    /// more than `limit` events.
    pub fn adopted(events: &[RawEvent], limit: u64) -> Result<Tail, AppendError> {
        if events.len() as u64 > limit {
            return Err(AppendError::TooManyEvents { limit });
        }
        let mut last: Option<EventId> = None;
        for (i, event) in events.iter().enumerate() {
            if event.seq != i as u64 + 1 {
                let message = format!("event {} has sequence number {}, not {}", event.id, event.seq, i + 1);
                return Err(AppendError::Malformed(message));
            }
            if last.is_some_and(|last| event.id <= last) {
                return Err(AppendError::Malformed(format!("event {}'s id is not after its predecessor's", event.id)));
            }
            last = Some(event.id);
        }
        Ok(Tail::recover(events.iter().rev().cloned().map(Ok::<_, std::convert::Infallible>)).expect("infallible"))
    }

    /// Rebuilds a tail from a session's stored events, newest first.
    pub fn recover<E>(newest_first: impl IntoIterator<Item = Result<RawEvent, E>>) -> Result<Tail, E> {
        let mut tail = Tail::default();
        for (i, event) in newest_first.into_iter().take(RECOVER_DEPTH).enumerate() {
            let event = event?;
            if i == 0 {
                tail.position = Position { last: Some(event.id), seq: event.seq };
                tail.closed = closes(event.kind());
                tail.deletable = event.kind() == "terminated" && !Tail::deleted_before(&event);
            }
            if let Some(turn) = event.turn() {
                tail.turn = Some(turn);
                break;
            }
        }
        Ok(tail)
    }

    /// A turn that `drafts` continue but this tail does not know the number of (its last
    /// event lies further back than [`Tail::recover`] looked). The caller finds its last
    /// turn sequence number in the log and sets it with [`Tail::continue_turn`] before
    /// staging, so numbering stays exact after any restart.
    pub fn unknown_turn(&self, drafts: &[Draft]) -> Option<TurnId> {
        let first = drafts.iter().find(|d| d.turn.is_some())?;
        let turn = first.turn?;
        let known = self.turn.is_some_and(|(last, _)| last == turn);
        (!known && first.kind() != "turn.started").then_some(turn)
    }

    /// `turn` goes on from `number`, its last event's (0: it has none, so nothing can
    /// continue it and [`Tail::stage`] refuses what tries).
    pub fn continue_turn(&mut self, turn: TurnId, number: u32) {
        if number > 0 {
            self.turn = Some((turn, number));
        }
    }

    /// Whether a `terminated` was written by a delete: a delete's comes right after its
    /// `session.deleted`, in one append, and says so (`session deleted`).
    fn deleted_before(terminated: &RawEvent) -> bool {
        let needle: &[u8] = b"\"reason\":\"session deleted\"";
        memchr::memmem::find(&terminated.json, needle).is_some()
    }

    /// The last turn sequence number of `turn`, from a session's events, newest first.
    pub fn last_in_turn<E>(
        newest_first: impl IntoIterator<Item = Result<RawEvent, E>>,
        turn: TurnId,
    ) -> Result<u32, E> {
        for event in newest_first {
            if let Some((_, number)) = event?.turn().filter(|(of, _)| *of == turn) {
                return Ok(number);
            }
        }
        Ok(0)
    }

    /// Numbers `drafts` as the next events of `session` if its log ends at `expected`: the
    /// events to store, or the conflict. The tail moves on only when events are returned.
    pub fn stage(
        &mut self,
        session: SessionId,
        expected: u64,
        drafts: &[Draft],
        clock: &Clock,
        limit: u64,
    ) -> Result<Appended, AppendError> {
        // Nothing follows `terminated` (but the one delete of a session that ended on its own):
        // check the whole append before numbering any of it.
        let terminated_early = drafts.iter().rev().skip(1).any(|d| d.kind() == "terminated");
        let deleting_ended = self.deletable && drafts.len() == 1 && drafts[0].kind() == "session.deleted";
        if (self.closed && !deleting_ended) || terminated_early {
            return Err(AppendError::Closed);
        }
        if expected != self.position.seq {
            return Ok(Err(Conflict { expected, actual: self.position }));
        }
        if self.position.seq + drafts.len() as u64 > limit {
            return Err(AppendError::TooManyEvents { limit });
        }
        let mut tail = *self;
        let mut events = Vec::with_capacity(drafts.len());
        for draft in drafts {
            let id = EventId(next_ulid(tail.position.last.map(EventId::ulid), clock.now_ms));
            let seq = tail.position.seq + 1;
            let turn = match (draft.turn, tail.turn) {
                (Some(turn), _) if draft.kind() == "turn.started" => Some((turn, 1)),
                (Some(turn), Some((current, n))) if current == turn => Some((turn, n + 1)),
                (Some(turn), _) => return Err(AppendError::OutOfTurn { turn: turn.to_string() }),
                (None, _) => None,
            };
            let json = Envelope { id, session, turn, seq, now: &clock.now }.write(draft);
            tail.position = Position { last: Some(id), seq };
            tail.turn = turn.or(tail.turn);
            tail.closed = draft.kind() == "terminated" || deleting_ended;
            tail.deletable = draft.kind() == "terminated" && !drafts.iter().any(|d| d.kind() == "session.deleted");
            events.push(RawEvent { id, seq, json });
        }
        *self = tail;
        Ok(Ok(events))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::EventBody;

    fn outcome(turn: Option<TurnId>) -> Draft {
        Draft::new(turn, &EventBody::UserDefineOutcome { outcome: serde_json::json!(1) })
    }

    #[test]
    fn appends_go_only_at_the_expected_position() {
        let session = SessionId::generate();
        let mut tail = Tail::default();
        let clock = Clock::now();
        let first = tail.stage(session, 0, &[outcome(None), outcome(None)], &clock, 100).unwrap().unwrap();
        assert_eq!(first.iter().map(|e| e.seq).collect::<Vec<_>>(), [1, 2]);
        let conflict = tail.stage(session, 1, &[outcome(None)], &clock, 100).unwrap().unwrap_err();
        assert_eq!(conflict, Conflict { expected: 1, actual: Position { last: Some(first[1].id), seq: 2 } });
        assert_eq!(tail.position.seq, 2, "a conflict moves nothing");
        assert_eq!(
            tail.stage(session, 2, &vec![outcome(None); 99], &clock, 100),
            Err(AppendError::TooManyEvents { limit: 100 })
        );
    }

    #[test]
    fn turns_number_from_their_start_and_nothing_follows_terminated() {
        let session = SessionId::generate();
        let (a, b) = (TurnId::generate(), TurnId::generate());
        let mut tail = Tail::default();
        let clock = Clock::now();
        let started = |turn| Draft::new(Some(turn), &EventBody::TurnStarted {});
        let drafts = [started(a), outcome(Some(a)), outcome(None), outcome(Some(a)), started(b), outcome(Some(b))];
        let events = tail.stage(session, 0, &drafts, &clock, 100).unwrap().unwrap();
        let numbers: Vec<Option<u32>> = events.iter().map(|e| e.turn().map(|(_, n)| n)).collect();
        assert_eq!(numbers, [Some(1), Some(2), None, Some(3), Some(1), Some(2)]);
        let late = [outcome(Some(a))];
        assert_eq!(
            tail.stage(session, 6, &late, &clock, 100),
            Err(AppendError::OutOfTurn { turn: a.to_string() }),
            "a turn takes no events once the next has started"
        );
        let end = Draft::new(None, &EventBody::Terminated { reason: "x".into() });
        assert_eq!(tail.stage(session, 6, &[end.clone(), outcome(None)], &clock, 100), Err(AppendError::Closed));
        tail.stage(session, 6, &[end], &clock, 100).unwrap().unwrap();
        assert_eq!(tail.stage(session, 7, &[outcome(None)], &clock, 100), Err(AppendError::Closed));
        // A session that ended on its own may still be deleted, once, and then takes nothing.
        let deleted = Draft::new(None, &EventBody::SessionDeleted {});
        assert_eq!(tail.stage(session, 7, &[deleted.clone(), outcome(None)], &clock, 100), Err(AppendError::Closed));
        let recovered = Tail::recover(events.iter().rev().cloned().map(Ok::<_, ()>)).unwrap();
        assert!(!recovered.closed, "before the end");
        tail.stage(session, 7, std::slice::from_ref(&deleted), &clock, 100).unwrap().unwrap();
        assert_eq!(tail.stage(session, 8, &[deleted], &clock, 100), Err(AppendError::Closed));
        assert_eq!(tail.stage(session, 8, &[outcome(None)], &clock, 100), Err(AppendError::Closed));
    }

    #[test]
    fn a_deleted_session_s_end_takes_nothing_even_after_a_restart() {
        let session = SessionId::generate();
        let mut tail = Tail::default();
        let clock = Clock::now();
        let deleted = Draft::new(None, &EventBody::SessionDeleted {});
        let end = Draft::new(None, &EventBody::Terminated { reason: "session deleted".into() });
        let events = tail.stage(session, 0, &[outcome(None), deleted.clone(), end], &clock, 100).unwrap().unwrap();
        assert_eq!(tail.stage(session, 3, std::slice::from_ref(&deleted), &clock, 100), Err(AppendError::Closed));
        let mut recovered = Tail::recover(events.iter().rev().cloned().map(Ok::<_, ()>)).unwrap();
        assert!(recovered.closed && !recovered.deletable);
        assert_eq!(recovered.stage(session, 3, &[deleted], &clock, 100), Err(AppendError::Closed));
        // A timed-out session's end, read back after a restart, still takes its delete.
        let timed_out = SessionId::generate();
        let mut tail = Tail::default();
        let end = Draft::new(None, &EventBody::Terminated { reason: "idle timeout".into() });
        let events = tail.stage(timed_out, 0, &[outcome(None), end], &clock, 100).unwrap().unwrap();
        let mut recovered = Tail::recover(events.iter().rev().cloned().map(Ok::<_, ()>)).unwrap();
        assert!(recovered.closed && recovered.deletable);
        let deleted = Draft::new(None, &EventBody::SessionDeleted {});
        recovered.stage(timed_out, 2, &[deleted], &clock, 100).unwrap().unwrap();
        assert!(recovered.closed && !recovered.deletable);
    }

    #[test]
    fn a_recovered_tail_goes_on_where_the_log_ended() {
        let session = SessionId::generate();
        let turn = TurnId::generate();
        let mut tail = Tail::default();
        let clock = Clock::now();
        let mut drafts = vec![Draft::new(Some(turn), &EventBody::TurnStarted {}), outcome(Some(turn))];
        drafts.extend(std::iter::repeat_n(outcome(None), RECOVER_DEPTH + 1));
        let events = tail.stage(session, 0, &drafts, &clock, 10_000).unwrap().unwrap();
        let mut recovered = Tail::recover(events.iter().rev().cloned().map(Ok::<_, ()>)).unwrap();
        assert_eq!(recovered.position, tail.position);
        assert_eq!(recovered.turn, None, "the turn lies further back than recovery looks");
        let more = [outcome(Some(turn))];
        assert_eq!(recovered.unknown_turn(&more), Some(turn));
        recovered.continue_turn(turn, 2);
        let next = recovered.stage(session, tail.position.seq, &more, &clock, 10_000).unwrap().unwrap();
        assert_eq!(next[0].turn(), Some((turn, 3)));
        assert!(next[0].id > tail.position.last.unwrap());
    }
}
