//! Several nodes on one JetStream log: the NATS side of [`crate::engine::cluster`].
//!
//! A session's lease is an entry of a key-value bucket whose values expire after the
//! lease's time to live (the bucket's `max_age`): a node takes it with a create that fails
//! if the key exists, renews it with a revision-checked update every third of the time to
//! live, and gives it up with a revision-checked delete. A node that dies stops renewing,
//! and the entry expires. Commands for a session go to its holder as NATS requests on
//! `<prefix>.node.<node>`; no answerer means the node is gone.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, kv};
use bytes::Bytes;
use futures_util::StreamExt;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::domain::SessionId;
use crate::engine::cluster::{Claim, Cluster, ForwardError, Forwarded, Lease};
use crate::error::SessionError;
use crate::metrics;
use crate::store::jetstream::patiently;
use crate::store::StoreError;

pub struct NatsCluster {
    client: async_nats::Client,
    leases: kv::Store,
    node: String,
    prefix: String,
    ttl: Duration,
    /// How long a request to the engine is sent again while it fails over.
    wait: Duration,
}

/// How long a forwarded command waits for its answer, beyond the time its node may spend
/// waiting out an engine's election.
const FORWARD_WAIT: Duration = Duration::from_secs(10);

fn unavailable(context: &str, error: impl std::fmt::Display) -> SessionError {
    SessionError::Unavailable(format!("{context}: {error}"))
}

impl NatsCluster {
    /// Opens (or makes) the leases bucket; refuses one made with another time to live,
    /// since nodes must agree on when a lease expires.
    pub async fn open(
        js: &jetstream::Context,
        client: async_nats::Client,
        settings: &crate::config::JetStreamSettings,
        node: String,
    ) -> Result<NatsCluster, StoreError> {
        let ttl = Duration::from_secs(settings.lease_ttl_secs);
        let bucket = &settings.leases_bucket;
        let (leases, status) = crate::store::jetstream::when_ready(|| async {
            let leases = crate::store::jetstream::open_bucket(js, bucket, ttl, settings.replicas).await?;
            let status = leases
                .status()
                .await
                .map_err(|e| StoreError::unavailable(format!("the leases bucket {bucket}: {e}")))?;
            Ok((leases, status))
        })
        .await?;
        if status.max_age() != ttl {
            return Err(StoreError::new(format!(
                "the leases bucket {bucket} expires entries after {:?}, and this node's store.jetstream.lease_ttl_secs \
                 is {}: all nodes must use the same",
                status.max_age(),
                settings.lease_ttl_secs
            )));
        }
        let wait = Duration::from_millis(settings.failover_wait_ms);
        Ok(NatsCluster { client, leases, node, prefix: settings.prefix.clone(), ttl, wait })
    }

    fn subject(&self, node: &str) -> String {
        format!("{}.node.{node}", self.prefix)
    }

    fn lease(&self, session: SessionId, revision: u64) -> Box<dyn Lease> {
        metrics::LEASE_CHANGES.with_label_values(&["acquired"]).inc();
        let lost = CancellationToken::new();
        let stop = CancellationToken::new();
        let key = session.ulid().to_string();
        let renewal =
            renew(self.leases.clone(), key.clone(), self.node.clone(), revision, self.ttl, lost.clone(), stop.clone());
        let task = tokio::spawn(renewal);
        Box::new(NatsLease { leases: self.leases.clone(), key, lost, stop, task: Some(task) })
    }
}

