//! The scripted model: deterministic, so that tests, demos and load runs need no network.
//! It reads the last user message; lines starting with `/` are directives, the others
//! are text (DESIGN.md section 4 lists the directives).

use std::time::Duration;

use serde_json::{json, Value};

use super::model::{Model, ModelError, ModelEvent, ModelRequest, ModelStop, ModelStream};
use crate::domain::{Message, Part, Usage};

pub struct ScriptedModel {
    name: String,
}

impl ScriptedModel {
    pub fn new(name: &str) -> ScriptedModel {
        ScriptedModel { name: if name.is_empty() { "scripted".into() } else { name.into() } }
    }
}

#[derive(Debug, Default, PartialEq)]
struct Script {
    text: Vec<String>,
    directives: bool,
    thinking: Option<String>,
    calls: Vec<(String, Value)>,
    words: Option<usize>,
    delay: Option<Duration>,
    looping: bool,
    error: Option<String>,
    refuse: bool,
    max_tokens: bool,
    crash: bool,
    /// `/say <text>`: the reply is exactly this.
    say: Option<String>,
    /// `/whoami`: the reply names the model (`model: NAME`).
    whoami: bool,
}

/// The environment variable that lets `/crash` abort the process (for crash tests only).
pub const CRASH_ENV: &str = "TURNLOG_SCRIPTED_CRASH";

/// The most words `/words` makes (a message of about 700 KB, under the largest event).
const MAX_WORDS: usize = 100_000;
/// The longest `/delay`, a minute.
const MAX_DELAY_MS: u64 = 60_000;

fn parse(text: &str) -> Result<Script, ModelError> {
    let mut script = Script::default();
    for line in text.lines() {
        let Some(directive) = line.strip_prefix('/') else {
            script.text.push(line.to_string());
            continue;
        };
        script.directives = true;
        let (name, rest) = directive.split_once(' ').unwrap_or((directive, ""));
        let rest = rest.trim();
        let bad = |why: &str| ModelError::new("invalid_directive", format!("scripted model: `{line}`: {why}"));
        match name {
            "think" => script.thinking = Some(rest.to_string()),
            "tool" => {
                let (tool, input) = rest.split_once(' ').unwrap_or((rest, "{}"));
                if tool.is_empty() {
                    return Err(bad("needs a tool name"));
                }
                let input: Value = serde_json::from_str(input).map_err(|e| bad(&format!("input is not JSON: {e}")))?;
                if !input.is_object() {
                    return Err(bad("input must be a JSON object"));
                }
                script.calls.push((tool.to_string(), input));
            }
            "words" => {
                let n = rest.parse().ok().filter(|n| *n <= MAX_WORDS);
                script.words = Some(n.ok_or_else(|| bad(&format!("needs a number up to {MAX_WORDS}")))?);
            }
            "delay" => {
                let ms = rest.parse().ok().filter(|ms| *ms <= MAX_DELAY_MS);
                script.delay = Some(Duration::from_millis(
                    ms.ok_or_else(|| bad(&format!("needs milliseconds, up to {MAX_DELAY_MS}")))?,
                ));
            }
            "loop" => script.looping = true,
            "say" => script.say = Some(rest.to_string()),
            "whoami" => script.whoami = true,
            "error" => script.error = Some(if rest.is_empty() { "model_error".into() } else { rest.to_string() }),
            "refuse" => script.refuse = true,
            "max_tokens" => script.max_tokens = true,
            "crash" if std::env::var(CRASH_ENV).is_ok_and(|v| v == "1") => script.crash = true,
            "crash" => return Err(bad(&format!("aborts the process only where {CRASH_ENV}=1 (crash tests)"))),
            _ => return Err(bad("unknown directive")),
        }
    }
    Ok(script)
}

/// What one response says and does.
#[derive(Debug, PartialEq)]
struct Reply {
    thinking: Option<String>,
    text: String,
    calls: Vec<(String, Value)>,
    stop: ModelStop,
    /// Abort the process once the text is streamed (`/crash`).
    crash: bool,
}

/// The fuzz target's entry (`fuzz/fuzz_targets/scripted.rs`): a user's text as the model
/// reads it, directives and all; anything but a panic is an answer.
pub fn fuzz(text: &str) {
    let message = Message::User { content: vec![crate::domain::Block::text(text)] };
    let _ = reply(&[message], "scripted");
}

