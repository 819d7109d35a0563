//! turnlog-load: the benchmark and load harness for turnlog.
//!
//! Every scenario drives a real server over loopback HTTP, is bounded in count and in
//! time, and checks correctness as well as speed: each subscribing client's events, across
//! all its reconnects, must be exactly the log's suffix after its first cursor, once each,
//! in order, compared against the list API at the end.
//!
//! - [`server`]: starting the `turnlog` binary (or using a running one), its RSS, CPU and
//!   `/metrics`.
//! - [`client`]: typed verbs over the HTTP API, and SSE streams parsed by
//!   `sse-stream`.
//! - [`check`]: the correctness checks (the log itself, and each client's view of it).
//! - [`stats`], [`report`], [`progress`]: histograms, the Markdown/JSON report, progress bars.
//! - [`scenarios`]: one module per scenario.

pub mod check;
pub mod client;
pub mod progress;
pub mod report;
pub mod scenarios;
pub mod server;
pub mod stats;

pub use report::Report;
pub use scenarios::{Ctx, Scenario, Size};
pub use server::Launcher;
