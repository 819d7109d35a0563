//! One turn: call the model, stream its text and thinking as coalesced delta events, then
//! handle its tool calls (trusted server tools run inline, the rest wait for the client)
//! and call the model again, until it stops, needs the client, or hits a limit. Every step
//! is an event in the log; the actor writes how the turn ended.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::log::Writer;
use super::SessionError;
use crate::agent::mcp::{name_tools, McpServers, McpTool, ToolAnswer};
use crate::agent::{Agent, ModelError, ModelEvent, ModelRequest, ModelStop, ToolDef, Tools};
use crate::domain::event::{Confirmation, McpRef, Permission, SessionSpec, StopReason};
use crate::domain::ids::prefixed;
use crate::domain::{Block, Draft, EventBody, EventId, Message, Part, RawEvent, TurnId, Usage};
use crate::metrics;
use crate::projection::turns::PendingCall;

/// How a call of each tool is handled in this session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Inline,
    Ask,
    Client,
    /// The client chose to always reject it in this session: each call is denied at once.
    Rejected,
}

/// The tools offered to the model, and how each is handled.
#[derive(Debug, Clone, Default)]
pub struct ToolPlan {
    pub defs: Vec<ToolDef>,
    pub modes: HashMap<String, Mode>,
    /// The MCP server and tool behind each MCP tool's name.
    pub mcp: HashMap<String, McpTool>,
    /// The permission decisions the client chose to keep, by tool (MCP tools join the plan
    /// as the turn starts, and take them then).
    pub remembered: BTreeMap<String, Confirmation>,
}

impl ToolPlan {
    /// Server tools the agent has (minus `deny`), enabled as the session says: exposed
    /// tools only when the client listed them (trusted or not), unexposed ones always.
    /// A tool runs inline only if the config allows it and the client trusts it, or if the
    /// client chose to always allow it (`remembered`); one it chose to always reject stays
    /// offered (the history may hold its calls) and each call of it is denied. Then the
    /// client tools: the agent's own, and the session's.
    pub fn new(
        agent: &Agent,
        tools: &Tools,
        spec: &SessionSpec,
        remembered: &BTreeMap<String, Confirmation>,
    ) -> ToolPlan {
        let mut plan = ToolPlan { remembered: remembered.clone(), ..ToolPlan::default() };
        for (name, permission) in &agent.config.tools {
            let always = remembered.get(name);
            if *permission == Permission::Deny {
                continue;
            }
            let trust = if tools.exposed(name) {
                match spec.agent.tools.as_ref().and_then(|list| list.iter().find(|t| &t.name == name)) {
                    Some(choice) => choice.trust,
                    None => continue,
                }
            } else {
                true
            };
            if let Some(def) = tools.def(name) {
                let mode = match always {
                    Some(Confirmation::Deny) => Mode::Rejected,
                    Some(Confirmation::Allow) => Mode::Inline,
                    None if *permission == Permission::Allow && trust => Mode::Inline,
                    None => Mode::Ask,
                };
                plan.defs.push(def);
                plan.modes.insert(name.clone(), mode);
            }
        }
        for tool in agent.config.client_tools.iter().chain(&spec.tools) {
            plan.defs.push(ToolDef {
                name: tool.name.clone(),
                description: tool.description.clone(),
                parameters: tool.input_schema.clone(),
            });
            plan.modes.insert(tool.name.clone(), Mode::Client);
        }
        plan
    }

    /// Adds MCP tools (their declaration's permission, or what the client chose to
    /// remember). A name already taken keeps its tool.
    pub fn add_mcp(&mut self, tools: Vec<McpTool>) {
        for tool in tools {
            let name = tool.def.name.clone();
            if self.modes.contains_key(&name) {
                tracing::warn!(%name, "an MCP tool's name is taken by another tool; it is not offered");
                continue;
            }
            let mode = match (self.remembered.get(&name), tool.permission) {
                (Some(Confirmation::Deny), _) => Mode::Rejected,
                (Some(Confirmation::Allow), _) | (None, Permission::Allow) => Mode::Inline,
                (None, _) => Mode::Ask,
            };
            self.modes.insert(name.clone(), mode);
            self.defs.push(tool.def.clone());
            self.mcp.insert(name, tool);
        }
    }

