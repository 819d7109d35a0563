//! The `turnlog` binary: parse the command line, load settings, and run.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};
use turnlog::{Application, Settings};

/// jemalloc rather than glibc's malloc: the writer and the HTTP thread allocate and free
/// many short-lived buffers (sled's node copies, request bodies, rendered events), and
/// glibc kept handing that memory back to the kernel and faulting it in again.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's options, read before `main`: unused pages go back to the kernel after about a
/// second rather than ten, so that the server's RSS follows what it holds (a burst's
/// buffers, once freed, do not stay counted against it).
/// The symbol is the C `const char *malloc_conf` (prefixed as this build of jemalloc is):
/// one thin pointer to a NUL-terminated string.
#[export_name = "_rjem_malloc_conf"]
static MALLOC_CONF: Option<&u8> = Some(&b"dirty_decay_ms:1000,muzzy_decay_ms:0\0"[0]);

#[derive(Parser)]
#[command(name = "turnlog", version, about = "An event-sourced session service for LLM agents")]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    serve: ServeArgs,
}

#[derive(clap::Args, Clone, Default)]
struct ServeArgs {
    /// Address to listen on (port 0 picks a free port).
    #[arg(long, global = true)]
    addr: Option<String>,
    /// Where the log lives.
    #[arg(long, global = true)]
    data_dir: Option<PathBuf>,
    /// A TOML file read over config/default.toml.
    #[arg(long, global = true)]
    config: Option<PathBuf>,
}

#[derive(Subcommand)]
enum Command {
    /// Run the service (the default).
    Serve,
    /// Print the SHA-256 of an API key, for `[[auth.keys]]`.
    HashKey { key: String },
    /// Be an Agent Client Protocol agent on stdin/stdout (an editor starts it): with
    /// `--server`, a bridge to a running turnlog; without, the engine on `--data-dir`.
    Acp(AcpArgs),
    /// Write sessions as JSON Lines exactly as stored, with their hash chains (all, the
    /// ones named, or those a filter picks), from a data dir or a server.
    Export {
        /// Sessions to export (none: every session, or those the filters pick).
        sessions: Vec<String>,
        #[command(flatten)]
        remote: Remote,
        /// Only sessions of this agent.
        #[arg(long)]
        agent: Option<String>,
        /// Only sessions made by this subject.
        #[arg(long)]
        created_by: Option<String>,
        /// The file to write (standard output by default).
        #[arg(short, long)]
        output: Option<PathBuf>,
    },
    /// Load an export into a data dir or a server; refused if a chain does not verify or a
    /// session exists with other events.
    Import {
        file: PathBuf,
        #[command(flatten)]
        remote: Remote,
    },
    /// Check every chain in an export FILE or in --data-dir; exit 1 at the first broken
    /// link, which it names.
    Verify { file: Option<PathBuf> },
    /// Follow a session in the terminal, across drops and restarts, until it ends.
    Tail {
        session: String,
        #[command(flatten)]
        remote: Remote,
        /// Start after this event (default: the start of the log).
        #[arg(long)]
        after: Option<String>,
        /// Only these event types (comma-separated).
        #[arg(long, value_delimiter = ',')]
        types: Vec<String>,
        /// Print each event's JSON on its own line.
        #[arg(long)]
        json: bool,
    },
    /// Print a session's events again at their original pace.
    Replay {
        session: String,
        #[command(flatten)]
        remote: Remote,
        /// How many times faster than it happened.
        #[arg(long, default_value_t = 1.0)]
        speed: f64,
        /// Start at this event.
        #[arg(long)]
        from: Option<String>,
        /// Only these event types (comma-separated).
        #[arg(long, value_delimiter = ',')]
        types: Vec<String>,
        /// Print each event's JSON on its own line.
        #[arg(long)]
        json: bool,
        /// Re-emit the events into a new session of the server's (printing its id), for any
        /// client of any view to watch, instead of printing them.
        #[arg(long, requires = "server", conflicts_with_all = ["types", "json"])]
        into_session: bool,
    },
}

/// A server to work through instead of a data dir.
#[derive(clap::Args)]
struct Remote {
    /// A running turnlog (`http://127.0.0.1:8787`), instead of a data dir.
    #[arg(long, conflicts_with = "data_dir")]
    server: Option<String>,
    /// Its API key (sent as `Authorization: Bearer`).
    #[arg(long, env = "TURNLOG_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
}

impl Remote {
    fn client(&self) -> Option<turnlog::cli::Client> {
        self.server.as_deref().map(|server| turnlog::cli::Client::new(server, self.api_key.clone()))
    }
}

#[derive(clap::Args)]
struct AcpArgs {
    /// A running turnlog server (`http://127.0.0.1:8787`); sessions live in its log.
    #[arg(long, conflicts_with = "data_dir")]
    server: Option<String>,
    /// The server's API key (sent as `Authorization: Bearer`).
    #[arg(long, env = "TURNLOG_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// The agent new sessions run.
    #[arg(long, default_value = "default")]
    agent: String,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command.unwrap_or(Command::Serve) {
        Command::HashKey { key } => {
            println!("{}", turnlog::api::auth::hash_key(&key));
            Ok(())
        }
        Command::Serve => serve(cli.serve),
        Command::Acp(args) => {
            let code = acp(cli.serve, args);
            // Not waiting for the thread that still blocks reading stdin: the log is closed.
            std::process::exit(code)
        }
        command => std::process::exit(tool(&cli.serve, command)),
    }
}

