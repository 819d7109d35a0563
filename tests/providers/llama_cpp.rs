//! What llama.cpp's `llama-server` sends, recorded from the one `scripts/llama` builds
//! (llama-cpp-python 0.3.36's llama.cpp, SmolLM2-135M) and replayed byte for byte by the
//! fake: where it differs from OpenAI's and Anthropic's own servers, the providers must
//! read it all the same. The same server, live, is `tests/llama` (in `scripts/test`).

use serde_json::json;
use turnlog::agent::{ModelEvent, ModelStop};
use turnlog::domain::Usage;

use crate::fake::{FakeServer, Reply};
use crate::support::*;

/// Chat Completions (`tool_choice: "required"`, the Functionary v3.2 chat template): a
/// first chunk with `content: null`, the arguments in pieces, the finish, then the usage
/// (with llama.cpp's own `timings`) in a chunk with no choices, then `[DONE]`.
const OPENAI_TOOL_CALL: &[&str] = &[
    r#"{"choices":[{"finish_reason":null,"index":0,"delta":{"role":"assistant","content":null}}],"created":1795840320,"id":"chatcmpl-aCsH6NC0LQJ0AUMqQChaXZBevWdxEmvh","model":"smol","system_fingerprint":"b1-0c1e570","object":"chat.completion.chunk"}"#,
    r#"{"choices":[{"finish_reason":null,"index":0,"delta":{"tool_calls":[{"index":0,"id":"Sw6hN0DWm64TGGEcwbdMkUfG02vJ9tY8","type":"function","function":{"name":"get_weather","arguments":"{"}}]}}],"created":1795840320,"id":"chatcmpl-aCsH6NC0LQJ0AUMqQChaXZBevWdxEmvh","model":"smol","system_fingerprint":"b1-0c1e570","object":"chat.completion.chunk"}"#,
    r#"{"choices":[{"finish_reason":null,"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\n\n\""}}]}}],"created":1795840320,"id":"chatcmpl-aCsH6NC0LQJ0AUMqQChaXZBevWdxEmvh","model":"smol","system_fingerprint":"b1-0c1e570","object":"chat.completion.chunk"}"#,
    r#"{"choices":[{"finish_reason":null,"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"city"}}]}}],"created":1795840320,"id":"chatcmpl-aCsH6NC0LQJ0AUMqQChaXZBevWdxEmvh","model":"smol","system_fingerprint":"b1-0c1e570","object":"chat.completion.chunk"}"#,
    r#"{"choices":[{"finish_reason":null,"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\":"}}]}}],"created":1795840320,"id":"chatcmpl-aCsH6NC0LQJ0AUMqQChaXZBevWdxEmvh","model":"smol","system_fingerprint":"b1-0c1e570","object":"chat.completion.chunk"}"#,
    r#"{"choices":[{"finish_reason":null,"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":" \""}}]}}],"created":1795840320,"id":"chatcmpl-aCsH6NC0LQJ0AUMqQChaXZBevWdxEmvh","model":"smol","system_fingerprint":"b1-0c1e570","object":"chat.completion.chunk"}"#,
    r#"{"choices":[{"finish_reason":null,"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"Paris"}}]}}],"created":1795840320,"id":"chatcmpl-aCsH6NC0LQJ0AUMqQChaXZBevWdxEmvh","model":"smol","system_fingerprint":"b1-0c1e570","object":"chat.completion.chunk"}"#,
    r#"{"choices":[{"finish_reason":null,"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\""}}]}}],"created":1795840320,"id":"chatcmpl-aCsH6NC0LQJ0AUMqQChaXZBevWdxEmvh","model":"smol","system_fingerprint":"b1-0c1e570","object":"chat.completion.chunk"}"#,
    r#"{"choices":[{"finish_reason":null,"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\n}"}}]}}],"created":1795840320,"id":"chatcmpl-aCsH6NC0LQJ0AUMqQChaXZBevWdxEmvh","model":"smol","system_fingerprint":"b1-0c1e570","object":"chat.completion.chunk"}"#,
    r#"{"choices":[{"finish_reason":"tool_calls","index":0,"delta":{}}],"created":1795840320,"id":"chatcmpl-aCsH6NC0LQJ0AUMqQChaXZBevWdxEmvh","model":"smol","system_fingerprint":"b1-0c1e570","object":"chat.completion.chunk"}"#,
    r#"{"choices":[],"created":1795840320,"id":"chatcmpl-aCsH6NC0LQJ0AUMqQChaXZBevWdxEmvh","model":"smol","system_fingerprint":"b1-0c1e570","object":"chat.completion.chunk","usage":{"completion_tokens":16,"prompt_tokens":199,"total_tokens":215,"prompt_tokens_details":{"cached_tokens":0}},"timings":{"cache_n":0,"prompt_n":199,"prompt_ms":688.063,"prompt_per_token_ms":3.4576030150753767,"prompt_per_second":289.21770244875836,"predicted_n":16,"predicted_ms":216.221,"predicted_per_token_ms":14.414733333333334,"predicted_per_second":69.37346511208439}}"#,
    r#"[DONE]"#,
];

