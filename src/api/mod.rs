//! The HTTP views. Each view parses its wire shapes, calls the session layer
//! ([`crate::session::Sessions`]), and renders log events and errors in its own shapes
//! (its own `wire.rs` types); none of them owns state or rules, and none reaches past the
//! session layer.
//!
//! One folder per view (`aap`, `native`, `managed`, `harness`, `console`, and `audit.rs`);
//! no view imports another. What they share is here, each part in a file of its own: the
//! request extractors ([`auth`], [`body`], [`caller`]), content blocks as clients send
//! them ([`content`]), server-sent events ([`sse`]), errors and their renderers
//! ([`error`]), the state every handler may use ([`state`]), the route table ([`routes`])
//! and the OpenAPI document made from it ([`openapi`], with the methods each path takes in
//! [`allowed`]).

pub mod aap;
pub mod allowed;
pub mod audit;
pub mod auth;
pub mod body;
pub mod caller;
pub mod compress;
pub mod conn;
pub mod console;
pub mod content;
pub mod error;
pub mod harness;
pub mod managed;
pub mod native;
pub mod openapi;
pub mod ops;
pub mod routes;
pub mod schema;
pub mod sse;
pub mod state;

pub use error::{no_route, Error};
pub use routes::routes;
pub use state::{AppState, State, StreamCounter, StreamGuard};
