//! What each view sends and takes where the protocols differ: stop reasons in each view's
//! own names, the native stream's delta merging and type filter, and images refused at the
//! request for a model that takes none.

use futures_util::StreamExt;
use serde_json::{json, Value};

use crate::helpers::{get_json, post_json, spawn_with, sse, take, TestApp};

const CONFIG: &str = r#"
[agents.blind]
model = { provider = "scripted", images = false }
"#;

/// A session of the default agent that may run the calculator without asking.
async fn session(app: &TestApp) -> String {
    let body = json!({"agent": {"name": "default", "tools": [{"name": "calculator", "trust": true}]}});
    let (status, created) = post_json(app, "/sessions", body).await;
    assert_eq!(status, 201, "{created}");
    created["sessionId"].as_str().unwrap().to_string()
}

/// An AAP turn, answered once it ends.
async fn turn(app: &TestApp, session: &str, text: &str) -> Value {
    let body = json!({"stream": "none", "messages": [{"role": "user", "content": text}]});
    let (status, answer) = post_json(app, &format!("/sessions/{session}/turns"), body).await;
    assert_eq!(status, 200, "{answer}");
    answer
}

/// The stop reasons of the session's turns as the native list shows them.
async fn native_stops(app: &TestApp, session: &str) -> Vec<Value> {
    let events = app.all_events(session).await;
    events.iter().filter(|e| e["type"] == "session.status_idle").map(|e| e["stop_reason"].clone()).collect()
}

#[tokio::test]
async fn each_view_names_stop_reasons_as_its_protocol_does() {
    let app = spawn_with(CONFIG).await;
    let session = session(&app).await;
    let mut aap = Vec::new();
    for text in ["hello", "/max_tokens", "/refuse", "/loop"] {
        aap.push(turn(&app, &session, text).await["stopReason"].clone());
    }
    // An interrupt, through the stream's own view of it.
    let mut stream = sse(app.stream(&session, None, None).await);
    let body = json!({"stream": "delta", "messages": [{"role": "user", "content": "/delay 50\n/words 100"}]});
    let running = app.post(&format!("/sessions/{session}/turns")).json(&body).send().await.unwrap();
    let mut frames = sse(running);
    take(&mut frames, 2, 10).await;
    assert_eq!(app.post_event(&session, json!({"type": "user.interrupt"})).await.status(), 200);
    let rest: Vec<_> = frames.collect().await;
    aap.push(rest.last().unwrap().data["stopReason"].clone());

    // AAP's five only: an interrupted turn ended; a turn cut at its request limit was cut short.
    assert_eq!(aap, ["end_turn", "max_tokens", "refusal", "max_tokens", "end_turn"]);
    // The event-stream seed's names, with turnlog's own as `detail` where they differ.
    let expected = [
        json!({"type": "end_turn"}),
        json!({"type": "end_turn", "detail": "max_tokens"}),
        json!({"type": "end_turn", "detail": "refusal"}),
        json!({"type": "max_turns", "detail": "max_turn_requests"}),
        json!({"type": "cancel", "detail": "cancelled"}),
    ];
    assert_eq!(native_stops(&app, &session).await, expected);
    let mut streamed = Vec::new();
    while streamed.len() < expected.len() {
        let frame = take(&mut stream, 1, 10).await.remove(0);
        if frame.event == "session.status_idle" {
            streamed.push(frame.data["stop_reason"].clone());
        }
    }
    assert_eq!(streamed, expected, "the stream names them as the list does");
    // The managed-agents view: the SDK's names.
    let (_, listed) = get_json(&app, &format!("/v1/sessions/{session}/events?limit=1000")).await;
    let managed: Vec<&Value> = listed["data"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] == "session.status_idle")
        .map(|e| &e["stop_reason"]["type"])
        .collect();
    assert_eq!(managed, ["end_turn", "end_turn", "refusal", "end_turn", "end_turn"]);
}

/// The native stream's `agent.message.delta` frames, read until the turn's end.
async fn deltas(app: &TestApp, session: &str, query: &str) -> Vec<String> {
    let response = app.get(&format!("/sessions/{session}/events/stream{query}")).send().await.unwrap();
    let mut frames = sse(response);
    let mut out = Vec::new();
    loop {
        let frame = take(&mut frames, 1, 10).await.remove(0);
        match frame.event.as_str() {
            "agent.message.delta" => out.push(frame.data["delta"].as_str().unwrap().to_string()),
            "session.status_idle" => return out,
            _ => {}
        }
    }
}

