//! The event format: its types, its envelope, and its stored bytes.

use bytes::Bytes;
use ulid::Ulid;

use super::*;

#[test]
fn types_names_every_variant_once() {
    // serde names every variant when it meets an unknown one.
    let error = serde_json::from_str::<EventBody>(r#"{"type":"?"}"#).unwrap_err().to_string();
    let mut variants: Vec<&str> = error.split('`').skip(3).step_by(2).collect();
    let mut listed = EventBody::TYPES.to_vec();
    variants.sort_unstable();
    listed.sort_unstable();
    assert_eq!(listed, variants, "{error}");
}

#[test]
fn envelope_and_body_make_one_event_that_decodes() {
    let body = EventBody::UserMessage { content: vec![Block::text("hi")] };
    let draft = Draft::new(None, &body);
    assert_eq!(draft.kind(), "user.message");
    let id = EventId(Ulid::new());
    let session = SessionId(Ulid::new());
    let turn = TurnId(Ulid::new());
    let json =
        Envelope { id, session, turn: Some((turn, 3)), seq: 7, now: "2026-01-01T00:00:00.000000Z" }.write(&draft);
    let (id_ulid, session_ulid, turn_ulid) = (id.ulid(), session.ulid(), turn.ulid());
    let head = format!(
        "{{\"id\":\"evt_{id_ulid}\",\"type\":\"user.message\",\"session_id\":\"sess_{session_ulid}\",\"turn_id\":\"turn_{turn_ulid}\",\
         \"turn_sequence_number\":3,\"sequence_number\":7,\"created_at\":\"2026-01-01T00:00:00.000000Z\",\
         \"processed_at\":\"2026-01-01T00:00:00.000000Z\",\"schema_version\":1,\"content\":"
    );
    assert!(json.starts_with(head.as_bytes()), "{}", String::from_utf8_lossy(&json));
    let raw = RawEvent::stored(id, json);
    assert_eq!(raw.seq, 7);
    assert_eq!(raw.turn(), Some((turn, 3)));
    assert_eq!(raw.kind(), "user.message");
    let event = raw.decode().unwrap();
    assert_eq!(event.id, id);
    assert_eq!(event.session_id, session);
    assert_eq!(event.turn_id, Some(turn));
    assert_eq!(event.turn_sequence_number, Some(3));
    assert_eq!(event.sequence_number, 7);
    assert_eq!(event.body, body);
}

#[test]
fn a_body_with_no_fields_still_makes_valid_json() {
    let draft = Draft::new(None, &EventBody::SessionDeleted {});
    let id = EventId(Ulid::new());
    let json = Envelope { id, session: SessionId(Ulid::new()), turn: None, seq: 1, now: "t" }.write(&draft);
    let value: Value = serde_json::from_slice(&json).unwrap();
    assert_eq!(value["type"], "session.deleted");
    let raw = RawEvent::stored(id, json);
    assert_eq!((raw.kind(), raw.seq, raw.turn()), ("session.deleted", 1, None));
}

#[test]
fn a_body_field_named_like_the_envelope_is_not_read_as_it() {
    let body =
        EventBody::UserDefineOutcome { outcome: serde_json::json!({"turn_id": "turn_x", "n": ",\"turn_id\":\""}) };
    let id = EventId(Ulid::new());
    let json =
        Envelope { id, session: SessionId(Ulid::new()), turn: None, seq: 12, now: "t" }.write(&Draft::new(None, &body));
    let raw = RawEvent::stored(id, json);
    assert_eq!((raw.seq, raw.turn()), (12, None));
}

#[test]
fn a_cut_or_foreign_envelope_reads_as_nothing_rather_than_wrong() {
    let turn = TurnId(Ulid::new());
    let id = EventId(Ulid::new());
    let draft = Draft::new(Some(turn), &EventBody::UserInterrupt {});
    let json = Envelope { id, session: SessionId(Ulid::new()), turn: Some((turn, 9)), seq: 41, now: "t" }.write(&draft);
    for end in 0..json.len() {
        let cut = RawEvent::stored(id, json.slice(..end));
        // Cut inside a number, the envelope may read as a shorter number; never anything else.
        assert!(cut.turn().is_none_or(|(of, n)| of == turn && "9".starts_with(&n.to_string())));
    }
    let foreign = RawEvent::stored(id, Bytes::from_static(br#"{"sequence_number":3,"turn_id":"x"}"#));
    assert_eq!((foreign.seq, foreign.turn()), (0, None));
}

#[test]
fn queued_input_is_known_at_any_sequence_number_and_reads_processed_later() {
    let body = EventBody::UserMessage { content: vec![Block::text(",\"processed_at\":null")] };
    for seq in [1, 9, 10, 12_345_678_901] {
        let id = EventId(Ulid::new());
        let json =
            Envelope { id, session: SessionId(Ulid::new()), turn: None, seq, now: "t" }.write(&Draft::queued(&body));
        let raw = RawEvent::stored(id, json);
        assert!(raw.is_queued(), "at {seq}");
        let event = raw.decode().unwrap();
        assert_eq!((event.processed_at, event.schema_version), (None, SCHEMA_VERSION_QUEUED));
        let processed = raw.processed("2026-01-01T00:00:00.000000Z");
        assert!(!processed.is_queued());
        assert_eq!(processed.decode().unwrap().processed_at.as_deref(), Some("2026-01-01T00:00:00.000000Z"));
        let plain = RawEvent::stored(
            id,
            Envelope { id, session: SessionId(Ulid::new()), turn: None, seq, now: "t" }.write(&Draft::new(None, &body)),
        );
        assert!(!plain.is_queued(), "a body that holds the words is not queued");
    }
    // Only a message waits: another type is never queued, whatever its envelope says (and
    // its bytes are not looked through).
    let id = EventId(Ulid::new());
    let json = format!(
        r#"{{"id":"{id}","type":"user.define_outcome","session_id":"sess_01J00000000000000000000000","sequence_number":2,"created_at":"t","processed_at":null,"schema_version":1,"outcome":"x"}}"#
    );
    assert!(!RawEvent::stored(id, Bytes::from(json.clone())).is_queued());
    let message = json.replace("user.define_outcome", "user.message");
    assert!(RawEvent::stored(id, Bytes::from(message)).is_queued(), "the same envelope on a message is queued");
}

#[test]
fn client_tools_keep_their_stored_form() {
    let stored = r#"{"name":"get_weather","description":"Weather","parameters":{"type":"object","required":["city"]}}"#;
    let tool: ClientTool = serde_json::from_str(stored).unwrap();
    assert_eq!(tool.input_schema["required"][0], "city");
    let written: Value = serde_json::to_value(&tool).unwrap();
    assert_eq!(written, serde_json::from_str::<Value>(stored).unwrap(), "written back exactly as stored");
    let bare: ClientTool = serde_json::from_str(r#"{"name":"t"}"#).unwrap();
    assert_eq!(bare.input_schema, ClientTool::any_object());
}

#[test]
fn a_stop_reasons_name_is_the_one_the_log_stores() {
    use StopReason::*;
    for reason in [EndTurn, RequiresAction, MaxTokens, MaxTurnRequests, Refusal, Cancelled, Error] {
        assert_eq!(serde_json::to_value(reason).unwrap(), reason.as_str());
    }
}
