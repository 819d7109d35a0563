//! The HTTP server on the [`Service`]: assemble the views, bind, serve, and shut down in
//! order (stop accepting, stop the turns and record their end, end the streams, drain
//! requests, close the log).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix_http::{error::DispatchError, HttpService, KeepAlive};
use actix_service::{fn_service, map_config, IntoServiceFactory, ServiceFactoryExt};
use actix_web::body::{EitherBody, MessageBody};
use actix_web::dev::{AppConfig, Server, ServiceFactory, ServiceRequest, ServiceResponse};
use actix_web::middleware::{from_fn, Next};
use actix_web::rt::net::TcpStream;
use actix_web::{web, App};
use tokio_util::sync::CancellationToken;
use utoipa_actix_web::AppExt;

use crate::api::conn::{Conn, Socket, Watched};
use crate::api::{self, AppState};
use crate::config::Settings;
use crate::metrics;
use crate::service::{Service, StartError};

pub struct Application {
    server: Server,
    addr: SocketAddr,
    service: Arc<Service>,
    shutdown: CancellationToken,
}

#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error(transparent)]
    Start(#[from] StartError),
    #[error("could not listen on {addr}: {source}")]
    Bind { addr: SocketAddr, source: std::io::Error },
}

impl Application {
    /// Opens the service and binds (port 0 allowed); [`Application::addr`] says where.
    pub async fn build(settings: Settings) -> Result<Application, BuildError> {
        metrics::init();
        let requested = settings.addr().map_err(|e| StartError::Refused(e.to_string()))?;
        let mut auth = api::auth::Keys::new(&settings.auth.keys);
        if auth.is_open() && !requested.ip().is_loopback() {
            return Err(StartError::Refused(format!(
                "refusing to listen on {requested} with no API keys configured: add [[auth.keys]] or listen on loopback"
            ))
            .into());
        }
        if auth.is_open() {
            tracing::warn!("no API keys configured: listening on loopback only, every caller is the admin `local`");
        } else {
            let dir = &settings.server.data_dir;
            let secret = api::auth::console_secret(dir).map_err(|e| {
                StartError::Refused(format!("the console's secret in {} could not be read or made: {e}", dir.display()))
            })?;
            auth = auth.with_secret(secret);
        }
        let service = Arc::new(Service::open(&settings).await?);
        let settings = settings.with_body_limit(service.max_body_bytes());
        let state = web::Data::new(AppState::new(&service, Arc::new(settings.clone()), auth));
        let shutdown = state.shutdown.clone();
        // The log's writer thread keeps a core busy under load (it syncs, inserts and
        // publishes every commit): one worker per core beside it. On two cores one worker
        // also keeps a request, its session's actor and its answer on one thread.
        let workers = match settings.server.workers {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get().saturating_sub(1).max(1)),
            n => n,
        };
        let routes = web::Data::new(api::openapi::Routes::new(&api::openapi::document(settings.limits.max_page_size)));
        let head_timeout = Duration::from_millis(settings.server.request_head_timeout_ms);
        let compression = Arc::new(api::compress::Compression::new(&settings.server));
        raise_open_files_limit();
        let listener = listen(requested).map_err(|source| BuildError::Bind { addr: requested, source })?;
        let addr = listener.local_addr().map_err(|source| BuildError::Bind { addr: requested, source })?;
        // actix-web's `HttpServer`, assembled by hand so that actix reads and writes a
        // [`Socket`] of ours rather than the TCP stream itself: see `api::conn`.
        let builder = actix_server::Server::build();
        let graceful = builder.graceful_shutdown_signal();
        let server = builder
            .workers(workers)
            .max_concurrent_connections(100_000)
            .disable_signals()
            .shutdown_timeout(settings.server.shutdown_timeout_secs)
            .listen("turnlog", listener, move || {
                let graceful = graceful.clone();
                let compression = compression.clone();
                // (The last wrapped is the outermost: compression wraps the watched body.)
                let app = views(state.clone(), routes.clone())
                    .wrap(from_fn(observe))
                    .wrap(from_fn(move |req, next| api::compress::compress(compression.clone(), req, next)))
                    .into_factory();
                // `HttpServer`'s settings where turnlog has none of its own. The app's config
                // holds the host and address used for a request with no Host header, for URLs
                // turnlog does not make; only its scheme (http) is read.
                let http = HttpService::build()
                    .keep_alive(KeepAlive::default())
                    .client_request_timeout(head_timeout)
                    .client_disconnect_timeout(Duration::from_secs(1))
                    .h1_allow_half_closed(true)
                    .local_addr(addr)
                    .graceful_shutdown_signal(move || {
                        let graceful = graceful.clone();
                        async move { graceful.notified().await }
                    })
                    .on_connect_ext(move |socket: &Socket, data: &mut _| {
                        api::conn::on_connect(socket, data, head_timeout)
                    })
                    .h1(map_config(app.map_err(|error| error.error_response()), |_| AppConfig::default()));
                fn_service(|tcp: TcpStream| async move {
                    let peer = tcp.peer_addr().ok();
                    Ok::<_, DispatchError>((Socket::new(tcp), peer))
                })
                .and_then(http)
            })
            .map_err(|source| BuildError::Bind { addr: requested, source })?
            .run();
        Ok(Application { server, addr, service, shutdown })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Serves until SIGTERM or Ctrl-C, then shuts down in order.
    pub async fn run_until_stopped(self) -> std::io::Result<()> {
        let Application { server, service, shutdown, .. } = self;
        let handle = server.handle();
        let signals = tokio::spawn({
            let (shutdown, service) = (shutdown.clone(), service.clone());
            async move {
                wait_for_signal().await;
                tracing::info!("shutting down: stopping turns, ending streams, draining requests, flushing the log");
                handle.pause().await;
                service.stop_turns().await;
                shutdown.cancel();
                handle.stop(true).await;
            }
        });
        let result = server.await;
        shutdown.cancel();
        signals.abort();
        if let Err(error) = service.shutdown().await {
            tracing::error!(%error, "closing the log failed");
        }
        result
    }
}

