//! The agent harness view over HTTP against the real binary, for what the official SDK
//! cannot send (it drives the view in `tests/harness`): input it would not build, refused
//! with the field named and nothing stored; files stored as given; `Last-Event-Id` over the
//! body; turns made through other views, shown in the harness's shapes; its routes beside
//! the managed-agents view's.

use serde_json::{json, Value};

use futures_util::StreamExt;

use crate::helpers::{get_json as get, post_json as post, spawn_app, sse, take, Sse, TestApp};

async fn session(app: &TestApp) -> String {
    let (status, made) = post(app, "/v1/agents/sessions", json!({"agent_name": "default"})).await;
    assert_eq!(status, 200, "{made}");
    made["data"]["id"].as_str().unwrap().to_string()
}

/// A turn, streamed to its end.
async fn turn(app: &TestApp, session: &str, input: Value) -> Vec<Sse> {
    let response = app.post(&format!("/v1/agents/sessions/{session}/turns")).json(&json!({"input": input})).send();
    to_the_end(sse(response.await.unwrap())).await
}

/// A turn's frames to its `turn.done`, after which the stream must close.
async fn to_the_end(mut frames: impl futures_util::Stream<Item = Sse> + Unpin) -> Vec<Sse> {
    let mut all = Vec::new();
    while all.last().is_none_or(|f: &Sse| f.data["type"] != "turn.done") {
        all.extend(take(&mut frames, 1, 10).await);
    }
    let after = tokio::time::timeout(std::time::Duration::from_secs(10), frames.next()).await;
    assert!(matches!(after, Ok(None)), "the stream closes after turn.done");
    all
}

/// An existing turn's frames, from its start to its `turn.done`.
async fn subscribe(app: &TestApp, session: &str, turn: &str) -> Vec<Sse> {
    let path = format!("/v1/agents/sessions/{session}/turns/{turn}/subscribe");
    to_the_end(sse(app.post(&path).json(&json!({})).send().await.unwrap())).await
}

#[tokio::test]
async fn the_harness_answers_beside_the_managed_view_in_its_own_shape() {
    let app = spawn_app().await;
    let (status, made) = post(&app, "/v1/agents/sessions", json!({"agent_name": "default", "title": "plans"})).await;
    assert_eq!(status, 200, "{made}");
    assert_eq!((made["data"]["type"].as_str(), made["data"]["title"].as_str()), (Some("session"), Some("plans")));
    let (status, agents) = get(&app, "/v1/agents").await;
    assert_eq!(status, 200, "the managed view's routes are where they were: {agents}");
    assert!(agents["data"].is_array());

    let (status, missing) = get(&app, "/v1/agents/sessions/sess_01J00000000000000000000000/turns").await;
    assert_eq!(status, 404);
    assert_eq!(missing.as_object().unwrap().keys().collect::<Vec<_>>(), ["error"], "{missing}");
    assert!(missing["error"]["message"].as_str().unwrap().contains("not found"), "{missing}");
    let (status, unknown) = get(&app, "/v1/agents/sessions/x/nothing/here").await;
    assert_eq!((status, unknown["error"]["code"].as_str()), (404, Some("not_found")), "{unknown}");
}

#[tokio::test]
async fn input_the_sdk_would_not_build_is_refused_naming_the_field_and_stores_nothing() {
    let app = spawn_app().await;
    let session = session(&app).await;
    let path = format!("/v1/agents/sessions/{session}/turns");
    let message = |content: Value| json!([{"type": "user.message", "content": content}]);
    let cases = [
        (json!({"input": message(json!([{"type": "file", "name": "a", "data": "nope"}]))}), "input[0].content[0].data"),
        (
            json!({"input": message(json!([{"type": "file", "name": "a", "data": "data:text/plain;base64,a$=="}]))}),
            "not base64",
        ),
        (json!({"input": message(json!([{"type": "image", "url": "x"}]))}), "input[0].content[0].type"),
        (json!({"input": message(json!([]))}), "input[0].content"),
        (json!({"input": [{"type": "user.mesage", "content": "x"}]}), "input[0]"),
        (json!({"input": [{"type": "user.message"}]}), "content"),
        (json!({"input": message(json!("x")), "metadata": {}}), "metadata"),
        (json!({"input": message(json!("x")), "previous_turn_id": "yesterday"}), "previous_turn_id"),
        (json!({"input": []}), "input"),
        (json!({"stream": false}), "input"),
        (
            json!({"input": [{"type": "user.tool_approval", "thread_id": "main", "tool_call_id": "c",
                "approval": {"status": "maybe"}}]}),
            "input[0]",
        ),
    ];
    for (body, named) in cases {
        let (status, refused) = post(&app, &path, body.clone()).await;
        assert_eq!(status, 400, "{body} -> {refused}");
        let message = refused["error"]["message"].as_str().unwrap();
        assert!(message.contains(named), "{body}: {message:?} should name {named:?}");
    }
    let (_, log) = get(&app, &format!("/sessions/{session}/events")).await;
    let kinds: Vec<&str> = log["data"].as_array().unwrap().iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["session.created"], "nothing refused was stored");
}

