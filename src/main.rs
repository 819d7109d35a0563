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
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command.unwrap_or(Command::Serve) {
        Command::HashKey { key } => {
            println!("{}", turnlog::api::auth::hash_key(&key));
            Ok(())
        }
        Command::Serve => serve(cli.serve),
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
