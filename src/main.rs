//! The `turnlog` binary: parse the command line, load settings, and run.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};
use turnlog::{Application, Settings};

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
