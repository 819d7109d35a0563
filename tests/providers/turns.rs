//! A whole turn with a client tool round trip, through the real `turnlog` binary and the
//! AAP turn API, on each provider: the agent's model points at a fake provider server.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::fake::{FakeServer, Received, Reply};
use crate::support::{KEY, KEY_ENV};

struct Server {
    url: String,
    client: reqwest::Client,
    _child: Child,
    _dir: tempfile::TempDir,
}

/// Starts the binary with `config` on port 0 and a fresh data dir, with the key set.
async fn start(config: &str) -> Server {
    let dir = tempfile::tempdir().expect("temp dir");
    let config_path = dir.path().join("config.toml");
    std::fs::write(&config_path, config).expect("write config");
    let log = dir.path().join("turnlog.log");
    let (child, url) = launch(&config_path, &dir.path().join("data"), &log)
        .await
        .unwrap_or_else(|| panic!("turnlog did not start: {}", std::fs::read_to_string(&log).unwrap_or_default()));
    Server { url, client: reqwest::Client::new(), _child: child, _dir: dir }
}

async fn launch(config: &Path, data: &Path, log: &Path) -> Option<(Child, String)> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_turnlog"))
        .args(["serve", "--addr", "127.0.0.1:0", "--config"])
        .arg(config)
        .arg("--data-dir")
        .arg(data)
        .env("RUST_LOG", "warn")
        .env(KEY_ENV, KEY)
        .stdout(Stdio::piped())
        .stderr(Stdio::from(std::fs::File::create(log).expect("log file")))
        .kill_on_drop(true)
        .spawn()
        .expect("spawn turnlog");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line()).await;
    let url = line.ok()?.ok()??.strip_prefix("listening on ")?.trim().to_string();
    Some((child, url))
}

impl Server {
    async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        let response = self.client.post(format!("{}{path}", self.url)).json(&body).send().await.unwrap();
        let status = response.status().as_u16();
        let text = response.text().await.unwrap();
        (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
    }
}

fn weather_tool() -> Value {
    json!({
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    })
}

