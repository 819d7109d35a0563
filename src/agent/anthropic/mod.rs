//! The `anthropic` provider: the Messages API with `stream: true`. The transport, retries
//! and timeouts are in [`super::http`]; this module maps our conversation onto the request,
//! and [`stream`] the streamed events back onto model events.
//!
//! A stream looks like this (`event:` and `data:` lines, blank line between; shortened):
//! ```text
//! event: message_start
//! data: {"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","content":[],"model":"claude-sonnet-4-5","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":472,"output_tokens":2}}}
//!
//! event: content_block_start
//! data: {"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"toolu_1","name":"get_weather","input":{}}}
//!
//! event: content_block_delta
//! data: {"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"{\"city\": \"Par"}}
//!
//! event: content_block_stop
//! data: {"type":"content_block_stop","index":0}
//!
//! event: message_delta
//! data: {"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":89}}
//!
//! event: message_stop
//! data: {"type":"message_stop"}
//! ```

mod stream;

use serde_json::{json, Map, Value};

use super::http::{self, Http, Secret};
use super::model::{Model, ModelRequest, ModelStream, ToolDef};
use super::openai::decimal;
use super::{ModelConfig, ToolChoice};
use crate::domain::event::File;
use crate::domain::{Block, Message, Part};
use stream::StreamDecoder;

const DEFAULT_BASE_URL: &str = "https://api.anthropic.com";
const DEFAULT_KEY_ENV: &str = "ANTHROPIC_API_KEY";
const API_VERSION: &str = "2023-06-01";
/// The API requires `max_tokens`; this is used when the config sets none.
const DEFAULT_MAX_TOKENS: u32 = 4096;

pub struct AnthropicModel {
    name: String,
    url: String,
    /// `None`: a server of the user's own (llama.cpp's `/v1/messages`) that needs no key.
    key_env: Option<String>,
    params: Map<String, Value>,
    tool_choice: ToolChoice,
    http: Http,
}

impl AnthropicModel {
    pub fn new(config: &ModelConfig) -> Result<AnthropicModel, String> {
        if config.name.trim().is_empty() {
            return Err("provider anthropic needs the model `name`".into());
        }
        let base = config.base_url.as_deref().unwrap_or(DEFAULT_BASE_URL);
        // Accept a base URL given with or without the `/v1` the path starts with.
        let base = base.trim_end_matches('/').trim_end_matches("/v1");
        let key_env = match &config.api_key_env {
            Some(env) => Some(env.clone()),
            None if base.starts_with(DEFAULT_BASE_URL) => Some(DEFAULT_KEY_ENV.to_string()),
            None => None,
        };
        let mut params = Map::new();
        let max_tokens = config.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS);
        params.insert("max_tokens".into(), json!(max_tokens));
        if let Some(t) = config.temperature {
            params.insert("temperature".into(), decimal(t));
        }
        if let Some(p) = config.top_p {
            params.insert("top_p".into(), decimal(p));
        }
        Ok(AnthropicModel {
            name: config.name.clone(),
            url: format!("{base}/v1/messages"),
            key_env,
            params,
            tool_choice: config.tool_choice,
            http: Http::new("anthropic", config)?,
        })
    }

    fn body(&self, request: &ModelRequest) -> Value {
        let (system, messages) = conversation(&request.system, &request.messages);
        let mut body = json!({"model": self.name, "messages": messages, "stream": true});
        if !system.is_empty() {
            body["system"] = Value::String(system);
        }
        if !request.tools.is_empty() {
            body["tools"] = request.tools.iter().map(tool).collect();
            match self.tool_choice {
                ToolChoice::Auto => {}
                ToolChoice::Required => body["tool_choice"] = json!({"type": "any"}),
                ToolChoice::None => body["tool_choice"] = json!({"type": "none"}),
            }
        }
        let fields = body.as_object_mut().expect("an object");
        fields.extend(self.params.clone());
        body
    }
}

fn tool(def: &ToolDef) -> Value {
    let schema =
        if def.parameters.is_object() { def.parameters.clone() } else { json!({"type": "object", "properties": {}}) };
    json!({"name": def.name, "description": def.description, "input_schema": schema})
}

