//! The managed-agents view over HTTP against the real binary: one log under every view
//! (an observer on the native stream, the AAP history and `/meta`), the catalog kept across
//! a restart, and errors in Anthropic's shape. (The official SDK drives it in `tests/managed`.)

use serde_json::{json, Value};
use turnlog::api::auth::hash_key;

use crate::helpers::{get_json as get, post_json as post, spawn_with, sse, take, TestApp};

fn config() -> String {
    format!(
        "[auth]\nkeys = [\n  {{ subject = \"alice\", sha256 = \"{}\" }},\n  {{ subject = \"bob\", sha256 = \"{}\" }},\n]\n",
        hash_key("alice-key"),
        hash_key("bob-key"),
    )
}

async fn app() -> TestApp {
    let mut app = spawn_with(&config()).await;
    app.use_key("alice-key");
    app
}

/// An environment, an agent with a custom tool, and a session of it.
async fn session(app: &TestApp) -> (String, String) {
    let (status, env) = post(app, "/v1/environments", json!({"name": "e"})).await;
    assert_eq!(status, 200, "{env}");
    let tool = json!({"type": "custom", "name": "get_weather", "description": "w", "input_schema": {"type": "object"}});
    let (status, agent) = post(app, "/v1/agents", json!({"name": "a", "model": "scripted", "tools": [tool]})).await;
    assert_eq!(status, 200, "{agent}");
    let body = json!({"agent": agent["id"], "environment_id": env["id"]});
    let (status, session) = post(app, "/v1/sessions", body).await;
    assert_eq!(status, 200, "{session}");
    (session["id"].as_str().unwrap().to_string(), agent["id"].as_str().unwrap().to_string())
}

#[tokio::test]
async fn an_observer_on_the_native_stream_sees_a_managed_session_live() {
    let app = app().await;
    let (session, _) = session(&app).await;
    let mut native = sse(app.stream(&session, None, None).await);
    let created = take(&mut native, 1, 10).await;
    assert_eq!(created[0].event, "session.created");

    let message = json!({"type": "user.message", "content": [{"type": "text", "text": "watched"}]});
    let (status, sent) = post(&app, &format!("/v1/sessions/{session}/events"), json!({"events": [message]})).await;
    assert_eq!(status, 200, "{sent}");
    let mut seen = Vec::new();
    while seen.last().is_none_or(|e: &crate::helpers::Sse| e.event != "session.status_idle") {
        seen.extend(take(&mut native, 1, 10).await);
    }
    let kinds: Vec<&str> = seen.iter().map(|e| e.event.as_str()).filter(|k| !k.ends_with(".delta")).collect();
    assert_eq!(
        kinds,
        [
            "turn.started",
            "user.message",
            "session.status_running",
            "span.model_request_start",
            "agent.message",
            "span.model_request_end",
            "session.status_idle"
        ]
    );
    assert_eq!(seen[1].id, sent["data"][0]["id"], "the event the managed view echoed is the log's");

    let (_, history) = get(&app, &format!("/sessions/{session}/history?type=full")).await;
    assert_eq!(
        history["history"]["full"],
        json!([{"role": "user", "content": "watched"}, {"role": "assistant", "content": "echo: watched"}])
    );
}

#[tokio::test]
async fn agents_and_environments_are_real_and_survive_a_restart() {
    let mut app = app().await;
    let (session, agent) = session(&app).await;
    let meta: Value = app.get("/meta").send().await.unwrap().json().await.unwrap();
    let listed = meta["agents"].as_array().unwrap().iter().find(|a| a["name"] == agent.as_str());
    assert_eq!(listed.expect("the AAP lists an agent made through /v1/agents")["title"], "a");
    let (status, updated) = post(&app, &format!("/v1/agents/{agent}"), json!({"version": 1, "system": "S"})).await;
    assert_eq!((status, updated["version"].clone()), (200, json!(2)));
    let (status, stale) = post(&app, &format!("/v1/agents/{agent}"), json!({"version": 1, "system": "T"})).await;
    assert_eq!(status, 409, "{stale}");

    app.terminate().await;
    app.restart().await;
    let (status, fetched) = get(&app, &format!("/v1/agents/{agent}?version=1")).await;
    assert_eq!((status, fetched["version"].clone(), fetched["system"].clone()), (200, json!(1), Value::Null));
    let (_, latest) = get(&app, &format!("/v1/agents/{agent}")).await;
    assert_eq!((latest["version"].clone(), latest["system"].clone()), (json!(2), json!("S")));
    let (_, versions) = get(&app, &format!("/v1/agents/{agent}/versions")).await;
    assert_eq!(versions["data"].as_array().unwrap().len(), 2);
    let (status, resumed) = get(&app, &format!("/v1/sessions/{session}")).await;
    assert_eq!((status, resumed["agent"]["version"].clone()), (200, json!(1)), "a session keeps its version");
    let message = json!({"type": "user.message", "content": [{"type": "text", "text": "after"}]});
    let (status, _) = post(&app, &format!("/v1/sessions/{session}/events"), json!({"events": [message]})).await;
    assert_eq!(status, 200, "the agent runs after the restart");
}

