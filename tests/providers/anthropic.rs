//! The `anthropic` provider against a fake Messages API server that sends what Anthropic
//! sends. A real stream with a tool call (from the streaming reference):
//!
//! ```text
//! event: message_start
//! data: {"type":"message_start","message":{"id":"msg_014p7gG3wDgGV9EUtLvnow3U","type":"message","role":"assistant","model":"claude-opus-4-1-20250805","stop_sequence":null,"usage":{"input_tokens":472,"output_tokens":2},"content":[],"stop_reason":null}}
//!
//! event: content_block_start
//! data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}
//!
//! event: ping
//! data: {"type": "ping"}
//!
//! event: content_block_delta
//! data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Okay, let's check the weather for San Francisco, CA:"}}
//!
//! event: content_block_stop
//! data: {"type":"content_block_stop","index":0}
//!
//! event: content_block_start
//! data: {"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"toolu_01T1x1fJ34qAmk2tNTrN7Up6","name":"get_weather","input":{}}}
//!
//! event: content_block_delta
//! data: {"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":""}}
//!
//! event: content_block_delta
//! data: {"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"location\":"}}
//!
//! event: content_block_delta
//! data: {"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":" \"San Francisco, CA\"}"}}
//!
//! event: content_block_stop
//! data: {"type":"content_block_stop","index":1}
//!
//! event: message_delta
//! data: {"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":89}}
//!
//! event: message_stop
//! data: {"type":"message_stop"}
//! ```

use std::time::Duration;

use futures_util::StreamExt;
use serde_json::json;
use turnlog::agent::{ModelEvent, ModelStop};
use turnlog::domain::Usage;

use crate::fake::{Body, FakeServer, Reply};
use crate::support::*;

/// One SSE event as Anthropic frames it: the type twice, in `event:` and in the data.
fn event(kind: &str, data: &str) -> String {
    format!("event: {kind}\ndata: {data}\n\n")
}

fn message_start(input_tokens: u64) -> String {
    event(
        "message_start",
        &format!("{{\"type\":\"message_start\",\"message\":{{\"id\":\"msg_01XFDUDYJgAACzvnptvVoYEL\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"claude-sonnet-4-5-20250929\",\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{{\"input_tokens\":{input_tokens},\"cache_creation_input_tokens\":0,\"cache_read_input_tokens\":0,\"output_tokens\":1,\"service_tier\":\"standard\"}}}}}}"),
    )
}

fn block_start(index: usize, block: &str) -> String {
    event(
        "content_block_start",
        &format!("{{\"type\":\"content_block_start\",\"index\":{index},\"content_block\":{block}}}"),
    )
}

fn block_delta(index: usize, delta: &str) -> String {
    event("content_block_delta", &format!("{{\"type\":\"content_block_delta\",\"index\":{index},\"delta\":{delta}}}"))
}

fn text_delta(index: usize, text: &str) -> String {
    block_delta(index, &json!({"type": "text_delta", "text": text}).to_string())
}

fn json_delta(index: usize, partial: &str) -> String {
    block_delta(index, &json!({"type": "input_json_delta", "partial_json": partial}).to_string())
}

fn block_stop(index: usize) -> String {
    event("content_block_stop", &format!("{{\"type\":\"content_block_stop\",\"index\":{index}}}"))
}

fn message_end(stop_reason: &str, output_tokens: u64) -> Vec<String> {
    vec![
        event(
            "message_delta",
            &format!("{{\"type\":\"message_delta\",\"delta\":{{\"stop_reason\":\"{stop_reason}\",\"stop_sequence\":null}},\"usage\":{{\"output_tokens\":{output_tokens}}}}}"),
        ),
        event("message_stop", "{\"type\":\"message_stop\"}"),
    ]
}

fn ping() -> String {
    event("ping", "{\"type\": \"ping\"}")
}

