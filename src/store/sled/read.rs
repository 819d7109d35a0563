//! Reading the log: a session's events within what is durable, by range, by id or by
//! number, and the projections' trees, in key order.

use std::ops::Bound;

use ::sled::IVec;
use bytes::Bytes;

use super::{bytes_of, keys, raw_event, KeyRange, SledLog};
use crate::domain::{EventId, RawEvent, SessionId};
use crate::store::{Key, ReadRange, Scan, StoreError};

impl SledLog {
    /// The keys of `range` within what is durable of the session's log, if any.
    pub(super) fn durable_keys(&self, session: SessionId, range: ReadRange) -> Result<Option<KeyRange>, StoreError> {
        let durable = self.inner.channel(session)?.durable();
        // Nothing durable yet, or nothing durable after `after` (an append of its own the
        // caller knows is ordered, not yet flushed).
        let Some(last) = durable.last.filter(|last| range.after.is_none_or(|after| after < *last)) else {
            return Ok(None);
        };
        let (lower, mut upper) = keys::range(session, range.after, last);
        if let Some(before) = range.before.filter(|&before| before <= last) {
            upper = Bound::Excluded(keys::event_key(session, before));
        }
        Ok(Some((lower, upper)))
    }

    /// The events of `range`: oldest first from the session's recent commits where they
    /// hold its start (then any more from the tree), else from the tree.
    pub(super) fn read_sync(&self, session: SessionId, range: ReadRange) -> Result<Vec<RawEvent>, StoreError> {
        if !range.newest_first {
            let recent = self.inner.channel(session)?.recent.after(range.after, range.before, range.limit);
            if let Some(mut events) = recent.filter(|events| !events.is_empty()) {
                if events.len() < range.limit {
                    let after = events.last().map(|last| last.id);
                    let rest = ReadRange { after, limit: range.limit - events.len(), ..range };
                    events.extend(self.scan_events(session, rest, raw_event)?);
                }
                return Ok(events);
            }
        }
        self.scan_events(session, range, raw_event)
    }

    /// `take` of each stored event of the session within `range` (its key and value).
    pub(super) fn scan_events<T>(
        &self,
        session: SessionId,
        range: ReadRange,
        take: impl Fn(&[u8], IVec) -> T,
    ) -> Result<Vec<T>, StoreError> {
        let Some(keys) = self.durable_keys(session, range)? else { return Ok(Vec::new()) };
        let iter = self.inner.events.range::<keys::EventKey, _>(keys);
        let take = |item: Result<(IVec, IVec), ::sled::Error>| item.map(|(k, v)| take(&k, v));
        let events: Result<Vec<_>, _> = if range.newest_first {
            iter.rev().take(range.limit).map(take).collect()
        } else {
            iter.take(range.limit).map(take).collect()
        };
        Ok(events?)
    }

    /// The event numbered `seq`, found by bisecting the id space: ids grow with sequence
    /// numbers, so each probe (the first event at or after an id) halves the interval.
    pub(super) fn event_at_sync(&self, session: SessionId, seq: u64) -> Result<Option<RawEvent>, StoreError> {
        let durable = self.inner.channel(session)?.durable();
        let Some(last) = durable.last.filter(|_| seq >= 1 && seq <= durable.seq) else {
            return Ok(None);
        };
        let upto = keys::event_key(session, last);
        let (mut low, mut high) = (0u128, u128::from(last.ulid()));
        while low <= high {
            let mid = low + (high - low) / 2;
            let from = keys::event_key(session, EventId(ulid::Ulid::from(mid)));
            let Some(item) = self.inner.events.range(from..=upto).next() else { return Ok(None) };
            let (key, value) = item?;
            let event = raw_event(&key, value);
            match event.seq.cmp(&seq) {
                std::cmp::Ordering::Equal => return Ok(Some(event)),
                std::cmp::Ordering::Less => low = u128::from(event.id.ulid()) + 1,
                // Nothing lies between `mid` and this event, so the one sought is below `mid`.
                std::cmp::Ordering::Greater if mid == 0 => return Ok(None),
                std::cmp::Ordering::Greater => high = mid - 1,
            }
        }
        Ok(None)
    }

    pub(super) fn scan_sync(&self, projection: &str, scan: Scan) -> Result<Vec<(Key, Bytes)>, StoreError> {
        let tree = self.inner.tree(projection)?;
        let (mut lower, mut upper) = match scan.session {
            Some(session) => {
                let next = u128::from(session.ulid()).checked_add(1).map(|n| n.to_be_bytes().to_vec());
                (Bound::Included(keys::session_key(session).to_vec()), next.map_or(Bound::Unbounded, Bound::Excluded))
            }
            None => (Bound::Unbounded, Bound::Unbounded),
        };
        if let Some(after) = scan.after {
            let after = Bound::Excluded(keys::projection_key(after));
            if scan.newest_first {
                upper = after;
            } else {
                lower = after;
            }
        }
        let iter = tree.range::<Vec<u8>, _>((lower, upper));
        let entry = |item: Result<(IVec, IVec), ::sled::Error>| -> Result<(Key, Bytes), StoreError> {
            let (key, value) = item?;
            let key = keys::key_from_bytes(&key).ok_or_else(|| StoreError::new("a projection key is malformed"))?;
            Ok((key, bytes_of(value)))
        };
        if scan.newest_first {
            iter.rev().take(scan.limit).map(entry).collect()
        } else {
            iter.take(scan.limit).map(entry).collect()
        }
    }
}
