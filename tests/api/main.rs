mod audit;
mod auth;
mod cluster;
mod console;
mod crash;
mod disk;
mod events;
mod harness;
mod helpers;
mod managed;
#[path = "../common/nats.rs"]
mod nats;
mod openapi;
mod ops;
mod sessions;
mod soak;
mod stream;
mod turns;
