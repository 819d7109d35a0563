//! History compaction on the real binary: a session of 300 turns with a small context
//! window stays inside it, every request under the budget, while the log, the full history,
//! the audit chain and replay keep everything.

use std::time::Duration;

use serde_json::{json, Value};

use crate::helpers::{get_json, post_json, spawn_with, TestApp};

const WINDOW: u64 = 1024;
const TURNS: usize = 300;

const CONFIG: &str = r#"
[agents.long]
model = { provider = "scripted" }
[agents.long.context]
window = 1024
"#;

/// A user message of about 120 bytes, numbered.
fn said(i: usize) -> String {
    format!("turn {i:03}: {}", "the quick brown fox jumps over the lazy dog ".repeat(2).trim_end())
}

async fn turn(app: &TestApp, session: &str, text: &str) -> Value {
    let body = json!({"stream": "none", "messages": [{"role": "user", "content": text}]});
    let (status, answer) = post_json(app, &format!("/sessions/{session}/turns"), body).await;
    assert_eq!(status, 200, "{answer}");
    answer
}

async fn history(app: &TestApp, session: &str, kind: &str) -> Vec<Value> {
    let (status, body) = get_json(app, &format!("/sessions/{session}/history?type={kind}")).await;
    assert_eq!(status, 200, "{body}");
    body["history"][kind].as_array().unwrap().clone()
}

fn text_of(message: &Value) -> String {
    match &message["content"] {
        Value::String(text) => text.clone(),
        Value::Array(blocks) => blocks.iter().filter_map(|b| b["text"].as_str()).collect(),
        other => panic!("no content: {other}"),
    }
}

#[tokio::test]
async fn three_hundred_turns_stay_inside_a_small_context_window_and_lose_nothing() {
    let app = spawn_with(CONFIG).await;
    let (status, created) = post_json(&app, "/sessions", json!({"agent": {"name": "long"}})).await;
    assert_eq!(status, 201, "{created}");
    let session = created["sessionId"].as_str().unwrap().to_string();
    for i in 0..TURNS {
        let answer = turn(&app, &session, &said(i)).await;
        assert_eq!(answer["stopReason"], "end_turn", "turn {i}: {answer}");
        assert_eq!(text_of(&answer["messages"][0]), format!("echo: {}", said(i)), "turn {i}");
    }

    let log = app.all_events(&session).await;
    let of = |kind: &'static str| log.iter().filter(move |e| e["type"] == kind);
    // Every model request was under the budget, as the model itself counted it.
    let inputs: Vec<u64> = of("span.model_request_end").map(|e| e["usage"]["input_tokens"].as_u64().unwrap()).collect();
    assert_eq!(inputs.len(), TURNS, "one request a turn: compaction calls are not spans");
    let budget = WINDOW * 8 / 10;
    assert!(inputs.iter().all(|&tokens| tokens <= budget), "a request past {budget} tokens: {inputs:?}");
    assert!(inputs[TURNS - 1] > 200, "the history is not empty: {inputs:?}");
    // Compactions happened all along, each making the history smaller, each summarising.
    let compactions: Vec<&Value> = of("history.compacted").collect();
    assert!(compactions.len() >= 20, "{} compactions", compactions.len());
    for c in &compactions {
        assert_eq!(c["strategy"], "summary", "{c}");
        let (before, after) = (c["tokens_before"].as_u64().unwrap(), c["tokens_after"].as_u64().unwrap());
        assert!(before > budget && after <= WINDOW / 2, "{c}");
        assert!(!c["summary"].as_str().unwrap().is_empty() && c["messages"].as_u64().unwrap() > 0, "{c}");
        assert!(c["usage"]["input_tokens"].as_u64().unwrap() > 0, "what the summary cost: {c}");
        assert!(c["turn_id"].is_string(), "a compaction belongs to the turn it made room for: {c}");
    }
    // Each turn's usage counts its summaries too.
    let last = compactions.last().unwrap();
    let turn_end = of("session.status_idle").find(|e| e["turn_id"] == last["turn_id"]).unwrap();
    let request = of("span.model_request_end").find(|e| e["turn_id"] == last["turn_id"]).unwrap();
    assert_eq!(
        turn_end["usage"]["input_tokens"].as_u64().unwrap(),
        request["usage"]["input_tokens"].as_u64().unwrap() + last["usage"]["input_tokens"].as_u64().unwrap()
    );

    // The log and the full history keep every message, in order.
    let users: Vec<String> = of("user.message").map(text_of).collect();
    assert_eq!(users, (0..TURNS).map(said).collect::<Vec<_>>());
    let full = history(&app, &session, "full").await;
    assert_eq!(full.len(), 2 * TURNS);
    for (i, pair) in full.chunks(2).enumerate() {
        assert_eq!((pair[0]["role"].as_str(), text_of(&pair[0])), (Some("user"), said(i)));
        assert_eq!((pair[1]["role"].as_str(), text_of(&pair[1])), (Some("assistant"), format!("echo: {}", said(i))));
    }
    // The compacted history is what the model reads: the last summary, then what it kept.
    let compacted = history(&app, &session, "compacted").await;
    assert!(compacted.len() < full.len() / 4, "{} of {} messages", compacted.len(), full.len());
    assert_eq!(compacted[0]["role"], "user");
    let summary = text_of(&compacted[0]);
    assert!(summary.starts_with("Summary of the conversation before this point"), "{summary}");
    assert!(summary.ends_with(last["summary"].as_str().unwrap()), "{summary}");
    assert_eq!(compacted[1..], full[full.len() - (compacted.len() - 1)..], "the rest is the newest messages, whole");
    // The default is the compacted history.
    let (_, default) = get_json(&app, &format!("/sessions/{session}/history")).await;
    assert_eq!(default["history"]["compacted"].as_array().unwrap(), &compacted);

    // Replay sends the log as it is, and the audit chain verifies.
    let response = app.get(&format!("/sessions/{session}/replay?speed=100000")).send().await.unwrap();
    let replayed: Vec<Value> = futures_util::StreamExt::collect::<Vec<_>>(crate::helpers::sse(response))
        .await
        .into_iter()
        .map(|frame| frame.data)
        .collect();
    assert_eq!(replayed, log);
    let exported = app.get(&format!("/sessions/{session}/export")).send().await.unwrap();
    assert_eq!(exported.status(), 200);
    let file = app.dir.path().join("export.jsonl");
    std::fs::write(&file, exported.bytes().await.unwrap()).unwrap();
    let verify =
        tokio::process::Command::new(env!("CARGO_BIN_EXE_turnlog")).args(["verify", file.to_str().unwrap()]).output();
    let verify = tokio::time::timeout(Duration::from_secs(60), verify).await.unwrap().unwrap();
    assert!(verify.status.success(), "{}", String::from_utf8_lossy(&verify.stderr));
}

