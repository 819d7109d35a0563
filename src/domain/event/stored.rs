//! An event as the log stores it: a [`Draft`] (a body serialised off the writer's thread),
//! the [`Envelope`] the writer puts in front of it, and the stored bytes ([`RawEvent`]),
//! whose type and numbers are read at fixed offsets without parsing.

use bytes::Bytes;
use memchr::memmem::Finder;

use std::sync::{Arc, LazyLock};

use super::{Event, EventBody, SCHEMA_VERSION, SCHEMA_VERSION_QUEUED};
use crate::domain::ids::{EventId, SessionId, TurnId};
use crate::domain::request::{RequestMark, MARK_FIELD};

/// What a caller asks to append: the body already serialised (off the writer's thread)
/// and the turn it belongs to. The writer adds the envelope.
#[derive(Debug, Clone)]
pub struct Draft {
    pub turn: Option<TurnId>,
    body: Bytes,
    kind_end: usize,
    /// Input stored while a turn runs, answered by a later one: `processed_at` is null
    /// until a `turn.input` names it.
    queued: bool,
    /// The keyed write this draft is the first event of (see [`crate::domain::request`]).
    request: Option<Arc<RequestMark>>,
}

const TYPE_PREFIX: &[u8] = b"{\"type\":\"";
/// The only type of event ever written queued (a user's message that waits for a turn).
const QUEUED_KIND: &str = "user.message";

impl Draft {
    pub fn new(turn: Option<TurnId>, body: &EventBody) -> Draft {
        let body = Bytes::from(serde_json::to_vec(body).expect("event bodies always serialise"));
        let kind_end =
            TYPE_PREFIX.len() + body[TYPE_PREFIX.len()..].iter().position(|&b| b == b'"').expect("a type tag");
        Draft { turn, body, kind_end, queued: false, request: None }
    }

    /// A user's message that waits for the running turn to end (`processed_at` null). Only
    /// messages wait: [`RawEvent::is_queued`] looks no further for any other type.
    pub fn queued(body: &EventBody) -> Draft {
        debug_assert!(matches!(body, EventBody::UserMessage { .. }), "only a user's message is queued");
        Draft { queued: true, ..Draft::new(None, body) }
    }

    pub fn is_queued(&self) -> bool {
        self.queued
    }

    /// This draft as the first event of a keyed write, which its envelope then says.
    pub fn marked(self, mark: RequestMark) -> Draft {
        Draft { request: Some(Arc::new(mark)), ..self }
    }

    pub fn request(&self) -> Option<&RequestMark> {
        self.request.as_deref()
    }

    /// The serialised body, as [`Draft::from_body`] takes it (to hand a draft to another node).
    pub fn body(&self) -> &[u8] {
        &self.body
    }

    /// A draft of a body serialised by [`Draft::new`] elsewhere; `None` if it is not one
    /// (or if it says it is queued and is not a user's message: only those wait).
    pub fn from_body(turn: Option<TurnId>, body: Bytes, queued: bool) -> Option<Draft> {
        let rest = body.strip_prefix(TYPE_PREFIX)?;
        let kind_end = TYPE_PREFIX.len() + rest.iter().position(|&b| b == b'"')?;
        if queued && &body[TYPE_PREFIX.len()..kind_end] != QUEUED_KIND.as_bytes() {
            return None;
        }
        serde_json::from_slice::<EventBody>(&body).ok()?;
        Some(Draft { turn, body, kind_end, queued, request: None })
    }

    pub fn kind(&self) -> &str {
        std::str::from_utf8(&self.body[TYPE_PREFIX.len()..self.kind_end]).expect("utf-8")
    }

    /// The body's own fields after the type: `,"content":[...]}` or `}`.
    pub fn fields(&self) -> &[u8] {
        &self.body[self.kind_end + 1..]
    }

    pub fn len(&self) -> usize {
        self.body.len()
    }

