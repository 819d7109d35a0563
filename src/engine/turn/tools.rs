//! Running the calls a server runs (built-in tools, and MCP servers' tools) once they are
//! durable, in parallel, and recording their results in call order.

use std::sync::Arc;

use serde_json::Value;

use super::{append, Failure, TurnContext};
use crate::agent::mcp::ToolAnswer;
use crate::domain::event::McpRef;
use crate::domain::{EventBody, EventId, Message};
use crate::engine::decide::Call;
use crate::engine::plan::ToolPlan;
use crate::projection::turns::PendingCall;

/// A call a server runs: a built-in tool, or the MCP server and tool it was made of.
pub(super) struct ServerCall {
    event_id: EventId,
    tool_call_id: String,
    name: String,
    input: Value,
    mcp: Option<McpRef>,
}

impl ServerCall {
    /// A call granted permission before the turn started.
    pub fn granted(call: PendingCall) -> ServerCall {
        let PendingCall { event_id, tool_call_id, name, input, mcp, .. } = call;
        ServerCall { event_id, tool_call_id, name, input, mcp }
    }

    /// A call of the model's that runs inline.
    pub fn of(plan: &ToolPlan, event_id: EventId, call: Call) -> ServerCall {
        let mcp = plan.mcp_ref(&call.name);
        ServerCall { event_id, tool_call_id: call.tool_call_id, name: call.name, input: call.input, mcp }
    }
}

/// Runs server tools in parallel and records their results in call order. A cancel
/// reaches running tools at once; they answer `Tool call cancelled`.
pub(super) async fn run(ctx: &mut TurnContext, calls: Vec<ServerCall>) -> Result<(), Failure> {
    if calls.is_empty() {
        return Ok(());
    }
    // A tool acts on the world: first the calls (and the permissions that let them run)
    // are on disk, so that no crash leaves an action the log does not show.
    ctx.writer.settled().await?;
    let answers = futures_util::future::join_all(calls.iter().map(|call| answer(ctx, call))).await;
    let bodies = calls
        .into_iter()
        .zip(answers)
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

/// What one call answers. An MCP call runs the server and tool it was made of (its name
/// may have changed hands since it was granted); one whose server no longer offers it fails.
fn answer<'a>(ctx: &TurnContext, call: &'a ServerCall) -> impl std::future::Future<Output = ToolAnswer> + 'a {
    let (tools, cancel) = (ctx.tools.clone(), ctx.cancel.clone());
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
}

/// Appends tool results, and adds them to the history the model reads next.
pub(super) fn record_results(ctx: &mut TurnContext, bodies: Vec<EventBody>) -> Result<(), Failure> {
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
