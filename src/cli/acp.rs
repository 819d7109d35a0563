//! `turnlog acp`: an Agent Client Protocol agent on stdin/stdout, as a bridge to a running
//! server (`--server`) or with the engine in this process on the data dir.

use std::sync::Arc;

use anyhow::Context;

use super::args::{AcpArgs, ServeArgs};
use crate::acp::door::{Bridge, Embedded};
use crate::acp::Acp;
use crate::service::Service;

/// Serves ACP until stdin closes; the exit status.
pub fn run(serve: &ServeArgs, args: AcpArgs) -> i32 {
    crate::telemetry::init();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("turnlog acp: {error}");
            return 1;
        }
    };
    let result = runtime.block_on(async move {
        match args.server {
            Some(server) => bridge(&server, args.api_key, args.agent).await,
            None => embedded(serve, args.agent).await,
        }
    });
    match result {
        Ok(()) => 0,
        Err(error) => {
            tracing::error!("turnlog acp: {error:#}");
            1
        }
    }
}

async fn bridge(server: &str, key: Option<String>, agent: String) -> anyhow::Result<()> {
    let door = Bridge::new(server, key)?;
    Ok(Acp::new(Arc::new(door), agent).serve().await?)
}

/// The engine on the data dir, which is closed whatever the connection came to.
async fn embedded(serve: &ServeArgs, agent: String) -> anyhow::Result<()> {
    let settings = super::settings(serve)?;
    let service = Arc::new(Service::open(&settings).await?);
    if service.sessions().agents().get(&agent).is_none() {
        service.shutdown().await.context("closing the log")?;
        anyhow::bail!("no agent named {agent:?} (--agent) in the config");
    }
    let door = Embedded::new(service.clone());
    let served = Acp::new(Arc::new(door), agent).serve().await;
    service.shutdown().await.context("closing the log")?;
    Ok(served?)
}
