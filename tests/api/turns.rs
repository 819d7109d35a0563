//! The AAP turn routes and the event API driving turns, over HTTP against the real binary.

use std::time::Duration;

use futures_util::StreamExt;
use serde_json::{json, Value};

use crate::helpers::{spawn_app, sse, take, Sse, TestApp};

async fn aap_session(app: &TestApp) -> String {
    let body = json!({
        "agent": {"name": "default", "tools": [{"name": "calculator", "trust": false}, {"name": "current_time", "trust": true}]},
        "tools": [{"name": "get_weather", "description": "Weather", "parameters": {"type": "object"}}],
    });
    let response = app.post("/sessions").json(&body).send().await.unwrap();
    assert_eq!(response.status(), 201);
    response.json::<Value>().await.unwrap()["sessionId"].as_str().unwrap().to_string()
}

async fn turn(app: &TestApp, session: &str, body: Value) -> reqwest::Response {
    app.post(&format!("/sessions/{session}/turns")).json(&body).send().await.unwrap()
}

/// All frames of a turn stream, which must end after `turn_stop`.
async fn frames(response: reqwest::Response) -> Vec<Sse> {
    let mut stream = sse(response);
    let mut out = Vec::new();
    while let Some(frame) = tokio::time::timeout(Duration::from_secs(20), stream.next()).await.expect("a frame") {
        out.push(frame);
    }
    assert_eq!(out.first().map(|f| f.event.as_str()), Some("turn_start"));
    assert_eq!(out.last().map(|f| f.event.as_str()), Some("turn_stop"));
    out
}

fn deltas(frames: &[Sse]) -> String {
    frames.iter().filter(|f| f.event == "text_delta").map(|f| f.data["delta"].as_str().unwrap()).collect()
}

