//! Following a session's log: replay from the store after a cursor, then the live bus,
//! with no gap and no duplicate at the seam. A follower that lags behind the bus re-reads
//! the store after the last event it returned, so the live path is lossless; one that is
//! more than `max_backlog` events behind is told to go, and resumes by cursor.

use std::sync::Arc;

use tokio::sync::broadcast::error::RecvError;

use super::{Live, Log, Position, ReadRange, StoreError, Subscription};
use crate::domain::{EventId, RawEvent, SessionId};
use crate::metrics;

#[derive(Debug, thiserror::Error)]
pub enum FollowError {
    #[error("the stream fell {behind} events behind the log (limit {limit}); resume from the last event id")]
    Backlog { behind: u64, limit: u64 },
    #[error(transparent)]
    Storage(#[from] StoreError),
}

/// How a follower reads: events per replay read, and how far behind the log it may fall
/// before it is told to go.
#[derive(Debug, Clone, Copy)]
pub struct FollowConfig {
    pub replay_chunk: usize,
    pub max_backlog: u64,
}

pub struct Follower {
    log: Arc<dyn Log>,
    session: SessionId,
    subscription: Subscription,
    /// The last event returned (or the cursor).
    sent: Position,
    /// While replaying: read the log up to here (the position the bus delivers everything
    /// after), then go back to the bus.
    replay_to: Option<Position>,
    config: FollowConfig,
    ended: bool,
}

impl Follower {
    /// A follower of `session` after `after`: it subscribes first, then replays.
    pub async fn new(
        log: Arc<dyn Log>,
        session: SessionId,
        after: Position,
        config: FollowConfig,
    ) -> Result<Follower, StoreError> {
        let subscription = log.subscribe(session).await?;
        let replay_to = Some(subscription.at);
        Ok(Follower { log, session, subscription, sent: after, replay_to, config, ended: false })
    }

    /// A follower that only sees events appended from now on.
    pub async fn live(log: Arc<dyn Log>, session: SessionId, config: FollowConfig) -> Result<Follower, StoreError> {
        let subscription = log.subscribe(session).await?;
        let sent = subscription.at;
        Ok(Follower { log, session, subscription, sent, replay_to: None, config, ended: false })
    }

    /// The next events in log order, waiting for live ones. `None` once `terminated` has
    /// been returned or the log is gone. Cancel-safe: nothing is lost if the future is
    /// dropped before it completes (a read in flight is simply made again).
    pub async fn next(&mut self) -> Result<Option<Vec<RawEvent>>, FollowError> {
        loop {
            if self.ended {
                return Ok(None);
            }
            if let Some(to) = self.replay_to.filter(|to| to.seq > self.sent.seq) {
                let range = ReadRange {
                    after: self.sent.last,
                    before: to.last.and_then(just_after),
                    limit: self.config.replay_chunk,
                    newest_first: false,
                };
                let events = self.log.read(self.session, range).await?;
                if !events.is_empty() {
                    metrics::EVENTS_REPLAYED.inc_by(events.len() as u64);
                    return Ok(Some(self.mark(events)));
                }
            }
            self.replay_to = None;
            match self.subscription.live.recv().await {
                Ok(Live::Events(batch)) => {
                    let fresh: Vec<RawEvent> = batch.iter().filter(|e| Some(e.id) > self.sent.last).cloned().collect();
                    if !fresh.is_empty() {
                        metrics::EVENTS_LIVE.inc_by(fresh.len() as u64);
                        return Ok(Some(self.mark(fresh)));
                    }
                }
                // A large commit: read from the log up to its end, then back to the bus.
                Ok(Live::Stored(end)) => self.replay_to = Some(end),
                Err(RecvError::Lagged(_)) => {
                    metrics::SUBSCRIBERS_LAGGED.inc();
                    let head = self.subscription.channel.durable();
                    let behind = head.seq.saturating_sub(self.sent.seq);
                    if behind > self.config.max_backlog {
                        metrics::SUBSCRIBERS_DROPPED.inc();
                        return Err(FollowError::Backlog { behind, limit: self.config.max_backlog });
                    }
                    self.replay_to = Some(head);
                }
                Err(RecvError::Closed) => return Ok(None),
            }
        }
    }

    /// Records what is about to be returned, and ends after `terminated`.
    fn mark(&mut self, mut events: Vec<RawEvent>) -> Vec<RawEvent> {
        if let Some(end) = events.iter().position(|e| e.kind() == "terminated") {
            events.truncate(end + 1);
            self.ended = true;
        }
        if let Some(last) = events.last() {
            self.sent = Position { last: Some(last.id), seq: last.seq };
        }
        events
    }
}

/// The id just after `id`: reading strictly before it reads up to `id` itself.
fn just_after(id: EventId) -> Option<EventId> {
    u128::from(id.ulid()).checked_add(1).map(|n| EventId(ulid::Ulid::from(n)))
}
