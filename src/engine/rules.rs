//! The rules a session's setup follows whichever view asked: which server tools it may
//! enable and trust, client tool names, agent options, the calls a seed history may leave
//! waiting, and which option values are secret. Error messages name the field in the neutral
//! [`SessionSpec`]'s terms.

use serde_json::{Map, Value};

use super::command::SessionUpdate;
use crate::agent::{Agent, OptionKind, Tools};
use crate::domain::event::{ClientTool, SessionSpec, ToolTrust};
use crate::domain::{Block, EventBody};
use crate::error::SessionError;

fn invalid(message: String) -> SessionError {
    SessionError::Invalid(message)
}

/// A new session's spec, checked against its agent.
pub fn check_new(agent: &Agent, tools: &Tools, spec: &mut SessionSpec) -> Result<(), SessionError> {
    if let Some(trust) = &spec.agent.tools {
        check_agent_tools(agent, tools, trust)?;
    }
    check_client_tools(agent, &spec.tools)?;
    if let Some(mode) = &spec.mode {
        check_mode(agent, mode, "mode")?;
    }
    if let Some(model) = &spec.model {
        check_model(agent, model, "model")?;
    }
    spec.agent.options = merge_options(agent, &Map::new(), &spec.agent.options)?;
    // The calls a seed history ends with wait for answers by id: two with one id could
    // never both be answered.
    let waiting: Vec<String> = crate::domain::message::waiting_calls(&spec.messages).map(|(id, _, _)| id).collect();
    if let Some((i, id)) = waiting.iter().enumerate().find(|(i, id)| waiting[..*i].contains(id)) {
        let last = spec.messages.len() - 1;
        return Err(invalid(format!(
            "invalid field `messages[{last}].content`: tool call {i} repeats the id {id:?} of an earlier call"
        )));
    }
    Ok(())
}

/// Content for the session's model (its choice of the agent's `models`, else the agent's
/// own): an image to a model that takes none is refused, naming where it is, rather than
/// dropped on the way to the model.
pub fn check_content<'a>(
    agent: &Agent,
    spec: &SessionSpec,
    content: impl IntoIterator<Item = &'a [Block]>,
) -> Result<(), SessionError> {
    if agent.model_config(spec.model.as_deref()).images {
        return Ok(());
    }
    for (i, blocks) in content.into_iter().enumerate() {
        if let Some(at) = blocks.iter().position(Block::is_image) {
            return Err(invalid(format!(
                "agent {:?} has a model that takes no images (`images = false` in its config), and message {i} \
                 holds one (block {at})",
                agent.name
            )));
        }
    }
    Ok(())
}

/// The `session.updated` a submission's changes make: `agent.tools`, `tools` and `title`
/// replace, `agent.options` merge by key, `metadata` is a patch (`null` deletes a key);
/// `None` when it changes nothing.
pub fn update(
    agent: &Agent,
    tools: &Tools,
    current: &SessionSpec,
    update: &SessionUpdate,
) -> Result<Option<EventBody>, SessionError> {
    if update.is_empty() {
        return Ok(None);
    }
    if let Some(client) = &update.tools {
        check_client_tools(agent, client)?;
    }
    let agent_spec = match &update.agent {
        Some(changes) => {
            let mut spec = current.agent.clone();
            if let Some(trust) = &changes.tools {
                check_agent_tools(agent, tools, trust)?;
                spec.tools = Some(trust.clone());
            }
            if let Some(options) = &changes.options {
                spec.options = merge_options(agent, &spec.options, options)?;
            }
            Some(spec)
        }
        None => None,
    };
    let metadata = update.metadata.as_ref().map(|patch| {
        let mut metadata = current.metadata.clone();
        crate::domain::metadata::apply_patch(&mut metadata, patch.clone());
        metadata
    });
    if let Some(mode) = &update.mode {
        check_mode(agent, mode, "mode")?;
    }
    if let Some(model) = &update.model {
        check_model(agent, model, "model")?;
    }
    Ok(Some(EventBody::SessionUpdated {
        agent: agent_spec,
        tools: update.tools.clone(),
        title: update.title.clone(),
        metadata,
        mode: update.mode.clone(),
        model: update.model.clone(),
    }))
}

/// A mode must be one of the agent's.
fn check_mode(agent: &Agent, mode: &str, field: &str) -> Result<(), SessionError> {
    if agent.config.modes.contains_key(mode) {
        return Ok(());
    }
    let modes: Vec<&str> = agent.config.modes.keys().map(String::as_str).collect();
    Err(invalid(match modes.is_empty() {
        true => format!("invalid field `{field}`: agent {:?} has no modes", agent.name),
        false => format!(
            "invalid field `{field}`: agent {:?} has no mode {mode:?}; it has: {}",
            agent.name,
            modes.join(", ")
        ),
    }))
}