#[tokio::test]
async fn errors_are_in_anthropics_shape_and_store_nothing() {
    let app = app().await;
    let (session, _) = session(&app).await;
    let events = format!("/v1/sessions/{session}/events");
    let error = |body: &Value| (body["type"].clone(), body["error"]["type"].clone());

    let (status, body) =
        post(&app, &events, json!({"events": [{"type": "user.message", "content": "x", "extra": 1}]})).await;
    assert_eq!((status, error(&body)), (400, (json!("error"), json!("invalid_request_error"))));
    assert!(body["error"]["message"].as_str().unwrap().contains("extra"), "{body}");
    let (status, body) = post(&app, &events, json!({"event": []})).await;
    assert_eq!(status, 400);
    assert!(body["error"]["message"].as_str().unwrap().contains("event"), "{body}");
    let response = app.post(&events).header("content-type", "application/json").body("{").send().await.unwrap();
    assert_eq!(response.status(), 400);
    let body: Value = response.json().await.unwrap();
    assert_eq!(
        error(&body),
        (json!("error"), json!("invalid_request_error")),
        "a broken body answers in the view's shape"
    );
    // Which agents exist is the server's to say: one that is not there is not found.
    let (status, body) = post(&app, "/v1/sessions", json!({"agent": "nobody", "environment_id": "env_x"})).await;
    assert_eq!((status, error(&body)), (404, (json!("error"), json!("not_found_error"))));
    assert!(body["error"]["message"].as_str().unwrap().contains("nobody"), "{body}");
    let (status, body) = post(
        &app,
        "/v1/agents",
        json!({"name": "t", "model": "scripted", "tools": [{"type": "agent_toolset_20260401"}]}),
    )
    .await;
    assert_eq!(status, 400);
    assert!(body["error"]["message"].as_str().unwrap().contains("tools[0].type"), "{body}");

    // Input the new session would refuse is refused before the session is made.
    let (_, sessions) = get(&app, "/v1/sessions?limit=100").await;
    let huge = json!({"type": "user.message", "content": [{"type": "text", "text": "x".repeat(1 << 20)}]});
    let (_, agent) = get(&app, &format!("/v1/sessions/{session}")).await;
    let body =
        json!({"agent": agent["agent"]["id"], "environment_id": agent["environment_id"], "initial_events": [huge]});
    let (status, refused) = post(&app, "/v1/sessions", body).await;
    assert_eq!((status, error(&refused)), (413, (json!("error"), json!("request_too_large"))), "{refused:.300}");
    let (_, after) = get(&app, "/v1/sessions?limit=100").await;
    assert_eq!(after["data"], sessions["data"], "no session was made");

    let (status, body) = get(&app, "/v1/sessions/sess_01J00000000000000000000000").await;
    assert_eq!((status, error(&body)), (404, (json!("error"), json!("not_found_error"))));
    let (status, body) = get(&app, "/v1/nothing/here").await;
    assert_eq!((status, error(&body)), (404, (json!("error"), json!("not_found_error"))));
    let unauthenticated = app.client.get(format!("{}/v1/sessions", app.url)).send().await.unwrap();
    assert_eq!(unauthenticated.status(), 401);
    let body: Value = unauthenticated.json().await.unwrap();
    assert_eq!(error(&body), (json!("error"), json!("authentication_error")));

    let mut bob = app.client.get(format!("{}/v1/sessions/{session}?beta=true", app.url));
    bob = bob.header("x-api-key", "bob-key").header("anthropic-version", "2023-06-01");
    assert_eq!(bob.send().await.unwrap().status(), 404, "another subject gets 404");

    let call = json!({"type": "user.message", "content": [{"type": "text", "text": "/tool get_weather {}"}]});
    let mut stream = sse(app.get(&format!("{events}/stream")).send().await.unwrap());
    assert_eq!(post(&app, &events, json!({"events": [call]})).await.0, 200);
    while take(&mut stream, 1, 10).await[0].event != "session.status_idle" {}
    let before = app.get(&format!("{events}?limit=1000")).send().await.unwrap().json::<Value>().await.unwrap();
    let busy = json!({"type": "user.message", "content": [{"type": "text", "text": "hello?"}]});
    let response = app.post(&events).json(&json!({"events": [busy]})).send().await.unwrap();
    assert_eq!(response.status(), 409);
    assert_eq!(response.headers()["x-should-retry"], "false");
    let after = app.get(&format!("{events}?limit=1000")).send().await.unwrap().json::<Value>().await.unwrap();
    assert_eq!(before["data"], after["data"], "nothing refused was stored");
}

