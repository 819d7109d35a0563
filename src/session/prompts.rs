//! The prompts of a session's MCP servers (its agent's, and those its client declared for
//! it): listed for a client's command menu (`/mcp:<server>:<prompt>`, `session::commands`),
//! and written out from the user's arguments into the message that starts a turn. Nothing
//! is stored here: the message, once sent, is the log's `user.message`.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Serialize;

use super::{SessionError, Sessions};
use crate::agent::mcp::{McpPrompt, McpServers, PromptError, PromptPart};
use crate::domain::Block;
use crate::projection::SessionSummary;

/// A session's prompts, and the servers whose prompts could not be listed now.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SessionPrompts {
    /// Every server's prompts, the agent's servers first.
    pub prompts: Vec<McpPrompt>,
    pub unavailable: Vec<Unavailable>,
}

/// A server whose prompts are not offered now, and why.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Unavailable {
    pub server: String,
    pub error: String,
}

impl Sessions {
    /// The prompts of the session's MCP servers, listed afresh (a server not started yet is
    /// started; all are asked at once, none waited for past
    /// [`PROMPTS_WAIT`](crate::agent::mcp::PROMPTS_WAIT)). A server that
    /// cannot be reached is named in `unavailable`; so is one the client declared under the
    /// name of one of the agent's (the agent's is the one offered).
    pub async fn prompts(&self, session: &SessionSummary) -> Result<SessionPrompts, SessionError> {
        let sets = self.mcp_servers(session)?;
        let listed = futures_util::future::join_all(sets.iter().map(|servers| servers.prompts())).await;
        let mut all = SessionPrompts::default();
        let mut seen = std::collections::HashSet::new();
        for (servers, (prompts, failed)) in sets.iter().zip(listed) {
            let shadowed: Vec<String> =
                servers.names().filter(|name| seen.contains(*name)).map(str::to_string).collect();
            all.prompts.extend(prompts.into_iter().filter(|p| !shadowed.contains(&p.server)));
            let failed = failed.into_iter().filter(|e| !shadowed.contains(&e.server));
            all.unavailable.extend(failed.map(|e| Unavailable { server: e.server, error: e.message }));
            all.unavailable.extend(shadowed.iter().map(|server| {
                Unavailable {
                    server: server.clone(),
                    error:
                        "the client declared a server of the same name as one of the agent's, whose prompts are offered"
                            .into(),
                }
            }));
            seen.extend(servers.names().map(str::to_string));
        }
        Ok(all)
    }

    /// `server`'s prompt `name` written out from `arguments`: the content of the user
    /// message it makes (see [`message_of`]).
    pub async fn write_prompt(
        &self,
        session: &SessionSummary,
        server: &str,
        name: &str,
        arguments: &BTreeMap<String, String>,
    ) -> Result<Vec<Block>, SessionError> {
        let servers = self.mcp_servers(session)?.into_iter().find(|s| s.has(server));
        let servers = servers
            .ok_or_else(|| SessionError::CatalogNotFound(format!("MCP server {server:?} of session {}", session.id)))?;
        let parts = servers.prompt(server, name, arguments).await.map_err(|error| match error {
            PromptError::NoServer(_) => SessionError::CatalogNotFound(format!("MCP server {server:?}")),
            PromptError::Refused(error) => SessionError::Invalid(error.to_string()),
            PromptError::Unreachable(error) => SessionError::Unavailable(error.to_string()),
        })?;
        if parts.is_empty() {
            return Err(SessionError::Invalid(format!("MCP server {server}: prompt {name} wrote no message")));
        }
        Ok(message_of(parts))
    }

    /// The session's MCP servers: its agent's, then those its client declared for it.
    fn mcp_servers(&self, session: &SessionSummary) -> Result<Vec<Arc<McpServers>>, SessionError> {
        let spec = &session.spec;
        let agent = self.agents().get_version(&spec.agent.name, spec.agent.version).ok_or_else(|| {
            SessionError::Unavailable(format!("session {}'s agent {:?} is not configured", session.id, spec.agent.name))
        })?;
        Ok(self.agents().servers_of(&agent, session.id).into_iter().filter(|s| !s.is_empty()).collect())
    }
}

/// A prompt's messages as one user message: their content in order. A prompt that has the
/// assistant speak too (a worked example, say) is kept whole, each speaker's run of
/// messages introduced by a line that names it: the log's user message is the user's alone.
pub fn message_of(parts: Vec<PromptPart>) -> Vec<Block> {
    let mixed = parts.iter().any(|p| p.assistant);
    let mut out = Vec::new();
    let mut last = None;
    for part in parts {
        if mixed && last != Some(part.assistant) {
            out.push(Block::text(if part.assistant { "Assistant:\n" } else { "User:\n" }));
        }
        last = Some(part.assistant);
        out.push(part.content);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(assistant: bool, text: &str) -> PromptPart {
        PromptPart { assistant, content: Block::text(text) }
    }

    #[test]
    fn a_prompts_messages_make_one_user_message_that_names_the_speakers_only_when_both_speak() {
        let user = message_of(vec![part(false, "Analyse this:"), part(false, "the resource")]);
        assert_eq!(user, [Block::text("Analyse this:"), Block::text("the resource")]);
        let both = message_of(vec![part(false, "a"), part(false, "b"), part(true, "c"), part(false, "d")]);
        let texts: Vec<&str> = both.iter().map(|b| b.text.as_deref().unwrap()).collect();
        assert_eq!(texts, ["User:\n", "a", "b", "Assistant:\n", "c", "User:\n", "d"]);
    }
}
