//! The server under test: the `turnlog` binary started on 127.0.0.1:0 with a temp data
//! dir, or a server that is already running (`--url`, or one a test started in-process).
//! Also what we read about it from outside: RSS and CPU time from `/proc`, and `/metrics`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{bail, Context};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// Config every started server gets: the harness opens more streams than the default
/// per-subject limit allows.
const SERVER_CONFIG: &str = "[streams]\nmax_streams_per_subject = 1000000\n";

/// How to get a server for a scenario.
#[derive(Debug, Clone)]
pub enum Launcher {
    /// Start this binary, once per scenario, with a fresh data dir under `data_root` and
    /// `extra` (TOML) read over the harness's settings.
    Binary { path: PathBuf, data_root: PathBuf, extra: String },
    /// Use a server that is already running; `pid` (when known) is read for RSS and CPU.
    External { url: String, pid: Option<u32> },
}

/// A running server for one scenario.
pub struct Server {
    pub url: String,
    pub pid: Option<u32>,
    child: Option<Child>,
    dir: Option<tempfile::TempDir>,
}

impl Launcher {
    pub async fn start(&self) -> anyhow::Result<Server> {
        match self {
            Launcher::External { url, pid } => {
                Ok(Server { url: url.trim_end_matches('/').to_string(), pid: *pid, child: None, dir: None })
            }
            Launcher::Binary { path, data_root, extra } => spawn(path, data_root, extra).await,
        }
    }

    pub fn data_root(&self) -> PathBuf {
        match self {
            Launcher::Binary { data_root, .. } => data_root.clone(),
            Launcher::External { .. } => std::env::temp_dir(),
        }
    }
}

async fn spawn(bin: &Path, data_root: &Path, extra: &str) -> anyhow::Result<Server> {
    std::fs::create_dir_all(data_root)?;
    let dir = tempfile::Builder::new()
        .prefix("turnlog-load-")
        .tempdir_in(data_root)
        .context("creating the server's data dir")?;
    let config = dir.path().join("config.toml");
    std::fs::write(&config, format!("{SERVER_CONFIG}{extra}"))?;
    let log = std::fs::File::create(dir.path().join("server.log"))?;
    let mut child = Command::new(bin)
        .args(["serve", "--addr", "127.0.0.1:0", "--config"])
        .arg(&config)
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::from(log))
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    let stdout = child.stdout.take().expect("stdout is piped");
    let mut lines = BufReader::new(stdout).lines();
    let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line()).await;
    let url = match line {
        Ok(Ok(Some(line))) if line.starts_with("listening on ") => line["listening on ".len()..].trim().to_string(),
        _ => {
            let _ = child.start_kill();
            let _ = child.wait().await;
            let log = std::fs::read_to_string(dir.path().join("server.log")).unwrap_or_default();
            bail!("{} did not start: {}", bin.display(), tail(&log, 2000));
        }
    };
    // Keep draining stdout so the server never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Ok(Server { url, pid: child.id(), child: Some(child), dir: Some(dir) })
}

fn tail(text: &str, max: usize) -> &str {
    let mut start = text.len().saturating_sub(max);
    while !text.is_char_boundary(start) {
        start += 1;
    }
    &text[start..]
}

impl Server {
    /// Resident memory in KiB (`VmRSS` of `/proc/<pid>/status`).
    pub fn rss_kib(&self) -> Option<u64> {
        self.pid.and_then(rss_kib)
    }

    /// User plus system CPU time, in seconds.
    pub fn cpu_seconds(&self) -> Option<f64> {
        self.pid.and_then(cpu_seconds)
    }

    /// The end of the server's log, when we started it (for error messages).
    pub fn log_tail(&self) -> String {
        self.dir
            .as_ref()
            .and_then(|d| std::fs::read_to_string(d.path().join("server.log")).ok())
            .map(|log| tail(&log, 2000).to_string())
            .unwrap_or_default()
    }

    /// Whether the server we started is still running (an external one is assumed so).
    pub fn alive(&mut self) -> bool {
        match &mut self.child {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => true,
        }
    }

    pub async fn stop(mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.start_kill();
            let _ = child.wait().await;
        }
    }
}

pub fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|l| l.strip_prefix("VmRSS:"))?.split_whitespace().next()?.parse().ok()
}

/// `utime + stime` from `/proc/<pid>/stat`, in seconds (Linux reports clock ticks of
/// USER_HZ, which is 100 on every architecture it runs on).
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces; the fields we want come after its closing paren.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / 100.0)
}

/// A scrape of `/metrics`: every sample by its full name (with labels).
#[derive(Debug, Clone, Default)]
pub struct Metrics(HashMap<String, f64>);

impl Metrics {
    pub fn parse(text: &str) -> Metrics {
        Metrics(
            text.lines()
                .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
                .filter_map(|l| {
                    let (name, value) = l.rsplit_once(' ')?;
                    Some((name.to_string(), value.parse().ok()?))
                })
                .collect(),
        )
    }

    /// The sum of every sample of `name`, whatever its labels.
    pub fn sum(&self, name: &str) -> f64 {
        self.0
            .iter()
            .filter(|(k, _)| k.strip_prefix(name).is_some_and(|rest| rest.is_empty() || rest.starts_with('{')))
            .map(|(_, v)| v)
            .sum()
    }

    /// `self - earlier` for one metric.
    pub fn delta(&self, earlier: &Metrics, name: &str) -> f64 {
        self.sum(name) - earlier.sum(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_sum_over_labels_only_for_the_exact_name() {
        let m = Metrics::parse(
            "# HELP x\nturnlog_a_total 3\nturnlog_a_total_more 100\nturnlog_b{k=\"1\"} 2\nturnlog_b{k=\"2\"} 5\n",
        );
        assert_eq!(m.sum("turnlog_a_total"), 3.0);
        assert_eq!(m.sum("turnlog_b"), 7.0);
    }

    #[test]
    fn our_own_rss_and_cpu_are_readable() {
        let pid = std::process::id();
        assert!(rss_kib(pid).unwrap() > 0);
        assert!(cpu_seconds(pid).is_some());
    }
}