#[tokio::test]
async fn the_native_stream_merges_deltas_every_50_ms_unless_asked_otherwise() {
    let app = spawn_with(CONFIG).await;
    let session = session(&app).await;
    let answer = turn(&app, &session, "/delay 30\n/words 12").await;
    let said = answer["messages"][0]["content"].as_str().unwrap().to_string();
    let logged: Vec<Value> =
        app.all_events(&session).await.into_iter().filter(|e| e["type"] == "agent.message.delta").collect();
    assert!(logged.len() > 2, "the log keeps a delta per 25 ms: {}", logged.len());

    let every = deltas(&app, &session, "?delta_flush_interval_ms=0").await;
    assert_eq!(every.len(), logged.len(), "0 keeps every delta");
    let merged = deltas(&app, &session, "").await;
    assert!(merged.len() < logged.len(), "read back at once, 50 ms merge them: {merged:?}");
    assert_eq!(merged.concat(), said);
    assert_eq!(every.concat(), said);
}

#[tokio::test]
async fn the_native_stream_sends_only_the_types_asked_for_and_resumes_by_log_ids() {
    let app = spawn_with(CONFIG).await;
    let session = session(&app).await;
    turn(&app, &session, "one").await;
    turn(&app, &session, "two").await;
    let log = app.all_events(&session).await;
    let wanted = ["agent.message", "session.status_idle"];
    let expected: Vec<&Value> = log.iter().filter(|e| wanted.contains(&e["type"].as_str().unwrap())).collect();
    let query = "?types[]=agent.message&types[]=session.status_idle";
    let response = app.get(&format!("/sessions/{session}/events/stream{query}")).send().await.unwrap();
    let got = take(&mut sse(response), 4, 10).await;
    assert_eq!(got.iter().map(|f| &f.data).collect::<Vec<_>>(), expected);
    assert!(got.iter().all(|f| f.data["id"] == f.id.as_str()), "ids are the log's");
    // Resuming after the first filtered event skips what the filter left out, and no more.
    let path = format!("/sessions/{session}/events/stream{query}&after_id={}", got[1].id);
    let resumed = take(&mut sse(app.get(&path).send().await.unwrap()), 2, 10).await;
    assert_eq!(resumed.iter().map(|f| &f.data).collect::<Vec<_>>(), expected[2..]);
    // The managed-agents stream takes the same filter in its own names.
    let path = format!(
        "/v1/sessions/{session}/events/stream?after_id={}&types[]=session.status_idle",
        log[0]["id"].as_str().unwrap()
    );
    let managed = take(&mut sse(app.get(&path).send().await.unwrap()), 2, 10).await;
    assert!(managed.iter().all(|f| f.event == "session.status_idle"), "{managed:?}");
}

#[tokio::test]
async fn an_image_for_a_model_that_takes_none_is_refused_at_the_request() {
    let app = spawn_with(CONFIG).await;
    let (status, created) = post_json(&app, "/sessions", json!({"agent": {"name": "blind"}})).await;
    assert_eq!(status, 201);
    let session = created["sessionId"].as_str().unwrap();
    let image = json!({"type": "image", "url": "https://example.com/cat.png"});
    let body = json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "what is it?"}, image]}]});
    let (status, refused) = post_json(&app, &format!("/sessions/{session}/turns"), body).await;
    assert_eq!(status, 400, "{refused}");
    let message = refused.to_string();
    assert!(message.contains("takes no images") && message.contains("blind"), "{message}");
    let base64 =
        json!({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}});
    let native = app.post_event(session, json!({"type": "user.message", "content": [base64]})).await;
    assert_eq!(native.status(), 400);
    assert!(native.text().await.unwrap().contains("takes no images"));
    assert_eq!(app.all_events(session).await.len(), 1, "nothing was stored but the session's start");
    // Text alone still goes, and `/meta` says which agents take images.
    turn(&app, session, "hello").await;
    let (_, meta) = get_json(&app, "/meta").await;
    let image = |name: &str| {
        meta["agents"].as_array().unwrap().iter().find(|a| a["name"] == name).unwrap()["capabilities"]["image"].clone()
    };
    assert_eq!(image("blind"), Value::Null);
    assert_eq!(image("default"), json!({"http": {}, "data": {}}));
}

