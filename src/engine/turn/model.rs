//! One model request: its span opens in the log, its stream is collected (text and
//! thinking going out as coalesced deltas, a cancel stopping it at once), then the whole
//! response is recorded: its messages, its calls as the decision step plans them, the
//! span's end, and the denials.

use std::sync::Arc;
use std::time::Instant;

use futures_util::StreamExt;
use serde_json::Value;

use super::said::{MessageIds, Pace, Said};
use super::{append, compact, tools, Failure, TurnContext};
use crate::agent::{ModelError, ModelEvent, ModelRequest, ModelStop, ModelStream};
use crate::domain::ids::prefixed;
use crate::domain::{EventBody, EventId, Message, Part, Usage};
use crate::engine::decide::{self, Call};
use crate::metrics;

/// A recorded response: how the model stopped, and its calls with their events' ids.
pub(super) struct Response {
    pub stop: ModelStop,
    pub calls: Vec<(EventId, Call)>,
    pub called: bool,
}

/// What the model's stream brought before it ended (or failed, or was cancelled).
#[derive(Default)]
struct Streamed {
    said: Said,
    calls: Vec<(Option<String>, String, Value)>,
    usage: Usage,
    stop: Option<ModelStop>,
    failure: Option<Failure>,
}

/// The span of one request, as its start event opened it.
struct Span {
    id: String,
    start: Option<EventId>,
    messages: MessageIds,
}

pub(super) async fn request(ctx: &mut TurnContext, usage: &mut Usage) -> Result<Response, Failure> {
    let model = ctx.model.model.clone();
    let span_id = prefixed("span_");
    let input_tokens = compact::request_size(ctx);
    let start = EventBody::ModelRequestStart {
        model: model.name().into(),
        span_id: span_id.clone(),
        input_tokens: Some(input_tokens),
    };
    let start = append(ctx, vec![start])?.first().map(|event| event.id);
    let span = Span { id: span_id, start, messages: MessageIds::new() };
    let request = ModelRequest {
        system: ctx.agent.config.system.clone(),
        messages: ctx.history.clone(),
        tools: ctx.plan.defs.clone(),
        cancel: ctx.cancel.clone(),
    };
    let started = Instant::now();
    let mut streamed = collect(ctx, model.stream(request), &span.messages).await?;
    // Cut short before the provider said what it used: the input as sent, the output as
    // streamed, marked as estimated.
    let estimated = streamed.failure.is_some() && streamed.usage == Usage::default();
    if estimated {
        streamed.usage = Usage { input_tokens, output_tokens: Usage::estimated_tokens(streamed.said.bytes()) };
    }
    let provider = model.provider();
    metrics::MODEL_SECONDS.with_label_values(&[provider]).observe(started.elapsed().as_secs_f64());
    metrics::MODEL_TOKENS.with_label_values(&[provider, "input"]).inc_by(streamed.usage.input_tokens);
    metrics::MODEL_TOKENS.with_label_values(&[provider, "output"]).inc_by(streamed.usage.output_tokens);
    *usage += streamed.usage;
    record(ctx, span, model.name(), streamed, estimated)
}

/// Reads the stream to its end, sending what is said as deltas at the [`Pace`] of
/// `delta_coalesce`; a cancel ends it at once.
async fn collect(ctx: &TurnContext, mut stream: ModelStream, ids: &MessageIds) -> Result<Streamed, Failure> {
    let mut streamed = Streamed::default();
    let mut pace = Pace::new(ctx.delta_coalesce);
    let mut flush_at: Option<tokio::time::Instant> = None;
    streamed.failure = loop {
        let next = tokio::select! {
            biased;
            _ = ctx.cancel.cancelled() => break Some(Failure::Cancelled),
            _ = sleep_until(flush_at), if flush_at.is_some() => {
                flush_at = None;
                pace.sent(tokio::time::Instant::now());
                append(ctx, streamed.said.deltas(ids))?;
                continue;
            }
            next = stream.next() => next,
        };
        match next {
            Some(Ok(ModelEvent::TextDelta(text))) => streamed.said.text(&text),
            Some(Ok(ModelEvent::ThinkingDelta(text))) => streamed.said.thinking(&text),
            Some(Ok(ModelEvent::ToolCall { id, name, input })) => streamed.calls.push((id, name, input)),
            Some(Ok(ModelEvent::Usage(usage))) => streamed.usage = usage,
            Some(Ok(ModelEvent::Stop(stop))) => {
                streamed.stop = Some(stop);
                break None;
            }
            // A provider may end its stream as it sees the cancel.
            Some(Err(_)) | None if ctx.cancel.is_cancelled() => break Some(Failure::Cancelled),
            Some(Err(error)) => break Some(Failure::Model(error)),
            None => {
                let error = ModelError::new("model_stream_error", "the model stream ended without a stop");
                break Some(Failure::Model(error));
            }
        }
        if flush_at.is_none() && streamed.said.unsent() {
            flush_at = pace.send_at(tokio::time::Instant::now());
            if flush_at.is_none() {
                append(ctx, streamed.said.deltas(ids))?;
            }
        }
    };
    Ok(streamed)
}

