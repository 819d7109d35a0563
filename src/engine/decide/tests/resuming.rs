//! Resuming a turn whose process stopped: how each state a turn can be left in goes on.

use serde_json::json;

use super::*;
use crate::domain::event::{Permission, Usage};
use crate::projection::progress::TurnProgress;

/// A turn's events as a stopped process left them, folded as a resume reads them.
fn left(turn: TurnId, bodies: &[EventBody]) -> (TurnProgress, TurnState, Vec<RawEvent>) {
    let mut drafts = vec![Draft::new(Some(turn), &EventBody::TurnStarted {})];
    drafts.push(Draft::new(Some(turn), &EventBody::UserMessage { content: vec![Block::text("hi")] }));
    drafts.push(Draft::new(Some(turn), &running()));
    drafts.extend(bodies.iter().map(|body| Draft::new(Some(turn), body)));
    let events = stored(&drafts);
    let (mut progress, mut state) = (TurnProgress::new(turn), TurnState::default());
    for raw in &events {
        let event = raw.decode().unwrap();
        progress.apply(&event);
        state.apply(&event);
    }
    (progress, state, events)
}

fn start(span: &str) -> EventBody {
    EventBody::ModelRequestStart { model: "scripted".into(), span_id: span.into(), input_tokens: Some(40) }
}

fn end(span: &str, stop: ModelStop) -> EventBody {
    EventBody::ModelRequestEnd {
        span_id: span.into(),
        model: "scripted".into(),
        usage: Usage { input_tokens: 10, output_tokens: 5 },
        is_error: false,
        model_request_start_id: None,
        stop_reason: Some(stop),
        context_window: None,
        usage_estimated: false,
    }
}

fn tool_use(name: &str, permission: Permission, idempotent: bool) -> EventBody {
    EventBody::AgentToolUse {
        tool_call_id: format!("call_{name}"),
        name: name.into(),
        input: serde_json::json!({}),
        evaluated_permission: permission,
        mcp: None,
        idempotent,
    }
}

fn go(resume: Resume) -> (Vec<Draft>, ResumePoint) {
    match resume {
        Resume::Go(drafts, point) => (drafts, point),
        Resume::Close(drafts) => panic!("closed: {:?}", drafts.iter().map(Draft::kind).collect::<Vec<_>>()),
    }
}

fn resumed(drafts: &[Draft]) -> EventBody {
    let event = stored(drafts).into_iter().find(|raw| raw.kind() == "turn.resumed").expect("a turn.resumed");
    event.decode().unwrap().body
}

#[test]
fn a_request_in_flight_is_made_again_and_what_it_streamed_is_discarded() {
    let turn = TurnId::generate();
    let deltas = [
        start("span_1"),
        EventBody::AgentThinkingDelta { message_id: "msg_t".into(), delta: "hm".into() },
        EventBody::AgentMessageDelta { message_id: "msg_a".into(), delta: "w1 w2".into() },
    ];
    let (progress, state, _) = left(turn, &deltas);
    let (drafts, point) = go(resume(turn, &progress, &state, 3));
    let kinds: Vec<&str> = drafts.iter().map(Draft::kind).collect();
    assert_eq!(kinds, ["turn.resumed", "span.model_request_end", "session.status_running"]);
    assert!(drafts.iter().all(|d| d.turn == Some(turn)), "the same turn goes on");
    let EventBody::TurnResumed { attempt, discarded, rerun, interrupted, .. } = resumed(&drafts) else {
        unreachable!()
    };
    assert_eq!((attempt, discarded), (1, vec!["msg_t".to_string(), "msg_a".to_string()]));
    assert!(rerun.is_empty() && interrupted.is_empty());
    assert_eq!((point.next, point.rerun), (Next::Model, vec![]));
    assert_eq!(point.requests, 0, "the cut request is made again: it counts once");
    // The cut request is counted as estimated: its input as its start said, its output
    // from the 7 bytes it streamed.
    let cut = Usage { input_tokens: 40, output_tokens: 2 };
    assert_eq!(point.usage, cut);
    let end = stored(&drafts).into_iter().find(|e| e.kind() == "span.model_request_end").unwrap();
    let EventBody::ModelRequestEnd { usage, usage_estimated, is_error, .. } = end.decode().unwrap().body else {
        unreachable!()
    };
    assert_eq!((usage, usage_estimated, is_error), (cut, true, true));
}