/// The same call on the Messages API (`tool_choice: {"type": "any"}`): its `tool_use` block
/// starts without `input` (Anthropic sends `"input": {}`), and the prompt it had cached
/// counts as `cache_read_input_tokens` beside one new input token.
const ANTHROPIC_TOOL_USE: &[(&str, &str)] = &[
    (
        "message_start",
        r#"{"type":"message_start","message":{"id":"chatcmpl-Q5VaQcpmzPWzsssnchjNLsDDAXZC44mO","type":"message","role":"assistant","content":[],"model":"smol","stop_reason":null,"stop_sequence":null,"usage":{"cache_read_input_tokens":198,"input_tokens":1,"output_tokens":0}}}"#,
    ),
    (
        "content_block_start",
        r#"{"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"ZFxsD68Agcat0xUCLzuUqvgaVBkwAzWN","name":"get_weather"}}"#,
    ),
    (
        "content_block_delta",
        r#"{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"{"}}"#,
    ),
    (
        "content_block_delta",
        r#"{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"\n\n\""}}"#,
    ),
    (
        "content_block_delta",
        r#"{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"city"}}"#,
    ),
    (
        "content_block_delta",
        r#"{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"\":"}}"#,
    ),
    (
        "content_block_delta",
        r#"{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":" \""}}"#,
    ),
    (
        "content_block_delta",
        r#"{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"Paris"}}"#,
    ),
    (
        "content_block_delta",
        r#"{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"\""}}"#,
    ),
    (
        "content_block_delta",
        r#"{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"\n}"}}"#,
    ),
    ("content_block_stop", r#"{"type":"content_block_stop","index":0}"#),
    (
        "message_delta",
        r#"{"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":16}}"#,
    ),
    ("message_stop", r#"{"type":"message_stop"}"#),
];

/// What the server answered a prompt of 5,031 tokens with 2,048 tokens of context, on both
/// APIs.
const CONTEXT_EXCEEDED: &str = r#"{"error":{"code":400,"message":"request (5031 tokens) exceeds the available context size (2048 tokens), try increasing it","type":"exceed_context_size_error","n_prompt_tokens":5031,"n_ctx":2048}}"#;

fn paris() -> (Option<String>, String, serde_json::Value) {
    (Some("Sw6hN0DWm64TGGEcwbdMkUfG02vJ9tY8".into()), "get_weather".into(), json!({"city": "Paris"}))
}

#[tokio::test]
async fn a_forced_call_on_chat_completions() {
    let pieces = OPENAI_TOOL_CALL.iter().map(|data| format!("data: {data}\n\n")).collect();
    let server = FakeServer::start(vec![Reply::sse(pieces)]).await;
    let model = model("openai", &format!("{}/v1", server.url), json!({"api_key_env": null, "tool_choice": "required"}));

    let events = events(run(&model, request(vec![user("What is the weather in Paris?")])).await);

    assert_eq!(calls(&events), vec![paris()]);
    assert_eq!(events[events.len() - 2], ModelEvent::Usage(Usage { input_tokens: 199, output_tokens: 16 }));
    assert_eq!(events.last(), Some(&ModelEvent::Stop(ModelStop::ToolUse)));
    let sent = &server.received()[0];
    assert_eq!(sent.body["tool_choice"], "required");
    assert_eq!(sent.header("authorization"), None);
}

#[tokio::test]
async fn a_forced_call_on_the_messages_api_from_a_server_that_needs_no_key() {
    let pieces = ANTHROPIC_TOOL_USE.iter().map(|(kind, data)| format!("event: {kind}\ndata: {data}\n\n")).collect();
    let server = FakeServer::start(vec![Reply::sse(pieces)]).await;
    let mut id = paris();
    id.0 = Some("ZFxsD68Agcat0xUCLzuUqvgaVBkwAzWN".into());
    let model = model("anthropic", &server.url, json!({"api_key_env": null, "tool_choice": "required"}));

    let events = events(run(&model, request(vec![user("What is the weather in Paris?")])).await);

    assert_eq!(calls(&events), vec![id]);
    assert_eq!(events[events.len() - 2], ModelEvent::Usage(Usage { input_tokens: 199, output_tokens: 16 }));
    assert_eq!(events.last(), Some(&ModelEvent::Stop(ModelStop::ToolUse)));
    let sent = &server.received()[0];
    assert_eq!(sent.body["tool_choice"], json!({"type": "any"}));
    assert_eq!(sent.header("x-api-key"), None, "no key is sent to a server of the user's own");
}

#[tokio::test]
async fn a_prompt_past_the_context_is_its_own_error_and_not_retried() {
    for (provider, path) in [("openai", "/v1"), ("anthropic", "")] {
        let server = FakeServer::start(vec![Reply::error(400, CONTEXT_EXCEEDED, &[])]).await;
        let model = model(provider, &format!("{}{path}", server.url), json!({}));

        let error = failure(run(&model, request(vec![user("...")])).await);

        assert_eq!(error.code, "model_context_exceeded_error", "{provider}");
        assert!(error.message.contains("exceeds the available context size (2048 tokens)"), "{}", error.message);
        assert_eq!(server.received().len(), 1, "{provider}: not retried");
    }
}
