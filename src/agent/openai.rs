//! The `openai` provider: Chat Completions with `stream: true`, for OpenAI and the servers
//! that speak its dialect (vLLM, llama.cpp, Ollama). The transport, retries and timeouts
//! are in [`super::http`]; this module maps our conversation onto the request and the
//! streamed chunks back onto model events.
//!
//! A stream looks like this (one `data:` line per chunk, blank line between; shortened):
//! ```text
//! data: {"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":"","tool_calls":[{"index":0,"id":"call_a","type":"function","function":{"name":"get_weather","arguments":""}}]},"finish_reason":null}],"usage":null}
//! data: {"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"city\":"}}]},"finish_reason":null}],"usage":null}
//! data: {"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}],"usage":null}
//! data: {"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":80,"completion_tokens":17,"total_tokens":97}}
//! data: [DONE]
//! ```

use std::collections::BTreeMap;

use eventsource_stream::Event;
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::http::{self, Decoder, Failure, Http, Secret, Step};
use super::model::{Model, ModelEvent, ModelRequest, ModelStop, ModelStream, ToolDef};
use super::{ModelConfig, ToolChoice};
use crate::domain::{Block, Message, Part, Usage};

const DEFAULT_BASE_URL: &str = "https://api.openai.com/v1";
/// The key variable used for OpenAI itself when the config names none.
const DEFAULT_KEY_ENV: &str = "OPENAI_API_KEY";

pub struct OpenAiModel {
    name: String,
    url: String,
    /// `None`: a local server that needs no key.
    key_env: Option<String>,
    /// OpenAI's reasoning models refuse `max_tokens`; the compatible servers do not all
    /// know `max_completion_tokens`. So: the new name for OpenAI itself, the old elsewhere.
    max_tokens_field: &'static str,
    params: Map<String, Value>,
    tool_choice: ToolChoice,
    http: Http,
}

impl OpenAiModel {
    pub fn new(config: &ModelConfig) -> Result<OpenAiModel, String> {
        if config.name.trim().is_empty() {
            return Err("provider openai needs the model `name`".into());
        }
        let base = config.base_url.as_deref().unwrap_or(DEFAULT_BASE_URL);
        let base = base.trim_end_matches('/');
        let is_openai = base.starts_with("https://api.openai.com");
        let key_env = match &config.api_key_env {
            Some(env) => Some(env.clone()),
            None if is_openai => Some(DEFAULT_KEY_ENV.to_string()),
            None => None,
        };
        let max_tokens_field = if is_openai { "max_completion_tokens" } else { "max_tokens" };
        let mut model = OpenAiModel {
            name: config.name.clone(),
            url: format!("{base}/chat/completions"),
            key_env,
            max_tokens_field,
            params: Map::new(),
            tool_choice: config.tool_choice,
            http: Http::new("openai", config)?,
        };
        model.params = model.sampling(config);
        Ok(model)
    }

    fn sampling(&self, config: &ModelConfig) -> Map<String, Value> {
        let mut params = Map::new();
        if let Some(max) = config.max_tokens {
            params.insert(self.max_tokens_field.into(), json!(max));
        }
        if let Some(t) = config.temperature {
            params.insert("temperature".into(), decimal(t));
        }
        if let Some(p) = config.top_p {
            params.insert("top_p".into(), decimal(p));
        }
        params
    }

    fn body(&self, request: &ModelRequest) -> Value {
        let mut body = json!({
            "model": self.name,
            "messages": messages(&request.system, &request.messages),
            "stream": true,
            "stream_options": {"include_usage": true},
        });
        if !request.tools.is_empty() {
            body["tools"] = request.tools.iter().map(tool).collect();
            match self.tool_choice {
                ToolChoice::Auto => {}
                ToolChoice::Required => body["tool_choice"] = json!("required"),
                ToolChoice::None => body["tool_choice"] = json!("none"),
            }
        }
        let fields = body.as_object_mut().expect("an object");
        fields.extend(self.params.clone());
        body
    }
}

/// An `f32` from config as the decimal the user wrote (`0.7`, not `0.699999988`).
pub(crate) fn decimal(value: f32) -> Value {
    value.to_string().parse::<f64>().map(Value::from).unwrap_or(Value::Null)
}

