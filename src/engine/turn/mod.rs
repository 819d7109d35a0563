//! One turn, IO only: call the model ([`model`]: its text and thinking go out as coalesced
//! delta events, [`said`]), record its response, run the calls that run inline ([`tools`]),
//! and call the model again, until the decision step says the turn stops (it ends, needs
//! the client, or hits a limit). What each response and call becomes is decided in
//! [`super::decide`]; the actor records how the turn ended.

mod compact;
mod model;
pub mod outcome;
mod said;
mod tools;

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use self::tools::ServerCall;
use super::decide::{self, Next, Outcome, ResumePoint};
use super::plan::{Mode, ToolPlan};
use super::writer::Writer;
use crate::agent::mcp::{name_tools, McpServers};
use crate::agent::{Agent, ChosenModel, ModelError, Tools};
use crate::domain::event::StopReason;
use crate::domain::{Draft, EventBody, EventId, Message, RawEvent, TurnId, Usage};
use crate::error::SessionError;
use crate::projection::turns::PendingCall;

pub struct TurnContext {
    /// The session's one writer, shared with its actor.
    pub(super) writer: Arc<Writer>,
    pub turn: TurnId,
    pub agent: Arc<Agent>,
    /// The model the session runs this turn (its choice, else the agent's own).
    pub model: ChosenModel,
    pub tools: Arc<Tools>,
    /// The MCP servers whose tools the turn offers: the agent's, then the session's own.
    pub mcp: Vec<Arc<McpServers>>,
    pub plan: ToolPlan,
    pub history: Vec<Arc<Message>>,
    /// Calls granted permission before this turn (or, for a resumed turn, the calls it
    /// runs again): they run first.
    pub granted: Vec<PendingCall>,
    /// Where a resumed turn goes on from (`None`: a new turn).
    pub resume: Option<ResumePoint>,
    pub cancel: CancellationToken,
    pub delta_coalesce: Duration,
    /// The session's outcome, graded once the turn ends its turn.
    pub outcome: Option<outcome::PendingOutcome>,
    /// The turn compacts the conversation (`user.compact`) and does nothing else.
    pub compact: bool,
}

pub async fn run(mut ctx: TurnContext) -> Outcome {
    let mut usage = Usage::default();
    if ctx.compact {
        let stop = match compact::now(&mut ctx, &mut usage).await {
            Ok(()) => Ok((StopReason::EndTurn, vec![])),
            Err(Failure::Model(error)) => Err(error),
            Err(Failure::Cancelled) => Ok((StopReason::Cancelled, vec![])),
            Err(Failure::Log(error)) => Err(ModelError::new("log_error", error)),
        };
        return Outcome { stop, usage };
    }
    let mut driven = drive(&mut ctx, &mut usage).await;
    if matches!(driven, Ok((StopReason::EndTurn, _))) {
        if let Err(failure) = outcome::grade(&mut ctx, &mut usage).await {
            driven = Err(failure);
        }
    }
    let stop = match driven {
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

async fn drive(ctx: &mut TurnContext, usage: &mut Usage) -> Result<(StopReason, Vec<EventId>), Failure> {
    // A resumed turn's earlier requests count, in its usage and against its limit.
    let (made, next) = match ctx.resume.take() {
        Some(point) => {
            *usage += point.usage;
            (point.requests, point.next)
        }
        None => (0, Next::Model),
    };
    list_mcp(ctx).await?;
    let granted = std::mem::take(&mut ctx.granted).into_iter().map(ServerCall::granted).collect();
    tools::run(ctx, granted).await?;
    if let Next::Stop(reason, waiting) = next {
        return Ok((reason, waiting));
    }
    for _ in made..ctx.agent.config.max_turn_requests {
        if ctx.cancel.is_cancelled() {
            return Err(Failure::Cancelled);
        }
        compact::fit(ctx, usage).await?;
        let response = model::request(ctx, usage).await?;
        let (mut inline, mut waiting) = (Vec::new(), Vec::new());
        for (event_id, call) in response.calls {
            match call.mode {
                Some(Mode::Inline) => inline.push(ServerCall::of(&ctx.plan, event_id, call)),
                Some(Mode::Ask | Mode::Client | Mode::ClientAsks) => waiting.push(event_id),
                Some(Mode::Rejected | Mode::OutOfMode) | None => {}
            }
        }
        tools::run(ctx, inline).await?;
        if let Some(stop) = decide::after_response(response.stop, response.called, waiting) {
            return Ok(stop);
        }
    }
    if ctx.cancel.is_cancelled() {
        return Err(Failure::Cancelled);
    }
    Ok((StopReason::MaxTurnRequests, vec![]))
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

/// Orders the turn's next events. The turn does not wait for them to be durable: nobody
/// sees them before they are, and a turn's events share flushes with each other and with
/// the actor's. It waits only before a tool runs ([`tools::run`]).
fn append(ctx: &TurnContext, bodies: Vec<EventBody>) -> Result<Vec<RawEvent>, Failure> {
    let drafts = bodies.iter().map(|body| Draft::new(Some(ctx.turn), body)).collect();
    ctx.writer.order(drafts)?.0.map_err(|conflict| {
        Failure::Log(format!("another writer appended to the session's log (at {})", conflict.actual.seq))
    })
}
