//! Debian's `nats-server` (2.9) for tests: one server, or a cluster of three, on free
//! loopback ports, each with its own store dir; killed when dropped. `scripts/test`
//! installs the package; a test that cannot find it fails and says so.

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Nats {
    pub servers: Vec<Server>,
    dir: tempfile::TempDir,
}

pub struct Server {
    child: Option<Child>,
    pub port: u16,
    http: u16,
    config: PathBuf,
    log: PathBuf,
}

fn binary() -> PathBuf {
    if let Ok(path) = std::env::var("NATS_SERVER") {
        return PathBuf::from(path);
    }
    let found = std::env::var("PATH")
        .unwrap_or_default()
        .split(':')
        .chain(["/usr/sbin", "/usr/local/sbin", "/usr/bin"])
        .map(|dir| PathBuf::from(dir).join("nats-server"))
        .find(|path| path.is_file());
    found.expect("nats-server not found: `scripts/test` installs Debian's nats-server package (or set NATS_SERVER)")
}

/// A port that is free now, chosen below Linux's ephemeral range (32768 and up), so that the
/// outgoing connections of other tests running at the same time cannot take it before
/// nats-server binds it. Another test may still pick the same one: `start` and `restart`
/// try again when a server finds its port taken.
fn free_port() -> u16 {
    use rand::Rng;
    loop {
        let port = rand::rng().random_range(10_000..32_000);
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

/// How many times a server is started again after it found its port taken.
const ATTEMPTS: usize = 5;

enum NotReady {
    /// The server exited because one of its ports was in use: worth another try.
    PortTaken,
    Failed(String),
}

impl Nats {
    /// One server with JetStream.
    pub async fn single() -> Nats {
        Nats::start(1).await
    }

    /// Three servers in one cluster, each with JetStream: streams with three replicas.
    pub async fn cluster() -> Nats {
        Nats::start(3).await
    }

    /// One server as it comes, with NATS's default `max_payload` (1 MB).
    #[allow(dead_code)] // Only the cluster tests start one.
    pub async fn stock() -> Nats {
        Nats::start_with(1, None).await
    }

    async fn start(count: usize) -> Nats {
        Nats::start_with(count, Some("8MB")).await
    }

    async fn start_with(count: usize, max_payload: Option<&str>) -> Nats {
        for _ in 1..ATTEMPTS {
            let mut nats = Nats::configure(count, max_payload);
            match nats.all_ready().await {
                Ok(()) => return nats,
                Err(NotReady::PortTaken) => continue,
                Err(NotReady::Failed(why)) => panic!("{why}"),
            }
        }
        let mut nats = Nats::configure(count, max_payload);
        if let Err(NotReady::Failed(why)) = nats.all_ready().await {
            panic!("{why}");
        }
        nats
    }

    async fn all_ready(&mut self) -> Result<(), NotReady> {
        for i in 0..self.servers.len() {
            self.spawn(i);
        }
        for i in 0..self.servers.len() {
            self.ready(i).await?;
        }
        Ok(())
    }

    /// Fresh ports and store dirs for `count` servers, none started yet.
    fn configure(count: usize, max_payload: Option<&str>) -> Nats {
        let dir = tempfile::tempdir().unwrap();
        let routes: Vec<u16> = (0..count).map(|_| free_port()).collect();
        let mut servers = Vec::new();
        for (i, route) in routes.iter().enumerate() {
            let (port, http) = (free_port(), free_port());
            let store = dir.path().join(format!("n{i}"));
            let max_payload = max_payload.map(|max| format!("max_payload: {max}\n")).unwrap_or_default();
            let mut config = format!(
                "server_name: n{i}\nlisten: 127.0.0.1:{port}\nhttp: 127.0.0.1:{http}\n{max_payload}\
                 jetstream {{ store_dir: {store:?} }}\n"
            );
            if count > 1 {
                let others: Vec<String> = routes.iter().map(|r| format!("nats-route://127.0.0.1:{r}")).collect();
                config += &format!(
                    "cluster {{ name: turnlog, listen: 127.0.0.1:{route}, routes: [{}] }}\n",
                    others.join(", ")
                );
            }
            let path = dir.path().join(format!("n{i}.conf"));
            std::fs::write(&path, config).unwrap();
            let log = dir.path().join(format!("n{i}.log"));
            servers.push(Server { child: None, port, http, config: path, log });
        }
        Nats { servers, dir }
    }

    fn spawn(&mut self, i: usize) {
        let server = &mut self.servers[i];
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&server.log).unwrap();
        let child = Command::new(binary())
            .arg("-c")
            .arg(&server.config)
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .expect("nats-server starts");
        server.child = Some(child);
    }

    /// Waits until server `i` answers that JetStream is ready (with a cluster: that it has a
    /// metadata leader), or finds that it exited.
    async fn ready(&mut self, i: usize) -> Result<(), NotReady> {
        let clustered = self.servers.len() > 1;
        let server = &mut self.servers[i];
        let deadline = Instant::now() + Duration::from_secs(30);
        let client = reqwest::Client::new();
        let (http, port) = (server.http, server.port);
        let monitor = |path: &str| {
            let request = client.get(format!("http://127.0.0.1:{http}/{path}")).send();
            async move { request.await.ok()?.json::<serde_json::Value>().await.ok() }
        };
        loop {
            let log = || std::fs::read_to_string(&server.log).unwrap_or_default();
            let exited = server.child.as_mut().is_some_and(|child| child.try_wait().unwrap().is_some());
            if let (false, Some(jsz)) = (exited, monitor("jsz").await) {
                let leader = jsz["meta_cluster"]["leader"].as_str().is_some_and(|l| !l.is_empty());
                // This server's own monitor, not another's that took the same free port.
                let ours = monitor("varz").await.is_some_and(|varz| varz["port"] == port);
                if ours && jsz["config"].is_object() && (!clustered || leader) {
                    return Ok(());
                }
            }
            if exited {
                server.child = None;
                if log().contains("address already in use") {
                    return Err(NotReady::PortTaken);
                }
                return Err(NotReady::Failed(format!("nats-server {i} exited: {}", log())));
            }
            if Instant::now() >= deadline {
                return Err(NotReady::Failed(format!("nats-server {i} is not ready: {}", log())));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub fn urls(&self) -> Vec<String> {
        self.servers.iter().map(|s| format!("nats://127.0.0.1:{}", s.port)).collect()
    }

    /// The servers as a TOML array, for `store.jetstream.servers`.
    pub fn toml_servers(&self) -> String {
        let urls: Vec<String> = self.urls().iter().map(|u| format!("{u:?}")).collect();
        format!("[{}]", urls.join(", "))
    }

    /// The server (its index) that leads `stream` now: the one whose death makes the
    /// stream fail over.
    #[allow(dead_code)] // Not every test binary that includes this kills a leader.
    pub async fn stream_leader(&self, stream: &str) -> usize {
        let client = async_nats::connect(self.urls()[0].as_str()).await.expect("connecting to nats-server");
        let mut stream = async_nats::jetstream::new(client).get_stream(stream).await.expect("the stream exists");
        let info = stream.info().await.expect("the stream's info");
        let leader = info.cluster.as_ref().and_then(|cluster| cluster.leader.clone()).expect("a leader");
        leader.strip_prefix('n').and_then(|n| n.parse().ok()).expect("servers are named n0, n1, ...")
    }

    /// Whether every stream (the key-value buckets' too) has a leader and `replicas`
    /// replicas, all current and online: a server started again has caught up, so another
    /// may die without any stream losing its quorum. False while no server answers.
    #[allow(dead_code)] // Only the cluster soak waits for this.
    pub async fn all_current(&self, replicas: usize) -> bool {
        use futures_util::StreamExt;
        let live: Vec<String> =
            self.servers.iter().filter(|s| s.child.is_some()).map(|s| format!("nats://127.0.0.1:{}", s.port)).collect();
        let Ok(client) = async_nats::connect(live).await else { return false };
        let js = async_nats::jetstream::new(client);
        let mut streams = js.streams();
        let mut any = false;
        while let Some(info) = streams.next().await {
            let Ok(info) = info else { return false };
            let Some(cluster) = info.cluster else { return false };
            let peers = &cluster.replicas;
            if cluster.leader.is_none() || peers.len() + 1 != replicas || peers.iter().any(|p| !p.current || p.offline)
            {
                return false;
            }
            any = true;
        }
        any
    }

    /// Kills server `i` with SIGKILL.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.servers[i].child.take() {
            child.kill().unwrap();
            child.wait().unwrap();
        }
    }

    /// Starts server `i` again on its store dir and ports. A port released by the kill may
    /// be held for a moment by another test's server starting up; then this waits and tries
    /// again.
    pub async fn restart(&mut self, i: usize) {
        for attempt in 1..=ATTEMPTS {
            self.spawn(i);
            match self.ready(i).await {
                Ok(()) => return,
                Err(NotReady::PortTaken) if attempt < ATTEMPTS => {
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                Err(NotReady::PortTaken) => panic!("nats-server {i}: its port stayed taken"),
                Err(NotReady::Failed(why)) => panic!("{why}"),
            }
        }
    }
}

/// A JetStream log on these servers (one replica), as a node opens it.
pub async fn open_log(nats: &Nats) -> turnlog::store::jetstream::JetStreamLog {
    open_log_with(nats, 1).await
}

/// A log whose stream has `replicas` replicas (3 needs [`Nats::cluster`]).
pub async fn open_log_with(nats: &Nats, replicas: usize) -> turnlog::store::jetstream::JetStreamLog {
    use turnlog::store::jetstream::{Credentials, JetStreamConfig, JetStreamLog};
    let config = JetStreamConfig {
        servers: nats.urls(),
        replicas,
        stream: "EVENTS".into(),
        prefix: "t".into(),
        projections_bucket: "projections".into(),
        credentials: Credentials::None,
        connect_timeout: Duration::from_secs(5),
        max_events_per_session: 1_000_000,
        bus_capacity: 256,
        max_batch_bytes: 1 << 20,
        failover_wait: Duration::from_secs(20),
        claims_bucket: "claims".into(),
        claims_max_age: Duration::from_secs(3600),
    };
    JetStreamLog::open(config, turnlog::projection::all()).await.expect("the log opens")
}

impl Drop for Nats {
    fn drop(&mut self) {
        for i in 0..self.servers.len() {
            self.kill(i);
        }
    }
}
