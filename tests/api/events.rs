use serde_json::{json, Value};

use crate::helpers::{ids, spawn_app, spawn_with, texts};

#[tokio::test]
async fn posted_events_come_back_stored_with_ids_and_sequence_numbers() {
    let app = spawn_app().await;
    let session = app.create_session().await;
    let stored = app.post_outcomes(&session, &texts("m", 3)).await;
    assert_eq!(stored.len(), 3);
    for (i, event) in stored.iter().enumerate() {
        assert_eq!(event["type"], "user.define_outcome");
        assert_eq!(event["session_id"], session.as_str());
        assert_eq!(event["sequence_number"], i as u64 + 2);
        assert_eq!(event["outcome"], format!("m-{i}"));
        assert_eq!(event["schema_version"], 1);
        assert!(event["id"].as_str().unwrap().starts_with("evt_"));
        assert!(event["created_at"].as_str().unwrap().ends_with('Z'));
        assert!(event["processed_at"].is_string());
    }
    let all = app.all_events(&session).await;
    assert_eq!(&all[1..], &stored[..]);

    let passive = json!({"events": [
        {"type": "user.interrupt"},
        {"type": "user.define_outcome", "outcome": {"description": "a summary"}},
    ]});
    let response = app.post(&format!("/sessions/{session}/events")).json(&passive).send().await.unwrap();
    assert_eq!(response.status(), 200);
    for resolution in [
        json!({"type": "user.tool_confirmation", "tool_use_id": "evt_x", "result": "deny", "deny_message": "no"}),
        json!({"type": "user.custom_tool_result", "custom_tool_use_id": "evt_y", "content": "42"}),
    ] {
        let response = app
            .post(&format!("/sessions/{session}/events"))
            .json(&json!({"events": [resolution]}))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 409);
        let body: Value = response.json().await.unwrap();
        assert!(body["error"]["message"].as_str().unwrap().contains("no tool calls are waiting"), "{body}");
    }
    let kinds: Vec<String> =
        app.all_events(&session).await.iter().map(|e| e["type"].as_str().unwrap().to_string()).collect();
    assert_eq!(
        kinds,
        [
            "session.created",
            "user.define_outcome",
            "user.define_outcome",
            "user.define_outcome",
            "user.interrupt",
            "user.define_outcome"
        ]
    );
}

#[tokio::test]
async fn the_list_pages_in_both_orders_with_cursors_and_type_filters() {
    let app = spawn_app().await;
    let session = app.create_session().await;
    let stored = app.post_outcomes(&session, &texts("m", 10)).await;
    let all = app.all_events(&session).await;
    let all_ids = ids(&all);
    assert_eq!(all_ids.len(), 11);

    let page: Value =
        app.get(&format!("/sessions/{session}/events?limit=4")).send().await.unwrap().json().await.unwrap();
    assert_eq!(ids(page["data"].as_array().unwrap()), all_ids[..4]);
    assert_eq!(page["first_id"], all_ids[0].as_str());
    assert_eq!(page["last_id"], all_ids[3].as_str());
    assert_eq!(page["has_more"], true);

    let path = format!("/sessions/{session}/events?limit=3&after_id={}", all_ids[7]);
    let page: Value = app.get(&path).send().await.unwrap().json().await.unwrap();
    assert_eq!(ids(page["data"].as_array().unwrap()), all_ids[8..]);
    assert_eq!(page["has_more"], false);

    let path = format!("/sessions/{session}/events?order=desc&limit=3&before_id={}", all_ids[5]);
    let page: Value = app.get(&path).send().await.unwrap().json().await.unwrap();
    let expected: Vec<String> = all_ids[2..5].iter().rev().cloned().collect();
    assert_eq!(ids(page["data"].as_array().unwrap()), expected);
    assert_eq!(page["has_more"], true);

    let path = format!("/sessions/{session}/events?types[]=session.created&types[]=user.interrupt");
    let page: Value = app.get(&path).send().await.unwrap().json().await.unwrap();
    assert_eq!(ids(page["data"].as_array().unwrap()), all_ids[..1]);
    let path = format!("/sessions/{session}/events?type=user.define_outcome&limit=9");
    let page: Value = app.get(&path).send().await.unwrap().json().await.unwrap();
    assert_eq!(ids(page["data"].as_array().unwrap()), ids(&stored)[..9]);
    assert_eq!(page["has_more"], true);

    for (query, field) in [("limit=0", "limit"), ("order=sideways", "order"), ("limit=abc", "limit")] {
        let response = app.get(&format!("/sessions/{session}/events?{query}")).send().await.unwrap();
        assert_eq!(response.status(), 400, "{query}");
        assert!(response.text().await.unwrap().contains(field), "{query}");
    }
    let response = app.get(&format!("/sessions/{session}/events?after_id=evt_nope")).send().await.unwrap();
    assert_eq!(response.status(), 409);
    assert_eq!(response.json::<Value>().await.unwrap()["error"]["code"], "unknown_cursor");

    // A list as OpenAPI's form style sends it (`types=a&types=b`, or one `types=a`), as the
    // document says; an empty value is no filter. (Both were refused with 400 before.)
    for (query, expected) in [
        ("types=session.created&types=user.interrupt", &all_ids[..1]),
        ("types=session.created", &all_ids[..1]),
        ("types=&limit=1000", &all_ids[..]),
    ] {
        let page: Value =
            app.get(&format!("/sessions/{session}/events?{query}")).send().await.unwrap().json().await.unwrap();
        assert_eq!(ids(page["data"].as_array().expect(query)), expected, "{query}");
    }
}