#[test]
fn a_call_that_may_run_twice_runs_again_and_one_that_may_not_is_answered_as_interrupted() {
    let turn = TurnId::generate();
    let response = [
        start("span_1"),
        tool_use("calculator", Permission::Allow, true),
        tool_use("deploy", Permission::Allow, false),
        end("span_1", ModelStop::ToolUse),
    ];
    let (progress, state, events) = left(turn, &response);
    let ids: Vec<EventId> = events.iter().filter(|e| e.kind() == "agent.tool_use").map(|e| e.id).collect();
    let (drafts, point) = go(resume(turn, &progress, &state, 3));
    let kinds: Vec<&str> = drafts.iter().map(Draft::kind).collect();
    assert_eq!(kinds, ["turn.resumed", "session.status_running", "agent.tool_result"]);
    let EventBody::TurnResumed { rerun, interrupted, discarded, .. } = resumed(&drafts) else { unreachable!() };
    assert_eq!((rerun, interrupted, discarded), (vec![ids[0]], vec![ids[1]], vec![]));
    let answer = stored(&drafts).pop().unwrap().decode().unwrap().body;
    let EventBody::AgentToolResult { tool_use_id, is_error, content, .. } = answer else { unreachable!() };
    assert_eq!((tool_use_id, is_error, Block::join_text(&content)), (ids[1], true, INTERRUPTED.to_string()));
    assert_eq!(point.rerun.iter().map(|c| c.event_id).collect::<Vec<_>>(), vec![ids[0]]);
    assert_eq!(point.next, Next::Model, "every call has its answer after the rerun: the model goes on");
    assert_eq!(point.usage, Usage { input_tokens: 10, output_tokens: 5 });
}

#[test]
fn a_whole_response_whose_end_was_not_recorded_ends_the_turn_without_asking_again() {
    let turn = TurnId::generate();
    let said = EventBody::AgentMessage { message_id: "msg_a".into(), content: vec![Block::text("done")] };
    let deltas = EventBody::AgentMessageDelta { message_id: "msg_a".into(), delta: "done".into() };
    let (progress, state, _) = left(turn, &[start("span_1"), deltas, said, end("span_1", ModelStop::EndTurn)]);
    let (drafts, point) = go(resume(turn, &progress, &state, 3));
    let EventBody::TurnResumed { discarded, .. } = resumed(&drafts) else { unreachable!() };
    assert!(discarded.is_empty(), "a whole message is kept");
    assert_eq!(point.next, Next::Stop(StopReason::EndTurn, vec![]));
}

#[test]
fn calls_that_wait_for_the_client_keep_waiting() {
    let turn = TurnId::generate();
    let custom = EventBody::AgentCustomToolUse {
        tool_call_id: "c1".into(),
        name: "get_weather".into(),
        input: json!({}),
        ask: false,
        editor: false,
    };
    let ask = tool_use("fetch_url", Permission::Ask, true);
    let (progress, state, events) = left(turn, &[start("span_1"), custom, ask, end("span_1", ModelStop::ToolUse)]);
    let waiting: Vec<EventId> = events.iter().filter(|e| e.kind().contains("tool_use")).map(|e| e.id).collect();
    let (drafts, point) = go(resume(turn, &progress, &state, 3));
    assert_eq!(drafts.iter().map(Draft::kind).collect::<Vec<_>>(), ["turn.resumed", "session.status_running"]);
    assert_eq!(point.next, Next::Stop(StopReason::RequiresAction, waiting));
}

