//! Keeping a long session inside its model's context window (docs/compaction.md). Before
//! each model request the turn estimates the request's size; past the agent's threshold it
//! makes the history smaller, records how in a `history.compacted` event (from which the
//! compacted history folds, also after a restart) and goes on with the smaller history.
//! The log and the full history keep everything. A compaction that fails changes nothing:
//! the request goes out as it was.

use std::sync::Arc;

use super::{append, Failure, TurnContext};
use crate::agent::{ContextBudget as Budget, ModelRequest};
use crate::domain::event::Compaction;
use crate::domain::{Block, EventBody, Message, Part, Usage};
use crate::metrics;
use crate::projection::history::History;

/// What the model is told when it writes a summary.
const INSTRUCTIONS: &str = "You compact a conversation between a user and an AI agent so that it can go on \
within the agent's context window. Write a summary of the conversation given: what the user asked for, \
what was decided and done (tool calls and what they returned), the facts and names that matter, and what \
is still open. Write only the summary, as plain prose or a list.";

/// What a message costs beyond its text, in bytes (its role, its framing).
const FRAMING: usize = 16;

fn tokens(bytes: usize) -> u64 {
    Usage::estimated_tokens(bytes)
}

/// A message's size as a request carries it: its text, and its calls' names and inputs.
/// Images count nothing (their cost depends on the provider).
fn message_bytes(message: &Message) -> usize {
    let calls: usize = match message {
        Message::Assistant { content } => content
            .iter()
            .map(|part| match part {
                Part::ToolUse { tool_call_id, name, input } => {
                    tool_call_id.len() + name.len() + input.to_string().len()
                }
                _ => 0,
            })
            .sum(),
        _ => 0,
    };
    message.text_len() + calls + FRAMING
}

/// What every request of the turn carries beside its history: the system prompt and the
/// tools offered, in bytes.
fn fixed_bytes(ctx: &TurnContext) -> usize {
    let tools: usize =
        ctx.plan.defs.iter().map(|d| d.name.len() + d.description.len() + d.parameters.to_string().len()).sum();
    ctx.agent.config.system.len() + tools
}

/// The estimated size of the turn's next request, in tokens.
pub(super) fn request_size(ctx: &TurnContext) -> u64 {
    request_tokens(fixed_bytes(ctx), &ctx.history)
}

/// The estimated size of a request with `messages` as its history, beside `fixed` bytes.
fn request_tokens(fixed: usize, messages: &[Arc<Message>]) -> u64 {
    tokens(fixed + messages.iter().map(|m| message_bytes(m)).sum::<usize>())
}

/// Makes the history fit the agent's context budget before a model request, if it has one
/// and the request would pass it.
pub(super) async fn fit(ctx: &mut TurnContext, usage: &mut Usage) -> Result<(), Failure> {
    let Some(budget) = ctx.agent.context_budget(&ctx.model) else { return Ok(()) };
    let fixed = fixed_bytes(ctx);
    let before = request_tokens(fixed, &ctx.history);
    if before <= budget.compact_above {
        return Ok(());
    }
    // The current turn's messages (from its user message on) are never compacted.
    let Some(current) = ctx.history.iter().rposition(|m| matches!(**m, Message::User { .. })) else {
        return Ok(());
    };
    let mut now = before;
    if budget.drop_tool_outputs {
        let mut cut = ctx.history.clone();
        History::cut_tool_outputs(&mut cut, current);
        let after = request_tokens(fixed, &cut);
        if after < now {
            record(ctx, Compaction::ToolOutputs, current, String::new(), (now, after), Usage::default())?;
            ctx.history = cut;
            now = after;
            if now <= budget.keep {
                return Ok(());
            }
        }
    }
    // Cut where a user message starts, so that calls and their results stay together: the
    // fewest messages that bring the request within `keep` with the summary, or, if none
    // does, all but the current turn's.
    let cuts: Vec<usize> = (1..=current).filter(|&i| matches!(*ctx.history[i], Message::User { .. })).collect();
    let summary = budget.summary + tokens(message_bytes(&History::summary_message("")));
    // What is kept from each place on, in bytes, summed once from the end.
    let mut kept = vec![0; ctx.history.len() + 1];
    for (i, message) in ctx.history.iter().enumerate().rev() {
        kept[i] = kept[i + 1] + message_bytes(message);
    }
    let fits = |&&i: &&usize| tokens(fixed + kept[i]) + summary <= budget.keep;
    let Some(&n) = cuts.iter().find(fits).or(cuts.last()) else { return Ok(()) };
    let (summary, cost) = match summarise(ctx, n, &budget).await {
        Ok(done) => done,
        Err(Failure::Model(error)) => {
            tracing::warn!(%error, turn_id = %ctx.turn, "a compaction failed: the request goes out uncompacted");
            metrics::COMPACTIONS.with_label_values(&["failed"]).inc();
            return Ok(());
        }
        Err(failure) => return Err(failure),
    };
    *usage += cost;
    let mut compacted = ctx.history.clone();
    History::summarise(&mut compacted, n, &summary);
    let after = request_tokens(fixed, &compacted);
    record(ctx, Compaction::Summary, n, summary, (now, after), cost)?;
    ctx.history = compacted;
    Ok(())
}