#[tokio::test]
async fn a_file_is_stored_as_given_and_read_back_as_sent() {
    let app = spawn_app().await;
    let session = session(&app).await;
    let parts = json!([
        {"type": "text", "text": "what is in it?"},
        {"type": "file", "name": "notes.txt", "data": "data:text/plain;base64,aGVsbG8="},
    ]);
    let input = json!([{"type": "user.message", "content": parts}]);
    let path = format!("/v1/agents/sessions/{session}/turns");
    let (status, turn) = post(&app, &path, json!({"input": input, "stream": false})).await;
    assert_eq!(status, 200, "{turn}");
    assert_eq!(turn["data"]["state"]["status"], "running", "answered at once, with the running turn");
    assert_eq!(turn["data"]["input"], input);
    let events = app.all_events(&session).await;
    let stored = events.iter().find(|e| e["type"] == "user.message").unwrap();
    assert_eq!(stored["content"], parts, "in the log as given");
}

#[tokio::test]
async fn last_event_id_is_read_before_the_body() {
    let app = spawn_app().await;
    let session = session(&app).await;
    let frames = turn(&app, &session, json!([{"type": "user.message", "content": "/words 5"}])).await;
    let turn_id = frames[0].data["turn_id"].as_str().unwrap();
    let subscribe = format!("/v1/agents/sessions/{session}/turns/{turn_id}/subscribe");
    let response = app
        .post(&subscribe)
        .header("Last-Event-Id", &frames[2].id)
        .json(&json!({"after_sequence_number": 0}))
        .send()
        .await
        .unwrap();
    let rest = to_the_end(sse(response)).await;
    let ids = |frames: &[Sse]| frames.iter().map(|f| f.id.clone()).collect::<Vec<_>>();
    assert_eq!(ids(&rest), ids(&frames[3..]));
    // A subscription with no body at all starts from the first frame.
    let response = app.post(&subscribe).send().await.unwrap();
    assert_eq!(ids(&to_the_end(sse(response)).await), ids(&frames));

    let (status, refused) = post(&app, &subscribe, json!({"after_sequence_number": -1})).await;
    assert_eq!(status, 400, "{refused}");
    let response = app.post(&subscribe).header("Last-Event-Id", "evt_1").send().await.unwrap();
    assert_eq!(response.status(), 400);
}

#[tokio::test]
async fn limits_and_page_tokens_are_checked() {
    let app = spawn_app().await;
    let session = session(&app).await;
    let frames = turn(&app, &session, json!([{"type": "user.message", "content": "hi"}])).await;
    let turn_id = frames[0].data["turn_id"].as_str().unwrap();
    let base = format!("/v1/agents/sessions/{session}");
    for (path, named) in [
        (format!("{base}/turns/{turn_id}/events?limit=26"), "limit"),
        (format!("{base}/turns/{turn_id}/events?page_token=soon"), "page_token"),
        (format!("{base}/turns/{turn_id}/events?order=sideways"), "order"),
        (format!("{base}/events?limit=101"), "limit"),
        (format!("{base}/events?page_token={turn_id}"), "page_token"),
        (format!("{base}/turns?page_token=sess_x"), "page_token"),
        ("/v1/agents/sessions?agent_name=default&limit=0".to_string(), "limit"),
        ("/v1/agents/sessions?agent_name=default&start_timestamp=monday".to_string(), "start_timestamp"),
        ("/v1/agents/sessions".to_string(), "agent_name"),
    ] {
        let (status, refused) = get(&app, &path).await;
        assert_eq!(status, 400, "{path}: {refused}");
        assert!(refused["error"]["message"].as_str().unwrap().contains(named), "{path}: {refused}");
    }
}

