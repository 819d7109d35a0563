//! What an actor takes ([`Command`]) and what it answers a submission with ([`Reply`]).

use tokio::sync::oneshot;

use super::command::{Closing, Submission, Submitted};
use super::decide::Outcome;
use super::writer::Durable;
use crate::domain::{Draft, RawEvent, TurnId};
use crate::error::SessionError;

/// Where the answer to a command goes.
pub(super) type Answer<T> = oneshot::Sender<Result<T, SessionError>>;

pub(super) enum Command {
    /// The first events of a new session (the first command its actor takes).
    Create(Vec<Draft>, Answer<()>),
    Submit(Box<Submission>, oneshot::Sender<Reply>),
    TurnEnded(TurnId, Outcome),
    /// Cancel what runs, record how it ended, then delete or archive the session.
    Close(Closing, Answer<()>),
    /// Stop once the running turn (if any) has ended (the service is shutting down).
    Stop(oneshot::Sender<()>),
    /// Stop now, leaving the running turn as the log shows it, to be resumed by the next
    /// actor of the session (after a restart, or on another node).
    Leave(oneshot::Sender<()>),
    /// Nothing to do but load (which resumes a turn left running): the actor then answers
    /// the messages that wait. Answered, if asked, once loaded.
    Wake(Option<oneshot::Sender<()>>),
    /// Events of another session's log, re-emitted as they are (a replay session's):
    /// appended after the session's last, answered with them once durable.
    Copy(Vec<Draft>, Answer<Vec<RawEvent>>),
    /// A replay has ended (done, or stopped): a copied turn it left open is closed.
    EndReplay(Answer<()>),
}

/// An actor's answer to a submission.
pub(super) enum Reply {
    Done(Pending),
    Refused(SessionError),
    /// The actor stopped before it took the submission: send it to the next one.
    Again(Box<Submission>),
    /// A keyed submission sent again: what the first one stored, to read once durable.
    Recalled(Recall),
}

/// Where a keyed write's events are: `events` events from sequence number `first`,
/// durable once `durable` resolves (`None`: they are).
pub(super) struct Recall {
    pub first: u64,
    pub events: u32,
    pub durable: Option<Durable>,
}

/// A submission's answer, which may not be durable yet: the caller waits for that itself
/// (one wake from the writer, no task in between), while the actor goes on to its next
/// command.
pub(super) struct Pending {
    pub submitted: Submitted,
    pub durable: Option<Durable>,
}

impl Pending {
    /// An answer whose events are durable already (or that stored none).
    pub fn settled(submitted: Submitted) -> Pending {
        Pending { submitted, durable: None }
    }

    pub async fn settle(self) -> Result<Submitted, SessionError> {
        if let Some(durable) = self.durable {
            durable.wait().await?;
        }
        Ok(self.submitted)
    }
}

impl From<Result<Pending, SessionError>> for Reply {
    fn from(result: Result<Pending, SessionError>) -> Reply {
        match result {
            Ok(pending) => Reply::Done(pending),
            Err(error) => Reply::Refused(error),
        }
    }
}

impl Command {
    /// Answers a command that no actor will handle with `failure` (one the next actor
    /// should take instead, dropped, goes on to it).
    pub fn refuse(self, failure: impl Fn() -> SessionError) {
        match self {
            Command::Submit(_, reply) => drop(reply.send(Reply::Refused(failure()))),
            Command::Create(_, reply) | Command::Close(_, reply) | Command::EndReplay(reply) => {
                drop(reply.send(Err(failure())))
            }
            Command::Copy(_, reply) => drop(reply.send(Err(failure()))),
            Command::Stop(reply) | Command::Leave(reply) => drop(reply.send(())),
            Command::TurnEnded(..) | Command::Wake(_) => {}
        }
    }
}
