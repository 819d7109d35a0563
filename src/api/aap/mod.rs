//! The Agent Application Protocol v3 view (seeds 000 and 003): sessions as resources.
//! Its errors use the service's one JSON error shape; the official client reads only
//! the status and the text.

mod history;
mod meta;
mod sessions;
mod turns;
pub mod wire;

use actix_web::web;

pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/meta", web::get().to(meta::meta))
        .route("/sessions/{session_id}/history", web::get().to(history::history))
        .route("/sessions/{session_id}/turns", web::post().to(turns::post));
}

/// Routes that also answer under `/api/v1/cloud`.
pub fn session_routes(cfg: &mut web::ServiceConfig) {
    cfg.service(
        web::resource("/sessions")
            .name("sessions")
            .route(web::post().to(sessions::create))
            .route(web::get().to(sessions::list)),
    )
    .service(
        web::resource("/sessions/{session_id}")
            .route(web::get().to(sessions::get))
            .route(web::delete().to(sessions::delete)),
    );
}
