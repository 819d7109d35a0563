//! Operator routes: `/healthz`, `/metrics`, and the OpenAPI document at `/openapi.json`.

use actix_web::{get, web, HttpResponse};

use super::allowed::Routes;

pub fn routes(cfg: &mut utoipa_actix_web::service_config::ServiceConfig) {
    cfg.service(healthz).service(metrics).service(openapi);
}

/// `{"status": "ok"}` and when an acknowledged append is on disk (`durability`); with the
/// log on an engine (JetStream), also the engine, its version and whether this node is
/// connected to it, and 503 while it is not.
#[utoipa::path(
    tag = "ops",
    operation_id = "healthz",
    security(()),
    responses(
        (status = 200, description = "Serving", body = Object),
        (status = 503, description = "The log's engine is out of reach", body = Object),
    ),
)]
#[get("/healthz")]
async fn healthz(state: web::Data<super::state::AppState>) -> HttpResponse {
    match state.sessions.health() {
        None => HttpResponse::Ok().json(
            serde_json::json!({"status": "ok", "store": "sled", "durability": crate::session::Durability::SyncedOnAck}),
        ),
        Some(health) => {
            let status = if health.connected { "ok" } else { "unavailable" };
            let body = serde_json::json!({
                "status": status,
                "store": health.engine,
                "connected": health.connected,
                "version": health.version,
                "durability": health.durability,
            });
            match health.connected {
                true => HttpResponse::Ok().json(body),
                false => HttpResponse::ServiceUnavailable().json(body),
            }
        }
    }
}

/// Prometheus metrics, in the text format.
#[utoipa::path(
    tag = "ops",
    operation_id = "metrics",
    security(()),
    responses((status = 200, description = "Metrics", body = String, content_type = "text/plain")),
)]
#[get("/metrics")]
async fn metrics() -> HttpResponse {
    HttpResponse::Ok().content_type("text/plain; version=0.0.4").body(crate::metrics::render())
}

/// The OpenAPI document of every route, as JSON.
#[utoipa::path(
    tag = "ops",
    operation_id = "openapi",
    security(()),
    responses((status = 200, description = "This document", body = Object, content_type = "application/json")),
)]
#[get("/openapi.json")]
async fn openapi(routes: web::Data<Routes>) -> HttpResponse {
    HttpResponse::Ok().content_type("application/json").body(routes.json())
}