#[tokio::test]
async fn a_native_outcome_is_graded_after_the_turn_and_named_by_its_event() {
    let app = spawn_with(CONFIG).await;
    let session = session(&app).await;
    let defined =
        app.post_event(&session, json!({"type": "user.define_outcome", "outcome": "/say SATISFIED: fine"})).await;
    let defined: Value = defined.json().await.unwrap();
    let outcome_id = defined["data"][0]["id"].as_str().unwrap().to_string();
    let mut stream = sse(app.stream(&session, None, Some(&outcome_id)).await);
    turn(&app, &session, "hello").await;
    let mut seen = Vec::new();
    while seen.last().is_none_or(|f: &crate::helpers::Sse| f.event != "session.status_idle") {
        seen.extend(take(&mut stream, 1, 10).await);
    }
    let kinds: Vec<&str> = seen.iter().map(|f| f.event.as_str()).collect();
    let at = kinds.iter().position(|k| *k == "span.outcome_evaluation_start").expect("graded");
    assert_eq!(kinds[at + 1], "span.outcome_evaluation_end", "{kinds:?}");
    assert!(kinds[..at].contains(&"agent.message"), "after the reply: {kinds:?}");
    let end = &seen[at + 1].data;
    assert_eq!((end["outcome_id"].as_str(), end["result"].as_str()), (Some(outcome_id.as_str()), Some("satisfied")));
    assert_eq!(
        (end["description"].as_str(), end["explanation"].as_str()),
        (Some("/say SATISFIED: fine"), Some("fine"))
    );
    assert_eq!(end["outcome_evaluation_start_id"], seen[at].data["id"]);
    let idle = &seen.last().unwrap().data;
    let request = seen.iter().find(|f| f.event == "span.model_request_end").unwrap();
    let (turn_in, request_in) =
        (idle["usage"]["input_tokens"].as_u64(), request.data["usage"]["input_tokens"].as_u64());
    assert_eq!(
        turn_in.unwrap(),
        request_in.unwrap() + end["usage"]["input_tokens"].as_u64().unwrap(),
        "grading counts"
    );
}

/// A session's mode through the native route: the agent's modes (the default config's
/// `ask`, `code` and `plan`), a change recorded in the log and holding from the next turn,
/// a mode the agent does not have or an agent without modes refused with 400, naming why.
#[tokio::test]
async fn a_sessions_mode_changes_what_its_tools_may_do_from_its_next_turn() {
    let app = spawn_with(CONFIG).await;
    let trusted = json!([{"name": "calculator", "trust": true}, {"name": "fetch_url", "trust": true}]);
    let (status, created) = post_json(&app, "/sessions", json!({"agent": {"name": "default", "tools": trusted}})).await;
    assert_eq!(status, 201, "{created}");
    let session = created["sessionId"].as_str().unwrap().to_string();
    let (status, modes) = get_json(&app, &format!("/sessions/{session}/mode")).await;
    assert_eq!((status, &modes["mode"]), (200, &json!("code")), "{modes}");
    let ids: Vec<&str> = modes["modes"].as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["ask", "code", "plan"]);

    let (status, changed) = post_json(&app, &format!("/sessions/{session}/mode"), json!({"mode": "plan"})).await;
    assert_eq!(status, 200, "{changed}");
    assert_eq!(changed["mode"], "plan");
    let calls = "/tool fetch_url {\"url\": \"http://example.com/\"}\n/tool calculator {\"expression\": \"6*7\"}";
    let answer = turn(&app, &session, calls).await;
    let said = answer["messages"].as_array().unwrap().last().unwrap()["content"].to_string();
    assert!(said.contains("calculator=42"), "plan mode allows the calculator: {said}");
    let refused = "fetch_url=Tool call denied: the session's mode (plan) does not allow \\\"fetch_url\\\"";
    assert!(said.contains(refused), "plan mode refuses fetch_url, trusted as it is, unasked: {said}");

    let (status, refused) = post_json(&app, &format!("/sessions/{session}/mode"), json!({"mode": "yolo"})).await;
    assert_eq!(status, 400, "{refused}");
    let message = refused["error"]["message"].as_str().unwrap();
    assert_eq!(message, "invalid field `mode`: agent \"default\" has no mode \"yolo\"; it has: ask, code, plan");
    let updates: Vec<Value> =
        app.all_events(&session).await.into_iter().filter(|e| e["type"] == "session.updated").collect();
    assert_eq!(updates.len(), 1, "a refused change stores nothing: {updates:?}");
    assert_eq!(updates[0]["mode"], "plan");

    let (status, created) = post_json(&app, "/sessions", json!({"agent": {"name": "blind"}})).await;
    assert_eq!(status, 201, "{created}");
    let other = created["sessionId"].as_str().unwrap();
    let none = get_json(&app, &format!("/sessions/{other}/mode")).await;
    assert_eq!(none, (200, json!({"mode": null, "modes": []})));
    let (status, refused) = post_json(&app, &format!("/sessions/{other}/mode"), json!({"mode": "plan"})).await;
    assert_eq!(
        (status, refused["error"]["message"].as_str()),
        (400, Some("invalid field `mode`: agent \"blind\" has no modes"))
    );
}

