//! The decisions, given a state and a command.

use super::*;
use crate::domain::event::Envelope;
use crate::domain::event::ModelStop;
use crate::domain::{Block, Message, RawEvent, SessionId};
use crate::engine::command::Closing;
use crate::engine::command::{Input, InputLimits, Submission};
use crate::engine::plan::{Mode, ToolPlan};
use crate::error::SessionError;
use crate::projection::turns::{CallKind, TurnState};
use crate::projection::SessionSummary;

/// Room for any input these tests make.
const ROOM: InputLimits = InputLimits { max_events_per_request: 100, max_event_bytes: 1 << 20 };

/// Room for events of at most `max_event_bytes`.
fn bytes(max_event_bytes: usize) -> InputLimits {
    InputLimits { max_event_bytes, ..ROOM }
}

fn kinds(decision: &Decision) -> Vec<&str> {
    decision.drafts.iter().map(Draft::kind).collect()
}

/// Drafts as a log stores them (ids and numbers in order).
fn stored(drafts: &[Draft]) -> Vec<RawEvent> {
    let session = SessionId::generate();
    let event = |(i, draft): (usize, &Draft)| {
        let (id, seq) = (EventId(ulid::Ulid::from_parts(1_000, i as u128)), i as u64 + 1);
        let turn = draft.turn.map(|t| (t, seq as u32));
        RawEvent { id, seq, json: Envelope { id, session, turn, seq, now: "t" }.write(draft) }
    };
    drafts.iter().enumerate().map(event).collect()
}

/// The state after these drafts.
fn fold(drafts: &[Draft]) -> TurnState {
    let mut state = TurnState::default();
    for raw in stored(drafts) {
        state.apply(&raw.decode().unwrap());
    }
    state
}

fn submission(inputs: Vec<Input>) -> Submission {
    Submission { inputs, all_at_once: true, ..Submission::default() }
}

#[test]
fn a_message_starts_a_turn_and_a_second_is_refused_while_it_runs() {
    let turn = TurnId::generate();
    let message = submission(vec![Input::Message(vec![Block::text("hi")])]);
    let decision = decide(&TurnState::default(), &message, None, turn, ROOM).unwrap();
    assert_eq!(kinds(&decision), ["turn.started", "user.message", "session.status_running"]);
    assert_eq!((decision.start, decision.cancel), (Some(turn), false));
    let running = fold(&decision.drafts);
    let refused = decide(&running, &message, None, TurnId::generate(), ROOM).unwrap_err();
    assert!(matches!(refused, SessionError::Busy(ref m) if m.contains("a turn is running")), "{refused}");
    let interrupt = decide(&running, &submission(vec![Input::Interrupt]), None, TurnId::generate(), ROOM).unwrap();
    assert_eq!((kinds(&interrupt), interrupt.cancel), (vec!["user.interrupt"], true));
}

#[test]
fn input_larger_than_the_limit_is_refused_naming_its_place() {
    let text = |n: usize| vec![Block::text("x".repeat(n))];
    let (outcome, message) = (Input::Outcome(serde_json::json!("done")), Input::Message(text(50)));
    let fits = decide(
        &TurnState::default(),
        &submission(vec![outcome.clone(), message]),
        None,
        TurnId::generate(),
        bytes(150),
    );
    assert_eq!(
        kinds(&fits.unwrap()),
        ["user.define_outcome", "turn.started", "user.message", "session.status_running"]
    );
    let over = submission(vec![outcome, Input::Message(text(200))]);
    let refused = decide(&TurnState::default(), &over, None, TurnId::generate(), bytes(150)).unwrap_err();
    assert!(
        matches!(refused, SessionError::TooLarge(ref m) if m.starts_with("event 1 (user.message) is ")),
        "{refused}"
    );
    assert!(refused.to_string().ends_with("; the limit is 150"), "{refused}");
}

