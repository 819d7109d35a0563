//! MCP servers' prompts (`prompts/list`, `prompts/get`): messages a server writes for the
//! user to start a turn with, from arguments the user gives. A session offers them as
//! commands (`session::prompts`).

use std::collections::BTreeMap;
use std::time::Duration;

use rmcp::model::{GetPromptRequestParams, Role};
use rmcp::service::ServiceError;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{McpError, McpServers, Server, CONNECT_TIMEOUT};
use crate::domain::Block;

/// How long listing the prompts of a set of servers may take, all together (each server is
/// asked at once): below the 30 s a bridge's HTTP client waits for an answer.
pub const PROMPTS_WAIT: Duration = Duration::from_secs(20);

/// One of a server's prompts, as it lists it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct McpPrompt {
    /// The server's name, as the agent's config (or the client) declared it.
    pub server: String,
    /// The prompt's name, as the server lists it.
    pub name: String,
    /// Its description, or else its title.
    pub description: String,
    /// What the user gives it, in the order the server lists them.
    pub arguments: Vec<McpPromptArgument>,
}

/// One argument of a prompt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct McpPromptArgument {
    pub name: String,
    /// Its description, or else its title.
    pub description: String,
    /// Whether the prompt cannot be written without it.
    pub required: bool,
}

/// One message of a prompt: who says it, and what.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptPart {
    /// The assistant says it (a worked example); otherwise the user does.
    pub assistant: bool,
    pub content: Block,
}

/// Why a prompt was not had.
#[derive(Debug, thiserror::Error)]
pub enum PromptError {
    /// No such server in the set.
    #[error("no MCP server named {0:?}")]
    NoServer(String),
    /// The server refused the request (no such prompt, arguments it does not take, ...).
    #[error("{0}")]
    Refused(McpError),
    /// The server could not be reached, or did not answer in time.
    #[error("{0}")]
    Unreachable(McpError),
}

/// The JSON-RPC errors that say the request was wrong: invalid request, no such method,
/// invalid params (MCP's answer for no such prompt, or arguments it does not take).
const REFUSALS: [rmcp::model::ErrorCode; 3] = [
    rmcp::model::ErrorCode::INVALID_REQUEST,
    rmcp::model::ErrorCode::METHOD_NOT_FOUND,
    rmcp::model::ErrorCode::INVALID_PARAMS,
];

impl McpServers {
    /// Every prompt of every server that has prompts, listed afresh, every server asked at
    /// once and none waited for past [`PROMPTS_WAIT`]; beside them, the servers that could
    /// not be reached (their prompts are left out, not the others').
    pub async fn prompts(&self) -> (Vec<McpPrompt>, Vec<McpError>) {
        let each = self.servers.iter().map(|server| async move {
            match tokio::time::timeout(PROMPTS_WAIT, server.prompts()).await {
                Ok(listed) => listed,
                Err(_) => Err(server.error(format!("no prompts within {} s", PROMPTS_WAIT.as_secs()))),
            }
        });
        let (mut prompts, mut failed) = (Vec::new(), Vec::new());
        for listed in futures_util::future::join_all(each).await {
            match listed {
                Ok(listed) => prompts.extend(listed),
                Err(error) => failed.push(error),
            }
        }
        (prompts, failed)
    }

    /// `server`'s prompt `name`, written from `arguments`: its messages, in order.
    pub async fn prompt(
        &self,
        server: &str,
        name: &str,
        arguments: &BTreeMap<String, String>,
    ) -> Result<Vec<PromptPart>, PromptError> {
        let found = self.servers.iter().find(|s| s.name == server);
        found.ok_or_else(|| PromptError::NoServer(server.to_string()))?.prompt(name, arguments).await
    }
}

impl Server {
    /// The server's prompts; none for a server without the capability.
    async fn prompts(&self) -> Result<Vec<McpPrompt>, McpError> {
        let connection = self.connection().await?;
        let offers = connection.client.peer_info().is_some_and(|info| info.capabilities.prompts.is_some());
        if !offers {
            return Ok(Vec::new());
        }
        let listed = tokio::time::timeout(CONNECT_TIMEOUT, connection.client.peer().list_all_prompts()).await;
        let listed = match listed {
            Ok(Ok(listed)) => listed,
            Ok(Err(error)) => {
                if connection.client.is_closed() {
                    self.forget(&connection).await;
                }
                return Err(self.error(format!("prompts/list failed: {}", self.scrub(error.to_string()))));
            }
            Err(_) => {
                self.forget(&connection).await;
                return Err(self.error(format!("prompts/list got no answer within {} s", CONNECT_TIMEOUT.as_secs())));
            }
        };
        let prompts = listed.into_iter().map(|prompt| McpPrompt {
            server: self.name.clone(),
            description: prompt.description.or(prompt.title).unwrap_or_default(),
            arguments: (prompt.arguments.unwrap_or_default().into_iter())
                .map(|a| McpPromptArgument {
                    description: a.description.or(a.title).unwrap_or_default(),
                    required: a.required.unwrap_or(false),
                    name: a.name,
                })
                .collect(),
            name: prompt.name,
        });
        Ok(prompts.collect())
    }

    async fn prompt(&self, name: &str, arguments: &BTreeMap<String, String>) -> Result<Vec<PromptPart>, PromptError> {
        let connection = self.connection().await.map_err(PromptError::Unreachable)?;
        let arguments = arguments.iter().map(|(k, v)| (k.clone(), Value::String(v.clone()))).collect();
        let request = GetPromptRequestParams::new(name).with_arguments(arguments);
        let limit = Duration::from_secs(self.config.timeout_secs);
        let answer = tokio::time::timeout(limit, connection.client.peer().get_prompt(request)).await;
        let failed = |message: String| self.error(format!("prompts/get of {name}: {message}"));
        match answer {
            Ok(Ok(result)) => Ok(result
                .messages
                .into_iter()
                .map(|message| PromptPart {
                    assistant: message.role == Role::Assistant,
                    content: super::block_of(&message.content),
                })
                .collect()),
            // The request itself refused (no such prompt, arguments it does not take) ...
            Ok(Err(ServiceError::McpError(error))) if REFUSALS.contains(&error.code) => {
                Err(PromptError::Refused(failed(self.scrub(error.message.to_string()))))
            }
            // ... or the server failing it (its own error): not the request's fault.
            Ok(Err(ServiceError::McpError(error))) => {
                Err(PromptError::Unreachable(failed(self.scrub(error.message.to_string()))))
            }
            Ok(Err(error)) => {
                if connection.client.is_closed() {
                    self.forget(&connection).await;
                }
                Err(PromptError::Unreachable(failed(self.scrub(error.to_string()))))
            }
            Err(_) => Err(PromptError::Unreachable(failed(format!("no answer within {} s", limit.as_secs())))),
        }
    }
}
