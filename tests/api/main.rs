mod auth;
mod crash;
mod events;
mod helpers;
mod ops;
mod sessions;
mod stream;
mod turns;
