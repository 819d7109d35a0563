//! The binary's subcommands, each a function `main` calls with what clap read ([`args`]):
//! [`serve::run`] (the service), [`acp::run`] (an ACP agent on stdio), [`hash_key`], and
//! the operators' commands: `export`, `import` and `verify` of logs with their hash chains
//! ([`audit`]), `tail` of a session in the terminal, and `replay` of one at its original
//! pace ([`follow`]). Each operator's command works on a data dir (a running server holds
//! its lock; only `import` writes to one) or through a server's HTTP API
//! ([`crate::client`]). Exit status: 0 all well, 1 the chain or the data is wrong, 2 bad
//! input (a missing file, a malformed line, an unknown session, a refused call).

pub mod acp;
pub mod args;
pub mod audit;
pub mod follow;
pub mod serve;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::client::ClientError;
use crate::store::sled::{SledConfig, SledLog};
use crate::Settings;
use args::ServeArgs;

/// `turnlog hash-key KEY`: prints the SHA-256 of an API key, for `[[auth.keys]]`.
pub fn hash_key(key: &str) {
    println!("{}", crate::api::auth::hash_key(key));
}

/// The settings: `config/default.toml`, the `--config` file and the environment, then the
/// flags over them.
pub fn settings(args: &ServeArgs) -> anyhow::Result<Settings> {
    let mut settings = Settings::load(args.config.as_deref())?;
    if let Some(addr) = &args.addr {
        settings.server.addr = addr.clone();
    }
    if let Some(dir) = &args.data_dir {
        settings.server.data_dir = dir.clone();
    }
    settings.validate()?;
    Ok(settings)
}

/// The data dir an operator's command works on: `--data-dir`, or the config's.
fn data_dir(args: &ServeArgs) -> Result<PathBuf, Failure> {
    match &args.data_dir {
        Some(dir) => Ok(dir.clone()),
        None => settings(args).map(|s| s.server.data_dir).map_err(input),
    }
}

/// Runs the operator's command `name` to its end on a runtime of its own: its exit status,
/// after saying on stderr why it failed, if it did.
fn run(name: &str, command: impl Future<Output = Result<(), Failure>>) -> i32 {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("a runtime");
    match runtime.block_on(command) {
        Ok(()) => 0,
        Err(failure) => {
            eprintln!("turnlog {name}: {failure}");
            failure.code()
        }
    }
}

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

/// A server that could not be reached or refused the call: the command could not do its
/// work.
impl From<ClientError> for Failure {
    fn from(error: ClientError) -> Failure {
        input(error)
    }
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
