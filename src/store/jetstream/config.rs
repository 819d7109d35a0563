//! What a node is told of the engine: where it is, how to sign in, and where the log and
//! its projections are kept there.

use std::time::Duration;

/// How a node reaches the engine and where it keeps things there.
#[derive(Debug, Clone)]
pub struct JetStreamConfig {
    pub servers: Vec<String>,
    /// 1, or 3 for a quorum of three servers.
    pub replicas: usize,
    pub stream: String,
    /// Subjects are `<prefix>.events.<session>`.
    pub prefix: String,
    pub projections_bucket: String,
    pub credentials: Credentials,
    pub connect_timeout: Duration,
    pub max_events_per_session: u64,
    pub bus_capacity: usize,
    /// The largest append (bytes of JSON) the service takes: the engine must carry it.
    pub max_batch_bytes: usize,
    /// How long a request is sent again while it fails: a server failing over (a stream or
    /// bucket electing a new leader, a client reconnecting) answers nothing for a while
    /// (5 to 17 s measured on nats-server 2.9), and a write then waits rather than fail.
    pub failover_wait: Duration,
    /// Where claims (see [`crate::store::Claims`]) are kept, and for how long.
    pub claims_bucket: String,
    pub claims_max_age: Duration,
}

#[derive(Clone, Default)]
pub enum Credentials {
    #[default]
    None,
    UserPassword(String, String),
    Token(String),
    CredsFile(std::path::PathBuf),
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Credentials::None => "None",
            Credentials::UserPassword(..) => "UserPassword(..)",
            Credentials::Token(_) => "Token(..)",
            Credentials::CredsFile(_) => "CredsFile(..)",
        })
    }
}