/// The system prompt (ours, then any system messages in the history) and the messages.
/// Tool results become `tool_result` blocks of a user message; consecutive messages of
/// one role are merged, because the API wants roles to alternate and all results of one
/// assistant message in the next user message.
fn conversation<M: AsRef<Message>>(system: &str, history: &[M]) -> (String, Vec<Value>) {
    let mut prompt = system.to_string();
    let mut out: Vec<(&'static str, Vec<Value>)> = Vec::new();
    for message in history {
        let (role, blocks) = match message.as_ref() {
            Message::System { content } => {
                if !prompt.is_empty() {
                    prompt.push_str("\n\n");
                }
                prompt.push_str(content);
                continue;
            }
            Message::User { content } => ("user", blocks(content)),
            Message::Assistant { content } => ("assistant", assistant(content)),
            Message::Tool { tool_call_id, content, is_error } => {
                ("user", vec![tool_result(tool_call_id, content, *is_error)])
            }
        };
        if blocks.is_empty() {
            continue;
        }
        match out.last_mut() {
            Some((last, previous)) if *last == role => previous.extend(blocks),
            _ => out.push((role, blocks)),
        }
    }
    let messages = out.into_iter().map(|(role, content)| json!({"role": role, "content": content})).collect();
    (prompt, messages)
}

/// Our blocks are Anthropic's shape already, but for files (images and PDFs become image
/// and document blocks; the model is told of others) and attached context (text); empty
/// text is dropped (the API refuses it).
fn blocks(content: &[Block]) -> Vec<Value> {
    content
        .iter()
        .filter(|b| b.kind != "text" || b.text.as_deref().is_some_and(|t| !t.is_empty()))
        .filter_map(|b| match (b.file(), b.context()) {
            (Some(file), _) => Some(file_block(&file)),
            (None, _) if b.image_url().is_some() => {
                Some(json!({"type": "image", "source": {"type": "url", "url": b.image_url()}}))
            }
            (None, Some(context)) => Some(json!({"type": "text", "text": context})),
            (None, None) if matches!(b.kind.as_str(), "file" | "resource" | "resource_link" | "audio") => None,
            // The text and the API's own fields: clients add fields of their own (ACP's
            // `annotations`, `_meta`), which the API refuses.
            (None, None) if b.kind == "text" => {
                let mut text = json!({"type": "text", "text": b.text});
                for key in ["cache_control", "citations"] {
                    if let Some(value) = b.rest.get(key) {
                        text[key] = value.clone();
                    }
                }
                Some(text)
            }
            (None, None) => serde_json::to_value(b).ok(),
        })
        .collect()
}

fn file_block(file: &File) -> Value {
    let mime = file.mime.to_ascii_lowercase();
    let source = json!({"type": "base64", "media_type": mime, "data": file.base64});
    match mime.as_str() {
        "image/jpeg" | "image/png" | "image/gif" | "image/webp" => json!({"type": "image", "source": source}),
        "application/pdf" => json!({"type": "document", "source": source, "title": file.name}),
        _ => json!({"type": "text", "text": file.unsupported("images (JPEG, PNG, GIF, WebP) and PDFs")}),
    }
}

/// Thinking is not sent back: the API only takes it with the signature we do not keep.
fn assistant(parts: &[Part]) -> Vec<Value> {
    parts
        .iter()
        .filter_map(|part| match part {
            Part::Text { text } if !text.is_empty() => Some(json!({"type": "text", "text": text})),
            Part::ToolUse { tool_call_id, name, input } => Some(json!({
                "type": "tool_use", "id": call_id(tool_call_id), "name": name, "input": input,
            })),
            _ => None,
        })
        .collect()
}

fn tool_result(tool_call_id: &str, content: &[Block], is_error: bool) -> Value {
    let mut result = json!({
        "type": "tool_result",
        "tool_use_id": call_id(tool_call_id),
        "content": blocks(content),
    });
    if is_error {
        result["is_error"] = Value::Bool(true);
    }
    result
}

/// The API takes ids of `[a-zA-Z0-9_-]`; calls made by another provider may have others.
fn call_id(id: &str) -> String {
    id.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' || c == '-' { c } else { '_' }).collect()
}

impl Model for AnthropicModel {
    fn name(&self) -> &str {
        &self.name
    }

    fn provider(&self) -> &'static str {
        "anthropic"
    }

    fn stream(&self, request: ModelRequest) -> ModelStream {
        let key = match http::optional_key("anthropic", self.key_env.as_deref()) {
            Ok(key) => key,
            Err(error) => return http::failed(error),
        };
        let body = self.body(&request);
        let client = self.http.client().clone();
        let url = self.url.clone();
        let header = key.as_ref().and_then(key_header);
        let build = move || {
            let mut request = client
                .post(&url)
                .header("anthropic-version", API_VERSION)
                .header("accept", "text/event-stream")
                .json(&body);
            if let Some(value) = &header {
                request = request.header("x-api-key", value.clone());
            }
            request
        };
        self.http.stream(build, StreamDecoder::default, key, request.cancel)
    }
}

