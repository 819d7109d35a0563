//! The `openai` provider against a fake Chat Completions server that sends what OpenAI
//! sends. A real stream (`stream_options.include_usage`), one `data:` line per chunk:
//!
//! ```text
//! data: {"id":"chatcmpl-BxK3x","object":"chat.completion.chunk","created":1754380000,"model":"gpt-4.1-2025-04-14","service_tier":"default","system_fingerprint":"fp_799e4ca3f1","choices":[{"index":0,"delta":{"role":"assistant","content":"","refusal":null},"logprobs":null,"finish_reason":null}],"usage":null}
//!
//! data: {"id":"chatcmpl-BxK3x","object":"chat.completion.chunk","created":1754380000,"model":"gpt-4.1-2025-04-14","service_tier":"default","system_fingerprint":"fp_799e4ca3f1","choices":[{"index":0,"delta":{"content":"Hello"},"logprobs":null,"finish_reason":null}],"usage":null}
//!
//! data: {"id":"chatcmpl-BxK3x","object":"chat.completion.chunk","created":1754380000,"model":"gpt-4.1-2025-04-14","service_tier":"default","system_fingerprint":"fp_799e4ca3f1","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}],"usage":null}
//!
//! data: {"id":"chatcmpl-BxK3x","object":"chat.completion.chunk","created":1754380000,"model":"gpt-4.1-2025-04-14","service_tier":"default","system_fingerprint":"fp_799e4ca3f1","choices":[],"usage":{"prompt_tokens":19,"completion_tokens":10,"total_tokens":29,"prompt_tokens_details":{"cached_tokens":0,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":0,"audio_tokens":0,"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}}}
//!
//! data: [DONE]
//! ```

use std::time::Duration;

use serde_json::json;
use turnlog::agent::{ModelEvent, ModelStop};
use turnlog::domain::Usage;

use crate::fake::{Body, FakeServer, Reply};
use crate::support::*;

/// One chunk as OpenAI frames it, with `choice` as its only choice.
fn chunk(choice: &str) -> String {
    format!(
        "data: {{\"id\":\"chatcmpl-BxK3x\",\"object\":\"chat.completion.chunk\",\"created\":1754380000,\"model\":\"gpt-4.1-2025-04-14\",\"service_tier\":\"default\",\"system_fingerprint\":\"fp_799e4ca3f1\",\"choices\":[{choice}],\"usage\":null}}\n\n"
    )
}

fn delta(delta: &str) -> String {
    chunk(&format!("{{\"index\":0,\"delta\":{delta},\"logprobs\":null,\"finish_reason\":null}}"))
}

fn finish(reason: &str) -> String {
    chunk(&format!("{{\"index\":0,\"delta\":{{}},\"logprobs\":null,\"finish_reason\":\"{reason}\"}}"))
}

fn usage(prompt: u64, completion: u64) -> String {
    format!(
        "data: {{\"id\":\"chatcmpl-BxK3x\",\"object\":\"chat.completion.chunk\",\"created\":1754380000,\"model\":\"gpt-4.1-2025-04-14\",\"service_tier\":\"default\",\"system_fingerprint\":\"fp_799e4ca3f1\",\"choices\":[],\"usage\":{{\"prompt_tokens\":{prompt},\"completion_tokens\":{completion},\"total_tokens\":{},\"prompt_tokens_details\":{{\"cached_tokens\":0,\"audio_tokens\":0}},\"completion_tokens_details\":{{\"reasoning_tokens\":0,\"audio_tokens\":0,\"accepted_prediction_tokens\":0,\"rejected_prediction_tokens\":0}}}}}}\n\n",
        prompt + completion
    )
}

const DONE: &str = "data: [DONE]\n\n";

