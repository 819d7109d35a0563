//! `GET /sessions/{id}/mode` and `POST /sessions/{id}/mode`: the session's mode (one of its
//! agent's `modes`) and the modes it may change to. A change is recorded in the log
//! (`session.updated` with `mode`) and holds from the session's next turn on.

use actix_web::{get, post, HttpResponse};
use serde::Deserialize;
use serde_json::json;
use utoipa::ToSchema;

use crate::api::body::JsonBody;
use crate::api::caller::CallerSession;
use crate::api::{Error, State};
use crate::session::Modes;

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SetMode {
    /// The id of one of the agent's modes.
    #[schema(min_length = 1)]
    mode: String,
}

/// The session's mode and its agent's modes (`null` and `[]` for an agent without modes).
#[utoipa::path(
    tag = "native",
    operation_id = "mode_get",
    params(("session_id" = String, Path, description = "The session's id")),
    responses((status = 200, description = "`{\"mode\", \"modes\": [{\"id\", \"name\", \"description\"}]}`", body = Object)),
)]
#[get("/sessions/{session_id}/mode")]
pub async fn get(state: State, CallerSession { summary, .. }: CallerSession) -> Result<HttpResponse, Error> {
    Ok(answer(state.sessions.modes(&summary)?))
}

/// Changes the session's mode, from its next turn on; answered with its modes as they are then.
#[utoipa::path(
    tag = "native",
    operation_id = "mode_set",
    params(("Idempotency-Key" = Option<String>, Header, description = "Names this write: sent again with the same key and body, it is answered as the first time and stored once (docs/idempotency.md)", min_length = 1, max_length = 255, pattern = "^[ -~]+$"), ("session_id" = String, Path, description = "The session's id")),
    request_body(content = SetMode, example = json!({"mode": "plan"})),
    responses((status = 200, description = "`{\"mode\", \"modes\": [...]}`", body = Object)),
)]
#[post("/sessions/{session_id}/mode")]
pub async fn set(
    state: State,
    CallerSession { summary, .. }: CallerSession,
    body: JsonBody<SetMode>,
) -> Result<HttpResponse, Error> {
    let request = body.request_key();
    let modes = state.sessions.set_mode(&summary, &body.0.mode, request).await?;
    Ok(answer(Some(modes)))
}

fn answer(modes: Option<Modes>) -> HttpResponse {
    HttpResponse::Ok().json(match modes {
        Some(modes) => json!({"mode": modes.current, "modes": modes.available}),
        None => json!({"mode": null, "modes": []}),
    })
}
