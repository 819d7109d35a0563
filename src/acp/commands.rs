//! Commands over ACP: the session's commands (`session::commands`) sent as an
//! `available_commands_update` when a client opens it, and a prompt that is one of them run
//! here, answered with a message saying what it did.

use agent_client_protocol::v1::schema::{
    AvailableCommand, AvailableCommandInput, AvailableCommandsUpdate, ContentBlock, ContentChunk, CurrentModeUpdate,
    MessageId, SessionUpdate, StopReason, TextContent, UnstructuredCommandInput,
};

use super::door::Door;
use super::line::Line;
use super::prompt::Ended;
use super::{settings, Acp};
use crate::domain::Block;
use crate::session::commands::{self, Command};

/// The session's commands as an update; `None` if they cannot be read now.
pub(super) async fn available(door: &dyn Door, session: &str) -> Option<SessionUpdate> {
    let (modes, models) = settings::read(door, session).await.ok()?;
    let listed = commands::offered(modes.as_ref(), &models)
        .into_iter()
        .map(|command| {
            let input =
                command.hint.map(|hint| AvailableCommandInput::Unstructured(UnstructuredCommandInput::new(hint)));
            AvailableCommand::new(command.name, command.description).input(input)
        })
        .collect();
    Some(SessionUpdate::AvailableCommandsUpdate(AvailableCommandsUpdate::new(listed)))
}

/// The command a prompt is, if it is one of the session's: one text block, `/name ...`.
pub(super) async fn asked(door: &dyn Door, session: &str, prompt: &[Block]) -> Option<Result<Command, String>> {
    let [block] = prompt else { return None };
    let text = block.text.as_deref().filter(|text| block.kind == "text" && text.trim_start().starts_with('/'))?;
    let (modes, models) = settings::read(door, session).await.ok()?;
    commands::parse(text, &commands::offered(modes.as_ref(), &models))
}

impl Acp {
    /// Runs a command typed in `session`'s prompt; the prompt ends `end_turn` with a message
    /// saying what was done (or why not). The change itself is in the log.
    pub(super) async fn run_command(&self, line: &Line<'_>, command: Result<Command, String>) -> Ended {
        let session = line.session;
        let said = match command {
            Err(usage) => usage,
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

    fn write_key(&self) -> String {
        super::door::write_key(&self.connection, None)
    }
}
