//! Durable turns, against the real binary: a turn whose process is SIGKILLed (or stopped
//! past its grace) goes on from its log when the server starts again, and a client that
//! reconnects with `Last-Event-ID` sees one continuous turn.

use std::collections::HashSet;
use std::time::Duration;

use futures_util::StreamExt;
use serde_json::{json, Value};

use crate::helpers::{spawn_app, spawn_with, sse, Sse, TestApp};

/// Reads the native stream until `done` holds for a frame (which is kept), failing after
/// `secs` without one.
async fn read_until(
    stream: &mut (impl futures_util::Stream<Item = Sse> + Unpin),
    frames: &mut Vec<Sse>,
    secs: u64,
    done: impl Fn(&Sse, &[Sse]) -> bool,
) {
    loop {
        let next = tokio::time::timeout(Duration::from_secs(secs), stream.next()).await;
        let frame = next.unwrap_or_else(|_| panic!("no frame in {secs} s after {} frames", frames.len()));
        let Some(frame) = frame else { panic!("the stream ended after {} frames", frames.len()) };
        frames.push(frame);
        if done(frames.last().unwrap(), frames) {
            return;
        }
    }
}

fn words(n: usize) -> String {
    (1..=n).map(|i| format!("w{i}")).collect::<Vec<_>>().join(" ")
}

/// The session's events once its last turn has ended (polled).
async fn after_the_turn(app: &TestApp, session: &str) -> Vec<Value> {
    for _ in 0..600 {
        let events = app.all_events(session).await;
        if events.last().is_some_and(|e| e["type"] == "session.status_idle") {
            return events;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the turn did not end: {:?}", kinds(&app.all_events(session).await));
}

fn kinds(events: &[Value]) -> Vec<&str> {
    events.iter().map(|e| e["type"].as_str().unwrap()).collect()
}

fn of_type<'a>(events: &'a [Value], kind: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["type"] == kind).collect()
}

#[tokio::test]
async fn a_reply_cut_by_sigkill_goes_on_after_a_restart_as_one_continuous_turn() {
    let mut app = spawn_app().await;
    let session = app.create_session().await;
    let mut stream = sse(app.stream(&session, None, None).await);
    let slow = json!({"type": "user.message", "content": "/delay 40\n/words 60"});
    assert_eq!(app.post_event(&session, slow).await.status(), 200);
    let mut seen = Vec::new();
    // A few deltas of the reply have reached the subscriber: the server dies mid-sentence.
    read_until(&mut stream, &mut seen, 20, |_, frames| {
        frames.iter().filter(|f| f.event == "agent.message.delta").count() >= 3
    })
    .await;
    app.kill().await;
    drop(stream);
    let cut: String =
        seen.iter().filter(|f| f.event == "agent.message.delta").map(|f| f.data["delta"].as_str().unwrap()).collect();
    assert!(cut.starts_with("w1") && !cut.contains("w60"), "cut mid-reply: {cut:?}");
    let cut_message = seen.iter().find(|f| f.event == "agent.message.delta").unwrap().data["message_id"].clone();

    app.restart().await;
    let last = seen.last().unwrap().id.clone();
    let mut stream = sse(app.stream(&session, None, Some(&last)).await);
    read_until(&mut stream, &mut seen, 30, |frame, _| frame.event == "session.status_idle").await;

    // Every event once, in the log's order: what came before the crash, then the rest.
    let log = after_the_turn(&app, &session).await;
    let ids: Vec<&str> = seen.iter().map(|f| f.id.as_str()).collect();
    assert_eq!(ids.iter().collect::<HashSet<_>>().len(), ids.len(), "no event twice");
    let logged: Vec<&str> = log.iter().map(|e| e["id"].as_str().unwrap()).collect();
    assert_eq!(ids, logged, "the subscriber saw the whole log, in order");

    let turn = &log[1]["turn_id"];
    assert!(log[1..].iter().all(|e| &e["turn_id"] == turn), "one turn: {:?}", kinds(&log));
    let [resumed] = of_type(&log, "turn.resumed")[..] else { panic!("one resume: {:?}", kinds(&log)) };
    assert_eq!(resumed["attempt"], 1);
    assert_eq!(resumed["discarded"], json!([cut_message]), "the cut reply's deltas are retracted");
    let messages = of_type(&log, "agent.message");
    assert_eq!(messages.len(), 1, "one final message, no half one");
    assert_eq!(messages[0]["content"][0]["text"], words(60), "the scripted model's whole reply");
    assert_ne!(messages[0]["message_id"], cut_message, "the new attempt is a new message");
    let idle = log.last().unwrap();
    assert_eq!(idle["stop_reason"]["type"], "end_turn");
    assert!(of_type(&log, "session.error").is_empty(), "nothing closed as interrupted");
    assert_eq!(of_type(&log, "session.status_idle").len(), 1, "the turn ends once");
    assert_eq!(app.metric("turnlog_turns_resumed_total").await, 1.0);

    // The hash chain goes on through the resume.
    let audit: Value =
        app.get(&format!("/sessions/{session}/audit?verify=true")).send().await.unwrap().json().await.unwrap();
    assert_eq!(audit["verified"], true, "{audit}");
    assert_eq!(audit["sequence_number"], log.len() as u64, "{audit}");

    // The AAP history holds the whole reply once, and nothing of the cut one.
    let history: Value =
        app.get(&format!("/sessions/{session}/history?type=full")).send().await.unwrap().json().await.unwrap();
    let messages = history["history"]["full"].as_array().unwrap_or_else(|| panic!("{history}"));
    let said: Vec<&Value> = messages.iter().filter(|m| m["role"] == "assistant").collect();
    assert_eq!(said.len(), 1, "{history}");
    assert_eq!(said[0]["content"], words(60), "{history}");
}

