//! How each tool is handled in a session: which tools the model is offered, and whether a
//! call of each runs inline, waits for a permission, waits for the client's result, or is
//! denied at once. Built from the agent's config, the session's mode and choices, and the
//! decisions the client chose to remember.

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::agent::mcp::McpTool;
use crate::agent::{Agent, ModeConfig, ToolDef, Tools};
use crate::domain::event::{Confirmation, McpRef, Permission, SessionSpec};

/// How a call of each tool is handled in this session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Inline,
    Ask,
    Client,
    /// Run by the client, which asks the user first (the session's mode asks for it).
    ClientAsks,
    /// The client chose to always reject it in this session: each call is denied at once.
    Rejected,
    /// The session's mode does not allow it: each call is denied at once, saying so.
    OutOfMode,
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
    /// The session's mode (its id and config), if the agent has modes.
    pub mode: Option<(String, ModeConfig)>,
    /// The session's client tools that are the editor's (see [`ClientTool::editor`]).
    pub editor: HashSet<String>,
}

impl ToolPlan {
    /// Server tools the agent has (minus `deny`), enabled as the session says: exposed
    /// tools only when the client listed them (trusted or not), unexposed ones always.
    /// A tool runs inline only if the config allows it and the client trusts it, or if the
    /// client chose to always allow it (`remembered`); one it chose to always reject stays
    /// offered (the history may hold its calls) and each call of it is denied. Then the
    /// client tools: the agent's own, and the session's. The session's mode has the last
    /// word (see [`ToolPlan::in_mode`]).
    pub fn new(
        agent: &Agent,
        tools: &Tools,
        spec: &SessionSpec,
        remembered: &BTreeMap<String, Confirmation>,
    ) -> ToolPlan {
        let mode = agent.mode(spec.mode.as_deref()).map(|(id, mode)| (id.to_string(), mode.clone()));
        let mut plan = ToolPlan { remembered: remembered.clone(), mode, ..ToolPlan::default() };
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
                let mode = plan.in_mode(name, mode);
                plan.modes.insert(name.clone(), mode);
            }
        }
        for tool in agent.config.client_tools.iter().chain(&spec.tools) {
            plan.defs.push(ToolDef {
                name: tool.name.clone(),
                description: tool.description.clone(),
                parameters: tool.input_schema.clone(),
            });
            let mode = plan.in_mode(&tool.name, Mode::Client);
            plan.modes.insert(tool.name.clone(), mode);
            if tool.editor {
                plan.editor.insert(tool.name.clone());
            }
        }
        plan
    }

    /// How the session's mode handles a tool the rest of the plan handles as `otherwise`:
    /// a tool it denies is refused; one it asks for asks (on the client, for a tool the
    /// client runs), unless the user chose to always allow or reject it; one it allows runs
    /// inline, unless the user chose to always reject it or it runs on the client. A tool
    /// the mode does not name is as `otherwise`.
    fn in_mode(&self, name: &str, otherwise: Mode) -> Mode {
        let Some((_, mode)) = &self.mode else { return otherwise };
        match (mode.permission(name), otherwise) {
            (Some(Permission::Deny), _) => Mode::OutOfMode,
            (Some(Permission::Ask), Mode::Client) => Mode::ClientAsks,
            (_, Mode::Client | Mode::ClientAsks | Mode::Rejected) | (None, _) => otherwise,
            (Some(Permission::Ask), _) if self.remembered.get(name) == Some(&Confirmation::Allow) => otherwise,
            (Some(Permission::Ask), _) => Mode::Ask,
            (Some(Permission::Allow), _) => Mode::Inline,
        }
    }

    /// Why a call of a tool the session's mode does not allow is refused.
    pub fn out_of_mode(&self, name: &str) -> String {
        let mode = self.mode.as_ref().map_or("", |(id, _)| id.as_str());
        format!("the session's mode ({mode}) does not allow {name:?}: the user may change the mode")
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
            let mode = self.in_mode(&name, mode);
            self.modes.insert(name.clone(), mode);
            self.defs.push(tool.def.clone());
            self.mcp.insert(name, tool);
        }
    }

    /// Whether a call of `name` may run twice: the built-in tools only read (`fetch_url`
    /// is a GET), and an MCP tool may if its server or the operator says so.
    pub fn idempotent(&self, name: &str) -> bool {
        match self.mcp.get(name) {
            Some(tool) => tool.idempotent,
            None => crate::agent::tools::NAMES.contains(&name),
        }
    }

    /// The MCP server and tool behind `name`, as the log records them.
    pub fn mcp_ref(&self, name: &str) -> Option<McpRef> {
        self.mcp.get(name).map(|t| McpRef { server: t.server.clone(), tool: t.tool.clone() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::event::Permission::{Allow, Ask, Deny};

    /// A plan in a mode saying `tools`, with the user's remembered decisions.
    fn in_mode(tools: &[(&str, Permission)], remembered: &[(&str, Confirmation)]) -> ToolPlan {
        let tools = tools.iter().map(|(name, permission)| (name.to_string(), *permission)).collect();
        let mode = ModeConfig { name: None, description: String::new(), tools };
        ToolPlan {
            mode: Some(("m".into(), mode)),
            remembered: remembered.iter().map(|(name, c)| (name.to_string(), *c)).collect(),
            ..ToolPlan::default()
        }
    }

    #[test]
    fn a_mode_has_the_last_word_but_for_what_the_user_chose_and_the_clients_own_tools() {
        let plan = in_mode(
            &[("*", Ask), ("calc", Allow), ("rm", Deny), ("weather", Deny)],
            &[("fetch", Confirmation::Allow), ("calc", Confirmation::Deny)],
        );
        let cases = [
            // `*` asks, even for a tool the config runs at once.
            ("time", Mode::Inline, Mode::Ask),
            // ... but not for one the user chose to always allow.
            ("fetch", Mode::Inline, Mode::Inline),
            // `allow` runs even one the config asks about, not one the user always rejects.
            ("calc", Mode::Rejected, Mode::Rejected),
            // `deny` refuses, whatever else says.
            ("rm", Mode::Inline, Mode::OutOfMode),
            ("weather", Mode::Client, Mode::OutOfMode),
            // A client tool the mode asks for: the client asks before it runs it.
            ("lookup", Mode::Client, Mode::ClientAsks),
        ];
        for (tool, otherwise, expected) in cases {
            assert_eq!(plan.in_mode(tool, otherwise), expected, "{tool}");
        }
        assert_eq!(
            in_mode(&[("calc", Allow)], &[]).in_mode("fetch", Mode::Ask),
            Mode::Ask,
            "unnamed, no `*`: as configured"
        );
        assert_eq!(in_mode(&[("calc", Allow)], &[]).in_mode("calc", Mode::Ask), Mode::Inline);
        assert_eq!(in_mode(&[("calc", Allow)], &[]).in_mode("calc", Mode::Client), Mode::Client, "the client runs it");
        let none = ToolPlan::default();
        assert_eq!(none.in_mode("calc", Mode::Ask), Mode::Ask, "no mode: as configured");
        assert_eq!(
            plan.out_of_mode("rm"),
            "the session's mode (m) does not allow \"rm\": the user may change the mode"
        );
    }
}
