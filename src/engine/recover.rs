//! Recovery on one node: the turns a crash (or a stop that timed out) left running are
//! closed before any actor exists, and the sessions whose messages wait for a turn are
//! woken, which their actors answer. With other nodes on the log, each such turn is taken
//! over once its lease expires instead ([`super::reap`]).

use super::decide;
use super::mailbox::Command;
use super::Engine;
use crate::error::SessionError;

impl Engine {
    /// Answers how many turns it closed.
    pub async fn recover(&self) -> Result<usize, SessionError> {
        if self.cluster.is_some() {
            return Ok(0);
        }
        let log = &self.env.log;
        let open = log.open().await?;
        let mut closed = 0;
        for (session, turn) in open.iter().filter_map(|open| Some((open.session, open.turn?))) {
            let at = log.position(session).await?;
            match log.append(session, at.seq, decide::interrupted(turn)).await {
                Ok(Ok(_)) => {
                    closed += 1;
                    tracing::warn!(session_id = %session, turn_id = %turn, "closed a turn interrupted by a stop");
                }
                Ok(Err(conflict)) => {
                    return Err(SessionError::Conflict(format!(
                        "another writer appended to session {session} while its interrupted turn was closed (at {})",
                        conflict.actual.seq
                    )))
                }
                Err(SessionError::NotFound(_)) => {}
                Err(error) => return Err(error),
            }
        }
        for open in open.iter().filter(|open| open.queued) {
            self.send(open.session, Command::Wake).await?;
        }
        Ok(closed)
    }
}
