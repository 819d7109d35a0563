//! Recovery on one node: the turns a crash (or a stop past its grace) left running go on,
//! and the sessions whose messages wait for a turn are answered. Each such session is
//! woken: its actor loads it from the log and resumes its turn (see
//! [`super::decide::resume`]). With other nodes on the log, each such turn is taken over
//! once its lease expires instead ([`super::reap`]).

use super::mailbox::Command;
use super::Engine;
use crate::error::SessionError;

impl Engine {
    /// Answers how many turns it found left running (each is resumed, or closed if it was
    /// resumed too often).
    pub async fn recover(&self) -> Result<usize, SessionError> {
        if self.cluster.is_some() {
            return Ok(0);
        }
        let open = self.env.log.open().await?;
        let mut running = 0;
        for open in &open {
            running += usize::from(open.turn.is_some());
            match self.send(open.session, Command::Wake).await {
                Ok(()) | Err(SessionError::NotFound(_)) => {}
                Err(error) => return Err(error),
            }
        }
        Ok(running)
    }
}
