//! The OpenAPI document as the route table: every route is in it, a method a path does not
//! take is answered 405 with `Allow`, and the authorization matrix (every documented route
//! and method, with no key, a wrong key, another subject's key and the owner's key) is
//! generated from it, so that a new route cannot be left out.

use std::collections::BTreeSet;

use reqwest::Method;
use serde_json::{json, Value};
use turnlog::api::auth::hash_key;

use crate::helpers::{spawn_with, TestApp};

fn keys() -> String {
    format!(
        "[auth]\nkeys = [\n  {{ subject = \"alice\", sha256 = \"{}\" }},\n  {{ subject = \"bob\", sha256 = \"{}\" }},\n]\n",
        hash_key("alice-key"),
        hash_key("bob-key"),
    )
}

async fn document(app: &TestApp) -> Value {
    let response = app.client.get(format!("{}/openapi.json", app.url)).send().await.unwrap();
    assert_eq!(response.status(), 200, "the document needs no key");
    response.json().await.unwrap()
}

const METHODS: [&str; 5] = ["get", "post", "put", "patch", "delete"];

/// Each documented operation: path template, method, operation.
fn operations(document: &Value) -> Vec<(String, String, Value)> {
    let mut all = Vec::new();
    for (path, item) in document["paths"].as_object().unwrap() {
        for method in METHODS {
            if let Some(operation) = item.get(method) {
                all.push((path.clone(), method.to_string(), operation.clone()));
            }
        }
    }
    all
}

