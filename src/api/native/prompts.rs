//! `GET /sessions/{id}/prompts` and `POST /sessions/{id}/prompts/{server}/{prompt}`: the
//! prompts of the session's MCP servers (its agent's, and those its client declared), and
//! one of them written out from the user's arguments into the content of a user message.
//! Nothing is stored: the client sends the content as the message of its next turn
//! (`POST /sessions/{id}/events`), as `turnlog acp` does for `/mcp:<server>:<prompt>`.

use std::collections::BTreeMap;

use actix_web::{get, post, web, HttpResponse};
use serde::Deserialize;
use serde_json::json;
use utoipa::ToSchema;

use crate::api::body::JsonBody;
use crate::api::caller::CallerSession;
use crate::api::{Error, State};

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct WritePrompt {
    /// The prompt's arguments by name, each a string (as MCP's `prompts/get` takes them).
    #[serde(default)]
    arguments: BTreeMap<String, String>,
}

/// The path's server and prompt names (the session's is read by `CallerSession`).
#[derive(Deserialize)]
struct PromptPath {
    server: String,
    prompt: String,
}

/// The prompts of the session's MCP servers, listed afresh; a server that cannot be
/// reached now is named in `unavailable`, with why.
#[utoipa::path(
    tag = "native",
    operation_id = "prompts_list",
    params(("session_id" = String, Path, description = "The session's id")),
    responses((status = 200, description = "`{\"prompts\": [{\"server\", \"name\", \"description\", \"arguments\": [{\"name\", \"description\", \"required\"}]}], \"unavailable\": [{\"server\", \"error\"}]}`", body = Object)),
)]
#[get("/sessions/{session_id}/prompts")]
pub async fn list(state: State, CallerSession { summary, .. }: CallerSession) -> Result<HttpResponse, Error> {
    let listed = state.sessions.prompts(&summary).await?;
    Ok(HttpResponse::Ok().json(json!({"prompts": listed.prompts, "unavailable": listed.unavailable})))
}

/// One prompt written out from `arguments` by its server (`prompts/get`): the content of
/// the user message it makes, in order (a prompt that has the assistant speak too names
/// each speaker in a text block). 404: no such server; 400: the server refused (no such
/// prompt, an argument missing); 503: the server cannot be reached now.
#[utoipa::path(
    tag = "native",
    operation_id = "prompt_write",
    params(
        ("session_id" = String, Path, description = "The session's id"),
        ("server" = String, Path, description = "The MCP server's name"),
        ("prompt" = String, Path, description = "The prompt's name"),
    ),
    request_body(content = WritePrompt, example = json!({"arguments": {"city": "Paris"}})),
    responses((status = 200, description = "`{\"content\": [content blocks]}`", body = Object)),
)]
#[post("/sessions/{session_id}/prompts/{server}/{prompt}")]
pub async fn write(
    state: State,
    CallerSession { summary, .. }: CallerSession,
    path: web::Path<PromptPath>,
    body: JsonBody<WritePrompt>,
) -> Result<HttpResponse, Error> {
    let content = state.sessions.write_prompt(&summary, &path.server, &path.prompt, &body.0.arguments).await?;
    Ok(HttpResponse::Ok().json(json!({ "content": content })))
}
