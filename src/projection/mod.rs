//! Projections: pure folds over the log. The log runs them as it writes and rebuilds them
//! from the events after an unclean stop.

pub mod catalog;
pub mod history;
pub mod page;
pub mod progress;
pub mod read;
pub mod sessions;
pub mod turns;

pub use page::{Page, TimeBounds};
pub use sessions::{SessionIndex, SessionSummary};
pub use turns::{TurnIndex, TurnSummary};

use std::sync::Arc;

use crate::store::Projection;

/// Every projection the service keeps.
pub fn all() -> Vec<Arc<dyn Projection>> {
    vec![
        Arc::new(SessionIndex),
        Arc::new(turns::OpenTurns),
        Arc::new(TurnIndex),
        Arc::new(turns::ProcessedInput),
        Arc::new(catalog::CatalogAgents),
        Arc::new(catalog::CatalogEnvironments),
    ]
}
