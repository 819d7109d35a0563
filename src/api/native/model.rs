//! `GET /sessions/{id}/model` and `POST /sessions/{id}/model`: the session's model (its
//! agent's own, `default`, or one of the agent's `models`) and those it may change to. A
//! change is recorded in the log (`session.updated` with `model`) and holds from the
//! session's next turn on.

use actix_web::{get, post, HttpResponse};
use serde::Deserialize;
use serde_json::json;
use utoipa::ToSchema;

use crate::api::body::JsonBody;
use crate::api::caller::CallerSession;
use crate::api::{Error, State};
use crate::session::Models;

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SetModel {
    /// `default` (the agent's own model) or the id of one of the agent's `models`.
    #[schema(min_length = 1)]
    model: String,
}

/// The session's model and the models its agent offers (its own, `default`, first).
#[utoipa::path(
    tag = "native",
    operation_id = "model_get",
    params(("session_id" = String, Path, description = "The session's id")),
    responses((status = 200, description = "`{\"model\", \"models\": [{\"id\", \"name\"}]}`", body = Object)),
)]
#[get("/sessions/{session_id}/model")]
pub async fn get(state: State, CallerSession { summary, .. }: CallerSession) -> Result<HttpResponse, Error> {
    Ok(answer(state.sessions.models(&summary)?))
}

/// Changes the session's model, from its next turn on; answered with its models as they are then.
#[utoipa::path(
    tag = "native",
    operation_id = "model_set",
    params(("Idempotency-Key" = Option<String>, Header, description = "Names this write: sent again with the same key and body, it is answered as the first time and stored once (docs/idempotency.md)", min_length = 1, max_length = 255, pattern = "^[ -~]+$"), ("session_id" = String, Path, description = "The session's id")),
    request_body(content = SetModel, example = json!({"model": "default"})),
    responses((status = 200, description = "`{\"model\", \"models\": [...]}`", body = Object)),
)]
#[post("/sessions/{session_id}/model")]
pub async fn set(
    state: State,
    CallerSession { summary, .. }: CallerSession,
    body: JsonBody<SetModel>,
) -> Result<HttpResponse, Error> {
    let request = body.request_key();
    let models = state.sessions.set_model(&summary, &body.0.model, request).await?;
    Ok(answer(models))
}

fn answer(models: Models) -> HttpResponse {
    HttpResponse::Ok().json(json!({"model": models.current, "models": models.available}))
}
