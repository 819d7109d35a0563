//! With other nodes on the log: several times per lease time to live, the turns whose node
//! stopped (their lease has expired) are taken over and resumed, and the messages that
//! wait in sessions nobody holds are answered, for as long as the service runs. A turn is
//! taken over at most a tenth of the time to live after its lease expired.

use std::sync::Arc;

use super::cluster::Cluster;
use super::mailbox::Command;
use super::Engine;

impl Engine {
    pub async fn reap(&self) {
        let Some(cluster) = self.cluster.clone() else { return };
        let period = (cluster.lease_ttl() / 10).max(std::time::Duration::from_millis(100));
        self.every(period, || self.take_over(&cluster)).await;
    }

    /// One round: every session with a turn open or messages waiting that no node holds
    /// is woken here.
    async fn take_over(&self, cluster: &Arc<dyn Cluster>) {
        let Ok(open) = self.env.log.open().await else { return };
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
                if let Err(error) = self.send(session, Command::Wake(None)).await {
                    tracing::warn!(%error, session_id = %session, "could not take over a session left running");
                }
            }
        }
    }
}
