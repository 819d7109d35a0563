//! The managed-agents view (seed 002 in its canonical form, Anthropic's Claude Managed
//! Agents events API): `/v1/sessions`, their events and streams, `/v1/agents` and
//! `/v1/environments`, so that the official `anthropic` SDK runs against turnlog
//! unchanged. A view of the one log: it parses the SDK's shapes, calls the session layer,
//! and renders events and errors as the SDK's strict models want them.

mod catalog;
pub mod event;
mod events;
mod outcomes;
mod request;
mod sessions;
pub mod wire;

use actix_web::http::StatusCode;
use actix_web::{web, HttpResponse};

use super::error::{ErrorTag, Render};
use crate::error::ApiError;

/// Anthropic's error shape: `{"type":"error","error":{"type","message"}}`. The SDK retries a
/// 409 and every 5xx unless told not to: a conflict here is an answer, not a hiccup, and a
/// 504 says a write may be stored. A 503 says it is not, and is retried.
pub struct Managed;

impl Render for Managed {
    type Body = wire::ErrorBody;

    fn body(error: &ApiError) -> wire::ErrorBody {
        wire::ErrorBody {
            kind: ErrorTag::Error,
            error: wire::ErrorDetail { kind: error.code.kind(), message: error.message.clone() },
        }
    }

    fn render(error: &ApiError) -> HttpResponse {
        let status = Self::status(error.code);
        let mut response = HttpResponse::build(status);
        // A write whose fate is unknown may be stored: sent again by the SDK on its own, it
        // could be stored twice (unless it carries an Idempotency-Key, which the caller
        // then sends again itself).
        if status == StatusCode::CONFLICT || error.code == crate::error::Code::FateUnknown {
            response.insert_header(("x-should-retry", "false"));
        }
        response.json(Self::body(error))
    }
}

type Error = super::Error<Managed>;
use super::caller::{Auth, CallerSession};
type Json<T> = super::body::JsonBody<T, Managed>;
type Query<T> = super::body::Query<T, Managed>;

pub fn routes(cfg: &mut utoipa_actix_web::service_config::ServiceConfig) {
    cfg.service(
        utoipa_actix_web::scope("/v1")
            .service(sessions::create)
            .service(sessions::list)
            .service(sessions::retrieve)
            .service(sessions::update)
            .service(sessions::delete)
            .service(sessions::archive)
            .service(events::send)
            .service(events::list)
            .service(events::stream)
            .configure(catalog::routes)
            .default_service(web::to(super::no_route::<Managed>)),
    );
}

/// A page as the SDK's cursor pages want it: `next_page` null at the end, or it loops.
fn page<T: serde::Serialize + utoipa::ToSchema>(data: Vec<T>, next: Option<String>) -> HttpResponse {
    HttpResponse::Ok().json(wire::Page { data, next_page: next, prev_page: None })
}

/// `limit` as asked, within the server's page size (larger asks are cut, not refused: the
/// SDK's tool runner lists with 1000).
fn limit(asked: Option<usize>, default: usize, max: usize) -> Result<usize, ApiError> {
    match asked {
        Some(0) => Err(ApiError::invalid("invalid query `limit`: must be at least 1")),
        Some(n) => Ok(n.min(max)),
        None => Ok(default.min(max)),
    }
}

fn time_bounds(field: &str, query: wire::TimeQuery) -> Result<crate::session::TimeBounds, ApiError> {
    let bound = |op: &str, value: Option<String>| {
        value.map(|t| super::body::utc_time(&format!("{field}[{op}]"), &t)).transpose()
    };
    Ok(crate::session::TimeBounds {
        gt: bound("gt", query.gt)?,
        gte: bound("gte", query.gte)?,
        lt: bound("lt", query.lt)?,
        lte: bound("lte", query.lte)?,
    })
}