    /// The MCP server and tool behind `name`, as the log records them.
    pub fn mcp_ref(&self, name: &str) -> Option<McpRef> {
        self.mcp.get(name).map(|t| McpRef { server: t.server.clone(), tool: t.tool.clone() })
    }
}

pub struct TurnContext {
    /// The session's one writer, shared with its actor.
    pub(super) writer: Arc<Writer>,
    pub turn: TurnId,
    pub agent: Arc<Agent>,
    pub tools: Arc<Tools>,
    /// The MCP servers whose tools the turn offers: the agent's, then the session's own.
    pub mcp: Vec<Arc<McpServers>>,
    pub plan: ToolPlan,
    pub history: Vec<Arc<Message>>,
    /// Calls granted permission before this turn: they run first.
    pub granted: Vec<PendingCall>,
    pub cancel: CancellationToken,
    pub delta_coalesce: Duration,
}

/// How a turn ended: a stop reason (with the calls waiting for the client), or a failure.
pub struct Outcome {
    pub stop: Result<(StopReason, Vec<EventId>), ModelError>,
    pub usage: Usage,
}

pub async fn run(mut ctx: TurnContext) -> Outcome {
    let mut usage = Usage::default();
    let stop = drive(&mut ctx, &mut usage).await;
    let stop = match stop {
        Err(Failure::Model(error)) => Err(error),
        Err(Failure::Cancelled) => Ok((StopReason::Cancelled, vec![])),
        Err(Failure::Log(error)) => Err(ModelError::new("log_error", error)),
        Ok(stop) => Ok(stop),
    };
    Outcome { stop, usage }
}

enum Failure {
    Model(ModelError),
    Cancelled,
    /// The log refused the turn's events: the turn cannot go on.
    Log(String),
}

impl From<SessionError> for Failure {
    fn from(error: SessionError) -> Failure {
        Failure::Log(error.to_string())
    }
}

/// Lists the tools of the turn's MCP servers and offers them, recording what was offered.
/// A server that cannot be reached fails the turn (`mcp_unavailable`, naming it).
async fn list_mcp(ctx: &mut TurnContext) -> Result<(), Failure> {
    let (mut tools, mut listed) = (Vec::new(), Vec::new());
    for servers in ctx.mcp.iter().filter(|s| !s.is_empty()) {
        let found = tokio::select! {
            _ = ctx.cancel.cancelled() => return Err(Failure::Cancelled),
            found = servers.tools() => found,
        };
        let (found, servers) = found.map_err(|e| {
            let mut error = ModelError::new("mcp_unavailable", e.to_string());
            error.mcp_server = Some(e.server);
            Failure::Model(error)
        })?;
        tools.extend(found);
        listed.extend(servers);
    }
    if listed.is_empty() {
        return Ok(());
    }
    name_tools(&mut tools);
    ctx.plan.add_mcp(tools);
    // What the model is offered, by the servers' names (less any that lost its name).
    for server in &mut listed {
        let offered = |tool: &String| ctx.plan.mcp.values().any(|t| t.server == server.server && &t.tool == tool);
        server.tools.retain(offered);
    }
    append(ctx, vec![EventBody::AgentMcpTools { servers: listed }])?;
    Ok(())
}

