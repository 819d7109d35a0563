//! Commands a user can type in a session's prompt (an editor's `/` menu): which a session
//! offers, and what a prompt's text asks for. Each does what a client could do another
//! way, so its effect is in the log as that way records it: `/compact` runs a turn that
//! compacts the conversation (`user.compact`, then `history.compacted`), `/fork` makes a
//! fork (its `session.created` names the source and the point), `/mode` and `/model`
//! change the session (`session.updated`).

use super::{Models, Modes};

/// A command as a client's menu lists it.
#[derive(Debug, Clone, PartialEq)]
pub struct CommandInfo {
    pub name: &'static str,
    pub description: String,
    /// What to type after the name, for a command that takes an argument.
    pub hint: Option<String>,
}

/// What a prompt asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    /// The conversation so far summarised now, to leave the model's context room.
    Compact,
    /// A new session with this one's conversation so far.
    Fork,
    /// The session's mode from its next turn on.
    Mode(String),
    /// The session's model from its next turn on.
    Model(String),
}

/// The commands a session offers: `/compact` and `/fork` always, `/mode` where its agent
/// has modes, and `/model` where it offers more than its own.
pub fn offered(modes: Option<&Modes>, models: &Models) -> Vec<CommandInfo> {
    let compact = CommandInfo {
        name: "compact",
        description: "Compact the conversation so far: the model summarises it, leaving its context room".into(),
        hint: None,
    };
    let fork = CommandInfo {
        name: "fork",
        description: "Fork this session: a new session with the conversation so far, which goes on apart".into(),
        hint: None,
    };
    let ids = |ids: Vec<&str>| ids.join(", ");
    let mode = modes.map(|modes| CommandInfo {
        name: "mode",
        description: "Change the session's mode (what the tools may do) from the next turn on".into(),
        hint: Some(ids(modes.available.iter().map(|m| m.id.as_str()).collect())),
    });
    let model = (models.available.len() > 1).then(|| CommandInfo {
        name: "model",
        description: "Change the session's model from the next turn on".into(),
        hint: Some(ids(models.available.iter().map(|m| m.id.as_str()).collect())),
    });
    [compact, fork].into_iter().chain(mode).chain(model).collect()
}

/// A prompt's text as one of the `offered` commands: `/name` and its argument, alone in the
/// prompt. `None`: not a command (for the model, as typed); `Err`: a command used wrongly,
/// saying how to use it.
pub fn parse(text: &str, offered: &[CommandInfo]) -> Option<Result<Command, String>> {
    let rest = text.trim().strip_prefix('/')?;
    let (name, argument) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
    let command = offered.iter().find(|c| c.name == name)?;
    let argument = argument.trim();
    Some(match (command.name, argument, &command.hint) {
        ("compact", "", _) => Ok(Command::Compact),
        ("fork", "", _) => Ok(Command::Fork),
        (name @ ("compact" | "fork"), _, _) => Err(format!("/{name} takes nothing after it")),
        (name, "", hint) => Err(format!("/{name} needs one of: {}", hint.as_deref().unwrap_or_default())),
        ("mode", id, _) => Ok(Command::Mode(id.to_string())),
        (_, id, _) => Ok(Command::Model(id.to_string())),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::{ModeInfo, ModelInfo};

    fn models(ids: &[&str]) -> Models {
        let available = ids.iter().map(|id| ModelInfo { id: id.to_string(), name: id.to_string() }).collect();
        Models { current: ids[0].to_string(), available }
    }

    #[test]
    fn a_session_offers_what_it_can_change_and_reads_only_those() {
        let modes = Modes {
            current: "code".into(),
            available: ["ask", "code"]
                .map(|id| ModeInfo { id: id.into(), name: id.into(), description: "".into() })
                .to_vec(),
        };
        let all = offered(Some(&modes), &models(&["default", "second"]));
        assert_eq!(all.iter().map(|c| c.name).collect::<Vec<_>>(), ["compact", "fork", "mode", "model"]);
        assert_eq!(all[2].hint.as_deref(), Some("ask, code"));
        let bare = offered(None, &models(&["default"]));
        assert_eq!(bare.iter().map(|c| c.name).collect::<Vec<_>>(), ["compact", "fork"]);
        assert_eq!(parse("/compact", &bare), Some(Ok(Command::Compact)));

        assert_eq!(parse("/fork", &all), Some(Ok(Command::Fork)));
        assert_eq!(parse("  /mode  ask \n", &all), Some(Ok(Command::Mode("ask".into()))));
        assert_eq!(parse("/model second", &all), Some(Ok(Command::Model("second".into()))));
        assert_eq!(parse("/mode", &all), Some(Err("/mode needs one of: ask, code".into())));
        assert_eq!(parse("/fork now", &all), Some(Err("/fork takes nothing after it".into())));
        assert_eq!(parse("/model second", &bare), None, "not offered: for the model, as typed");
        assert_eq!(parse("/tool calculator {}", &all), None);
        assert_eq!(parse("fork", &all), None);
    }
}
