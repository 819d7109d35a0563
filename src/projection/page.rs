//! Paging a listing of projected values: a page, and bounds on the times it is filtered by.

/// A page of a listing, and whether more follow it.
pub struct Page<T> {
    pub items: Vec<T>,
    pub has_more: bool,
}

/// Bounds on a time, each RFC 3339 in UTC with microseconds as stored (so they compare as
/// text): strictly after `gt`, at or after `gte`, strictly before `lt`, at or before `lte`.
#[derive(Debug, Clone, Default)]
pub struct TimeBounds {
    pub gt: Option<String>,
    pub gte: Option<String>,
    pub lt: Option<String>,
    pub lte: Option<String>,
}

impl TimeBounds {
    pub fn is_empty(&self) -> bool {
        self.gt.is_none() && self.gte.is_none() && self.lt.is_none() && self.lte.is_none()
    }

    pub fn contains(&self, time: &str) -> bool {
        self.gt.as_deref().is_none_or(|b| time > b)
            && self.gte.as_deref().is_none_or(|b| time >= b)
            && self.lt.as_deref().is_none_or(|b| time < b)
            && self.lte.as_deref().is_none_or(|b| time <= b)
    }

    /// Whether everything older than `time` is out of bounds too (so a newest-first
    /// listing can stop).
    pub fn older_all_out(&self, time: &str) -> bool {
        self.gt.as_deref().is_some_and(|b| time <= b) || self.gte.as_deref().is_some_and(|b| time < b)
    }

    /// Whether everything newer than `time` is out of bounds too.
    pub fn newer_all_out(&self, time: &str) -> bool {
        self.lt.as_deref().is_some_and(|b| time >= b) || self.lte.as_deref().is_some_and(|b| time > b)
    }
}
