//! One `session/prompt`: store the message, follow the session's log from it and render
//! each event as it is stored, ask the client for the permissions the turn waits for, and
//! answer with the stop reason once the log records how the turn chain ended.
//!
//! A tool whose permission is `ask` ends the log's turn waiting (`requires_action`); the
//! decision starts the turn that goes on. So one prompt may span several turns of the log,
//! and it ends at the first stop that waits for nothing.

use std::sync::Arc;
use std::time::Duration;

use agent_client_protocol::v1::schema::{PermissionOption, PermissionOptionKind, StopReason as AcpStop};
use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::Client;
use futures_util::StreamExt;
use tokio_util::sync::CancellationToken;

use super::door::{Door, DoorError};
use super::editor::{self, Ran};
use super::line::{Answer, Line, REJECT_ONCE};
use super::render::Live;
use crate::domain::event::StopReason;
use crate::domain::{Block, EventBody, EventId};
use crate::session::Input;

/// How a prompt ended, for its response.
pub enum Ended {
    Stopped(AcpStop),
    /// The model or the service failed the turn.
    Failed {
        code: String,
        message: String,
    },
    /// Nothing was stored, or the log could no longer be followed.
    Refused(DoorError),
}

pub struct Prompt {
    pub door: Arc<dyn Door>,
    pub cx: ConnectionTo<Client>,
    pub session: String,
    pub cancel: CancellationToken,
    /// The prompt request's idempotency key, and the connection's id for the other writes
    /// it makes (see [`super::door::write_key`]).
    pub key: String,
    pub connection: ulid::Ulid,
    /// The editor's files and terminals, as far as the client offers them.
    pub editor: super::editor::Editor,
}

/// How long a cancelled prompt waits for the log to record the end of its turn before it
/// answers `cancelled` anyway (the session may refuse the interrupt, e.g. once archived).
const CANCEL_WAIT: Duration = Duration::from_secs(5);

/// What became of a waiting call this prompt was to answer.
enum Answered {
    /// A decision or a result is stored (or another client answered first).
    Yes,
    /// The prompt was cancelled meanwhile; the calls are being closed.
    Cancelled,
}

impl Prompt {
    pub async fn run(self, content: Vec<Block>) -> Ended {
        if self.cancel.is_cancelled() {
            // Cancelled before anything was stored: nothing to store.
            return Ended::Stopped(AcpStop::Cancelled);
        }
        let message = vec![Input::Message(content.clone())];
        let stored = match self.door.submit(&self.session, message, &self.key).await {
            // Calls wait that no one will answer (an agent stopped while it asked the client):
            // the editor's user has moved on, so they are closed and the message taken.
            Err(DoorError::Refused(reason)) => {
                tracing::warn!(session_id = %self.session, %reason, "closing calls left waiting, for a new prompt");
                self.interrupt().await;
                // Refused, the first was not stored: the same key names this one.
                self.door.submit(&self.session, vec![Input::Message(content)], &self.key).await
            }
            stored => stored,
        };
        let stored = match stored {
            Ok(stored) => stored,
            Err(error) => return Ended::Refused(error),
        };
        let Some(message) = stored.iter().find(|e| matches!(e.body, EventBody::UserMessage { .. })) else {
            return Ended::Refused(DoorError::Unavailable("the message was not stored".into()));
        };
        let events = match self.door.follow(&self.session, message.id).await {
            Ok(events) => events,
            Err(error) => {
                // The turn runs, and no one could answer what it asks: stop it.
                self.interrupt().await;
                return Ended::Refused(error);
            }
        };
        match self.follow(events).await {
            _ if self.cancel.is_cancelled() => Ended::Stopped(AcpStop::Cancelled),
            ended => ended,
        }
    }

    /// Renders the prompt's events until the log records how its turns ended.
    async fn follow(&self, mut events: super::door::Events) -> Ended {
        let mut live = Live::default();
        let mut interrupted = false;
        let mut failure: Option<(String, String)> = None;
        loop {
            let next = tokio::select! {
                biased;
                _ = self.cancel.cancelled(), if !interrupted => {
                    interrupted = true;
                    self.interrupt().await;
                    continue;
                }
                next = timeout_if(interrupted, events.next()) => next,
            };
            let event = match next {
                Some(Some(Ok(event))) => event,
                Some(Some(Err(error))) => return Ended::Refused(error),
                Some(None) => {
                    return Ended::Refused(DoorError::NotFound(format!("session {} was deleted", self.session)))
                }
                // Cancelled, and the log has not recorded the end in time.
                None => return Ended::Stopped(AcpStop::Cancelled),
            };
            for update in live.update(&event) {
                self.line().notify(update);
            }
            if let EventBody::SessionUpdated { mode, model, .. } = &event.body {
                if mode.is_some() || model.is_some() {
                    if let Some(update) = super::settings::update(&*self.door, &self.session).await {
                        self.line().notify(update);
                    }
                }
            }
            match &event.body {
                EventBody::SessionError { error, code, .. } => failure = Some((code.clone(), error.clone())),
                EventBody::StatusIdle { stop_reason, .. } if stop_reason.kind == StopReason::RequiresAction => {
                    // Partial answers leave a new `requires_action` naming the calls that
                    // still wait: answer one call per stop.
                    let Some(&call) = stop_reason.event_ids.first() else { continue };
                    match self.answer(&live, call).await {
                        Ok(Answered::Yes) => {}
                        Ok(Answered::Cancelled) => interrupted = true,
                        Err(error) => {
                            self.interrupt().await;
                            return Ended::Refused(error);
                        }
                    }
                }
                EventBody::StatusIdle { stop_reason, .. } => {
                    return match (stop_reason.kind, failure) {
                        (StopReason::Error, Some((code, message))) => Ended::Failed { code, message },
                        (StopReason::Error, None) => {
                            Ended::Failed { code: "error".into(), message: "the turn failed".into() }
                        }
                        (kind, _) => Ended::Stopped(stop(kind)),
                    };
                }
                EventBody::Terminated { .. } => {
                    return Ended::Refused(DoorError::NotFound(format!("session {} was deleted", self.session)))
                }
                _ => {}
            }
        }
    }

