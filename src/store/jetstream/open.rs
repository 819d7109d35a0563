//! Opening the log (connecting, making or checking the stream and the projections'
//! bucket, waiting for a cluster that is not ready yet) and closing it.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, kv, stream};
use dashmap::DashMap;
use parking_lot::Mutex;
use tokio::sync::watch;

use super::mirror::Mirror;
use super::{store_error, Credentials, Inner, JetStreamConfig, JetStreamLog, HEARD};
use crate::store::hub::Hub;
use crate::store::{Projection, StoreError};

/// How long a node that starts waits for JetStream to be ready for it (a fresh cluster
/// electing its leaders takes a few seconds, longer on a loaded machine).
const START_WAIT: Duration = Duration::from_secs(30);

/// `attempt` (a node's start) until it succeeds, fails with anything but the engine out of
/// reach (a configuration that does not fit is refused at once), or [`START_WAIT`] has
/// passed: a cluster that has just started, or lost a server, answers nothing useful until
/// it has elected its leaders.
pub async fn when_ready<T, F: std::future::Future<Output = Result<T, StoreError>>>(
    mut attempt: impl FnMut() -> F,
) -> Result<T, StoreError> {
    let deadline = Instant::now() + START_WAIT;
    loop {
        match attempt().await {
            Ok(value) => return Ok(value),
            Err(error) if error.is_unavailable() && Instant::now() < deadline => {
                tracing::warn!(%error, "JetStream is not ready for this node yet; trying again");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(error) => return Err(error),
        }
    }
}

/// `request` until it succeeds, fails with an answer (`answered`), or `wait` has passed
/// (`store.jetstream.failover_wait_ms`: longer than the engine's elections take).
pub async fn patiently<T, E: std::fmt::Display, F: std::future::Future<Output = Result<T, E>>>(
    wait: Duration,
    what: &str,
    mut request: impl FnMut() -> F,
    answered: impl Fn(&E) -> bool,
) -> Result<T, E> {
    let deadline = Instant::now() + wait;
    let mut pause = Duration::from_millis(50);
    loop {
        match request().await {
            Err(error) if !answered(&error) && Instant::now() < deadline => {
                tracing::debug!(%error, what, "a JetStream request failed; sending it again");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(500));
            }
            result => return result,
        }
    }
}

impl JetStreamLog {
    /// Connects, makes (or checks) the stream and the bucket, brings the projections up to
    /// date and starts following the stream. Fails with a clear reason when the engine
    /// cannot be reached or does not fit the configuration; never falls back to anything.
    pub async fn open(
        config: JetStreamConfig,
        projections: Vec<Arc<dyn Projection>>,
    ) -> Result<JetStreamLog, StoreError> {
        if config.servers.is_empty() {
            return Err(StoreError::new("store.jetstream.servers names no server"));
        }
        if config.replicas != 1 && config.replicas != 3 {
            return Err(StoreError::new(format!("store.jetstream.replicas is {}: it must be 1 or 3", config.replicas)));
        }
        let client = connect(&config).await?;
        let max_payload = client.server_info().max_payload;
        // The batch, its envelopes and framing must fit one message: with a server that
        // takes less, bodies are held to what fits (see [`JetStreamLog::max_batch_bytes`]).
        let needed = config.max_batch_bytes + config.max_batch_bytes / 4 + FRAMING;
        let mut config = config;
        if max_payload < needed {
            let fits = max_payload.saturating_sub(FRAMING) * 4 / 5;
            if fits < MIN_BODY_BYTES {
                return Err(StoreError::new(format!(
                    "the NATS server takes messages of at most {max_payload} bytes (max_payload): too small to \
                     carry a request body of {MIN_BODY_BYTES} bytes; raise max_payload"
                )));
            }
            tracing::warn!(
                max_payload,
                body_bytes = fits,
                configured = config.max_batch_bytes,
                "the NATS server takes smaller messages (max_payload) than server.max_body_bytes needs: request \
                 bodies are held to what one message carries; raise max_payload to take larger ones"
            );
            config.max_batch_bytes = fits;
        }
        let version = client.server_info().version;
        match super::durability(&version) {
            crate::store::Durability::SyncedOnTimer => tracing::warn!(
                version,
                "this nats-server syncs acknowledged appends to disk on its own timer (2 minutes by default; \
                 nats-server 2.10+ can sync each one with `sync_interval: always`): replicas that all lose power \
                 at once can lose acknowledged events (docs/cluster.md, Durability)"
            ),
            _ => {
                tracing::info!(version,
                "acknowledged appends are on disk as the nats-server's `sync_interval` says (`always`: before each \
                 acknowledgement)")
            }
        }
        when_ready(|| JetStreamLog::attach(client.clone(), config.clone(), projections.clone())).await
    }

