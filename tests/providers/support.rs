//! What the provider tests share: a model built from config the way the server builds
//! it, a conversation with tool calls and results, and ways to read a model stream.

use std::sync::{Arc, Once};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;
use turnlog::agent::{build_model, Model, ModelConfig, ModelError, ModelEvent, ModelRequest, ToolDef};
use turnlog::domain::{Block, Message, Part};

/// The variable the tests' models read their key from, and the key. Fake servers echo
/// the key in their error bodies so that tests can check it never reaches an error.
pub const KEY_ENV: &str = "TURNLOG_PROVIDER_TEST_KEY";
pub const KEY: &str = "sk-test-Zq8xL2secret4f1c";

fn set_key() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| std::env::set_var(KEY_ENV, KEY));
}

/// A model of `provider` against `base_url`, with a 1 s stall timeout; `extra` overrides
/// config keys (a `null` removes one).
pub fn model(provider: &str, base_url: &str, extra: Value) -> Arc<dyn Model> {
    set_key();
    let mut config = json!({
        "provider": provider,
        "name": if provider == "openai" { "gpt-test" } else { "claude-test" },
        "base_url": base_url,
        "api_key_env": KEY_ENV,
        "timeout_secs": 20,
        "stall_timeout_secs": 1,
        "max_retries": 3,
    });
    for (key, value) in extra.as_object().cloned().unwrap_or_default() {
        if value.is_null() {
            config.as_object_mut().unwrap().remove(&key);
        } else {
            config[key] = value;
        }
    }
    let config: ModelConfig = serde_json::from_value(config).expect("model config");
    build_model(&config).expect("model builds")
}

pub fn weather_tool() -> ToolDef {
    ToolDef {
        name: "get_weather".into(),
        description: "The current weather in a city".into(),
        parameters: json!({
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        }),
    }
}

pub fn user(text: &str) -> Message {
    Message::User { content: vec![Block::text(text)] }
}

/// A user question, an assistant that said something and called two tools, both
/// results (the second an error), and a follow-up question.
pub fn conversation() -> Vec<Message> {
    vec![
        user("weather in Tokyo and Paris?"),
        Message::Assistant {
            content: vec![
                Part::Thinking { thinking: "two cities".into() },
                Part::Text { text: "Let me look.".into() },
                Part::ToolUse {
                    tool_call_id: "call_tokyo".into(),
                    name: "get_weather".into(),
                    input: json!({"city": "Tokyo"}),
                },
                Part::ToolUse {
                    tool_call_id: "call_paris".into(),
                    name: "get_weather".into(),
                    input: json!({"city": "Paris"}),
                },
            ],
        },
        Message::Tool { tool_call_id: "call_tokyo".into(), content: vec![Block::text("18C")], is_error: false },
        Message::Tool {
            tool_call_id: "call_paris".into(),
            content: vec![Block::text("station offline")],
            is_error: true,
        },
        user("and tomorrow?"),
    ]
}

pub fn request(messages: Vec<Message>) -> ModelRequest {
    ModelRequest {
        system: "You are terse.".into(),
        messages: messages.into_iter().map(std::sync::Arc::new).collect(),
        tools: vec![weather_tool()],
        cancel: CancellationToken::new(),
    }
}

pub type Results = Vec<Result<ModelEvent, ModelError>>;

/// Everything the model streams for `request` (bounded, so a hang fails the test).
pub async fn run(model: &Arc<dyn Model>, request: ModelRequest) -> Results {
    let stream = model.stream(request);
    tokio::time::timeout(Duration::from_secs(30), stream.collect::<Vec<_>>()).await.expect("the model stream ends")
}

/// The events of a stream that must have succeeded, ending with exactly one stop.
pub fn events(results: Results) -> Vec<ModelEvent> {
    let events: Vec<ModelEvent> = results.into_iter().map(|r| r.expect("no model error")).collect();
    let stops = events.iter().filter(|e| matches!(e, ModelEvent::Stop(_))).count();
    assert_eq!(stops, 1, "{events:?}");
    assert!(matches!(events.last(), Some(ModelEvent::Stop(_))), "{events:?}");
    events
}

/// The error a failed stream ended with: its last item, and no stop before it.
pub fn failure(results: Results) -> ModelError {
    let (last, before) = results.split_last().expect("an item");
    assert!(before.iter().all(|r| matches!(r, Ok(e) if !matches!(e, ModelEvent::Stop(_)))), "{results:?}");
    let error = last.clone().expect_err("the stream ends with an error");
    assert!(!error.message.contains(KEY) && !error.code.contains(KEY), "the key leaked: {error:?}");
    error
}

pub fn text(events: &[ModelEvent]) -> String {
    events
        .iter()
        .filter_map(|e| match e {
            ModelEvent::TextDelta(t) => Some(t.as_str()),
            _ => None,
        })
        .collect()
}

pub fn thinking(events: &[ModelEvent]) -> String {
    events
        .iter()
        .filter_map(|e| match e {
            ModelEvent::ThinkingDelta(t) => Some(t.as_str()),
            _ => None,
        })
        .collect()
}

pub fn calls(events: &[ModelEvent]) -> Vec<(Option<String>, String, Value)> {
    events
        .iter()
        .filter_map(|e| match e {
            ModelEvent::ToolCall { id, name, input } => Some((id.clone(), name.clone(), input.clone())),
            _ => None,
        })
        .collect()
}

/// The stream's bytes cut into pieces of `size`, regardless of line and event ends: a
/// client must put SSE events together across reads.
pub fn resplit(pieces: &[String], size: usize) -> Vec<String> {
    let all = pieces.concat();
    let bytes = all.as_bytes();
    bytes.chunks(size).map(|c| String::from_utf8(c.to_vec()).expect("ASCII streams")).collect()
}

/// Starts a timer for "this took at least / at most".
pub fn clock() -> Instant {
    Instant::now()
}

/// A user message with an image in every shape a view stores one: AAP's (`url`, an
/// address or a `data:` URI), Anthropic's (`source` of type `url` or `base64`), ACP's
/// (`data` and `mimeType`) and the agent harness's (`file`, a `data:` URI).
pub fn images() -> Message {
    let content = serde_json::from_value(json!([
        {"type": "text", "text": "what are these?"},
        {"type": "image", "url": "https://example.com/cat.png"},
        {"type": "image", "url": "data:image/png;base64,iVBORw0KGgo="},
        {"type": "image", "source": {"type": "url", "url": "https://example.com/dog.jpg"}},
        {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": "/9j/4AAQ"}},
        {"type": "image", "data": "R0lGODlh", "mimeType": "image/gif"},
        {"type": "file", "name": "shot.webp", "data": "data:image/webp;base64,UklGRg=="},
    ]))
    .expect("blocks");
    Message::User { content }
}