/// What the model named `name` answers to `messages`.
fn reply<M: AsRef<Message>>(messages: &[M], name: &str) -> Result<Reply, ModelError> {
    let last_user = messages.iter().rposition(|m| matches!(m.as_ref(), Message::User { .. }));
    let user_text = last_user.map(|i| messages[i].as_ref().text()).unwrap_or_default();
    let script = parse(&user_text)?;
    if let Some(code) = script.error {
        return Err(ModelError::new(code, "the scripted model was told to fail"));
    }
    let answered_tools = matches!(messages.last().map(AsRef::as_ref), Some(Message::Tool { .. }));
    if script.looping {
        let call = ("calculator".to_string(), json!({"expression": "1+1"}));
        return Ok(Reply {
            thinking: None,
            text: String::new(),
            calls: vec![call],
            stop: ModelStop::ToolUse,
            crash: false,
        });
    }
    if answered_tools {
        return Ok(Reply {
            thinking: None,
            text: tool_results(messages),
            calls: vec![],
            stop: ModelStop::EndTurn,
            crash: false,
        });
    }
    let said = script.text.join("\n");
    let (text, calls, stop) = if let Some(text) = script.say {
        (text, vec![], ModelStop::EndTurn)
    } else if script.whoami {
        (format!("model: {name}"), vec![], ModelStop::EndTurn)
    } else if script.refuse {
        ("I can't help with that.".to_string(), vec![], ModelStop::Refusal)
    } else if !script.calls.is_empty() {
        (said, script.calls, ModelStop::ToolUse)
    } else if let Some(n) = script.words {
        ((1..=n).map(|i| format!("w{i}")).collect::<Vec<_>>().join(" "), vec![], ModelStop::EndTurn)
    } else if script.max_tokens {
        ("this reply was cut".to_string(), vec![], ModelStop::MaxTokens)
    } else if script.directives {
        (format!("echo: {said}").trim_end().to_string(), vec![], ModelStop::EndTurn)
    } else {
        (format!("echo: {user_text}"), vec![], ModelStop::EndTurn)
    };
    Ok(Reply { thinking: script.thinking, text, calls, stop, crash: script.crash })
}

/// `tool results: name=content; name=content`, in the order of the calls.
fn tool_results<M: AsRef<Message>>(messages: &[M]) -> String {
    let calls = messages.iter().rev().find_map(|m| match m.as_ref() {
        Message::Assistant { content } => Some(content),
        _ => None,
    });
    let results: Vec<String> = calls
        .into_iter()
        .flatten()
        .filter_map(|part| match part {
            Part::ToolUse { tool_call_id, name, .. } => {
                let content = messages.iter().rev().find_map(|m| match m.as_ref() {
                    Message::Tool { tool_call_id: id, .. } if id == tool_call_id => Some(m.as_ref().text()),
                    _ => None,
                });
                Some(format!("{name}={}", content.unwrap_or_default()))
            }
            _ => None,
        })
        .collect();
    format!("tool results: {}", results.join("; "))
}

/// Words with the whitespace before them, so the tokens join back to the exact text.
fn tokens(text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut previous_space = true;
    for c in text.chars() {
        let space = c.is_whitespace();
        match out.last_mut() {
            // A new token starts at the first space after a word.
            Some(token) if !space || previous_space => token.push(c),
            _ => out.push(c.to_string()),
        }
        previous_space = space;
    }
    out
}

impl Model for ScriptedModel {
    fn name(&self) -> &str {
        &self.name
    }

