//! Commands over ACP: the session's commands (`session::commands`) sent as an
//! `available_commands_update` when a client opens it (then again with its MCP servers'
//! prompts, once they are listed), and a prompt that is one of them run here: a prompt of
//! an MCP server becomes the message of the turn it starts; any other command is answered
//! with a message saying what it did.

use agent_client_protocol::v1::schema::{
    ContentBlock, ContentChunk, CurrentModeUpdate, MessageId, SessionNotification, SessionUpdate, StopReason,
    TextContent,
};
use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::Client;

use super::door::{Door, DoorError};
use super::line::Line;
use super::prompt::{Ended, Prompt};
use super::render::Live;
use super::{settings, Acp};
use crate::domain::event::StopReason as DomainStop;
use crate::domain::{Block, EventBody};
use crate::session::commands::{self, Command};
use crate::session::Input;

/// The command a prompt is, if it is one of the session's: one text block, `/name ...`.
pub(super) async fn asked(door: &dyn Door, session: &str, prompt: &[Block]) -> Option<Result<Command, String>> {
    let [block] = prompt else { return None };
    let text = block.text.as_deref().filter(|text| block.kind == "text" && text.trim_start().starts_with('/'))?;
    let (modes, models) = settings::read(door, session).await.ok()?;
    let listed = match commands::may_name_a_prompt(text) {
        // Listing fails only for the session itself (gone, out of reach): said as the command's failure.
        true => match door.prompts(session).await {
            Ok(listed) => listed,
            Err(error) => {
                let name = text.split_whitespace().next().unwrap_or_default();
                return Some(Err(format!("{name}: the session's MCP prompts cannot be listed now: {error}")));
            }
        },
        false => Default::default(),
    };
    commands::parse(text, &commands::offered(modes.as_ref(), &models, &listed.prompts), &listed.unavailable)
}

impl Acp {
    /// Tells the client the session's commands again with its MCP servers' prompts, if it
    /// has any, from a task of its own (listing them may start the servers); not if the
    /// client closed the session meanwhile.
    pub(super) fn offer_prompts(&self, session: &str, cx: &ConnectionTo<Client>) {
        let (acp, session, cx) = (self.clone(), session.to_string(), cx.clone());
        tokio::spawn(async move {
            let Some(update) = settings::commands_with_prompts(&*acp.door, &session).await else { return };
            if acp.closed.lock().contains(&session) {
                return;
            }
            if let Err(error) = cx.send_notification(SessionNotification::new(session, update)) {
                tracing::debug!(%error, "the session's prompts were not sent (the client has gone)");
            }
        });
    }

    /// Runs a command typed in the prompt: an MCP server's prompt is written out and sent as
    /// the prompt's message; any other command ends the prompt `end_turn` with a message
    /// saying what was done (or why not). The change itself is in the log.
    pub(super) async fn run_command(&self, prompt: Prompt, command: Result<Command, String>) -> Ended {
        let line = &prompt.line();
        let session = line.session;
        let said = match command {
            Err(usage) => usage,
            Ok(Command::Prompt { server, name, arguments }) => {
                match self.door.write_prompt(session, &server, &name, &arguments).await {
                    Ok(content) => return prompt.run(content).await,
                    Err(error) => format!("/{}: {error}", commands::prompt_command(&server, &name)),
                }
            }
            Ok(Command::Compact) => match self.compact(line).await {
                Ok(Some(ended)) => return ended,
                Ok(None) => "Nothing to compact yet.".to_string(),
                Err(error) => format!("/compact: {error}"),
            },
            Ok(Command::Fork) => {
                let cwd = self.cwds.lock().get(session).cloned().unwrap_or_default();
                match self.fork(session, &cwd).await {
                    Ok(forked) => format!(
                        "Forked this session as {forked}: a new session with the conversation so far, which goes on \
                         apart. Open it from the session list."
                    ),
                    Err(error) => format!("/fork did not fork: {}", error.message),
                }
            }
            Ok(Command::Mode(mode)) => match self.door.set_mode(session, &mode, &self.write_key()).await {
                Ok(_) => {
                    line.notify(SessionUpdate::CurrentModeUpdate(CurrentModeUpdate::new(mode.clone())));
                    if let Some(update) = settings::update(&*self.door, session).await {
                        line.notify(update);
                    }
                    format!("The mode is {mode} from the next turn on.")
                }
                Err(error) => format!("/mode: {error}"),
            },
            Ok(Command::Model(model)) => match self.door.set_model(session, &model, &self.write_key()).await {
                Ok(_) => {
                    if let Some(update) = settings::update(&*self.door, session).await {
                        line.notify(update);
                    }
                    format!("The model is {model} from the next turn on.")
                }
                Err(error) => format!("/model: {error}"),
            },
        };
        let chunk = ContentChunk::new(ContentBlock::Text(TextContent::new(said)))
            .message_id(MessageId::new(format!("msg_{}", ulid::Ulid::new())));
        line.notify(SessionUpdate::AgentMessageChunk(chunk));
        Ended::Stopped(StopReason::EndTurn)
    }

    /// Runs a compaction turn and shows it as the log records it (`history.compacted`, as
    /// every view's replay does); `None` if it compacted nothing (a conversation of one
    /// message, or none).
    async fn compact(&self, line: &Line<'_>) -> Result<Option<Ended>, DoorError> {
        use futures_util::StreamExt;
        let stored = self.door.submit(line.session, vec![Input::Compact], &self.write_key()).await?;
        let Some(asked) = stored.iter().find(|e| matches!(e.body, EventBody::UserCompact {})) else {
            return Err(DoorError::Unavailable("the compaction was not stored".into()));
        };
        let mut events = self.door.follow(line.session, asked.id).await?;
        let (mut live, mut compacted, mut interrupted) = (Live::default(), false, false);
        loop {
            let next = tokio::select! {
                biased;
                _ = line.cancel.cancelled(), if !interrupted => {
                    // `session/cancel`: the compaction stops, and its turn says so.
                    interrupted = true;
                    if let Err(error) = self.door.submit(line.session, vec![Input::Interrupt], &self.write_key()).await {
                        tracing::debug!(session_id = line.session, %error, "a compaction was not interrupted (it ended first)");
                    }
                    continue;
                }
                next = events.next() => next,
            };
            let Some(event) = next else { break };
            let event = event?;
            compacted |= matches!(event.body, EventBody::HistoryCompacted { .. });
            for update in live.update(&event) {
                line.notify(update);
            }
            match &event.body {
                EventBody::SessionError { error, code, .. } => {
                    return Ok(Some(Ended::Failed { code: code.clone(), message: error.clone() }))
                }
                EventBody::StatusIdle { stop_reason, .. } if stop_reason.kind == DomainStop::Cancelled => {
                    return Ok(Some(Ended::Stopped(StopReason::Cancelled)))
                }
                EventBody::StatusIdle { .. } => return Ok(compacted.then_some(Ended::Stopped(StopReason::EndTurn))),
                _ => {}
            }
        }
        Err(DoorError::Unavailable("the session's log ended during the compaction".into()))
    }

    fn write_key(&self) -> String {
        super::door::write_key(&self.connection, None)
    }
}
