//! `turnlog serve` (the default): the HTTP server on the service, until a signal stops it.

use std::io::Write;

use anyhow::Context;

use super::args::ServeArgs;
use crate::Application;

/// Serves until stopped; prints `listening on http://ADDR` once it listens.
pub fn run(args: &ServeArgs) -> anyhow::Result<()> {
    crate::telemetry::init();
    let settings = super::settings(args)?;
    actix_web::rt::System::new().block_on(async move {
        let app = Application::build(settings).await.context("starting turnlog")?;
        println!("listening on http://{}", app.addr());
        std::io::stdout().flush()?;
        app.run_until_stopped().await.context("serving")
    })
}
