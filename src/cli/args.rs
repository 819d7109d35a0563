//! The command line, as clap reads it: the service's flags (which every subcommand takes)
//! and one set of arguments per subcommand.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::client::Client;

#[derive(Parser)]
#[command(name = "turnlog", version, about = "An event-sourced session service for LLM agents")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub serve: ServeArgs,
}

#[derive(clap::Args, Clone, Default)]
pub struct ServeArgs {
    /// Address to listen on (port 0 picks a free port).
    #[arg(long, global = true)]
    pub addr: Option<String>,
    /// Where the log lives.
    #[arg(long, global = true)]
    pub data_dir: Option<PathBuf>,
    /// A TOML file read over config/default.toml.
    #[arg(long, global = true)]
    pub config: Option<PathBuf>,
}

#[derive(Subcommand)]
pub enum Command {
    /// Run the service (the default).
    Serve,
    /// Print the SHA-256 of an API key, for `[[auth.keys]]`.
    HashKey { key: String },
    /// Be an Agent Client Protocol agent on stdin/stdout (an editor starts it): with
    /// `--server`, a bridge to a running turnlog; without, the engine on `--data-dir`.
    Acp(AcpArgs),
    /// Write sessions as JSON Lines exactly as stored, with their hash chains (all, the
    /// ones named, or those a filter picks), from a data dir or a server.
    Export(ExportArgs),
    /// Load an export into a data dir or a server; refused if a chain does not verify or a
    /// session exists with other events.
    Import(ImportArgs),
    /// Check every chain in an export FILE or in --data-dir; exit 1 at the first broken
    /// link, which it names.
    Verify(VerifyArgs),
    /// Follow a session in the terminal, across drops and restarts, until it ends.
    Tail(TailArgs),
    /// Print a session's events again at their original pace.
    Replay(ReplayArgs),
}

// The arguments of each subcommand carry no doc comment of their own: the subcommand's
// above is its help.

#[derive(clap::Args)]
pub struct AcpArgs {
    /// A running turnlog server (`http://127.0.0.1:8787`); sessions live in its log.
    #[arg(long, conflicts_with = "data_dir")]
    pub server: Option<String>,
    /// The server's API key (sent as `Authorization: Bearer`).
    #[arg(long, env = "TURNLOG_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// The agent new sessions run.
    #[arg(long, default_value = "default")]
    pub agent: String,
}

#[derive(clap::Args)]
pub struct ExportArgs {
    /// Sessions to export (none: every session, or those the filters pick).
    pub sessions: Vec<String>,
    #[command(flatten)]
    pub remote: Remote,
    /// Only sessions of this agent.
    #[arg(long)]
    pub agent: Option<String>,
    /// Only sessions made by this subject.
    #[arg(long)]
    pub created_by: Option<String>,
    /// The file to write (standard output by default).
    #[arg(short, long)]
    pub output: Option<PathBuf>,
}

#[derive(clap::Args)]
pub struct ImportArgs {
    pub file: PathBuf,
    #[command(flatten)]
    pub remote: Remote,
}

#[derive(clap::Args)]
pub struct VerifyArgs {
    pub file: Option<PathBuf>,
}

#[derive(clap::Args)]
pub struct TailArgs {
    pub session: String,
    #[command(flatten)]
    pub remote: Remote,
    /// Start after this event (default: the start of the log).
    #[arg(long)]
    pub after: Option<String>,
    /// Only these event types (comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub types: Vec<String>,
    /// Print each event's JSON on its own line.
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Args)]
pub struct ReplayArgs {
    pub session: String,
    #[command(flatten)]
    pub remote: Remote,
    /// How many times faster than it happened.
    #[arg(long, default_value_t = 1.0)]
    pub speed: f64,
    /// Start at this event.
    #[arg(long)]
    pub from: Option<String>,
    /// Only these event types (comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub types: Vec<String>,
    /// Print each event's JSON on its own line.
    #[arg(long)]
    pub json: bool,
    /// Re-emit the events into a new session of the server's (printing its id), for any
    /// client of any view to watch, instead of printing them.
    #[arg(long, requires = "server", conflicts_with_all = ["types", "json"])]
    pub into_session: bool,
}

/// A server to work through instead of a data dir.
#[derive(clap::Args)]
pub struct Remote {
    /// A running turnlog (`http://127.0.0.1:8787`), instead of a data dir.
    #[arg(long, conflicts_with = "data_dir")]
    pub server: Option<String>,
    /// Its API key (sent as `Authorization: Bearer`).
    #[arg(long, env = "TURNLOG_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
}

impl Remote {
    /// A client of the server, if one was named.
    pub fn client(&self) -> Option<Client> {
        self.server.as_deref().map(|server| Client::new(server, self.api_key.clone()))
    }
}