#[test]
fn a_granted_call_that_had_started_is_answered_as_interrupted_unless_it_may_run_twice() {
    let turn = TurnId::generate();
    let (progress, mut state, events) = left(turn, &[]);
    let event_id = events[0].id;
    for idempotent in [false, true] {
        state.granted = vec![crate::projection::turns::PendingCall {
            event_id,
            tool_call_id: "c1".into(),
            name: "mcp__write".into(),
            input: json!({}),
            kind: CallKind::Ask,
            mcp: None,
            idempotent,
        }];
        let (drafts, point) = go(resume(turn, &progress, &state, 3));
        let EventBody::TurnResumed { rerun, interrupted, .. } = resumed(&drafts) else { unreachable!() };
        assert_eq!((rerun.len(), interrupted.len()), (usize::from(idempotent), usize::from(!idempotent)));
        assert_eq!(point.rerun.len(), usize::from(idempotent));
        assert_eq!(point.next, Next::Model);
    }
}

#[test]
fn a_turn_the_user_interrupted_before_the_process_stopped_ends_cancelled() {
    let turn = TurnId::generate();
    let left_so = [start("span_1"), tool_use("calculator", Permission::Allow, true), EventBody::UserInterrupt {}];
    let (progress, state, _) = left(turn, &left_so);
    let Resume::Close(drafts) = resume(turn, &progress, &state, 3) else { panic!("resumed against the user's stop") };
    let kinds: Vec<&str> = drafts.iter().map(Draft::kind).collect();
    assert_eq!(kinds, ["span.model_request_end", "agent.tool_result", "session.status_idle"]);
    let bodies: Vec<EventBody> = stored(&drafts).iter().map(|raw| raw.decode().unwrap().body).collect();
    assert!(matches!(&bodies[1], EventBody::AgentToolResult { content, is_error: true, .. }
        if Block::join_text(content) == "Tool call cancelled"));
    assert!(
        matches!(&bodies[2], EventBody::StatusIdle { stop_reason, .. } if stop_reason.kind == StopReason::Cancelled)
    );
}

#[test]
fn calls_left_waiting_before_any_request_keep_waiting() {
    let turn = TurnId::generate();
    let custom = EventBody::AgentCustomToolUse {
        tool_call_id: "c1".into(),
        name: "get_weather".into(),
        input: json!({}),
        ask: false,
        editor: false,
    };
    let (progress, state, events) = left(turn, &[custom]);
    let call = events.iter().find(|e| e.kind() == "agent.custom_tool_use").unwrap().id;
    let (_, point) = go(resume(turn, &progress, &state, 3));
    assert_eq!(point.next, Next::Stop(StopReason::RequiresAction, vec![call]), "the model is not asked");
}

#[test]
fn a_turn_resumed_max_resumes_times_is_closed_saying_why() {
    let turn = TurnId::generate();
    let again = |attempt| EventBody::TurnResumed {
        attempt,
        reason: "stopped".into(),
        discarded: vec![],
        rerun: vec![],
        interrupted: vec![],
    };
    let (progress, state, _) = left(turn, &[again(1), again(2), start("span_9")]);
    assert_eq!(progress.resumes, 2);
    let (drafts, _) = go(resume(turn, &progress, &state, 3));
    let EventBody::TurnResumed { attempt, .. } = resumed(&drafts) else { unreachable!() };
    assert_eq!(attempt, 3);
    let (progress, state, _) = left(turn, &[again(1), again(2), again(3), start("span_9")]);
    let Resume::Close(drafts) = resume(turn, &progress, &state, 3) else { panic!("resumed a fourth time") };
    let kinds: Vec<&str> = drafts.iter().map(Draft::kind).collect();
    assert_eq!(kinds, ["span.model_request_end", "session.error", "session.status_idle"]);
    let error = stored(&drafts)[1].decode().unwrap().body;
    let EventBody::SessionError { code, error, .. } = error else { unreachable!() };
    assert_eq!(code, RETRIES_EXHAUSTED);
    assert!(error.contains("3 times") && error.contains("turns.max_resumes"), "{error}");
    let idle = fold(&drafts);
    assert_eq!(idle.phase, crate::projection::turns::Phase::Idle);
}