/// Records the response. What was said is recorded even when the request failed or was
/// cancelled, so the history holds it; calls are recorded only from a complete response.
fn record(
    ctx: &mut TurnContext,
    span: Span,
    model: &str,
    streamed: Streamed,
    usage_estimated: bool,
) -> Result<Response, Failure> {
    let Streamed { said, calls, usage, stop, failure } = streamed;
    let (mut bodies, mut parts) = said.finish(&span.messages);
    let (call_bodies, calls) = match failure {
        None => {
            let named =
                calls.into_iter().map(|(id, name, input)| (id.unwrap_or_else(|| prefixed("call_")), name, input));
            decide::plan_calls(&ctx.plan, named.collect())
        }
        Some(_) => Default::default(),
    };
    bodies.extend(call_bodies);
    parts.extend(calls.iter().map(|call| Part::ToolUse {
        tool_call_id: call.tool_call_id.clone(),
        name: call.name.clone(),
        input: call.input.clone(),
    }));
    bodies.push(EventBody::ModelRequestEnd {
        span_id: span.id,
        model: model.into(),
        usage,
        is_error: failure.is_some(),
        model_request_start_id: span.start,
        stop_reason: stop,
        context_window: ctx.agent.context_window(&ctx.model),
        usage_estimated,
    });
    let events = append(ctx, bodies)?;
    if !parts.is_empty() {
        ctx.history.push(Arc::new(Message::Assistant { content: parts }));
    }
    if let Some(failure) = failure {
        return Err(failure);
    }
    let call_events = events.iter().filter(|e| matches!(e.kind(), "agent.tool_use" | "agent.custom_tool_use"));
    let calls: Vec<(EventId, Call)> = call_events.map(|event| event.id).zip(calls).collect();
    // A call of a tool this session does not have, that the client always rejects, or that
    // the session's mode does not allow, gets an error result at once.
    tools::record_results(ctx, decide::denials(&ctx.plan, calls.iter().map(|(id, call)| (*id, call))))?;
    let called = !calls.is_empty();
    Ok(Response { stop: stop.unwrap_or(ModelStop::EndTurn), calls, called })
}

/// The text of a request made for the turn's own use (a summary, a grade), not part of the
/// conversation: nothing of it goes to the log. A cancel ends it at once. What it cost
/// comes back either way.
pub(super) async fn text(ctx: &TurnContext, request: ModelRequest) -> Result<(String, Usage), (Failure, Usage)> {
    let mut stream = ctx.model.model.stream(request);
    let (mut said, mut cost) = (String::new(), Usage::default());
    loop {
        let next = tokio::select! {
            biased;
            _ = ctx.cancel.cancelled() => return Err((Failure::Cancelled, cost)),
            next = stream.next() => next,
        };
        match next {
            Some(Ok(ModelEvent::TextDelta(text))) => said.push_str(&text),
            Some(Ok(ModelEvent::Usage(now))) => cost = now,
            Some(Ok(ModelEvent::Stop(_))) | None => return Ok((said, cost)),
            Some(Ok(_)) => {}
            Some(Err(error)) => return Err((Failure::Model(error), cost)),
        }
    }
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    if let Some(deadline) = deadline {
        tokio::time::sleep_until(deadline).await;
    }
}