/// Renews the lease every third of its time to live until stopped. It is lost if another
/// node took it, or when it may have expired: a time to live after the last renewal that
/// succeeded was sent (less a margin), whatever a renewal in flight is doing.
async fn renew(
    leases: kv::Store,
    key: String,
    node: String,
    mut revision: u64,
    ttl: Duration,
    lost: CancellationToken,
    stop: CancellationToken,
) -> u64 {
    let mut every = tokio::time::interval(ttl / 3);
    every.tick().await;
    let margin = ttl / 5;
    // The lease was taken just before this started.
    let mut valid_until = tokio::time::Instant::now() + ttl - margin;
    let expired = |revision| {
        tracing::warn!(session = %key, "this node could not renew its lease in time");
        lost.cancel();
        revision
    };
    // After a failed renewal (the bucket electing a leader, say), the next try comes soon,
    // not a third of the time to live later.
    let mut again = false;
    // When the first renewal not yet confirmed was sent: one whose answer was lost may have
    // landed then, and the entry expires a time to live after it.
    let mut unconfirmed: Option<tokio::time::Instant> = None;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return revision,
            _ = tokio::time::sleep_until(valid_until) => return expired(revision),
            _ = every.tick(), if !again => {}
            _ = tokio::time::sleep(RETRY), if again => {}
        }
        let sent = tokio::time::Instant::now();
        let first = *unconfirmed.get_or_insert(sent);
        let renewal = tokio::select! {
            _ = stop.cancelled() => return revision,
            _ = tokio::time::sleep_until(valid_until) => return expired(revision),
            renewal = renew_once(&leases, &key, &node, revision) => renewal,
        };
        again = match renewal {
            Renewal::Renewed(next) => {
                revision = next;
                valid_until = sent + ttl - margin;
                unconfirmed = None;
                metrics::LEASE_CHANGES.with_label_values(&["renewed"]).inc();
                false
            }
            // An earlier renewal landed unanswered, when is not known: the lease holds for
            // a time to live after the earliest it can have been sent, and is renewed
            // again at once to be sure of more.
            Renewal::Landed(next) => {
                revision = next;
                valid_until = valid_until.max(first + ttl - margin);
                unconfirmed = None;
                true
            }
            Renewal::Taken => {
                tracing::warn!(session = %key, "another node took this node's lease");
                lost.cancel();
                return revision;
            }
            Renewal::Failed => true,
        };
    }
}

/// What one renewal found.
enum Renewal {
    /// This renewal is stored: the lease is this node's, at this revision.
    Renewed(u64),
    /// An earlier renewal, unanswered, was stored: the lease is this node's, at this revision.
    Landed(u64),
    Taken,
    /// No answer to go by (the bucket electing a leader, say): try again.
    Failed,
}

/// One revision-checked update of the lease. One refused for its revision may have lost
/// only its answer (an update answered into a leader election had landed): the entry is
/// read back, and the lease is still this node's if it names this node.
async fn renew_once(leases: &kv::Store, key: &str, node: &str, revision: u64) -> Renewal {
    let error = match leases.update(key, Bytes::from(node.to_string()), revision).await {
        Ok(next) => return Renewal::Renewed(next),
        Err(error) if error.kind() == kv::UpdateErrorKind::WrongLastRevision => error,
        Err(error) => {
            tracing::warn!(%error, session = %key, "could not renew a lease; trying again");
            return Renewal::Failed;
        }
    };
    match leases.entry(key).await {
        Ok(Some(entry)) if entry.operation == kv::Operation::Put && entry.value == node.as_bytes() => {
            tracing::info!(session = %key, "a renewal had landed unanswered; the lease is still this node's");
            Renewal::Landed(entry.revision)
        }
        Ok(_) => Renewal::Taken,
        Err(read) => {
            tracing::warn!(%error, %read, session = %key, "could not read a lease back; trying again");
            Renewal::Failed
        }
    }
}

/// How soon a renewal that failed is tried again.
const RETRY: Duration = Duration::from_millis(200);

struct NatsLease {
    leases: kv::Store,
    key: String,
    lost: CancellationToken,
    stop: CancellationToken,
    task: Option<tokio::task::JoinHandle<u64>>,
}

impl Drop for NatsLease {
    fn drop(&mut self) {
        // Given up without a release: it expires.
        self.stop.cancel();
    }
}

#[async_trait::async_trait]
impl Lease for NatsLease {
    fn lost(&self) -> CancellationToken {
        self.lost.clone()
    }

    async fn release(mut self: Box<Self>) {
        self.stop.cancel();
        let Some(task) = self.task.take() else { return };
        let Ok(revision) = task.await else { return };
        if self.lost.is_cancelled() {
            return;
        }
        match self.leases.delete_expect_revision(&self.key, Some(revision)).await {
            Ok(()) => metrics::LEASE_CHANGES.with_label_values(&["released"]).inc(),
            Err(error) => tracing::warn!(%error, session = %self.key, "could not give a lease up; it expires"),
        }
    }
}

#[async_trait::async_trait]
impl Cluster for NatsCluster {
    fn node(&self) -> &str {
        &self.node
    }

    fn lease_ttl(&self) -> Duration {
        self.ttl
    }

