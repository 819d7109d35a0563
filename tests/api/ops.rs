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