#[tokio::test]
async fn the_managed_stream_is_live_unless_given_a_cursor_and_resumes_exactly() {
    let app = app().await;
    let (session, _) = session(&app).await;
    let events = format!("/v1/sessions/{session}/events");
    let message =
        |text: &str| json!({"events": [{"type": "user.message", "content": [{"type": "text", "text": text}]}]});
    let mut first = sse(app.get(&format!("{events}/stream")).send().await.unwrap());
    assert_eq!(post(&app, &events, message("one")).await.0, 200);
    let seen = take(&mut first, 6, 10).await;
    assert_eq!(seen[0].event, "user.message", "live from connect: nothing of the session before");
    assert_eq!(seen.last().unwrap().event, "session.status_idle");
    drop(first);

    // Resume after the third frame from the log: exactly the rest, then what comes next.
    let cursor = &seen[2].id;
    let resumed = app.get(&format!("{events}/stream")).header("last-event-id", cursor).send().await.unwrap();
    let mut resumed = sse(resumed);
    let replayed = take(&mut resumed, 3, 10).await;
    let ids = |frames: &[crate::helpers::Sse]| frames.iter().map(|f| f.id.clone()).collect::<Vec<_>>();
    assert_eq!(ids(&replayed), ids(&seen[3..]));
    assert_eq!(post(&app, &events, message("two")).await.0, 200);
    assert_eq!(take(&mut resumed, 1, 10).await[0].data["content"][0]["text"], "two");
    let unknown = app.get(&format!("{events}/stream?after_id=evt_nope")).send().await.unwrap();
    assert_eq!(unknown.status(), 409, "a cursor not in this log is refused, never skipped");
    assert_eq!(unknown.json::<Value>().await.unwrap()["error"]["type"], "invalid_request_error");
}

#[tokio::test]
async fn an_agents_model_id_picks_a_model_from_config() {
    let config = format!("{}\n[models.echo-large]\nprovider = \"scripted\"\nname = \"echo-large\"\n", config());
    let mut app = spawn_with(&config).await;
    app.use_key("alice-key");
    let (status, unknown) = post(&app, "/v1/agents", json!({"name": "x", "model": "gpt-nine"})).await;
    assert_eq!(status, 400);
    let message = unknown["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("gpt-nine") && message.contains("echo-large") && message.contains("scripted"),
        "{message}"
    );

    let (_, env) = post(&app, "/v1/environments", json!({"name": "e"})).await;
    let (_, agent) = post(&app, "/v1/agents", json!({"name": "big", "model": {"id": "echo-large"}})).await;
    assert_eq!(agent["model"], json!({"id": "echo-large"}));
    let (_, session) = post(&app, "/v1/sessions", json!({"agent": agent["id"], "environment_id": env["id"]})).await;
    let session = session["id"].as_str().unwrap();
    let mut native = sse(app.stream(session, None, None).await);
    let message = json!({"type": "user.message", "content": [{"type": "text", "text": "hi"}]});
    assert_eq!(post(&app, &format!("/v1/sessions/{session}/events"), json!({"events": [message]})).await.0, 200);
    loop {
        let frame = take(&mut native, 1, 10).await.remove(0);
        if frame.event == "span.model_request_start" {
            assert_eq!(frame.data["model"], "echo-large", "the turn ran the configured model");
            break;
        }
    }
}

#[tokio::test]
async fn two_changes_of_one_agent_version_cannot_both_land() {
    let app = app().await;
    let (_, agent) = session(&app).await;
    for round in 1..=5u32 {
        let path = format!("/v1/agents/{agent}");
        let change = |name: &str| json!({"version": round, "name": name});
        let (a, b) = tokio::join!(post(&app, &path, change("a")), post(&app, &path, change("b")));
        let mut statuses = [a.0, b.0];
        statuses.sort();
        assert_eq!(statuses, [200, 409], "round {round}: exactly one change lands");
        let winner = if a.0 == 200 { a.1 } else { b.1 };
        let (_, latest) = get(&app, &path).await;
        assert_eq!((latest["version"].clone(), latest["name"].clone()), (json!(round + 1), winner["name"].clone()));
    }
    let (_, versions) = get(&app, &format!("/v1/agents/{agent}/versions?limit=100")).await;
    assert_eq!(versions["data"].as_array().unwrap().len(), 6, "one version per landed change");
}

