//! Noticing that a follower of a stream (the node's consumer, or its projections' watch)
//! has gone quiet: one on a server that died brings nothing and says nothing.

use std::time::Duration;

use async_nats::jetstream::stream;

/// How long a node's consumer (or its projections' watch) may bring nothing while the
/// stream holds what it has not brought, before the node follows the stream again with a
/// new one from where the old one stopped. A consumer on a server that died brings nothing
/// and says nothing: its client would notice only after two missed heartbeats (10 s),
/// while live streams, appends and reads on this node wait for it.
pub(super) const QUIET_WAIT: Duration = Duration::from_secs(1);

/// How many messages a node without a consumer fetches before it tries to make one again.
pub(super) const FETCH_ROUND: u64 = 1024;

/// The ticks at which a follower of a stream is asked whether it has gone quiet: the first
/// a whole [`QUIET_WAIT`] after it starts, and never two at once after a delay.
pub(super) fn quiet_ticks() -> tokio::time::Interval {
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + QUIET_WAIT, QUIET_WAIT);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticks
}

/// Whether a follower of a stream (the node's consumer, or its projections' watch) has
/// gone quiet: asked once per [`QUIET_WAIT`] with the stream sequence it has brought up to.
/// A follower that has brought nothing for a tick, while the stream held a later message
/// at that tick, and still nothing a tick later, has: a live one brings a message within
/// moments of its being stored.
#[derive(Default)]
pub(super) struct Quiet {
    at_tick: u64,
    /// The stream's last message, asked at a tick the follower had brought nothing since
    /// the one before.
    suspect: Option<u64>,
    /// The stream's last message when the follower was last replaced: not again for it (a
    /// message removed from the stream is never brought).
    replaced_for: u64,
}

impl Quiet {
    pub(super) fn new(at: u64) -> Quiet {
        Quiet { at_tick: at, ..Quiet::default() }
    }

    /// Whether the follower, at `now`, is to be replaced.
    pub(super) async fn stalled(&mut self, now: u64, stream: &stream::Stream) -> bool {
        if std::mem::replace(&mut self.at_tick, now) != now {
            self.suspect = None;
            return false;
        }
        if let Some(last) = self.suspect.take().filter(|last| *last > now && *last != self.replaced_for) {
            self.replaced_for = last;
            return true;
        }
        if let Ok(Ok(info)) = tokio::time::timeout(QUIET_WAIT, stream.get_info()).await {
            self.suspect = Some(info.state.last_sequence).filter(|last| *last > now);
        }
        false
    }
}