#[tokio::test]
async fn the_document_covers_every_view_and_names_each_operation_once() {
    let app = spawn_with(&keys()).await;
    let document = document(&app).await;
    assert_eq!(document["openapi"], "3.1.0");
    let operations = operations(&document);
    let ids: BTreeSet<&str> = operations.iter().map(|(_, _, op)| op["operationId"].as_str().unwrap()).collect();
    assert_eq!(ids.len(), operations.len(), "operation ids are unique");
    for prefix in
        ["/sessions", "/api/v1/cloud/sessions", "/v1/sessions", "/v1/agents/sessions", "/v1/agents", "/console/api"]
    {
        assert!(operations.iter().any(|(path, ..)| path.starts_with(prefix)), "a route under {prefix}");
    }
    for (path, method, operation) in &operations {
        let responses = operation["responses"].as_object().unwrap();
        assert!(responses.keys().any(|s| s.starts_with('2')), "{method} {path} documents its success");
        if path.starts_with("/v1/agents/sessions") {
            assert_eq!(
                responses["412"]["content"]["application/json"]["schema"]["$ref"],
                "#/components/schemas/HarnessError"
            );
        } else if path.starts_with("/v1/") {
            assert_eq!(
                responses["409"]["content"]["application/json"]["schema"]["$ref"],
                "#/components/schemas/ManagedError"
            );
        }
    }
    // Each body names its own schema: the harness's session had the AAP view's (its
    // `CreateSession` took the same name), so the document asked for `agent`, not `agent_name`.
    let body = |path: &str| {
        document["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]["$ref"].clone()
    };
    assert_eq!(body("/v1/agents/sessions"), "#/components/schemas/HarnessCreateSession");
    assert_eq!(body("/sessions"), "#/components/schemas/CreateSession");
    let harness = &document["components"]["schemas"]["HarnessCreateSession"];
    assert_eq!(harness["required"], json!(["agent_name"]), "{harness}");
}

#[tokio::test]
async fn a_method_a_path_does_not_take_is_405_with_allow_in_the_views_shape() {
    let app = spawn_with(&keys()).await;
    let document = document(&app).await;
    for (path, item) in document["paths"].as_object().unwrap() {
        let concrete = path.replace("{file}", "app.js").replace('{', "x").replace('}', "");
        let documented: Vec<String> =
            METHODS.iter().filter(|m| item.get(**m).is_some()).map(|m| m.to_uppercase()).collect();
        for method in METHODS.iter().map(|m| m.to_uppercase()).filter(|m| !documented.contains(m)) {
            let method = Method::from_bytes(method.as_bytes()).unwrap();
            // `/sessions/import` is also `/sessions/{session_id}` (a session named `import`,
            // which is not found): its GET and DELETE go there.
            if concrete == "/sessions/import" && (method == Method::GET || method == Method::DELETE) {
                continue;
            }
            let response = app.client.request(method.clone(), format!("{}{concrete}", app.url)).send().await.unwrap();
            assert_eq!(response.status(), 405, "{method} {path}");
            let allow = response.headers()["allow"].to_str().unwrap().to_string();
            let mut allowed: Vec<&str> = allow.split(", ").collect();
            allowed.sort();
            let mut expected: Vec<&str> = documented.iter().map(String::as_str).collect();
            expected.sort();
            assert_eq!(allowed, expected, "Allow of {path}");
            let body: Value = response.json().await.unwrap();
            if path.starts_with("/v1/") && !path.starts_with("/v1/agents/sessions") {
                // The managed view's shape: no code, the type says it.
                assert_eq!(
                    (&body["type"], &body["error"]["type"]),
                    (&json!("error"), &json!("invalid_request_error")),
                    "{path}"
                );
            } else {
                assert_eq!(body["error"]["code"], "method_not_allowed", "{path}: {body}");
            }
            assert!(body["error"]["message"].as_str().unwrap().contains("does not take"), "{path}: {body}");
        }
    }
}

/// What alice owns, by path parameter.
struct Owned {
    session: String,
    harness_session: String,
    turn: String,
    agent: String,
    environment: String,
    event: String,
}

impl Owned {
    async fn make(app: &TestApp) -> Owned {
        let post = |path: String, body: Value| {
            let request = app.client.post(format!("{}{path}", app.url)).bearer_auth("alice-key").json(&body);
            async move {
                let response = request.send().await.unwrap();
                assert!(response.status().is_success(), "{path}: {}", response.status());
                response.json::<Value>().await.unwrap()
            }
        };
        let session = post("/sessions".into(), json!({"agent": {"name": "default"}})).await["sessionId"]
            .as_str()
            .unwrap()
            .to_string();
        let events = post(
            format!("/sessions/{session}/events"),
            json!({"events": [{"type": "user.define_outcome", "outcome": "o"}]}),
        )
        .await;
        let harness_session = post("/v1/agents/sessions".into(), json!({"agent_name": "default"})).await["data"]["id"]
            .as_str()
            .unwrap()
            .to_string();
        let turn = post(
            format!("/v1/agents/sessions/{harness_session}/turns"),
            json!({"input": [{"type": "user.message", "content": [{"type": "text", "text": "hello"}]}], "stream": false}),
        )
        .await["data"]["id"]
            .as_str()
            .unwrap()
            .to_string();
        let agent = post("/v1/agents".into(), json!({"name": "helper", "model": "scripted"})).await["id"]
            .as_str()
            .unwrap()
            .to_string();
        let environment =
            post("/v1/environments".into(), json!({"name": "env"})).await["id"].as_str().unwrap().to_string();
        let event = events["data"][0]["id"].as_str().unwrap().to_string();
        Owned { session, harness_session, turn, agent, environment, event }
    }

    /// The concrete path, with alice's ids and the operation's required query parameters.
    fn path(&self, template: &str, operation: &Value) -> String {
        let session = if template.starts_with("/v1/agents/sessions") { &self.harness_session } else { &self.session };
        let required = operation["parameters"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|p| p["in"] == "query" && p["required"] == true);
        let query: Vec<String> = required
            .map(|parameter| match parameter["name"].as_str().unwrap() {
                "agent_name" => "agent_name=default".to_string(),
                other => panic!("the matrix has no value for the required query parameter {other} of {template}"),
            })
            .collect();
        let query = if query.is_empty() { String::new() } else { format!("?{}", query.join("&")) };
        let path = template
            .replace("{session_id}", session)
            .replace("{turn_id}", &self.turn)
            .replace("{agent_id}", &self.agent)
            .replace("{environment_id}", &self.environment)
            .replace("{file}", "app.js");
        path + &query
    }

    /// The operation's documented example, with alice's ids in it.
    fn body(&self, operation: &Value) -> Option<Value> {
        let example = operation["requestBody"]["content"]["application/json"]["example"].clone();
        if example.is_null() {
            return None;
        }
        let text = example
            .to_string()
            .replace("AGENT_ID", &self.agent)
            .replace("ENVIRONMENT_ID", &self.environment)
            .replace("evt_01JD0000000000000000000000", &self.event);
        Some(serde_json::from_str(&text).unwrap())
    }

    fn ids(&self) -> [&str; 5] {
        [&self.session, &self.harness_session, &self.turn, &self.agent, &self.environment]
    }
}

/// Public when the document says any caller may come (`security` lists `{}`).
fn public(operation: &Value) -> bool {
    operation["security"]
        .as_array()
        .is_some_and(|options| options.iter().any(|o| o.as_object().is_some_and(|o| o.is_empty())))
}

/// Whether the answer is an SSE stream (which may not end).
fn streams(operation: &Value) -> bool {
    operation["responses"].as_object().unwrap().values().any(|r| r["content"].get("text/event-stream").is_some())
}

/// Only the console's cookie will do (`/console/api/refresh`): a key is not a cookie.
fn cookie_only(operation: &Value) -> bool {
    operation["security"] == json!([{"console": []}])
}

async fn send(app: &TestApp, method: &str, path: &str, key: Option<&str>, body: Option<&Value>) -> reqwest::Response {
    let method = Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
    let mut request = app.client.request(method, format!("{}{path}", app.url)).header("x-turnlog-console", "1");
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    if let Some(body) = body {
        request = request.json(body);
    }
    request.send().await.unwrap()
}

/// What the owner's log holds: its events and its turns, to see that nothing the others
/// sent was stored.
async fn footprint(app: &TestApp, owned: &Owned) -> Vec<Value> {
    let mut all = Vec::new();
    for path in [
        format!("/sessions/{}/events?limit=1000", owned.session),
        format!("/sessions/{}/events?limit=1000", owned.harness_session),
    ] {
        let response = send(app, "get", &path, Some("alice-key"), None).await;
        assert_eq!(response.status(), 200);
        let page: Value = response.json().await.unwrap();
        all.extend(page["data"].as_array().unwrap().iter().cloned());
    }
    all
}

#[tokio::test]
async fn every_route_answers_each_caller_as_it_should() {
    let app = spawn_with(&keys()).await;
    let document = document(&app).await;
    let owned = Owned::make(&app).await;
    let before = footprint(&app, &owned).await;
    let operations = operations(&document);
    let mut checked = 0;
    for (template, method, operation) in &operations {
        let path = owned.path(template, operation);
        let body = owned.body(operation);
        let what = format!("{} {template}", method.to_uppercase());
        if public(operation) {
            continue;
        }
        for key in [None, Some("nope")] {
            let response = send(&app, method, &path, key, body.as_ref()).await;
            assert_eq!(response.status(), 401, "{what} with key {key:?}");
        }
        let response = send(&app, method, &path, Some("bob-key"), body.as_ref()).await;
        let status = response.status().as_u16();
        if cookie_only(operation) {
            assert_eq!(status, 401, "{what} with a key and no cookie");
        } else if template.contains('{') {
            assert_eq!(status, 404, "{what} as another subject");
        } else if template == "/sessions/import" {
            assert_eq!(status, 403, "{what}: admins only");
        } else if streams(operation) {
            // The caller's own sessions as they change: bob's stream opens (and shows his).
            assert_eq!(status, 200, "{what} as bob");
        } else {
            // A collection: bob sees his own, never alice's; what he makes with alice's
            // resources (her agent, her environment) is refused as if they did not exist.
            let text = response.text().await.unwrap();
            let refers = body.as_ref().is_some_and(|b| owned.ids().iter().any(|id| b.to_string().contains(id)));
            if refers {
                assert!(status == 400 || status == 404, "{what} as bob with alice's ids: {status} {text}");
                checked += 1;
                continue;
            }
            assert!(status < 300, "{what} as bob: {status} {text}");
            for id in owned.ids() {
                assert!(!text.contains(id), "{what} showed bob alice's {id}");
            }
        }
        checked += 1;
    }
    assert!(checked >= 50, "the matrix covered {checked} operations");
    assert_eq!(footprint(&app, &owned).await, before, "nothing anyone else sent reached alice's logs");

    // The owner, last: what ends a resource (archive, cancel, delete) after all else.
    let mut ordered: Vec<_> = operations.iter().filter(|(_, _, op)| !public(op)).collect();
    ordered.sort_by_key(|(template, method, _)| match () {
        _ if method == "delete" => 2,
        _ if template.ends_with("/archive") || template.ends_with("/cancel") => 1,
        _ => 0,
    });
    for (template, method, operation) in ordered {
        let mut path = owned.path(template, operation);
        if method == "delete" && template.contains("{session_id}") {
            // Each view's delete, on a session of its own.
            let created =
                send(&app, "post", "/sessions", Some("alice-key"), Some(&json!({"agent": {"name": "default"}}))).await;
            let fresh: Value = created.json().await.unwrap();
            path = path.replace(&owned.session, fresh["sessionId"].as_str().unwrap());
        }
        let body = owned.body(operation);
        let response = send(&app, method, &path, Some("alice-key"), body.as_ref()).await;
        let status = response.status().as_u16();
        let what = format!("{} {template}", method.to_uppercase());
        match template.as_str() {
            "/sessions/import" => assert_eq!(status, 403, "{what}: admins only"),
            _ if cookie_only(operation) => assert_eq!(status, 401, "{what} with a key and no cookie"),
            // The default agent has no MCP servers: a prompt of one is not found, by name.
            t if t.ends_with("/prompts/{server}/{prompt}") => {
                let text = response.text().await.unwrap();
                assert!(status == 404 && text.contains("MCP server"), "{what} as the owner: {status} {text}");
            }
            _ => assert!(status < 300, "{what} as the owner: {status} {}", response.text().await.unwrap()),
        }
    }
}