#[tokio::test]
async fn bad_input_is_refused_with_the_field_named_and_stores_nothing() {
    let app =
        spawn_with("[server]\nmax_body_bytes = 4096\n[limits]\nmax_event_bytes = 1024\nmax_events_per_request = 5\n")
            .await;
    let session = app.create_session().await;
    let path = format!("/sessions/{session}/events");
    let cases: Vec<(String, u16, &str, &str)> = vec![
        ("{\"events\": [".into(), 400, "invalid_json", "not valid JSON"),
        ("[]".into(), 400, "invalid_request", "invalid body"),
        (json!({"events": []}).to_string(), 400, "invalid_request", "events"),
        (json!({"events": [{"type": "user.message"}]}).to_string(), 400, "invalid_request", "content"),
        (
            json!({"events": [{"type": "user.message", "content": 5}]}).to_string(),
            400,
            "invalid_request",
            "events[0].content",
        ),
        (
            json!({"events": [{"type": "user.message", "content": "x", "role": "user"}]}).to_string(),
            400,
            "invalid_request",
            "role",
        ),
        (
            json!({"events": [{"type": "agent.message", "content": "x"}]}).to_string(),
            400,
            "invalid_request",
            "agent.message",
        ),
        (
            json!({"events": [{"type": "user.tool_confirmation", "tool_use_id": "x", "result": "maybe"}]}).to_string(),
            400,
            "invalid_request",
            "result",
        ),
        (json!({"events": [{"type": "user.interrupt"}], "extra": true}).to_string(), 400, "invalid_request", "extra"),
        (
            json!({"events": vec![json!({"type": "user.interrupt"}); 6]}).to_string(),
            400,
            "invalid_request",
            "at most 5",
        ),
        (
            json!({"events": [{"type": "user.message", "content": "x".repeat(2000)}]}).to_string(),
            413,
            "payload_too_large",
            "event 0 (user.message)",
        ),
        (
            json!({"events": [{"type": "user.message", "content": "x".repeat(5000)}]}).to_string(),
            413,
            "payload_too_large",
            "4096",
        ),
    ];
    for (body, status, code, needle) in cases {
        let response =
            app.post(&path).header("content-type", "application/json").body(body.clone()).send().await.unwrap();
        assert_eq!(response.status(), status, "{body:.80}");
        let error: Value = response.json().await.unwrap();
        assert_eq!(error["error"]["code"], code, "{body:.80}");
        let message = error["error"]["message"].as_str().unwrap();
        assert!(message.contains(needle), "{message:?} should mention {needle:?}");
    }
    let events = app.all_events(&session).await;
    assert_eq!(events.len(), 1, "nothing but session.created was stored");
    let ok = app.post_outcomes(&session, &texts("ok", 1)).await;
    assert_eq!(ok[0]["sequence_number"], 2, "no sequence number was used up by the refusals");
}