/// Extended thinking (with its signature), then text.
fn thinking_then_text() -> Vec<String> {
    let mut stream = vec![
        message_start(25),
        block_start(0, r#"{"type":"thinking","thinking":"","signature":""}"#),
        block_delta(0, r#"{"type":"thinking_delta","thinking":"The user says hello. "}"#),
        block_delta(0, r#"{"type":"thinking_delta","thinking":"I should greet back."}"#),
        block_delta(
            0,
            r#"{"type":"signature_delta","signature":"EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds"}"#,
        ),
        block_stop(0),
        block_start(1, r#"{"type":"text","text":""}"#),
        ping(),
        text_delta(1, "Hello"),
        text_delta(1, "!"),
        block_stop(1),
    ];
    stream.extend(message_end("end_turn", 15));
    stream
}

/// Text, then two tool_use blocks whose input arrives as partial JSON.
fn two_tools() -> Vec<String> {
    let mut stream = vec![
        message_start(472),
        block_start(0, r#"{"type":"text","text":""}"#),
        ping(),
        text_delta(0, "Checking both."),
        block_stop(0),
        block_start(1, r#"{"type":"tool_use","id":"toolu_01T1x1fJ34qAmk2tNTrN7Up6","name":"get_weather","input":{}}"#),
        json_delta(1, ""),
        json_delta(1, "{\"city\":"),
        json_delta(1, " \"Tok"),
        json_delta(1, "yo\"}"),
        block_stop(1),
        block_start(2, r#"{"type":"tool_use","id":"toolu_01UvqH3Z9NfBw3HD1gW2wFcT","name":"get_weather","input":{}}"#),
        json_delta(2, ""),
        json_delta(2, "{\"ci"),
        json_delta(2, "ty\": \"Paris\"}"),
        block_stop(2),
    ];
    stream.extend(message_end("tool_use", 89));
    stream
}

const OVERLOADED: &str = r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"},"request_id":"req_011CSHoEeqs5C35K2UUqR7Fy"}"#;
const API_ERROR: &str = r#"{"type":"error","error":{"type":"api_error","message":"Internal server error"},"request_id":"req_011CSHoEeqs5C35K2UUqR7Fz"}"#;
const RATE_LIMITED: &str = r#"{"type":"error","error":{"type":"rate_limit_error","message":"This request would exceed the rate limit for your organization of 50 input tokens per minute. For details, refer to: https://docs.claude.com/en/api/rate-limits."},"request_id":"req_011CSHoEeqs5C35K2UUqR7G0"}"#;

fn model_at(server: &FakeServer) -> std::sync::Arc<dyn turnlog::agent::Model> {
    model("anthropic", &server.url, json!({}))
}

#[tokio::test]
async fn thinking_and_text_stream_and_the_request_is_what_anthropic_expects() {
    let server = FakeServer::start(vec![Reply::sse(thinking_then_text())]).await;
    let model = model("anthropic", &server.url, json!({"temperature": 0.5}));

    let events = events(run(&model, request(conversation())).await);

    assert_eq!(thinking(&events), "The user says hello. I should greet back.");
    assert_eq!(text(&events), "Hello!");
    let tail = &events[events.len() - 2..];
    assert_eq!(
        tail,
        [ModelEvent::Usage(Usage { input_tokens: 25, output_tokens: 15 }), ModelEvent::Stop(ModelStop::EndTurn),]
    );
    let received = server.received();
    assert_eq!(received.len(), 1);
    let sent = &received[0];
    assert_eq!((sent.method.as_str(), sent.path.as_str()), ("POST", "/v1/messages"));
    assert_eq!(sent.header("x-api-key"), Some(KEY));
    assert_eq!(sent.header("anthropic-version"), Some("2023-06-01"));
    assert_eq!(sent.header("authorization"), None);
    assert_eq!(sent.header("content-type"), Some("application/json"));
    assert_eq!(sent.body["model"], "claude-test");
    assert_eq!(sent.body["stream"], true);
    assert_eq!(sent.body["max_tokens"], 4096, "the API requires it: a default");
    assert_eq!(sent.body["temperature"], json!(0.5));
    assert_eq!(sent.body["system"], "You are terse.");
    assert_eq!(
        sent.body["tools"],
        json!([{
            "name": "get_weather",
            "description": "The current weather in a city",
            "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        }])
    );
    assert_eq!(
        sent.body["messages"],
        json!([
            {"role": "user", "content": [{"type": "text", "text": "weather in Tokyo and Paris?"}]},
            {"role": "assistant", "content": [
                {"type": "text", "text": "Let me look."},
                {"type": "tool_use", "id": "call_tokyo", "name": "get_weather", "input": {"city": "Tokyo"}},
                {"type": "tool_use", "id": "call_paris", "name": "get_weather", "input": {"city": "Paris"}},
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "call_tokyo", "content": [{"type": "text", "text": "18C"}]},
                {"type": "tool_result", "tool_use_id": "call_paris", "content": [{"type": "text", "text": "station offline"}], "is_error": true},
                {"type": "text", "text": "and tomorrow?"},
            ]},
        ])
    );
}

#[tokio::test]
async fn tool_use_blocks_come_out_whole_even_when_reads_split_lines() {
    let server = FakeServer::start(vec![Reply::sse(resplit(&two_tools(), 29))]).await;

    let events = events(run(&model_at(&server), request(vec![user("weather in Tokyo and Paris?")])).await);

    assert_eq!(text(&events), "Checking both.");
    assert_eq!(
        calls(&events),
        vec![
            (Some("toolu_01T1x1fJ34qAmk2tNTrN7Up6".into()), "get_weather".into(), json!({"city": "Tokyo"})),
            (Some("toolu_01UvqH3Z9NfBw3HD1gW2wFcT".into()), "get_weather".into(), json!({"city": "Paris"})),
        ]
    );
    assert_eq!(events[events.len() - 2], ModelEvent::Usage(Usage { input_tokens: 472, output_tokens: 89 }));
    assert_eq!(events.last(), Some(&ModelEvent::Stop(ModelStop::ToolUse)));
}

#[tokio::test]
async fn stop_reasons_map_to_stops() {
    for (reason, stop) in
        [("stop_sequence", ModelStop::EndTurn), ("max_tokens", ModelStop::MaxTokens), ("refusal", ModelStop::Refusal)]
    {
        let mut stream =
            vec![message_start(3), block_start(0, r#"{"type":"text","text":""}"#), text_delta(0, "x"), block_stop(0)];
        stream.extend(message_end(reason, 2));
        let server = FakeServer::start(vec![Reply::sse(stream)]).await;

        let events = events(run(&model_at(&server), request(vec![user("hi")])).await);

        assert_eq!(events.last(), Some(&ModelEvent::Stop(stop)), "{reason}");
    }
}

#[tokio::test]
async fn a_429_is_retried_after_its_retry_after() {
    let server = FakeServer::start(vec![
        Reply::error(429, RATE_LIMITED, &[("retry-after", "1"), ("anthropic-ratelimit-input-tokens-remaining", "0")]),
        Reply::sse(thinking_then_text()),
    ])
    .await;
    let started = clock();

    let events = events(run(&model_at(&server), request(vec![user("hi")])).await);

    assert!(started.elapsed() >= Duration::from_millis(950), "{:?}", started.elapsed());
    assert_eq!(text(&events), "Hello!");
    assert_eq!(server.received().len(), 2);
}

#[tokio::test]
async fn a_500_twice_is_retried_with_backoff() {
    let server = FakeServer::start(vec![
        Reply::error(500, API_ERROR, &[]),
        Reply::error(500, API_ERROR, &[]),
        Reply::sse(thinking_then_text()),
    ])
    .await;
    let started = clock();

    let events = events(run(&model_at(&server), request(vec![user("hi")])).await);

    assert!(started.elapsed() >= Duration::from_millis(700), "{:?}", started.elapsed());
    assert_eq!(text(&events), "Hello!");
    assert_eq!(server.received().len(), 3);
}

#[tokio::test]
async fn a_529_is_overloaded_and_honours_retry_after_ms_until_retries_run_out() {
    let overloaded = || Reply::error(529, OVERLOADED, &[("retry-after-ms", "50")]);
    let server = FakeServer::start(vec![overloaded(), overloaded(), overloaded()]).await;
    let model = model("anthropic", &server.url, json!({"max_retries": 2}));
    let started = clock();

    let error = failure(run(&model, request(vec![user("hi")])).await);

    assert_eq!(error.code, "model_overloaded_error");
    assert!(error.message.contains("Overloaded"), "{}", error.message);
    assert!(started.elapsed() < Duration::from_millis(700), "retry-after-ms, not backoff");
    assert_eq!(server.received().len(), 3);
}

#[tokio::test]
async fn a_401_is_an_auth_error_at_once_and_never_shows_the_key() {
    let body = json!({"type": "error", "error": {"type": "authentication_error", "message": format!("invalid x-api-key {KEY}")}});
    let server = FakeServer::start(vec![Reply::error(401, &body.to_string(), &[])]).await;

    let error = failure(run(&model_at(&server), request(vec![user("hi")])).await);

    assert_eq!(error.code, "model_auth_error");
    assert_eq!(server.received().len(), 1);
}

#[tokio::test]
async fn a_400_is_a_request_error_with_the_providers_message() {
    let body = r#"{"type":"error","error":{"type":"invalid_request_error","message":"messages.1.content.0.tool_result: unexpected `tool_use_id` found in `tool_result` blocks: toolu_01. Each `tool_result` block must have a corresponding `tool_use` block in the previous message."},"request_id":"req_011CSHoEeqs5C35K2UUqR7G1"}"#;
    let server = FakeServer::start(vec![Reply::error(400, body, &[])]).await;

    let error = failure(run(&model_at(&server), request(vec![user("hi")])).await);

    assert_eq!(error.code, "model_request_error");
    assert!(error.message.contains("unexpected `tool_use_id` found in `tool_result` blocks"), "{}", error.message);
    assert_eq!(server.received().len(), 1);
}

#[tokio::test]
async fn an_overloaded_error_event_before_any_output_is_retried() {
    let error_event =
        event("error", r#"{"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}"#);
    let server = FakeServer::start(vec![
        Reply::sse(vec![message_start(10), ping(), error_event]),
        Reply::sse(thinking_then_text()),
    ])
    .await;

    let events = events(run(&model_at(&server), request(vec![user("hi")])).await);

    assert_eq!(text(&events), "Hello!");
    assert_eq!(server.received().len(), 2);
}

#[tokio::test]
async fn an_error_event_after_output_ends_the_stream_and_is_not_replayed() {
    let error_event =
        event("error", r#"{"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}"#);
    let server = FakeServer::start(vec![
        Reply::sse(vec![
            message_start(10),
            block_start(0, r#"{"type":"text","text":""}"#),
            text_delta(0, "Hel"),
            error_event,
        ]),
        Reply::sse(thinking_then_text()),
    ])
    .await;

    let results = run(&model_at(&server), request(vec![user("hi")])).await;

    assert_eq!(results[0], Ok(ModelEvent::TextDelta("Hel".into())));
    assert_eq!(failure(results).code, "model_overloaded_error");
    assert_eq!(server.received().len(), 1);
}

#[tokio::test]
async fn a_stalled_stream_times_out_within_the_stall_timeout() {
    let server = FakeServer::start(vec![Reply::stream(Body::Hang(vec![message_start(10)]))]).await;
    let started = clock();

    let error = failure(run(&model_at(&server), request(vec![user("hi")])).await);

    assert_eq!(error.code, "model_timeout_error");
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(900) && took < Duration::from_secs(3), "{took:?}");
    assert_eq!(server.received().len(), 1, "a stall is not retried");
}

#[tokio::test]
async fn cancelling_ends_the_stream_at_once_and_closes_the_connection() {
    let server = FakeServer::start(vec![Reply::stream(Body::Hang(vec![
        message_start(10),
        block_start(0, r#"{"type":"text","text":""}"#),
        text_delta(0, "Hel"),
    ]))])
    .await;
    let model = model("anthropic", &server.url, json!({"stall_timeout_secs": 30}));
    let request = request(vec![user("hi")]);
    let cancel = request.cancel.clone();
    let mut stream = model.stream(request);

    assert_eq!(stream.next().await, Some(Ok(ModelEvent::TextDelta("Hel".into()))));
    cancel.cancel();
    let started = clock();
    let next = tokio::time::timeout(Duration::from_secs(1), stream.next()).await;

    assert_eq!(next, Ok(None), "the stream ends, with no stop and no error");
    assert!(started.elapsed() < Duration::from_millis(200));
    assert!(server.wait_closed(Duration::from_secs(2)).await, "the server saw the connection closed");
}

#[tokio::test]
async fn a_missing_key_variable_is_an_auth_error_before_any_request() {
    let server = FakeServer::start(vec![Reply::sse(thinking_then_text())]).await;
    let model = model("anthropic", &server.url, json!({"api_key_env": "TURNLOG_TEST_UNSET_KEY"}));

    let error = failure(run(&model, request(vec![user("hi")])).await);

    assert_eq!(error.code, "model_auth_error");
    assert!(error.message.contains("TURNLOG_TEST_UNSET_KEY"), "{}", error.message);
    assert!(server.received().is_empty());
}

#[tokio::test]
async fn max_tokens_from_config_and_a_base_url_with_v1_are_used() {
    let server = FakeServer::start(vec![Reply::sse(thinking_then_text())]).await;
    let model = model("anthropic", &format!("{}/v1/", server.url), json!({"max_tokens": 99}));

    events(run(&model, request(vec![user("hi")])).await);

    let sent = &server.received()[0];
    assert_eq!(sent.path, "/v1/messages");
    assert_eq!(sent.body["max_tokens"], 99);
}

#[tokio::test]
async fn images_of_every_view_reach_the_model_as_image_blocks() {
    let server = FakeServer::start(vec![Reply::sse(thinking_then_text())]).await;
    events(run(&model_at(&server), request(vec![images()])).await);
    let sent = &server.received()[0];
    let url = |url: &str| json!({"type": "image", "source": {"type": "url", "url": url}});
    let data = |mime: &str, data: &str| json!({"type": "image", "source": {"type": "base64", "media_type": mime, "data": data}});
    assert_eq!(
        sent.body["messages"],
        json!([{"role": "user", "content": [
            {"type": "text", "text": "what are these?"},
            url("https://example.com/cat.png"),
            data("image/png", "iVBORw0KGgo="),
            url("https://example.com/dog.jpg"),
            data("image/jpeg", "/9j/4AAQ"),
            data("image/gif", "R0lGODlh"),
            data("image/webp", "UklGRg=="),
        ]}]),
        "{}",
        sent.body
    );
}