/// The budget of a compaction asked for by an agent with no context window: requests of
/// about 24k tokens, a summary of at most 1k.
const ASKED: Budget = Budget { compact_above: 24_576, keep: 16_384, summary: 1_024, drop_tool_outputs: false };

/// Compacts the whole conversation so far, as the user asked (`user.compact`): its messages
/// are summarised by the model, in as many requests as the agent's budget takes. One
/// message (a summary already) or none is left as it is. Unlike a compaction the turn
/// makes to fit a request, a failure here fails the turn: nothing else was asked for.
pub(super) async fn now(ctx: &mut TurnContext, usage: &mut Usage) -> Result<(), Failure> {
    let n = ctx.history.len();
    if n < 2 {
        return Ok(());
    }
    let budget = ctx.agent.context_budget(&ctx.model).unwrap_or(ASKED);
    let fixed = fixed_bytes(ctx);
    let before = request_tokens(fixed, &ctx.history);
    let (summary, cost) = summarise(ctx, n, &budget).await?;
    *usage += cost;
    let mut compacted = ctx.history.clone();
    History::summarise(&mut compacted, n, &summary);
    let after = request_tokens(fixed, &compacted);
    record(ctx, Compaction::Summary, n, summary, (before, after), cost)?;
    ctx.history = compacted;
    Ok(())
}

fn record(
    ctx: &TurnContext,
    strategy: Compaction,
    messages: usize,
    summary: String,
    (tokens_before, tokens_after): (u64, u64),
    usage: Usage,
) -> Result<(), Failure> {
    let messages = u32::try_from(messages).unwrap_or(u32::MAX);
    append(ctx, vec![EventBody::HistoryCompacted { strategy, messages, summary, tokens_before, tokens_after, usage }])?;
    let label = match strategy {
        Compaction::Summary => "summary",
        Compaction::ToolOutputs => "tool_outputs",
    };
    metrics::COMPACTIONS.with_label_values(&[label]).inc();
    Ok(())
}

/// The model's summary of the history's first `n` messages, written in as many requests
/// as it takes for each to fit the budget (each given the summary so far), and what the
/// requests cost.
async fn summarise(ctx: &TurnContext, n: usize, budget: &Budget) -> Result<(String, Usage), Failure> {
    // Room in one request for the conversation, beside the instructions and the summary so far.
    let room = budget.compact_above.saturating_sub(tokens(INSTRUCTIONS.len()) + 2 * budget.summary).max(64);
    let room_bytes = usize::try_from(room * 4).unwrap_or(usize::MAX);
    let (mut summary, mut usage, mut chunk) = (String::new(), Usage::default(), String::new());
    for message in &ctx.history[..n] {
        let line = clip(transcript(message), room_bytes / 2);
        if !chunk.is_empty() && chunk.len() + line.len() > room_bytes {
            summary = ask(ctx, &summary, &chunk, budget, &mut usage).await?;
            chunk.clear();
        }
        chunk.push_str(&line);
    }
    if !chunk.is_empty() {
        summary = ask(ctx, &summary, &chunk, budget, &mut usage).await?;
    }
    Ok((summary, usage))
}

