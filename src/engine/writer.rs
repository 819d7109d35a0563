//! One session's appends, one after another: the actor and its running turn share a
//! [`Writer`], so the session has a single writer; [`Durable`] resolves once an append is.

use futures_util::future::{BoxFuture, FutureExt, Shared};
use tokio_util::sync::CancellationToken;

use super::log::EngineLog;
use crate::domain::{Draft, RawEvent, SessionId};
use crate::error::SessionError;
use crate::store::{AppendError, Appended};

/// What resolves once an append is durable (cloned by whoever waits for it).
#[derive(Clone)]
pub(super) struct Durable {
    session: SessionId,
    done: Shared<BoxFuture<'static, Result<(), AppendError>>>,
    /// The writer's flag, set if the append fails (see [`Writer`]'s).
    failed: CancellationToken,
}

impl Durable {
    pub async fn wait(self) -> Result<(), SessionError> {
        self.done.await.map_err(|error| {
            self.failed.cancel();
            SessionError::from_append(self.session, error)
        })
    }
}

/// One session's appends, one after another, each at the position the one before left.
/// The actor and its running turn share one, so the session has a single writer; if
/// anything else appends to the log, the next append here gets the conflict.
///
/// An append is numbered as it is ordered, and the writer keeps what it ordered for the
/// actor to fold ([`Writer::take_ordered`]): the actor decides on events in hand, never
/// reads back what was just written, and need not wait for one append to be durable before
/// it orders the next, so a session's appends share flushes.
pub(super) struct Writer {
    log: EngineLog,
    session: SessionId,
    state: parking_lot::Mutex<Ordering>,
    /// Set once an append ordered here failed: refused because another node appended
    /// first, or not stored, or stored or not with no answer saying which (an engine failing
    /// over). What the actor folded may then not be the log, and it must be loaded again.
    failed: CancellationToken,
    watched: bool,
}

struct Ordering {
    /// The position after the last append ordered here.
    at: u64,
    /// The last append ordered here: once it is durable, all before it are.
    last: Option<Durable>,
    /// What was ordered here and not yet taken by the actor, oldest first.
    unfolded: Vec<RawEvent>,
}

impl Writer {
    /// `watched`: every append is waited for by a task of its own, so that one that fails
    /// is noticed even if nobody else waits for it (with several nodes, where an append can
    /// turn out to have raced another node's, or its fate be lost in a failover).
    pub fn new(log: EngineLog, session: SessionId, at: u64, watched: bool) -> Writer {
        let state = parking_lot::Mutex::new(Ordering { at, last: None, unfolded: Vec::new() });
        Writer { log, session, state, failed: CancellationToken::new(), watched }
    }

    /// Orders `drafts` after the last append: the events (or the conflict) at once, and
    /// what resolves once they are durable. Nothing may show the events to anyone before.
    pub fn order(&self, drafts: Vec<Draft>) -> Result<(Appended, Durable), SessionError> {
        let mut state = self.state.lock();
        let ordered = self.log.order(self.session, state.at, drafts);
        let (appended, done) = match ordered {
            Ok(ordered) => ordered.split(),
            Err(error) => {
                self.note(&error);
                return Err(SessionError::from_append(self.session, error));
            }
        };
        let durable = Durable { session: self.session, done: done.shared(), failed: self.failed.clone() };
        if self.watched && appended.is_ok() {
            tokio::spawn(durable.clone().wait());
        }
        if let Some(last) = appended.as_ref().ok().and_then(|events| events.last()) {
            state.at = last.seq;
            state.last = Some(durable.clone());
            state.unfolded.extend(appended.as_ref().into_iter().flatten().cloned());
        }
        Ok((appended, durable))
    }

    fn note(&self, error: &AppendError) {
        if let AppendError::Raced(_) = error {
            self.failed.cancel();
        }
    }

    /// What was folded from this writer's appends is not the log (some were not stored):
    /// the actor must be loaded again, as after a race (see `failed`).
    pub fn invalidate(&self) {
        self.failed.cancel();
    }

    /// Whether an append ordered here failed (see `failed`).
    pub fn failed(&self) -> bool {
        self.failed.is_cancelled()
    }

    /// Resolves once an append ordered here has failed (see `failed`), for an actor that
    /// waits for its next command.
    pub fn failing(&self) -> tokio_util::sync::WaitForCancellationFuture<'_> {
        self.failed.cancelled()
    }

    /// Whether everything ordered here is durable and folded: nothing of this writer's is
    /// still in flight, so what the actor folded is the log as this node stored it.
    pub fn idle(&self) -> bool {
        let state = self.state.lock();
        state.unfolded.is_empty() && state.last.as_ref().is_none_or(|last| matches!(last.done.peek(), Some(Ok(()))))
    }

    /// Waits until everything ordered here so far is durable.
    pub async fn settled(&self) -> Result<(), SessionError> {
        match self.last() {
            Some(last) => last.wait().await,
            None => Ok(()),
        }
    }

    /// What resolves once everything ordered here so far is durable.
    pub fn last(&self) -> Option<Durable> {
        self.state.lock().last.clone()
    }

    /// The events ordered here since the last call, oldest first.
    pub fn take_ordered(&self) -> Vec<RawEvent> {
        std::mem::take(&mut self.state.lock().unfolded)
    }

    /// The log was read (after a conflict, or at load) up to `seq`, and everything ordered
    /// here was taken: append after `seq` from now on. Nothing is changed if something
    /// was ordered here meanwhile (it was ordered at the log's end, so `at` is right).
    pub fn caught_up(&self, seq: u64) {
        let mut state = self.state.lock();
        if state.unfolded.is_empty() {
            state.at = seq;
        }
    }
}
