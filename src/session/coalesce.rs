//! Merging consecutive delta events of one message (`delta_flush_interval_ms`): a delta
//! that comes after a quiet spell goes out at once (a reply's first words wait for nothing);
//! those that come within the window after a delta went out are held, and go out at the
//! window's end as one event whose text is theirs and whose id is the id of the last delta
//! it covers, so resuming after it is exact. So a stream sends at most one delta event per
//! window. Deltas are merged, never dropped.

use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;

use crate::domain::RawEvent;

pub struct Coalescer {
    window: Option<Duration>,
    pending: Option<Pending>,
    /// When a delta last went out.
    sent: Option<Instant>,
}

struct Pending {
    due: Instant,
    last: RawEvent,
    kind: String,
    message_id: String,
    text: String,
    merged: usize,
}

#[derive(serde::Deserialize)]
struct DeltaFields {
    message_id: String,
    delta: String,
}

impl Coalescer {
    /// `None` or zero: every event passes through as it is.
    pub fn new(window: Option<Duration>) -> Coalescer {
        Coalescer { window: window.filter(|w| !w.is_zero()), pending: None, sent: None }
    }

    /// Takes events in log order; returns those ready to send now.
    pub fn push(&mut self, events: Vec<RawEvent>, now: Instant) -> Vec<RawEvent> {
        let Some(window) = self.window else {
            return events;
        };
        let mut ready = Vec::with_capacity(events.len());
        for event in events {
            let fields = if event.is_delta() { serde_json::from_slice::<DeltaFields>(&event.json).ok() } else { None };
            let Some(fields) = fields else {
                ready.extend(self.flush_at(now));
                ready.push(event);
                continue;
            };
            match &mut self.pending {
                Some(p) if p.kind == event.kind() && p.message_id == fields.message_id => {
                    p.text.push_str(&fields.delta);
                    p.last = event;
                    p.merged += 1;
                }
                _ => {
                    ready.extend(self.flush_at(now));
                    let due = self.sent.map(|at| at + window).filter(|due| *due > now);
                    let Some(due) = due else {
                        // After a quiet spell: at once.
                        self.sent = Some(now);
                        ready.push(event);
                        continue;
                    };
                    self.pending = Some(Pending {
                        due,
                        kind: event.kind().to_string(),
                        last: event,
                        message_id: fields.message_id,
                        text: fields.delta,
                        merged: 1,
                    });
                }
            }
        }
        if self.deadline().is_some_and(|due| due <= now) {
            ready.extend(self.flush_at(now));
        }
        ready
    }

    /// When the held deltas must go out.
    pub fn deadline(&self) -> Option<Instant> {
        self.pending.as_ref().map(|p| p.due)
    }

    /// The held deltas as one event, going out now.
    pub fn flush(&mut self) -> Option<RawEvent> {
        self.flush_at(Instant::now())
    }

    fn flush_at(&mut self, now: Instant) -> Option<RawEvent> {
        let pending = self.pending.take()?;
        self.sent = Some(now);
        if pending.merged == 1 {
            return Some(pending.last);
        }
        Some(RawEvent { json: with_delta(&pending.last.json, &pending.text), ..pending.last })
    }
}

/// The event with its `delta` replaced. The envelope and `message_id` come before
/// `delta`, which the body writes last, and `,"delta":` cannot occur inside a JSON
/// string (a quote there is always escaped), so the first match is the field.
fn with_delta(json: &[u8], text: &str) -> Bytes {
    const FIELD: &[u8] = b",\"delta\":";
    let at = memchr::memmem::find(json, FIELD).expect("delta events have a delta");
    let mut out = Vec::with_capacity(at + FIELD.len() + text.len() + 8);
    out.extend_from_slice(&json[..at + FIELD.len()]);
    serde_json::to_writer(&mut out, text).expect("strings serialise");
    out.push(b'}');
    Bytes::from(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::event::Envelope;
    use crate::domain::{Draft, EventBody, EventId, SessionId};
    use ulid::Ulid;

    fn delta(seq: u64, message: &str, text: &str) -> RawEvent {
        let body = EventBody::AgentMessageDelta { message_id: message.into(), delta: text.into() };
        let id = EventId(Ulid::from_parts(seq, 0));
        let json =
            Envelope { id, session: SessionId(Ulid::nil()), turn: None, seq, now: "t" }.write(&Draft::new(None, &body));
        RawEvent { id, seq, json }
    }

    fn text_of(event: &RawEvent) -> String {
        serde_json::from_slice::<DeltaFields>(&event.json).unwrap().delta
    }

    #[test]
    fn without_a_window_everything_passes() {
        let mut c = Coalescer::new(None);
        let out = c.push(vec![delta(1, "m", "a"), delta(2, "m", "b")], Instant::now());
        assert_eq!(out.len(), 2);
    }

    #[test]
    fn the_first_delta_goes_at_once_and_the_run_after_it_becomes_one_event_with_the_last_id() {
        let mut c = Coalescer::new(Some(Duration::from_millis(50)));
        let now = Instant::now();
        let first = c.push(vec![delta(1, "m", "he"), delta(2, "m", "l\"lo")], now);
        assert_eq!(first.iter().map(|e| e.seq).collect::<Vec<_>>(), [1], "after a quiet spell, at once");
        assert!(c.push(vec![delta(3, "m", " ,\"delta\": x")], now).is_empty());
        assert_eq!(c.deadline(), Some(now + Duration::from_millis(50)));
        let merged = c.push(vec![], now + Duration::from_millis(50));
        assert_eq!(merged.len(), 1);
        assert_eq!(merged[0].seq, 3);
        assert_eq!(text_of(&merged[0]), "l\"lo ,\"delta\": x");
        assert_eq!(merged[0].kind(), "agent.message.delta");
        // Within the window after that: held again; after a quiet window: at once.
        assert!(c.push(vec![delta(4, "m", "a")], now + Duration::from_millis(60)).is_empty());
        assert_eq!(c.push(vec![], now + Duration::from_millis(100)).len(), 1);
        assert_eq!(c.push(vec![delta(5, "m", "b")], now + Duration::from_millis(200)).len(), 1);
    }

    #[test]
    fn another_message_or_event_flushes_the_run_in_order() {
        let mut c = Coalescer::new(Some(Duration::from_secs(10)));
        let now = Instant::now();
        let other = RawEvent {
            json: Envelope {
                id: EventId(Ulid::from_parts(4, 0)),
                session: SessionId(Ulid::nil()),
                turn: None,
                seq: 4,
                now: "t",
            }
            .write(&Draft::new(None, &EventBody::UserInterrupt {})),
            id: EventId(Ulid::from_parts(4, 0)),
            seq: 4,
        };
        let out = c.push(vec![delta(1, "m", "a"), delta(2, "n", "b"), delta(3, "n", "c"), other], now);
        let seqs: Vec<u64> = out.iter().map(|e| e.seq).collect();
        assert_eq!(seqs, vec![1, 3, 4]);
        assert_eq!(text_of(&out[1]), "bc");
    }
}