/// A session whose agent has no MCP servers has no prompts, and writing one out names the
/// server it does not have (tests/mcp/test_prompts.py drives real servers' prompts).
#[tokio::test]
async fn a_session_without_mcp_servers_lists_no_prompts_and_writes_none() {
    let app = spawn_with(CONFIG).await;
    let session = session(&app).await;
    let (status, listed) = get_json(&app, &format!("/sessions/{session}/prompts")).await;
    assert_eq!((status, listed), (200, json!({"prompts": [], "unavailable": []})));
    let path = format!("/sessions/{session}/prompts/everything/simple-prompt");
    let (status, refused) = post_json(&app, &path, json!({})).await;
    assert_eq!(status, 404, "{refused}");
    assert_eq!(
        refused["error"]["message"].as_str(),
        Some(format!("MCP server \"everything\" of session {session} not found").as_str())
    );
    let (status, refused) = post_json(&app, &path, json!({"arguments": {"city": ["Paris"]}})).await;
    assert_eq!(status, 400, "a body of the wrong shape is refused before anything: {refused}");
}

/// A session's model through the native route: the agent's own (`default`) and its
/// `models` (the default config's `second`), a change recorded in the log and run from the
/// next turn, kept by a fork; a model the agent does not offer refused with 400, naming why.
#[tokio::test]
async fn a_sessions_model_is_chosen_among_its_agents_and_runs_from_its_next_turn() {
    let app = spawn_with(CONFIG).await;
    let session = session(&app).await;
    let offered = json!([{"id": "default", "name": "scripted"}, {"id": "second", "name": "scripted-second"}]);
    let (status, models) = get_json(&app, &format!("/sessions/{session}/model")).await;
    assert_eq!((status, models), (200, json!({"model": "default", "models": offered})));
    let said = |answer: Value| answer["messages"].as_array().unwrap().last().unwrap()["content"].to_string();
    assert!(said(turn(&app, &session, "/whoami").await).contains("model: scripted\""));

    let (status, changed) = post_json(&app, &format!("/sessions/{session}/model"), json!({"model": "second"})).await;
    assert_eq!((status, &changed["model"]), (200, &json!("second")), "{changed}");
    assert!(said(turn(&app, &session, "/whoami").await).contains("model: scripted-second"));
    let (status, refused) = post_json(&app, &format!("/sessions/{session}/model"), json!({"model": "gpt-9"})).await;
    assert_eq!(status, 400, "{refused}");
    let message = refused["error"]["message"].as_str().unwrap();
    assert_eq!(
        message,
        "invalid field `model`: agent \"default\" offers no model \"gpt-9\"; it offers: default, second"
    );
    let events = app.all_events(&session).await;
    let starts: Vec<&Value> =
        events.iter().filter(|e| e["type"] == "span.model_request_start").map(|e| &e["model"]).collect();
    assert_eq!(starts, [&json!("scripted"), &json!("scripted-second")], "the log says which model answered");
    let at = events.last().unwrap()["id"].as_str().unwrap();
    let (status, forked) = post_json(&app, &format!("/sessions/{session}/fork"), json!({"at": at})).await;
    assert_eq!(status, 201, "{forked}");
    let fork = forked["sessionId"].as_str().unwrap();
    let (_, models) = get_json(&app, &format!("/sessions/{fork}/model")).await;
    assert_eq!(models["model"], "second", "a fork keeps the model: {models}");

    let (status, created) = post_json(&app, "/sessions", json!({"agent": {"name": "blind"}})).await;
    assert_eq!(status, 201, "{created}");
    let other = created["sessionId"].as_str().unwrap();
    let (_, models) = get_json(&app, &format!("/sessions/{other}/model")).await;
    assert_eq!(models, json!({"model": "default", "models": [{"id": "default", "name": "scripted"}]}));
    let (status, refused) = post_json(&app, &format!("/sessions/{other}/model"), json!({"model": "second"})).await;
    assert_eq!(
        (status, refused["error"]["message"].as_str()),
        (400, Some("invalid field `model`: agent \"blind\" offers no model \"second\"; it offers: default"))
    );
}
