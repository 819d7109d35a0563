use serde_json::{json, Value};
use turnlog::api::auth::hash_key;

use crate::helpers::{spawn_app, spawn_with, sse, take, TestApp};

fn keys_config() -> String {
    format!(
        "[auth]\nkeys = [\n  {{ subject = \"alice\", sha256 = \"{}\" }},\n  {{ subject = \"bob\", sha256 = \"{}\" }},\n]\n",
        hash_key("alice-key"),
        hash_key("bob-key"),
    )
}

/// Logs in to the console with `key`: the response and the cookie it set (`name=value`).
async fn login(app: &TestApp, key: &str) -> (reqwest::Response, Option<String>) {
    let response = app
        .client
        .post(format!("{}/console/api/login", app.url))
        .header("x-turnlog-console", "1")
        .json(&json!({"key": key}))
        .send()
        .await
        .unwrap();
    let cookie = response.headers().get("set-cookie").map(|v| v.to_str().unwrap().to_string());
    (response, cookie)
}

fn name_value(set_cookie: &str) -> String {
    set_cookie.split(';').next().unwrap().to_string()
}

#[tokio::test]
async fn the_console_is_served_from_the_binary() {
    let app = spawn_app().await;
    for (path, kind) in [
        ("/console", "text/html"),
        ("/console/", "text/html"),
        ("/console/app.js", "text/javascript"),
        ("/console/net.js", "text/javascript"),
        ("/console/list.js", "text/javascript"),
        ("/console/session.js", "text/javascript"),
        ("/console/replay.js", "text/javascript"),
        ("/console/render.js", "text/javascript"),
        ("/console/sections.js", "text/javascript"),
        ("/console/table.js", "text/javascript"),
        ("/console/style.css", "text/css"),
    ] {
        let response = app.get(path).send().await.unwrap();
        assert_eq!(response.status(), 200, "{path}");
        assert!(response.headers()["content-type"].to_str().unwrap().starts_with(kind), "{path}");
        let csp = response.headers()["content-security-policy"].to_str().unwrap();
        assert!(csp.contains("default-src 'none'") && csp.contains("script-src 'self'"), "{path}: {csp}");
        assert!(!response.text().await.unwrap().trim().is_empty(), "{path} is empty");
    }
    let missing = app.get("/console/secret.txt").send().await.unwrap();
    assert_eq!(missing.status(), 404);
    let body: Value = missing.json().await.unwrap();
    assert_eq!(body["error"]["code"], "not_found");
    // With no keys, the viewer is the admin `local` without logging in.
    let (status, who) = crate::helpers::get_json(&app, "/console/api/whoami").await;
    assert_eq!((status, who["subject"].as_str(), who["open"].as_bool()), (200, Some("local"), Some(true)));
    assert!(who["event_types"].as_array().unwrap().iter().any(|t| t == "agent.message.delta"));
}

#[tokio::test]
async fn a_console_cookie_stands_for_its_key_until_logout_and_writes_need_the_console_header() {
    let mut app = spawn_with(&keys_config()).await;
    let (wrong, cookie) = login(&app, "nope").await;
    assert_eq!((wrong.status().as_u16(), cookie), (401, None));
    let no_header = app
        .client
        .post(format!("{}/console/api/login", app.url))
        .json(&json!({"key": "alice-key"}))
        .send()
        .await
        .unwrap();
    assert_eq!(no_header.status(), 403, "a login must come from the console");
    let (ok, cookie) = login(&app, "alice-key").await;
    assert_eq!(ok.status(), 200);
    let set_cookie = cookie.expect("a cookie");
    for attribute in ["HttpOnly", "SameSite=Strict", "Path=/", "Max-Age="] {
        assert!(set_cookie.contains(attribute), "{set_cookie} lacks {attribute}");
    }
    assert!(!set_cookie.contains("alice-key"), "the key is not in the cookie");
    let cookie = name_value(&set_cookie);
    let who: Value = with_cookie(&app, &cookie, "/console/api/whoami").send().await.unwrap().json().await.unwrap();
    assert_eq!(who["subject"], "alice");

    app.use_key("alice-key");
    let mine = app.create_session().await;
    app.use_key("bob-key");
    let bobs = app.create_session().await;
    assert_eq!(post_with_cookie(&app, &cookie, &mine, false).await, 403, "a cookie write without the header");
    assert_eq!(post_with_cookie(&app, &cookie, &mine, true).await, 200);
    assert_eq!(post_with_cookie(&app, &cookie, &bobs, true).await, 404, "bob's session is not alice's");
    let stream = with_cookie(&app, &cookie, &format!("/sessions/{bobs}/events/stream")).send().await.unwrap();
    assert_eq!(stream.status(), 404);
    app.use_key("alice-key");
    let kinds: Vec<Value> = app.all_events(&mine).await.iter().map(|e| e["type"].clone()).collect();
    assert_eq!(kinds, ["session.created", "user.define_outcome"], "the refused write stored nothing");

    // The cookie's list holds alice's sessions only.
    let list: Value = with_cookie(&app, &cookie, "/console/api/sessions").send().await.unwrap().json().await.unwrap();
    let ids: Vec<&str> = list["sessions"].as_array().unwrap().iter().map(|s| s["id"].as_str().unwrap()).collect();
    assert_eq!(ids, [mine.as_str()]);

    // A forged cookie is refused; the real one survives a restart.
    let forged = cookie.replace(&hex_of("alice"), &hex_of("bob"));
    let refused = app.client.get(format!("{}/console/api/whoami", app.url)).header("cookie", forged).send().await;
    assert_eq!(refused.unwrap().status(), 401);
    app.kill().await;
    app.restart().await;
    let again = app.client.get(format!("{}/console/api/whoami", app.url)).header("cookie", cookie.clone());
    assert_eq!(again.send().await.unwrap().status(), 200, "the cookie outlives a restart");

    let refresh = app
        .client
        .post(format!("{}/console/api/refresh", app.url))
        .header("cookie", cookie.clone())
        .header("x-turnlog-console", "1")
        .send()
        .await
        .unwrap();
    assert_eq!(refresh.status(), 200);
    let renewed = name_value(refresh.headers()["set-cookie"].to_str().unwrap());
    let who: Value = with_cookie(&app, &renewed, "/console/api/whoami").send().await.unwrap().json().await.unwrap();
    assert_eq!(who["subject"], "alice", "the renewed cookie works");
    let logout = app
        .client
        .post(format!("{}/console/api/logout", app.url))
        .header("cookie", cookie.clone())
        .header("x-turnlog-console", "1")
        .send()
        .await
        .unwrap();
    assert_eq!(logout.status(), 204);
    let cleared = logout.headers()["set-cookie"].to_str().unwrap();
    assert!(cleared.starts_with("turnlog_console=;") && cleared.contains("Max-Age=0"), "{cleared}");
}