    fn provider(&self) -> &'static str {
        "scripted"
    }

    fn stream(&self, request: ModelRequest) -> ModelStream {
        // The rule of thumb (a token is about four bytes of text), over the whole history,
        // as a provider counts its prompt; cheap, so that a long session's turns cost the
        // server what a remote model would, not a tokenizer.
        let bytes: usize = request.messages.iter().map(|m| m.text_len()).sum();
        let input_tokens = bytes.div_ceil(4) as u64;
        let delay = request
            .messages
            .iter()
            .rev()
            .find(|m| matches!(m.as_ref(), Message::User { .. }))
            .and_then(|m| parse(&m.text()).ok())
            .and_then(|s| s.delay);
        let planned = reply(&request.messages, &self.name);
        Box::pin(async_stream::stream! {
            let reply = match planned {
                Ok(reply) => reply,
                Err(error) => {
                    yield Err(error);
                    return;
                }
            };
            let mut output_tokens = 0u64;
            let thinking = reply.thinking.as_deref().map(tokens).unwrap_or_default();
            let text = tokens(&reply.text);
            let pieces = thinking.into_iter().map(ModelEvent::ThinkingDelta).chain(text.into_iter().map(ModelEvent::TextDelta));
            for piece in pieces {
                if let Some(delay) = delay {
                    tokio::select! {
                        _ = request.cancel.cancelled() => return,
                        _ = tokio::time::sleep(delay) => {}
                    }
                }
                output_tokens += 1;
                yield Ok(piece);
            }
            if reply.crash {
                // Time for what was said to reach the log as deltas, as with a real crash.
                tokio::time::sleep(Duration::from_millis(200)).await;
                tracing::error!("the scripted model aborts the process (/crash)");
                std::process::abort();
            }
            for (name, input) in reply.calls {
                output_tokens += 1;
                yield Ok(ModelEvent::ToolCall { id: None, name, input });
            }
            yield Ok(ModelEvent::Usage(Usage { input_tokens, output_tokens }));
            yield Ok(ModelEvent::Stop(reply.stop));
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::Block;

    fn user(text: &str) -> Message {
        Message::User { content: vec![Block::text(text)] }
    }

    #[test]
    fn tokens_join_back_to_the_text() {
        assert_eq!(tokens("echo: hello  there"), vec!["echo:", " hello", "  there"]);
        assert_eq!(tokens("a\nb").concat(), "a\nb");
    }

    #[test]
    fn plain_text_is_echoed() {
        let r = reply(&[user("hello there")], "scripted").unwrap();
        assert_eq!((r.text.as_str(), r.stop), ("echo: hello there", ModelStop::EndTurn));
    }

    #[test]
    fn directives_shape_the_reply() {
        let r = reply(&[user("look it up\n/think hmm\n/tool a {\"x\":1}\n/tool b {}")], "scripted").unwrap();
        assert_eq!(r.thinking.as_deref(), Some("hmm"));
        assert_eq!(r.text, "look it up");
        assert_eq!(r.calls, vec![("a".into(), json!({"x": 1})), ("b".into(), json!({}))]);
        assert_eq!(r.stop, ModelStop::ToolUse);
        assert_eq!(reply(&[user("/words 3")], "scripted").unwrap().text, "w1 w2 w3");
        assert_eq!(reply(&[user("/refuse")], "scripted").unwrap().stop, ModelStop::Refusal);
        assert_eq!(reply(&[user("/say SATISFIED: done\nignored")], "scripted").unwrap().text, "SATISFIED: done");
        assert_eq!(reply(&[user("/whoami")], "scripted-second").unwrap().text, "model: scripted-second");
        assert_eq!(reply(&[user("/max_tokens")], "scripted").unwrap().stop, ModelStop::MaxTokens);
        assert_eq!(
            reply(&[user("/error model_overloaded_error")], "scripted").unwrap_err().code,
            "model_overloaded_error"
        );
        assert_eq!(reply(&[user("/tool x notjson")], "scripted").unwrap_err().code, "invalid_directive");
        assert_eq!(reply(&[user("/nope")], "scripted").unwrap_err().code, "invalid_directive");
    }

    #[test]
    fn after_tool_results_it_reports_them_in_call_order() {
        let messages = vec![
            user("/tool b {}\n/tool a {}"),
            Message::Assistant {
                content: vec![
                    Part::ToolUse { tool_call_id: "1".into(), name: "b".into(), input: json!({}) },
                    Part::ToolUse { tool_call_id: "2".into(), name: "a".into(), input: json!({}) },
                ],
            },
            Message::Tool { tool_call_id: "2".into(), content: vec![Block::text("A")], is_error: false },
            Message::Tool { tool_call_id: "1".into(), content: vec![Block::text("B")], is_error: false },
        ];
        let r = reply(&messages, "scripted").unwrap();
        assert_eq!(r.text, "tool results: b=B; a=A");
        assert_eq!(r.stop, ModelStop::EndTurn);
    }

    #[test]
    fn loop_calls_the_calculator_every_time() {
        let messages = vec![
            user("/loop"),
            Message::Tool { tool_call_id: "1".into(), content: vec![Block::text("2")], is_error: false },
        ];
        assert_eq!(reply(&messages, "scripted").unwrap().calls[0].0, "calculator");
    }
}
