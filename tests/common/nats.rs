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

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
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

    async fn start(count: usize) -> Nats {
        let dir = tempfile::tempdir().unwrap();
        let routes: Vec<u16> = (0..count).map(|_| free_port()).collect();
        let mut servers = Vec::new();
        for (i, route) in routes.iter().enumerate() {
            let (port, http) = (free_port(), free_port());
            let store = dir.path().join(format!("n{i}"));
            let mut config = format!(
                "server_name: n{i}\nlisten: 127.0.0.1:{port}\nhttp: 127.0.0.1:{http}\nmax_payload: 8MB\n\
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
        let mut nats = Nats { servers, dir };
        for i in 0..count {
            nats.spawn(i);
        }
        for i in 0..count {
            nats.ready(i).await;
        }
        nats
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
    /// metadata leader).
    async fn ready(&self, i: usize) {
        let server = &self.servers[i];
        let deadline = Instant::now() + Duration::from_secs(30);
        let client = reqwest::Client::new();
        loop {
            let jsz = client.get(format!("http://127.0.0.1:{}/jsz", server.http)).send().await;
            if let Ok(response) = jsz {
                let body: serde_json::Value = response.json().await.unwrap_or_default();
                let clustered = self.servers.len() > 1;
                let leader = body["meta_cluster"]["leader"].as_str().is_some_and(|l| !l.is_empty());
                if body["config"].is_object() && (!clustered || leader) {
                    return;
                }
            }
            assert!(
                Instant::now() < deadline,
                "nats-server {i} is not ready: {}",
                std::fs::read_to_string(&server.log).unwrap_or_default()
            );
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

    /// Kills server `i` with SIGKILL.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.servers[i].child.take() {
            child.kill().unwrap();
            child.wait().unwrap();
        }
    }

    /// Starts server `i` again on its store dir.
    pub async fn restart(&mut self, i: usize) {
        self.spawn(i);
        self.ready(i).await;
    }
}

/// A JetStream log on these servers (one replica), as a node opens it.
pub async fn open_log(nats: &Nats) -> turnlog::store::jetstream::JetStreamLog {
    use turnlog::store::jetstream::{Credentials, JetStreamConfig, JetStreamLog};
    let config = JetStreamConfig {
        servers: nats.urls(),
        replicas: 1,
        stream: "EVENTS".into(),
        prefix: "t".into(),
        projections_bucket: "projections".into(),
        credentials: Credentials::None,
        connect_timeout: Duration::from_secs(5),
        max_events_per_session: 1_000_000,
        bus_capacity: 256,
        max_batch_bytes: 1 << 20,
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