fn with_cookie(app: &TestApp, cookie: &str, path: &str) -> reqwest::RequestBuilder {
    app.client.get(format!("{}{path}", app.url)).header("cookie", cookie)
}

/// Posts an outcome with the console's cookie (and its header, if `header`): the status.
async fn post_with_cookie(app: &TestApp, cookie: &str, session: &str, header: bool) -> u16 {
    let mut request = app
        .client
        .post(format!("{}/sessions/{session}/events", app.url))
        .header("cookie", cookie)
        .json(&json!({"events": [{"type": "user.define_outcome", "outcome": {"n": 1}}]}));
    if header {
        request = request.header("x-turnlog-console", "1");
    }
    request.send().await.unwrap().status().as_u16()
}

fn hex_of(text: &str) -> String {
    text.bytes().map(|b| format!("{b:02x}")).collect()
}

#[tokio::test]
async fn the_session_stream_shows_the_callers_sessions_as_they_change() {
    let mut app = spawn_with(&keys_config()).await;
    app.use_key("alice-key");
    let changes = app.get("/console/api/sessions/stream").send().await.unwrap();
    let mut changes = sse(changes);
    app.use_key("bob-key");
    app.create_session().await;
    app.use_key("alice-key");
    let session = app.create_session().await;
    // A turn of about a second: far longer than the stream's 100 ms coalescing.
    let turn = json!({"type": "user.message", "content": "/delay 200\n/words 5"});
    assert_eq!(app.post_event(&session, turn).await.status(), 200);
    statuses_until_idle(&mut changes, &session, true).await;
    // A deleted session leaves the list.
    assert_eq!(app.delete(&format!("/sessions/{session}")).send().await.unwrap().status(), 204);
    loop {
        let frame = take(&mut changes, 1, 10).await.remove(0);
        if frame.event == "removed" {
            assert_eq!(frame.data, json!({"id": session}));
            break;
        }
    }
    let session = app.create_session().await;
    assert_eq!(app.post_event(&session, json!({"type": "user.message", "content": "hi"})).await.status(), 200);
    statuses_until_idle(&mut changes, &session, false).await;
    // The list filters by status.
    let (status, idle) = crate::helpers::get_json(&app, "/console/api/sessions?status=idle").await;
    assert_eq!((status, idle["sessions"][0]["id"].as_str()), (200, Some(session.as_str())));
    let (_, running) = crate::helpers::get_json(&app, "/console/api/sessions?status=running").await;
    assert_eq!(running["sessions"], json!([]));
    let (status, bad) = crate::helpers::get_json(&app, "/console/api/sessions?status=asleep").await;
    assert_eq!(status, 400);
    assert!(bad["error"]["message"].as_str().unwrap().contains("`status`"));
}

/// Reads the stream's frames until `session` is idle (after running, if `ran`: frames come
/// per change, coalesced, so a short turn may show only its end); each frame is of
/// `session`, alice's only one.
async fn statuses_until_idle(
    changes: &mut (impl futures_util::Stream<Item = crate::helpers::Sse> + Unpin),
    session: &str,
    ran: bool,
) -> Vec<String> {
    let mut statuses: Vec<String> = Vec::new();
    let done = |statuses: &[String]| {
        statuses.last().is_some_and(|s| s == "idle") && (!ran || statuses.iter().any(|s| s == "running"))
    };
    while !done(&statuses) {
        let frame = take(changes, 1, 10).await.remove(0);
        assert_eq!(frame.event, "session");
        assert_eq!(frame.data["id"], session, "only alice's session: {:?}", frame.data);
        statuses.push(frame.data["status"].as_str().unwrap().to_string());
    }
    statuses
}