async fn drive(ctx: &mut TurnContext, usage: &mut Usage) -> Result<(StopReason, Vec<EventId>), Failure> {
    list_mcp(ctx).await?;
    let granted = std::mem::take(&mut ctx.granted);
    let calls: Vec<ServerCall> = granted
        .into_iter()
        .map(|c| ServerCall {
            event_id: c.event_id,
            tool_call_id: c.tool_call_id,
            name: c.name,
            input: c.input,
            mcp: c.mcp,
        })
        .collect();
    run_server_tools(ctx, calls).await?;
    let mut requests = 0;
    loop {
        if ctx.cancel.is_cancelled() {
            return Err(Failure::Cancelled);
        }
        if requests >= ctx.agent.config.max_turn_requests {
            return Ok((StopReason::MaxTurnRequests, vec![]));
        }
        requests += 1;
        let response = model_request(ctx, usage).await?;
        let calls = response.calls;
        let mut waiting = Vec::new();
        let mut inline = Vec::new();
        for call in calls {
            match call.mode {
                Some(Mode::Inline) => inline.push(ServerCall {
                    mcp: ctx.plan.mcp_ref(&call.name),
                    event_id: call.event_id,
                    tool_call_id: call.tool_call_id,
                    name: call.name,
                    input: call.input,
                }),
                Some(Mode::Ask | Mode::Client) => waiting.push(call.event_id),
                Some(Mode::Rejected) | None => {}
            }
        }
        run_server_tools(ctx, inline).await?;
        if !waiting.is_empty() {
            return Ok((StopReason::RequiresAction, waiting));
        }
        match response.stop {
            ModelStop::ToolUse if response.called => continue,
            ModelStop::ToolUse | ModelStop::EndTurn => return Ok((StopReason::EndTurn, vec![])),
            ModelStop::MaxTokens => return Ok((StopReason::MaxTokens, vec![])),
            ModelStop::Refusal => return Ok((StopReason::Refusal, vec![])),
        }
    }
}

/// Orders the turn's next events. The turn does not wait for them to be durable: nobody
/// sees them before they are, and a turn's events share flushes with each other and with
/// the actor's. It waits only before a tool runs ([`run_server_tools`]).
fn append(ctx: &TurnContext, bodies: Vec<EventBody>) -> Result<Vec<RawEvent>, Failure> {
    let drafts = bodies.iter().map(|body| Draft::new(Some(ctx.turn), body)).collect();
    ctx.writer.order(drafts)?.0.map_err(|conflict| {
        Failure::Log(format!("another writer appended to the session's log (at {})", conflict.actual.seq))
    })
}

struct Call {
    event_id: EventId,
    tool_call_id: String,
    name: String,
    input: Value,
    mode: Option<Mode>,
}

struct Response {
    stop: ModelStop,
    calls: Vec<Call>,
    called: bool,
}

/// Text and thinking so far, and what has not yet gone out as a delta event.
#[derive(Default)]
struct Said {
    text: String,
    thinking: String,
    unsent_text: String,
    unsent_thinking: String,
}

impl Said {
    fn deltas(&mut self, ids: &MessageIds) -> Vec<EventBody> {
        let mut out = Vec::new();
        if !self.unsent_thinking.is_empty() {
            let delta = std::mem::take(&mut self.unsent_thinking);
            out.push(EventBody::AgentThinkingDelta { message_id: ids.thinking.clone(), delta });
        }
        if !self.unsent_text.is_empty() {
            let delta = std::mem::take(&mut self.unsent_text);
            out.push(EventBody::AgentMessageDelta { message_id: ids.text.clone(), delta });
        }
        out
    }
}

/// The ids of one response's thinking and text, each carried by its deltas and its final
/// event: made up front, so a view can announce a message before it is whole (the
/// managed-agents previews name the final event by it).
struct MessageIds {
    thinking: String,
    text: String,
}

impl MessageIds {
    fn new() -> MessageIds {
        MessageIds { thinking: prefixed("msg_"), text: prefixed("msg_") }
    }
}