    /// This prompt's line to its client.
    pub(super) fn line(&self) -> Line<'_> {
        Line { cx: &self.cx, session: &self.session, cancel: &self.cancel }
    }

    /// Stops the running turn, or closes the calls it left waiting.
    async fn interrupt(&self) {
        let key = super::door::write_key(&self.connection, None);
        match self.door.submit(&self.session, vec![Input::Interrupt], &key).await {
            Ok(_) | Err(DoorError::Refused(_)) | Err(DoorError::Busy(_)) => {}
            Err(error) => tracing::warn!(session_id = %self.session, %error, "interrupt"),
        }
    }

    /// Answers one waiting call: asks the client for a permission, or runs a call of one of
    /// the editor's tools on it (another client tool, which ACP cannot run, gets an error
    /// result).
    async fn answer(&self, live: &Live, call: EventId) -> Result<Answered, DoorError> {
        if self.cancel.is_cancelled() {
            self.interrupt().await;
            return Ok(Answered::Cancelled);
        }
        let Some(known) = live.calls.get(&call) else {
            // A call this prompt did not make (left waiting before it): not ours to answer.
            tracing::warn!(session_id = %self.session, %call, "a call waits that this prompt did not make");
            self.interrupt().await;
            return Ok(Answered::Cancelled);
        };
        let input = match known.client {
            true if known.editor => {
                let shown = known.update(call);
                let call = editor::Call { id: call, name: &known.name, input: &known.input, ask: known.ask, shown };
                match self.editor.run(&self.line(), call).await {
                    Ran::Stored(input) => input,
                    Ran::Cancelled => {
                        self.interrupt().await;
                        return Ok(Answered::Cancelled);
                    }
                }
            }
            true => Input::Result {
                call: call.to_string(),
                content: vec![Block::text(format!("{} is a client tool, and an ACP client cannot run it", known.name))],
                is_error: true,
                ran: None,
            },
            false => {
                let (granted, remember) = match self.line().ask(known.update(call), options(&known.name)).await {
                    Answer::Chose(option) => match option.as_str() {
                        ALLOW_ONCE => (true, false),
                        ALLOW_ALWAYS => (true, true),
                        REJECT_ALWAYS => (false, true),
                        _ => (false, false),
                    },
                    // Not the user's cancel: the client could not ask. Rejected, once.
                    Answer::Failed(_) => (false, false),
                    // Cancelled, by `session/cancel` or by the client itself.
                    Answer::Cancelled => {
                        self.interrupt().await;
                        return Ok(Answered::Cancelled);
                    }
                };
                Input::Permission { call: call.to_string(), granted, reason: None, remember }
            }
        };
        let key = super::door::write_key(&self.connection, None);
        let stored = match self.door.submit(&self.session, vec![input.clone()], &key).await {
            // Larger than the server stores (its `limits.max_event_bytes`): what ran is
            // recorded shorter, rather than not at all.
            Err(DoorError::Invalid(reason)) if super::editor::shorter(&input).is_some() => {
                tracing::warn!(session_id = %self.session, %reason, "a result recorded shorter");
                let key = super::door::write_key(&self.connection, None);
                self.door.submit(&self.session, super::editor::shorter(&input).into_iter().collect(), &key).await
            }
            stored => stored,
        };
        match stored {
            // Refused: another client answered the call first; the log goes on either way.
            Ok(_) | Err(DoorError::Refused(_)) | Err(DoorError::Busy(_)) => Ok(Answered::Yes),
            Err(error) => Err(error),
        }
    }
}

/// `next`, or `None` once [`CANCEL_WAIT`] has passed when `bounded`.
async fn timeout_if<T>(bounded: bool, next: impl std::future::Future<Output = T>) -> Option<T> {
    match bounded {
        true => tokio::time::timeout(CANCEL_WAIT, next).await.ok(),
        false => Some(next.await),
    }
}

const ALLOW_ONCE: &str = "allow-once";
const ALLOW_ALWAYS: &str = "allow-always";
const REJECT_ALWAYS: &str = "reject-always";

fn options(tool: &str) -> Vec<PermissionOption> {
    vec![
        PermissionOption::new(ALLOW_ONCE, "Allow", PermissionOptionKind::AllowOnce),
        PermissionOption::new(ALLOW_ALWAYS, format!("Always allow {tool}"), PermissionOptionKind::AllowAlways),
        PermissionOption::new(REJECT_ONCE, "Reject", PermissionOptionKind::RejectOnce),
        PermissionOption::new(REJECT_ALWAYS, format!("Always reject {tool}"), PermissionOptionKind::RejectAlways),
    ]
}

/// The log's stop reasons as ACP names them (`requires_action` and `error` never reach here).
fn stop(kind: StopReason) -> AcpStop {
    match kind {
        StopReason::MaxTokens => AcpStop::MaxTokens,
        StopReason::MaxTurnRequests => AcpStop::MaxTurnRequests,
        StopReason::Refusal => AcpStop::Refusal,
        StopReason::Cancelled => AcpStop::Cancelled,
        StopReason::EndTurn | StopReason::RequiresAction | StopReason::Error => AcpStop::EndTurn,
    }
}