    pub fn is_empty(&self) -> bool {
        self.body.is_empty()
    }
}

/// A stored event as bytes, with the two facts the hot paths need without parsing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawEvent {
    pub id: EventId,
    pub seq: u64,
    pub json: Bytes,
}

/// `{"id":"evt_` + 26 ULID characters + `","type":"`: where the writer puts the type.
const KIND_OFFSET: usize = 7 + 4 + 26 + 10;

impl RawEvent {
    /// A stored event: its id (from its key) and its bytes, exactly as stored.
    pub fn stored(id: EventId, json: Bytes) -> RawEvent {
        let seq = Head::seq(&json).unwrap_or(0);
        RawEvent { id, seq, json }
    }

    /// The turn the event belongs to and its number in it, read from the envelope.
    pub fn turn(&self) -> Option<(TurnId, u32)> {
        Head::turn(&self.json)
    }

    /// The event type, read from where the writer put it.
    pub fn kind(&self) -> &str {
        let rest = self.json.get(KIND_OFFSET..).unwrap_or_default();
        let end = memchr::memchr(b'"', rest).unwrap_or(0);
        std::str::from_utf8(&rest[..end]).unwrap_or("")
    }

    pub fn decode(&self) -> Result<Event, serde_json::Error> {
        serde_json::from_slice(&self.json)
    }

    pub fn is_delta(&self) -> bool {
        self.kind().ends_with(".delta")
    }
}

/// The numbers of an envelope, read where [`Envelope::write`] puts them: after the type,
/// `,"session_id":"sess_…"`, then inside a turn `,"turn_id":"turn_…","turn_sequence_number":N`,
/// then `,"sequence_number":N`. Fixed offsets, no scanning: every read of the log does this.
struct Head;

impl Head {
    const SESSION: &'static [u8] = b"\",\"session_id\":\"sess_";
    const TURN: &'static [u8] = b"\",\"turn_id\":\"turn_";
    const TURN_NUMBER: &'static [u8] = b"\",\"turn_sequence_number\":";
    const SEQ: &'static [u8] = b",\"sequence_number\":";
    const ULID: usize = 26;

    /// The sequence number alone (what every event read needs): the turn is skipped, not parsed.
    fn seq(json: &[u8]) -> Option<u64> {
        let rest = Head::after_session(json)?;
        let rest = match rest.strip_prefix(Head::TURN) {
            Some(turn) => {
                let rest = turn.get(Head::ULID..)?.strip_prefix(Head::TURN_NUMBER)?;
                number(rest)?.1
            }
            None => rest.strip_prefix(b"\"")?,
        };
        Some(number(rest.strip_prefix(Head::SEQ)?)?.0)
    }

    /// What follows the session id.
    fn after_session(json: &[u8]) -> Option<&[u8]> {
        let kind_end = KIND_OFFSET + memchr::memchr(b'"', json.get(KIND_OFFSET..)?)?;
        json.get(kind_end..)?.strip_prefix(Head::SESSION)?.get(Head::ULID..)
    }

    /// The turn and the event's number in it, if it is in one.
    fn turn(json: &[u8]) -> Option<(TurnId, u32)> {
        let turn = Head::after_session(json)?.strip_prefix(Head::TURN)?;
        let id = std::str::from_utf8(turn.get(..Head::ULID)?).ok()?;
        let id = TurnId(ulid::Ulid::from_string(id).ok()?);
        let (number, _) = number(turn.get(Head::ULID..)?.strip_prefix(Head::TURN_NUMBER)?)?;
        Some((id, u32::try_from(number).ok()?))
    }
}

/// The unsigned number at the start of `bytes`, and what follows it.
fn number(bytes: &[u8]) -> Option<(u64, &[u8])> {
    let len = bytes.iter().take_while(|b| b.is_ascii_digit()).count();
    let value = bytes[..len].iter().try_fold(0u64, |n, b| n.checked_mul(10)?.checked_add(u64::from(b - b'0')))?;
    (len > 0).then_some((value, &bytes[len..]))
}

