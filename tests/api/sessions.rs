use serde_json::{json, Value};

use crate::helpers::{spawn_app, spawn_with};

#[tokio::test]
async fn a_created_session_can_be_read_listed_and_deleted() {
    let app = spawn_with(
        "[agents.opt]\nmodel = { provider = \"scripted\" }\noptions = [\n  { type = \"text\", name = \"tone\", default = \"plain\" },\n  { type = \"secret\", name = \"token\" },\n]\n",
    )
    .await;
    let response = app
        .post("/sessions")
        .json(&json!({"agent": {"name": "opt", "options": {"tone": "dry", "token": "hunter2"}}, "title": "t1"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 201);
    let id = response.json::<Value>().await.unwrap()["sessionId"].as_str().unwrap().to_string();
    assert!(id.starts_with("sess_"));

    let session: Value = app.get(&format!("/sessions/{id}")).send().await.unwrap().json().await.unwrap();
    assert_eq!(session["sessionId"], id);
    assert_eq!(session["agent"]["name"], "opt");
    assert_eq!(session["agent"]["options"]["tone"], "dry");
    assert_eq!(session["agent"]["options"]["token"], "***", "secret options are redacted");
    assert_eq!(session["title"], "t1");

    let events = app.all_events(&id).await;
    assert_eq!(events.len(), 1);
    assert_eq!(events[0]["type"], "session.created");
    assert_eq!(events[0]["sequence_number"], 1);

    let deleted = app.delete(&format!("/sessions/{id}")).send().await.unwrap();
    assert_eq!(deleted.status(), 204);
    for path in [format!("/sessions/{id}"), format!("/sessions/{id}/events"), format!("/sessions/{id}/events/stream")] {
        let response = app.get(&path).send().await.unwrap();
        assert_eq!(response.status(), 404, "{path}");
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["error"]["code"], "session_not_found");
    }
    assert_eq!(app.delete(&format!("/sessions/{id}")).send().await.unwrap().status(), 404);
    let list: Value = app.get("/sessions").send().await.unwrap().json().await.unwrap();
    assert_eq!(list["sessions"].as_array().unwrap().len(), 0);
}

#[tokio::test]
async fn sessions_list_newest_first_with_a_cursor_and_filters() {
    let app = spawn_with("[agents.other]\nmodel = { provider = \"scripted\" }\n").await;
    let mut made = Vec::new();
    for i in 0..5 {
        let agent = if i % 2 == 0 { "default" } else { "other" };
        let response = app.post("/sessions").json(&json!({"agent": {"name": agent}})).send().await.unwrap();
        made.push(response.json::<Value>().await.unwrap()["sessionId"].as_str().unwrap().to_string());
    }
    let newest_first: Vec<String> = made.iter().rev().cloned().collect();

    let mut seen = Vec::new();
    let mut path = "/sessions?limit=2".to_string();
    loop {
        let page: Value = app.get(&path).send().await.unwrap().json().await.unwrap();
        seen.extend(page["sessions"].as_array().unwrap().iter().map(|s| s["sessionId"].as_str().unwrap().to_string()));
        match page["next"].as_str() {
            Some(next) => path = format!("/sessions?limit=2&after={next}"),
            None => break,
        }
    }
    assert_eq!(seen, newest_first);

    let page: Value = app.get("/sessions?agent=other").send().await.unwrap().json().await.unwrap();
    let others: Vec<&str> =
        page["sessions"].as_array().unwrap().iter().map(|s| s["sessionId"].as_str().unwrap()).collect();
    assert_eq!(others, vec![made[3].as_str(), made[1].as_str()]);

    let page: Value = app.get("/sessions?created_by=someone-else").send().await.unwrap().json().await.unwrap();
    assert!(page["sessions"].as_array().unwrap().is_empty());

    let third: Value = app.get(&format!("/sessions/{}", made[2])).send().await.unwrap().json().await.unwrap();
    let created = third["createdAt"].as_str().unwrap();
    let page: Value = app
        .get(&format!("/sessions?created_after={}", created.replace('+', "%2B")))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let after: Vec<&str> =
        page["sessions"].as_array().unwrap().iter().map(|s| s["sessionId"].as_str().unwrap()).collect();
    assert_eq!(after, vec![made[4].as_str(), made[3].as_str()]);

    let bad = app.get("/sessions?created_after=yesterday").send().await.unwrap();
    assert_eq!(bad.status(), 400);
    assert!(bad.text().await.unwrap().contains("created_after"));
}

#[tokio::test]
async fn creating_a_session_checks_the_body() {
    let app = spawn_app().await;
    let cases = [
        (json!({}), "agent"),
        (json!({"agent": {}}), "name"),
        (json!({"agent": {"name": ""}}), "agent.name"),
        (json!({"agent": {"name": 7}}), "invalid field `agent.name`: invalid type: integer `7`"),
        // serde reads a struct from an array; a request does not.
        (json!([{"name": "default"}]), "a JSON object is required"),
        (json!({"agent": ["default"]}), "invalid field `agent`: expected an object"),
        (json!({"agent": {"name": "default"}, "tools": [["t"]]}), "invalid field `tools`"),
    ];
    for (body, field) in cases {
        let response = app.post("/sessions").json(&body).send().await.unwrap();
        assert_eq!(response.status(), 400, "{body}");
        let error: Value = response.json().await.unwrap();
        assert!(error["error"]["message"].as_str().unwrap().contains(field), "{error} should name {field}");
    }
    let response = app.post("/sessions").body("{not json").send().await.unwrap();
    assert_eq!(response.status(), 400);
    assert_eq!(response.json::<Value>().await.unwrap()["error"]["code"], "invalid_json");
}