#[test]
fn an_interrupt_after_input_that_starts_a_turn_cancels_that_turn() {
    let turn = TurnId::generate();
    let both = submission(vec![Input::Message(vec![Block::text("hi")]), Input::Interrupt]);
    let decision = decide(&TurnState::default(), &both, None, turn, ROOM).unwrap();
    assert_eq!(kinds(&decision), ["turn.started", "user.message", "session.status_running", "user.interrupt"]);
    assert!(decision.drafts.iter().all(|d| d.turn == Some(turn)), "the interrupt is the new turn's");
    assert_eq!((decision.start, decision.cancel), (Some(turn), true));
}

#[test]
fn a_seed_that_ends_with_calls_waits_for_their_answers() {
    let plan = ToolPlan {
        modes: [("calculator".to_string(), Mode::Inline), ("get_weather".to_string(), Mode::Client)].into(),
        ..ToolPlan::default()
    };
    let call = |id: &str, name: &str| crate::domain::Part::ToolUse {
        tool_call_id: id.into(),
        name: name.into(),
        input: serde_json::json!({}),
    };
    let seed = [Message::Assistant {
        content: vec![call("a", "get_weather"), call("b", "calculator"), call("c", "launch_rockets")],
    }];
    let turn = TurnId::generate();
    let mut drafts = seed_waiting(&seed, &plan, turn);
    let kinds: Vec<&str> = drafts.iter().map(Draft::kind).collect();
    assert_eq!(kinds, ["turn.started", "agent.custom_tool_use", "agent.tool_use", "agent.tool_use"]);
    let settled = seed_settled(&stored(&drafts), &plan);
    let kinds: Vec<&str> = settled.iter().map(Draft::kind).collect();
    assert_eq!(kinds, ["agent.tool_result", "session.status_idle"]);
    drafts.extend(settled);
    let state = fold(&drafts);
    let kinds: Vec<CallKind> = state.pending.values().map(|c| c.kind).collect();
    assert_eq!(kinds, [CallKind::Client, CallKind::Ask], "the unknown tool's call was denied, not left waiting");
    let answer = submission(vec![
        Input::Result { call: "a".into(), content: vec![Block::text("cold")], is_error: false, ran: None },
        Input::Permission { call: "b".into(), granted: true, reason: None, remember: false },
    ]);
    let next = TurnId::generate();
    let decision = decide(&state, &answer, None, next, ROOM).unwrap();
    assert_eq!(decision.start, Some(next));
    // A result larger than the limit is refused, naming its place in the input.
    let large = submission(vec![
        Input::Permission { call: "b".into(), granted: true, reason: None, remember: false },
        Input::Result { call: "a".into(), content: vec![Block::text("x".repeat(200))], is_error: false, ran: None },
    ]);
    let refused = decide(&state, &large, None, next, bytes(150)).unwrap_err();
    assert!(
        matches!(refused, SessionError::TooLarge(ref m) if m.starts_with("event 1 (user.custom_tool_result) is ")),
        "{refused}"
    );
    assert!(seed_waiting(&[Message::User { content: vec![] }], &plan, turn).is_empty());
    assert!(seed_settled(&[], &plan).is_empty());
}

#[test]
fn a_seed_call_the_mode_refuses_is_denied_saying_so() {
    let plan = ToolPlan {
        modes: [("write".to_string(), Mode::OutOfMode)].into(),
        mode: Some(("plan".to_string(), crate::agent::ModeConfig::default())),
        ..ToolPlan::default()
    };
    let call =
        crate::domain::Part::ToolUse { tool_call_id: "a".into(), name: "write".into(), input: serde_json::json!({}) };
    let drafts = seed_waiting(&[Message::Assistant { content: vec![call] }], &plan, TurnId::generate());
    let settled = seed_settled(&stored(&drafts), &plan);
    let denied: Vec<crate::domain::Event> = stored(&settled).iter().map(|raw| raw.decode().unwrap()).collect();
    let EventBody::AgentToolResult { content, is_error: true, .. } = &denied[0].body else { panic!("{denied:?}") };
    assert_eq!(
        Block::join_text(&content[..]),
        "Tool call denied: the session's mode (plan) does not allow \"write\": the user may change the mode"
    );
}

