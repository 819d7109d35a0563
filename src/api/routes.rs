//! The route table: every route of every view, in the order actix tries them.

use utoipa_actix_web::service_config::ServiceConfig;

use super::error::Shape;
use super::{aap, audit, console, harness, managed, native, ops};

/// How the views with an error shape of their own answer errors, by the tag their
/// operations carry, for the OpenAPI document; the others answer in turnlog's own.
pub fn error_shapes() -> Vec<Shape> {
    vec![Shape::of::<managed::Managed>("managed"), Shape::of::<harness::Harness>("harness")]
}

/// Every route of every view, each documented in the OpenAPI document by being registered
/// here ([`super::openapi`]).
pub fn routes(cfg: &mut ServiceConfig) {
    // actix tries routes in the order they are registered, a regular expression each, so
    // the busiest come first: the native log's appends, pages and streams, and AAP turns
    // (no other route's path has their shapes).
    cfg.configure(native::session_routes).configure(aap::routes);
    ops::routes(cfg);
    console::routes(cfg);
    // The harness first: the managed view's `/v1` scope would take `/v1/agents/sessions`.
    cfg.configure(audit::routes)
        .configure(harness::routes)
        .configure(managed::routes)
        .configure(aap::session_routes)
        .service(
            utoipa_actix_web::scope("/api/v1/cloud").configure(aap::session_routes).configure(native::session_routes),
        );
}
