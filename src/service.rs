//! The service without a front end: the log, the agents, the engine and recovery, built
//! from [`Settings`]. The HTTP server ([`crate::app`]) and `turnlog acp` both build on it.
//! [`Service::shutdown`] stops in order: no new turn starts, running turns have
//! `shutdown.grace_ms` to finish and are otherwise left as they are (the next start, or
//! another node, resumes them), then the log is flushed and closed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::agent::{tools::Tools, Agents};
use crate::audit::Audit;
use crate::catalog::Catalog;
use crate::config::{Settings, StoreBackend};
use crate::engine::cluster::Cluster;
use crate::engine::{Engine, InputLimits};
use crate::session::{SessionLog, Sessions};
use crate::store::follow::FollowConfig;
use crate::store::sled::{SledConfig, SledLog};
use crate::store::{Log, Store, StoreError};

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("{0}")]
    Refused(String),
    #[error("could not open the log in {path}: {source}")]
    Store { path: String, source: StoreError },
}

pub struct Service {
    sessions: Sessions,
    catalog: Arc<Catalog>,
    audit: Audit,
    engine: Engine,
    log: Arc<dyn Log>,
    /// The largest request body the log underneath takes (see [`Settings::with_body_limit`]).
    max_body_bytes: usize,
    /// The sweeper, and with other nodes the server of forwarded commands and the reaper.
    background: Vec<tokio::task::JoinHandle<()>>,
    stop_wait: Duration,
    recovered: usize,
    turns_stopped: tokio::sync::OnceCell<()>,
}

impl Service {
    /// Opens the durable log (in `server.data_dir`, or on JetStream), then the rest.
    pub async fn open(settings: &Settings) -> Result<Service, StartError> {
        let agents = agents(settings)?;
        if settings.store.backend == StoreBackend::Jetstream {
            let servers = settings.store.jetstream.servers.join(", ");
            let (log, cluster) = crate::cluster::open(settings)
                .await
                .map_err(|source| StartError::Store { path: format!("NATS JetStream at {servers}"), source })?;
            tracing::info!(node = cluster.node(), servers, "the log is on JetStream");
            let settings = &settings.with_body_limit(log.max_batch_bytes());
            return Service::start(settings, agents, Store::shared(Arc::new(log)), Some(cluster)).await;
        }
        let config = SledConfig {
            path: Some(settings.server.data_dir.clone()),
            cache_capacity_bytes: settings.store.cache_capacity_mb << 20,
            max_batch_events: settings.store.max_batch_events,
            max_events_per_session: settings.limits.max_events_per_session,
            bus_capacity: settings.streams.bus_capacity,
            min_free_bytes: settings.store.min_free_mb << 20,
            recent_bytes: settings.store.recent_kib << 10,
            recent_total_bytes: settings.store.recent_total_mb << 20,
            ..SledConfig::default()
        };
        let path = settings.server.data_dir.display().to_string();
        let log =
            SledLog::open(config, crate::projection::all()).map_err(|source| StartError::Store { path, source })?;
        Service::start(settings, agents, Store::embedded(Arc::new(log)), None).await
    }

    /// Builds the service on a log that is already open (the in-memory one, in tests).
    pub async fn with_store(settings: &Settings, store: Store) -> Result<Service, StartError> {
        Service::start(settings, agents(settings)?, store, None).await
    }