/// A session waiting for permissions on calls of one server tool, by these call ids.
fn waiting_for(ids: &[&str]) -> TurnState {
    let plan = ToolPlan { modes: [("calculator".to_string(), Mode::Inline)].into(), ..ToolPlan::default() };
    let call = |id: &&str| crate::domain::Part::ToolUse {
        tool_call_id: id.to_string(),
        name: "calculator".into(),
        input: serde_json::json!({}),
    };
    let mut drafts =
        seed_waiting(&[Message::Assistant { content: ids.iter().map(call).collect() }], &plan, TurnId::generate());
    drafts.extend(seed_settled(&stored(&drafts), &plan));
    fold(&drafts)
}

#[test]
fn every_event_of_a_resolution_is_held_to_the_limit_under_the_place_of_its_input() {
    let long = "a-call-id-much-longer-than-the-other-one-0123456789";
    let state = waiting_for(&["b", long]);
    let allow = |remember| Input::Permission { call: "b".into(), granted: true, reason: None, remember };
    // Remembered, the decision is copied to the other call, whose longer id makes the
    // copy the larger event: it is refused under the place of the decision it copies.
    let decision = decide(&state, &submission(vec![allow(true)]), None, TurnId::generate(), ROOM).unwrap();
    let confirmations: Vec<usize> =
        decision.drafts.iter().filter(|d| d.kind() == "user.tool_confirmation").map(Draft::len).collect();
    assert!(confirmations.len() == 2 && confirmations[1] > confirmations[0], "{confirmations:?}");
    let limit = bytes(confirmations[0]);
    let refused = decide(&state, &submission(vec![allow(true)]), None, TurnId::generate(), limit).unwrap_err();
    assert!(matches!(refused, SessionError::TooLarge(ref m) if m.starts_with("event 0 ")), "{refused}");
    // A denial's tool result repeats its reason: it is held to the limit too.
    let reason = Some("r".repeat(100));
    let deny = Input::Permission { call: "b".into(), granted: false, reason: reason.clone(), remember: false };
    let deny = Submission { inputs: vec![deny], ..Submission::default() };
    let decision = decide(&state, &deny, None, TurnId::generate(), ROOM).unwrap();
    let size = |kind| decision.drafts.iter().find(|d| d.kind() == kind).map(Draft::len).unwrap();
    let (confirmation, result) = (size("user.tool_confirmation"), size("agent.tool_result"));
    assert!(result > confirmation, "{result} > {confirmation}");
    let refused = decide(&state, &deny, None, TurnId::generate(), bytes(confirmation));
    assert!(matches!(refused, Err(SessionError::TooLarge(ref m)) if m.starts_with("event 0 (agent.tool_result)")));
}

#[test]
fn a_request_may_answer_every_waiting_call_even_past_the_events_per_request() {
    let state = waiting_for(&["c1", "c2", "c3"]);
    let allow = |call: &str| Input::Permission { call: call.into(), granted: true, reason: None, remember: false };
    let two = InputLimits { max_events_per_request: 2, ..ROOM };
    let all = submission(vec![allow("c1"), allow("c2"), allow("c3")]);
    assert!(decide(&state, &all, None, TurnId::generate(), two).unwrap().start.is_some());
    let more = submission(vec![allow("c1"), allow("c2"), allow("c3"), Input::Interrupt]);
    let refused = decide(&state, &more, None, TurnId::generate(), two).unwrap_err();
    assert!(matches!(refused, SessionError::Invalid(ref m) if m == "at most 2 events per request; this one has 4"));
    let idle = submission(vec![Input::Interrupt; 3]);
    assert!(decide(&TurnState::default(), &idle, None, TurnId::generate(), two).is_err());
}

/// A session as the index has it, live or not.
fn summary(archived: bool, deleted: bool) -> SessionSummary {
    let at = "2026-01-01T00:00:00.000000Z".to_string();
    SessionSummary {
        id: SessionId::generate(),
        spec: Default::default(),
        created_by: "t".into(),
        created_at: at.clone(),
        updated_at: at.clone(),
        deleted,
        archived_at: archived.then_some(at),
        ended: None,
    }
}