#[tokio::test]
async fn turns_made_through_other_views_show_in_the_harness_shapes() {
    let app = spawn_app().await;
    let session = session(&app).await;
    // An image, as the native and managed views take it, shows as a `file` part.
    let image = json!({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw=="}});
    let message = json!({"type": "user.message", "content": [{"type": "text", "text": "look"}, image]});
    let response = app.post_event(&session, message).await;
    assert_eq!(response.status(), 200);
    let stored: Value = response.json().await.unwrap();
    let turn_id = stored["data"][0]["turn_id"].as_str().unwrap().to_string();
    let frames = subscribe(&app, &session, &turn_id).await;
    let input = json!([{"type": "user.message", "content": [
        {"type": "text", "text": "look"},
        {"type": "file", "name": "image", "data": "data:image/png;base64,iVBORw=="},
    ]}]);
    assert_eq!(frames[0].data["input"], input);
    let (_, turn) = get(&app, &format!("/v1/agents/sessions/{session}/turns/{turn_id}")).await;
    assert_eq!(turn["data"]["input"], input);
    assert_eq!(turn["data"]["state"]["output"]["content"], "echo: look");
}

#[tokio::test]
async fn a_turn_that_takes_messages_the_managed_view_queued_shows_them_as_its_input() {
    let app = spawn_app().await;
    let session = session(&app).await;
    let path = format!("/v1/agents/sessions/{session}/turns");
    let slow = json!({"input": [{"type": "user.message", "content": "/delay 20\n/words 30"}], "stream": false});
    let (status, running) = post(&app, &path, slow).await;
    assert_eq!(status, 200, "{running}");
    let first = running["data"]["id"].as_str().unwrap().to_string();
    // Anthropic's API takes a message while a turn runs: it waits for the next turn.
    let queued = json!({"events": [{"type": "user.message", "content": [{"type": "text", "text": "and then?"}]}]});
    let (status, sent) = post(&app, &format!("/v1/sessions/{session}/events"), queued).await;
    assert_eq!(status, 200, "{sent}");
    assert!(sent["data"][0]["processed_at"].is_null(), "queued: {sent}");
    assert_eq!(subscribe(&app, &session, &first).await.last().unwrap().data["state"]["status"], "done");

    // The next turn starts on its own once the first ends: the log says which.
    let mut log = sse(app.stream(&session, None, None).await);
    let mut next_id = None;
    while next_id.is_none() {
        let event = take(&mut log, 1, 10).await.remove(0);
        if event.event == "turn.started" && event.data["turn_id"] != first.as_str() {
            next_id = event.data["turn_id"].as_str().map(String::from);
        }
    }
    let next_id = next_id.unwrap();
    let frames = subscribe(&app, &session, &next_id).await;
    let input = json!([{"type": "user.message", "content": "and then?"}]);
    assert_eq!(frames[0].data["input"], input);
    assert_eq!(frames[0].data["previous_turn_id"], first.as_str());
    let (_, turn) = get(&app, &format!("{path}/{next_id}")).await;
    assert_eq!(turn["data"]["input"], input);
    assert_eq!(turn["data"]["state"]["output"]["content"], "echo: and then?");
}

#[tokio::test]
async fn calls_a_seed_history_left_waiting_show_as_the_actions_a_turn_waits_for() {
    let app = spawn_app().await;
    let seed = json!({
        "agent": {"name": "default", "tools": [{"name": "calculator", "trust": true}]},
        "tools": [{"name": "get_weather", "description": "Weather", "parameters": {"type": "object"}}],
        "messages": [
            {"role": "user", "content": "The weather in Oslo, and 6*7?"},
            {"role": "assistant", "content": [
                {"type": "tool_use", "toolCallId": "call_seed_1", "name": "calculator", "input": {"expression": "6*7"}},
                {"type": "tool_use", "toolCallId": "call_seed_2", "name": "get_weather", "input": {"city": "Oslo"}},
            ]},
        ],
    });
    let made: Value = app.post("/sessions").json(&seed).send().await.unwrap().json().await.unwrap();
    let session = made["sessionId"].as_str().unwrap();
    let (_, turns) = get(&app, &format!("/v1/agents/sessions/{session}/turns")).await;
    let state = &turns["data"][0]["state"];
    assert_eq!(state["status"], "done", "{turns}");
    let actions = state["required_actions"].as_array().unwrap();
    let kinds: Vec<&str> = actions.iter().map(|a| a["type"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["tool.approval_required", "tool.response_required"]);
    let message = &state["output"];
    assert_eq!(message["tool_calls"][0]["id"], "call_seed_1");
    let mut ids: Vec<&str> = actions.iter().map(|a| a["id"].as_str().unwrap()).collect();
    ids.push(message["id"].as_str().unwrap());
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 3, "every event has its own id: {turns}");
    for action in actions {
        assert_eq!(action["tool_calls"][0]["source_event_id"], message["id"]);
    }
    let answers = json!([
        {"type": "user.tool_approval", "thread_id": "main", "tool_call_id": "call_seed_1", "approval": {"status": "allow"}},
        {"type": "user.tool_response", "thread_id": "main", "tool_call_id": "call_seed_2", "content": "cold"},
    ]);
    let frames = turn(&app, session, answers).await;
    let done = &frames.last().unwrap().data["state"];
    assert_eq!(done["output"]["content"], "tool results: calculator=42; get_weather=cold");
}

#[tokio::test]
async fn a_quiet_turn_stream_gets_ping_comments_between_its_frames() {
    let app = crate::helpers::spawn_with("[streams]\nheartbeat_ms = 100\n").await;
    let session = session(&app).await;
    let slow = json!({"input": [{"type": "user.message", "content": "/delay 300\n/words 2"}]});
    let response = app.post(&format!("/v1/agents/sessions/{session}/turns")).json(&slow).send().await.unwrap();
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let mut body = response.bytes_stream();
    let mut text = String::new();
    while let Some(chunk) = tokio::time::timeout(std::time::Duration::from_secs(10), body.next()).await.unwrap() {
        text.push_str(std::str::from_utf8(&chunk.unwrap()).unwrap());
    }
    let ping = text.find(": ping\n\n").expect("a ping while the model is slow");
    assert!(text[..ping].contains("turn.created") && text[ping..].contains("turn.done"), "{text}");
    assert!(!text.contains("data: :"), "pings are comments, never data");
}
