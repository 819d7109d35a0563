use serde_json::{json, Value};
use turnlog::api::auth::hash_key;

use crate::helpers::{launch, spawn_with};

fn keys_config() -> String {
    format!(
        "[auth]\nkeys = [\n  {{ subject = \"alice\", sha256 = \"{}\" }},\n  {{ subject = \"bob\", sha256 = \"{}\" }},\n  {{ subject = \"ops\", sha256 = \"{}\", admin = true }},\n]\n",
        hash_key("alice-key"),
        hash_key("bob-key"),
        hash_key("ops-key")
    )
}

#[tokio::test]
async fn requests_need_a_valid_key_in_either_header() {
    let app = spawn_with(&keys_config()).await;
    let body = json!({"agent": {"name": "default"}});
    let missing = app.client.post(format!("{}/sessions", app.url)).json(&body).send().await.unwrap();
    assert_eq!(missing.status(), 401);
    assert!(missing.text().await.unwrap().contains("Authorization: Bearer"));
    let wrong = app.client.post(format!("{}/sessions", app.url)).bearer_auth("nope").json(&body).send().await.unwrap();
    assert_eq!(wrong.status(), 401);
    let bearer =
        app.client.post(format!("{}/sessions", app.url)).bearer_auth("alice-key").json(&body).send().await.unwrap();
    assert_eq!(bearer.status(), 201);
    let x_api_key = app
        .client
        .post(format!("{}/sessions", app.url))
        .header("x-api-key", "alice-key")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(x_api_key.status(), 201);
    let health = app.client.get(format!("{}/healthz", app.url)).send().await.unwrap();
    assert_eq!(health.status(), 200, "health needs no key");
}

#[tokio::test]
async fn a_session_is_invisible_to_other_subjects_and_visible_to_admins() {
    let mut app = spawn_with(&keys_config()).await;
    app.use_key("alice-key");
    let session = app.create_session().await;
    let first = app.post_outcomes(&session, &["hi".to_string()]).await;
    let first_id = first[0]["id"].as_str().unwrap().to_string();

    app.use_key("bob-key");
    let paths = [
        format!("/sessions/{session}"),
        format!("/sessions/{session}/events"),
        format!("/sessions/{session}/events/stream"),
        format!("/sessions/{session}/events/stream?after_id={first_id}"),
        format!("/api/v1/cloud/sessions/{session}/events"),
    ];
    for path in &paths {
        let response = app.get(path).send().await.unwrap();
        assert_eq!(response.status(), 404, "{path}");
    }
    let post = app.post_event(&session, json!({"type": "user.interrupt"})).await;
    assert_eq!(post.status(), 404);
    assert_eq!(app.delete(&format!("/sessions/{session}")).send().await.unwrap().status(), 404);
    let list: Value = app.get("/sessions").send().await.unwrap().json().await.unwrap();
    assert!(list["sessions"].as_array().unwrap().is_empty(), "bob lists none of alice's sessions");

    app.use_key("ops-key");
    for path in &paths[..3] {
        assert_eq!(app.get(path).send().await.unwrap().status(), 200, "{path}");
    }
    let list: Value = app.get("/sessions").send().await.unwrap().json().await.unwrap();
    assert_eq!(list["sessions"][0]["createdBy"], "alice");

    app.use_key("alice-key");
    assert_eq!(app.all_events(&session).await.len(), 2, "bob's attempts stored nothing");
}

#[tokio::test]
async fn with_no_keys_the_server_refuses_a_public_address() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.toml");
    std::fs::write(&config, "").unwrap();
    let refused = launch(&config, &dir.path().join("data"), "0.0.0.0:0").await;
    let log = refused.expect_err("the server does not start");
    assert!(log.contains("refusing to listen on 0.0.0.0"), "{log}");

    std::fs::write(&config, keys_config()).unwrap();
    let (mut child, url) = launch(&config, &dir.path().join("data"), "0.0.0.0:0").await.expect("starts with keys");
    assert!(url.starts_with("http://0.0.0.0:"));
    child.start_kill().unwrap();
}
