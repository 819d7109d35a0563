//! Building and running the service: open the store, assemble the views, bind, serve, and
//! shut down in order (streams end, requests drain, the writer flushes).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix_web::body::MessageBody;
use actix_web::dev::{Server, ServiceRequest, ServiceResponse};
use actix_web::middleware::{from_fn, Next};
use actix_web::{web, App, HttpServer};
use tokio_util::sync::CancellationToken;

use crate::agent::{tools::Tools, Agents};
use crate::api::{self, AppState, StreamCounter};
use crate::config::Settings;
use crate::metrics;
use crate::session::{Engine, FollowConfig, Sessions};
use crate::store::{Store, StoreConfig};

pub struct Application {
    server: Server,
    addr: SocketAddr,
    store: Store,
    shutdown: CancellationToken,
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("{0}")]
    Refused(String),
    #[error("could not open the log in {path}: {source}")]
    Store { path: String, source: crate::store::StoreError },
    #[error("could not listen on {addr}: {source}")]
    Bind { addr: SocketAddr, source: std::io::Error },
}

impl Application {
    /// Opens the store and binds (port 0 allowed); [`Application::addr`] says where.
    pub async fn build(settings: Settings) -> Result<Application, StartError> {
        metrics::init();
        let requested = settings.addr().map_err(|e| StartError::Refused(e.to_string()))?;
        let auth = api::auth::Keys::new(&settings.auth.keys);
        if auth.is_open() && !requested.ip().is_loopback() {
            return Err(StartError::Refused(format!(
                "refusing to listen on {requested} with no API keys configured: add [[auth.keys]] or listen on loopback"
            )));
        }
        if auth.is_open() {
            tracing::warn!("no API keys configured: listening on loopback only, every caller is the admin `local`");
        }
        let store = Store::open(
            StoreConfig {
                path: Some(settings.server.data_dir.clone()),
                cache_capacity_bytes: settings.store.cache_capacity_mb << 20,
                max_batch_events: settings.store.max_batch_events,
                max_events_per_session: settings.limits.max_events_per_session,
                bus_capacity: settings.streams.bus_capacity,
            },
            crate::projection::all(),
        )
        .map_err(|source| StartError::Store { path: settings.server.data_dir.display().to_string(), source })?;
        let shutdown = CancellationToken::new();
        let follow = FollowConfig {
            replay_chunk: settings.streams.replay_chunk_events,
            max_backlog: settings.streams.max_backlog_events,
        };
        let sessions = Sessions::new(store.clone(), follow);
        let agents =
            Agents::build(&settings.agents, Tools::new(settings.tools.clone())).map_err(StartError::Refused)?;
        let engine = Engine::new(sessions.clone(), Arc::new(agents), settings.engine.clone());
        match engine.recover().await {
            Ok(0) => {}
            Ok(closed) => tracing::warn!(closed, "closed turns that the last stop left running"),
            Err(error) => return Err(StartError::Refused(format!("could not close interrupted turns: {error}"))),
        }
        let state = web::Data::new(AppState {
            engine: engine.clone(),
            sessions,
            settings: Arc::new(settings.clone()),
            auth,
            streams: StreamCounter::default(),
            shutdown: shutdown.clone(),
        });
        let workers = match settings.server.workers {
            0 => std::thread::available_parallelism().map_or(2, |n| n.get()),
            n => n,
        };
        let server = HttpServer::new(move || {
            App::new()
                .app_data(state.clone())
                .wrap(from_fn(observe))
                .configure(api::routes)
                .default_service(web::to(api::no_route))
        })
        // Small SSE frames must not wait for the peer's delayed ACK (about 40 ms a frame).
        .on_connect(|connection, _| {
            if let Some(tcp) = connection.downcast_ref::<actix_web::rt::net::TcpStream>() {
                let _ = tcp.set_nodelay(true);
            }
        })
        .workers(workers)
        // Applied only when the server binds the socket itself (not to a listener handed
        // in), so it binds: a thousand clients connecting at once must not overflow it.
        .backlog(4096)
        .max_connections(100_000)
        .disable_signals()
        .shutdown_timeout(settings.server.shutdown_timeout_secs)
        .bind(requested)
        .map_err(|source| StartError::Bind { addr: requested, source })?;
        let addr = *server.addrs().first().expect("a bound address");
        let server = server.run();
        Ok(Application { server, addr, store, shutdown })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Serves until SIGTERM or Ctrl-C, then shuts down in order.
    pub async fn run_until_stopped(self) -> std::io::Result<()> {
        let Application { server, store, shutdown, .. } = self;
        let handle = server.handle();
        let sweeper = tokio::spawn(sweep(store.clone()));
        let signals = tokio::spawn({
            let shutdown = shutdown.clone();
            async move {
                wait_for_signal().await;
                tracing::info!("shutting down: ending streams, draining requests, flushing the log");
                shutdown.cancel();
                handle.stop(true).await;
            }
        });
        let result = server.await;
        shutdown.cancel();
        signals.abort();
        sweeper.abort();
        let started = Instant::now();
        match tokio::task::spawn_blocking(move || store.close()).await {
            Ok(Ok(())) => tracing::info!(elapsed_ms = started.elapsed().as_millis() as u64, "log flushed and closed"),
            Ok(Err(error)) => tracing::error!(%error, "closing the log failed"),
            Err(error) => tracing::error!(%error, "closing the log panicked"),
        }
        result
    }
}

/// Drops the live channels of sessions nobody watches, so idle sessions cost nothing.
async fn sweep(store: Store) {
    let mut every = tokio::time::interval(Duration::from_secs(10));
    loop {
        every.tick().await;
        store.sweep();
    }
}

async fn wait_for_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("installing the SIGTERM handler");
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}

/// Request metrics by route template (never by session id).
async fn observe(
    req: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let started = Instant::now();
    let method = req.method().to_string();
    let route = req.match_pattern().unwrap_or_else(|| "unmatched".into());
    let response = next.call(req).await?;
    let status = response.status().as_u16().to_string();
    metrics::HTTP_REQUESTS.with_label_values(&[&method, &route, &status]).inc();
    metrics::HTTP_SECONDS.with_label_values(&[&method, &route]).observe(started.elapsed().as_secs_f64());
    Ok(response)
}
