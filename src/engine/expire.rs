//! Sessions that time out: with an idle timeout configured (`[engine]
//! session_idle_timeout_secs`, or an agent's `idle_timeout_secs`), a sweep walks the session
//! index every so often and asks the actor of each session whose last event is older than
//! its timeout to end it ([`Closing::Expire`]); the actor decides again on what it knows
//! (a turn that runs, or an event that came meanwhile, keeps the session). With several
//! nodes each node sweeps; ending a session twice is ending it once.

use std::time::Duration;

use super::command::Closing;
use super::Engine;
use crate::domain::ids::now_ms;
use crate::projection::SessionSummary;

/// Sessions read from the index at a time.
const PAGE: usize = 512;

impl Engine {
    /// Whether any session may time out: a default timeout, or an agent's own.
    pub fn expires_sessions(&self) -> bool {
        self.env.settings.session_idle_timeout_secs > 0 || self.env.agents.any_idle_timeout()
    }

    /// Sweeps for idle sessions until the engine stops: every quarter of the shortest
    /// timeout, between a quarter of a second and half a minute.
    pub async fn expire_idle(&self) {
        let shortest = self.shortest_timeout();
        if shortest == 0 {
            return;
        }
        let period =
            Duration::from_millis(shortest * 1000 / 4).clamp(Duration::from_millis(250), Duration::from_secs(30));
        self.every(period, || async {
            if let Err(error) = self.sweep_idle().await {
                tracing::warn!(%error, "could not look for idle sessions");
            }
        })
        .await;
    }

    fn shortest_timeout(&self) -> u64 {
        let agents = self.env.agents.all().into_iter().filter_map(|agent| agent.config.idle_timeout_secs);
        let default = Some(self.env.settings.session_idle_timeout_secs);
        default.into_iter().chain(agents).filter(|secs| *secs > 0).min().unwrap_or(0)
    }

    /// One sweep: every live session past its timeout is asked to end.
    async fn sweep_idle(&self) -> Result<(), crate::error::SessionError> {
        let mut after = None;
        loop {
            let page = self.env.log.sessions(after, PAGE).await?;
            let Some((last, _)) = page.last() else { return Ok(()) };
            after = Some(*last);
            for (_, summary) in page {
                let Some(idle_ms) = self.timeout_of(&summary) else { continue };
                let position = self.env.log.position(summary.id).await?;
                let last = position.last.map_or(0, |id| id.ulid().timestamp_ms());
                if now_ms().saturating_sub(last) < idle_ms {
                    continue;
                }
                match self.close(summary.id, Closing::Expire { idle_ms }).await {
                    Ok(()) => tracing::debug!(session_id = %summary.id, "asked an idle session to end"),
                    Err(error) => tracing::warn!(%error, session_id = %summary.id, "could not end an idle session"),
                }
            }
        }
    }

    /// A live session's idle timeout, in milliseconds, if it has one.
    fn timeout_of(&self, summary: &SessionSummary) -> Option<u64> {
        if summary.deleted || summary.archived_at.is_some() || summary.ended.is_some() {
            return None;
        }
        let agent = self.env.agents.get(&summary.spec.agent.name);
        let secs =
            agent.and_then(|a| a.config.idle_timeout_secs).unwrap_or(self.env.settings.session_idle_timeout_secs);
        (secs > 0).then(|| secs.saturating_mul(1000))
    }
}