    /// [`JetStreamLog::open`] once connected.
    async fn attach(
        client: async_nats::Client,
        config: JetStreamConfig,
        projections: Vec<Arc<dyn Projection>>,
    ) -> Result<JetStreamLog, StoreError> {
        let max_payload = client.server_info().max_payload;
        let js = jetstream::new(client.clone());
        let subjects = format!("{}.events.*", config.prefix);
        let stream_config = stream::Config {
            name: config.stream.clone(),
            subjects: vec![subjects.clone()],
            storage: stream::StorageType::File,
            num_replicas: config.replicas,
            max_message_size: max_payload as i32,
            duplicate_window: Duration::from_secs(120),
            allow_direct: true,
            ..Default::default()
        };
        let stream = js
            .get_or_create_stream(stream_config)
            .await
            .map_err(|e| store_error(&format!("could not open the JetStream stream {}", config.stream), e))?;
        let info = stream.cached_info();
        if info.config.subjects != vec![subjects.clone()] || info.config.num_replicas != config.replicas {
            return Err(StoreError::new(format!(
                "the JetStream stream {} exists with subjects {:?} and {} replicas; this node is configured for \
                 {subjects:?} and {}",
                config.stream, info.config.subjects, info.config.num_replicas, config.replicas
            )));
        }
        let (start, messages) = (info.state.last_sequence + 1, info.state.messages);
        let bucket = open_bucket(&js, &config.projections_bucket, Duration::ZERO, config.replicas).await?;
        let claims = open_bucket(&js, &config.claims_bucket, config.claims_max_age, config.replicas).await?;
        let mirror = Mirror::new(&projections);
        let inner = Arc::new(Inner {
            client,
            js,
            stream,
            bucket,
            claims,
            hub: Hub::new(config.bus_capacity),
            config,
            sessions: DashMap::new(),
            projections,
            mirror,
            closed: AtomicBool::new(false),
            tasks: Mutex::new(Vec::new()),
            publishing: watch::channel(0).0,
            seen_open: Mutex::default(),
            heard: Mutex::new(VecDeque::with_capacity(HEARD)),
            behind: Mutex::default(),
        });
        let log = JetStreamLog { inner };
        log.rebuild_if_needed().await?;
        let upto = log.bucket_revision().await?;
        let changes = log.inner.hub.changes_sender();
        let watch = log
            .inner
            .mirror
            .follow(&log.inner.bucket, upto, move |session| {
                let _ = changes.send(session.ulid());
            })
            .await?;
        log.learn_open_turns(messages).await.inspect_err(|_| watch.abort())?;
        let consumer = log.follow(start).await.inspect_err(|_| watch.abort())?;
        log.inner.tasks.lock().extend([watch, consumer]);
        Ok(log)
    }

    /// The client, for the session layer's leases and forwarding over the same connection.
    pub fn client(&self) -> async_nats::Client {
        self.inner.client.clone()
    }

    pub fn context(&self) -> jetstream::Context {
        self.inner.js.clone()
    }

    /// [`Log::close`](crate::store::Log::close): waits a while for the appends in flight,
    /// stops following the stream and flushes the connection.
    pub(super) async fn close_cleanly(&self) -> Result<(), StoreError> {
        self.inner.closed.store(true, Ordering::SeqCst);
        let mut publishing = self.inner.publishing.subscribe();
        let drained = publishing.wait_for(|n| *n == 0);
        if tokio::time::timeout(Duration::from_secs(10), drained).await.is_err() {
            tracing::warn!("appends still in flight to JetStream at close");
        }
        for task in self.inner.tasks.lock().drain(..) {
            task.abort();
        }
        self.inner.client.flush().await.map_err(|e| store_error("flushing the NATS connection", e))?;
        Ok(())
    }

