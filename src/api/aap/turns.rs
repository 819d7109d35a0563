//! `POST /sessions/{id}/turns`: one user message, or the results and permissions for every
//! waiting tool call, in; the turn out as SSE (`delta` or `message`) or as one JSON answer
//! (`none`). The turn is the session's: a client that goes away does not stop it.

use std::time::Duration;

use actix_web::{post, HttpResponse};
use bytes::{Bytes, BytesMut};
use serde_json::{json, Value};

use super::wire::{stop_reason, AgentResponse, MessageIn, MessageOut, StreamMode, TurnRequest};
use crate::api::body::JsonBody;
use crate::api::caller::CallerSession;
use crate::api::sse::{self, Flow, Follow};
use crate::api::{Error, State};
use crate::domain::{Block, Event, EventBody, TurnId};
use crate::error::ApiError;
use crate::projection::history::History;
use crate::session::{Caller, Cursor, Follower, Input, Submission};

/// Runs a turn: the answer as one JSON body (`stream: none`) or as SSE (`delta`, `message`).
#[utoipa::path(
    tag = "aap",
    operation_id = "sessions_turn",
    params(("Idempotency-Key" = Option<String>, Header, description = "Names this write: sent again with the same key and body, it is answered as the first time and stored once (docs/idempotency.md)", min_length = 1, max_length = 255, pattern = "^[ -~]+$"), ("session_id" = String, Path, description = "The session's id")),
    request_body(content = TurnRequest, example = json!({"messages": [{"role": "user", "content": "hello"}]})),
    responses(
        (status = 200, description = "The turn", content(
            (AgentResponse = "application/json"),
            (String = "text/event-stream"),
        )),
    ),
)]
#[post("/sessions/{session_id}/turns")]
pub async fn post(
    state: State,
    CallerSession { caller, summary, .. }: CallerSession,
    body: JsonBody<TurnRequest>,
) -> Result<HttpResponse, Error> {
    let key = body.request_key();
    let mut request = body.0;
    let update = request.update();
    let inputs = inputs(request.messages)?;
    // Follow from the current end before submitting, so every event of the turn is seen.
    let live = state.sessions.follow_live(&summary).await?;
    let submission = Submission { update, inputs, all_at_once: true, request: key, ..Submission::default() };
    let submitted = state.sessions.submit(&summary, submission).await?;
    let turn = submitted.turn.ok_or_else(|| ApiError::internal("a turn request started no turn"))?;
    // A request sent again with its key is answered with the turn its first copy started,
    // however far on: from that copy's first event.
    let follower = match submitted.recalled {
        false => live,
        true => {
            let before = submitted.events.first().map_or(0, |event| event.seq - 1);
            state.sessions.follow(&summary, Some(Cursor::Sequence(before))).await?
        }
    };
    tracing::debug!(session_id = %summary.id, turn_id = %turn, "turn started");
    match request.stream {
        StreamMode::None => answer(follower, turn).await,
        mode => stream(&state, &caller, follower, turn, mode),
    }
}

/// The turn's input: exactly one user message, or tool results and permissions only.
fn inputs(messages: Vec<MessageIn>) -> Result<Vec<Input>, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::invalid("invalid field `messages`: at least one message is needed"));
    }
    let users = messages.iter().filter(|m| matches!(m, MessageIn::User { .. })).count();
    if users > 1 || (users == 1 && messages.len() > 1) {
        return Err(ApiError::invalid(
            "invalid field `messages`: send one user message, or only tool and tool_permission messages",
        ));
    }
    messages
        .into_iter()
        .enumerate()
        .map(|(i, message)| match message {
            MessageIn::User { content } => Ok(Input::Message(content)),
            MessageIn::Tool { tool_call_id, content } => {
                Ok(Input::Result { call: tool_call_id, content: content.into_blocks(), is_error: false, ran: None })
            }
            MessageIn::ToolPermission { tool_call_id, granted, reason } => {
                Ok(Input::Permission { call: tool_call_id, granted, reason, remember: false })
            }
            MessageIn::System { .. } | MessageIn::Assistant { .. } => Err(ApiError::invalid(format!(
                "invalid field `messages[{i}].role`: a turn takes user, tool and tool_permission messages"
            ))),
        })
        .collect()
}

/// Waits for the turn to end and answers `{stopReason, messages}`: what the agent said
/// and what its tools answered in this turn.
async fn answer(mut follower: Follower, turn: TurnId) -> Result<HttpResponse, Error> {
    let mut history = History::default();
    loop {
        let Some(events) = follower.next().await? else {
            return Err(ApiError::internal("the session ended during the turn").into());
        };
        // Deltas and other turns' events are told apart by their envelope, undecoded.
        let ours = events.iter().filter(|raw| raw.turn().is_some_and(|(of, _)| of == turn) && !raw.is_delta());
        for raw in ours {
            let Ok(event) = raw.decode() else { continue };
            if event.turn_id != Some(turn) || event.body.is_user_input() {
                continue;
            }
            if let EventBody::StatusIdle { stop_reason: stop, .. } = &event.body {
                let messages = history.messages.iter().map(|m| MessageOut::from(&**m)).collect();
                return Ok(HttpResponse::Ok().json(AgentResponse { stop_reason: stop_reason(stop.kind), messages }));
            }
            history.apply(&event);
        }
    }
}

