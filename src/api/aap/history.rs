//! `GET /sessions/{id}/history?type=compacted|full`: `full` is every message, exactly;
//! `compacted` is what the agent's model reads, where a compaction's summary stands for the
//! messages it replaced (docs/compaction.md). Tool permissions never appear, and either may
//! end with tool calls that still wait for the client.

use actix_web::{get, HttpResponse};
use serde_json::json;

use super::wire::{HistoryQuery, MessageOut};
use crate::api::body::Query;
use crate::api::caller::CallerSession;
use crate::api::{Error, State};
use crate::error::{ApiError, Code};

/// The session's history as AAP messages: compacted (the default) or full.
#[utoipa::path(
    tag = "aap",
    operation_id = "sessions_history",
    params(("session_id" = String, Path, description = "The session's id"), HistoryQuery),
    responses((status = 200, description = "`{\"messages\": [...]}`", body = Object)),
)]
#[get("/sessions/{session_id}/history")]
pub async fn history(
    state: State,
    CallerSession { summary, .. }: CallerSession,
    query: Query<HistoryQuery>,
) -> Result<HttpResponse, Error> {
    let kind = match query.0.kind.as_deref() {
        None | Some("compacted") => "compacted",
        Some("full") => "full",
        Some(other) => {
            let message = format!("history type {other:?} is not offered; use compacted or full");
            return Err(ApiError::new(Code::NotFound, message).into());
        }
    };
    let messages = state.sessions.history(&summary, kind == "full").await?;
    let out: Vec<MessageOut> = messages.iter().map(MessageOut::from).collect();
    Ok(HttpResponse::Ok().json(json!({"history": {kind: out}})))
}
