//! turnlog: an event-sourced session service for LLM agents.
//!
//! Every event of a session is appended to that session's log; everything else is a view.
//! The layout, each layer importing only those above it (docs/layout.md has the whole map,
//! and `scripts/layers` checks it):
//!
//! - [`domain`]: ids, the event format, messages: the vocabulary of every other layer.
//! - [`store`]: the log behind narrow traits (the log, its projections, the audit side,
//!   what a shared log adds) and three backends (sled, embedded and durable; JetStream,
//!   shared by several nodes; memory, for tests).
//! - [`error`]: the one table of error codes, and what the layers under the views answer.
//! - [`projection`]: pure folds over the log (session index, turn index, history, turn state).
//! - [`agent`]: agents from config, the model interface and its providers, server tools.
//! - [`engine`]: the write side: one actor per active session, the pure decisions, the turn
//!   loop, recovery, and forwarding to the node that holds a session.
//! - [`catalog`]: agents and environments made through an API.
//! - [`session`]: the front door ([`session::Sessions`]) and the read side: ownership,
//!   pages, cursors of every dialect, followers.
//! - [`audit`]: the hash chain's uses: export, verify, import, fork, replay.
//! - [`cluster`]: several nodes on one JetStream log: session leases and forwarding.
//! - [`service`]: the service without a front end (store, engine, sessions, recovery, shutdown).
//! - [`api`]: the HTTP views, each with its own wire types and error shape.
//! - [`app`]: the HTTP server on the service.
//! - [`acp`]: the Agent Client Protocol view over stdio, on the service or on a server.
//! - [`client`]: the one typed client of a server's HTTP API (the CLI's `--server`, the ACP
//!   bridge, the load harness and the tests use it).
//! - [`cli`]: the binary's subcommands, each a function `main` calls.
//! - [`config`], [`metrics`], [`telemetry`].
#![forbid(unsafe_code)]

pub mod acp;
pub mod agent;
pub mod api;
pub mod app;
pub mod audit;
pub mod catalog;
pub mod cli;
pub mod client;
pub mod cluster;
pub mod config;
pub mod domain;
pub mod engine;
pub mod error;
/// The fuzz targets' entry points (`fuzz/`, and `tests/fuzz_corpus.rs`): nothing of the
/// service calls them, so its binary links none of it. Always built, so that one build of
/// the workspace serves the lints, the tests and the fuzz corpus alike.
#[doc(hidden)]
pub mod fuzzing;
pub mod metrics;
pub mod projection;
pub mod service;
pub mod session;
pub mod store;
pub mod telemetry;

pub use app::Application;
pub use config::Settings;
pub use service::Service;
