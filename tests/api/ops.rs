use serde_json::Value;

use crate::helpers::{spawn_app, texts};

#[tokio::test]
async fn health_and_metrics_are_served() {
    let app = spawn_app().await;
    let health: Value = app.get("/healthz").send().await.unwrap().json().await.unwrap();
    assert_eq!(health["status"], "ok");
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

#[tokio::test]
async fn a_sigterm_during_a_slow_turn_records_its_end_before_the_process_exits() {
    let mut app = spawn_app().await;
    let session = app.create_session().await;
    let slow = serde_json::json!({"type": "user.message", "content": "/delay 100\n/words 1000"});
    assert_eq!(app.post_event(&session, slow).await.status(), 200);
    // Wait until the turn is streaming: its first delta is in the log.
    for _ in 0..400 {
        if app.all_events(&session).await.iter().any(|e| e["type"] == "agent.message.delta") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    let status = app.terminate().await;
    assert!(status.success(), "{status:?}");

    // Whatever the next start writes, it writes after what the stopped process left.
    app.restart().await;
    let events = app.all_events(&session).await;
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert!(kinds.contains(&"agent.message.delta"), "the turn was running: {kinds:?}");
    let last = events.last().unwrap();
    assert_eq!(last["type"], "session.status_idle", "{kinds:?}");
    assert_eq!(last["stop_reason"]["type"], "cancelled");
    assert_eq!(last["turn_id"], events[1]["turn_id"], "it is the slow turn's end");
    assert!(!kinds.contains(&"session.error"), "the next start closed nothing as interrupted: {kinds:?}");
    let said: String = events
        .iter()
        .filter(|e| e["type"] == "agent.message")
        .map(|e| e["content"][0]["text"].as_str().unwrap())
        .collect();
    assert!(said.starts_with("w1") && !said.contains("w1000"), "what was said before the stop is kept: {said:?}");

    // The session goes on.
    let next = serde_json::json!({"type": "user.message", "content": "again"});
    assert_eq!(app.post_event(&session, next).await.status(), 200);
}