fn tool(def: &ToolDef) -> Value {
    let parameters =
        if def.parameters.is_object() { def.parameters.clone() } else { json!({"type": "object", "properties": {}}) };
    json!({
        "type": "function",
        "function": {"name": def.name, "description": def.description, "parameters": parameters},
    })
}

/// Our conversation as chat messages: the system prompt first, assistant tool calls as
/// `tool_calls` with JSON-string arguments, tool results as `role: "tool"`.
fn messages<M: AsRef<Message>>(system: &str, history: &[M]) -> Vec<Value> {
    let mut out = Vec::with_capacity(history.len() + 1);
    if !system.is_empty() {
        out.push(json!({"role": "system", "content": system}));
    }
    for message in history {
        out.push(match message.as_ref() {
            Message::System { content } => json!({"role": "system", "content": content}),
            Message::User { content } => json!({"role": "user", "content": user_content(content)}),
            Message::Assistant { content } => assistant(content),
            Message::Tool { tool_call_id, content, is_error } => {
                // The API has no error flag on tool results; say it in the content.
                let text = Block::join_text(content);
                let text = if *is_error { format!("Error: {text}") } else { text };
                json!({"role": "tool", "tool_call_id": tool_call_id, "content": text})
            }
        });
    }
    out
}

/// Plain text as a string (what every compatible server accepts); images as parts.
fn user_content(blocks: &[Block]) -> Value {
    if blocks.iter().all(|b| b.kind == "text") {
        return Value::String(Block::join_text(blocks));
    }
    blocks.iter().filter_map(user_part).collect()
}

fn user_part(block: &Block) -> Option<Value> {
    if let Some(file) = block.file() {
        return Some(match file.mime.to_ascii_lowercase().as_str() {
            mime if mime.starts_with("image/") => json!({"type": "image_url", "image_url": {"url": file.data_uri()}}),
            "application/pdf" => json!({"type": "file", "file": {"filename": file.name, "file_data": file.data_uri()}}),
            _ => json!({"type": "text", "text": file.unsupported("images and PDFs")}),
        });
    }
    if let Some(url) = block.image_url() {
        return Some(json!({"type": "image_url", "image_url": {"url": url}}));
    }
    if let Some(context) = block.context() {
        return Some(json!({"type": "text", "text": context}));
    }
    match block.kind.as_str() {
        "text" => Some(json!({"type": "text", "text": block.text.clone().unwrap_or_default()})),
        // Other blocks (documents, ...) have no chat-completions form.
        _ => None,
    }
}

/// Thinking is not sent back: the servers that stream reasoning ask not to receive it.
fn assistant(parts: &[Part]) -> Value {
    let mut text = String::new();
    let mut calls = Vec::new();
    for part in parts {
        match part {
            Part::Text { text: t } => text.push_str(t),
            Part::Thinking { .. } => {}
            Part::ToolUse { tool_call_id, name, input } => calls.push(json!({
                "id": tool_call_id,
                "type": "function",
                "function": {"name": name, "arguments": input.to_string()},
            })),
        }
    }
    let mut message = json!({"role": "assistant", "content": text});
    if !calls.is_empty() {
        if text.is_empty() {
            message["content"] = Value::Null;
        }
        message["tool_calls"] = Value::Array(calls);
    }
    message
}

impl Model for OpenAiModel {
    fn name(&self) -> &str {
        &self.name
    }

    fn provider(&self) -> &'static str {
        "openai"
    }

    fn stream(&self, request: ModelRequest) -> ModelStream {
        let key = match http::optional_key("openai", self.key_env.as_deref()) {
            Ok(key) => key,
            Err(error) => return http::failed(error),
        };
        let body = self.body(&request);
        let client = self.http.client().clone();
        let url = self.url.clone();
        let auth = key.clone();
        let build = move || {
            let request = client.post(&url).header("accept", "text/event-stream").json(&body);
            authorize(request, auth.as_ref())
        };
        self.http.stream(build, ChunkDecoder::default, key, request.cancel)
    }
}

fn authorize(request: reqwest::RequestBuilder, key: Option<&Secret>) -> reqwest::RequestBuilder {
    let Some(key) = key else { return request };
    match reqwest::header::HeaderValue::from_str(&format!("Bearer {}", key.expose())) {
        Ok(mut value) => {
            value.set_sensitive(true);
            request.header(reqwest::header::AUTHORIZATION, value)
        }
        // A key with bytes a header cannot carry: the server will answer 401.
        Err(_) => request,
    }
}

