//! Forwarding: a command for a session whose lease another node holds goes to that node
//! (through the [`super::cluster::Cluster`] port), and the answer comes back; this node
//! answers the commands others forward to it the same way.

use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use super::cluster::ForwardError;
use super::mailbox::{Answer as Reply, Command, Pending, Reply as SubmitReply};
use super::registry::Route;
use super::remote::{self, Answer, Remote, Request, WireDraft, WireError};
use super::Engine;
use crate::domain::SessionId;
use crate::error::SessionError;
use crate::metrics;

/// How long a command forwarded to a node that does not answer waits for its lease to
/// expire, beyond the lease's time to live.
const FORWARD_GRACE: Duration = Duration::from_secs(5);

/// How long a node that is gone (or has let the session go) is left before it is asked
/// again where the session is.
const FORWARD_PAUSE: Duration = Duration::from_millis(200);

/// Where the answer to a forwarded command goes.
enum ReplyTo {
    Done(Reply<()>),
    Submitted(oneshot::Sender<SubmitReply>),
    Nothing,
}

impl ReplyTo {
    fn answer(self, answer: Answer) {
        match self {
            ReplyTo::Done(reply) => drop(reply.send(answer.into_done())),
            ReplyTo::Submitted(reply) => drop(reply.send(answer.into_submitted().map(Pending::settled).into())),
            ReplyTo::Nothing => {}
        }
    }

    /// The command again, for this node's own actor (the session came here meanwhile).
    fn into_command(self, remote: Remote) -> Option<Command> {
        Some(match (remote, self) {
            (Remote::Create(drafts), ReplyTo::Done(reply)) => {
                match drafts.into_iter().map(WireDraft::into_draft).collect::<Result<Vec<_>, _>>() {
                    Ok(drafts) => Command::Create(drafts, reply),
                    Err(error) => {
                        let _ = reply.send(Err(error));
                        return None;
                    }
                }
            }
            (Remote::Submit(submission), ReplyTo::Submitted(reply)) => Command::Submit(submission, reply),
            (Remote::Close(closing), ReplyTo::Done(reply)) => Command::Close(closing, reply),
            _ => Command::Wake(None),
        })
    }
}

/// `command` as it crosses to `node`, and where its answer goes; `None` for a command that
/// does not cross (answered here).
fn remote(session: SessionId, node: &str, command: Command) -> Option<(Remote, ReplyTo)> {
    let held = |why: &str| SessionError::Unavailable(format!("session {session} is held by node {node}{why}"));
    Some(match command {
        Command::Create(drafts, reply) => {
            (Remote::Create(drafts.iter().map(WireDraft::from_draft).collect()), ReplyTo::Done(reply))
        }
        Command::Submit(submission, reply) => (Remote::Submit(submission), ReplyTo::Submitted(reply)),
        Command::Close(closing, reply) => (Remote::Close(closing), ReplyTo::Done(reply)),
        Command::Wake(_) => (Remote::Wake, ReplyTo::Nothing),
        // A replay re-emits into a session whose actor runs on its own node (which keeps
        // it while the replay runs); one that has moved to another node ends the replay.
        Command::Copy(_, reply) => {
            let _ = reply.send(Err(held(": a replay runs where its session does")));
            return None;
        }
        Command::EndReplay(reply) => {
            let _ = reply.send(Err(held("")));
            return None;
        }
        // Only ever sent to an actor of this node.
        Command::TurnEnded(..) | Command::Stop(_) | Command::Leave(_) => return None,
    })
}

impl Engine {
    /// Hands `command` to the node that holds the session's lease and passes its answer on.
    /// A node that is gone (or has let the session go) is asked again where the session is,
    /// until its lease expires and this node can take it.
    pub(super) async fn forward(
        &self,
        session: SessionId,
        mut node: String,
        command: Command,
    ) -> Result<(), SessionError> {
        let Some(cluster) = self.cluster.clone() else { return Err(SessionError::ShuttingDown) };
        let Some((command, reply)) = remote(session, &node, command) else { return Ok(()) };
        metrics::FORWARDED.with_label_values(&["sent"]).inc();
        let from = Some(cluster.node().to_string());
        let request = remote::encode(&Request { session, command: command.clone(), from });
        let deadline = Instant::now() + cluster.lease_ttl() + FORWARD_GRACE;
        let failed = |error: SessionError| Answer::Failed(WireError::from_error(&error));
        loop {
            let answered = match cluster.forward(&node, request.clone()).await {
                Ok(bytes) => match remote::decode::<Answer>(&bytes) {
                    Ok(Answer::Failed(WireError::NotHere)) => None,
                    Ok(answer) => Some(answer),
                    Err(error) => Some(failed(error)),
                },
                Err(ForwardError::Gone) => None,
                // Sent, and not answered: the node may have made the write.
                Err(ForwardError::Failed(message)) => {
                    let error = format!(
                        "node {node}, which runs session {session}, did not answer ({message}); whether it did \
                         what was asked is not known: send it again only with the same Idempotency-Key"
                    );
                    Some(failed(SessionError::FateUnknown(error)))
                }
            };
            let answered = answered.or_else(|| {
                let error = format!("node {node} holds session {session} and does not answer; try again later");
                (Instant::now() >= deadline).then(|| failed(SessionError::Unavailable(error)))
            });
            if let Some(answer) = answered {
                reply.answer(answer);
                return Ok(());
            }
            tokio::time::sleep(FORWARD_PAUSE).await;
            match self.route(session).await? {
                Route::Remote(next) => node = next,
                Route::Local(..) => match reply.into_command(command) {
                    Some(command) => return Box::pin(self.send(session, command)).await,
                    None => return Ok(()),
                },
            }
        }
    }

    /// Answers the commands other nodes forward to this one, for sessions whose lease this
    /// node holds (or takes); for others it answers that the session is not here.
    pub async fn serve_forwarded(&self) -> Result<tokio::task::JoinHandle<()>, SessionError> {
        let Some(cluster) = self.cluster.clone() else { return Err(SessionError::ShuttingDown) };
        let mut requests = cluster.serve().await?;
        let engine = self.clone();
        Ok(tokio::spawn(async move {
            while let Some((request, answer)) = requests.recv().await {
                let engine = engine.clone();
                tokio::spawn(async move {
                    let answered = engine.answer_forwarded(&request).await;
                    let _ = answer.send(remote::encode(&answered));
                });
            }
        }))
    }

    async fn answer_forwarded(&self, request: &[u8]) -> Answer {
        let failed = |error: SessionError| Answer::Failed(WireError::from_error(&error));
        let Request { session, command, from } = match remote::decode(request) {
            Ok(request) => request,
            Err(error) => return failed(error),
        };
        match self.route(session).await {
            Ok(Route::Local(..)) => {}
            Ok(Route::Remote(_)) => return Answer::Failed(WireError::NotHere),
            Err(error) => return failed(error),
        }
        metrics::FORWARDED.with_label_values(&["served"]).inc();
        let answered = match command {
            Remote::Create(drafts) => match drafts.into_iter().map(WireDraft::into_draft).collect() {
                Ok(drafts) => self.create(session, drafts).await.map(|()| Answer::Done),
                Err(error) => Err(error),
            },
            Remote::Submit(mut submission) => {
                submission.forwarded_by = from;
                self.submit(session, *submission).await.map(|s| Answer::submitted(&s))
            }
            Remote::Close(closing) => self.close(session, closing).await.map(|()| Answer::Done),
            Remote::Wake => self.send(session, Command::Wake(None)).await.map(|()| Answer::Done),
        };
        answered.unwrap_or_else(failed)
    }
}
