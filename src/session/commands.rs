//! Commands a user can type in a session's prompt (an editor's `/` menu): which a session
//! offers, and what a prompt's text asks for. Each does what a client could do another
//! way, so its effect is in the log as that way records it: `/compact` runs a turn that
//! compacts the conversation (`user.compact`, then `history.compacted`), `/fork` makes a
//! fork (its `session.created` names the source and the point), `/mode` and `/model`
//! change the session (`session.updated`), and `/mcp:<server>:<prompt>` starts a turn
//! with the message the MCP server's prompt writes (`user.message`).

use std::collections::BTreeMap;

use super::{McpPrompt, Models, Modes, Unavailable};

/// A command as a client's menu lists it.
#[derive(Debug, Clone, PartialEq)]
pub struct CommandInfo {
    pub name: String,
    pub description: String,
    /// What to type after the name, for a command that takes an argument.
    pub hint: Option<String>,
    what: What,
}

/// What a command does, and for a prompt, which.
#[derive(Debug, Clone, PartialEq)]
enum What {
    Compact,
    Fork,
    Mode,
    Model,
    Prompt(McpPrompt),
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
    /// A turn started with what an MCP server's prompt writes from these arguments.
    Prompt { server: String, name: String, arguments: BTreeMap<String, String> },
}

/// The commands a session offers: `/compact` and `/fork` always, `/mode` where its agent
/// has modes, `/model` where it offers more than its own, and each prompt of its MCP
/// servers as `/mcp:<server>:<prompt>` (one whose name has a space cannot be typed).
pub fn offered(modes: Option<&Modes>, models: &Models, prompts: &[McpPrompt]) -> Vec<CommandInfo> {
    let command = |name: &str, description: &str, hint: Option<String>, what: What| CommandInfo {
        name: name.to_string(),
        description: description.to_string(),
        hint,
        what,
    };
    let compact = command(
        "compact",
        "Compact the conversation so far: the model summarises it, leaving its context room",
        None,
        What::Compact,
    );
    let fork = command(
        "fork",
        "Fork this session: a new session with the conversation so far, which goes on apart",
        None,
        What::Fork,
    );
    let ids = |ids: Vec<&str>| ids.join(", ");
    let mode = modes.map(|modes| {
        let hint = ids(modes.available.iter().map(|m| m.id.as_str()).collect());
        command(
            "mode",
            "Change the session's mode (what the tools may do) from the next turn on",
            Some(hint),
            What::Mode,
        )
    });
    let model = (models.available.len() > 1).then(|| {
        let hint = ids(models.available.iter().map(|m| m.id.as_str()).collect());
        command("model", "Change the session's model from the next turn on", Some(hint), What::Model)
    });
    let typable = |p: &&McpPrompt| !p.name.contains(char::is_whitespace) && !p.server.contains(char::is_whitespace);
    let prompts = prompts.iter().filter(typable).map(|prompt| {
        let about = if prompt.description.is_empty() { "A prompt" } else { prompt.description.as_str() };
        let description = format!("{about} (MCP server {})", prompt.server);
        let hint = (!prompt.arguments.is_empty()).then(|| {
            let each = prompt.arguments.iter().map(|a| match a.required {
                true => format!("<{}>", a.name),
                false => format!("[{}]", a.name),
            });
            each.collect::<Vec<_>>().join(" ")
        });
        command(&prompt_command(&prompt.server, &prompt.name), &description, hint, What::Prompt(prompt.clone()))
    });
    [compact, fork].into_iter().chain(mode).chain(model).chain(prompts).collect()
}

/// The name of the command of `server`'s prompt `name`.
pub fn prompt_command(server: &str, name: &str) -> String {
    format!("mcp:{server}:{name}")
}

/// Whether a prompt's text may name one of the session's MCP prompts (worth listing them).
pub fn may_name_a_prompt(text: &str) -> bool {
    text.trim_start().starts_with("/mcp:")
}

