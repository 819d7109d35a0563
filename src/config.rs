//! Settings: `config/default.toml` (compiled in), then an optional file, then
//! `TURNLOG__SECTION__KEY` environment variables; validated before anything starts.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use figment::providers::{Env, Format, Toml};
use figment::Figment;
use serde::Deserialize;

const DEFAULTS: &str = include_str!("../config/default.toml");

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    pub server: ServerSettings,
    pub store: StoreSettings,
    pub streams: StreamSettings,
    pub limits: LimitSettings,
    pub auth: AuthSettings,
    pub engine: crate::engine::EngineSettings,
    pub turns: crate::engine::TurnSettings,
    pub shutdown: ShutdownSettings,
    pub tools: crate::agent::tools::ToolSettings,
    pub agents: std::collections::BTreeMap<String, crate::agent::AgentConfig>,
    /// Models that agents made through an API may name by id (`scripted` always exists).
    #[serde(default)]
    pub models: std::collections::BTreeMap<String, crate::agent::ModelConfig>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerSettings {
    pub addr: String,
    pub data_dir: PathBuf,
    pub max_body_bytes: usize,
    pub workers: usize,
    pub shutdown_timeout_secs: u64,
    /// A connection has this long to send a whole request head (else 408, and it is closed).
    pub request_head_timeout_ms: u64,
    /// A request has this long to send its whole body (else 408, and it is closed).
    pub body_timeout_ms: u64,
    /// The encodings a response may be compressed in, for a client that accepts one.
    pub compress: Vec<Codec>,
    /// The encodings an SSE stream may be compressed in (each open stream keeps its
    /// compressor's memory).
    pub compress_streams: Vec<Codec>,
    /// A body of a known length under this many bytes is sent as it is.
    pub compress_min_bytes: u64,
}

/// A content coding turnlog compresses responses in (`[server] compress`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Codec {
    Zstd,
    Gzip,
}

/// A graceful stop (SIGTERM, SIGINT, the end of an ACP client's input).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShutdownSettings {
    /// How long running turns have to finish; past it, each is left to be resumed (by this
    /// node when it starts again, or by another node of a cluster), never closed.
    pub grace_ms: u64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoreSettings {
    /// Where the log lives: embedded sled (one node), or NATS JetStream (several nodes).
    pub backend: StoreBackend,
    pub cache_capacity_mb: u64,
    pub max_batch_events: usize,
    pub min_free_mb: u64,
    /// The newest events of each session kept in memory for readers (sled), and in all.
    pub recent_kib: usize,
    pub recent_total_mb: usize,
    pub jetstream: JetStreamSettings,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StoreBackend {
    Sled,
    Jetstream,
}

#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JetStreamSettings {
    pub servers: Vec<String>,
    pub replicas: usize,
    pub stream: String,
    pub prefix: String,
    pub projections_bucket: String,
    pub leases_bucket: String,
    pub lease_ttl_secs: u64,
    pub connect_timeout_ms: u64,
    /// How long a request to the engine is sent again while it fails over (see
    /// [`crate::store::jetstream::JetStreamConfig::failover_wait`]).
    pub failover_wait_ms: u64,
    pub claims_bucket: String,
    /// This node's name in leases (default: made up at start, unique).
    #[serde(default)]
    pub node: Option<String>,
    #[serde(default)]
    pub user: Option<String>,
    #[serde(default)]
    pub password: Option<String>,
    #[serde(default)]
    pub token: Option<String>,
    #[serde(default)]
    pub creds_file: Option<PathBuf>,
}

impl std::fmt::Debug for JetStreamSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JetStreamSettings")
            .field("servers", &self.servers)
            .field("replicas", &self.replicas)
            .field("stream", &self.stream)
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