#[derive(Deserialize)]
struct Chunk {
    choices: Option<Vec<Choice>>,
    usage: Option<ChunkUsage>,
    error: Option<Value>,
}

#[derive(Deserialize)]
struct Choice {
    #[serde(default)]
    index: usize,
    delta: Option<Delta>,
    finish_reason: Option<String>,
}

#[derive(Deserialize, Default)]
struct Delta {
    content: Option<String>,
    /// vLLM and DeepSeek say `reasoning_content`; Ollama and OpenRouter say `reasoning`.
    reasoning_content: Option<String>,
    reasoning: Option<String>,
    refusal: Option<String>,
    tool_calls: Option<Vec<ToolCallDelta>>,
}

#[derive(Deserialize)]
struct ToolCallDelta {
    index: Option<usize>,
    id: Option<String>,
    function: Option<FunctionDelta>,
}

#[derive(Deserialize)]
struct FunctionDelta {
    name: Option<String>,
    arguments: Option<String>,
}

#[derive(Deserialize)]
struct ChunkUsage {
    #[serde(default)]
    prompt_tokens: u64,
    #[serde(default)]
    completion_tokens: u64,
}

#[derive(Default)]
struct PartialCall {
    id: Option<String>,
    name: String,
    arguments: String,
}

/// Assembles one response from its chunks.
#[derive(Default)]
struct ChunkDecoder {
    /// Calls by the `index` the server gives them; their pieces arrive interleaved.
    calls: BTreeMap<usize, PartialCall>,
    finish: Option<String>,
    usage: Option<Usage>,
    refused: bool,
}

impl Decoder for ChunkDecoder {
    fn event(&mut self, event: &Event) -> Result<Step, Failure> {
        if event.data.trim() == "[DONE]" {
            return self.done().map(Step::Done);
        }
        let chunk: Chunk = serde_json::from_str(&event.data).map_err(|e| {
            Failure::fatal("model_response_error", format!("openai: a stream chunk is not the expected JSON: {e}"))
        })?;
        if let Some(error) = chunk.error {
            return Err(stream_error(&error));
        }
        if let Some(usage) = chunk.usage {
            self.usage = Some(Usage { input_tokens: usage.prompt_tokens, output_tokens: usage.completion_tokens });
        }
        let mut out = Vec::new();
        // We ask for one choice; a server that sends more gets its first one read.
        for choice in chunk.choices.unwrap_or_default() {
            if choice.index == 0 {
                self.choice(choice, &mut out);
            }
        }
        Ok(Step::More(out))
    }

    fn end(&mut self) -> Result<Vec<ModelEvent>, Failure> {
        // Some servers close the stream without `[DONE]`; after a finish that is complete.
        if self.finish.is_none() {
            return Err(Failure::retryable(
                "model_connection_error",
                "openai: the stream ended before the response was complete",
            ));
        }
        self.done()
    }
}

impl ChunkDecoder {
    fn choice(&mut self, choice: Choice, out: &mut Vec<ModelEvent>) {
        let delta = choice.delta.unwrap_or_default();
        for thinking in [delta.reasoning_content, delta.reasoning].into_iter().flatten() {
            if !thinking.is_empty() {
                out.push(ModelEvent::ThinkingDelta(thinking));
            }
        }
        if let Some(text) = delta.content.filter(|t| !t.is_empty()) {
            out.push(ModelEvent::TextDelta(text));
        }
        if let Some(refusal) = delta.refusal.filter(|t| !t.is_empty()) {
            self.refused = true;
            out.push(ModelEvent::TextDelta(refusal));
        }
        for call in delta.tool_calls.into_iter().flatten() {
            self.call_piece(call);
        }
        if choice.finish_reason.is_some() {
            self.finish = choice.finish_reason;
        }
    }

    fn call_piece(&mut self, piece: ToolCallDelta) {
        let index = piece.index.unwrap_or_else(|| self.unindexed(piece.id.as_deref()));
        let call = self.calls.entry(index).or_default();
        if let Some(id) = piece.id.filter(|id| !id.is_empty()) {
            call.id = Some(id);
        }
        if let Some(function) = piece.function {
            if let Some(name) = function.name {
                call.name.push_str(&name);
            }
            if let Some(arguments) = function.arguments {
                call.arguments.push_str(&arguments);
            }
        }
    }

