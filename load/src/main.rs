//! `turnlog-load`: run one scenario, or all of them, against a server it starts itself (or
//! one on loopback given with `--url`); print a Markdown table, optionally write JSON, and
//! exit non-zero if any correctness check failed.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};
use turnlog_load::report::{self, Report};
use turnlog_load::scenarios::{self, Ctx, Scenario, Size};
use turnlog_load::Launcher;

#[derive(Parser)]
#[command(
    name = "turnlog-load",
    about = "Benchmarks and load scenarios for turnlog; every scenario also checks correctness"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Drive this running server (loopback only) instead of starting one per scenario.
    #[arg(long, global = true)]
    url: Option<String>,
    /// With --url: the server's process id, to read its RSS and CPU time.
    #[arg(long, global = true)]
    server_pid: Option<u32>,
    /// The turnlog binary to start (default: target/release/turnlog, built first).
    #[arg(long, global = true)]
    server_bin: Option<PathBuf>,
    /// Do not run `cargo build --bin turnlog` before starting it.
    #[arg(long, global = true)]
    no_build: bool,
    /// Where the temporary data dirs go (default: the system temp dir).
    #[arg(long, global = true)]
    data_root: Option<PathBuf>,
    /// TOML read over the harness's own settings by every server it starts: e.g. a
    /// `[store] backend = "jetstream"` section, to measure the log on JetStream.
    #[arg(long, global = true)]
    server_config: Option<PathBuf>,
    /// Also write the results as JSON to this file.
    #[arg(long, global = true)]
    json: Option<PathBuf>,
    /// No progress bars.
    #[arg(long, global = true)]
    quiet: bool,
}

#[derive(Subcommand)]
enum Command {
    #[command(flatten)]
    Scenario(Scenario),
    /// Every scenario in turn (baseline and append side by side), then one table.
    All {
        /// Smaller sizes: the whole pass in well under two minutes.
        #[arg(long)]
        quick: bool,
        /// Scenarios to leave out, by name (comma separated).
        #[arg(long, value_delimiter = ',')]
        skip: Vec<String>,
        /// Only these scenarios, by name (comma separated).
        #[arg(long, value_delimiter = ',')]
        only: Vec<String>,
    },
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli).await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(error) => {
            eprintln!("turnlog-load: {error:#}");
            ExitCode::from(2)
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<bool> {
    // Many scenarios hold thousands of sockets; a server we start inherits the limit.
    scenarios::connections::raise_fd_limit();
    let launcher = launcher(&cli)?;
    let scenarios = match cli.command {
        Command::Scenario(scenario) => vec![scenario],
        Command::All { quick, skip, only } => {
            for name in skip.iter().chain(&only) {
                if !Scenario::NAMES.contains(&name.as_str()) {
                    bail!("no scenario named {name:?}; they are {}", Scenario::NAMES.join(", "));
                }
            }
            let size = if quick { Size::Quick } else { Size::Full };
            Scenario::all(size)
                .into_iter()
                .filter(|s| !skip.iter().any(|n| n == s.name()))
                .filter(|s| only.is_empty() || only.iter().any(|n| n == s.name()))
                .collect()
        }
    };
    let ctx = Ctx { launcher, quiet: cli.quiet };
    let reports = scenarios::run_all(&ctx, scenarios).await;
    print(&reports, cli.json.as_deref())?;
    Ok(reports.iter().all(Report::ok))
}

fn print(reports: &[Report], json: Option<&Path>) -> anyhow::Result<()> {
    println!("{}", report::markdown(reports));
    let failed: Vec<&Report> = reports.iter().filter(|r| !r.ok()).collect();
    if failed.is_empty() {
        println!("All correctness checks passed.");
    } else {
        println!(
            "FAILED: correctness violations in {}.",
            failed.iter().map(|r| r.scenario.as_str()).collect::<Vec<_>>().join(", ")
        );
    }
    if let Some(path) = json {
        let command: Vec<String> = std::env::args().collect();
        let value = report::json(reports, &command.join(" "));
        std::fs::write(path, serde_json::to_string_pretty(&value)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

fn launcher(cli: &Cli) -> anyhow::Result<Launcher> {
    let Cli { url, server_pid: pid, server_bin: bin, no_build, data_root, server_config, .. } = cli;
    if let Some(url) = url {
        let parsed = reqwest::Url::parse(url).with_context(|| format!("--url {url}"))?;
        let loopback = match parsed.host() {
            Some(url::Host::Domain(name)) => name == "localhost",
            Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
            Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
            None => false,
        };
        if parsed.scheme() != "http" || !loopback {
            bail!("--url must be a loopback http:// address (127.0.0.1, localhost or [::1]), not {url}");
        }
        return Ok(Launcher::External { url: url.clone(), pid: *pid });
    }
    let path = match bin {
        Some(bin) => bin.clone(),
        None => server_binary(*no_build)?,
    };
    let extra = match server_config {
        Some(file) => std::fs::read_to_string(file).with_context(|| format!("--server-config {}", file.display()))?,
        None => String::new(),
    };
    Ok(Launcher::Binary { path, data_root: data_root.clone().unwrap_or_else(std::env::temp_dir), extra })
}

/// `turnlog` next to this binary (target/release or target/debug), built first with the
/// same profile so it is never stale.
fn server_binary(no_build: bool) -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let dir = exe.parent().context("the directory of this binary")?;
    let release = dir.file_name().is_some_and(|n| n == "release");
    if !no_build {
        let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../Cargo.toml");
        let mut cargo = std::process::Command::new(std::env::var("CARGO").unwrap_or("cargo".into()));
        cargo.args(["build", "--quiet", "--bin", "turnlog", "--manifest-path"]).arg(&manifest);
        if release {
            cargo.arg("--release");
        }
        eprintln!("building the server: cargo build{} --bin turnlog", if release { " --release" } else { "" });
        match cargo.status() {
            Ok(status) if status.success() => {}
            other => eprintln!("warning: building turnlog failed ({other:?}); using the binary that is there, if any"),
        }
    }
    let bin = dir.join("turnlog");
    if !bin.exists() {
        bail!(
            "no server binary at {}: build it with `cargo build --release --bin turnlog` or pass --server-bin",
            bin.display()
        );
    }
    if !release {
        eprintln!("warning: using a debug build of the server; figures will be far below release");
    }
    Ok(bin)
}
