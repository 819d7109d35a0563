use serde_json::Value;

use crate::helpers::{spawn_app, texts};

#[tokio::test]
async fn health_and_metrics_are_served() {
    let app = spawn_app().await;
    let health: Value = app.get("/healthz").send().await.unwrap().json().await.unwrap();
    assert_eq!(health["status"], "ok");
    assert_eq!(health["durability"], "synced_on_ack", "sled syncs its write-ahead log before each answer: {health}");
    let session = app.create_session().await;
    app.post_outcomes(&session, &texts("m", 3)).await;
    let text = app.get("/metrics").send().await.unwrap().text().await.unwrap();
    for name in [
        "turnlog_events_appended_total",
        "turnlog_writer_batch_events_bucket",
        "turnlog_writer_fsync_seconds_bucket",
        "turnlog_streams_open",
        "turnlog_stream_events_replayed_total",
        "turnlog_stream_events_live_total",
        "turnlog_stream_lagged_total",
        "turnlog_http_requests_total",
    ] {
        assert!(text.contains(name), "{name} is exported");
    }
    assert_eq!(app.metric("turnlog_events_appended_total").await, 4.0);
    assert!(text.contains("route=\"/sessions/{session_id}/events\""), "routes are templates");
    assert!(!text.contains(&session), "no session id in a label");
}

#[tokio::test]
async fn a_graceful_stop_flushes_and_the_log_reopens_clean() {
    let mut app = spawn_app().await;
    let session = app.create_session().await;
    let stored = app.post_outcomes(&session, &texts("m", 5)).await;
    let status = app.terminate().await;
    assert!(status.success(), "{status:?}");
    app.restart().await;
    let all = app.all_events(&session).await;
    assert_eq!(&all[1..], &stored[..]);
}

/// Waits until the session's log holds an event of this type.
async fn wait_for(app: &crate::helpers::TestApp, session: &str, kind: &str) {
    for _ in 0..400 {
        if app.all_events(session).await.iter().any(|e| e["type"] == kind) {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    panic!("no {kind} in the log of {session}");
}

fn texts_of(events: &[Value], kind: &str) -> Vec<String> {
    let of_kind = events.iter().filter(|e| e["type"] == kind);
    of_kind.map(|e| e["content"][0]["text"].as_str().unwrap().to_string()).collect()
}

#[tokio::test]
async fn a_sigterm_lets_a_running_turn_finish_within_its_grace() {
    let mut app = spawn_app().await;
    let session = app.create_session().await;
    let turn = serde_json::json!({"type": "user.message", "content": "/delay 20\n/words 40"});
    assert_eq!(app.post_event(&session, turn).await.status(), 200);
    wait_for(&app, &session, "agent.message.delta").await;
    let status = app.terminate().await;
    assert!(status.success(), "{status:?}");
    app.restart().await;
    let events = app.all_events(&session).await;
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(kinds.last(), Some(&"session.status_idle"), "the turn ended before the exit: {kinds:?}");
    assert_eq!(events.last().unwrap()["stop_reason"]["type"], "end_turn");
    assert_eq!(texts_of(&events, "agent.message").last().unwrap().split(' ').count(), 40, "the whole reply");
    assert!(!kinds.contains(&"turn.resumed") && !kinds.contains(&"session.error"), "{kinds:?}");
    // A new turn is refused while the stop runs, not lost: the session takes input again.
    let next = serde_json::json!({"type": "user.message", "content": "again"});
    assert_eq!(app.post_event(&session, next).await.status(), 200);
}

#[tokio::test]
async fn a_sigterm_past_its_grace_leaves_the_turn_to_be_resumed_at_the_next_start() {
    let mut app = crate::helpers::spawn_with("[shutdown]\ngrace_ms = 300\n").await;
    let session = app.create_session().await;
    let slow = serde_json::json!({"type": "user.message", "content": "/delay 50\n/words 100"});
    assert_eq!(app.post_event(&session, slow).await.status(), 200);
    wait_for(&app, &session, "agent.message.delta").await;
    let status = app.terminate().await;
    assert!(status.success(), "{status:?}");
    app.restart().await;
    let mut events = app.all_events(&session).await;
    for _ in 0..400 {
        if events.last().is_some_and(|e| e["type"] == "session.status_idle") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        events = app.all_events(&session).await;
    }
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    let resumed = kinds.iter().position(|k| *k == "turn.resumed").expect("resumed at the start");
    assert!(!kinds[..resumed].contains(&"session.status_idle"), "the stop recorded no end: {kinds:?}");
    assert!(!kinds.contains(&"session.error"), "nothing closed as interrupted: {kinds:?}");
    assert_eq!(events.last().unwrap()["stop_reason"]["type"], "end_turn", "{kinds:?}");
    let said = texts_of(&events, "agent.message");
    assert_eq!(said.len(), 1, "one whole message: {said:?}");
    assert!(said[0].starts_with("w1 ") && said[0].ends_with(" w100"), "{said:?}");
}
