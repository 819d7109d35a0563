//! The native session event log (the Qoder flavour of seed 002): list, send and stream a
//! session's events as they are stored (but for the stop reasons, which are the seed's: `wire.rs`).

mod events;
mod mode;
mod model;
mod prompts;
mod stream;
pub mod wire;

use utoipa_actix_web::service_config::ServiceConfig;

pub fn session_routes(cfg: &mut ServiceConfig) {
    cfg.service(events::list).service(events::post).service(stream::stream).service(mode::get).service(mode::set);
    cfg.service(model::get).service(model::set).service(prompts::list).service(prompts::write);
}