impl JetStreamSettings {
    /// The credentials to connect with: at most one kind may be given.
    pub fn credentials(&self) -> Result<crate::store::jetstream::Credentials, ConfigError> {
        use crate::store::jetstream::Credentials;
        match (&self.user, &self.password, &self.token, &self.creds_file) {
            (None, None, None, None) => Ok(Credentials::None),
            (Some(user), Some(password), None, None) => Ok(Credentials::UserPassword(user.clone(), password.clone())),
            (None, None, Some(token), None) => Ok(Credentials::Token(token.clone())),
            (None, None, None, Some(file)) => Ok(Credentials::CredsFile(file.clone())),
            _ => Err(ConfigError::Invalid(
                "store.jetstream: give `user` with `password`, or `token`, or `creds_file`, not several".into(),
            )),
        }
    }
}

fn default_retry_ms() -> u64 {
    1000
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamSettings {
    pub heartbeat_ms: u64,
    /// The `retry:` a browser's `EventSource` waits before it reconnects, sent first on the
    /// streams browsers follow (native, managed, the console's list); 0: not sent (the
    /// browser waits its own default, about 3 s).
    #[serde(default = "default_retry_ms")]
    pub retry_ms: u64,
    pub bus_capacity: usize,
    pub max_backlog_events: u64,
    pub replay_chunk_events: usize,
    pub max_streams_per_subject: usize,
    /// A streamed answer whose client takes none of what is ready for this long is cut off.
    pub stall_timeout_ms: u64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitSettings {
    pub max_event_bytes: usize,
    pub max_events_per_session: u64,
    pub max_events_per_request: usize,
    pub max_page_size: usize,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthSettings {
    pub keys: Vec<ApiKey>,
}

/// An API key, stored only as the hex SHA-256 of the key.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiKey {
    pub subject: String,
    pub sha256: String,
    #[serde(default)]
    pub admin: bool,
}

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiKey").field("subject", &self.subject).field("admin", &self.admin).finish_non_exhaustive()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("configuration: {0}")]
    Load(#[from] Box<figment::Error>),
    #[error("configuration: {0}")]
    Invalid(String),
}

impl Settings {
    /// These settings with request bodies (and the events they make) held to `limit` bytes,
    /// where the log underneath carries no more in one append.
    pub fn with_body_limit(&self, limit: usize) -> Settings {
        let mut settings = self.clone();
        settings.server.max_body_bytes = settings.server.max_body_bytes.min(limit);
        settings.limits.max_event_bytes = settings.limits.max_event_bytes.min(limit);
        settings
    }

    /// Reads the layers. `file` is optional; a named file that does not exist is an error.
    pub fn load(file: Option<&Path>) -> Result<Settings, ConfigError> {
        let mut figment = Figment::from(Toml::string(DEFAULTS));
        if let Some(file) = file {
            if !file.exists() {
                return Err(ConfigError::Invalid(format!("config file {} does not exist", file.display())));
            }
            figment = figment.merge(Toml::file(file));
        }
        let settings: Settings = figment
            .merge(Env::prefixed("TURNLOG__").split("__"))
            .extract()
            .map_err(|e| ConfigError::Load(Box::new(e)))?;
        settings.validate()?;
        Ok(settings)
    }

    /// The defaults with `text` (a config file's TOML) read over them; no environment.
    pub fn from_toml(text: &str) -> Result<Settings, ConfigError> {
        let settings: Settings = Figment::from(Toml::string(DEFAULTS))
            .merge(Toml::string(text))
            .extract()
            .map_err(|e| ConfigError::Load(Box::new(e)))?;
        settings.validate()?;
        Ok(settings)
    }

    /// Refuses contradictions before anything starts.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |m: &str| Err(ConfigError::Invalid(m.to_string()));
        self.addr()?;
        if self.server.max_body_bytes < 1024 {
            return invalid("server.max_body_bytes must be at least 1024");
        }
        if self.limits.max_event_bytes > self.server.max_body_bytes {
            return invalid("limits.max_event_bytes cannot exceed server.max_body_bytes");
        }
        if self.limits.max_events_per_request == 0 || self.limits.max_event_bytes == 0 {
            return invalid("limits.max_events_per_request and limits.max_event_bytes must be positive");
        }
        if self.store.max_batch_events == 0 || self.streams.replay_chunk_events == 0 {
            return invalid("store.max_batch_events and streams.replay_chunk_events must be positive");
        }
        if self.store.backend == StoreBackend::Jetstream {
            let js = &self.store.jetstream;
            if js.servers.is_empty() {
                return invalid("store.jetstream.servers must name at least one NATS server");
            }
            if js.replicas != 1 && js.replicas != 3 {
                return invalid("store.jetstream.replicas must be 1 or 3");
            }
            if js.lease_ttl_secs == 0 {
                return invalid("store.jetstream.lease_ttl_secs must be positive");
            }
            js.credentials()?;
        }
        if self.streams.heartbeat_ms == 0 {
            return invalid("streams.heartbeat_ms must be positive");
        }
        if self.streams.stall_timeout_ms == 0 {
            return invalid("streams.stall_timeout_ms must be positive");
        }
        if self.server.request_head_timeout_ms == 0 || self.server.body_timeout_ms == 0 {
            return invalid("server.request_head_timeout_ms and server.body_timeout_ms must be positive");
        }
        if self.agents.is_empty() {
            return invalid("at least one agent must be configured under [agents]");
        }
        for (name, agent) in &self.agents {
            if agent.max_turn_requests == 0 {
                return Err(ConfigError::Invalid(format!("agents.{name}.max_turn_requests must be positive")));
            }
        }
        for key in &self.auth.keys {
            if key.sha256.len() != 64 || !key.sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(ConfigError::Invalid(format!(
                    "auth.keys: the key of subject {:?} needs `sha256`, 64 hex digits (see `turnlog hash-key`)",
                    key.subject
                )));
            }
        }
        Ok(())
    }

    pub fn addr(&self) -> Result<SocketAddr, ConfigError> {
        self.server
            .addr
            .parse()
            .map_err(|_| ConfigError::Invalid(format!("server.addr {:?} is not an IP:port address", self.server.addr)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_load_and_validate() {
        let settings = Settings::load(None).unwrap();
        assert_eq!(settings.streams.heartbeat_ms, 15_000);
        assert!(settings.auth.keys.is_empty());
    }

    #[test]
    fn a_bad_key_hash_is_refused_with_its_subject() {
        let mut settings = Settings::load(None).unwrap();
        settings.auth.keys.push(ApiKey { subject: "alice".into(), sha256: "abc".into(), admin: false });
        let error = settings.validate().unwrap_err().to_string();
        assert!(error.contains("alice"), "{error}");
    }

    #[test]
    fn an_agents_models_are_ids_of_models_once_each_and_never_default() {
        use crate::agent::{Agents, Tools};
        let settings = Settings::load(None).unwrap();
        let build = |models: &[&str]| {
            let mut agents = settings.agents.clone();
            agents.get_mut("default").unwrap().models = models.iter().map(|m| m.to_string()).collect();
            Agents::build(&agents, &settings.models, Tools::new(settings.tools.clone())).err()
        };
        assert_eq!(build(&["second", "scripted"]), None, "`scripted` is always there");
        let unknown = build(&["nope"]).unwrap();
        assert_eq!(unknown, "agents.default.models: \"nope\" is not one of [models] (scripted, second)");
        assert!(build(&["default"]).unwrap().contains("\"default\" is not one of [models]"));
        assert_eq!(build(&["second", "second"]).unwrap(), "agents.default.models: \"second\" is listed twice");
    }

    #[test]
    fn input_limits_of_zero_are_refused() {
        let mut settings = Settings::load(None).unwrap();
        settings.limits.max_events_per_request = 0;
        let error = settings.validate().unwrap_err().to_string();
        assert!(error.contains("limits.max_events_per_request"), "{error}");
    }
}
