//! The audit tools on the real binary: export, import and verify (of files and data dirs,
//! tampered with), tail across a SIGKILL and restart, replay's pace, and fork.

use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

use crate::helpers::{ids, launch, spawn_app, TestApp};

fn turnlog() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_turnlog"));
    command.env("RUST_LOG", "warn").kill_on_drop(true);
    command
}

/// Runs `turnlog ARGS`: its output, once it exits.
async fn run(args: &[&str]) -> Output {
    let output = tokio::time::timeout(Duration::from_secs(60), turnlog().args(args).output()).await;
    output.expect("the command ends").expect("the command runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A turn through the AAP turn API, answered once it has ended.
async fn turn(app: &TestApp, session: &str, message: &str) -> Value {
    let body = json!({"stream": "none", "messages": [{"role": "user", "content": message}]});
    let response = app.post(&format!("/sessions/{session}/turns")).json(&body).send().await.unwrap();
    assert_eq!(response.status(), 200);
    response.json().await.unwrap()
}

fn path_str(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// A copy of a data dir.
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// The key and stored bytes of event `seq` of the only session in a data dir's events.
fn stored_event(db: &sled::Db, seq: u64) -> (sled::IVec, Vec<u8>) {
    let events = db.open_tree("events").unwrap();
    let needle = format!("\"sequence_number\":{seq},");
    events
        .iter()
        .map(Result::unwrap)
        .find(|(_, value)| text(value).contains(&needle))
        .map(|(key, value)| (key, value.to_vec()))
        .expect("the event is stored")
}

#[tokio::test]
async fn export_import_round_trips_and_verify_names_the_first_broken_link() {
    let mut app = spawn_app().await;
    let session = app.create_session().await;
    turn(&app, &session, "/words 5").await;
    turn(&app, &session, "hello there").await;
    let stored = app.all_events(&session).await;
    let (_, head) = crate::helpers::get_json(&app, &format!("/sessions/{session}/audit")).await;
    assert_eq!(head["sequence_number"], stored.len());
    assert_eq!(head["last_id"], stored.last().unwrap()["id"]);
    app.terminate().await;
    let data = app.data_dir();
    let work = tempfile::tempdir().unwrap();
    let exported = work.path().join("export.jsonl");

    let out = run(&["export", "--data-dir", path_str(&data), "-o", path_str(&exported)]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let lines: Vec<Value> =
        std::fs::read_to_string(&exported).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), stored.len());
    assert_eq!(lines.iter().map(|l| l["event"]["id"].clone()).collect::<Vec<_>>(), ids(&stored));
    assert_eq!(lines.last().unwrap()["hash"], head["hash"], "the audit head is the last line's hash");
    let verified = run(&["verify", path_str(&exported)]).await;
    assert!(verified.status.success(), "{}", text(&verified.stderr));

    // Into another data dir, byte for byte; a second import changes nothing.
    let other = work.path().join("other");
    let out = run(&["import", "--data-dir", path_str(&other), path_str(&exported)]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let again = work.path().join("again.jsonl");
    assert!(run(&["export", "--data-dir", path_str(&other), "-o", path_str(&again)]).await.status.success());
    assert_eq!(std::fs::read(&again).unwrap(), std::fs::read(&exported).unwrap(), "byte-identical");
    let twice = run(&["import", "--data-dir", path_str(&other), path_str(&exported)]).await;
    assert!(twice.status.success() && text(&twice.stderr).contains("already there"), "{}", text(&twice.stderr));
    assert!(run(&["verify", "--data-dir", path_str(&other)]).await.status.success());

    // A file with one byte changed in event 3: verify names it, import refuses it.
    let original = std::fs::read_to_string(&exported).unwrap();
    let mut edited: Vec<String> = original.lines().map(String::from).collect();
    edited[2] = edited[2].replacen("/words 5", "/words 6", 1);
    assert_ne!(edited[2], original.lines().nth(2).unwrap());
    let tampered = work.path().join("tampered.jsonl");
    std::fs::write(&tampered, edited.join("\n") + "\n").unwrap();
    let out = run(&["verify", path_str(&tampered)]).await;
    assert_eq!(out.status.code(), Some(1));
    let said = text(&out.stderr);
    assert!(said.contains(&format!("session {session}, sequence number 3:")), "{said}");
    assert!(said.contains(lines[2]["hash"].as_str().unwrap()), "names the hash the chain expected: {said}");
    let refused = run(&["import", "--data-dir", path_str(&work.path().join("third")), path_str(&tampered)]).await;
    assert_eq!(refused.status.code(), Some(1), "{}", text(&refused.stderr));
    // The other data dir holds the session with other events: a changed file is refused.
    // (Cut after the first turn's end: a log that stops mid-turn is refused for that.)
    let mut other_events = original.lines().map(String::from).collect::<Vec<_>>();
    let first_idle = other_events.iter().position(|l| l.contains("\"type\":\"session.status_idle\"")).unwrap();
    let mid_turn = work.path().join("mid-turn.jsonl");
    std::fs::write(&mid_turn, other_events[..first_idle].join("\n") + "\n").unwrap();
    let running = run(&["import", "--data-dir", path_str(&work.path().join("fourth")), path_str(&mid_turn)]).await;
    assert_eq!(running.status.code(), Some(1));
    assert!(text(&running.stderr).contains("has a turn running"), "{}", text(&running.stderr));
    other_events.truncate(first_idle + 1);
    let shorter = work.path().join("shorter.jsonl");
    std::fs::write(&shorter, other_events.join("\n") + "\n").unwrap();
    let exists = run(&["import", "--data-dir", path_str(&other), path_str(&shorter)]).await;
    assert_eq!(exists.status.code(), Some(1));
    assert!(text(&exists.stderr).contains("already exists with different content"), "{}", text(&exists.stderr));
    // A truncated line is bad input, named by its number.
    let cut = work.path().join("cut.jsonl");
    std::fs::write(&cut, &original[..original.find('\n').unwrap() + 40]).unwrap();
    let out = run(&["verify", path_str(&cut)]).await;
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("line 2"), "{}", text(&out.stderr));
    let out = run(&["verify", path_str(&work.path().join("missing.jsonl"))]).await;
    assert_eq!(out.status.code(), Some(2));

    // One byte flipped in one stored event of a copy of the data dir: verify finds that event.
    let flipped = work.path().join("flipped");
    copy_dir(&data, &flipped);
    {
        let db = sled::open(&flipped).unwrap();
        let (key, mut value) = stored_event(&db, 5);
        // In the event's JSON, before the chain hash and the zero byte stored after it.
        let at = value.len() - 33 - 3;
        assert_eq!(value[value.len() - 34], b'}');
        value[at] ^= 0x01;
        db.open_tree("events").unwrap().insert(key, value).unwrap();
        db.flush().unwrap();
    }
    let out = run(&["verify", "--data-dir", path_str(&flipped)]).await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let said = text(&out.stderr);
    assert!(said.contains(&format!("session {session}, sequence number 5: its bytes")), "{said}");
    // One event deleted from another copy: verify finds where the gap is.
    let deleted = work.path().join("deleted");
    copy_dir(&data, &deleted);
    {
        let db = sled::open(&deleted).unwrap();
        let (key, _) = stored_event(&db, 7);
        db.open_tree("events").unwrap().remove(key).unwrap();
        db.flush().unwrap();
    }
    let out = run(&["verify", "--data-dir", path_str(&deleted)]).await;
    assert_eq!(out.status.code(), Some(1));
    let said = text(&out.stderr);
    assert!(said.contains(&format!("session {session}, sequence number 8: events are missing")), "{said}");
    // The source is untouched by all of it.
    assert!(run(&["verify", "--data-dir", path_str(&data)]).await.status.success());
}

#[tokio::test]
async fn tail_follows_a_session_across_a_sigkill_and_restart_with_no_gap_and_no_duplicate() {
    let mut app = spawn_app().await;
    let session = app.create_session().await;
    app.post_outcomes(&session, &["a".into(), "b".into()]).await;
    let mut tail = turnlog()
        .args(["tail", &session, "--server", &app.url, "--json"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(tail.stdout.take().unwrap()).lines();
    let mut seen: Vec<Value> = Vec::new();
    while seen.len() < 3 {
        let line = tokio::time::timeout(Duration::from_secs(20), lines.next_line()).await;
        let line = line.expect("tail prints within 20 s").unwrap().expect("tail is still running");
        seen.push(serde_json::from_str(&line).unwrap());
    }
    // Killed and restarted on the same port, while tail keeps trying.
    let addr = app.url.trim_start_matches("http://").to_string();
    app.kill().await;
    let config = app.dir.path().join("config.toml");
    let (child, url) = restart_on(&config, &app.data_dir(), &addr).await;
    assert_eq!(url, app.url);
    app.restarted(child, url);
    app.post_outcomes(&session, &["c".into(), "d".into()]).await;
    let log = app.all_events(&session).await;
    // Tail has reconnected and caught up; then the session ends.
    while seen.len() < log.len() {
        let line = tokio::time::timeout(Duration::from_secs(20), lines.next_line()).await;
        let line = line.expect("tail catches up within 20 s").unwrap().expect("tail is still running");
        seen.push(serde_json::from_str(&line).unwrap());
    }
    assert_eq!(app.delete(&format!("/sessions/{session}")).send().await.unwrap().status(), 204);
    // Tail ends with the session: everything it printed, once each, in order.
    while let Some(line) = tokio::time::timeout(Duration::from_secs(20), lines.next_line()).await.unwrap().unwrap() {
        seen.push(serde_json::from_str(&line).unwrap());
    }
    let out = tokio::time::timeout(Duration::from_secs(20), tail.wait_with_output()).await.unwrap().unwrap();
    assert!(out.status.success(), "tail ends with the session: {}", text(&out.stderr));
    assert_eq!(ids(&seen[..log.len()]), ids(&log), "every event once, in order");
    let ending: Vec<&str> = seen[log.len()..].iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(ending, ["session.deleted", "terminated"]);
    let seqs: Vec<u64> = seen.iter().map(|e| e["sequence_number"].as_u64().unwrap()).collect();
    assert_eq!(seqs, (1..=seen.len() as u64).collect::<Vec<_>>(), "no gap, no duplicate");
    app.terminate().await;
}

/// Starts the server again on `addr`, retrying while the port is still held.
async fn restart_on(config: &Path, data: &Path, addr: &str) -> (tokio::process::Child, String) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        match launch(config, data, addr).await {
            Ok(started) => return started,
            Err(log) if Instant::now() < deadline => {
                assert!(log.contains("could not listen") || log.is_empty(), "{log}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(log) => panic!("the server did not restart on {addr}: {log}"),
        }
    }
}

/// Runs `turnlog replay ... --json`: the events it printed, and the time from its first line
/// to its last (so that starting the process does not count).
async fn replay_lines(args: &[&str]) -> (Vec<Value>, Duration) {
    let mut replay = turnlog().args(args).stdout(std::process::Stdio::piped()).spawn().unwrap();
    let mut lines = BufReader::new(replay.stdout.take().unwrap()).lines();
    let (mut first, mut replayed) = (None, Vec::new());
    while let Some(line) = lines.next_line().await.unwrap() {
        first.get_or_insert_with(Instant::now);
        replayed.push(serde_json::from_str::<Value>(&line).unwrap());
    }
    assert!(replay.wait().await.unwrap().success(), "turnlog {args:?}");
    (replayed, first.expect("a line").elapsed())
}

#[tokio::test]
async fn replay_keeps_the_original_pace_divided_by_the_speed() {
    let mut app = spawn_app().await;
    let session = app.create_session().await;
    turn(&app, &session, "/delay 200\n/words 12").await;
    let events = app.all_events(&session).await;
    let time = |e: &Value| e["created_at"].as_str().unwrap().parse::<chrono::DateTime<chrono::Utc>>().unwrap();
    let span = (time(events.last().unwrap()) - time(&events[0])).to_std().unwrap();
    assert!(span >= Duration::from_millis(2200), "the log spans {span:?}");
    // About a tenth of the span; well under the whole span, so that a replay at the
    // original pace (the speed ignored) fails, with room for a loaded machine.
    let expected = span / 10;
    let paced = |took: Duration| took >= expected.mul_f64(0.9) && took <= expected + span / 2;
    let (replayed, took) = replay_lines(&["replay", &session, "--server", &app.url, "--speed", "10", "--json"]).await;
    assert_eq!(replayed, events, "every event, in order, as the log has it");
    assert!(paced(took), "took {took:?}, expected about {expected:?}");
    let bad = run(&["replay", &session, "--server", &app.url, "--speed", "0"]).await;
    assert_eq!(bad.status.code(), Some(2));

    // The same as a stream of native frames, for any SSE client.
    let response = app.get(&format!("/sessions/{session}/replay?speed=10")).send().await.unwrap();
    let mut frames = crate::helpers::sse(response);
    let (mut first, mut streamed) = (None, Vec::new());
    while let Some(frame) = futures_util::StreamExt::next(&mut frames).await {
        first.get_or_insert_with(Instant::now);
        assert_eq!(frame.id, frame.data["id"].as_str().unwrap());
        streamed.push(frame.data);
    }
    let took = first.unwrap().elapsed();
    assert_eq!(streamed, events);
    assert!(paced(took), "took {took:?}");
    let from = events[3]["id"].as_str().unwrap();
    let response = app.get(&format!("/sessions/{session}/replay?speed=100&from={from}")).send().await.unwrap();
    let later: Vec<_> = futures_util::StreamExt::collect::<Vec<_>>(crate::helpers::sse(response)).await;
    assert_eq!(later.len(), events.len() - 3, "from event 4 on");
    // An empty `from` is no `from`, as every other query parameter's empty value is.
    let response = app.get(&format!("/sessions/{session}/replay?speed=1000&from=")).send().await.unwrap();
    let all: Vec<_> = futures_util::StreamExt::collect::<Vec<_>>(crate::helpers::sse(response)).await;
    assert_eq!(all.len(), events.len(), "from the start");
    let (status, body) = crate::helpers::get_json(&app, &format!("/sessions/{session}/replay?speed=-1")).await;
    assert_eq!(status, 400);
    assert!(body["error"]["message"].as_str().unwrap().contains("`speed`"));

    // From a data dir, paced by the command itself.
    app.terminate().await;
    let dir = app.data_dir();
    let args = ["replay", &session, "--data-dir", dir.to_str().unwrap(), "--speed", "10", "--json"];
    let (replayed, took) = replay_lines(&args).await;
    assert_eq!(replayed, events);
    assert!(paced(took), "took {took:?}, expected about {expected:?}");
    let from = ["--from", events[3]["id"].as_str().unwrap()];
    let (later, _) = replay_lines(&[&args[..], &from[..]].concat()).await;
    assert_eq!(later, events[3..]);
}

#[tokio::test]
async fn a_fork_has_the_history_up_to_its_point_and_goes_on_from_there() {
    let app = spawn_app().await;
    let source = app.create_session().await;
    turn(&app, &source, "one").await;
    turn(&app, &source, "two").await;
    let before = app.all_events(&source).await;
    let reply = before.iter().find(|e| e["type"] == "agent.message").unwrap();
    let at = reply["id"].as_str().unwrap();

    let response = app.post(&format!("/sessions/{source}/fork")).json(&json!({"at": at})).send().await.unwrap();
    assert_eq!(response.status(), 201);
    let forked: Value = response.json().await.unwrap();
    let fork = forked["sessionId"].as_str().unwrap().to_string();
    let point = &forked["forked_from"];
    assert_eq!((point["session_id"].as_str(), point["event_id"].as_str()), (Some(source.as_str()), Some(at)));
    assert_eq!(point["sequence_number"], reply["sequence_number"]);
    let export = app.get(&format!("/sessions/{source}/export")).send().await.unwrap().text().await.unwrap();
    let line: Value =
        export.lines().map(|l| serde_json::from_str::<Value>(l).unwrap()).find(|l| l["event"]["id"] == at).unwrap();
    assert_eq!(point["hash"], line["hash"], "the fork names the source's chain head at its point");

    turn(&app, &fork, "three").await;
    let history = |session: String| {
        let app = &app;
        async move {
            let body: Value =
                app.get(&format!("/sessions/{session}/history?type=full")).send().await.unwrap().json().await.unwrap();
            body["history"]["full"].as_array().unwrap().iter().map(|m| m["content"].clone()).collect::<Vec<_>>()
        }
    };
    assert_eq!(history(fork.clone()).await, [json!("one"), json!("echo: one"), json!("three"), json!("echo: three")]);
    assert_eq!(history(source.clone()).await, [json!("one"), json!("echo: one"), json!("two"), json!("echo: two")]);
    assert_eq!(app.all_events(&source).await, before, "the source is untouched");
    let created = &app.all_events(&fork).await[0];
    assert_eq!(created["forked_from"], *point, "the fork's log records where it came from");

    // Listed and shown like any session.
    let list: Value = app.get("/sessions").send().await.unwrap().json().await.unwrap();
    let listed: Vec<&str> =
        list["sessions"].as_array().unwrap().iter().filter_map(|s| s["sessionId"].as_str()).collect();
    assert!(listed.contains(&fork.as_str()) && listed.contains(&source.as_str()), "{list}");
    let shown = app.get(&format!("/sessions/{fork}")).send().await.unwrap();
    assert_eq!(shown.status(), 200);

    let unknown = app.post(&format!("/sessions/{source}/fork")).json(&json!({"at": "evt_nope"})).send().await.unwrap();
    assert_eq!(unknown.status(), 400);
    let body: Value = unknown.json().await.unwrap();
    assert!(body["error"]["message"].as_str().unwrap().contains("`at`"));
    // Well formed but not this session's: as an unknown cursor is.
    let elsewhere = json!({"at": "evt_01JD0000000000000000000000"});
    let unknown = app.post(&format!("/sessions/{source}/fork")).json(&elsewhere).send().await.unwrap();
    assert_eq!(unknown.status(), 409);
    let body: Value = unknown.json().await.unwrap();
    assert_eq!(body["error"]["code"], "unknown_cursor", "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("`at` evt_01JD0000000000000000000000"), "{body}");
}

#[tokio::test]
async fn a_fork_goes_on_with_another_agent_if_asked() {
    let app = crate::helpers::spawn_with(
        "[agents.other]\nsystem = \"Another.\"\nmodel = { provider = \"scripted\", name = \"scripted\" }\n",
    )
    .await;
    let source = app.create_session().await;
    turn(&app, &source, "one").await;
    let at = app.all_events(&source).await.last().unwrap()["id"].as_str().unwrap().to_string();
    let body = json!({"at": at, "agent": {"name": "other"}});
    let response = app.post(&format!("/sessions/{source}/fork")).json(&body).send().await.unwrap();
    assert_eq!(response.status(), 201);
    let fork = response.json::<Value>().await.unwrap()["sessionId"].as_str().unwrap().to_string();
    let created = &app.all_events(&fork).await[0];
    assert_eq!(created["agent"]["name"], "other", "{created}");
    let answer = turn(&app, &fork, "two").await;
    assert_eq!(answer["stopReason"], "end_turn", "{answer}");
    let shown: Value = app.get(&format!("/sessions/{fork}")).send().await.unwrap().json().await.unwrap();
    assert_eq!(shown["agent"]["name"], "other", "{shown}");
    assert_eq!(app.all_events(&source).await[0]["agent"]["name"], "default", "the source keeps its agent");

    let nobody = json!({"at": at, "agent": {"name": "nobody"}});
    let refused = app.post(&format!("/sessions/{source}/fork")).json(&nobody).send().await.unwrap();
    assert_eq!(refused.status(), 404, "an agent that is not there is not found");
    let body: Value = refused.json().await.unwrap();
    assert!(body["error"]["message"].as_str().unwrap().contains("nobody"), "{body}");
}

/// Drops the chain hashes of events `seqs` of the only session in a copy of a data dir
/// (each is stored after its event's JSON, with a zero byte), and marks the log as not
/// closed cleanly, as a crash would leave it; with `legacy`, drops every hash, as in a log
/// written before the chain existed.
fn strip_chain(dir: &Path, seqs: &[u64], legacy: bool) {
    let db = sled::open(dir).unwrap();
    let events = db.open_tree("events").unwrap();
    let unseal = |value: &[u8]| value[..value.len() - 33].to_vec();
    if legacy {
        for (key, value) in events.iter().map(Result::unwrap) {
            events.insert(key, unseal(&value)).unwrap();
        }
        db.open_tree("meta").unwrap().remove("chain").unwrap();
    }
    for &seq in seqs {
        let (key, value) = stored_event(&db, seq);
        events.insert(key, unseal(&value)).unwrap();
    }
    db.open_tree("meta").unwrap().insert("state", "open").unwrap();
    db.flush().unwrap();
}

/// Opens a data dir with the server (which completes what it may) and stops it.
async fn serve_once(dir: &Path) {
    let config = dir.with_extension("toml");
    std::fs::write(&config, "").unwrap();
    let (mut child, _) = launch(&config, dir, "127.0.0.1:0").await.expect("the server starts");
    let pid = child.id().unwrap().to_string();
    std::process::Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    child.wait().await.unwrap();
}

#[tokio::test]
async fn only_the_end_of_a_chain_is_completed_and_only_by_the_server() {
    let mut app = spawn_app().await;
    let session = app.create_session().await;
    turn(&app, &session, "/words 4").await;
    let count = app.all_events(&session).await.len() as u64;
    app.terminate().await;
    let work = tempfile::tempdir().unwrap();

    // The last events have no hashes (an older binary appended them): verify (which only
    // reads) says so; the server's next start records them.
    let cut = work.path().join("cut");
    copy_dir(&app.data_dir(), &cut);
    strip_chain(&cut, &[count - 1, count], false);
    let out = run(&["verify", "--data-dir", path_str(&cut)]).await;
    assert_eq!(out.status.code(), Some(1));
    let said = text(&out.stderr);
    assert!(said.contains(&format!("sequence number {}: the chain has no hash", count - 1)), "{said}");
    serve_once(&cut).await;
    let out = run(&["verify", "--data-dir", path_str(&cut)]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));

    // A hash missing in the middle is no crash's doing: it stays missing, and reported.
    let middle = work.path().join("middle");
    copy_dir(&app.data_dir(), &middle);
    strip_chain(&middle, &[4], false);
    serve_once(&middle).await;
    let out = run(&["verify", "--data-dir", path_str(&middle)]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("sequence number 4: the chain has no hash"), "{}", text(&out.stderr));

    // A log from before the chain gets one at its first start, and verifies.
    let legacy = work.path().join("legacy");
    copy_dir(&app.data_dir(), &legacy);
    strip_chain(&legacy, &[], true);
    serve_once(&legacy).await;
    let out = run(&["verify", "--data-dir", path_str(&legacy)]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
}

#[tokio::test]
async fn only_an_admin_may_import() {
    let config = format!(
        "[auth]\nkeys = [\n  {{ subject = \"alice\", sha256 = \"{}\" }},\n  {{ subject = \"ops\", sha256 = \"{}\", admin = true }},\n]\n",
        turnlog::api::auth::hash_key("alice-key"),
        turnlog::api::auth::hash_key("ops-key")
    );
    let mut app = crate::helpers::spawn_with(&config).await;
    app.use_key("alice-key");
    let session = app.create_session().await;
    let export = app.get(&format!("/sessions/{session}/export")).send().await.unwrap().text().await.unwrap();
    let refused = app.post("/sessions/import").body(export.clone()).send().await.unwrap();
    assert_eq!(refused.status(), 403);
    app.use_key("ops-key");
    let answer: Value = app.post("/sessions/import").body(export).send().await.unwrap().json().await.unwrap();
    assert_eq!(answer["sessions"][0]["status"], "unchanged", "{answer}");
    let bad = app.post("/sessions/import").body("{\"session_id\":").send().await.unwrap();
    assert_eq!(bad.status(), 400);
    let body: Value = bad.json().await.unwrap();
    assert!(body["error"]["message"].as_str().unwrap().starts_with("line 1:"), "{body}");
}

/// Reads `tail`'s stdout until it exits (at the session's end), within 30 s.
async fn tail_output(
    mut tail: tokio::process::Child,
    mut lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
) -> Vec<String> {
    let mut printed = Vec::new();
    while let Some(line) = tokio::time::timeout(Duration::from_secs(30), lines.next_line()).await.unwrap().unwrap() {
        printed.push(line);
    }
    let status = tokio::time::timeout(Duration::from_secs(30), tail.wait()).await.unwrap().unwrap();
    assert!(status.success(), "tail ends with its session: {printed:?}");
    printed
}

fn spawn_tail(args: &[&str]) -> (tokio::process::Child, tokio::io::Lines<BufReader<tokio::process::ChildStdout>>) {
    let mut tail = turnlog().args(args).stdout(std::process::Stdio::piped()).spawn().unwrap();
    let lines = BufReader::new(tail.stdout.take().unwrap()).lines();
    (tail, lines)
}

#[tokio::test]
async fn tail_prints_one_readable_line_per_event_and_joins_text_deltas() {
    let app = spawn_app().await;
    let session = app.create_session().await;
    let (tail, mut lines) = spawn_tail(&["tail", &session, "--server", &app.url]);
    let first = tokio::time::timeout(Duration::from_secs(20), lines.next_line()).await.unwrap().unwrap().unwrap();
    assert!(first.starts_with("#1 ") && first.contains(" session.created"), "{first}");
    turn(&app, &session, "/think hmm\n/words 3").await;
    let mut log = app.all_events(&session).await;
    assert_eq!(app.delete(&format!("/sessions/{session}")).send().await.unwrap().status(), 204);
    let printed = [vec![first], tail_output(tail, lines).await].concat();
    log.extend([json!({"type": "session.deleted"}), json!({"type": "terminated"})]);
    // One line per event, in order; the deltas of one message (or thinking block) share a
    // line, which stands for its `agent.message` (or `agent.thinking`) too.
    let seqs: Vec<u64> = printed.iter().map(|l| l[1..l.find(' ').unwrap()].parse().unwrap()).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{printed:#?}");
    let kind = |line: &String| line.split(' ').nth(2).unwrap().to_string();
    let printed_kinds: Vec<String> = printed.iter().map(kind).collect();
    let expected: Vec<String> = log
        .iter()
        .map(|e| e["type"].as_str().unwrap().to_string())
        .filter(|k| k != "agent.message" && k != "agent.thinking")
        .fold(Vec::new(), |mut kinds, k| {
            if !(k.ends_with(".delta") && kinds.last() == Some(&k)) {
                kinds.push(k);
            }
            kinds
        });
    assert_eq!(printed_kinds, expected, "{printed:#?}");
    let line = |kind: &str| printed.iter().find(|l| l.split(' ').nth(2) == Some(kind)).unwrap().clone();
    assert!(line("agent.message.delta").ends_with(" w1 w2 w3"), "{printed:#?}");
    assert!(line("agent.thinking.delta").ends_with(" hmm"), "{printed:#?}");
    assert!(line("user.message").ends_with(" /think hmm /words 3"), "{printed:#?}");
    assert!(line("session.status_idle").contains(" end_turn (in "), "{printed:#?}");
    assert!(line("terminated").ends_with(" session deleted"), "{printed:#?}");
}

#[tokio::test]
async fn tail_starts_after_a_cursor_and_prints_only_the_types_asked() {
    let app = spawn_app().await;
    let session = app.create_session().await;
    let posted = app.post_outcomes(&session, &["a".into(), "b".into()]).await;
    let after = posted[0]["id"].as_str().unwrap();
    let args = ["tail", &session, "--server", &app.url, "--after", after, "--types", "user.define_outcome,terminated"];
    let (tail, mut lines) = spawn_tail(&args);
    let first = tokio::time::timeout(Duration::from_secs(20), lines.next_line()).await.unwrap().unwrap().unwrap();
    app.post_outcomes(&session, &["c".into()]).await;
    assert_eq!(app.delete(&format!("/sessions/{session}")).send().await.unwrap().status(), 204);
    let printed = [vec![first], tail_output(tail, lines).await].concat();
    let heads: Vec<(&str, &str)> = printed
        .iter()
        .map(|l| {
            let mut words = l.split(' ');
            (words.next().unwrap(), words.nth(1).unwrap())
        })
        .collect();
    assert_eq!(
        heads,
        [("#3", "user.define_outcome"), ("#4", "user.define_outcome"), ("#6", "terminated")],
        "after event 2, outcomes and the end only: {printed:#?}"
    );
}

#[tokio::test]
async fn unknown_sessions_and_two_sources_are_bad_input() {
    let mut app = spawn_app().await;
    let nobody = "sess_01JD00000000000000000000AA";
    for command in ["export", "tail", "replay"] {
        let out = run(&[command, nobody, "--server", &app.url]).await;
        assert_eq!(out.status.code(), Some(2), "{command}: {}", text(&out.stderr));
        assert!(
            text(&out.stderr).contains(nobody) || text(&out.stderr).contains("404"),
            "{command}: {}",
            text(&out.stderr)
        );
        assert!(out.stdout.is_empty(), "{command} printed {}", text(&out.stdout));
    }
    app.terminate().await;
    let dir = app.data_dir();
    for command in ["export", "replay"] {
        let out = run(&[command, nobody, "--data-dir", path_str(&dir)]).await;
        assert_eq!(out.status.code(), Some(2), "{command}: {}", text(&out.stderr));
        assert!(text(&out.stderr).contains(nobody), "{command}: {}", text(&out.stderr));
    }
    let both = run(&["export", "--server", &app.url, "--data-dir", path_str(&dir)]).await;
    assert_eq!(both.status.code(), Some(2));
    assert!(text(&both.stderr).contains("cannot be used with"), "{}", text(&both.stderr));
}

#[tokio::test]
async fn export_picks_sessions_and_import_goes_through_a_server() {
    let app = crate::helpers::spawn_with(
        "[agents.other]\nsystem = \"Another.\"\nmodel = { provider = \"scripted\", name = \"scripted\" }\n",
    )
    .await;
    let mine = app.create_session().await;
    app.post_outcomes(&mine, &["a".into()]).await;
    let body = json!({"agent": {"name": "other"}});
    let other: Value = app.post("/sessions").json(&body).send().await.unwrap().json().await.unwrap();
    let other = other["sessionId"].as_str().unwrap().to_string();
    app.post_outcomes(&other, &["b".into(), "c".into()]).await;
    let sessions_in = |out: &Output| -> Vec<(String, u64)> {
        text(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .map(|l| (l["session_id"].as_str().unwrap().to_string(), l["sequence_number"].as_u64().unwrap()))
            .collect()
    };
    let one = run(&["export", &mine, "--server", &app.url]).await;
    assert!(one.status.success(), "{}", text(&one.stderr));
    assert_eq!(sessions_in(&one), [(mine.clone(), 1), (mine.clone(), 2)]);
    let picked = run(&["export", "--agent", "other", "--server", &app.url]).await;
    assert!(picked.status.success(), "{}", text(&picked.stderr));
    assert_eq!(sessions_in(&picked), [(other.clone(), 1), (other.clone(), 2), (other.clone(), 3)]);

    // Into another server: the same events, byte for byte; a second import changes nothing.
    let target = crate::helpers::spawn_with(
        "[agents.other]\nsystem = \"Another.\"\nmodel = { provider = \"scripted\", name = \"scripted\" }\n",
    )
    .await;
    let work = tempfile::tempdir().unwrap();
    let file = work.path().join("other.jsonl");
    std::fs::write(&file, &picked.stdout).unwrap();
    let imported = run(&["import", "--server", &target.url, path_str(&file)]).await;
    assert!(imported.status.success(), "{}", text(&imported.stderr));
    assert_eq!(target.all_events(&other).await, app.all_events(&other).await);
    let again = run(&["import", "--server", &target.url, path_str(&file)]).await;
    assert!(again.status.success(), "{}", text(&again.stderr));
    assert!(
        text(&again.stderr).contains("unchanged") || text(&again.stderr).contains("already"),
        "{}",
        text(&again.stderr)
    );
    assert_eq!(target.all_events(&other).await, app.all_events(&other).await);
}

#[tokio::test]
async fn a_file_that_is_refused_imports_nothing() {
    let mut app = spawn_app().await;
    let first = app.create_session().await;
    app.post_outcomes(&first, &["a".into()]).await;
    let second = app.create_session().await;
    app.post_outcomes(&second, &["b".into(), "c".into()]).await;
    app.terminate().await;
    let work = tempfile::tempdir().unwrap();
    let all = work.path().join("all.jsonl");
    assert!(run(&["export", "--data-dir", path_str(&app.data_dir()), "-o", path_str(&all)]).await.status.success());
    let lines: Vec<String> = std::fs::read_to_string(&all).unwrap().lines().map(String::from).collect();
    let of = |session: &str| -> Vec<String> { lines.iter().filter(|l| l.contains(session)).cloned().collect() };
    assert_eq!((of(&first).len(), of(&second).len()), (2, 3));

    // The target holds a shorter log of the second session: the file, the first session
    // included, is refused.
    let target = work.path().join("target");
    let shorter = work.path().join("shorter.jsonl");
    std::fs::write(&shorter, of(&second)[..2].join("\n") + "\n").unwrap();
    assert!(run(&["import", "--data-dir", path_str(&target), path_str(&shorter)]).await.status.success());
    let refused = run(&["import", "--data-dir", path_str(&target), path_str(&all)]).await;
    assert_eq!(refused.status.code(), Some(1));
    assert!(text(&refused.stderr).contains("already exists with different content"), "{}", text(&refused.stderr));
    let held = work.path().join("held.jsonl");
    assert!(run(&["export", "--data-dir", path_str(&target), "-o", path_str(&held)]).await.status.success());
    assert_eq!(std::fs::read_to_string(&held).unwrap(), std::fs::read_to_string(&shorter).unwrap(), "nothing imported");

    // A broken chain in the second session: the first is not imported either.
    let broken = work.path().join("broken.jsonl");
    let mut tampered = lines.clone();
    let last = tampered.len() - 1;
    tampered[last] = tampered[last].replacen(r#""outcome":"c""#, r#""outcome":"C""#, 1);
    assert_ne!(tampered[last], lines[last], "the last event changed");
    std::fs::write(&broken, tampered.join("\n") + "\n").unwrap();
    let fresh = work.path().join("fresh");
    let refused = run(&["import", "--data-dir", path_str(&fresh), path_str(&broken)]).await;
    assert_eq!(refused.status.code(), Some(1), "{}", text(&refused.stderr));
    let out = run(&["export", "--data-dir", path_str(&fresh)]).await;
    assert!(out.stdout.is_empty(), "nothing imported: {}", text(&out.stdout));
}

/// An event without its envelope, with the event ids its fields name changed by `ids`.
fn body_of(event: &Value, ids: &std::collections::HashMap<String, String>) -> Value {
    fn rename(value: &mut Value, ids: &std::collections::HashMap<String, String>) {
        match value {
            Value::String(text) => {
                if let Some(new) = ids.get(text.as_str()) {
                    *text = new.clone();
                }
            }
            Value::Array(items) => items.iter_mut().for_each(|item| rename(item, ids)),
            Value::Object(fields) => fields.values_mut().for_each(|field| rename(field, ids)),
            _ => {}
        }
    }
    let mut body = event.clone();
    let fields = body.as_object_mut().unwrap();
    for envelope in ["id", "session_id", "turn_id", "sequence_number", "created_at", "processed_at"] {
        fields.remove(envelope);
    }
    rename(&mut body, ids);
    body
}

#[tokio::test]
async fn a_replay_session_re_emits_the_source_at_its_pace_for_any_client() {
    let app = spawn_app().await;
    let source = app.create_session().await;
    turn(&app, &source, "/tool calculator {\"expression\": \"2+3\"}").await;
    turn(&app, &source, "/delay 150\n/words 8").await;
    let original = app.all_events(&source).await;
    let time = |e: &Value| e["created_at"].as_str().unwrap().parse::<chrono::DateTime<chrono::Utc>>().unwrap();
    let span = (time(original.last().unwrap()) - time(&original[1])).to_std().unwrap();
    assert!(span >= Duration::from_millis(1200), "the log spans {span:?}");

    let out = run(&["replay", &source, "--server", &app.url, "--into-session", "--speed", "10"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let copy = text(&out.stdout).trim().to_string();
    let stream = app.get(&format!("/sessions/{copy}/events/stream?delta_flush_interval_ms=0")).send().await.unwrap();
    let mut frames = crate::helpers::sse(stream);
    let replayed: Vec<Value> =
        crate::helpers::take(&mut frames, original.len(), 30).await.into_iter().map(|f| f.data).collect();

    // Its own start, naming the source; then every event of the source, in new turns, with
    // the ids they name changed to the copies'.
    assert_eq!(replayed[0]["type"], "session.created");
    assert_eq!(replayed[0]["replay_of"], json!({"session_id": source, "speed": 10.0}));
    let ids: std::collections::HashMap<String, String> = original[1..]
        .iter()
        .zip(&replayed[1..])
        .map(|(a, b)| (a["id"].as_str().unwrap().to_string(), b["id"].as_str().unwrap().to_string()))
        .collect();
    let none = std::collections::HashMap::new();
    for (a, b) in original[1..].iter().zip(&replayed[1..]) {
        assert_eq!(body_of(a, &ids), body_of(b, &none), "{a} copied as {b}");
    }
    let turns = |events: &[Value]| -> Vec<String> {
        let mut turns: Vec<String> = events.iter().filter_map(|e| e["turn_id"].as_str().map(String::from)).collect();
        turns.dedup();
        turns
    };
    let (old, new) = (turns(&original), turns(&replayed));
    assert_eq!(old.len(), new.len(), "a new turn for each of the source's");
    assert!(new.iter().all(|t| !old.contains(t)));
    let took = (time(replayed.last().unwrap()) - time(&replayed[1])).to_std().unwrap();
    assert!(took >= (span / 10).mul_f64(0.9) && took <= span / 10 + span / 2, "took {took:?} for a span of {span:?}");

    // Done, it is a session like any other: the same history, and it goes on.
    let history = |session: &str| {
        let app = &app;
        let path = format!("/sessions/{session}/history?type=full");
        async move { app.get(&path).send().await.unwrap().json::<Value>().await.unwrap()["history"]["full"].clone() }
    };
    assert_eq!(history(&copy).await, history(&source).await);
    let deadline = Instant::now() + Duration::from_secs(10);
    let body = json!({"stream": "none", "messages": [{"role": "user", "content": "more"}]});
    loop {
        let response = app.post(&format!("/sessions/{copy}/turns")).json(&body).send().await.unwrap();
        if response.status() == 200 {
            break;
        }
        // Until the replay's task has let the session go.
        assert_eq!(response.status(), 409);
        assert!(Instant::now() < deadline, "the replay session never took input");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // While a replay runs, its session takes no input; deleting it ends the replay.
    let slow = app.post(&format!("/sessions/{source}/replay")).json(&json!({"speed": 1})).send().await.unwrap();
    assert_eq!(slow.status(), 201);
    let slow = slow.json::<Value>().await.unwrap()["sessionId"].as_str().unwrap().to_string();
    let refused = app.post(&format!("/sessions/{slow}/turns")).json(&body).send().await.unwrap();
    assert_eq!(refused.status(), 409);
    let why: Value = refused.json().await.unwrap();
    assert!(why["error"]["message"].as_str().unwrap().contains("replaying"), "{why}");
    assert_eq!(app.delete(&format!("/sessions/{slow}")).send().await.unwrap().status(), 204);
    let from = original[5]["id"].as_str().unwrap();
    let bad = app.post(&format!("/sessions/{source}/replay")).json(&json!({"speed": 0})).send().await.unwrap();
    assert_eq!(bad.status(), 400);
    let later = json!({"speed": 100, "from": from});
    let partial = app.post(&format!("/sessions/{source}/replay")).json(&later).send().await.unwrap();
    assert_eq!(partial.status(), 201);
    let partial = partial.json::<Value>().await.unwrap()["sessionId"].as_str().unwrap().to_string();
    // Event 6 is inside the first turn: the replay starts at that turn's start, with the
    // history before it (none) as its seed.
    let first_turn = original.iter().position(|e| e["type"] == "turn.started").unwrap();
    assert!(first_turn < 5 && original[5]["turn_id"] == original[first_turn]["turn_id"]);
    let stream = app.get(&format!("/sessions/{partial}/events/stream?delta_flush_interval_ms=0")).send().await.unwrap();
    let mut frames = crate::helpers::sse(stream);
    let copied = crate::helpers::take(&mut frames, 1 + original.len() - first_turn, 30).await;
    let kinds = |events: &[Value]| events.iter().map(|e| e["type"].as_str().unwrap().to_string()).collect::<Vec<_>>();
    let copied: Vec<Value> = copied.into_iter().map(|f| f.data).collect();
    assert_eq!(kinds(&copied[1..]), kinds(&original[first_turn..]));
    assert_eq!(app.all_events(&source).await, original, "the source is untouched");
}

#[tokio::test]
async fn a_replay_of_a_turn_still_running_closes_the_copy_of_it_and_takes_input_after() {
    let app = spawn_app().await;
    let source = app.create_session().await;
    let (url, client, path) = (app.url.clone(), app.client.clone(), format!("/sessions/{source}/turns"));
    let slow = json!({"stream": "none", "messages": [{"role": "user", "content": "/delay 50\n/words 200"}]});
    let running = tokio::spawn(async move { client.post(format!("{url}{path}")).json(&slow).send().await });
    let deadline = Instant::now() + Duration::from_secs(10);
    while !app.all_events(&source).await.iter().any(|e| e["type"] == "agent.message.delta") {
        assert!(Instant::now() < deadline, "the turn never said anything");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let started = app.post(&format!("/sessions/{source}/replay")).json(&json!({"speed": 100})).send().await.unwrap();
    assert_eq!(started.status(), 201);
    let copy = started.json::<Value>().await.unwrap()["sessionId"].as_str().unwrap().to_string();
    // The replay ends with the log as it was: the copied turn is closed, and the copy takes
    // input from then on.
    let stream = app.get(&format!("/sessions/{copy}/events/stream?delta_flush_interval_ms=0")).send().await.unwrap();
    let mut frames = crate::helpers::sse(stream);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let frame = tokio::time::timeout(Duration::from_secs(20), futures_util::StreamExt::next(&mut frames));
        let frame = frame.await.unwrap().unwrap();
        if frame.event == "session.error" {
            assert_eq!(frame.data["code"], "interrupted");
            assert!(frame.data["error"].as_str().unwrap().contains("replay ended"), "{}", frame.data);
            break;
        }
        assert!(Instant::now() < deadline);
    }
    let body = json!({"stream": "none", "messages": [{"role": "user", "content": "go on"}]});
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let response = app.post(&format!("/sessions/{copy}/turns")).json(&body).send().await.unwrap();
        if response.status() == 200 {
            let answer: Value = response.json().await.unwrap();
            assert_eq!(answer["messages"][0]["content"], "echo: go on", "{answer}");
            break;
        }
        assert_eq!(response.status(), 409);
        assert!(Instant::now() < deadline, "the copy never took input");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    app.post_event(&source, json!({"type": "user.interrupt"})).await;
    running.await.unwrap().unwrap();
}