/// A prompt's text as one of the `offered` commands: `/name` and its argument, alone in the
/// prompt. `None`: not a command (for the model, as typed); `Err`: a command used wrongly,
/// saying how to use it. A `/mcp:<server>:<prompt>` is never for the model: one not offered
/// says why (its server cannot be reached now, per `unavailable`, or has no such prompt).
pub fn parse(text: &str, offered: &[CommandInfo], unavailable: &[Unavailable]) -> Option<Result<Command, String>> {
    let rest = text.trim().strip_prefix('/')?;
    let (name, argument) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
    let Some(command) = offered.iter().find(|c| c.name == name) else {
        let (server, prompt) = name.strip_prefix("mcp:")?.split_once(':')?;
        let why = match unavailable.iter().find(|u| u.server == server) {
            Some(down) => format!("MCP server {server} cannot be reached now ({}); try again", down.error),
            None => {
                let theirs: Vec<&str> = offered.iter().filter_map(|c| c.name.strip_prefix("mcp:")).collect();
                let listed = if theirs.is_empty() { "none".to_string() } else { theirs.join(", ") };
                format!(
                    "no MCP server of this session offers a prompt {prompt:?} as {server:?} (its prompts: {listed})"
                )
            }
        };
        return Some(Err(format!("/{name}: {why}")));
    };
    let argument = argument.trim();
    let hint = command.hint.as_deref().unwrap_or_default();
    Some(match (&command.what, argument) {
        (What::Compact, "") => Ok(Command::Compact),
        (What::Fork, "") => Ok(Command::Fork),
        (What::Compact | What::Fork, _) => Err(format!("/{name} takes nothing after it")),
        (What::Mode | What::Model, "") => Err(format!("/{name} needs one of: {hint}")),
        (What::Mode, id) => Ok(Command::Mode(id.to_string())),
        (What::Model, id) => Ok(Command::Model(id.to_string())),
        (What::Prompt(prompt), text) => bind(prompt, text)
            .map(|arguments| Command::Prompt { server: prompt.server.clone(), name: prompt.name.clone(), arguments })
            .map_err(|why| match hint {
                "" => format!("/{name}: {why}"),
                hint => format!("/{name} {hint}: {why}"),
            }),
    })
}

/// The arguments typed after a prompt's command, by name. Each is one word or a quoted
/// string (`"New York"`, with `\"` for a quote and `\\` for a backslash), given in the
/// prompt's order or by name (`state=NY`); the last one left takes the rest of the text as
/// typed (unquoted if it is one quoted string). An empty value does not give a required one.
fn bind(prompt: &McpPrompt, text: &str) -> Result<BTreeMap<String, String>, String> {
    let mut bound = BTreeMap::new();
    let mut rest = text.trim();
    let unset = |bound: &BTreeMap<String, String>| -> Vec<String> {
        prompt.arguments.iter().map(|a| a.name.clone()).filter(|n| !bound.contains_key(n)).collect()
    };
    while !rest.is_empty() {
        let left = unset(&bound);
        let named = rest.split_once('=').filter(|(name, _)| prompt.arguments.iter().any(|a| a.name == *name));
        let (name, value_text) = match named {
            Some((name, _)) if bound.contains_key(name) => return Err(format!("{name} is given twice")),
            Some((name, after)) => (name.to_string(), after),
            None => match left.first() {
                Some(next) => (next.clone(), rest),
                None if prompt.arguments.is_empty() => return Err("it takes nothing after it".into()),
                None => return Err(format!("every argument is given; {rest:?} is left over")),
            },
        };
        let last = left.len() == 1 && left[0] == name;
        if last {
            bound.insert(name, whole(value_text));
            break;
        }
        let (value, after) = word(value_text)?;
        bound.insert(name, value);
        rest = after.trim_start();
    }
    let missing: Vec<&str> = prompt
        .arguments
        .iter()
        .filter(|a| a.required && bound.get(&a.name).is_none_or(|v| v.is_empty()))
        .map(|a| a.name.as_str())
        .collect();
    if !missing.is_empty() {
        return Err(format!("{} needed", missing.join(" and ")));
    }
    Ok(bound)
}

