//! The vocabulary every other layer speaks: ids and events.

pub mod caller;
pub mod catalog;
pub mod event;
pub mod ids;
pub mod message;
pub mod metadata;
pub mod plan;
pub mod request;

pub use caller::Caller;
pub use event::{Block, Draft, Event, EventBody, RawEvent, StopReason, Usage};
pub use ids::{EventId, SessionId, TurnId};
pub use message::{Message, Part};
pub use request::{RequestKey, RequestMark};