/// `None` for a key with bytes a header cannot carry: the server will answer 401.
fn key_header(key: &Secret) -> Option<reqwest::header::HeaderValue> {
    let mut value = reqwest::header::HeaderValue::from_str(key.expose()).ok()?;
    value.set_sensitive(true);
    Some(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acp_images_and_attached_context_reach_the_model() {
        let blocks_in: Vec<Block> = serde_json::from_value(json!([
            {"type": "text", "text": "look", "annotations": {"priority": 1}, "_meta": {}},
            {"type": "image", "data": "iVBORw0KGgo=", "mimeType": "image/png"},
            {"type": "resource", "resource": {"uri": "file:///a.py", "mimeType": "text/x-python", "text": "print(1)"}},
            {"type": "resource_link", "uri": "file:///b.txt", "name": "b.txt"},
            {"type": "resource", "resource": {"uri": "file:///c.pdf", "mimeType": "application/pdf", "blob": "JVBE"}},
        ]))
        .unwrap();
        assert_eq!(
            Value::Array(blocks(&blocks_in)),
            json!([
                {"type": "text", "text": "look"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}},
                {"type": "text", "text": "<resource uri=\"file:///a.py\">\nprint(1)\n</resource>"},
                {"type": "text", "text": "[b.txt](file:///b.txt)"},
                {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBE"},
                 "title": "file:///c.pdf"},
            ])
        );
    }

    #[test]
    fn tool_results_merge_into_one_user_message_and_system_messages_join_the_prompt() {
        let history = vec![
            Message::User { content: vec![Block::text("go")] },
            Message::Assistant {
                content: vec![
                    Part::Thinking { thinking: "hm".into() },
                    Part::Text { text: String::new() },
                    Part::ToolUse { tool_call_id: "a.1".into(), name: "f".into(), input: json!({}) },
                    Part::ToolUse { tool_call_id: "b".into(), name: "g".into(), input: json!({"x": 1}) },
                ],
            },
            Message::Tool { tool_call_id: "a.1".into(), content: vec![Block::text("A")], is_error: false },
            Message::Tool { tool_call_id: "b".into(), content: vec![Block::text("B")], is_error: true },
            Message::System { content: "be brief".into() },
        ];
        let (system, messages) = conversation("sys", &history);
        assert_eq!(system, "sys\n\nbe brief");
        assert_eq!(
            messages,
            vec![
                json!({"role": "user", "content": [{"type": "text", "text": "go"}]}),
                json!({"role": "assistant", "content": [
                    {"type": "tool_use", "id": "a_1", "name": "f", "input": {}},
                    {"type": "tool_use", "id": "b", "name": "g", "input": {"x": 1}},
                ]}),
                json!({"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "a_1", "content": [{"type": "text", "text": "A"}]},
                    {"type": "tool_result", "tool_use_id": "b", "content": [{"type": "text", "text": "B"}], "is_error": true},
                ]}),
            ]
        );
    }

    #[test]
    fn files_become_image_and_document_blocks_and_others_a_note() {
        let file = |name: &str, mime: &str| {
            serde_json::from_value::<Block>(
                json!({"type": "file", "name": name, "data": format!("data:{mime};base64,AAAA")}),
            )
            .unwrap()
        };
        let content = vec![
            Block::text("see"),
            file("a.png", "image/png"),
            file("b.pdf", "application/pdf"),
            file("c.txt", "text/plain"),
        ];
        let (_, messages) = conversation("", &[Message::User { content }]);
        let source = |mime: &str| json!({"type": "base64", "media_type": mime, "data": "AAAA"});
        assert_eq!(
            messages[0]["content"],
            json!([
                {"type": "text", "text": "see"},
                {"type": "image", "source": source("image/png")},
                {"type": "document", "source": source("application/pdf"), "title": "b.pdf"},
                {"type": "text", "text": "[file c.txt (text/plain) left out: this model takes images (JPEG, PNG, GIF, WebP) and PDFs]"},
            ])
        );
    }
}