#[tokio::test]
async fn unknown_sessions_are_not_found() {
    let app = spawn_app().await;
    for session in ["sess_01J00000000000000000000000", "nonsense"] {
        let response = app.post_event(session, json!({"type": "user.interrupt"})).await;
        assert_eq!(response.status(), 404);
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["error"]["code"], "session_not_found");
        assert!(body["error"]["message"].as_str().unwrap().contains(session));
    }
    let response = app.get("/no/such/route").send().await.unwrap();
    assert_eq!(response.status(), 404);
    assert_eq!(response.json::<Value>().await.unwrap()["error"]["code"], "not_found");
}

#[tokio::test]
async fn the_cloud_prefix_serves_the_same_log() {
    let app = spawn_app().await;
    let session = app.create_session().await;
    app.post_outcomes(&session, &texts("m", 2)).await;
    let page: Value =
        app.get(&format!("/api/v1/cloud/sessions/{session}/events")).send().await.unwrap().json().await.unwrap();
    assert_eq!(page["data"].as_array().unwrap().len(), 3);
    let response = app
        .post(&format!("/api/v1/cloud/sessions/{session}/events"))
        .json(&json!({"events": [{"type": "user.interrupt"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(app.all_events(&session).await.len(), 4);
}

/// The size of each event and the number per request are the session layer's rules, so
/// every view refuses the same input, each in its own shape, and stores none of it.
#[tokio::test]
async fn every_view_holds_input_to_the_same_limits_and_stores_nothing_it_refuses() {
    let app =
        spawn_with("[server]\nmax_body_bytes = 8192\n[limits]\nmax_event_bytes = 1024\nmax_events_per_request = 3\n")
            .await;
    let session = app.create_session().await;
    let big = "x".repeat(1500);
    let text = json!([{"type": "text", "text": big}]);
    // (view, path, a body whose one message is over the limit)
    let cases = [
        (
            "native",
            format!("/sessions/{session}/events"),
            json!({"events": [{"type": "user.message", "content": big}]}),
        ),
        ("aap", format!("/sessions/{session}/turns"), json!({"messages": [{"role": "user", "content": big}]})),
        (
            "managed",
            format!("/v1/sessions/{session}/events"),
            json!({"events": [{"type": "user.message", "content": text}]}),
        ),
        (
            "harness",
            format!("/v1/agents/sessions/{session}/turns"),
            json!({"input": [{"type": "user.message", "content": big}]}),
        ),
    ];
    for (view, path, body) in cases {
        let (status, refused) = crate::helpers::post_json(&app, &path, body).await;
        assert_eq!(status, 413, "{view}: {refused}");
        let message = refused["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("event 0 (user.message)") && message.contains("limit is 1024"), "{view}: {refused}");
        match view {
            "managed" => assert_eq!(refused["error"]["type"], "request_too_large", "{refused}"),
            _ => assert_eq!(refused["error"]["code"], "payload_too_large", "{view}: {refused}"),
        }
    }
    // AAP takes one user message a turn (or answers to the calls that wait, which the limit
    // always lets through), so only the other three can be sent four events.
    let four = json!({"events": vec![json!({"type": "user.interrupt"}); 4]});
    let input = json!({"input": vec![json!({"type": "user.message", "content": "hi"}); 4]});
    for (path, body) in [
        (format!("/sessions/{session}/events"), &four),
        (format!("/v1/sessions/{session}/events"), &four),
        (format!("/v1/agents/sessions/{session}/turns"), &input),
    ] {
        let (status, refused) = crate::helpers::post_json(&app, &path, body.clone()).await;
        assert_eq!(status, 400, "{path}: {refused}");
        let message = refused["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("at most 3 events per request; this one has 4"), "{path}: {refused}");
    }
    let events = app.all_events(&session).await;
    assert_eq!(events.len(), 1, "nothing but session.created was stored: {events:?}");
    let (status, fits) = crate::helpers::post_json(
        &app,
        &format!("/sessions/{session}/events"),
        json!({"events": [{"type": "user.message", "content": "x".repeat(900)}]}),
    )
    .await;
    assert_eq!(status, 200, "an event within the limit is stored: {fits}");
}