/// One model request: its span, its coalesced deltas, its message and its tool calls.
async fn model_request(ctx: &mut TurnContext, usage: &mut Usage) -> Result<Response, Failure> {
    let model = ctx.agent.model.clone();
    let span_id = prefixed("span_");
    let ids = MessageIds::new();
    let start = EventBody::ModelRequestStart { model: model.name().into(), span_id: span_id.clone() };
    let start_id = append(ctx, vec![start])?.first().map(|event| event.id);
    let request = ModelRequest {
        system: ctx.agent.config.system.clone(),
        messages: ctx.history.clone(),
        tools: ctx.plan.defs.clone(),
        cancel: ctx.cancel.clone(),
    };
    let started = Instant::now();
    let mut stream = model.stream(request);
    let mut said = Said::default();
    let mut calls: Vec<(Option<String>, String, Value)> = Vec::new();
    let mut request_usage = Usage::default();
    let mut stop = None;
    let mut flush_at: Option<tokio::time::Instant> = None;
    let failure = loop {
        let next = tokio::select! {
            biased;
            _ = ctx.cancel.cancelled() => break Some(Failure::Cancelled),
            _ = sleep_until(flush_at), if flush_at.is_some() => {
                flush_at = None;
                append(ctx, said.deltas(&ids))?;
                continue;
            }
            next = stream.next() => next,
        };
        match next {
            Some(Ok(ModelEvent::TextDelta(text))) => {
                said.text.push_str(&text);
                said.unsent_text.push_str(&text);
            }
            Some(Ok(ModelEvent::ThinkingDelta(text))) => {
                said.thinking.push_str(&text);
                said.unsent_thinking.push_str(&text);
            }
            Some(Ok(ModelEvent::ToolCall { id, name, input })) => calls.push((id, name, input)),
            Some(Ok(ModelEvent::Usage(u))) => request_usage = u,
            Some(Ok(ModelEvent::Stop(s))) => {
                stop = Some(s);
                break None;
            }
            // A provider may end its stream as it sees the cancel.
            Some(Err(_)) | None if ctx.cancel.is_cancelled() => break Some(Failure::Cancelled),
            Some(Err(error)) => break Some(Failure::Model(error)),
            None => {
                break Some(Failure::Model(ModelError::new(
                    "model_stream_error",
                    "the model stream ended without a stop",
                )))
            }
        }
        if flush_at.is_none() && !(said.unsent_text.is_empty() && said.unsent_thinking.is_empty()) {
            flush_at = Some(tokio::time::Instant::now() + ctx.delta_coalesce);
        }
    };
    drop(stream);
    let provider = model.provider();
    metrics::MODEL_SECONDS.with_label_values(&[provider]).observe(started.elapsed().as_secs_f64());
    metrics::MODEL_TOKENS.with_label_values(&[provider, "input"]).inc_by(request_usage.input_tokens);
    metrics::MODEL_TOKENS.with_label_values(&[provider, "output"]).inc_by(request_usage.output_tokens);
    *usage += request_usage;

    // What was said is recorded even when the request failed or was cancelled, so the
    // history holds it; calls are recorded only from a complete response.
    let mut bodies = said.deltas(&ids);
    let mut parts = Vec::new();
    if !said.thinking.is_empty() {
        bodies.push(EventBody::AgentThinking { message_id: ids.thinking.clone(), thinking: said.thinking.clone() });
        parts.push(Part::Thinking { thinking: said.thinking });
    }
    if !said.text.is_empty() {
        bodies.push(EventBody::AgentMessage { message_id: ids.text.clone(), content: vec![Block::text(&said.text)] });
        parts.push(Part::Text { text: said.text });
    }
    let mut planned = Vec::new();
    if failure.is_none() {
        for (id, name, input) in calls {
            let tool_call_id = id.unwrap_or_else(|| prefixed("call_"));
            let mode = ctx.plan.modes.get(&name).copied();
            bodies.push(match mode {
                Some(Mode::Client) => EventBody::AgentCustomToolUse {
                    tool_call_id: tool_call_id.clone(),
                    name: name.clone(),
                    input: input.clone(),
                },
                Some(Mode::Ask) => tool_use(&tool_call_id, &name, &input, Permission::Ask, &ctx.plan),
                Some(Mode::Inline) => tool_use(&tool_call_id, &name, &input, Permission::Allow, &ctx.plan),
                Some(Mode::Rejected) | None => tool_use(&tool_call_id, &name, &input, Permission::Deny, &ctx.plan),
            });
            parts.push(Part::ToolUse { tool_call_id: tool_call_id.clone(), name: name.clone(), input: input.clone() });
            planned.push((tool_call_id, name, input, mode));
        }
    }
    let is_error = failure.is_some();
    bodies.push(EventBody::ModelRequestEnd {
        span_id,
        model: model.name().into(),
        usage: request_usage,
        is_error,
        model_request_start_id: start_id,
        stop_reason: stop,
    });
    let events = append(ctx, bodies)?;
    if !parts.is_empty() {
        ctx.history.push(Arc::new(Message::Assistant { content: parts }));
    }
    if let Some(failure) = failure {
        return Err(failure);
    }
    let call_events = events.iter().filter(|e| matches!(e.kind(), "agent.tool_use" | "agent.custom_tool_use"));
    let calls: Vec<Call> = call_events
        .zip(planned)
        .map(|(event, (tool_call_id, name, input, mode))| Call { event_id: event.id, tool_call_id, name, input, mode })
        .collect();
    let called = !calls.is_empty();
    // A call of a tool this session does not have, or that the client always rejects,
    // gets an error result at once.
    let denied: Vec<EventBody> = calls
        .iter()
        .filter_map(|c| {
            let why = match c.mode {
                None => format!("no tool named {:?} is available", c.name),
                Some(Mode::Rejected) => "the user rejects this tool for this session".to_string(),
                Some(_) => return None,
            };
            Some(EventBody::AgentToolResult {
                tool_use_id: c.event_id,
                tool_call_id: c.tool_call_id.clone(),
                content: vec![Block::text(format!("Tool call denied: {why}"))],
                is_error: true,
                structured_content: None,
                mcp: None,
            })
        })
        .collect();
    record_results(ctx, denied)?;
    Ok(Response { stop: stop.unwrap_or(ModelStop::EndTurn), calls, called })
}

