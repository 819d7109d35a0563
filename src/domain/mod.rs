//! The vocabulary every other layer speaks: ids and events.

pub mod event;
pub mod ids;

pub use event::{Block, Draft, Event, EventBody, RawEvent, StopReason, Usage};
pub use ids::{EventId, SessionId, TurnId};
