//! Recovery on one node: the turns a crash (or a stop past its grace) left running go on,
//! and the sessions whose messages wait for a turn are answered. Each such session is
//! woken: its actor loads it from the log and resumes its turn (see
//! [`super::decide::resume`]). With other nodes on the log, each such turn is taken over
//! once its lease expires instead ([`super::reap`]).

use std::time::Duration;

use tokio::sync::oneshot;

use super::mailbox::Command;
use super::Engine;
use crate::error::SessionError;

/// How long a start waits for the woken sessions to be loaded (and their turns resumed).
const LOADED_WAIT: Duration = Duration::from_secs(30);

impl Engine {
    /// Answers how many turns it found left running. Each is resumed (or closed, if it was
    /// resumed too often) before this answers, so that no reader of this node's log sees a
    /// turn's cut reply without its retraction; a session that takes longer than
    /// [`LOADED_WAIT`] to load is resumed after.
    pub async fn recover(&self) -> Result<usize, SessionError> {
        if self.cluster.is_some() {
            return Ok(0);
        }
        let open = self.env.log.open().await?;
        let mut running = 0;
        let mut loaded = Vec::new();
        for open in &open {
            running += usize::from(open.turn.is_some());
            let (done, waited) = oneshot::channel();
            match self.send(open.session, Command::Wake(Some(done))).await {
                Ok(()) => loaded.push(waited),
                Err(SessionError::NotFound(_)) => {}
                Err(error) => return Err(error),
            }
        }
        // A session that could not be loaded drops its answer: nothing to wait for.
        let all = futures_util::future::join_all(loaded);
        if tokio::time::timeout(LOADED_WAIT, all).await.is_err() {
            tracing::warn!("some sessions left running are still loading; their turns are resumed once they are");
        }
        Ok(running)
    }
}
