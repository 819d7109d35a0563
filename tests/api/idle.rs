//! Sessions that time out, on the real binary: an agent's sessions end after a second with
//! nothing happening (calls that wait are cancelled first), every stream sends `terminated`
//! and closes, new input is refused, the session stays readable and may be deleted, also
//! after a restart; sessions of an agent with no timeout go on.

use futures_util::StreamExt;
use serde_json::{json, Value};

use crate::helpers::{get_json, post_json, spawn_with, sse, TestApp};

const CONFIG: &str = r#"
[agents.brief]
model = { provider = "scripted" }
tools = { calculator = "ask" }
idle_timeout_secs = 1
"#;

async fn session(app: &TestApp, agent: &str, tools: Value) -> String {
    let (status, created) = post_json(app, "/sessions", json!({"agent": {"name": agent, "tools": tools}})).await;
    assert_eq!(status, 201, "{created}");
    created["sessionId"].as_str().unwrap().to_string()
}

/// Every frame of the native stream from the start, until the stream ends (within 20 s).
async fn until_closed(app: &TestApp, session: &str) -> Vec<Value> {
    let frames = sse(app.stream(session, None, None).await).map(|frame| frame.data).collect::<Vec<_>>();
    tokio::time::timeout(std::time::Duration::from_secs(20), frames).await.expect("the stream closed")
}

#[tokio::test]
async fn an_idle_session_ends_with_terminated_and_is_kept_readable_until_deleted() {
    let mut app = spawn_with(CONFIG).await;
    let waiting = session(&app, "brief", json!([{"name": "calculator"}])).await;
    let body = json!({"stream": "none", "messages": [{"role": "user", "content": "/tool calculator {\"expression\": \"1\"}"}]});
    let (status, answer) = post_json(&app, &format!("/sessions/{waiting}/turns"), body).await;
    assert_eq!((status, answer["stopReason"].as_str()), (200, Some("tool_use")), "{answer}");
    let quiet = session(&app, "brief", json!([])).await;
    let forever = session(&app, "default", json!([])).await;

    // The streams end by themselves, with `terminated` last.
    let ended = until_closed(&app, &waiting).await;
    let kinds: Vec<&str> = ended.iter().map(|e| e["type"].as_str().unwrap()).collect();
    let tail = &kinds[kinds.len() - 3..];
    assert_eq!(tail, ["agent.tool_result", "session.status_idle", "terminated"], "{kinds:?}");
    assert_eq!(ended[ended.len() - 3]["content"][0]["text"], "Tool call cancelled");
    assert_eq!(ended[ended.len() - 2]["stop_reason"]["type"], "cancel");
    assert_eq!(ended.last().unwrap()["reason"], "idle timeout");
    let quiet_log = until_closed(&app, &quiet).await;
    assert_eq!(
        quiet_log.iter().map(|e| e["type"].as_str().unwrap()).collect::<Vec<_>>(),
        ["session.created", "terminated"]
    );
    // The managed-agents view sees it terminated, and says so on its stream too.
    let (_, managed) = get_json(&app, &format!("/v1/sessions/{quiet}")).await;
    assert_eq!(managed["status"], "terminated", "{managed}");

    // New input is refused, in each view's words, and nothing is stored.
    let refused = app.post_event(&quiet, json!({"type": "user.message", "content": "hello?"})).await;
    assert_eq!(refused.status(), 409);
    assert!(refused.text().await.unwrap().contains("has ended (idle timeout"));
    let body = json!({"messages": [{"role": "user", "content": "hello?"}]});
    assert_eq!(post_json(&app, &format!("/sessions/{quiet}/turns"), body).await.0, 409);
    assert_eq!(app.all_events(&quiet).await.len(), 2);
    // Still readable.
    assert_eq!(get_json(&app, &format!("/sessions/{quiet}")).await.0, 200);

    // A session of an agent with no timeout goes on, older than the others' timeout.
    assert!(!app.all_events(&forever).await.iter().any(|e| e["type"] == "terminated"));
    let (status, _) = post_json(
        &app,
        &format!("/sessions/{forever}/turns"),
        json!({"stream": "none", "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_eq!(status, 200);

    // After a restart: still ended, and a delete still works, once.
    assert!(app.terminate().await.success(), "it stops cleanly, its sweep with it");
    app.restart().await;
    assert_eq!(app.post_event(&quiet, json!({"type": "user.interrupt"})).await.status(), 409);
    assert_eq!(app.delete(&format!("/sessions/{quiet}")).send().await.unwrap().status(), 204);
    assert_eq!(get_json(&app, &format!("/sessions/{quiet}")).await.0, 404);
    assert_eq!(app.delete(&format!("/sessions/{quiet}")).send().await.unwrap().status(), 404);
    assert_eq!(app.delete(&format!("/sessions/{waiting}")).send().await.unwrap().status(), 204);
}