    /// Stops at once, as a crash would: nothing in flight is waited for.
    pub fn close_unclean(&self) {
        self.inner.closed.store(true, Ordering::SeqCst);
        for task in self.inner.tasks.lock().drain(..) {
            task.abort();
        }
    }

    /// Whether the client is connected to a server now.
    pub fn connected(&self) -> bool {
        self.inner.client.connection_state() == async_nats::connection::State::Connected
    }
}

/// Opens (or makes) a key-value bucket keeping one value per key, expiring values after
/// `max_age` (zero: never). The bucket's stream is made as the client's `create_key_value`
/// makes it, without the account query that nats-server 2.9 answers in a form this client
/// does not read, and with one difference: no direct gets. Every bucket here is read to
/// decide a revision-checked write (a lease, a claim, a projection), and a direct get is
/// answered by any replica, a stale one included: one catching up after a restart answers
/// with what it has, and since NATS prefers a responder on the asker's own server, a node
/// whose server is that replica read the same old revision on every try (its claims failed
/// with "keeps changing hands" until the replica caught up). Reads go to the leader.
pub async fn open_bucket(
    js: &jetstream::Context,
    bucket: &str,
    max_age: Duration,
    replicas: usize,
) -> Result<kv::Store, StoreError> {
    let config = stream::Config {
        name: format!("KV_{bucket}"),
        subjects: vec![format!("$KV.{bucket}.>")],
        max_messages_per_subject: 1,
        max_age,
        storage: stream::StorageType::File,
        num_replicas: replicas,
        allow_rollup: true,
        deny_delete: true,
        allow_direct: false,
        discard: stream::DiscardPolicy::New,
        duplicate_window: if max_age.is_zero() {
            Duration::from_secs(120)
        } else {
            max_age.min(Duration::from_secs(120))
        },
        ..Default::default()
    };
    let stream = js
        .get_or_create_stream(config)
        .await
        .map_err(|e| store_error(&format!("could not open the bucket {bucket}"), e))?;
    let made = &stream.cached_info().config;
    if made.allow_direct {
        // Made by an earlier turnlog (or by `create_key_value`).
        let config = stream::Config { allow_direct: false, ..made.clone() };
        js.update_stream(config)
            .await
            .map_err(|e| store_error(&format!("could not turn off direct gets on the bucket {bucket}"), e))?;
    }
    js.get_key_value(bucket).await.map_err(|e| store_error(&format!("could not open the bucket {bucket}"), e))
}

/// What a message carries beside its events (headers, framing), at most.
const FRAMING: usize = 64 * 1024;

/// The smallest request body a node serves with (as `server.max_body_bytes` must be).
const MIN_BODY_BYTES: usize = 1024;

/// How long one request to the engine waits for its answer before it is sent again.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(3);

async fn connect(config: &JetStreamConfig) -> Result<async_nats::Client, StoreError> {
    let mut options = async_nats::ConnectOptions::new()
        .name("turnlog")
        .connection_timeout(config.connect_timeout)
        // A request to a server that died as it was sent is answered by nobody: sent again
        // (patiently) after this, not after the client's default 10 s.
        .request_timeout(Some(REQUEST_TIMEOUT))
        .max_reconnects(None);
    options = match &config.credentials {
        Credentials::None => options,
        Credentials::UserPassword(user, password) => options.user_and_password(user.clone(), password.clone()),
        Credentials::Token(token) => options.token(token.clone()),
        Credentials::CredsFile(path) => options
            .credentials_file(path)
            .await
            .map_err(|e| store_error(&format!("could not read the credentials file {}", path.display()), e))?,
    };
    let servers: Vec<async_nats::ServerAddr> = config
        .servers
        .iter()
        .map(|server| server.parse().map_err(|e| store_error(&format!("the server address {server:?}"), e)))
        .collect::<Result<_, _>>()?;
    let connecting = options.connect(servers);
    match tokio::time::timeout(config.connect_timeout + Duration::from_secs(1), connecting).await {
        Ok(Ok(client)) => Ok(client),
        Ok(Err(error)) => {
            Err(store_error(&format!("could not connect to NATS at {}", config.servers.join(", ")), error))
        }
        Err(_) => Err(StoreError::new(format!("no answer from NATS at {} in time", config.servers.join(", ")))),
    }
}