fn hello_stream() -> Vec<String> {
    vec![
        delta(r#"{"role":"assistant","content":"","refusal":null}"#),
        delta(r#"{"content":"Hello"}"#),
        delta(r#"{"content":" there"}"#),
        delta(r#"{"content":"!"}"#),
        finish("stop"),
        usage(19, 10),
        DONE.to_string(),
    ]
}

/// `get_weather` for Tokyo, then for Paris, in parallel; each call's arguments in
/// pieces, as OpenAI streams them (id and name in the first piece of each call).
fn two_calls_stream() -> Vec<String> {
    vec![
        delta(
            r#"{"role":"assistant","content":null,"tool_calls":[{"index":0,"id":"call_DdmO9pD3xa9XTPNJ32zg2hcA","type":"function","function":{"name":"get_weather","arguments":""}}],"refusal":null}"#,
        ),
        delta(r#"{"tool_calls":[{"index":0,"function":{"arguments":"{\""}}]}"#),
        delta(r#"{"tool_calls":[{"index":0,"function":{"arguments":"city"}}]}"#),
        delta(r#"{"tool_calls":[{"index":0,"function":{"arguments":"\":\""}}]}"#),
        delta(r#"{"tool_calls":[{"index":0,"function":{"arguments":"Tok"}}]}"#),
        delta(r#"{"tool_calls":[{"index":0,"function":{"arguments":"yo\"}"}}]}"#),
        delta(
            r#"{"tool_calls":[{"index":1,"id":"call_ABzWm6QzjXnqZ4BgoNmjVdGs","type":"function","function":{"name":"get_weather","arguments":""}}]}"#,
        ),
        delta(r#"{"tool_calls":[{"index":1,"function":{"arguments":"{\"ci"}}]}"#),
        delta(r#"{"tool_calls":[{"index":1,"function":{"arguments":"ty\": \"Pa"}}]}"#),
        delta(r#"{"tool_calls":[{"index":1,"function":{"arguments":"ris\"}"}}]}"#),
        finish("tool_calls"),
        usage(82, 51),
        DONE.to_string(),
    ]
}

const RATE_LIMITED: &str = r#"{
    "error": {
        "message": "Rate limit reached for gpt-4.1 in organization org-Qf3 on requests per min (RPM): Limit 500, Used 500, Requested 1. Please try again in 120ms. Visit https://platform.openai.com/account/rate-limits to learn more.",
        "type": "requests",
        "param": null,
        "code": "rate_limit_exceeded"
    }
}"#;

const SERVER_ERROR: &str = r#"{
  "error": {
    "message": "The server had an error while processing your request. Sorry about that!",
    "type": "server_error",
    "param": null,
    "code": null
  }
}"#;

fn unauthorized() -> String {
    // OpenAI masks the key it quotes; this fake quotes all of it, to prove we never do.
    json!({"error": {
        "message": format!("Incorrect API key provided: {KEY}. You can find your API key at https://platform.openai.com/account/api-keys."),
        "type": "invalid_request_error", "param": null, "code": "invalid_api_key",
    }})
    .to_string()
}

fn model_at(server: &FakeServer) -> std::sync::Arc<dyn turnlog::agent::Model> {
    model("openai", &format!("{}/v1", server.url), json!({}))
}

#[tokio::test]
async fn text_streams_with_usage_and_the_request_is_what_openai_expects() {
    let server = FakeServer::start(vec![Reply::sse(hello_stream())]).await;
    let model =
        model("openai", &format!("{}/v1/", server.url), json!({"max_tokens": 256, "temperature": 0.7, "top_p": 0.9}));

    let events = events(run(&model, request(conversation())).await);

    assert_eq!(text(&events), "Hello there!");
    let tail = &events[events.len() - 2..];
    assert_eq!(
        tail,
        [ModelEvent::Usage(Usage { input_tokens: 19, output_tokens: 10 }), ModelEvent::Stop(ModelStop::EndTurn),]
    );
    let received = server.received();
    assert_eq!(received.len(), 1);
    let sent = &received[0];
    assert_eq!((sent.method.as_str(), sent.path.as_str()), ("POST", "/v1/chat/completions"));
    assert_eq!(sent.header("authorization"), Some(format!("Bearer {KEY}").as_str()));
    assert_eq!(sent.header("content-type"), Some("application/json"));
    assert_eq!(sent.body["model"], "gpt-test");
    assert_eq!(sent.body["stream"], true);
    assert_eq!(sent.body["stream_options"], json!({"include_usage": true}));
    assert_eq!(sent.body["max_tokens"], 256);
    assert_eq!(sent.body["temperature"], json!(0.7));
    assert_eq!(sent.body["top_p"], json!(0.9));
    assert_eq!(
        sent.body["tools"],
        json!([{"type": "function", "function": {
            "name": "get_weather",
            "description": "The current weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        }}])
    );
    assert_eq!(
        sent.body["messages"],
        json!([
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "weather in Tokyo and Paris?"},
            {"role": "assistant", "content": "Let me look.", "tool_calls": [
                {"id": "call_tokyo", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Tokyo\"}"}},
                {"id": "call_paris", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}},
            ]},
            {"role": "tool", "tool_call_id": "call_tokyo", "content": "18C"},
            {"role": "tool", "tool_call_id": "call_paris", "content": "Error: station offline"},
            {"role": "user", "content": "and tomorrow?"},
        ])
    );
}

#[tokio::test]
async fn parallel_calls_in_pieces_come_out_whole_even_when_reads_split_lines() {
    let server = FakeServer::start(vec![Reply::sse(resplit(&two_calls_stream(), 37))]).await;

    let events = events(run(&model_at(&server), request(vec![user("weather in Tokyo and Paris?")])).await);

    assert_eq!(
        calls(&events),
        vec![
            (Some("call_DdmO9pD3xa9XTPNJ32zg2hcA".into()), "get_weather".into(), json!({"city": "Tokyo"})),
            (Some("call_ABzWm6QzjXnqZ4BgoNmjVdGs".into()), "get_weather".into(), json!({"city": "Paris"})),
        ]
    );
    assert_eq!(events[events.len() - 2], ModelEvent::Usage(Usage { input_tokens: 82, output_tokens: 51 }));
    assert_eq!(events.last(), Some(&ModelEvent::Stop(ModelStop::ToolUse)));
}

#[tokio::test]
async fn reasoning_from_vllm_and_ollama_is_thinking() {
    let stream = vec![
        delta(r#"{"role":"assistant","content":""}"#),
        delta(r#"{"reasoning_content":"The user greets. "}"#),
        delta(r#"{"reasoning":"Greet back."}"#),
        delta(r#"{"content":"Hi!"}"#),
        finish("length"),
        usage(5, 7),
        DONE.to_string(),
    ];
    let server = FakeServer::start(vec![Reply::sse(stream)]).await;

    let events = events(run(&model_at(&server), request(vec![user("hi")])).await);

    assert_eq!(thinking(&events), "The user greets. Greet back.");
    assert_eq!(text(&events), "Hi!");
    assert_eq!(events.last(), Some(&ModelEvent::Stop(ModelStop::MaxTokens)));
}

#[tokio::test]
async fn a_content_filter_stop_is_a_refusal() {
    let stream = vec![delta(r#"{"content":"I can't"}"#), finish("content_filter"), DONE.to_string()];
    let server = FakeServer::start(vec![Reply::sse(stream)]).await;

    let events = events(run(&model_at(&server), request(vec![user("hi")])).await);

    assert_eq!(events.last(), Some(&ModelEvent::Stop(ModelStop::Refusal)));
}

#[tokio::test]
async fn a_429_is_retried_after_its_retry_after() {
    let server =
        FakeServer::start(vec![Reply::error(429, RATE_LIMITED, &[("retry-after", "1")]), Reply::sse(hello_stream())])
            .await;
    let started = clock();

    let events = events(run(&model_at(&server), request(vec![user("hi")])).await);

    assert!(started.elapsed() >= Duration::from_millis(950), "{:?}", started.elapsed());
    assert_eq!(text(&events), "Hello there!");
    let received = server.received();
    assert_eq!(received.len(), 2);
    assert_eq!(received[0].raw_body, received[1].raw_body, "the same request again");
}

#[tokio::test]
async fn a_500_twice_is_retried_with_backoff() {
    let server = FakeServer::start(vec![
        Reply::error(500, SERVER_ERROR, &[]),
        Reply::error(500, SERVER_ERROR, &[]),
        Reply::sse(hello_stream()),
    ])
    .await;
    let started = clock();

    let events = events(run(&model_at(&server), request(vec![user("hi")])).await);

    // Backoff of 0.25–0.5 s, then 0.5–1 s.
    assert!(started.elapsed() >= Duration::from_millis(700), "{:?}", started.elapsed());
    assert_eq!(text(&events), "Hello there!");
    assert_eq!(server.received().len(), 3);
}

#[tokio::test]
async fn retries_give_up_with_the_last_status_code() {
    let server = FakeServer::start(vec![
        Reply::error(503, SERVER_ERROR, &[("retry-after-ms", "20")]),
        Reply::error(503, SERVER_ERROR, &[("retry-after-ms", "20")]),
        Reply::error(429, RATE_LIMITED, &[("retry-after-ms", "20")]),
    ])
    .await;
    let model = model("openai", &format!("{}/v1", server.url), json!({"max_retries": 2}));

    let error = failure(run(&model, request(vec![user("hi")])).await);

    assert_eq!(error.code, "model_rate_limited_error");
    assert!(error.message.contains("Rate limit reached"), "{}", error.message);
    assert_eq!(server.received().len(), 3);
}

#[tokio::test]
async fn a_401_is_an_auth_error_at_once_and_never_shows_the_key() {
    let server = FakeServer::start(vec![Reply::error(401, &unauthorized(), &[])]).await;

    let error = failure(run(&model_at(&server), request(vec![user("hi")])).await);

    assert_eq!(error.code, "model_auth_error");
    assert_eq!(server.received().len(), 1);
}

#[tokio::test]
async fn a_400_is_a_request_error_with_the_providers_message() {
    let body = json!({"error": {
        "message": format!("Invalid 'messages[1].content': string too long (request from key {KEY})."),
        "type": "invalid_request_error", "param": "messages[1].content", "code": "string_above_max_length",
    }});
    let server = FakeServer::start(vec![Reply::error(400, &body.to_string(), &[])]).await;

    let error = failure(run(&model_at(&server), request(vec![user("hi")])).await);

    assert_eq!(error.code, "model_request_error");
    assert!(error.message.contains("Invalid 'messages[1].content': string too long"), "{}", error.message);
    assert_eq!(server.received().len(), 1);
}

#[tokio::test]
async fn an_error_inside_the_stream_before_any_output_is_retried() {
    let stream_error = "data: {\"error\":{\"message\":\"The server had an error while processing your request. Sorry about that!\",\"type\":\"server_error\",\"param\":null,\"code\":null}}\n\n";
    let server = FakeServer::start(vec![
        Reply::sse(vec![delta(r#"{"role":"assistant","content":""}"#), stream_error.to_string()]),
        Reply::sse(hello_stream()),
    ])
    .await;

    let events = events(run(&model_at(&server), request(vec![user("hi")])).await);

    assert_eq!(text(&events), "Hello there!");
    assert_eq!(server.received().len(), 2);
}

#[tokio::test]
async fn a_stream_cut_after_output_fails_and_is_not_replayed() {
    let server = FakeServer::start(vec![
        Reply::stream(Body::Cut(vec![delta(r#"{"content":"Hel"}"#)])),
        Reply::sse(hello_stream()),
    ])
    .await;

    let results = run(&model_at(&server), request(vec![user("hi")])).await;

    assert_eq!(results[0], Ok(ModelEvent::TextDelta("Hel".into())));
    assert_eq!(failure(results).code, "model_connection_error");
    assert_eq!(server.received().len(), 1);
}

#[tokio::test]
async fn a_stalled_stream_times_out_within_the_stall_timeout() {
    let server = FakeServer::start(vec![Reply::stream(Body::Hang(vec![delta(r#"{"content":"Hel"}"#)]))]).await;
    let started = clock();

    let error = failure(run(&model_at(&server), request(vec![user("hi")])).await);

    assert_eq!(error.code, "model_timeout_error");
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(900) && took < Duration::from_secs(3), "{took:?}");
    assert!(server.wait_closed(Duration::from_secs(2)).await, "the connection is dropped");
}

#[tokio::test]
async fn the_whole_request_times_out_after_timeout_secs() {
    // A chunk every 300 ms keeps the stall timer quiet; the 1 s request limit ends it.
    let pieces = (0..10).map(|_| delta(r#"{"content":"."}"#)).collect();
    let server = FakeServer::start(vec![Reply::stream(Body::Slow(pieces, Duration::from_millis(300)))]).await;
    let model = model("openai", &format!("{}/v1", server.url), json!({"timeout_secs": 1, "stall_timeout_secs": 5}));
    let started = clock();

    let error = failure(run(&model, request(vec![user("hi")])).await);

    assert_eq!(error.code, "model_timeout_error");
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(900) && took < Duration::from_secs(2), "{took:?}");
}

#[tokio::test]
async fn cancelling_ends_the_stream_at_once_and_closes_the_connection() {
    let server = FakeServer::start(vec![Reply::stream(Body::Hang(vec![
        delta(r#"{"role":"assistant","content":""}"#),
        delta(r#"{"content":"Hel"}"#),
    ]))])
    .await;
    let model = model("openai", &format!("{}/v1", server.url), json!({"stall_timeout_secs": 30}));
    let request = request(vec![user("hi")]);
    let cancel = request.cancel.clone();
    let mut stream = model.stream(request);

    use futures_util::StreamExt;
    let first = stream.next().await;
    assert_eq!(first, Some(Ok(ModelEvent::TextDelta("Hel".into()))));
    cancel.cancel();
    let started = clock();
    let next = tokio::time::timeout(Duration::from_secs(1), stream.next()).await;

    assert_eq!(next, Ok(None), "the stream ends, with no stop and no error");
    assert!(started.elapsed() < Duration::from_millis(200));
    assert!(server.wait_closed(Duration::from_secs(2)).await, "the server saw the connection closed");
}

#[tokio::test]
async fn dropping_the_stream_closes_the_connection() {
    let server = FakeServer::start(vec![Reply::stream(Body::Hang(vec![delta(r#"{"content":"Hel"}"#)]))]).await;
    let model = model("openai", &format!("{}/v1", server.url), json!({"stall_timeout_secs": 30}));
    let mut stream = model.stream(request(vec![user("hi")]));

    use futures_util::StreamExt;
    assert!(stream.next().await.is_some());
    drop(stream);

    assert!(server.wait_closed(Duration::from_secs(2)).await);
}

#[tokio::test]
async fn a_local_server_needs_no_key() {
    let server = FakeServer::start(vec![Reply::sse(hello_stream())]).await;
    let model = model("openai", &format!("{}/v1", server.url), json!({"api_key_env": null}));

    events(run(&model, request(vec![user("hi")])).await);

    assert_eq!(server.received()[0].header("authorization"), None);
}

#[tokio::test]
async fn a_missing_key_variable_is_an_auth_error_before_any_request() {
    let server = FakeServer::start(vec![Reply::sse(hello_stream())]).await;
    let model = model("openai", &format!("{}/v1", server.url), json!({"api_key_env": "TURNLOG_TEST_UNSET_KEY"}));

    let error = failure(run(&model, request(vec![user("hi")])).await);

    assert_eq!(error.code, "model_auth_error");
    assert!(error.message.contains("TURNLOG_TEST_UNSET_KEY"), "{}", error.message);
    assert!(server.received().is_empty());
}

#[tokio::test]
async fn a_server_that_is_not_there_is_a_connection_error_after_retries() {
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let model = model("openai", &format!("http://127.0.0.1:{port}/v1"), json!({"max_retries": 1}));

    let error = failure(run(&model, request(vec![user("hi")])).await);

    assert_eq!(error.code, "model_connection_error");
}

#[test]
fn a_model_without_a_name_does_not_build() {
    let config: turnlog::agent::ModelConfig = serde_json::from_value(json!({"provider": "openai"})).unwrap();
    assert!(turnlog::agent::build_model(&config).is_err());
}

#[tokio::test]
async fn images_of_every_view_reach_the_model_as_image_url_parts() {
    let server = FakeServer::start(vec![Reply::sse(hello_stream())]).await;
    events(run(&model_at(&server), request(vec![images()])).await);
    let sent = &server.received()[0];
    let url = |url: &str| json!({"type": "image_url", "image_url": {"url": url}});
    assert_eq!(
        sent.body["messages"][1],
        json!({"role": "user", "content": [
            {"type": "text", "text": "what are these?"},
            url("https://example.com/cat.png"),
            url("data:image/png;base64,iVBORw0KGgo="),
            url("https://example.com/dog.jpg"),
            url("data:image/jpeg;base64,/9j/4AAQ"),
            url("data:image/gif;base64,R0lGODlh"),
            url("data:image/webp;base64,UklGRg=="),
        ]}),
        "{}",
        sent.body
    );
}
