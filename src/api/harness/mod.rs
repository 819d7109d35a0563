//! The agent harness view (seed 004, TrueFoundry's Agent Harness turn API): sessions of a
//! saved agent, turns that chain one to the next, each turn's events as an SSE stream with
//! integer sequence numbers, resumable after any of them, and its lists, so that the
//! official `truefoundry-gateway-sdk` runs against turnlog unchanged. A view of the one
//! log: it parses the SDK's shapes, calls the session layer, and renders each turn through
//! one fold ([`fold::TurnFold`]).

mod event;
mod fold;
mod sessions;
mod turns;
mod wire;

use actix_web::http::StatusCode;
use actix_web::{web, HttpResponse};

use super::error::Render;
use crate::error::{ApiError, Code};

/// The harness's error shape, `{"error":{"message","type","code"}}`, with its statuses: 412
/// where the session's state does not allow the call yet (a turn runs, or the turn named as
/// the previous one is not the last), 422 where the input does not fit the state (a message
/// while calls wait, an answer to no waiting call). Never a 409 for those: the SDK retries
/// a 409 on its own.
pub struct Harness;

impl Render for Harness {
    type Body = wire::ErrorBody;

    fn status(code: Code) -> StatusCode {
        match code {
            Code::UnknownCursor => StatusCode::BAD_REQUEST,
            Code::Busy | Code::PreviousTurn => StatusCode::PRECONDITION_FAILED,
            Code::Conflict => StatusCode::UNPROCESSABLE_ENTITY,
            _ => super::error::status(code),
        }
    }

    fn body(error: &ApiError) -> wire::ErrorBody {
        wire::ErrorBody {
            error: wire::ErrorDetail {
                message: error.message.clone(),
                kind: error.code.kind(),
                code: error.code.code(),
            },
        }
    }
}

type Error = super::Error<Harness>;
use super::caller::{Auth, CallerSession};
type Json<T> = super::body::JsonBody<T, Harness>;
type Query<T> = super::body::Query<T, Harness>;

/// Under `/v1/agents/sessions`; registered before the managed-agents view's `/v1` scope,
/// whose `/v1/agents/{agent_id}` would take these paths otherwise.
pub fn routes(cfg: &mut utoipa_actix_web::service_config::ServiceConfig) {
    cfg.service(
        utoipa_actix_web::scope("/v1/agents/sessions")
            .service(sessions::list)
            .service(sessions::create)
            .service(sessions::get)
            .service(sessions::cancel)
            .service(sessions::events)
            .service(turns::list)
            .service(turns::create)
            .service(turns::get)
            .service(turns::subscribe)
            .service(turns::events)
            .default_service(web::to(super::no_route::<Harness>)),
    );
}

/// `limit` as asked (1 to `max`; more is refused, as the harness does), or `default`.
fn limit(asked: Option<usize>, default: usize, max: usize) -> Result<usize, ApiError> {
    match asked {
        None => Ok(default),
        Some(n) if (1..=max).contains(&n) => Ok(n),
        Some(n) => Err(ApiError::invalid(format!("invalid query `limit`: {n} is not between 1 and {max}"))),
    }
}

/// A page: `pagination.limit` always (the SDK needs it), `next_page_token` only when more
/// exists.
fn page<T: serde::Serialize + utoipa::ToSchema>(data: Vec<T>, limit: usize, next: Option<String>) -> HttpResponse {
    HttpResponse::Ok().json(wire::Page { data, pagination: wire::Pagination { limit, next_page_token: next } })
}

/// `{"data": ...}`.
fn data<T: serde::Serialize + utoipa::ToSchema>(data: T) -> HttpResponse {
    HttpResponse::Ok().json(wire::Data { data })
}

/// A page token that does not parse.
fn bad_token(token: &str) -> ApiError {
    ApiError::invalid(format!("invalid query `page_token`: {token:?} is not a token this listing gave"))
}
