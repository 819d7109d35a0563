//! The Messages API's streamed events, decoded into model events: text and thinking as they
//! come, tool calls once their input is whole, usage (cached input added in) and the stop.

use std::collections::HashMap;

use eventsource_stream::Event;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::agent::http::{Decoder, Failure, Step};
use crate::agent::model::{ModelEvent, ModelStop};
use crate::domain::Usage;

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum StreamEvent {
    MessageStart {
        message: MessageStart,
    },
    ContentBlockStart {
        index: usize,
        content_block: ContentBlock,
    },
    ContentBlockDelta {
        index: usize,
        delta: Delta,
    },
    ContentBlockStop {
        index: usize,
    },
    MessageDelta {
        delta: MessageDelta,
        usage: Option<WireUsage>,
    },
    MessageStop,
    Error {
        error: ApiError,
    },
    /// `ping`, and event types added after this was written.
    #[serde(other)]
    Other,
}

#[derive(Deserialize)]
struct MessageStart {
    usage: Option<WireUsage>,
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum ContentBlock {
    Text {
        #[serde(default)]
        text: String,
    },
    Thinking {
        #[serde(default)]
        thinking: String,
    },
    ToolUse {
        id: String,
        name: String,
        #[serde(default)]
        input: Value,
    },
    #[serde(other)]
    Other,
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Delta {
    #[serde(rename = "text_delta")]
    Text { text: String },
    #[serde(rename = "thinking_delta")]
    Thinking { thinking: String },
    #[serde(rename = "input_json_delta")]
    InputJson { partial_json: String },
    /// `signature_delta`, `citations_delta`, ...: nothing we keep.
    #[serde(other)]
    Other,
}

#[derive(Deserialize)]
struct MessageDelta {
    stop_reason: Option<String>,
}

/// Input counts come at the start and (in newer responses) again at the end; output
/// counts at the end are cumulative.
#[derive(Deserialize)]
struct WireUsage {
    input_tokens: Option<u64>,
    cache_creation_input_tokens: Option<u64>,
    cache_read_input_tokens: Option<u64>,
    output_tokens: Option<u64>,
}

#[derive(Deserialize)]
struct ApiError {
    #[serde(rename = "type", default)]
    kind: String,
    #[serde(default)]
    message: String,
}

/// A tool-use block being streamed.
struct PartialCall {
    id: String,
    name: String,
    start: Value,
    json: String,
}

/// Assembles one response from its events.
#[derive(Default)]
pub(super) struct StreamDecoder {
    calls: HashMap<usize, PartialCall>,
    usage: Usage,
    stop: Option<ModelStop>,
}

impl Decoder for StreamDecoder {
    fn event(&mut self, event: &Event) -> Result<Step, Failure> {
        let parsed: StreamEvent = serde_json::from_str(&event.data).map_err(|e| {
            Failure::fatal("model_response_error", format!("anthropic: a stream event is not the expected JSON: {e}"))
        })?;
        let out = match parsed {
            StreamEvent::MessageStart { message } => {
                self.add_usage(message.usage);
                vec![]
            }
            StreamEvent::ContentBlockStart { index, content_block } => self.start(index, content_block),
            StreamEvent::ContentBlockDelta { index, delta } => self.delta(index, delta),
            StreamEvent::ContentBlockStop { index } => self.finish_call(index)?,
            StreamEvent::MessageDelta { delta, usage } => {
                self.add_usage(usage);
                if let Some(reason) = delta.stop_reason.as_deref() {
                    self.stop = Some(stop(reason));
                }
                vec![]
            }
            StreamEvent::MessageStop => return Ok(Step::Done(self.done())),
            StreamEvent::Error { error } => return Err(stream_error(&error)),
            StreamEvent::Other => vec![],
        };
        Ok(Step::More(out))
    }

    fn end(&mut self) -> Result<Vec<ModelEvent>, Failure> {
        // The stop reason came; only `message_stop` is missing.
        if self.stop.is_some() {
            return Ok(self.done());
        }
        Err(Failure::retryable(
            "model_connection_error",
            "anthropic: the stream ended before the response was complete",
        ))
    }
}

impl StreamDecoder {
    fn start(&mut self, index: usize, block: ContentBlock) -> Vec<ModelEvent> {
        match block {
            ContentBlock::Text { text } if !text.is_empty() => vec![ModelEvent::TextDelta(text)],
            ContentBlock::Thinking { thinking } if !thinking.is_empty() => {
                vec![ModelEvent::ThinkingDelta(thinking)]
            }
            ContentBlock::ToolUse { id, name, input } => {
                let start = input;
                let json = String::new();
                self.calls.insert(index, PartialCall { id, name, start, json });
                vec![]
            }
            _ => vec![],
        }
    }

    fn delta(&mut self, index: usize, delta: Delta) -> Vec<ModelEvent> {
        match delta {
            Delta::Text { text } if !text.is_empty() => vec![ModelEvent::TextDelta(text)],
            Delta::Thinking { thinking } if !thinking.is_empty() => {
                vec![ModelEvent::ThinkingDelta(thinking)]
            }
            Delta::InputJson { partial_json } => {
                if let Some(call) = self.calls.get_mut(&index) {
                    call.json.push_str(&partial_json);
                }
                vec![]
            }
            _ => vec![],
        }
    }

    /// A tool-use block is complete at its `content_block_stop`.
    fn finish_call(&mut self, index: usize) -> Result<Vec<ModelEvent>, Failure> {
        let Some(call) = self.calls.remove(&index) else {
            return Ok(vec![]);
        };
        let json = call.json.trim();
        let input = if !json.is_empty() {
            serde_json::from_str(json).map_err(|e| {
                Failure::fatal(
                    "model_response_error",
                    format!("anthropic: the input of the call of {:?} is not JSON: {e}", call.name),
                )
            })?
        } else if call.start.is_object() {
            call.start
        } else {
            json!({})
        };
        Ok(vec![ModelEvent::ToolCall { id: Some(call.id), name: call.name, input }])
    }

    fn add_usage(&mut self, usage: Option<WireUsage>) {
        let Some(usage) = usage else { return };
        // Cached input is counted apart by this API; we report all input the model read.
        let parts = [usage.input_tokens, usage.cache_creation_input_tokens, usage.cache_read_input_tokens];
        if parts.iter().any(Option::is_some) {
            self.usage.input_tokens = parts.iter().flatten().sum();
        }
        if let Some(output) = usage.output_tokens {
            self.usage.output_tokens = output;
        }
    }

    fn done(&mut self) -> Vec<ModelEvent> {
        let stop = self.stop.unwrap_or(ModelStop::EndTurn);
        vec![ModelEvent::Usage(self.usage), ModelEvent::Stop(stop)]
    }
}

fn stop(reason: &str) -> ModelStop {
    match reason {
        "tool_use" => ModelStop::ToolUse,
        "max_tokens" | "model_context_window_exceeded" => ModelStop::MaxTokens,
        "refusal" => ModelStop::Refusal,
        // `end_turn`, `stop_sequence`, `pause_turn` and reasons added later.
        _ => ModelStop::EndTurn,
    }
}

/// An `error` event inside the stream, by its error type.
fn stream_error(error: &ApiError) -> Failure {
    let message = format!("anthropic: {}: {}", error.kind, error.message);
    match error.kind.as_str() {
        "overloaded_error" | "api_error" => Failure::retryable("model_overloaded_error", message),
        "rate_limit_error" => Failure::retryable("model_rate_limited_error", message),
        "timeout_error" => Failure::retryable("model_timeout_error", message),
        "authentication_error" | "permission_error" => {
            Failure::fatal("model_auth_error", "anthropic: the API key was refused")
        }
        _ => Failure::fatal("model_request_error", message),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(data: &[&str]) -> Vec<ModelEvent> {
        let mut decoder = StreamDecoder::default();
        let mut out = Vec::new();
        for data in data {
            let event = Event { data: data.to_string(), ..Event::default() };
            match decoder.event(&event).map_err(|f| f.error).unwrap() {
                Step::More(events) => out.extend(events),
                Step::Done(events) => out.extend(events),
            }
        }
        out
    }

    #[test]
    fn usage_adds_cached_input_and_keeps_the_last_output() {
        let out = decode(&[
            r#"{"type":"message_start","message":{"usage":{"input_tokens":10,"cache_read_input_tokens":5,"output_tokens":1}}}"#,
            r#"{"type":"message_delta","delta":{"stop_reason":"max_tokens"},"usage":{"output_tokens":30}}"#,
            r#"{"type":"message_stop"}"#,
        ]);
        assert_eq!(
            out,
            vec![
                ModelEvent::Usage(Usage { input_tokens: 15, output_tokens: 30 }),
                ModelEvent::Stop(ModelStop::MaxTokens),
            ]
        );
    }

    #[test]
    fn a_tool_with_no_input_deltas_gets_its_start_input() {
        let out = decode(&[
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"t","name":"now","input":{}}}"#,
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":""}}"#,
            r#"{"type":"content_block_stop","index":0}"#,
        ]);
        assert_eq!(out, vec![ModelEvent::ToolCall { id: Some("t".into()), name: "now".into(), input: json!({}) }]);
    }

    #[test]
    fn stop_reasons_map() {
        assert_eq!(stop("end_turn"), ModelStop::EndTurn);
        assert_eq!(stop("stop_sequence"), ModelStop::EndTurn);
        assert_eq!(stop("tool_use"), ModelStop::ToolUse);
        assert_eq!(stop("max_tokens"), ModelStop::MaxTokens);
        assert_eq!(stop("refusal"), ModelStop::Refusal);
    }
}