    async fn start(
        settings: &Settings,
        agents: Agents,
        store: Store,
        cluster: Option<Arc<dyn Cluster>>,
    ) -> Result<Service, StartError> {
        let follow = FollowConfig {
            replay_chunk: settings.streams.replay_chunk_events,
            max_backlog: settings.streams.max_backlog_events,
        };
        let agents = Arc::new(agents);
        let limits = InputLimits {
            max_events_per_request: settings.limits.max_events_per_request,
            max_event_bytes: settings.limits.max_event_bytes,
        };
        let engine_settings = crate::engine::EngineSettings { turns: settings.turns, ..settings.engine.clone() };
        let engine = Engine::new(&store, agents.clone(), engine_settings, limits, cluster.clone());
        // The catalog before recovery: a session that recovery wakes may run one of its agents.
        let catalog = Arc::new(open_catalog(&store, &engine, &agents, follow).await?);
        let recovered = match engine.recover().await {
            Ok(0) => 0,
            Ok(resumed) => {
                tracing::warn!(resumed, "resuming turns that the last run left running");
                resumed
            }
            Err(error) => return Err(StartError::Refused(format!("could not resume the turns left running: {error}"))),
        };
        let sessions = Sessions::new(SessionLog::new(&store, follow), engine.clone(), agents, catalog.clone());
        let audit = Audit::new(sessions.clone(), store.clone(), engine.clone());
        let log = store.log;
        let mut background = vec![tokio::spawn(sweep(log.clone()))];
        if engine.expires_sessions() {
            let expirer = engine.clone();
            background.push(tokio::spawn(async move { expirer.expire_idle().await }));
        }
        if cluster.is_some() {
            let serving = engine.serve_forwarded().await.map_err(|error| StartError::Refused(error.to_string()))?;
            let reaper = engine.clone();
            background.extend([serving, tokio::spawn(async move { reaper.reap().await })]);
        }
        let stop_wait = Duration::from_millis(settings.shutdown.grace_ms);
        let turns_stopped = Default::default();
        let max_body_bytes = settings.server.max_body_bytes;
        Ok(Service {
            sessions,
            catalog,
            audit,
            engine,
            log,
            max_body_bytes,
            background,
            stop_wait,
            recovered,
            turns_stopped,
        })
    }

    /// The largest request body the log takes: `server.max_body_bytes`, or less where the
    /// engine underneath carries less in one message.
    pub fn max_body_bytes(&self) -> usize {
        self.max_body_bytes
    }

    /// How many turns that the last run left running this start found (and resumes).
    pub fn recovered(&self) -> usize {
        self.recovered
    }

    pub fn sessions(&self) -> &Sessions {
        &self.sessions
    }

    /// Agents and environments made through an API.
    pub fn catalog(&self) -> &Arc<Catalog> {
        &self.catalog
    }

    pub fn audit(&self) -> &Audit {
        &self.audit
    }

    /// Takes no new turn (every submission answers that the service is shutting down) and
    /// gives running turns `shutdown.grace_ms` to finish; those still running then are
    /// left to be resumed. Reads and streams go on until [`Service::shutdown`].
    pub async fn stop_turns(&self) {
        let stop = async {
            let started = Instant::now();
            let (stopped, left) = self.engine.shutdown(self.stop_wait).await;
            let elapsed_ms = started.elapsed().as_millis() as u64;
            tracing::info!(stopped, left, elapsed_ms, "session actors stopped");
        };
        // Once: a second caller waits for the first stop rather than as long again.
        self.turns_stopped.get_or_init(|| stop).await;
    }

    /// Stops the turns (if [`Service::stop_turns`] has not), then flushes and closes the log.
    pub async fn shutdown(&self) -> Result<(), StoreError> {
        self.stop_turns().await;
        self.sessions.agents().shutdown().await;
        for task in &self.background {
            task.abort();
        }
        let started = Instant::now();
        self.log.close().await?;
        tracing::info!(elapsed_ms = started.elapsed().as_millis() as u64, "log flushed and closed");
        Ok(())
    }
}

/// How long a start waits for a log whose engine is not ready yet (a cluster electing its
/// leaders, as when it has just come back), as opening the log itself does.
const START_WAIT: Duration = Duration::from_secs(30);

/// Opens the catalog, waiting up to [`START_WAIT`] while the log's engine is out of reach.
async fn open_catalog(
    store: &Store,
    engine: &Engine,
    agents: &Arc<Agents>,
    follow: FollowConfig,
) -> Result<Catalog, StartError> {
    let deadline = Instant::now() + START_WAIT;
    loop {
        match Catalog::open(store, engine.clone(), agents.clone(), follow).await {
            Ok(catalog) => return Ok(catalog),
            Err(error) if error.is_unavailable() && Instant::now() < deadline => {
                tracing::warn!(%error, "the log is not ready to read the catalog yet; trying again");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(error) => return Err(StartError::Refused(format!("could not read the catalog: {error}"))),
        }
    }
}

pub(crate) fn agents(settings: &Settings) -> Result<Agents, StartError> {
    Agents::build(&settings.agents, &settings.models, Tools::new(settings.tools.clone())).map_err(StartError::Refused)
}

/// Drops the live channels of sessions nobody watches, so idle sessions cost nothing.
async fn sweep(log: Arc<dyn Log>) {
    let mut every = tokio::time::interval(Duration::from_secs(10));
    loop {
        every.tick().await;
        log.sweep();
    }
}
