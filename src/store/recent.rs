//! The newest events of a session, kept in memory as they were published, so that a reader
//! near the end of the log (a catch-up, a reconnecting browser, a new watcher) is answered
//! from memory rather than from the store: no tree walk and no copy per event, the events'
//! bytes shared with the commit that wrote them.
//!
//! A session's recent events are a run of whole commits, contiguous in the log and ending
//! at its last published one: at most `per_session` bytes of events, and `total` bytes
//! across every session (a commit that finds the total spent starts its session's run
//! anew from itself, or keeps none). They live in the session's live channel and go with
//! it, when nobody has held it for a while (see [`super::hub::Hub::sweep`]).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use super::hub::Batch;
use crate::domain::{EventId, RawEvent};
use crate::metrics;

/// How much the hub keeps: per session and in all.
#[derive(Debug, Default)]
pub struct Budget {
    per_session: usize,
    total: usize,
    used: AtomicUsize,
}

impl Budget {
    /// Keeps up to `per_session` bytes of each session's newest events, `total` in all (0: none).
    pub fn new(per_session: usize, total: usize) -> Arc<Budget> {
        Arc::new(Budget { per_session: per_session.min(total), total, used: AtomicUsize::new(0) })
    }

    /// The bytes kept now, across sessions.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// Takes `bytes` of the total if they fit.
    fn take(&self, bytes: usize) -> bool {
        let fits = self.used.fetch_add(bytes, Ordering::Relaxed) + bytes <= self.total;
        if !fits {
            self.used.fetch_sub(bytes, Ordering::Relaxed);
        }
        metrics::RECENT_BYTES.set(self.used() as i64);
        fits
    }

    fn give_back(&self, bytes: usize) {
        self.used.fetch_sub(bytes, Ordering::Relaxed);
        metrics::RECENT_BYTES.set(self.used() as i64);
    }
}

/// One session's newest commits.
pub struct Recent {
    budget: Arc<Budget>,
    runs: Mutex<Run>,
}

#[derive(Default, Clone)]
struct Run {
    commits: VecDeque<Batch>,
    bytes: usize,
}

fn size(commit: &[RawEvent]) -> usize {
    commit.iter().map(|event| event.json.len()).sum()
}

impl Recent {
    pub fn new(budget: Arc<Budget>) -> Recent {
        Recent { budget, runs: Mutex::default() }
    }

    /// Keeps a commit just published (`bytes` of events; the one after the last kept, if
    /// any), dropping the oldest ones beyond the budget. A commit that does not fit empties
    /// the run: what is kept is always contiguous.
    pub fn keep(&self, commit: &Batch, bytes: usize) {
        if self.budget.per_session == 0 || commit.is_empty() {
            return;
        }
        let mut run = self.runs.lock();
        if bytes > self.budget.per_session || !self.budget.take(bytes) {
            self.forget(&mut run);
            return;
        }
        run.commits.push_back(commit.clone());
        run.bytes += bytes;
        while run.bytes > self.budget.per_session {
            let Some(oldest) = run.commits.pop_front() else { break };
            let freed = size(&oldest);
            run.bytes -= freed;
            self.budget.give_back(freed);
        }
    }

    fn forget(&self, run: &mut Run) {
        self.budget.give_back(run.bytes);
        *run = Run::default();
    }

    /// Up to `limit` events after `after` (from the log's first when `None`) and before
    /// `before`, oldest first, if the run holds `after` and what follows it (or, from the
    /// start, the log's first event): `None` when it cannot say. The events
    /// returned are the log's next ones, without a gap; the caller reads any more from the
    /// store after the last of them.
    pub fn after(&self, after: Option<EventId>, before: Option<EventId>, limit: usize) -> Option<Vec<RawEvent>> {
        let newer = |event: &RawEvent| after.is_none_or(|after| event.id > after);
        // The commits that hold the answer, taken under the lock (a few pointers).
        let commits: Vec<Batch> = {
            let run = self.runs.lock();
            let first = run.commits.front()?.first()?;
            let last = run.commits.back()?.last()?;
            match after {
                // The log's first event must be the run's.
                None if first.seq != 1 => return None,
                // The run holds the event after `after` only if it starts at or before
                // `after` (ids grow with the log) and goes on past it.
                Some(after) if after < first.id || after >= last.id => return None,
                _ => {}
            }
            let start = run.commits.partition_point(|commit| commit.last().is_some_and(|last| !newer(last)));
            let mut counted = 0;
            let enough = |commit: &&Batch| {
                let more = counted < limit;
                counted += commit.len() - commit.partition_point(|event| !newer(event));
                more
            };
            run.commits.range(start..).take_while(enough).cloned().collect()
        };
        let mut events = Vec::with_capacity(limit.min(1024));
        for commit in &commits {
            let from = commit.partition_point(|event| !newer(event));
            for event in &commit[from..] {
                if events.len() == limit || before.is_some_and(|before| event.id >= before) {
                    return Some(events);
                }
                events.push(event.clone());
            }
        }
        Some(events)
    }
}