    async fn claim(&self, session: SessionId) -> Result<Claim, SessionError> {
        let key = session.ulid().to_string();
        for _ in 0..4 {
            let exists = |e: &kv::CreateError| e.kind() == kv::CreateErrorKind::AlreadyExists;
            let created =
                patiently(self.wait, "a lease", || self.leases.create(&key, Bytes::from(self.node.clone())), exists)
                    .await;
            match created {
                Ok(revision) => return Ok(Claim::Mine(self.lease(session, revision))),
                Err(error) if error.kind() == kv::CreateErrorKind::AlreadyExists => {}
                Err(error) => return Err(unavailable("could not take a session's lease", error)),
            }
            let entry = patiently(self.wait, "a lease", || self.leases.entry(&key), |_| false)
                .await
                .map_err(|e| unavailable("could not read a lease", e))?;
            let Some(entry) = entry.filter(|entry| entry.operation == kv::Operation::Put) else { continue };
            let holder = String::from_utf8_lossy(&entry.value).into_owned();
            if holder != self.node {
                return Ok(Claim::Theirs(holder));
            }
            // This node's own, from an actor that has just stopped or from before a restart.
            if let Ok(revision) = self.leases.update(&key, entry.value.clone(), entry.revision).await {
                metrics::LEASE_CHANGES.with_label_values(&["taken_back"]).inc();
                return Ok(Claim::Mine(self.lease(session, revision)));
            }
        }
        Err(SessionError::Unavailable(format!("session {session}'s lease keeps changing hands; try again")))
    }

    async fn holder(&self, session: SessionId) -> Result<Option<String>, SessionError> {
        let key = session.ulid().to_string();
        let entry = patiently(self.wait, "a lease", || self.leases.entry(&key), |_| false)
            .await
            .map_err(|e| unavailable("a lease", e))?;
        Ok(entry
            .filter(|entry| entry.operation == kv::Operation::Put)
            .map(|entry| String::from_utf8_lossy(&entry.value).into_owned()))
    }

    async fn forward(&self, node: &str, request: Bytes) -> Result<Bytes, ForwardError> {
        // The node that holds the session may itself wait out an election, twice (an append
        // and the read of its fate): the client's own request timeout (10 s) is too short.
        let wait = FORWARD_WAIT + 2 * self.wait;
        let request = async_nats::Request::new().payload(request).timeout(Some(wait));
        let asked = self.client.send_request(self.subject(node), request);
        match tokio::time::timeout(wait + Duration::from_secs(1), asked).await {
            Ok(Ok(message)) => Ok(message.payload),
            Ok(Err(error)) if error.kind() == async_nats::RequestErrorKind::NoResponders => Err(ForwardError::Gone),
            Ok(Err(error)) => Err(ForwardError::Failed(error.to_string())),
            Err(_) => Err(ForwardError::Failed(format!("no answer in {wait:?}"))),
        }
    }

    async fn serve(&self) -> Result<mpsc::Receiver<Forwarded>, SessionError> {
        let subject = self.subject(&self.node);
        let mut requests =
            self.client.subscribe(subject).await.map_err(|e| unavailable("could not take forwarded commands", e))?;
        let (sender, receiver) = mpsc::channel(1024);
        let client = self.client.clone();
        tokio::spawn(async move {
            while let Some(message) = requests.next().await {
                let Some(reply) = message.reply else { continue };
                let (answer, answered) = oneshot::channel::<Bytes>();
                if sender.send((message.payload, answer)).await.is_err() {
                    return;
                }
                let client = client.clone();
                tokio::spawn(async move {
                    if let Ok(answer) = answered.await {
                        if let Err(error) = client.publish(reply, answer).await {
                            tracing::warn!(%error, "could not answer a forwarded command");
                        }
                    }
                });
            }
        });
        Ok(receiver)
    }
}

/// Opens the log on JetStream and the cluster on the same connection.
pub async fn open(
    settings: &crate::config::Settings,
) -> Result<(crate::store::jetstream::JetStreamLog, Arc<NatsCluster>), StoreError> {
    let js = &settings.store.jetstream;
    let credentials = js.credentials().map_err(StoreError::new)?;
    let config = crate::store::jetstream::JetStreamConfig {
        servers: js.servers.clone(),
        replicas: js.replicas,
        stream: js.stream.clone(),
        prefix: js.prefix.clone(),
        projections_bucket: js.projections_bucket.clone(),
        credentials,
        connect_timeout: Duration::from_millis(js.connect_timeout_ms),
        max_events_per_session: settings.limits.max_events_per_session,
        bus_capacity: settings.streams.bus_capacity,
        max_batch_bytes: settings.server.max_body_bytes,
        failover_wait: Duration::from_millis(js.failover_wait_ms),
        claims_bucket: js.claims_bucket.clone(),
        claims_max_age: Duration::from_secs(settings.engine.idempotency_hours.max(1) * 3600),
    };
    let log = crate::store::jetstream::JetStreamLog::open(config, crate::projection::all()).await?;
    let node = js.node.clone().unwrap_or_else(|| format!("node-{}", ulid::Ulid::new()));
    let cluster = NatsCluster::open(&log.context(), log.client(), js, node).await?;
    Ok((log, Arc::new(cluster)))
}