fn stream(
    state: &State,
    caller: &Caller,
    follower: Follower,
    turn: TurnId,
    mode: StreamMode,
) -> Result<HttpResponse, Error> {
    let settings = &state.settings.streams;
    let guard = state.streams.open(&caller.subject, settings.max_streams_per_subject)?;
    let mut preamble = BytesMut::new();
    sse::frame(&mut preamble, None, "turn_start", b"{}");
    let body = sse::follow(
        Follow {
            preamble: Some(preamble.freeze()),
            follower,
            heartbeat: Duration::from_millis(settings.heartbeat_ms),
            merge_window: None,
            shutdown: state.shutdown.clone(),
            guard,
        },
        // Only the turn's events of the kinds this mode shows are decoded; the rest are
        // told apart by their envelope.
        move |out, raw| match raw.turn() {
            Some((of, _)) if of == turn && shown(raw.kind(), mode) => match raw.decode() {
                Ok(event) => render(out, &event, mode),
                Err(_) => Flow::Continue,
            },
            _ => Flow::Continue,
        },
    );
    Ok(crate::api::sse::response().streaming(body))
}

/// Whether [`render`] shows an event of type `kind` in this mode.
fn shown(kind: &str, mode: StreamMode) -> bool {
    match kind {
        "agent.message.delta" | "agent.thinking.delta" => mode == StreamMode::Delta,
        "agent.message" | "agent.thinking" => mode == StreamMode::Message,
        "agent.tool_use" | "agent.custom_tool_use" | "agent.tool_result" | "session.status_idle" => true,
        _ => false,
    }
}

/// One log event as AAP SSE, if AAP shows it in this mode.
fn render(out: &mut BytesMut, event: &Event, mode: StreamMode) -> Flow {
    let (name, data): (&str, Value) = match &event.body {
        EventBody::AgentMessageDelta { delta, .. } if mode == StreamMode::Delta => {
            ("text_delta", json!({"delta": delta}))
        }
        EventBody::AgentThinkingDelta { delta, .. } if mode == StreamMode::Delta => {
            ("thinking_delta", json!({"delta": delta}))
        }
        EventBody::AgentMessage { content, .. } if mode == StreamMode::Message => {
            ("text", json!({"text": Block::join_text(content)}))
        }
        EventBody::AgentThinking { thinking, .. } if mode == StreamMode::Message => {
            ("thinking", json!({"thinking": thinking}))
        }
        EventBody::AgentToolUse { tool_call_id, name, input, .. }
        | EventBody::AgentCustomToolUse { tool_call_id, name, input, .. } => {
            ("tool_call", json!({"toolCallId": tool_call_id, "name": name, "input": input}))
        }
        EventBody::AgentToolResult { tool_call_id, content, .. } => {
            ("tool_result", json!({"toolCallId": tool_call_id, "content": Block::join_text(content)}))
        }
        EventBody::StatusIdle { stop_reason: stop, .. } => {
            let data = serde_json::to_vec(&json!({"stopReason": stop_reason(stop.kind)})).expect("serialises");
            sse::frame(out, None, "turn_stop", &data);
            return Flow::End;
        }
        _ => return Flow::Continue,
    };
    sse::frame(out, None, name, &Bytes::from(serde_json::to_vec(&data).expect("serialises")));
    Flow::Continue
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::event::{Permission, StopReason, Usage};
    use crate::domain::{Draft, EventId, SessionId};
    use crate::engine::decide::idle;
    use crate::store::numbering::{Clock, Tail};

    /// `shown` decides, from the envelope alone, which events `render` is given: it must
    /// name exactly the kinds `render` writes something for, in each mode.
    #[test]
    fn shown_names_exactly_the_kinds_render_writes() {
        let turn = TurnId::generate();
        let bodies = [
            EventBody::TurnStarted {},
            EventBody::AgentMessageDelta { message_id: "m".into(), delta: "d".into() },
            EventBody::AgentThinkingDelta { message_id: "m".into(), delta: "d".into() },
            EventBody::AgentMessage { message_id: "m".into(), content: vec![Block::text("t")] },
            EventBody::AgentThinking { message_id: "m".into(), thinking: "t".into() },
            EventBody::AgentToolUse {
                tool_call_id: "c".into(),
                name: "n".into(),
                input: json!({}),
                evaluated_permission: Permission::Ask,
                mcp: None,
                idempotent: false,
            },
            EventBody::AgentCustomToolUse {
                tool_call_id: "c".into(),
                name: "n".into(),
                input: json!({}),
                ask: false,
                editor: false,
            },
            EventBody::AgentToolResult {
                tool_use_id: EventId(ulid::Ulid::new()),
                tool_call_id: "c".into(),
                content: vec![Block::text("r")],
                is_error: false,
                structured_content: None,
                mcp: None,
            },
            idle(StopReason::EndTurn, vec![], Usage::default()),
            EventBody::UserDefineOutcome { outcome: json!(1) },
        ];
        let drafts: Vec<Draft> = bodies.iter().map(|body| Draft::new(Some(turn), body)).collect();
        let mut tail = Tail::default();
        let events = tail.stage(SessionId::generate(), 0, &drafts, &Clock::now(), 100).unwrap().unwrap();
        for mode in [StreamMode::Delta, StreamMode::Message, StreamMode::None] {
            for raw in &events {
                let mut out = BytesMut::new();
                render(&mut out, &raw.decode().unwrap(), mode);
                assert_eq!(shown(raw.kind(), mode), !out.is_empty(), "{} in {mode:?}", raw.kind());
            }
        }
    }
}