    /// Where a piece without `index` goes (the API requires it; some older servers omit
    /// it): a new id starts a new call, anything else continues the last one.
    fn unindexed(&self, id: Option<&str>) -> usize {
        match self.calls.iter().next_back() {
            None => 0,
            Some((&last, call)) if id.is_some() && call.id.as_deref() != id => last + 1,
            Some((&last, _)) => last,
        }
    }

    /// The complete calls, the usage and the stop, once the response has ended.
    fn done(&mut self) -> Result<Vec<ModelEvent>, Failure> {
        let mut out = Vec::new();
        for (_, call) in std::mem::take(&mut self.calls) {
            out.push(complete_call(call)?);
        }
        let has_calls = !out.is_empty();
        out.extend(self.usage.take().map(ModelEvent::Usage));
        out.push(ModelEvent::Stop(self.stop(has_calls)));
        Ok(out)
    }

    fn stop(&self, has_calls: bool) -> ModelStop {
        match self.finish.as_deref() {
            Some("length") => ModelStop::MaxTokens,
            Some("content_filter") => ModelStop::Refusal,
            Some("tool_calls" | "function_call") => ModelStop::ToolUse,
            _ if self.refused => ModelStop::Refusal,
            // Some servers say `stop` after tool calls; the calls are what counts.
            _ if has_calls => ModelStop::ToolUse,
            _ => ModelStop::EndTurn,
        }
    }
}

fn complete_call(call: PartialCall) -> Result<ModelEvent, Failure> {
    let arguments = call.arguments.trim();
    let input = if arguments.is_empty() {
        json!({})
    } else {
        serde_json::from_str(arguments).map_err(|e| {
            Failure::fatal(
                "model_response_error",
                format!("openai: the arguments of the call of {:?} are not JSON: {e}", call.name),
            )
        })?
    };
    Ok(ModelEvent::ToolCall { id: call.id, name: call.name, input })
}