/// One summary request: the summary so far and the next part of the conversation in, the
/// new summary (at most the budget's size) out.
async fn ask(
    ctx: &TurnContext,
    so_far: &str,
    conversation: &str,
    budget: &Budget,
    usage: &mut Usage,
) -> Result<String, Failure> {
    let text = match so_far.is_empty() {
        true => format!("The conversation:\n\n{conversation}"),
        false => format!("The summary so far:\n\n{so_far}\n\nThe conversation after it:\n\n{conversation}"),
    };
    let request = ModelRequest {
        system: INSTRUCTIONS.into(),
        messages: vec![Arc::new(Message::User { content: vec![Block::text(text)] })],
        tools: Vec::new(),
        cancel: ctx.cancel.clone(),
    };
    let (said, used) = super::model::text(ctx, request).await.map_err(|(failure, _)| failure)?;
    *usage += used;
    let said = said.trim();
    if said.is_empty() {
        return Err(Failure::Model(crate::agent::ModelError::new("compaction_failed", "the model wrote no summary")));
    }
    let most = usize::try_from(budget.summary * 4).unwrap_or(usize::MAX);
    Ok(clip(said.to_string(), most))
}

/// A message as lines of a transcript a model reads (to summarise it, or to grade it):
/// who said it, then its text, each line after the first indented.
pub(super) fn transcript(message: &Message) -> String {
    let indented = |text: &str| text.replace('\n', "\n  ");
    match message {
        Message::System { content } => format!("System: {}\n", indented(content)),
        Message::User { content } => format!("User: {}\n", indented(&Block::join_text(content))),
        Message::Tool { content, is_error, .. } => {
            let error = if *is_error { " (an error)" } else { "" };
            format!("Tool result{error}: {}\n", indented(&Block::join_text(content)))
        }
        Message::Assistant { content } => {
            let mut line = String::new();
            for part in content {
                match part {
                    Part::Text { text } => line.push_str(&format!("Assistant: {}\n", indented(text))),
                    Part::ToolUse { name, input, .. } => line.push_str(&format!("Assistant called {name}({input})\n")),
                    Part::Thinking { .. } => {}
                }
            }
            line
        }
    }
}

/// At most `most` bytes of `text`, cut at a character's edge, saying so when cut.
fn clip(mut text: String, most: usize) -> String {
    if text.len() <= most {
        return text;
    }
    let mut end = most.saturating_sub(16);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    text.push_str(" [...]\n");
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clipping_keeps_whole_characters_and_says_so() {
        assert_eq!(clip("short".into(), 100), "short");
        let clipped = clip("é".repeat(100), 40);
        assert!(clipped.len() <= 40 && clipped.ends_with(" [...]\n"), "{clipped}");
    }

    #[test]
    fn a_transcript_names_who_said_what() {
        let call = Part::ToolUse { tool_call_id: "c".into(), name: "calc".into(), input: serde_json::json!({"x": 1}) };
        let said = Message::Assistant { content: vec![Part::Text { text: "let me see".into() }, call] };
        assert_eq!(transcript(&said), "Assistant: let me see\nAssistant called calc({\"x\":1})\n");
        let result = Message::Tool { tool_call_id: "c".into(), content: vec![Block::text("2")], is_error: true };
        assert_eq!(transcript(&result), "Tool result (an error): 2\n");
        let asked = Message::User { content: vec![Block::text("/delay 30\n/words 3")] };
        assert_eq!(transcript(&asked), "User: /delay 30\n  /words 3\n", "no line of it starts as a directive");
    }
}