impl Drop for Recent {
    fn drop(&mut self) {
        let run = std::mem::take(&mut *self.runs.lock());
        if run.bytes > 0 {
            self.budget.give_back(run.bytes);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn event(seq: u64) -> RawEvent {
        RawEvent { id: EventId(ulid::Ulid::from_parts(seq, 0)), seq, json: Bytes::from(vec![b'x'; 10]) }
    }

    fn commit(seqs: std::ops::RangeInclusive<u64>) -> Batch {
        seqs.map(event).collect::<Vec<_>>().into()
    }

    fn keep(recent: &Recent, seqs: std::ops::RangeInclusive<u64>) {
        let commit = commit(seqs);
        recent.keep(&commit, size(&commit));
    }

    fn seqs(events: Option<Vec<RawEvent>>) -> Option<Vec<u64>> {
        events.map(|events| events.iter().map(|e| e.seq).collect())
    }

    #[test]
    fn answers_from_the_run_only_what_follows_without_a_gap() {
        let recent = Recent::new(Budget::new(1000, 1000));
        keep(&recent, 1..=3);
        keep(&recent, 4..=5);
        let id = |seq| Some(event(seq).id);
        assert_eq!(seqs(recent.after(None, None, 10)), Some(vec![1, 2, 3, 4, 5]));
        assert_eq!(seqs(recent.after(id(2), None, 2)), Some(vec![3, 4]));
        assert_eq!(seqs(recent.after(id(3), id(5), 10)), Some(vec![4]));
        // Nothing after the last kept: the store may have more (published later).
        assert_eq!(seqs(recent.after(id(5), None, 10)), None);
        // An id between events (a turn's start, say) reads from the next event on.
        let between = Some(EventId(ulid::Ulid::from_parts(2, 7)));
        assert_eq!(seqs(recent.after(between, None, 10)), Some(vec![3, 4, 5]));
    }

    #[test]
    fn the_oldest_commits_go_beyond_the_budget_and_a_run_that_starts_later_cannot_answer_before_it() {
        let budget = Budget::new(50, 1000);
        let recent = Recent::new(budget.clone());
        keep(&recent, 1..=3);
        keep(&recent, 4..=6); // 60 bytes: 1..=3 goes
        assert_eq!(budget.used(), 30);
        assert_eq!(seqs(recent.after(None, None, 10)), None, "the log's first event is no longer kept");
        assert_eq!(seqs(recent.after(Some(event(2).id), None, 10)), None, "event 3 is no longer kept");
        // (The run must hold `after` itself: only then is the next event known to be the run's.)
        assert_eq!(seqs(recent.after(Some(event(3).id), None, 10)), None);
        assert_eq!(seqs(recent.after(Some(event(4).id), None, 10)), Some(vec![5, 6]));
        // A commit larger than a session's share empties the run.
        keep(&recent, 7..=12);
        assert_eq!(budget.used(), 0);
        assert_eq!(seqs(recent.after(Some(event(8).id), None, 10)), None);
        drop(recent);
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn sessions_share_the_total_and_give_it_back_when_dropped() {
        let budget = Budget::new(40, 50);
        let (a, b) = (Recent::new(budget.clone()), Recent::new(budget.clone()));
        keep(&a, 1..=3);
        keep(&b, 1..=3); // 60 of 50: b keeps nothing
        assert_eq!(budget.used(), 30);
        assert_eq!(seqs(b.after(None, None, 10)), None);
        drop(a);
        assert_eq!(budget.used(), 0);
        keep(&b, 4..=4);
        keep(&b, 5..=5);
        assert_eq!(budget.used(), 20);
        assert_eq!(seqs(b.after(Some(event(4).id), None, 10)), Some(vec![5]));
    }
}
