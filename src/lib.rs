//! turnlog: an event-sourced session service for LLM agents.
//!
//! Every event of a session is appended to that session's log; everything else is a view.
//! The layout, with dependencies pointing inward:
//!
//! - [`domain`]: ids and events, the vocabulary of every other layer.
//! - [`store`]: the durable log in sled (group-commit writer, watermarks, live buses).
//! - [`projection`]: pure folds over the log (the session index).
//! - [`agent`]: agents from config, the model interface and its providers, server tools.
//! - [`session`]: sessions, ownership, the turn engine, and following a log.
//! - [`api`]: the HTTP views, each with its own wire types.
//! - [`app`], [`config`], [`metrics`], [`error`], [`telemetry`]: wiring and operations.
#![forbid(unsafe_code)]

pub mod agent;
pub mod api;
pub mod app;
pub mod config;
pub mod domain;
pub mod error;
pub mod metrics;
pub mod projection;
pub mod session;
pub mod store;
pub mod telemetry;

pub use app::Application;
pub use config::Settings;