async fn wait_idle(app: &TestApp, session: &str) -> Vec<Value> {
    for _ in 0..2400 {
        let events = app.all_events(session).await;
        if events.last().is_some_and(|e| e["type"] == "session.status_idle") {
            return events;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("the session did not go idle");
}

#[tokio::test]
async fn each_stream_mode_renders_the_same_turn() {
    let app = spawn_app().await;
    let session = aap_session(&app).await;

    let delta = frames(
        turn(
            &app,
            &session,
            json!({"stream": "delta", "messages": [{"role": "user", "content": "/delay 5\n/words 30"}]}),
        )
        .await,
    )
    .await;
    let words: Vec<String> = (1..=30).map(|i| format!("w{i}")).collect();
    assert_eq!(deltas(&delta), words.join(" "));
    assert!(delta.iter().filter(|f| f.event == "text_delta").count() > 1, "tokens are coalesced, not batched whole");
    assert_eq!(delta.last().unwrap().data, json!({"stopReason": "end_turn"}));

    let message = frames(
        turn(&app, &session, json!({"stream": "message", "messages": [{"role": "user", "content": "/think hmm\nhi"}]}))
            .await,
    )
    .await;
    let names: Vec<&str> = message.iter().map(|f| f.event.as_str()).collect();
    assert_eq!(names, ["turn_start", "thinking", "text", "turn_stop"]);
    assert_eq!(message[1].data, json!({"thinking": "hmm"}));
    assert_eq!(message[2].data, json!({"text": "echo: hi"}));

    let none = turn(&app, &session, json!({"messages": [{"role": "user", "content": "plain"}]})).await;
    assert_eq!(none.headers()["content-type"], "application/json");
    let body: Value = none.json().await.unwrap();
    assert_eq!(body, json!({"stopReason": "end_turn", "messages": [{"role": "assistant", "content": "echo: plain"}]}));
}

#[tokio::test]
async fn tools_inline_with_permission_and_on_the_client_in_one_parallel_stop() {
    let app = spawn_app().await;
    let session = aap_session(&app).await;
    let input =
        "/tool current_time {}\n/tool calculator {\"expression\": \"6*7\"}\n/tool get_weather {\"city\": \"Oslo\"}";
    let first = frames(
        turn(&app, &session, json!({"stream": "delta", "messages": [{"role": "user", "content": input}]})).await,
    )
    .await;
    let calls: Vec<&Sse> = first.iter().filter(|f| f.event == "tool_call").collect();
    assert_eq!(calls.len(), 3);
    let results: Vec<&Sse> = first.iter().filter(|f| f.event == "tool_result").collect();
    assert_eq!(results.len(), 1, "only the trusted tool ran");
    assert_eq!(results[0].data["toolCallId"], calls[0].data["toolCallId"]);
    assert_eq!(first.last().unwrap().data["stopReason"], "tool_use");

    let id = |i: usize| calls[i].data["toolCallId"].as_str().unwrap().to_string();
    let answer = json!({"messages": [
        {"role": "tool", "toolCallId": id(2), "content": "cold"},
        {"role": "tool_permission", "toolCallId": id(1), "granted": true},
    ]});
    let body: Value = turn(&app, &session, answer).await.json().await.unwrap();
    assert_eq!(body["stopReason"], "end_turn");
    let messages = body["messages"].as_array().unwrap();
    assert_eq!(messages[0], json!({"role": "tool", "toolCallId": id(1), "content": "42"}));
    let time = results[0].data["content"].as_str().unwrap();
    assert_eq!(
        messages[1],
        json!({"role": "assistant", "content": format!("tool results: current_time={time}; calculator=42; get_weather=cold")})
    );

    let history: Value =
        app.get(&format!("/sessions/{session}/history?type=full")).send().await.unwrap().json().await.unwrap();
    let history = history["history"]["full"].as_array().unwrap();
    assert!(history.iter().all(|m| m["role"] != "tool_permission"));
    assert_eq!(history.iter().filter(|m| m["role"] == "tool").count(), 3);
}

#[tokio::test]
async fn refusals_name_what_is_wrong_and_store_nothing() {
    let app = spawn_app().await;
    let session = aap_session(&app).await;
    let body: Value = turn(&app, &session, json!({"messages": [{"role": "user", "content": "/tool get_weather {}"}]}))
        .await
        .json()
        .await
        .unwrap();
    let call = body["messages"][0]["content"][0]["toolCallId"].as_str().unwrap().to_string();
    let before = app.all_events(&session).await.len();

    let cases = [
        (json!({"messages": [{"role": "user", "content": "hi"}]}), 409, call.as_str()),
        (json!({"stream": "delta", "messages": [{"role": "user", "content": "hi"}]}), 409, call.as_str()),
        (json!({"messages": [{"role": "tool", "toolCallId": "call_nope", "content": "x"}]}), 409, "call_nope"),
        (json!({"messages": [{"role": "tool_permission", "toolCallId": call, "granted": true}]}), 409, "client tool"),
        (
            json!({"messages": [{"role": "user", "content": "a"}, {"role": "tool", "toolCallId": call, "content": "x"}]}),
            400,
            "messages",
        ),
        (json!({"messages": []}), 400, "messages"),
        (json!({"messages": [{"role": "assistant", "content": "x"}]}), 400, "messages[0].role"),
        (json!({"stream": "sideways", "messages": [{"role": "user", "content": "x"}]}), 400, "stream"),
        // Found by schemathesis: serde would read a struct from an array.
        (json!({"agent": [null, null], "messages": [{"role": "user", "content": "x"}]}), 400, "agent"),
        (json!({"tools": [["calculator"]], "messages": [{"role": "user", "content": "x"}]}), 400, "tools"),
        (
            json!({"tools": [{"name": "calculator"}], "messages": [{"role": "tool", "toolCallId": call, "content": "x"}]}),
            400,
            "clashes",
        ),
        (
            json!({"agent": {"tools": [{"name": "rm_rf"}]}, "messages": [{"role": "tool", "toolCallId": call, "content": "x"}]}),
            400,
            "rm_rf",
        ),
    ];
    for (body, status, needle) in cases {
        let response = turn(&app, &session, body.clone()).await;
        assert_eq!(response.status(), status, "{body}");
        let text = response.text().await.unwrap();
        assert!(text.contains(needle), "{text} should name {needle}");
    }
    let response = app.post_event(&session, json!({"type": "user.message", "content": "hi"})).await;
    assert_eq!(response.status(), 409);
    assert!(response.text().await.unwrap().contains(&call));
    assert_eq!(app.all_events(&session).await.len(), before, "no refused input was stored");

    let missing =
        turn(&app, "sess_01J00000000000000000000000", json!({"messages": [{"role": "user", "content": "x"}]})).await;
    assert_eq!(missing.status(), 404);
    let clash = json!({"agent": {"name": "default"}, "tools": [{"name": "current_time"}]});
    let response = app.post("/sessions").json(&clash).send().await.unwrap();
    assert_eq!(response.status(), 400);
    assert!(response.text().await.unwrap().contains("clashes"));
    let unknown = app.post("/sessions").json(&json!({"agent": {"name": "nobody"}})).send().await.unwrap();
    assert_eq!(unknown.status(), 404, "an agent that is not there is not found");
    assert!(unknown.text().await.unwrap().contains("nobody"));
}

#[tokio::test]
async fn an_interrupt_cancels_a_streaming_turn_and_a_disconnect_does_not() {
    let app = spawn_app().await;
    let session = aap_session(&app).await;
    let slow = json!({"stream": "delta", "messages": [{"role": "user", "content": "/delay 10\n/words 400"}]});

    // A client that goes away mid-turn: the turn still ends normally.
    let mut gone = sse(turn(&app, &session, slow.clone()).await);
    take(&mut gone, 2, 10).await;
    drop(gone);
    let events = wait_idle(&app, &session).await;
    let last = events.last().unwrap();
    assert_eq!(last["stop_reason"]["type"], "end_turn");
    let message = events.iter().rev().find(|e| e["type"] == "agent.message").unwrap();
    assert!(message["content"][0]["text"].as_str().unwrap().ends_with("w400"));

    // An explicit interrupt: the stream ends with the turn, cancelled.
    let mut streaming = sse(turn(&app, &session, slow).await);
    take(&mut streaming, 2, 10).await;
    let response = app.post_event(&session, json!({"type": "user.interrupt"})).await;
    assert_eq!(response.status(), 200);
    let mut rest = Vec::new();
    while let Some(frame) = tokio::time::timeout(Duration::from_secs(10), streaming.next()).await.unwrap() {
        rest.push(frame);
    }
    // AAP has no `cancelled`: the interrupted turn ended, and the session goes on.
    assert_eq!(rest.last().unwrap().data, json!({"stopReason": "end_turn"}));
    assert!(app.metric("turnlog_turns_total{stop_reason=\"cancelled\"}").await >= 1.0);

    // The cut request is counted as it was sent and as far as it streamed (the scripted
    // model reports usage only at its end): estimated, and so marked.
    let events = wait_idle(&app, &session).await;
    let turn_id = events.last().unwrap()["turn_id"].clone();
    let of_turn =
        |kind: &str| events.iter().filter(|e| e["type"] == kind && e["turn_id"] == turn_id).collect::<Vec<_>>();
    let ([start], [end]) = (&of_turn("span.model_request_start")[..], &of_turn("span.model_request_end")[..]) else {
        panic!("one request in the interrupted turn: {events:?}")
    };
    let streamed: usize = of_turn("agent.message.delta").iter().map(|e| e["delta"].as_str().unwrap().len()).sum();
    assert!(streamed > 0 && start["input_tokens"].as_u64().unwrap() > 0, "{start}");
    let usage = json!({"input_tokens": start["input_tokens"], "output_tokens": streamed.div_ceil(4)});
    assert_eq!((&end["usage"], &end["usage_estimated"], &end["is_error"]), (&usage, &json!(true), &json!(true)));
    assert_eq!(events.last().unwrap()["usage"], usage, "the turn's usage counts it");
}

#[tokio::test]
async fn the_event_api_and_the_turn_api_drive_one_session_in_turn() {
    let app = spawn_app().await;
    let session = aap_session(&app).await;
    let mut observer = sse(app.stream(&session, None, None).await);
    let posted = app.post_event(&session, json!({"type": "user.message", "content": "/tool get_weather {}"})).await;
    assert_eq!(posted.status(), 200);
    let stored: Value = posted.json().await.unwrap();
    assert_eq!(stored["data"][0]["type"], "user.message", "the answer echoes the user event");
    let events = wait_idle(&app, &session).await;
    let ask = events.iter().find(|e| e["type"] == "agent.custom_tool_use").unwrap();
    assert_eq!(events.last().unwrap()["stop_reason"]["event_ids"], json!([ask["id"]]));

    // The AAP view sees the waiting call in history and answers it.
    let history: Value =
        app.get(&format!("/sessions/{session}/history?type=full")).send().await.unwrap().json().await.unwrap();
    let call = history["history"]["full"].as_array().unwrap().last().unwrap()["content"][0]["toolCallId"].clone();
    assert_eq!(call, ask["tool_call_id"]);
    let body: Value =
        turn(&app, &session, json!({"messages": [{"role": "tool", "toolCallId": call, "content": "fog"}]}))
            .await
            .json()
            .await
            .unwrap();
    assert_eq!(body["messages"][0]["content"], "tool results: get_weather=fog");

    // The observer saw all of it, in order, once.
    let all = app.all_events(&session).await;
    let seen = take(&mut observer, all.len(), 10).await;
    assert_eq!(seen.iter().map(|e| e.id.clone()).collect::<Vec<_>>(), crate::helpers::ids(&all));
}

#[tokio::test]
async fn a_stream_can_merge_deltas_and_resume_exactly_after_a_merged_one() {
    let app = spawn_app().await;
    let session = aap_session(&app).await;
    let body: Value = turn(&app, &session, json!({"messages": [{"role": "user", "content": "/delay 4\n/words 60"}]}))
        .await
        .json()
        .await
        .unwrap();
    let text = body["messages"][0]["content"].as_str().unwrap().to_string();
    let all = app.all_events(&session).await;
    let stored_deltas: Vec<&Value> = all.iter().filter(|e| e["type"] == "agent.message.delta").collect();
    assert!(stored_deltas.len() >= 3, "the engine wrote several deltas ({})", stored_deltas.len());

    let response =
        app.get(&format!("/sessions/{session}/events/stream?delta_flush_interval_ms=1000")).send().await.unwrap();
    let mut stream = sse(response);
    let expected = all.len() - stored_deltas.len() + 2;
    let merged = take(&mut stream, expected, 10).await;
    let delta: Vec<&Sse> = merged.iter().filter(|e| e.event == "agent.message.delta").collect();
    // The first goes at once (after a quiet spell), the rest within the window become one.
    assert_eq!(delta.len(), 2, "consecutive deltas of one message became one event after the first");
    assert_eq!(delta[0].data, *stored_deltas[0], "the first, as stored");
    let joined = format!("{}{}", delta[0].data["delta"].as_str().unwrap(), delta[1].data["delta"].as_str().unwrap());
    assert_eq!(joined, text);
    assert_eq!(delta[1].id, stored_deltas.last().unwrap()["id"].as_str().unwrap(), "it keeps the last covered id");
    let after: Vec<String> = all
        .iter()
        .skip_while(|e| e["id"] != delta[1].id.as_str())
        .skip(1)
        .map(|e| e["id"].as_str().unwrap().to_string())
        .collect();
    let mut resumed = sse(app.stream(&session, None, Some(&delta[1].id)).await);
    let got: Vec<String> = take(&mut resumed, after.len(), 10).await.into_iter().map(|e| e.id).collect();
    assert_eq!(got, after);
}

#[tokio::test]
async fn an_unexposed_tool_is_not_listed_but_runs_and_streams() {
    let app = crate::helpers::spawn_with("[tools.current_time]\nexposed = false\n").await;
    let meta: Value = app.get("/meta").send().await.unwrap().json().await.unwrap();
    let tools: Vec<&str> =
        meta["agents"][0]["tools"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(tools, vec!["calculator", "fetch_url", "update_plan"]);
    // Enabled without being asked for, since no client can name it.
    let session = app.post("/sessions").json(&json!({"agent": {"name": "default"}})).send().await.unwrap();
    let session = session.json::<Value>().await.unwrap()["sessionId"].as_str().unwrap().to_string();
    let inline = frames(
        turn(
            &app,
            &session,
            json!({"stream": "message", "messages": [{"role": "user", "content": "/tool current_time {}"}]}),
        )
        .await,
    )
    .await;
    let names: Vec<&str> = inline.iter().map(|f| f.event.as_str()).collect();
    assert_eq!(names, ["turn_start", "tool_call", "tool_result", "text", "turn_stop"]);

    // `agent.tools` was omitted, so the exposed tools are disabled: a call is refused.
    let body = json!({"stream": "message", "messages": [{"role": "user", "content": "/tool calculator {\"expression\": \"1\"}"}]});
    let refused = frames(turn(&app, &session, body).await).await;
    let result = refused.iter().find(|f| f.event == "tool_result").unwrap();
    assert!(result.data["content"].as_str().unwrap().starts_with("Tool call denied: no tool named \"calculator\""));

    // A history type the server does not declare is 404, as AAP says.
    let history = app.get(&format!("/sessions/{session}/history?type=summary")).send().await.unwrap();
    assert_eq!(history.status(), 404);
}

#[tokio::test]
async fn a_seed_history_that_ends_with_calls_waits_for_their_answers() {
    let app = spawn_app().await;
    let seed = json!({
        "agent": {"name": "default", "tools": [{"name": "calculator", "trust": true}]},
        "tools": [{"name": "get_weather", "description": "Weather", "parameters": {"type": "object"}}],
        "messages": [
            {"role": "user", "content": "The weather in Oslo, and 6*7?"},
            {"role": "assistant", "content": [
                {"type": "text", "text": "Let me check."},
                {"type": "tool_use", "toolCallId": "call_seed_1", "name": "get_weather", "input": {"city": "Oslo"}},
                {"type": "tool_use", "toolCallId": "call_seed_2", "name": "calculator", "input": {"expression": "6*7"}},
            ]},
        ],
    });
    let response = app.post("/sessions").json(&seed).send().await.unwrap();
    assert_eq!(response.status(), 201);
    let session = response.json::<Value>().await.unwrap()["sessionId"].as_str().unwrap().to_string();
    let history = |app: &TestApp| {
        let path = format!("/sessions/{session}/history?type=full");
        let request = app.get(&path);
        async move { request.send().await.unwrap().json::<Value>().await.unwrap()["history"]["full"].clone() }
    };
    assert_eq!(history(&app).await, seed["messages"], "the seed reads back exactly, each call once");

    // The calls wait as if the model had just made them: a message is refused, naming them.
    let refused = turn(&app, &session, json!({"messages": [{"role": "user", "content": "hi"}]})).await;
    assert_eq!(refused.status(), 409);
    let text = refused.text().await.unwrap();
    assert!(text.contains("call_seed_1") && text.contains("call_seed_2"), "{text}");

    // A result for the client tool and a permission for the server tool resolve them.
    let answer = json!({"messages": [
        {"role": "tool", "toolCallId": "call_seed_1", "content": "cold"},
        {"role": "tool_permission", "toolCallId": "call_seed_2", "granted": true},
    ]});
    let body: Value = turn(&app, &session, answer).await.json().await.unwrap();
    assert_eq!(
        body,
        json!({"stopReason": "end_turn", "messages": [
            {"role": "tool", "toolCallId": "call_seed_2", "content": "42"},
            {"role": "assistant", "content": "tool results: get_weather=cold; calculator=42"},
        ]})
    );
    let history = history(&app).await;
    let history = history.as_array().unwrap();
    assert_eq!(history.len(), 5, "{history:?}");
    assert_eq!(&history[..2], seed["messages"].as_array().unwrap().as_slice());
    assert_eq!(history[2], json!({"role": "tool", "toolCallId": "call_seed_1", "content": "cold"}));
    assert_eq!(history[3], json!({"role": "tool", "toolCallId": "call_seed_2", "content": "42"}));

    // The log says why the session waited: a turn that stopped for the client's answers.
    let events = app.all_events(&session).await;
    let kinds: Vec<&str> = events.iter().take(5).map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        ["session.created", "turn.started", "agent.custom_tool_use", "agent.tool_use", "session.status_idle"]
    );
    assert_eq!(events[3]["evaluated_permission"], "ask");
    let waiting = &events[4]["stop_reason"];
    assert_eq!(waiting["type"], "requires_action");
    assert_eq!(waiting["event_ids"], json!([events[2]["id"], events[3]["id"]]));
}

#[tokio::test]
async fn a_seed_history_that_ends_with_unknown_or_repeated_calls() {
    let app = spawn_app().await;
    let seed = |calls: Value| {
        json!({
            "agent": {"name": "default"},
            "messages": [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": [{"type": "tool_use", "toolCallId": "call_early", "name": "x", "input": {}}]},
                {"role": "user", "content": "and then?"},
                {"role": "assistant", "content": calls},
            ],
        })
    };
    let call = |id: &str, name: &str| json!({"type": "tool_use", "toolCallId": id, "name": name, "input": {}});

    // Two waiting calls with one id could never both be answered.
    let twice = seed(json!([call("call_1", "a"), call("call_1", "b")]));
    let response = app.post("/sessions").json(&twice).send().await.unwrap();
    assert_eq!(response.status(), 400);
    let text = response.text().await.unwrap();
    assert!(text.contains("messages[3]") && text.contains("call_1"), "{text}");

    // A call of a tool the session does not have is denied at once, as in a turn: nothing
    // waits. (The unanswered call earlier in the history is the client's to keep.)
    let unknown = seed(json!([call("call_2", "launch_rockets")]));
    let response = app.post("/sessions").json(&unknown).send().await.unwrap();
    assert_eq!(response.status(), 201);
    let session = response.json::<Value>().await.unwrap()["sessionId"].as_str().unwrap().to_string();
    let history: Value =
        app.get(&format!("/sessions/{session}/history?type=full")).send().await.unwrap().json().await.unwrap();
    let last = history["history"]["full"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["role"], "tool");
    assert_eq!(last["toolCallId"], "call_2");
    assert!(last["content"].as_str().unwrap().contains("no tool named \"launch_rockets\""), "{last}");
    let body: Value =
        turn(&app, &session, json!({"messages": [{"role": "user", "content": "go on"}]})).await.json().await.unwrap();
    assert_eq!(body["stopReason"], "end_turn");
}