#[tokio::test]
async fn a_stream_resumes_after_a_message_id() {
    let app = app().await;
    let (session, _) = session(&app).await;
    let events = format!("/v1/sessions/{session}/events");
    let message = json!({"events": [{"type": "user.message", "content": [{"type": "text", "text": "hi"}]}]});
    let mut live = sse(app.get(&format!("{events}/stream")).send().await.unwrap());
    assert_eq!(post(&app, &events, message).await.0, 200);
    let seen = take(&mut live, 6, 10).await;
    let reply = seen.iter().position(|f| f.event == "agent.message").unwrap();
    let message_id = seen[reply].data["id"].as_str().unwrap().to_string();
    assert!(message_id.starts_with("msg_"), "a message shows by its message id: {message_id}");
    let resumed = app.get(&format!("{events}/stream?after_id={message_id}")).send().await.unwrap();
    let next = take(&mut sse(resumed), 2, 10).await;
    let ids = |frames: &[crate::helpers::Sse]| frames.iter().map(|f| f.id.clone()).collect::<Vec<_>>();
    assert_eq!(ids(&next), ids(&seen[reply + 1..reply + 3]), "resumed right after that message");
}

#[tokio::test]
async fn agents_and_environments_belong_to_who_made_them() {
    let mut app = app().await;
    let (_, agent) = session(&app).await;
    let (_, env) = post(&app, "/v1/environments", json!({"name": "mine"})).await;
    let env = env["id"].as_str().unwrap().to_string();
    let meta = |key: Option<&str>| {
        let mut request = app.client.get(format!("{}/meta", app.url));
        if let Some(key) = key {
            request = request.bearer_auth(key);
        }
        async move {
            let meta: Value = request.send().await.unwrap().json().await.unwrap();
            meta["agents"]
                .as_array()
                .unwrap()
                .iter()
                .map(|a| a["name"].as_str().unwrap().to_string())
                .collect::<Vec<_>>()
        }
    };
    assert!(meta(Some("alice-key")).await.contains(&agent));
    assert!(!meta(Some("bob-key")).await.contains(&agent), "another subject does not see it");
    assert!(!meta(None).await.contains(&agent), "nor does a caller without a key");

    app.use_key("bob-key");
    for path in
        [format!("/v1/agents/{agent}"), format!("/v1/agents/{agent}/versions"), format!("/v1/environments/{env}")]
    {
        assert_eq!(get(&app, &path).await.0, 404, "{path}");
    }
    assert_eq!(post(&app, &format!("/v1/agents/{agent}"), json!({"name": "taken"})).await.0, 404);
    assert_eq!(post(&app, &format!("/v1/environments/{env}/archive"), json!({})).await.0, 404);
    let (_, listed) = get(&app, "/v1/agents").await;
    assert!(listed["data"].as_array().unwrap().iter().all(|a| a["id"] != agent.as_str()));
    let (_, own_env) = post(&app, "/v1/environments", json!({"name": "bob's"})).await;
    let (status, _) = post(&app, "/v1/sessions", json!({"agent": agent, "environment_id": own_env["id"]})).await;
    assert_eq!(status, 404, "nor may it start a session of another's agent: it is not found");
    let (status, _) = post(&app, "/v1/sessions", json!({"agent": "default", "environment_id": env})).await;
    assert_eq!(status, 404, "or in another's environment");
    assert_eq!(
        post(&app, "/v1/agents/default", json!({"name": "mine now"})).await.0,
        404,
        "configured agents are not the catalog's"
    );
}

/// Found by schemathesis: a `types[]` filter that leaves nothing to show answered 200 before
/// the rest of the query was read.
#[tokio::test]
async fn an_event_list_checks_its_whole_query_even_when_no_type_is_shown() {
    let app = app().await;
    let (session, _) = session(&app).await;
    let (status, page) = get(&app, &format!("/v1/sessions/{session}/events?types[]=nothing")).await;
    assert_eq!((status, page["data"].clone()), (200, json!([])));
    for (query, expected) in [("types[]=nothing&created_at[gte]=yesterday", 400), ("types[]=nothing&page=nope", 409)] {
        let (status, error) = get(&app, &format!("/v1/sessions/{session}/events?{query}")).await;
        assert_eq!(status, expected, "{query}: {error}");
        assert_eq!(error["type"], "error");
    }
}
