//! Listing sessions: the caller's, newest (or oldest) first, filtered by agent, creator,
//! time and status, and each change to one as the caller may see it.

use super::{Activity, Caller, SessionError, Sessions};
use crate::domain::SessionId;
use crate::projection::{Page, SessionIndex, SessionSummary, TimeBounds};
use crate::store::{Key, Scan};

#[derive(Debug, Clone, Default)]
pub struct ListFilter {
    pub agent: Option<String>,
    /// With `agent`: only sessions of this version of it.
    pub agent_version: Option<u32>,
    pub created_by: Option<String>,
    pub created: TimeBounds,
    /// Only archived sessions (`Some(true)`) or only those not archived (`Some(false)`).
    pub archived: Option<bool>,
    /// Only sessions with a turn running (`Some(true)`) or without one (`Some(false)`).
    pub running: Option<bool>,
    pub oldest_first: bool,
    /// Continue after this session (in the listing's order).
    pub after: Option<SessionId>,
    pub limit: usize,
}

impl ListFilter {
    /// Only sessions in `status` (any, with `None`).
    pub fn with_status(self, status: Option<Status>) -> ListFilter {
        let (running, archived) = match status {
            None => (None, None),
            Some(Status::Running) => (Some(true), Some(false)),
            Some(Status::Idle) => (Some(false), Some(false)),
            Some(Status::Archived) => (None, Some(true)),
        };
        ListFilter { running, archived, ..self }
    }
}

/// A session's state as a list shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Running,
    Idle,
    /// Kept and readable; it takes no more input.
    Archived,
}

impl Status {
    pub fn of(summary: &SessionSummary, activity: &Activity) -> Status {
        match (summary.archived_at.is_some(), activity.running) {
            (true, _) => Status::Archived,
            (false, true) => Status::Running,
            (false, false) => Status::Idle,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Status::Running => "running",
            Status::Idle => "idle",
            Status::Archived => "archived",
        }
    }

    pub fn parse(text: &str) -> Option<Status> {
        [Status::Running, Status::Idle, Status::Archived].into_iter().find(|s| s.as_str() == text)
    }
}

/// A changed session as one caller sees it.
#[derive(Debug, Clone)]
pub enum Changed {
    /// As it stands now.
    Shown(Box<SessionSummary>, Status),
    /// Deleted: it leaves the caller's lists.
    Gone(SessionId),
    /// Not the caller's to see.
    Hidden,
}

/// Projected values read per step of a filtered listing.
const SCAN_CHUNK: usize = 256;

impl Sessions {
    /// The caller's sessions, newest first, filtered.
    pub async fn list(&self, caller: &Caller, filter: &ListFilter) -> Result<Page<SessionSummary>, SessionError> {
        let mut items = Vec::new();
        let mut after = filter.after.map(Key::session);
        // Enough for the page when nothing is filtered out; more per step when much is.
        let mut chunk = (filter.limit + 1).min(SCAN_CHUNK);
        loop {
            let scan = Scan { session: None, after, newest_first: !filter.oldest_first, limit: chunk };
            chunk = SCAN_CHUNK;
            let page = self.log.scan::<SessionSummary>(SessionIndex::NAME, scan).await?;
            let Some((last, _)) = page.last() else { return Ok(Page { items, has_more: false }) };
            after = Some(*last);
            for (_, summary) in page {
                let created = summary.created_at.as_str();
                // In creation order, everything further is out of bounds too.
                let past_bound = match filter.oldest_first {
                    false => filter.created.older_all_out(created),
                    true => filter.created.newer_all_out(created),
                };
                if past_bound {
                    return Ok(Page { items, has_more: false });
                }
                if !self.listed(caller, filter, &summary).await? {
                    continue;
                }
                if items.len() == filter.limit {
                    return Ok(Page { items, has_more: true });
                }
                items.push(self.redacted(summary));
            }
        }
    }

    async fn listed(
        &self,
        caller: &Caller,
        filter: &ListFilter,
        summary: &SessionSummary,
    ) -> Result<bool, SessionError> {
        let shown = !summary.deleted
            && caller.may_use(&summary.created_by)
            && filter.archived.is_none_or(|archived| summary.archived_at.is_some() == archived)
            && filter.agent.as_ref().is_none_or(|agent| &summary.spec.agent.name == agent)
            && filter.agent_version.is_none_or(|v| summary.spec.agent.version == Some(v))
            && filter.created_by.as_ref().is_none_or(|by| &summary.created_by == by)
            && filter.created.contains(&summary.created_at);
        match filter.running {
            Some(running) if shown => Ok(self.activity(summary).await?.running == running),
            _ => Ok(shown),
        }
    }

    /// The caller's session `id` as it stands now: for watchers of [`Sessions::changes`].
    pub async fn changed(&self, caller: &Caller, id: SessionId) -> Result<Changed, SessionError> {
        match self.log.summary(id).await? {
            Some(summary) if caller.may_use(&summary.created_by) && summary.deleted => Ok(Changed::Gone(id)),
            Some(summary) if caller.may_use(&summary.created_by) => {
                let status = Status::of(&summary, &self.activity(&summary).await?);
                Ok(Changed::Shown(Box::new(self.redacted(summary)), status))
            }
            _ => Ok(Changed::Hidden),
        }
    }

    /// Each session's status, for a page of them.
    pub async fn statuses(&self, sessions: &[SessionSummary]) -> Result<Vec<Status>, SessionError> {
        let mut statuses = Vec::with_capacity(sessions.len());
        for summary in sessions {
            statuses.push(Status::of(summary, &self.activity(summary).await?));
        }
        Ok(statuses)
    }

    /// Every session whose log grows from now on (anyone's: see [`Sessions::changed`]).
    pub fn changes(&self) -> tokio::sync::broadcast::Receiver<ulid::Ulid> {
        self.log.changes()
    }
}