/// A model must be one the agent offers its sessions: `default` (its own) or one of its
/// `models`.
fn check_model(agent: &Agent, model: &str, field: &str) -> Result<(), SessionError> {
    if model == crate::agent::DEFAULT_MODEL || agent.choices.contains_key(model) {
        return Ok(());
    }
    let offered: Vec<&str> =
        std::iter::once(crate::agent::DEFAULT_MODEL).chain(agent.choices.keys().map(String::as_str)).collect();
    Err(invalid(format!(
        "invalid field `{field}`: agent {:?} offers no model {model:?}; it offers: {}",
        agent.name,
        offered.join(", ")
    )))
}

/// `agent.tools` may name only the agent's exposed tools, once each.
fn check_agent_tools(agent: &Agent, tools: &Tools, trust: &[ToolTrust]) -> Result<(), SessionError> {
    let offered: Vec<&str> = agent.exposed_tools(tools).collect();
    for (i, tool) in trust.iter().enumerate() {
        if !offered.contains(&tool.name.as_str()) {
            return Err(invalid(format!(
                "invalid field `agent.tools[{i}].name`: agent {:?} has no tool {:?}; it offers: {}",
                agent.name,
                tool.name,
                offered.join(", ")
            )));
        }
        if trust[..i].iter().any(|t| t.name == tool.name) {
            return Err(invalid(format!("invalid field `agent.tools[{i}].name`: {:?} is listed twice", tool.name)));
        }
    }
    Ok(())
}

/// Client tool names must be unique, and unique across the agent's tools.
fn check_client_tools(agent: &Agent, client: &[ClientTool]) -> Result<(), SessionError> {
    for (i, tool) in client.iter().enumerate() {
        if tool.name.trim().is_empty() {
            return Err(invalid(format!("invalid field `tools[{i}].name`: must not be empty")));
        }
        if agent.config.tools.contains_key(&tool.name) || agent.config.client_tools.iter().any(|t| t.name == tool.name)
        {
            return Err(invalid(format!(
                "invalid field `tools[{i}].name`: {:?} clashes with a tool of agent {:?}; tool names must be unique \
                 across the client's and the agent's tools",
                tool.name, agent.name
            )));
        }
        if client[..i].iter().any(|t| t.name == tool.name) {
            return Err(invalid(format!("invalid field `tools[{i}].name`: {:?} is declared twice", tool.name)));
        }
    }
    Ok(())
}

/// Options merge by key; each must be one the agent declares, and a select's value one of
/// its choices.
fn merge_options(
    agent: &Agent,
    current: &Map<String, Value>,
    changes: &Map<String, Value>,
) -> Result<Map<String, Value>, SessionError> {
    let mut merged = current.clone();
    for (name, value) in changes {
        let Some(spec) = agent.config.options.iter().find(|o| &o.name == name) else {
            return Err(invalid(format!(
                "invalid field `agent.options.{name}`: agent {:?} has no option {name:?}",
                agent.name
            )));
        };
        let Some(text) = value.as_str() else {
            return Err(invalid(format!("invalid field `agent.options.{name}`: must be a string")));
        };
        if spec.kind == OptionKind::Select && !spec.options.iter().any(|o| o == text) {
            return Err(invalid(format!(
                "invalid field `agent.options.{name}`: {text:?} is not one of {}",
                spec.options.join(", ")
            )));
        }
        merged.insert(name.clone(), value.clone());
    }
    Ok(merged)
}

/// Secret option values as `***`: no view ever shows them.
pub fn redact(agent: Option<&Agent>, spec: &mut SessionSpec) {
    let Some(agent) = agent else { return };
    for option in agent.config.options.iter().filter(|o| o.kind == OptionKind::Secret) {
        if let Some(value) = spec.agent.options.get_mut(&option.name) {
            *value = Value::String("***".into());
        }
    }
}

/// The session's choice of server tools when its dialect has none to make (the managed
/// agents API): every tool the agent offers, trusted as far as its config allows. `None`
/// for an agent made through an API, which has no server tools.
pub fn configured_tools(agent: &Agent, tools: &Tools) -> Option<Vec<ToolTrust>> {
    agent
        .definition
        .is_none()
        .then(|| agent.exposed_tools(tools).map(|name| ToolTrust { name: name.to_string(), trust: true }).collect())
}