#[test]
fn a_turn_ends_with_its_stop_or_with_its_failure_then_idle() {
    let turn = TurnId::generate();
    let usage = Usage { input_tokens: 3, output_tokens: 4 };
    let waiting = vec![EventId(ulid::Ulid::from_parts(1, 1))];
    let stopped = Outcome { stop: Ok((StopReason::RequiresAction, waiting.clone())), usage };
    let drafts = end_turn(turn, &stopped);
    let events = stored(&drafts);
    assert_eq!(drafts.iter().map(Draft::kind).collect::<Vec<_>>(), ["session.status_idle"]);
    match events[0].decode().unwrap().body {
        EventBody::StatusIdle { stop_reason, usage: recorded, .. } => {
            assert_eq!(
                (stop_reason.kind, stop_reason.event_ids, recorded),
                (StopReason::RequiresAction, waiting, usage)
            );
        }
        other => panic!("{other:?}"),
    }
    let mut error = crate::agent::ModelError::new("model_overloaded_error", "busy");
    error.mcp_server = Some("fs".into());
    let failed = Outcome { stop: Err(error), usage };
    assert_eq!(failed.stop_reason(), StopReason::Error);
    let events = stored(&end_turn(turn, &failed));
    let bodies: Vec<EventBody> = events.iter().map(|e| e.decode().unwrap().body).collect();
    assert!(matches!(&bodies[0], EventBody::SessionError { code, mcp_server: Some(s), .. }
        if code == "model_overloaded_error" && s == "fs"));
    assert!(matches!(&bodies[1], EventBody::StatusIdle { stop_reason, usage: u, .. }
        if stop_reason.kind == StopReason::Error && stop_reason.event_ids.is_empty() && *u == usage));
    assert!(events.iter().all(|e| e.turn().map(|(t, _)| t) == Some(turn)), "both are the turn's");
}

#[test]
fn a_turn_nothing_runs_is_abandoned_with_the_reason() {
    let turn = TurnId::generate();
    let events = stored(&abandoned(turn, "the replay ended before this turn did"));
    let bodies: Vec<EventBody> = events.iter().map(|e| e.decode().unwrap().body).collect();
    assert!(matches!(&bodies[0], EventBody::SessionError { code, error, .. }
        if code == "interrupted" && error == "the replay ended before this turn did"));
    assert!(matches!(&bodies[1], EventBody::StatusIdle { stop_reason, .. } if stop_reason.kind == StopReason::Error));
}

#[test]
fn closing_ends_a_turn_nothing_here_runs_then_deletes_or_archives_once() {
    let session = SessionId::generate();
    let (live, idle) = (summary(false, false), TurnState::default());
    let delete = close(session, &live, &idle, Closing::Delete, false, 0).unwrap();
    assert_eq!(kinds(&delete), ["session.deleted", "terminated"]);
    assert_eq!(kinds(&close(session, &live, &idle, Closing::Archive, false, 0).unwrap()), ["session.archived"]);
    assert!(kinds(&close(session, &summary(true, false), &idle, Closing::Archive, false, 0).unwrap()).is_empty());
    let gone = close(session, &summary(false, true), &idle, Closing::Delete, false, 0).unwrap_err();
    assert!(matches!(gone, SessionError::NotFound(_)));
    // A turn the log shows running: ended first when nothing here runs it (a replay's, or
    // one another actor left), left to end itself when this actor's turn is it.
    let running = fold(
        &decide(&idle, &submission(vec![Input::Message(vec![Block::text("hi")])]), None, TurnId::generate(), ROOM)
            .unwrap()
            .drafts,
    );
    let orphan = close(session, &live, &running, Closing::Delete, false, 0).unwrap();
    assert_eq!(kinds(&orphan), ["session.error", "session.status_idle", "session.deleted", "terminated"]);
    let ours = close(session, &live, &running, Closing::Delete, true, 0).unwrap();
    assert_eq!(kinds(&ours), ["session.deleted", "terminated"]);
}

