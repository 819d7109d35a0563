//! Logging: `tracing` to stderr, filtered by `RUST_LOG` (default `info`), as JSON when
//! `TURNLOG_LOG_FORMAT=json`. Standard output carries only the `listening on` line.

use tracing_subscriber::EnvFilter;

pub fn init() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let colour = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(colour);
    if std::env::var("TURNLOG_LOG_FORMAT").is_ok_and(|f| f == "json") {
        builder.json().init();
    } else {
        builder.init();
    }
}
