//! The HTTP views. Each view parses its wire shapes, calls the session layer
//! ([`Sessions`]), and renders log events and errors in its own shapes; none of them owns
//! state or rules, and none reaches past the session layer.

pub mod aap;
pub mod audit;
pub mod auth;
pub mod body;
pub mod conn;
pub mod console;
pub mod error;
pub mod harness;
pub mod managed;
pub mod native;
pub mod openapi;
pub mod ops;
pub mod sse;

use std::sync::Arc;

use actix_web::web;
use dashmap::DashMap;
use tokio_util::sync::CancellationToken;

use crate::audit::Audit;
use crate::catalog::Catalog;
use crate::config::Settings;
use crate::error::{ApiError, Code};
use crate::service::Service;
use crate::session::Sessions;

pub use error::{no_route, Error};

/// What every handler may use.
pub struct AppState {
    pub sessions: Sessions,
    pub catalog: Arc<Catalog>,
    pub audit: Audit,
    pub settings: Arc<Settings>,
    pub auth: auth::Keys,
    pub streams: StreamCounter,
    /// Cancelled at shutdown: every open stream ends cleanly.
    pub shutdown: CancellationToken,
}

impl AppState {
    pub fn new(service: &Service, settings: Arc<Settings>, auth: auth::Keys) -> AppState {
        AppState {
            sessions: service.sessions().clone(),
            catalog: service.catalog().clone(),
            audit: service.audit().clone(),
            settings,
            auth,
            streams: StreamCounter::default(),
            shutdown: CancellationToken::new(),
        }
    }
}

pub type State = web::Data<AppState>;

/// Open streams per subject, for the `max_streams_per_subject` limit.
#[derive(Default)]
pub struct StreamCounter {
    open: Arc<DashMap<String, usize>>,
}

/// Held by an open stream; counts it down when the stream ends.
pub struct StreamGuard {
    open: Arc<DashMap<String, usize>>,
    subject: String,
}

impl StreamCounter {
    pub fn open(&self, subject: &str, limit: usize) -> Result<StreamGuard, ApiError> {
        let mut count = self.open.entry(subject.to_string()).or_insert(0);
        if *count >= limit {
            return Err(ApiError::new(
                Code::TooManyStreams,
                format!("subject {subject:?} already has {limit} open streams (streams.max_streams_per_subject)"),
            ));
        }
        *count += 1;
        crate::metrics::STREAMS_OPEN.inc();
        Ok(StreamGuard { open: self.open.clone(), subject: subject.to_string() })
    }
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        crate::metrics::STREAMS_OPEN.dec();
        self.open.remove_if_mut(&self.subject, |_, count| {
            *count -= 1;
            *count == 0
        });
    }
}

/// Every route of every view, each documented in the OpenAPI document by being registered
/// here ([`openapi`]).
pub fn routes(cfg: &mut utoipa_actix_web::service_config::ServiceConfig) {
    // actix tries routes in the order they are registered, a regular expression each, so
    // the busiest come first: the native log's appends, pages and streams, and AAP turns
    // (no other route's path has their shapes).
    cfg.configure(native::session_routes).configure(aap::routes);
    ops::routes(cfg);
    cfg.service(openapi::serve);
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
