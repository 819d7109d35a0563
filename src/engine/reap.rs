//! With other nodes on the log: every lease time to live, the turns whose node stopped
//! (their lease has expired) are taken over, and the messages that wait in sessions nobody
//! holds are answered, for as long as the service runs.

use super::mailbox::Command;
use super::Engine;

impl Engine {
    pub async fn reap(&self) {
        let Some(cluster) = self.cluster.clone() else { return };
        let mut every = tokio::time::interval(cluster.lease_ttl());
        loop {
            every.tick().await;
            if self.env.stopping() {
                return;
            }
            let Ok(open) = self.env.log.open().await else { continue };
            let mut orphans: Vec<_> = open.into_iter().map(|open| open.session).collect();
            // Also those whose open turn the index missed: its writer died before writing it.
            orphans.extend(self.env.log.turns_seen_open());
            orphans.sort_unstable();
            orphans.dedup();
            for session in orphans {
                if self.registry.contains(session) {
                    continue;
                }
                if let Ok(None) = cluster.holder(session).await {
                    if let Err(error) = self.send(session, Command::Wake).await {
                        tracing::warn!(%error, session_id = %session, "could not take over a session left running");
                    }
                }
            }
        }
    }
}