/// The rest of the text as the last argument: unquoted if it is one quoted string, as typed
/// otherwise.
fn whole(text: &str) -> String {
    let text = text.trim();
    match word(text) {
        Ok((value, after)) if text.starts_with('"') && after.trim().is_empty() => value,
        _ => text.to_string(),
    }
}

/// The first word of `text` (or its quoted string, unquoted), and what follows it.
fn word(text: &str) -> Result<(String, &str), String> {
    let Some(quoted) = text.strip_prefix('"') else {
        let end = text.find(char::is_whitespace).unwrap_or(text.len());
        return Ok((text[..end].to_string(), &text[end..]));
    };
    let mut value = String::new();
    let mut chars = quoted.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => return Ok((value, &quoted[i + 1..])),
            '\\' if matches!(chars.peek(), Some((_, '"' | '\\'))) => value.push(chars.next().map_or(c, |(_, e)| e)),
            c => value.push(c),
        }
    }
    Err("a quote is not closed".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::{McpPromptArgument, ModeInfo, ModelInfo};

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
        let all = offered(Some(&modes), &models(&["default", "second"]), &[]);
        assert_eq!(all.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(), ["compact", "fork", "mode", "model"]);
        assert_eq!(all[2].hint.as_deref(), Some("ask, code"));
        let bare = offered(None, &models(&["default"]), &[]);
        assert_eq!(bare.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(), ["compact", "fork"]);
        assert_eq!(parse("/compact", &bare, &[]), Some(Ok(Command::Compact)));

        assert_eq!(parse("/fork", &all, &[]), Some(Ok(Command::Fork)));
        assert_eq!(parse("  /mode  ask \n", &all, &[]), Some(Ok(Command::Mode("ask".into()))));
        assert_eq!(parse("/model second", &all, &[]), Some(Ok(Command::Model("second".into()))));
        assert_eq!(parse("/mode", &all, &[]), Some(Err("/mode needs one of: ask, code".into())));
        assert_eq!(parse("/fork now", &all, &[]), Some(Err("/fork takes nothing after it".into())));
        assert_eq!(parse("/model second", &bare, &[]), None, "not offered: for the model, as typed");
        assert_eq!(parse("/tool calculator {}", &all, &[]), None);
        assert_eq!(parse("fork", &all, &[]), None);
    }

    fn prompt(name: &str, arguments: &[(&str, bool)]) -> McpPrompt {
        McpPrompt {
            server: "everything".into(),
            name: name.into(),
            description: format!("{name}'s description"),
            arguments: arguments
                .iter()
                .map(|(name, required)| McpPromptArgument {
                    name: name.to_string(),
                    description: String::new(),
                    required: *required,
                })
                .collect(),
        }
    }

    fn called(name: &str, arguments: &[(&str, &str)]) -> Option<Result<Command, String>> {
        let arguments = arguments.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Some(Ok(Command::Prompt { server: "everything".into(), name: name.into(), arguments }))
    }

    #[test]
    fn an_mcp_servers_prompts_are_commands_whose_arguments_come_in_order_or_by_name() {
        let prompts = [
            prompt("simple-prompt", &[]),
            prompt("args-prompt", &[("city", true), ("state", false)]),
            prompt("ask", &[("question", true)]),
            prompt("two words", &[]),
        ];
        let all = offered(None, &models(&["default"]), &prompts);
        let names: Vec<&str> = all.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(
            names,
            ["compact", "fork", "mcp:everything:simple-prompt", "mcp:everything:args-prompt", "mcp:everything:ask"]
        );
        assert_eq!(all[3].hint.as_deref(), Some("<city> [state]"));
        assert_eq!(all[2].hint, None);
        assert_eq!(all[3].description, "args-prompt's description (MCP server everything)");

        assert_eq!(parse("/mcp:everything:simple-prompt", &all, &[]), called("simple-prompt", &[]));
        assert_eq!(
            parse("/mcp:everything:simple-prompt now", &all, &[]),
            Some(Err("/mcp:everything:simple-prompt: it takes nothing after it".into()))
        );
        // In order; quoted; by name, in any order.
        assert_eq!(parse("/mcp:everything:args-prompt Paris", &all, &[]), called("args-prompt", &[("city", "Paris")]));
        assert_eq!(
            parse(r#"/mcp:everything:args-prompt "New York" NY"#, &all, &[]),
            called("args-prompt", &[("city", "New York"), ("state", "NY")])
        );
        assert_eq!(
            parse(r#"/mcp:everything:args-prompt state=TX city="El \"Paso\"""#, &all, &[]),
            called("args-prompt", &[("city", "El \"Paso\""), ("state", "TX")])
        );
        assert_eq!(
            parse("/mcp:everything:args-prompt state=TX Austin", &all, &[]),
            called("args-prompt", &[("city", "Austin"), ("state", "TX")])
        );
        // The last argument left takes the rest as it is, apostrophes and all.
        assert_eq!(
            parse("/mcp:everything:ask what's  the #1 city=of Texas?", &all, &[]),
            called("ask", &[("question", "what's  the #1 city=of Texas?")])
        );
        assert_eq!(
            parse(r#"/mcp:everything:ask "quoted whole""#, &all, &[]),
            called("ask", &[("question", "quoted whole")])
        );
        // Used wrongly: said how to use it.
        assert_eq!(
            parse("/mcp:everything:args-prompt", &all, &[]),
            Some(Err("/mcp:everything:args-prompt <city> [state]: city needed".into()))
        );
        assert_eq!(
            parse("/mcp:everything:args-prompt state=TX", &all, &[]),
            Some(Err("/mcp:everything:args-prompt <city> [state]: city needed".into()))
        );
        assert_eq!(
            parse(r#"/mcp:everything:args-prompt "New York"#, &all, &[]),
            Some(Err("/mcp:everything:args-prompt <city> [state]: a quote is not closed".into()))
        );
        assert_eq!(
            parse("/mcp:everything:args-prompt city=A city=B", &all, &[]),
            Some(Err("/mcp:everything:args-prompt <city> [state]: city is given twice".into()))
        );
        // A prompt command is never for the model: one not offered says why.
        assert_eq!(
            parse("/mcp:everything:nothing", &all, &[]),
            Some(Err("/mcp:everything:nothing: no MCP server of this session offers a prompt \"nothing\" as \"everything\" (its prompts: everything:simple-prompt, everything:args-prompt, everything:ask)".into()))
        );
        let down = [Unavailable { server: "git".into(), error: "could not start `mcp-git`".into() }];
        assert_eq!(
            parse("/mcp:git:review 12", &all, &down),
            Some(Err(
                "/mcp:git:review: MCP server git cannot be reached now (could not start `mcp-git`); try again".into()
            ))
        );
        // The last argument left takes the rest, by name too; a backslash escapes only a
        // quote or a backslash; an empty value does not give a required argument.
        assert_eq!(
            parse("/mcp:everything:ask question=what is this?", &all, &[]),
            called("ask", &[("question", "what is this?")])
        );
        assert_eq!(
            parse(r#"/mcp:everything:args-prompt "C:\Users\me" \"x"#, &all, &[]),
            called("args-prompt", &[("city", r"C:\Users\me"), ("state", r#"\"x"#)])
        );
        assert_eq!(
            parse(r#"/mcp:everything:ask "unclosed as typed"#, &all, &[]),
            called("ask", &[("question", r#""unclosed as typed"#)])
        );
        assert_eq!(
            parse("/mcp:everything:args-prompt city= Paris", &all, &[]),
            Some(Err("/mcp:everything:args-prompt <city> [state]: city needed".into()))
        );
    }
}
