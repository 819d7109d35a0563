//! The operators' commands: `export`, `import` and `verify` of logs with their hash chains,
//! `tail` of a session in the terminal, and `replay` of one at its original pace. Each works
//! on a data dir (a running server holds its lock; only `import` writes to one) or through
//! a server's HTTP API. Exit status: 0 all well, 1 the chain or the data is wrong,
//! 2 bad input (a missing file, a malformed line, an unknown session, a refused call).

pub mod audit;
pub mod follow;

use std::path::Path;
use std::sync::Arc;

use crate::store::sled::{SledConfig, SledLog};

/// A failure, with the exit status it calls for.
#[derive(Debug, thiserror::Error)]
pub enum Failure {
    /// What was checked is wrong (a broken chain, a refused import).
    #[error("{0}")]
    Wrong(String),
    /// The command could not do its work (bad input, an unreachable server).
    #[error("{0}")]
    Input(String),
}

impl Failure {
    pub fn code(&self) -> i32 {
        match self {
            Failure::Wrong(_) => 1,
            Failure::Input(_) => 2,
        }
    }
}

pub fn input(error: impl std::fmt::Display) -> Failure {
    Failure::Input(error.to_string())
}

/// The log in `dir`: to `write` (an import; made if it is not there), opened as the server
/// opens it; else only to read, changing none of its events (see [`SledLog::open_to_read`]).
pub fn open_data_dir(dir: &Path, write: bool) -> Result<Arc<SledLog>, Failure> {
    if !write && !dir.exists() {
        return Err(Failure::Input(format!("no data dir at {}", dir.display())));
    }
    let config = SledConfig { path: Some(dir.to_path_buf()), ..SledConfig::default() };
    let projections = crate::projection::all();
    let opened = if write { SledLog::open(config, projections) } else { SledLog::open_to_read(config, projections) };
    opened.map(Arc::new).map_err(|e| {
        Failure::Input(format!(
            "could not open the log in {} (is a server running on it? use --server): {e}",
            dir.display()
        ))
    })
}

/// An HTTP client for a server's API, with its key.
pub struct Client {
    pub base: String,
    key: Option<String>,
    http: reqwest::Client,
}

impl Client {
    pub fn new(base: &str, key: Option<String>) -> Client {
        Client { base: base.trim_end_matches('/').to_string(), key, http: reqwest::Client::new() }
    }

    pub fn get(&self, path: &str) -> reqwest::RequestBuilder {
        self.auth(self.http.get(format!("{}{path}", self.base)))
    }

    pub fn post(&self, path: &str) -> reqwest::RequestBuilder {
        self.auth(self.http.post(format!("{}{path}", self.base)))
    }

    fn auth(&self, request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.key {
            Some(key) => request.bearer_auth(key),
            None => request,
        }
    }

    /// The answer's body if it succeeded; else the server's error message, as a failure.
    pub async fn ok(&self, request: reqwest::RequestBuilder) -> Result<reqwest::Response, Failure> {
        let response = request.send().await.map_err(|e| Failure::Input(format!("{}: {e}", self.base)))?;
        if response.status().is_success() {
            return Ok(response);
        }
        let status = response.status();
        let body: serde_json::Value = response.json().await.unwrap_or_default();
        let message = body["error"]["message"].as_str().unwrap_or("no message").to_string();
        Err(Failure::Input(format!("the server answered {status}: {message}")))
    }
}

/// A progress bar on stderr when it is a terminal (count, rate, ETA); nothing otherwise.
pub fn progress(len: u64, what: &str) -> indicatif::ProgressBar {
    use std::io::IsTerminal;
    if !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let style = indicatif::ProgressStyle::with_template(&format!(
        "{{bar:30}} {{pos}}/{{len}} {what} · {{per_sec}} · ETA {{eta}}"
    ))
    .expect("a valid template");
    indicatif::ProgressBar::new(len).with_style(style)
}