const TOOLS_CONFIG: &str = r#"
[agents.tools]
model = { provider = "scripted" }
client_tools = [{ name = "lookup", description = "Look something up", input_schema = { type = "object" } }]
[agents.tools.context]
window = 1024
drop_tool_outputs = true
"#;

#[tokio::test]
async fn old_tool_outputs_are_cut_before_anything_is_summarised() {
    let app = spawn_with(TOOLS_CONFIG).await;
    let (status, created) = post_json(&app, "/sessions", json!({"agent": {"name": "tools"}})).await;
    assert_eq!(status, 201, "{created}");
    let session = created["sessionId"].as_str().unwrap().to_string();
    let output = "x".repeat(600);
    for i in 0..6 {
        let asked = turn(&app, &session, &format!("/tool lookup {{\"n\": {i}}}")).await;
        assert_eq!(asked["stopReason"], "tool_use", "{asked}");
        let blocks = asked["messages"][0]["content"].as_array().unwrap();
        let call = blocks.iter().find(|b| b["type"] == "tool_use").unwrap()["toolCallId"].as_str().unwrap().to_string();
        let body = json!({"stream": "none", "messages": [{"role": "tool", "toolCallId": call, "content": output}]});
        let (status, answer) = post_json(&app, &format!("/sessions/{session}/turns"), body).await;
        assert_eq!((status, answer["stopReason"].as_str()), (200, Some("end_turn")), "{answer}");
    }
    let log = app.all_events(&session).await;
    let compactions: Vec<&Value> = log.iter().filter(|e| e["type"] == "history.compacted").collect();
    let first = compactions.first().expect("the history was compacted");
    assert_eq!(first["strategy"], "tool_outputs", "tool outputs go first: {first}");
    assert!(first["tokens_after"].as_u64() < first["tokens_before"].as_u64(), "{first}");
    assert!(first["summary"].is_null(), "{first}");
    // The model read the outputs cut; the full history keeps them.
    let requests: Vec<u64> = log
        .iter()
        .filter(|e| e["type"] == "span.model_request_end")
        .map(|e| e["usage"]["input_tokens"].as_u64().unwrap())
        .collect();
    assert!(requests.iter().all(|&tokens| tokens <= WINDOW * 8 / 10), "{requests:?}");
    let full = history(&app, &session, "full").await;
    let outputs = full.iter().filter(|m| m["role"] == "tool" && text_of(m) == output).count();
    assert_eq!(outputs, 6, "every output, whole, in the full history");
}

