//! A session's settings as an editor picks them: its mode (ACP's modes, and a config option
//! of category `mode`) and its model (a config option of category `model`, where its agent
//! offers more than one). Both are in the log (`session.updated`), hold from the session's
//! next turn on, and reach a client following the session as updates. The commands a
//! session offers follow from the same (`session::commands`), and are read with them; its
//! MCP servers' prompts, which may take a server's start to list, follow apart.

use agent_client_protocol::v1::schema::{
    AvailableCommand, AvailableCommandInput, AvailableCommandsUpdate, ConfigOptionUpdate, SessionConfigOption,
    SessionConfigOptionCategory, SessionConfigSelectOption, SessionMode, SessionModeState, SessionUpdate,
    SetSessionConfigOptionRequest, SetSessionConfigOptionResponse, SetSessionModeRequest, SetSessionModeResponse,
    UnstructuredCommandInput,
};
use agent_client_protocol::Error;
use serde_json::json;

use super::door::{Door, DoorError};
use super::{error, Acp};
use crate::session::{McpPrompt, Models, Modes};

/// The config options' ids.
const MODE: &str = "mode";
const MODEL: &str = "model";

/// What `session/new`, `session/load`, `session/resume` and `session/fork` answer with.
pub(super) struct Settings {
    pub modes: Option<SessionModeState>,
    /// `None` when there is nothing to pick.
    pub options: Option<Vec<SessionConfigOption>>,
    /// The session's commands (`available_commands_update`), for the client to be told once
    /// it knows the session.
    pub commands: SessionUpdate,
}

impl Acp {
    /// The session's settings and commands, from one read of its modes and models.
    pub(super) async fn settings(&self, session: &str) -> Result<Settings, Error> {
        let (modes, models) = read(&*self.door, session).await.map_err(|e| error(e, Some(session)))?;
        let options = options(modes.as_ref(), &models);
        let commands = commands(modes.as_ref(), &models, &[]);
        Ok(Settings { modes: modes.map(mode_state), options: Some(options).filter(|o| !o.is_empty()), commands })
    }

    /// Changes the session's mode, in the log (from its next turn on); `key` names the write.
    pub(super) async fn set_mode(
        &self,
        request: &SetSessionModeRequest,
        key: &str,
    ) -> Result<SetSessionModeResponse, Error> {
        let session = request.session_id.0.to_string();
        self.door.set_mode(&session, &request.mode_id.0, key).await.map_err(|e| error(e, Some(&session)))?;
        Ok(SetSessionModeResponse::new())
    }

    /// Changes a config option (the mode or the model), in the log; answers with them all.
    pub(super) async fn set_option(
        &self,
        request: &SetSessionConfigOptionRequest,
        key: &str,
    ) -> Result<SetSessionConfigOptionResponse, Error> {
        let session = request.session_id.0.to_string();
        let invalid = |message: String| Error::invalid_params().data(json!(message));
        let Some(value) = request.value.as_value_id().map(|v| v.0.to_string()) else {
            return Err(invalid(format!("config option {:?} takes one of its values' ids", request.config_id.0)));
        };
        let set = match &*request.config_id.0 {
            MODE => self.door.set_mode(&session, &value, key).await.map(|_| ()),
            MODEL => self.door.set_model(&session, &value, key).await.map(|_| ()),
            other => return Err(invalid(format!("no config option {other:?}: there are {MODE:?} and {MODEL:?}"))),
        };
        set.map_err(|e| error(e, Some(&session)))?;
        let settings = self.settings(&session).await?;
        Ok(SetSessionConfigOptionResponse::new(settings.options.unwrap_or_default()))
    }
}

/// The session's config options as they are now, as an update (for a client following the
/// session when its mode or model changed); `None` if they cannot be read now.
pub(super) async fn update(door: &dyn Door, session: &str) -> Option<SessionUpdate> {
    match read(door, session).await {
        Ok((modes, models)) => {
            Some(SessionUpdate::ConfigOptionUpdate(ConfigOptionUpdate::new(options(modes.as_ref(), &models))))
        }
        Err(error) => {
            tracing::debug!(session_id = session, %error, "the session's config options were not sent");
            None
        }
    }
}

pub(super) async fn read(door: &dyn Door, session: &str) -> Result<(Option<Modes>, Models), DoorError> {
    let modes = door.modes(session).await?;
    let models = match door.models(session).await {
        Ok(models) => models,
        // A server from before model choice (no such route): the agent's own model alone.
        Err(DoorError::NotFound(reason)) => {
            tracing::debug!(session_id = session, %reason, "the session's models are not known: none to pick");
            Models { current: crate::agent::DEFAULT_MODEL.into(), available: Vec::new() }
        }
        Err(error) => return Err(error),
    };
    Ok((modes, models))
}

fn mode_state(modes: Modes) -> SessionModeState {
    let available = modes
        .available
        .into_iter()
        .map(|mode| SessionMode::new(mode.id, mode.name).description(Some(mode.description).filter(|d| !d.is_empty())))
        .collect();
    SessionModeState::new(modes.current, available)
}

/// The mode (if the agent has modes) and the model (if it offers more than one) as select
/// options.
fn options(modes: Option<&Modes>, models: &Models) -> Vec<SessionConfigOption> {
    let mode = modes.map(|modes| {
        let choices: Vec<SessionConfigSelectOption> = modes
            .available
            .iter()
            .map(|m| {
                SessionConfigSelectOption::new(m.id.clone(), m.name.clone())
                    .description(Some(m.description.clone()).filter(|d| !d.is_empty()))
            })
            .collect();
        SessionConfigOption::select(MODE, "Mode", modes.current.clone(), choices)
            .category(SessionConfigOptionCategory::Mode)
    });
    let model = (models.available.len() > 1).then(|| {
        let choices: Vec<SessionConfigSelectOption> =
            models.available.iter().map(|m| SessionConfigSelectOption::new(m.id.clone(), m.name.clone())).collect();
        SessionConfigOption::select(MODEL, "Model", models.current.clone(), choices)
            .category(SessionConfigOptionCategory::Model)
    });
    mode.into_iter().chain(model).collect()
}

/// The session's commands with the prompts of its MCP servers, as an update; `None` if it
/// has no prompts (the commands without them went with its settings) or they cannot be
/// listed now.
pub(super) async fn commands_with_prompts(door: &dyn Door, session: &str) -> Option<SessionUpdate> {
    let listed = match door.prompts(session).await {
        Ok(listed) => listed,
        Err(error) => {
            tracing::debug!(session_id = session, %error, "the session's MCP prompts are not offered");
            return None;
        }
    };
    for down in &listed.unavailable {
        tracing::warn!(session_id = session, server = %down.server, error = %down.error, "an MCP server's prompts are not offered");
    }
    if listed.prompts.is_empty() {
        return None;
    }
    let (modes, models) = read(door, session).await.ok()?;
    Some(commands(modes.as_ref(), &models, &listed.prompts))
}

/// The commands of a session with these modes, models and prompts, as an update.
fn commands(modes: Option<&Modes>, models: &Models, prompts: &[McpPrompt]) -> SessionUpdate {
    let listed = crate::session::commands::offered(modes, models, prompts)
        .into_iter()
        .map(|command| {
            let input =
                command.hint.map(|hint| AvailableCommandInput::Unstructured(UnstructuredCommandInput::new(hint)));
            AvailableCommand::new(command.name, command.description).input(input)
        })
        .collect();
    SessionUpdate::AvailableCommandsUpdate(AvailableCommandsUpdate::new(listed))
}
