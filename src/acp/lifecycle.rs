//! The session lifecycle over ACP beyond `session/new` and prompts: load (a replay) and
//! resume (none), close and delete, fork, and modes; and following a turn that still runs
//! when a client opens its session.

use std::path::Path;
use std::sync::Arc;

use agent_client_protocol::v1::schema::{
    self as acp, DeleteSessionResponse, ForkSessionRequest, ForkSessionResponse, LoadSessionRequest,
    LoadSessionResponse, ResumeSessionRequest, ResumeSessionResponse, SessionNotification,
};
use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::{Client, Error};
use serde_json::{json, Map};

use super::door::{self, Door};
use super::{absolute, error, mcp_servers, render, Acp, Running, CLOSE_WAIT};
use crate::domain::{Event, EventBody, EventId};
use crate::projection::turns::{Phase, TurnState};

impl Acp {
    /// Replays the whole conversation, then what the session list shows of it and how full
    /// its context is ([`Acp::open`]), then answers (the client reads the updates first).
    pub(super) async fn load_session(
        &self,
        request: &LoadSessionRequest,
        cx: &ConnectionTo<Client>,
    ) -> Result<LoadSessionResponse, Error> {
        let settings = self.open(&request.session_id.0, &request.cwd, &request.mcp_servers, cx, true).await?;
        Ok(LoadSessionResponse::new().modes(settings.modes).config_options(settings.options))
    }

    /// As [`Acp::load_session`], without the replay: the client has the conversation (it is
    /// reattaching after a reconnect, or a restart of this process).
    pub(super) async fn resume_session(
        &self,
        request: &ResumeSessionRequest,
        cx: &ConnectionTo<Client>,
    ) -> Result<ResumeSessionResponse, Error> {
        let settings = self.open(&request.session_id.0, &request.cwd, &request.mcp_servers, cx, false).await?;
        Ok(ResumeSessionResponse::new().modes(settings.modes).config_options(settings.options))
    }

    /// Opens `session` on this connection, with the client's MCP servers given to it: sends
    /// its conversation (if `replay`), what the session list shows of it (its title, when it
    /// last changed) and how full its context is, then streams the rest of a turn still
    /// running (one this agent resumed after its process stopped) until it ends. Its modes
    /// and config options.
    async fn open(
        &self,
        session: &str,
        cwd: &Path,
        mcp: &[acp::McpServer],
        cx: &ConnectionTo<Client>,
        replay: bool,
    ) -> Result<super::settings::Settings, Error> {
        absolute(cwd)?;
        let mcp = mcp_servers(mcp)?;
        let events = self.door.events(session).await.map_err(|e| error(e, Some(session)))?;
        self.door.attach_mcp(session, mcp).await.map_err(|e| error(e, Some(session)))?;
        self.closed.lock().remove(session);
        self.cwds.lock().insert(session.to_string(), cwd.to_path_buf());
        let settings = self.settings(session).await?;
        let replayed = if replay { render::replay(&events) } else { Vec::new() };
        let commands = Some(settings.commands.clone());
        let after = render::info(&events).into_iter().chain(render::context(&events)).chain(commands);
        for update in replayed.into_iter().chain(after) {
            cx.send_notification(SessionNotification::new(session.to_string(), update))?;
        }
        self.offer_prompts(session, cx);
        self.follow_if_running(session, &events, cx);
        Ok(settings)
    }

    /// Streams the rest of the session's turn to the client, if one runs (as the engine's
    /// own fold of the log says), until it ends or the client closes the session.
    fn follow_if_running(&self, session: &str, events: &[Event], cx: &ConnectionTo<Client>) {
        let mut state = TurnState::default();
        events.iter().for_each(|event| state.apply(event));
        let Some(last) = events.last().filter(|_| matches!(state.phase, Phase::Running(_))) else { return };
        let task = tokio::spawn(follow_running(self.door.clone(), cx.clone(), session.to_string(), last.id));
        let mut following = self.following.lock();
        following.retain(|_, task| !task.is_finished());
        if let Some(earlier) = following.insert(session.to_string(), task) {
            earlier.abort();
        }
    }

    /// Closes the session on this connection, at once: no prompt from now on (until a load
    /// or a resume), and the turn followed for it is no longer streamed. Its prompt, if one
    /// runs, is handed to [`Acp::finish_close`].
    pub(super) fn begin_close(&self, session: &str) -> Option<Running> {
        self.closed.lock().insert(session.to_string());
        if let Some(following) = self.following.lock().remove(session) {
            following.abort();
        }
        self.prompts.lock().remove(session)
    }