/// SIGTERM or Ctrl-C.
pub(crate) async fn wait_for_signal() {
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

/// Every connection holds a descriptor: raises the soft limit on open files to the hard
/// one, as Go's runtime does for every server, so that a node holds as many subscribers as
/// it is allowed (systemd's soft default of 1,024 would cap it near a thousand).
fn raise_open_files_limit() {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let limit = getrlimit(Resource::Nofile);
    if limit.current.is_some() && limit.current != limit.maximum {
        match setrlimit(Resource::Nofile, Rlimit { current: limit.maximum, maximum: limit.maximum }) {
            Ok(()) => tracing::info!(
                "open files: soft limit raised from {} to {}",
                limit.current.unwrap_or(u64::MAX),
                limit.maximum.map_or("unlimited".to_string(), |n| n.to_string())
            ),
            Err(error) => tracing::warn!(%error, "open files: the soft limit could not be raised to the hard one"),
        }
    }
}

/// The listening socket, bound here so that [`Application::addr`] can say where port 0 went:
/// with a backlog of 4,096, so that a thousand clients connecting at once do not overflow it.
/// Closed on exec: a process turnlog starts (a stdio MCP server) must not hold the port, or
/// one that outlives a crash keeps the next start from listening.
fn listen(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    use rustix::net::{self, sockopt, AddressFamily, SocketFlags, SocketType};
    let family = if addr.is_ipv4() { AddressFamily::INET } else { AddressFamily::INET6 };
    let socket = net::socket_with(family, SocketType::STREAM, SocketFlags::CLOEXEC, None)?;
    sockopt::set_socket_reuseaddr(&socket, true)?;
    net::bind(&socket, &addr)?;
    net::listen(&socket, 4096)?;
    let listener = std::net::TcpListener::from(socket);
    listener.set_nonblocking(true)?;
    Ok(listener)
}

/// Every view's routes on `state`, and the answer for paths none of them has; the server
/// adds its middleware.
pub fn views(
    state: web::Data<AppState>,
    routes: web::Data<api::openapi::Routes>,
) -> App<
    impl ServiceFactory<ServiceRequest, Config = (), Response = ServiceResponse, Error = actix_web::Error, InitError = ()>,
> {
    App::new()
        .into_utoipa_app()
        .configure(api::routes)
        .into_app()
        .app_data(state)
        .app_data(routes)
        .default_service(web::to(api::no_route::<api::error::Standard>))
}

/// Request metrics by route template (never by session id).
async fn observe(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let started = Instant::now();
    if let Some(conn) = req.conn_data::<Conn>() {
        conn.requested();
    }
    let response = next.call(req).await?;
    // Asked after routing, the route is the one that matched; asked before, actix matches
    // the path against every route again.
    let request = response.request();
    let route = request.match_pattern().unwrap_or_else(|| "unmatched".into());
    let (method, status) = (request.method().as_str(), response.status());
    metrics::HTTP_REQUESTS.with_label_values(&[method, &route, status.as_str()]).inc();
    metrics::HTTP_SECONDS.with_label_values(&[method, &route]).observe(started.elapsed().as_secs_f64());
    // A streamed answer is cut off if its client stops taking it.
    let request = request.clone();
    let stall = request.app_data::<api::State>().map(|state| state.settings.streams.stall_timeout_ms);
    let watch = |body| match stall {
        Some(ms) => Watched::new(body, request.conn_data(), Duration::from_millis(ms), || {
            format!("{} {route}", request.method())
        }),
        None => Err(body),
    };
    Ok(response.map_body(|_, body| match watch(body) {
        Ok(watched) => EitherBody::right(watched),
        Err(body) => EitherBody::left(body),
    }))
}
