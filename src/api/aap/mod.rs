//! The Agent Application Protocol v3 view (seeds 000 and 003): sessions as resources.
//! Its errors use the service's one JSON error shape; the official client reads only
//! the status and the text.

mod history;
mod meta;
mod sessions;
mod turns;
pub mod wire;

use utoipa_actix_web::service_config::ServiceConfig;

pub fn routes(cfg: &mut ServiceConfig) {
    cfg.service(meta::meta).service(history::history).service(turns::post);
}

/// Routes that also answer under `/api/v1/cloud`.
pub fn session_routes(cfg: &mut ServiceConfig) {
    cfg.service(sessions::create).service(sessions::list).service(sessions::get).service(sessions::delete);
}