#[test]
fn an_idle_session_expires_once_its_timeout_has_passed_and_is_kept_for_a_delete() {
    let session = SessionId::generate();
    let (live, idle) = (summary(false, false), TurnState::default());
    let expire = Closing::Expire { idle_ms: 1_000 };
    assert!(kinds(&close(session, &live, &idle, expire, false, 999).unwrap()).is_empty(), "not yet");
    assert_eq!(kinds(&close(session, &live, &idle, expire, false, 1_000).unwrap()), ["terminated"]);
    assert!(kinds(&close(session, &live, &idle, expire, true, 5_000).unwrap()).is_empty(), "a turn runs here");
    assert!(kinds(&close(session, &summary(true, false), &idle, expire, false, 5_000).unwrap()).is_empty());
    // Calls that wait for the client are cancelled, and their turn ended, first.
    let waiting = waiting_for(&["a", "b"]);
    let ended = close(session, &live, &waiting, expire, false, 5_000).unwrap();
    assert_eq!(kinds(&ended), ["agent.tool_result", "agent.tool_result", "session.status_idle", "terminated"]);
    // Once ended: no input, nothing more to close, and a delete is the delete alone.
    let mut gone = live.clone();
    gone.ended = Some(crate::projection::sessions::Ended { at: "t".into(), reason: IDLE_TIMEOUT.into() });
    let refused = admit(session, &gone, &submission(vec![Input::Message(vec![Block::text("hi")])]), false);
    assert!(matches!(refused, Err(SessionError::Conflict(why)) if why.contains("has ended (idle timeout")));
    assert!(kinds(&close(session, &gone, &idle, expire, false, 5_000).unwrap()).is_empty());
    assert!(kinds(&close(session, &gone, &idle, Closing::Archive, false, 0).unwrap()).is_empty());
    assert_eq!(kinds(&close(session, &gone, &idle, Closing::Delete, false, 0).unwrap()), ["session.deleted"]);
}

#[test]
fn a_closed_or_replayed_session_takes_only_what_it_may() {
    let session = SessionId::generate();
    let message = submission(vec![Input::Message(vec![Block::text("hi")])]);
    let cancel = submission(vec![Input::Cancel]);
    assert!(admit(session, &summary(false, false), &message, false).is_ok());
    let archived = summary(true, false);
    assert!(
        matches!(admit(session, &archived, &message, false), Err(SessionError::Conflict(m)) if m.contains("archived"))
    );
    assert!(admit(session, &archived, &cancel, false).is_ok(), "a cancel has nothing to do, and is answered");
    assert!(matches!(admit(session, &summary(false, true), &cancel, false), Err(SessionError::NotFound(_))));
    assert!(
        matches!(admit(session, &summary(false, false), &cancel, true), Err(SessionError::Conflict(m)) if m.contains("replaying"))
    );
}