/// Writes the envelope of an event in front of its fields. Field order is fixed: `id`
/// then `type` first, which [`RawEvent::kind`] relies on.
pub struct Envelope<'a> {
    pub id: EventId,
    pub session: SessionId,
    pub turn: Option<(TurnId, u32)>,
    pub seq: u64,
    pub now: &'a str,
}

impl Envelope<'_> {
    pub fn write(&self, draft: &Draft) -> Bytes {
        use std::io::Write;
        let mut out = Vec::with_capacity(draft.len() + 256);
        write!(out, "{{\"id\":\"{}\",\"type\":\"{}\",\"session_id\":\"{}\"", self.id, draft.kind(), self.session)
            .expect("writing to a Vec");
        if let Some((turn, turn_seq)) = self.turn {
            write!(out, ",\"turn_id\":\"{turn}\",\"turn_sequence_number\":{turn_seq}").expect("vec");
        }
        write!(out, ",\"sequence_number\":{},\"created_at\":\"{}\"", self.seq, self.now).expect("vec");
        let version = if draft.is_queued() {
            out.extend_from_slice(QUEUED);
            SCHEMA_VERSION_QUEUED
        } else {
            write!(out, ",\"processed_at\":\"{}\"", self.now).expect("vec");
            SCHEMA_VERSION
        };
        write!(out, ",\"schema_version\":{version}").expect("vec");
        if let Some(mark) = &draft.request {
            out.extend_from_slice(&MARK_FIELD[..MARK_FIELD.len() - b"{\"idempotency_key\":".len()]);
            serde_json::to_writer(&mut out, mark.as_ref()).expect("vec");
        }
        out.extend_from_slice(draft.fields());
        Bytes::from(out)
    }
}

const QUEUED: &[u8] = b",\"processed_at\":null";

impl RawEvent {
    /// Queued input as it reads once a turn has taken it: `processed_at` set to `at`.
    pub fn processed(&self, at: &str) -> RawEvent {
        static FIND: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(QUEUED));
        let Some(position) = FIND.find(&self.json) else { return self.clone() };
        let mut json = Vec::with_capacity(self.json.len() + at.len() + 2);
        json.extend_from_slice(&self.json[..position]);
        json.extend_from_slice(format!(",\"processed_at\":\"{at}\"").as_bytes());
        json.extend_from_slice(&self.json[position + QUEUED.len()..]);
        RawEvent { json: Bytes::from(json), ..self.clone() }
    }

    /// When the event was stored (`created_at`), read from the envelope.
    pub fn created_at(&self) -> Option<&str> {
        const FIELD: &[u8] = b",\"created_at\":\"";
        static FIND: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(FIELD));
        let at = FIND.find(&self.json)? + FIELD.len();
        let end = at + memchr::memchr(b'"', &self.json[at..])?;
        std::str::from_utf8(&self.json[at..end]).ok()
    }

    /// Whether this is input still waiting for a turn (as stored): the envelope's
    /// `processed_at`, the field just before its `schema_version`, is null. (The first
    /// `,"schema_version":` is the envelope's: a body's strings escape their quotes.)
    pub fn is_queued(&self) -> bool {
        // Only a user's message ever waits for a turn ([`Draft::queued`]): any other event is
        // known processed from its type, with no look through its bytes.
        let after = self.json.get(KIND_OFFSET..).and_then(|rest| rest.strip_prefix(QUEUED_KIND.as_bytes()));
        if after.is_none_or(|after| !after.starts_with(b"\"")) {
            return false;
        }
        const VERSION: &[u8] = b",\"schema_version\":";
        static FIND: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(VERSION));
        let head = FIND.find(&self.json).map(|end| &self.json[..end]);
        head.is_some_and(|head| head.ends_with(QUEUED))
    }
}

/// RFC 3339 with microseconds, in UTC.
pub fn timestamp_now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
}
