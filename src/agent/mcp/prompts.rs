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

/// One of a server's prompts, as it lists it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct McpPrompt {
    pub server: String,
    pub name: String,
    /// Its description, or else its title.
    pub description: String,
    pub arguments: Vec<McpPromptArgument>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct McpPromptArgument {
    pub name: String,
    pub description: String,
    pub required: bool,
}

/// One message of a prompt: who says it, and what.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptPart {
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

impl McpServers {
    /// Every prompt of every server that has prompts, listed afresh; beside them, the
    /// servers that could not be reached (their prompts are left out, not the others').
    pub async fn prompts(&self) -> (Vec<McpPrompt>, Vec<McpError>) {
        let (mut prompts, mut failed) = (Vec::new(), Vec::new());
        for server in &self.servers {
            match server.prompts().await {
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
                return Err(self.error(format!("prompts/list got no answer within {} s", CONNECT_TIMEOUT.as_secs())))
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
            Ok(Err(ServiceError::McpError(error))) => Err(PromptError::Refused(failed(error.message.to_string()))),
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