fn tool_use(tool_call_id: &str, name: &str, input: &Value, permission: Permission, plan: &ToolPlan) -> EventBody {
    EventBody::AgentToolUse {
        tool_call_id: tool_call_id.into(),
        name: name.into(),
        input: input.clone(),
        evaluated_permission: permission,
        mcp: plan.mcp_ref(name),
    }
}

/// A call a server runs: a built-in tool, or the MCP server and tool it was made of.
struct ServerCall {
    event_id: EventId,
    tool_call_id: String,
    name: String,
    input: Value,
    mcp: Option<McpRef>,
}

/// Runs server tools in parallel and records their results in call order. A cancel
/// reaches running tools at once; they answer `Tool call cancelled`.
async fn run_server_tools(ctx: &mut TurnContext, calls: Vec<ServerCall>) -> Result<(), Failure> {
    if calls.is_empty() {
        return Ok(());
    }
    // A tool acts on the world: first the calls (and the permissions that let them run)
    // are on disk, so that no crash leaves an action the log does not show.
    ctx.writer.settled().await?;
    let (tools, cancel) = (ctx.tools.clone(), ctx.cancel.clone());
    let results = futures_util::future::join_all(calls.iter().map(|call| {
        let (tools, cancel) = (tools.clone(), cancel.clone());
        // An MCP call runs the server and tool it was made of (its name may have changed
        // hands since it was granted); one whose server no longer offers it fails.
        let mcp = call.mcp.as_ref().map(|at| {
            let found = ctx.plan.mcp.values().find(|t| t.server == at.server && t.tool == at.tool).cloned();
            (at, found)
        });
        async move {
            match mcp {
                Some((at, Some(tool))) => tool.servers.call(&at.server, &at.tool, &call.input, &cancel).await,
                Some((at, None)) => {
                    ToolAnswer::text(Err(format!("MCP server {} does not offer {} any more", at.server, at.tool)))
                }
                None => ToolAnswer::text(tools.call(&call.name, &call.input, &cancel).await),
            }
        }
    }))
    .await;
    let bodies = calls
        .into_iter()
        .zip(results)
        .map(|(call, answer)| EventBody::AgentToolResult {
            tool_use_id: call.event_id,
            tool_call_id: call.tool_call_id,
            content: answer.content,
            is_error: answer.is_error,
            structured_content: answer.structured,
            mcp: call.mcp,
        })
        .collect();
    record_results(ctx, bodies)?;
    if ctx.cancel.is_cancelled() {
        return Err(Failure::Cancelled);
    }
    Ok(())
}

fn record_results(ctx: &mut TurnContext, bodies: Vec<EventBody>) -> Result<(), Failure> {
    if bodies.is_empty() {
        return Ok(());
    }
    for body in &bodies {
        if let EventBody::AgentToolResult { tool_call_id, content, is_error, .. } = body {
            ctx.history.push(Arc::new(Message::Tool {
                tool_call_id: tool_call_id.clone(),
                content: content.clone(),
                is_error: *is_error,
            }));
        }
    }
    append(ctx, bodies)?;
    Ok(())
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    if let Some(deadline) = deadline {
        tokio::time::sleep_until(deadline).await;
    }
}