#[tokio::test]
async fn a_turn_that_crashes_the_server_each_time_is_closed_after_max_resumes() {
    let mut app = spawn_with("[turns]\nmax_resumes = 2\n").await;
    let session = app.create_session().await;
    let crash = json!({"type": "user.message", "content": "/words 3\n/crash"});
    assert_eq!(app.post_event(&session, crash).await.status(), 200);
    let mut starts = 1;
    // The first run and each resume crash; the start after the last resume closes the turn.
    'lives: loop {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while app.exited().is_none() {
            let events: Vec<Value> = app.api().all_events(&session, 1000).await.unwrap_or_default();
            if events.last().is_some_and(|e| e["type"] == "session.status_idle") {
                break 'lives;
            }
            assert!(std::time::Instant::now() < deadline, "start {starts} neither crashed nor closed the turn");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        starts += 1;
        assert!(starts <= 4, "still crashing after {starts} starts: {}", app.log());
        // A start may crash before it says it listens (the resume runs beside the start):
        // then it has exited, and the next round starts it again.
        let _ = app.try_restart().await;
    }
    assert_eq!(starts, 4, "the first run and two resumes crashed");
    let log = after_the_turn(&app, &session).await;
    let attempts: Vec<&Value> = of_type(&log, "turn.resumed").iter().map(|e| &e["attempt"]).collect();
    assert_eq!(attempts, [&json!(1), &json!(2)], "resumed max_resumes times: {:?}", kinds(&log));
    let [error] = of_type(&log, "session.error")[..] else { panic!("one error: {:?}", kinds(&log)) };
    assert_eq!(error["code"], "retries_exhausted");
    assert!(error["error"].as_str().unwrap().contains("turns.max_resumes"), "{error}");
    assert_eq!(log.last().unwrap()["stop_reason"]["type"], "error");
    assert!(app.exit_within(1).await.is_none(), "the server stays up");
    let again = json!({"type": "user.message", "content": "still here"});
    assert_eq!(app.post_event(&session, again).await.status(), 200);
    let log = after_the_turn(&app, &session).await;
    assert_eq!(of_type(&log, "agent.message").last().unwrap()["content"][0]["text"], "echo: still here");
}
