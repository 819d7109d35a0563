//! Sessions shared by several nodes on one log: each session's actor runs on one node at a
//! time, the one holding the session's lease; any other node forwards the session's
//! commands to it ([`super::forward`]). The engine sees this narrow seam ([`Cluster`]); the
//! NATS implementation is [`crate::cluster`].

use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::domain::SessionId;
use crate::error::SessionError;

/// What a node learns when it asks for a session's lease.
pub enum Claim {
    /// This node holds it now: it runs the session's actor until it gives it up or loses it.
    Mine(Box<dyn Lease>),
    /// Another node holds it.
    Theirs(String),
}

#[async_trait::async_trait]
pub trait Lease: Send + Sync {
    /// Cancelled when the lease is lost (another node took it, or it could not be renewed
    /// in time): the actor must stop at once.
    fn lost(&self) -> CancellationToken;
    /// Gives the lease up (the actor has stopped).
    async fn release(self: Box<Self>);
}

#[derive(Debug)]
pub enum ForwardError {
    /// No node answers for that name: it is gone, and its leases expire.
    Gone,
    Failed(String),
}

/// A request forwarded to this node, and where its answer goes.
pub type Forwarded = (Bytes, oneshot::Sender<Bytes>);

#[async_trait::async_trait]
pub trait Cluster: Send + Sync + 'static {
    fn node(&self) -> &str;
    fn lease_ttl(&self) -> Duration;
    /// Takes the session's lease if nobody holds it (or this node's earlier life does).
    async fn claim(&self, session: SessionId) -> Result<Claim, SessionError>;
    /// The node holding the session's lease, if any.
    async fn holder(&self, session: SessionId) -> Result<Option<String>, SessionError>;
    /// Sends a request to the node and waits for its answer.
    async fn forward(&self, node: &str, request: Bytes) -> Result<Bytes, ForwardError>;
    /// The requests other nodes forward to this one.
    async fn serve(&self) -> Result<mpsc::Receiver<Forwarded>, SessionError>;
}