/// An error sent inside the stream (`data: {"error": {...}}`), as OpenAI and vLLM do.
fn stream_error(error: &Value) -> Failure {
    let message = error["message"].as_str().unwrap_or("the server reported an error");
    let kind = error["type"].as_str().unwrap_or_default();
    let status = error["code"].as_u64().unwrap_or_default();
    let message = format!("openai: {message}");
    if kind == "server_error" || status >= 500 {
        Failure::retryable("model_overloaded_error", message)
    } else if status == 429 || kind == "rate_limit_exceeded" {
        Failure::retryable("model_rate_limited_error", message)
    } else {
        Failure::fatal("model_request_error", message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::ModelError;

    #[test]
    fn acp_images_and_attached_context_become_parts() {
        let blocks: Vec<Block> = serde_json::from_value(json!([
            {"type": "text", "text": "look"},
            {"type": "image", "data": "iVBORw0KGgo=", "mimeType": "image/png"},
            {"type": "resource", "resource": {"uri": "file:///a.py", "text": "print(1)"}},
            {"type": "audio", "data": "AAAA", "mimeType": "audio/wav"},
        ]))
        .unwrap();
        assert_eq!(
            user_content(&blocks),
            json!([
                {"type": "text", "text": "look"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
                {"type": "text", "text": "<resource uri=\"file:///a.py\">\nprint(1)\n</resource>"},
            ])
        );
    }

    /// Decodes the `data:` of each event in turn, as the transport would feed them.
    fn events(data: &[&str]) -> Result<Vec<ModelEvent>, ModelError> {
        let mut decoder = ChunkDecoder::default();
        let mut out = Vec::new();
        for data in data {
            let event = Event { data: data.to_string(), ..Event::default() };
            match decoder.event(&event).map_err(|f| f.error)? {
                Step::More(events) => out.extend(events),
                Step::Done(events) => {
                    out.extend(events);
                    return Ok(out);
                }
            }
        }
        out.extend(decoder.end().map_err(|f| f.error)?);
        Ok(out)
    }

    #[test]
    fn files_become_image_and_file_parts_and_others_a_note() {
        let file = |name: &str, mime: &str| {
            serde_json::from_value::<Block>(
                json!({"type": "file", "name": name, "data": format!("data:{mime};base64,AAAA")}),
            )
            .unwrap()
        };
        let content = [
            Block::text("see"),
            file("a.png", "image/png"),
            file("b.pdf", "application/pdf"),
            file("c.txt", "text/plain"),
        ];
        assert_eq!(
            user_content(&content),
            json!([
                {"type": "text", "text": "see"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                {"type": "file", "file": {"filename": "b.pdf", "file_data": "data:application/pdf;base64,AAAA"}},
                {"type": "text", "text": "[file c.txt (text/plain) left out: this model takes images and PDFs]"},
            ])
        );
    }

    #[test]
    fn pieces_of_parallel_calls_are_assembled_by_index() {
        let out = events(&[
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"a","function":{"name":"f","arguments":"{\"x\""}},{"index":1,"id":"b","function":{"name":"g","arguments":""}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"function":{"arguments":"{}"}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":":1}"}}]},"finish_reason":"stop"}]}"#,
            "[DONE]",
        ])
        .unwrap();
        assert_eq!(
            out,
            vec![
                ModelEvent::ToolCall { id: Some("a".into()), name: "f".into(), input: json!({"x": 1}) },
                ModelEvent::ToolCall { id: Some("b".into()), name: "g".into(), input: json!({}) },
                ModelEvent::Stop(ModelStop::ToolUse),
            ]
        );
    }

    #[test]
    fn calls_without_an_index_are_told_apart_by_id() {
        let out = events(&[
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"id":"a","function":{"name":"f","arguments":"{}"}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"id":"b","function":{"name":"g","arguments":"{\"y\""}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"function":{"arguments":":2}"}}]},"finish_reason":"tool_calls"}]}"#,
            "[DONE]",
        ])
        .unwrap();
        assert_eq!(
            out[..2],
            [
                ModelEvent::ToolCall { id: Some("a".into()), name: "f".into(), input: json!({}) },
                ModelEvent::ToolCall { id: Some("b".into()), name: "g".into(), input: json!({"y": 2}) },
            ]
        );
    }

    #[test]
    fn finish_reasons_map_to_stops() {
        let stop = |reason: &str| {
            let chunk = format!(r#"{{"choices":[{{"index":0,"delta":{{}},"finish_reason":"{reason}"}}]}}"#);
            events(&[&chunk, "[DONE]"]).unwrap().pop().unwrap()
        };
        assert_eq!(stop("stop"), ModelEvent::Stop(ModelStop::EndTurn));
        assert_eq!(stop("length"), ModelEvent::Stop(ModelStop::MaxTokens));
        assert_eq!(stop("content_filter"), ModelEvent::Stop(ModelStop::Refusal));
        assert_eq!(stop("tool_calls"), ModelEvent::Stop(ModelStop::ToolUse));
    }

    #[test]
    fn a_cut_stream_and_bad_arguments_are_errors() {
        let cut = events(&[r#"{"choices":[{"index":0,"delta":{"content":"hi"}}]}"#]);
        assert_eq!(cut.unwrap_err().code, "model_connection_error");
        let bad = events(&[
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"a","function":{"name":"f","arguments":"{"}}]},"finish_reason":"tool_calls"}]}"#,
            "[DONE]",
        ]);
        assert_eq!(bad.unwrap_err().code, "model_response_error");
    }

    #[test]
    fn history_maps_onto_chat_messages() {
        let history = vec![
            Message::User { content: vec![Block::text("hi")] },
            Message::Assistant {
                content: vec![
                    Part::Thinking { thinking: "hmm".into() },
                    Part::ToolUse { tool_call_id: "c1".into(), name: "f".into(), input: json!({"a": 1}) },
                ],
            },
            Message::Tool { tool_call_id: "c1".into(), content: vec![Block::text("no")], is_error: true },
        ];
        assert_eq!(
            messages("sys", &history),
            vec![
                json!({"role": "system", "content": "sys"}),
                json!({"role": "user", "content": "hi"}),
                json!({"role": "assistant", "content": null, "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"a\":1}"}}
                ]}),
                json!({"role": "tool", "tool_call_id": "c1", "content": "Error: no"}),
            ]
        );
    }

    #[test]
    fn config_decimals_stay_as_written() {
        assert_eq!(decimal(0.7), json!(0.7));
    }
}