/// A compaction asked for (`user.compact`, what an editor's `/compact` sends): a turn of
/// its own that summarises the whole conversation so far, for an agent with no context
/// window too, and asks the model nothing else; the next turn reads the summary. Asked
/// with other input, or while a turn runs, it is refused; with nothing to compact, the
/// turn ends having done nothing.
#[tokio::test]
async fn a_compaction_asked_for_summarises_the_conversation_so_far_in_a_turn_of_its_own() {
    let app = spawn_with("").await;
    let (status, created) = post_json(&app, "/sessions", json!({"agent": {"name": "default"}})).await;
    assert_eq!(status, 201, "{created}");
    let session = created["sessionId"].as_str().unwrap().to_string();
    let path = format!("/sessions/{session}/events");
    let compact = |events: Value| post_json(&app, &path, json!({"events": events}));
    // The session's turn `turn_id` has ended: its `session.status_idle`, once stored.
    let ended = |turn_id: String| {
        let app = &app;
        let session = session.clone();
        async move {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
            loop {
                let log = app.all_events(&session).await;
                if let Some(idle) =
                    log.into_iter().find(|e| e["type"] == "session.status_idle" && e["turn_id"] == turn_id)
                {
                    return idle;
                }
                assert!(tokio::time::Instant::now() < deadline, "turn {turn_id} did not end within 10 s");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };

    // Nothing to compact yet: the turn ends at once.
    let (status, stored) = compact(json!([{"type": "user.compact"}])).await;
    assert_eq!(status, 200, "{stored}");
    let idle = ended(stored["data"][0]["turn_id"].as_str().unwrap().to_string()).await;
    assert_eq!(idle["stop_reason"]["type"], "end_turn", "{idle}");
    for text in ["one", "two"] {
        turn(&app, &session, text).await;
    }
    let (status, refused) = compact(json!([{"type": "user.compact"}, {"type": "user.interrupt"}])).await;
    assert_eq!(status, 400, "{refused}");
    assert!(refused.to_string().contains("a compaction is asked for alone"), "{refused}");

    let (status, stored) = compact(json!([{"type": "user.compact"}])).await;
    assert_eq!(status, 200, "{stored}");
    let kinds: Vec<&str> = stored["data"].as_array().unwrap().iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["user.compact"], "answered with what was sent, as stored");
    let turn_id = stored["data"][0]["turn_id"].as_str().unwrap().to_string();
    let idle = ended(turn_id.clone()).await;
    assert_eq!(idle["stop_reason"]["type"], "end_turn", "{idle}");

    let log = app.all_events(&session).await;
    let of_turn: Vec<&str> =
        log.iter().filter(|e| e["turn_id"] == turn_id).map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(
        of_turn,
        ["turn.started", "user.compact", "session.status_running", "history.compacted", "session.status_idle"],
        "a turn of its own, that only compacts"
    );
    let compactions: Vec<&Value> = log.iter().filter(|e| e["type"] == "history.compacted").collect();
    assert_eq!(compactions.len(), 1, "the first compaction had nothing to compact: {compactions:?}");
    assert_eq!((compactions[0]["turn_id"].as_str(), &compactions[0]["messages"]), (Some(turn_id.as_str()), &json!(4)));
    assert!(compactions[0]["summary"].as_str().unwrap().contains("one"), "{}", compactions[0]);
    let asked = log.iter().filter(|e| e["turn_id"] == turn_id && e["type"] == "span.model_request_start").count();
    assert_eq!(asked, 0, "a compaction turn asks the model nothing but the summary (no span)");

    let answer = turn(&app, &session, "three").await;
    assert_eq!(text_of(&answer["messages"][0]), "echo: three");
    let compacted = history(&app, &session, "compacted").await;
    assert_eq!(compacted.len(), 3, "the summary, then the new turn's two messages: {compacted:?}");
    assert!(text_of(&compacted[0]).starts_with("Summary of the conversation before this point"), "{compacted:?}");
    assert_eq!(history(&app, &session, "full").await.len(), 6, "the full history keeps everything");
}
