//! Idempotency keys in every HTTP view, against the real binary: a write sent again with
//! its key is answered as the first time (same ids, same status) and stored once, also
//! after a SIGKILL and restart between the two; the key with another body is a 422 that
//! names the conflict; a malformed key is a 400.

use serde_json::{json, Value};

use crate::helpers::{spawn_app, TestApp};

/// POSTs `body` to `path` with `Idempotency-Key: key`: the status and the JSON answer.
pub(super) async fn keyed(app: &TestApp, path: &str, key: &str, body: &Value) -> (u16, Value) {
    let response = app.post(path).header("Idempotency-Key", key).json(body).send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// The types of every event of the session, in order.
async fn kinds(app: &TestApp, session: &str) -> Vec<String> {
    app.all_events(session).await.iter().map(|e| e["type"].as_str().unwrap().to_string()).collect()
}

fn count(kinds: &[String], kind: &str) -> usize {
    kinds.iter().filter(|k| *k == kind).count()
}

/// The 422 a key used for another request answers, in whichever error shape.
fn reused(status: u16, body: &Value) {
    assert_eq!(status, 422, "{body}");
    let text = body.to_string();
    assert!(text.contains("Idempotency-Key") && text.contains("different request"), "{text}");
}

/// Waits until the session's last turn has ended (its log ends idle).
async fn settled(app: &TestApp, session: &str) {
    for _ in 0..200 {
        if kinds(app, session).await.last().map(String::as_str) == Some("session.status_idle") {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("the turn did not end: {:?}", kinds(app, session).await);
}

#[tokio::test]
async fn native_writes_sent_again_with_their_key_are_stored_once_across_a_sigkill() {
    let mut app = spawn_app().await;
    let make = json!({"agent": {"name": "default"}, "title": "keyed"});
    let (status, first) = keyed(&app, "/sessions", "make-1", &make).await;
    assert_eq!(status, 201, "{first}");
    let (status, again) = keyed(&app, "/sessions", "make-1", &make).await;
    assert_eq!((status, &again), (201, &first), "the same session, with the same status");
    let (status, other) = keyed(&app, "/sessions", "make-1", &json!({"agent": {"name": "default"}})).await;
    reused(status, &other);
    let session = first["sessionId"].as_str().unwrap().to_string();

    let path = format!("/sessions/{session}/events");
    let outcome = json!({"events": [{"type": "user.define_outcome", "outcome": "ship it"}]});
    let (status, stored) = keyed(&app, &path, "outcome-1", &outcome).await;
    assert_eq!(status, 200, "{stored}");
    let (status, again) = keyed(&app, &path, "outcome-1", &outcome).await;
    assert_eq!((status, &again), (200, &stored), "the same events, ids and all");
    let changed = json!({"events": [{"type": "user.define_outcome", "outcome": "ship something else"}]});
    let (status, refused) = keyed(&app, &path, "outcome-1", &changed).await;
    reused(status, &refused);
    assert_eq!(refused["error"]["code"], "idempotency_key_reused", "{refused}");

    app.kill().await;
    app.restart().await;
    let (status, after) = keyed(&app, &path, "outcome-1", &outcome).await;
    assert_eq!((status, &after), (200, &stored), "answered from the log after a SIGKILL");
    let (status, remade) = keyed(&app, "/sessions", "make-1", &make).await;
    assert_eq!((status, &remade), (201, &first), "the key still names the session it made");
    let log = kinds(&app, &session).await;
    assert_eq!(count(&log, "user.define_outcome"), 1, "{log:?}");
    let sessions = app.api().sessions(&Default::default()).await.unwrap().sessions;
    assert_eq!(sessions.len(), 1, "one session made, however often it was asked for");

    // A session made with a key and deleted since is gone for the key too.
    let (status, doomed) = keyed(&app, "/sessions", "make-2", &make).await;
    assert_eq!(status, 201, "{doomed}");
    let doomed = doomed["sessionId"].as_str().unwrap().to_string();
    assert_eq!(app.delete(&format!("/sessions/{doomed}")).send().await.unwrap().status().as_u16(), 204);
    let (status, gone) = keyed(&app, "/sessions", "make-2", &make).await;
    assert_eq!(status, 404, "{gone}");
    assert!(gone.to_string().contains(&doomed), "{gone}");

    // Without a key, a write sent twice is two writes, as before.
    for _ in 0..2 {
        let response = app.post(&path).json(&outcome).send().await.unwrap();
        assert_eq!(response.status(), 200);
    }
    assert_eq!(count(&kinds(&app, &session).await, "user.define_outcome"), 3);
}

#[tokio::test]
async fn a_malformed_key_is_refused_naming_the_header() {
    let app = spawn_app().await;
    let make = json!({"agent": {"name": "default"}});
    for key in [String::new(), "k".repeat(256), "tab\there".to_string()] {
        let (status, body) = keyed(&app, "/sessions", &key, &make).await;
        assert_eq!(status, 400, "{key:?}: {body}");
        assert!(body.to_string().contains("Idempotency-Key"), "{body}");
    }
    let sessions = app.api().sessions(&Default::default()).await.unwrap().sessions;
    assert!(sessions.is_empty(), "a refused request makes nothing");
}

#[tokio::test]
async fn an_aap_turn_sent_again_with_its_key_answers_the_same_turn_once() {
    let mut app = spawn_app().await;
    let session = app.create_session().await;
    let path = format!("/sessions/{session}/turns");
    let turn = json!({"messages": [{"role": "user", "content": "hello there"}]});
    let (status, first) = keyed(&app, &path, "turn-1", &turn).await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(first["stopReason"], "end_turn", "{first}");
    let (status, again) = keyed(&app, &path, "turn-1", &turn).await;
    assert_eq!((status, &again), (200, &first), "the first turn's answer, not a second turn");

    // Streamed, the request sent again replays the turn it started, from its start.
    let streamed = json!({"messages": [{"role": "user", "content": "stream it"}], "stream": "delta"});
    let response = app.post(&path).header("Idempotency-Key", "turn-2").json(&streamed).send().await.unwrap();
    let live = response.text().await.unwrap();
    settled(&app, &session).await;
    let response = app.post(&path).header("Idempotency-Key", "turn-2").json(&streamed).send().await.unwrap();
    assert_eq!(response.status(), 200);
    let replayed = response.text().await.unwrap();
    let frames = |text: &str| text.lines().filter(|l| l.starts_with("event:")).map(str::to_string).collect::<Vec<_>>();
    assert!(frames(&live).len() > 2, "{live}");
    assert_eq!(frames(&replayed), frames(&live), "the same frames, live and replayed");
    let said: String = replayed
        .lines()
        .filter_map(|line| line.strip_prefix("data: "))
        .filter_map(|data| serde_json::from_str::<Value>(data).ok())
        .filter_map(|frame| frame["delta"].as_str().map(str::to_string))
        .collect();
    assert_eq!(said, "echo: stream it", "{replayed}");

    app.kill().await;
    app.restart().await;
    let (status, after) = keyed(&app, &path, "turn-1", &turn).await;
    assert_eq!((status, &after), (200, &first), "answered from the log after a SIGKILL");
    let (status, refused) =
        keyed(&app, &path, "turn-1", &json!({"messages": [{"role": "user", "content": "hi"}]})).await;
    reused(status, &refused);
    let log = kinds(&app, &session).await;
    assert_eq!(count(&log, "turn.started"), 2, "{log:?}");
    assert_eq!(count(&log, "user.message"), 2, "{log:?}");
}

#[tokio::test]
async fn managed_writes_sent_again_with_their_key_are_stored_once_across_a_sigkill() {
    let mut app = spawn_app().await;
    let (status, env) = keyed(&app, "/v1/environments", "env-1", &json!({"name": "e"})).await;
    assert_eq!(status, 200, "{env}");
    let (status, again) = keyed(&app, "/v1/environments", "env-1", &json!({"name": "e"})).await;
    assert_eq!((status, &again["id"]), (200, &env["id"]), "the same environment: {again}");
    let (status, agent) = keyed(&app, "/v1/agents", "agent-1", &json!({"name": "a", "model": "scripted"})).await;
    assert_eq!(status, 200, "{agent}");
    let (status, again) = keyed(&app, "/v1/agents", "agent-1", &json!({"name": "a", "model": "scripted"})).await;
    assert_eq!((status, &again["id"], &again["version"]), (200, &agent["id"], &agent["version"]), "{again}");
    let (status, other) = keyed(&app, "/v1/agents", "agent-1", &json!({"name": "b", "model": "scripted"})).await;
    reused(status, &other);
    let (_, agents) = crate::helpers::get_json(&app, "/v1/agents?limit=100").await;
    assert_eq!(agents["data"].as_array().unwrap().len(), 1, "one agent made: {agents}");
    let message = json!({"type": "user.message", "content": [{"type": "text", "text": "first words"}]});
    let make = json!({"agent": agent["id"], "environment_id": env["id"], "initial_events": [message]});
    let (status, first) = keyed(&app, "/v1/sessions", "make-1", &make).await;
    assert_eq!(status, 200, "{first}");
    let (status, again) = keyed(&app, "/v1/sessions", "make-1", &make).await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["id"], first["id"], "the same session");
    let session = first["id"].as_str().unwrap().to_string();

    let path = format!("/v1/sessions/{session}/events");
    let send = json!({"events": [{"type": "user.message", "content": [{"type": "text", "text": "more"}]}]});
    let (status, sent) = keyed(&app, &path, "send-1", &send).await;
    assert_eq!(status, 200, "{sent}");
    let (status, again) = keyed(&app, &path, "send-1", &send).await;
    assert_eq!((status, &again), (200, &sent), "the same events, ids and all");
    let other = json!({"events": [{"type": "user.message", "content": [{"type": "text", "text": "else"}]}]});
    let response = app.post(&path).header("Idempotency-Key", "send-1").json(&other).send().await.unwrap();
    assert_eq!(response.headers().get("x-should-retry").map(|v| v.to_str().unwrap()), None);
    let status = response.status().as_u16();
    reused(status, &response.json().await.unwrap());

    app.kill().await;
    app.restart().await;
    let (status, after) = keyed(&app, &path, "send-1", &send).await;
    assert_eq!((status, &after), (200, &sent), "answered from the log after a SIGKILL");
    let (status, remade) = keyed(&app, "/v1/sessions", "make-1", &make).await;
    assert_eq!((status, &remade["id"]), (200, &first["id"]));
    settled(&app, &session).await;
    let log = kinds(&app, &session).await;
    assert_eq!(count(&log, "user.message"), 2, "the first words and one more: {log:?}");
}

#[tokio::test]
async fn harness_writes_sent_again_with_their_key_are_stored_once_across_a_sigkill() {
    let mut app = spawn_app().await;
    let make = json!({"agent_name": "default", "title": "keyed"});
    let (status, first) = keyed(&app, "/v1/agents/sessions", "make-1", &make).await;
    assert_eq!(status, 200, "{first}");
    let (status, again) = keyed(&app, "/v1/agents/sessions", "make-1", &make).await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["data"]["id"], first["data"]["id"], "the same session");
    let session = first["data"]["id"].as_str().unwrap().to_string();

    let path = format!("/v1/agents/sessions/{session}/turns");
    let input = |text: &str| json!({"input": [{"type": "user.message", "content": [{"type": "text", "text": text}]}]});
    let (status, turn) = keyed(&app, &path, "turn-1", &input("hello")).await;
    assert_eq!(status, 200, "{turn}");
    let (status, again) = keyed(&app, &path, "turn-1", &input("hello")).await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["data"]["id"], turn["data"]["id"], "the same turn: {again}");
    let (status, refused) = keyed(&app, &path, "turn-1", &input("goodbye")).await;
    reused(status, &refused);

    settled(&app, &session).await;
    app.kill().await;
    app.restart().await;
    let (status, after) = keyed(&app, &path, "turn-1", &input("hello")).await;
    assert_eq!(status, 200, "{after}");
    assert_eq!(after["data"]["id"], turn["data"]["id"], "answered from the log after a SIGKILL");
    let log = kinds(&app, &session).await;
    assert_eq!(count(&log, "turn.started"), 1, "{log:?}");
}
