//! The native session event log (the Qoder flavour of seed 002): list, send and stream a
//! session's events, exactly as they are stored.

mod events;
mod stream;
pub mod wire;

pub use stream::sse_response;

use actix_web::web;

pub fn session_routes(cfg: &mut web::ServiceConfig) {
    cfg.service(
        web::resource("/sessions/{session_id}/events")
            .route(web::get().to(events::list))
            .route(web::post().to(events::post)),
    )
    .service(web::resource("/sessions/{session_id}/events/stream").route(web::get().to(stream::stream)));
}