/// Runs the round trip on agent `agent`: a user question, the model's call of the client
/// tool, the client's result, the model's answer. Returns what the fake server received.
async fn round_trip(server: &Server, agent: &str, fake: &FakeServer) -> Vec<Received> {
    let (status, created) =
        server.post("/sessions", json!({"agent": {"name": agent}, "tools": [weather_tool()]})).await;
    assert_eq!(status, 201, "{created}");
    let session = created["sessionId"].as_str().expect("sessionId");
    let turns = format!("/sessions/{session}/turns");

    let (status, first) =
        server.post(&turns, json!({"messages": [{"role": "user", "content": "weather in Tokyo?"}]})).await;
    assert_ne!(status, 404, "the AAP turn route is not there yet: {first}");
    assert_eq!(status, 200, "{first}");
    assert_eq!(first["stopReason"], "tool_use", "{first}");
    let call = first["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| m["role"] == "assistant")
        .flat_map(|m| m["content"].as_array().cloned().unwrap_or_default())
        .find(|block| block["type"] == "tool_use")
        .unwrap_or_else(|| panic!("a tool_use block: {first}"));
    assert_eq!((&call["name"], &call["input"]), (&json!("get_weather"), &json!({"city": "Tokyo"})));
    let call_id = call["toolCallId"].as_str().expect("toolCallId");

    let result = json!({"messages": [{"role": "tool", "toolCallId": call_id, "content": "18C"}]});
    let (status, second) = server.post(&turns, result).await;
    assert_eq!(status, 200, "{second}");
    assert_eq!(second["stopReason"], "end_turn", "{second}");
    let said: Vec<&Value> =
        second["messages"].as_array().into_iter().flatten().filter(|m| m["role"] == "assistant").collect();
    assert_eq!(said.last().map(|m| &m["content"]), Some(&json!("It is 18C in Tokyo.")), "{second}");

    let received = fake.received();
    assert_eq!(received.len(), 2, "one model request per step");
    received
}

fn openai_stream(deltas: &[&str], finish: &str) -> Vec<String> {
    let chunk = |choice: String| {
        format!("data: {{\"id\":\"chatcmpl-T1\",\"object\":\"chat.completion.chunk\",\"created\":1754380000,\"model\":\"gpt-test\",\"system_fingerprint\":\"fp_1\",\"choices\":[{choice}],\"usage\":null}}\n\n")
    };
    let mut out: Vec<String> = deltas
        .iter()
        .map(|d| chunk(format!("{{\"index\":0,\"delta\":{d},\"logprobs\":null,\"finish_reason\":null}}")))
        .collect();
    out.push(chunk(format!("{{\"index\":0,\"delta\":{{}},\"logprobs\":null,\"finish_reason\":\"{finish}\"}}")));
    out.push("data: {\"id\":\"chatcmpl-T1\",\"object\":\"chat.completion.chunk\",\"created\":1754380000,\"model\":\"gpt-test\",\"system_fingerprint\":\"fp_1\",\"choices\":[],\"usage\":{\"prompt_tokens\":40,\"completion_tokens\":12,\"total_tokens\":52}}\n\n".into());
    out.push("data: [DONE]\n\n".into());
    out
}

#[tokio::test]
async fn an_openai_agent_calls_a_client_tool_and_answers_with_its_result() {
    let fake = FakeServer::start(vec![
        Reply::sse(openai_stream(
            &[
                r#"{"role":"assistant","content":null,"tool_calls":[{"index":0,"id":"call_W1","type":"function","function":{"name":"get_weather","arguments":""}}]}"#,
                r#"{"tool_calls":[{"index":0,"function":{"arguments":"{\"city\":"}}]}"#,
                r#"{"tool_calls":[{"index":0,"function":{"arguments":"\"Tokyo\"}"}}]}"#,
            ],
            "tool_calls",
        )),
        Reply::sse(openai_stream(
            &[r#"{"role":"assistant","content":""}"#, r#"{"content":"It is 18C"}"#, r#"{"content":" in Tokyo."}"#],
            "stop",
        )),
    ])
    .await;
    let server = start(&format!(
        "[agents.oa]\nsystem = \"You are terse.\"\nmodel = {{ provider = \"openai\", base_url = \"{}/v1\", name = \"gpt-test\", api_key_env = \"{KEY_ENV}\" }}\n",
        fake.url
    ))
    .await;

    let received = round_trip(&server, "oa", &fake).await;

    let first = &received[0];
    assert_eq!(first.header("authorization"), Some(format!("Bearer {KEY}").as_str()));
    assert_eq!(first.body["tools"][0]["function"]["name"], "get_weather");
    let second = &received[1].body["messages"];
    let messages = second.as_array().expect("messages");
    let assistant = messages.iter().find(|m| m["role"] == "assistant").expect("the assistant's call");
    let call_id = assistant["tool_calls"][0]["id"].as_str().expect("a call id");
    assert_eq!(assistant["tool_calls"][0]["function"]["name"], "get_weather");
    let tool = messages.iter().find(|m| m["role"] == "tool").unwrap_or_else(|| panic!("the tool result: {second}"));
    assert_eq!((tool["tool_call_id"].as_str(), &tool["content"]), (Some(call_id), &json!("18C")));
}

fn anthropic_stream(blocks: &[Vec<String>], stop: &str) -> Vec<String> {
    let event = |kind: &str, data: String| format!("event: {kind}\ndata: {data}\n\n");
    let mut out = vec![event("message_start", r#"{"type":"message_start","message":{"id":"msg_T1","type":"message","role":"assistant","model":"claude-test","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":40,"output_tokens":1}}}"#.into())];
    for block in blocks {
        out.extend(block.iter().cloned());
    }
    out.push(event("message_delta", format!("{{\"type\":\"message_delta\",\"delta\":{{\"stop_reason\":\"{stop}\",\"stop_sequence\":null}},\"usage\":{{\"output_tokens\":12}}}}")));
    out.push(event("message_stop", r#"{"type":"message_stop"}"#.into()));
    out
}

fn anthropic_block(index: usize, start: &str, deltas: &[&str]) -> Vec<String> {
    let event = |kind: &str, data: String| format!("event: {kind}\ndata: {data}\n\n");
    let mut out = vec![event(
        "content_block_start",
        format!("{{\"type\":\"content_block_start\",\"index\":{index},\"content_block\":{start}}}"),
    )];
    for delta in deltas {
        out.push(event(
            "content_block_delta",
            format!("{{\"type\":\"content_block_delta\",\"index\":{index},\"delta\":{delta}}}"),
        ));
    }
    out.push(event("content_block_stop", format!("{{\"type\":\"content_block_stop\",\"index\":{index}}}")));
    out
}

#[tokio::test]
async fn an_anthropic_agent_calls_a_client_tool_and_answers_with_its_result() {
    let call = anthropic_block(
        0,
        r#"{"type":"tool_use","id":"toolu_01W1","name":"get_weather","input":{}}"#,
        &[
            r#"{"type":"input_json_delta","partial_json":""}"#,
            r#"{"type":"input_json_delta","partial_json":"{\"city\": "}"#,
            r#"{"type":"input_json_delta","partial_json":"\"Tokyo\"}"}"#,
        ],
    );
    let answer = anthropic_block(
        0,
        r#"{"type":"text","text":""}"#,
        &[r#"{"type":"text_delta","text":"It is 18C"}"#, r#"{"type":"text_delta","text":" in Tokyo."}"#],
    );
    let fake = FakeServer::start(vec![
        Reply::sse(anthropic_stream(&[call], "tool_use")),
        Reply::sse(anthropic_stream(&[answer], "end_turn")),
    ])
    .await;
    let server = start(&format!(
        "[agents.an]\nsystem = \"You are terse.\"\nmodel = {{ provider = \"anthropic\", base_url = \"{}\", name = \"claude-test\", api_key_env = \"{KEY_ENV}\" }}\n",
        fake.url
    ))
    .await;

    let received = round_trip(&server, "an", &fake).await;

    let first = &received[0];
    assert_eq!(first.header("x-api-key"), Some(KEY));
    assert_eq!(first.body["tools"][0]["name"], "get_weather");
    assert_eq!(first.body["system"], "You are terse.");
    let messages = received[1].body["messages"].as_array().cloned().expect("messages");
    let blocks: Vec<Value> =
        messages.iter().flat_map(|m| m["content"].as_array().cloned().unwrap_or_default()).collect();
    let tool_use = blocks.iter().find(|b| b["type"] == "tool_use").expect("the assistant's call");
    let result = blocks.iter().find(|b| b["type"] == "tool_result").expect("the tool result");
    assert_eq!(result["tool_use_id"], tool_use["id"]);
    assert_eq!(result["content"], json!([{"type": "text", "text": "18C"}]));
    let last = messages.last().expect("a last message");
    assert_eq!(last["role"], "user", "the result goes back as a user message");
}
