//! Operator routes: `/healthz` and `/metrics`.

use actix_web::{web, HttpResponse};

pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/healthz", web::get().to(healthz)).route("/metrics", web::get().to(metrics));
}

/// `{"status": "ok"}`; with the log on an engine (JetStream), also the engine and whether
/// this node is connected to it, and 503 while it is not.
async fn healthz(state: web::Data<super::AppState>) -> HttpResponse {
    match state.sessions.health() {
        None => HttpResponse::Ok().json(serde_json::json!({"status": "ok", "store": "sled"})),
        Some(health) => {
            let status = if health.connected { "ok" } else { "unavailable" };
            let body = serde_json::json!({"status": status, "store": health.engine, "connected": health.connected});
            match health.connected {
                true => HttpResponse::Ok().json(body),
                false => HttpResponse::ServiceUnavailable().json(body),
            }
        }
    }
}

async fn metrics() -> HttpResponse {
    HttpResponse::Ok().content_type("text/plain; version=0.0.4").body(crate::metrics::render())
}