/// Runs an operator's command; its exit status (see [`turnlog::cli`]).
fn tool(serve: &ServeArgs, command: Command) -> i32 {
    use turnlog::cli::{audit, follow, Failure};
    let name = match &command {
        Command::Export { .. } => "export",
        Command::Import { .. } => "import",
        Command::Verify { .. } => "verify",
        Command::Tail { .. } => "tail",
        _ => "replay",
    };
    let data_dir = || -> Result<PathBuf, Failure> {
        match &serve.data_dir {
            Some(dir) => Ok(dir.clone()),
            None => settings(serve).map(|s| s.server.data_dir).map_err(turnlog::cli::input),
        }
    };
    let source = |remote: &Remote| -> Result<audit::Source, Failure> {
        match remote.client() {
            Some(client) => Ok(audit::Source::Server(client)),
            None => Ok(audit::Source::DataDir(data_dir()?)),
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("a runtime");
    let result: Result<(), Failure> = runtime.block_on(async {
        match command {
            Command::Export { sessions, remote, agent, created_by, output } => {
                let selection = audit::Selection { sessions, agent, created_by };
                let source = source(&remote)?;
                match output {
                    None => {
                        let mut out = std::io::stdout().lock();
                        audit::export(&source, &selection, &mut out).await?;
                    }
                    // Written aside and renamed once whole, so a failed export leaves no file.
                    Some(path) => {
                        let mut aside = path.clone().into_os_string();
                        aside.push(".partial");
                        let aside = PathBuf::from(aside);
                        let mut file = std::fs::File::create(&aside)
                            .map_err(|e| Failure::Input(format!("{}: {e}", aside.display())))?;
                        let written = audit::export(&source, &selection, &mut file).await;
                        if written.is_err() {
                            let _ = std::fs::remove_file(&aside);
                        }
                        let count = written?;
                        std::fs::rename(&aside, &path).map_err(turnlog::cli::input)?;
                        eprintln!("turnlog export: {count} sessions to {}", path.display());
                    }
                }
                Ok(())
            }
            Command::Import { file, remote } => {
                for (session, imported) in audit::import(&source(&remote)?, &file).await? {
                    let said = match imported {
                        turnlog::audit::import::Imported::New { events } => format!("imported, {events} events"),
                        turnlog::audit::import::Imported::Unchanged { events } => {
                            format!("already there, the same {events} events")
                        }
                    };
                    eprintln!("turnlog import: {session}: {said}");
                }
                Ok(())
            }
            Command::Verify { file } => {
                let dir = if file.is_none() { Some(data_dir()?) } else { None };
                let checked = audit::verify(file.as_deref(), dir.as_deref()).await?;
                let events: u64 = checked.iter().map(|(_, n)| n).sum();
                println!("ok: {} sessions, {events} events, every chain verifies", checked.len());
                Ok(())
            }
            Command::Tail { session, remote, after, types, json } => {
                let server = remote.server.clone().unwrap_or_else(|| "http://127.0.0.1:8787".into());
                let client = turnlog::cli::Client::new(&server, remote.api_key.clone());
                let mut printer = follow::Printer::new(std::io::stdout().lock(), json, types);
                follow::tail(&client, &session, after, &mut printer).await
            }
            Command::Replay { session, remote, speed, from, into_session: true, .. } => {
                let client = remote.client().ok_or_else(|| turnlog::cli::input("--into-session needs --server"))?;
                let copy = follow::replay_into(&client, &session, from.as_deref(), speed).await?;
                println!("{copy}");
                Ok(())
            }
            Command::Replay { session, remote, speed, from, types, json, .. } => {
                let from_where = match remote.client() {
                    Some(client) => follow::From::Server(client),
                    None => follow::From::DataDir(data_dir()?),
                };
                let mut printer = follow::Printer::new(std::io::stdout().lock(), json, types);
                follow::replay(&from_where, &session, from.as_deref(), speed, &mut printer).await.map(|_| ())
            }
            _ => unreachable!("not an operator's command"),
        }
    });
    match result {
        Ok(()) => 0,
        Err(failure) => {
            eprintln!("turnlog {name}: {failure}");
            failure.code()
        }
    }
}

/// Serves ACP until stdin closes; the exit status.
fn acp(serve: ServeArgs, args: AcpArgs) -> i32 {
    turnlog::telemetry::init();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("turnlog acp: {error}");
            return 1;
        }
    };
    let result: anyhow::Result<()> = runtime.block_on(async move {
        match args.server {
            Some(server) => {
                let door = turnlog::acp::door::Bridge::new(&server, args.api_key)?;
                turnlog::acp::Acp::new(std::sync::Arc::new(door), args.agent).serve().await?;
            }
            None => {
                let settings = settings(&serve)?;
                let service = std::sync::Arc::new(turnlog::service::Service::open(&settings).await?);
                if service.sessions().agents().get(&args.agent).is_none() {
                    service.shutdown().await.context("closing the log")?;
                    anyhow::bail!("no agent named {:?} (--agent) in the config", args.agent);
                }
                let door = turnlog::acp::door::Embedded::new(service.clone());
                let served = turnlog::acp::Acp::new(std::sync::Arc::new(door), args.agent).serve().await;
                service.shutdown().await.context("closing the log")?;
                served?;
            }
        }
        Ok(())
    });
    match result {
        Ok(()) => 0,
        Err(error) => {
            tracing::error!("turnlog acp: {error:#}");
            1
        }
    }
}

fn settings(args: &ServeArgs) -> anyhow::Result<Settings> {
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

fn serve(args: ServeArgs) -> anyhow::Result<()> {
    turnlog::telemetry::init();
    let settings = settings(&args)?;
    actix_web::rt::System::new().block_on(async move {
        let app = Application::build(settings).await.context("starting turnlog")?;
        println!("listening on http://{}", app.addr());
        std::io::stdout().flush()?;
        app.run_until_stopped().await.context("serving")
    })
}