    /// The rest of a close: the session's prompt is cancelled (and answered `cancelled`
    /// first), and the editor's MCP servers are taken off it unless the client has opened
    /// it again meanwhile. The session itself stays, in the log, for a later `session/load`
    /// or `session/resume` (by this client or any other).
    pub(super) async fn finish_close(&self, session: &str, running: Option<Running>) {
        if let Some(running) = running {
            running.cancel.cancel();
            if tokio::time::timeout(CLOSE_WAIT, running.task).await.is_err() {
                let waited = CLOSE_WAIT.as_secs();
                tracing::warn!(session_id = session, "a prompt still running {waited} s after its session closed");
            }
        }
        if !self.closed.lock().contains(session) {
            return;
        }
        if let Err(error) = self.door.attach_mcp(session, door::McpDeclared::new()).await {
            tracing::debug!(%error, session_id = session, "the editor's MCP servers were not taken off a closed session");
        }
    }

    /// Deletes the session: closed on this connection first (its prompt cancelled and
    /// answered), then deleted in the log (see [`Door::delete`]); a load of it is then
    /// `-32002`, and the session list no longer shows it.
    pub(super) async fn delete_session(
        &self,
        session: &str,
        running: Option<Running>,
    ) -> Result<DeleteSessionResponse, Error> {
        self.finish_close(session, running).await;
        self.door.delete(session).await.map_err(|e| error(e, Some(session)))?;
        tracing::info!(session_id = session, "session deleted");
        Ok(DeleteSessionResponse::new())
    }

    /// turnlog's fork of the session at its last event, in the client's `cwd`: a new
    /// session with the whole conversation so far, which goes on apart from the source.
    /// The fork's commands come with the answer, to be sent once the client has it.
    pub(super) async fn fork_session(
        &self,
        request: &ForkSessionRequest,
    ) -> Result<(ForkSessionResponse, acp::SessionUpdate), Error> {
        let mcp = mcp_servers(&request.mcp_servers)?;
        let forked = self.fork(&request.session_id.0, &request.cwd).await?;
        self.door.attach_mcp(&forked, mcp).await.map_err(|e| error(e, Some(&forked)))?;
        self.cwds.lock().insert(forked.clone(), request.cwd.clone());
        let settings = self.settings(&forked).await?;
        let answer = ForkSessionResponse::new(forked).modes(settings.modes).config_options(settings.options);
        Ok((answer, settings.commands))
    }

    /// Forks `session` at its last event, with `cwd` as the fork's working directory; the
    /// fork's id.
    pub(super) async fn fork(&self, session: &str, cwd: &Path) -> Result<String, Error> {
        let cwd = absolute(cwd)?;
        let events = self.door.events(session).await.map_err(|e| error(e, Some(session)))?;
        let Some(last) = events.last() else {
            return Err(acp::Error::session_not_found(session.to_string()).into());
        };
        let metadata = Map::from_iter([(door::CWD.to_string(), json!(cwd))]);
        let forked = self.door.fork(session, last.id, metadata).await.map_err(|e| error(e, Some(session)))?;
        tracing::info!(session_id = %forked, source = %session, "session forked");
        Ok(forked)
    }
}

/// Streams the rest of a running turn after a load's replay (which ends at `after`, the
/// last event other than a delta: the deltas after it are the turn's message in progress),
/// until the turn stops or the client goes. On one node, a turn a stopped process left is
/// resumed (its cut message retracted) before the start serves anyone, so these deltas are
/// of a message being said; through a cluster node, a load that comes before another node
/// has taken a dead node's turn over may stream the cut message's deltas too.
async fn follow_running(door: Arc<dyn Door>, cx: ConnectionTo<Client>, session: String, after: EventId) {
    use futures_util::StreamExt;
    let Ok(mut events) = door.follow(&session, after).await else { return };
    let mut live = render::Live::default();
    while let Some(Ok(event)) = events.next().await {
        let changed = match &event.body {
            EventBody::SessionUpdated { mode, model, .. } if mode.is_some() || model.is_some() => {
                super::settings::update(&*door, &session).await
            }
            _ => None,
        };
        for update in live.update(&event).into_iter().chain(changed) {
            if cx.send_notification(SessionNotification::new(session.clone(), update)).is_err() {
                return;
            }
        }
        if matches!(event.body, EventBody::StatusIdle { .. } | EventBody::Terminated { .. }) {
            return;
        }
    }
}