#[test]
fn a_models_calls_are_recorded_as_the_plan_handles_each_tool_and_the_denied_answered() {
    let plan = ToolPlan {
        modes: [
            ("calculator".to_string(), Mode::Inline),
            ("fetch_url".to_string(), Mode::Ask),
            ("get_weather".to_string(), Mode::Client),
            ("rm".to_string(), Mode::Rejected),
            ("write".to_string(), Mode::OutOfMode),
        ]
        .into(),
        mode: Some(("plan".to_string(), crate::agent::ModeConfig::default())),
        ..ToolPlan::default()
    };
    let call = |id: &str, name: &str| (id.to_string(), name.to_string(), serde_json::json!({}));
    let names = ["calculator", "fetch_url", "get_weather", "rm", "launch_rockets", "write"];
    let (bodies, calls) = plan_calls(&plan, names.iter().enumerate().map(|(i, n)| call(&format!("c{i}"), n)).collect());
    let permission = |body: &EventBody| match body {
        EventBody::AgentToolUse { evaluated_permission, .. } => Some(*evaluated_permission),
        EventBody::AgentCustomToolUse { .. } => None,
        other => panic!("{other:?}"),
    };
    use crate::domain::event::Permission;
    assert_eq!(
        bodies.iter().map(permission).collect::<Vec<_>>(),
        [
            Some(Permission::Allow),
            Some(Permission::Ask),
            None,
            Some(Permission::Deny),
            Some(Permission::Deny),
            Some(Permission::Deny)
        ]
    );
    assert!(matches!(bodies[2], EventBody::AgentCustomToolUse { ask: false, .. }), "{:?}", bodies[2]);
    // A client tool the session's mode asks for: the call says so, for the client to ask.
    let asking = ToolPlan { modes: [("lookup".to_string(), Mode::ClientAsks)].into(), ..ToolPlan::default() };
    let (asked, _) = plan_calls(&asking, vec![call("c9", "lookup")]);
    assert!(matches!(&asked[..], [EventBody::AgentCustomToolUse { ask: true, .. }]), "{asked:?}");
    let modes: Vec<Option<Mode>> = calls.iter().map(|c| c.mode).collect();
    assert_eq!(
        modes,
        [Some(Mode::Inline), Some(Mode::Ask), Some(Mode::Client), Some(Mode::Rejected), None, Some(Mode::OutOfMode)]
    );
    let ids: Vec<EventId> = (0..6).map(|i| EventId(ulid::Ulid::from_parts(2, i))).collect();
    let denied = denials(&plan, ids.iter().copied().zip(&calls));
    let texts: Vec<(EventId, String)> = denied
        .iter()
        .map(|body| match body {
            EventBody::AgentToolResult { tool_use_id, content, is_error: true, .. } => {
                (*tool_use_id, Block::join_text(content))
            }
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(
        texts,
        [
            (ids[3], "Tool call denied: the user rejects this tool for this session".to_string()),
            (ids[4], "Tool call denied: no tool named \"launch_rockets\" is available".to_string()),
            (
                ids[5],
                "Tool call denied: the session's mode (plan) does not allow \"write\": the user may change the mode"
                    .to_string()
            ),
        ]
    );
}

#[test]
fn after_a_response_the_turn_stops_or_asks_the_model_again() {
    let waiting = vec![EventId(ulid::Ulid::from_parts(3, 1))];
    assert_eq!(after_response(ModelStop::ToolUse, true, waiting.clone()), Some((StopReason::RequiresAction, waiting)));
    assert_eq!(after_response(ModelStop::ToolUse, true, vec![]), None, "every call answered: the model again");
    assert_eq!(after_response(ModelStop::ToolUse, false, vec![]), Some((StopReason::EndTurn, vec![])));
    assert_eq!(after_response(ModelStop::EndTurn, true, vec![]), Some((StopReason::EndTurn, vec![])));
    assert_eq!(after_response(ModelStop::MaxTokens, false, vec![]), Some((StopReason::MaxTokens, vec![])));
    assert_eq!(after_response(ModelStop::Refusal, false, vec![]), Some((StopReason::Refusal, vec![])));
}

mod resuming;

#[test]
fn a_compaction_starts_a_turn_of_its_own_on_an_idle_session_and_is_asked_for_alone() {
    let turn = TurnId::generate();
    let decision = decide(&TurnState::default(), &submission(vec![Input::Compact]), None, turn, ROOM).unwrap();
    let kinds: Vec<&str> = decision.drafts.iter().map(Draft::kind).collect();
    assert_eq!(kinds, ["turn.started", "user.compact", "session.status_running"]);
    assert_eq!(decision.start, Some(turn));
    let state = fold(&decision.drafts);
    assert!(state.compacting, "the turn started compacts");

    let busy = decide(&state, &submission(vec![Input::Compact]), None, TurnId::generate(), ROOM).unwrap_err();
    assert!(matches!(busy, SessionError::Busy(_)), "{busy}");
    let mixed = submission(vec![Input::Compact, Input::Message(vec![Block::text("hi")])]);
    let refused = decide(&TurnState::default(), &mixed, None, TurnId::generate(), ROOM).unwrap_err();
    assert_eq!(refused.to_string(), "a compaction is asked for alone, with no other input");
}
