//! [`Sessions`]: the front door. Each call that names a session takes the summary that
//! [`Sessions::get`] gave the caller, so ownership is checked once, where the id arrives.

use std::collections::BTreeMap;
use std::sync::Arc;

use ulid::Ulid;

use super::log::SessionLog;
use super::{Caller, Cursor, Follower, SessionError};
use crate::agent::mcp::{name_tools, McpServerConfig};
use crate::agent::Agents;
use crate::catalog::Catalog;
use crate::domain::event::SessionSpec;
use crate::domain::message::waiting_calls;
use crate::domain::{Draft, EventBody, EventId, Message, RawEvent, SessionId, TurnId, Usage};
use crate::engine::decide::seed_waiting;
use crate::engine::plan::ToolPlan;
use crate::engine::{rules, Closing, Engine, SessionUpdate, Submission, Submitted};
use crate::projection::history::History;
use crate::projection::turns::{OpenTurn, OpenTurns, Processed, ProcessedInput, TurnState};
use crate::projection::{Page, SessionIndex, SessionSummary, TimeBounds, TurnIndex, TurnSummary};
use crate::store::{Key, Position, ReadRange, Scan};

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

/// A page of a session's events: after and before cursors (exclusive), in either order,
/// of the given types only (all when empty).
#[derive(Debug, Clone, Default)]
pub struct EventQuery {
    pub after: Option<Cursor>,
    pub before: Option<Cursor>,
    pub limit: usize,
    pub newest_first: bool,
    pub kinds: Vec<String>,
    /// Bounds on the events' times.
    pub created: TimeBounds,
}

pub struct EventPage {
    pub events: Vec<RawEvent>,
    pub has_more: bool,
}

/// What a session is doing, from the log.
#[derive(Debug, Clone, Copy, Default)]
pub struct Activity {
    /// A turn runs (started, not yet stopped).
    pub running: bool,
    /// The usage of all its turns.
    pub usage: Usage,
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

/// A page of a session's turns, newest first, strictly before `before`.
#[derive(Debug, Clone, Copy, Default)]
pub struct TurnQuery {
    pub before: Option<TurnId>,
    pub limit: usize,
}

/// Projected values read per step of a filtered listing.
const SCAN_CHUNK: usize = 256;

#[derive(Clone)]
pub struct Sessions {
    pub(super) log: SessionLog,
    pub(super) engine: Engine,
    agents: Arc<Agents>,
    catalog: Arc<Catalog>,
}

impl Sessions {
    /// The engine underneath the log, if it is a client of one (see [`crate::store::Log::health`]).
    pub fn health(&self) -> Option<crate::store::Health> {
        self.log.health()
    }

    pub(crate) fn new(log: SessionLog, engine: Engine, agents: Arc<Agents>, catalog: Arc<Catalog>) -> Sessions {
        Sessions { log, engine, agents, catalog }
    }

    /// Every agent (configured and made through an API) and the server tools.
    pub fn agents(&self) -> &Agents {
        &self.agents
    }

    /// Agents and environments made through an API.
    pub fn catalog(&self) -> &Catalog {
        &self.catalog
    }

    /// Checks `spec` against its agent and starts the session's log. A seed history that
    /// ends with tool calls leaves them waiting for the client, as if the model had just
    /// made them.
    pub async fn create(&self, caller: &Caller, mut spec: SessionSpec) -> Result<SessionSummary, SessionError> {
        // An agent that is not there is not found (404), as a session that is not there is:
        // which agents exist is the server's to say, not a fault of the request's shape.
        let Some(agent) = self.agents.get_version(&spec.agent.name, spec.agent.version) else {
            return Err(SessionError::CatalogNotFound(match spec.agent.version {
                Some(version) => format!("agent {:?} version {version}", spec.agent.name),
                None => format!("agent {:?}", spec.agent.name),
            }));
        };
        // A catalog agent's session runs the version it was created with.
        spec.agent.version = agent.definition.as_ref().map(|d| d.version);
        self.catalog.usable(caller, &agent)?;
        if let Some(environment) = &spec.environment_id {
            let environment = self.catalog.environment(caller, environment).await?;
            if environment.archived_at.is_some() {
                let id = environment.id;
                return Err(SessionError::Invalid(format!("invalid field `environment_id`: {id} is archived")));
            }
        }
        rules::check_new(&agent, &self.agents.tools, &mut spec)?;
        let id = SessionId::generate();
        let mut plan = ToolPlan::new(&agent, &self.agents.tools, &spec, &Default::default());
        // A seed history's calls of the agent's MCP tools wait like any other: the tools
        // are listed to know them (so the servers start here), and a server that cannot
        // be reached refuses the session rather than deny its calls.
        let unknown = waiting_calls(&spec.messages).any(|(_, name, _)| !plan.modes.contains_key(&name));
        if unknown && !agent.mcp.is_empty() {
            let (mut tools, _) = agent.mcp.tools().await.map_err(|e| {
                SessionError::Unavailable(format!("the history ends with tool calls, and to know them: {e}"))
            })?;
            name_tools(&mut tools);
            plan.add_mcp(tools);
        }
        let waiting = seed_waiting(&spec.messages, &plan, TurnId::generate());
        let created = Draft::new(None, &EventBody::SessionCreated { spec, created_by: caller.subject.clone() });
        self.engine.start(id, created, waiting).await?;
        let summary = self.log.summary(id).await?.ok_or_else(|| SessionError::NotFound(id.to_string()))?;
        Ok(self.redacted(summary))
    }

    /// Gives the session MCP servers its client declared (ACP's `mcpServers`), in place of
    /// any it had (none: it has none), until the session is archived or deleted or this
    /// process stops. They are never stored: their `env` and `headers` may hold secrets;
    /// the log records the server of each call. A caller that is not an admin may declare
    /// only URLs on hosts the config allows. A name the agent's own servers use is refused,
    /// and so is an archived session (it takes no more turns).
    pub async fn attach_mcp(
        &self,
        caller: &Caller,
        id: &str,
        servers: BTreeMap<String, McpServerConfig>,
    ) -> Result<(), SessionError> {
        let summary = self.get(caller, id).await?;
        if summary.archived_at.is_some() && !servers.is_empty() {
            return Err(SessionError::Conflict(format!("session {id} is archived: it takes no MCP servers")));
        }
        let mut servers = servers;
        self.check_mcp(caller, &summary.spec.agent.name, summary.spec.agent.version, &mut servers)?;
        match servers.is_empty() {
            true => self.agents.detach(summary.id).await,
            false => self.agents.attach(summary.id, servers).await,
        }
        Ok(())
    }

    /// [`Sessions::create`], the session then given the MCP servers its client declared
    /// (see [`Sessions::attach_mcp`]): checked first, so a refused server makes no session.
    pub async fn create_with_mcp(
        &self,
        caller: &Caller,
        spec: SessionSpec,
        servers: BTreeMap<String, McpServerConfig>,
    ) -> Result<SessionSummary, SessionError> {
        let mut servers = servers;
        self.check_mcp(caller, &spec.agent.name, spec.agent.version, &mut servers)?;
        let summary = self.create(caller, spec).await?;
        if !servers.is_empty() {
            self.agents.attach(summary.id, servers).await;
        }
        Ok(summary)
    }

    /// Whether the caller may give a session of `agent` (at `version`) these MCP servers
    /// (see [`Sessions::attach_mcp`]); each is made to ask before every call, as a server
    /// the operator did not declare must.
    fn check_mcp(
        &self,
        caller: &Caller,
        agent: &str,
        version: Option<u32>,
        servers: &mut BTreeMap<String, McpServerConfig>,
    ) -> Result<(), SessionError> {
        let agent = self.agents.get_version(agent, version);
        let allowed = &self.agents.tools.settings().mcp.allowed_hosts;
        for (name, config) in servers.iter_mut() {
            config.permission = crate::domain::event::Permission::Ask;
            config.tools.clear();
            let at = format!("MCP server {name:?}");
            config.check(&at, name).map_err(SessionError::Invalid)?;
            if !caller.admin {
                config.check_reach(&at, allowed).map_err(SessionError::Invalid)?;
            }
            if agent.as_ref().is_some_and(|a| a.mcp.has(name)) {
                return Err(SessionError::Invalid(format!("{at}: the agent has a server of that name")));
            }
        }
        Ok(())
    }

    /// The session if it exists, is not deleted, and the caller may see it: one answer
    /// (not found) for all three, so ids of other subjects are not disclosed. Secret
    /// option values are redacted.
    pub async fn get(&self, caller: &Caller, id: &str) -> Result<SessionSummary, SessionError> {
        let not_found = || SessionError::NotFound(id.to_string());
        let session: SessionId = id.parse().map_err(|_| not_found())?;
        match self.log.summary(session).await? {
            Some(summary) if !summary.deleted && caller.may_use(&summary.created_by) => Ok(self.redacted(summary)),
            _ => Err(not_found()),
        }
    }

    fn redacted(&self, mut summary: SessionSummary) -> SessionSummary {
        let agent = self.agents.get_version(&summary.spec.agent.name, summary.spec.agent.version);
        rules::redact(agent.as_deref(), &mut summary.spec);
        summary
    }

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

    /// Cancels what runs in the session and records its end, then appends
    /// `session.deleted` and `terminated`; every open stream ends after the latter.
    pub async fn delete(&self, caller: &Caller, id: &str) -> Result<(), SessionError> {
        let summary = self.get(caller, id).await?;
        self.engine.close(summary.id, Closing::Delete).await?;
        self.agents.detach(summary.id).await;
        Ok(())
    }

    /// Cancels what runs and records its end, then archives the session: it keeps its log,
    /// lists only when asked for, and takes no more input. Archiving twice is archiving once.
    pub async fn archive(&self, session: &SessionSummary) -> Result<SessionSummary, SessionError> {
        self.engine.close(session.id, Closing::Archive).await?;
        self.agents.detach(session.id).await;
        self.reread(session).await
    }

    /// Changes the session's setup (title, metadata patch, tools, agent options), through
    /// its actor like any input.
    pub async fn update(
        &self,
        session: &SessionSummary,
        update: SessionUpdate,
    ) -> Result<SessionSummary, SessionError> {
        if !update.is_empty() {
            self.engine.submit(session.id, Submission { update, ..Submission::default() }).await?;
        }
        self.reread(session).await
    }

    /// The session as it is now, redacted.
    async fn reread(&self, session: &SessionSummary) -> Result<SessionSummary, SessionError> {
        let summary = self.log.summary(session.id).await?.filter(|s| !s.deleted);
        Ok(self.redacted(summary.ok_or_else(|| SessionError::NotFound(session.id.to_string()))?))
    }

    /// Makes a session and hands it its first input. Input a new session would refuse (too
    /// much of it, an event too large) is refused before the session is made, so that such
    /// a request leaves nothing behind. (A seed history decides the new session's state, so
    /// with one the input is checked as it is submitted, after.)
    pub async fn create_with_input(
        &self,
        caller: &Caller,
        spec: SessionSpec,
        first: Submission,
    ) -> Result<SessionSummary, SessionError> {
        if first.inputs.is_empty() {
            return self.create(caller, spec).await;
        }
        if spec.messages.is_empty() {
            let new = TurnState::default();
            crate::engine::decide::decide(&new, &first, None, TurnId::generate(), self.engine.limits())?;
        }
        let summary = self.create(caller, spec).await?;
        self.submit(&summary, first).await?;
        Ok(summary)
    }

    /// Hands input to the session's engine. Refusals come back before anything is stored.
    pub async fn submit(&self, session: &SessionSummary, submission: Submission) -> Result<Submitted, SessionError> {
        self.engine.submit(session.id, submission).await
    }

    /// The session's history, folded from its whole log.
    pub async fn history(&self, session: &SessionSummary) -> Result<Vec<Message>, SessionError> {
        let mut history = History::default();
        self.log
            .fold(session.id, Position::default(), |raw| {
                if let Ok(event) = raw.decode() {
                    history.apply(&event);
                }
            })
            .await?;
        Ok(history.messages.into_iter().map(Arc::unwrap_or_clone).collect())
    }

    /// A page of the session's events.
    pub async fn events(&self, session: &SessionSummary, query: EventQuery) -> Result<EventPage, SessionError> {
        let mut after = self.after(session, query.after).await?.last;
        let mut before = None;
        if let Some(cursor) = query.before {
            match self.position(session, cursor).await?.last {
                Some(id) => before = Some(id),
                // Before the start of the log: nothing.
                None => return Ok(EventPage { events: Vec::new(), has_more: false }),
            }
        }
        // Read one more than asked to know whether there is more; with a type filter, read
        // on in chunks until enough events match.
        let wanted = |e: &RawEvent| {
            (query.kinds.is_empty() || query.kinds.iter().any(|k| k == e.kind()))
                && (query.created.is_empty() || e.created_at().is_some_and(|t| query.created.contains(t)))
        };
        let filtered = !(query.kinds.is_empty() && query.created.is_empty());
        let mut found: Vec<RawEvent> = Vec::new();
        loop {
            // Unfiltered, one read of one more than asked answers the page and `has_more`.
            let chunk = if filtered { (query.limit + 1).max(256) } else { query.limit + 1 };
            let range = ReadRange { after, before, limit: chunk, newest_first: query.newest_first };
            let events = self.log.read(session.id, range).await?;
            let exhausted = events.len() < chunk;
            if let Some(last) = events.last() {
                if query.newest_first {
                    before = Some(last.id);
                } else {
                    after = Some(last.id);
                }
            }
            found.extend(events.into_iter().filter(wanted));
            if found.len() > query.limit || exhausted {
                break;
            }
        }
        let has_more = found.len() > query.limit;
        found.truncate(query.limit);
        for event in found.iter_mut().filter(|e| e.is_queued()) {
            *event = self.as_processed(session, event).await?;
        }
        Ok(EventPage { events: found, has_more })
    }

    /// A queued message as it reads once a turn has taken it (`processed_at` set), or as
    /// it is while it still waits.
    async fn as_processed(&self, session: &SessionSummary, event: &RawEvent) -> Result<RawEvent, SessionError> {
        let key = Key { session: session.id, item: Some(event.id.ulid()) };
        let processed: Option<Processed> = self.log.projected(ProcessedInput::NAME, key).await?;
        Ok(processed.map_or_else(|| event.clone(), |p| event.processed(&p.at)))
    }

    /// What the session is doing: whether a turn runs, and the usage of all its turns.
    pub async fn activity(&self, session: &SessionSummary) -> Result<Activity, SessionError> {
        let open: Option<OpenTurn> = self.log.projected(OpenTurns::NAME, Key::session(session.id)).await?;
        let open = open.unwrap_or_default();
        Ok(Activity { running: open.turn.is_some(), usage: open.usage })
    }

    /// A follower of the session's log after `after` (from the start when `None`).
    pub async fn follow(&self, session: &SessionSummary, after: Option<Cursor>) -> Result<Follower, SessionError> {
        let position = self.after(session, after).await?;
        self.log.follower(session.id, position).await
    }

    /// A follower that starts at the current end of the log (live only).
    pub async fn follow_live(&self, session: &SessionSummary) -> Result<Follower, SessionError> {
        self.log.live(session.id).await
    }

    /// The session's turns, newest first.
    pub async fn turns(&self, session: &SessionSummary, query: TurnQuery) -> Result<Page<TurnSummary>, SessionError> {
        let after = query.before.map(|turn| Key { session: session.id, item: Some(turn.ulid()) });
        let scan = Scan { session: Some(session.id), after, newest_first: true, limit: query.limit + 1 };
        let mut items: Vec<TurnSummary> =
            self.log.scan(TurnIndex::NAME, scan).await?.into_iter().map(|(_, turn)| turn).collect();
        let has_more = items.len() > query.limit;
        items.truncate(query.limit);
        Ok(Page { items, has_more })
    }

    /// One turn of the session, by its id as a client sent it.
    pub async fn turn(&self, session: &SessionSummary, id: &str) -> Result<TurnSummary, SessionError> {
        let not_found = || SessionError::TurnNotFound { turn: id.to_string(), session: session.id.to_string() };
        let turn: TurnId = id.parse().map_err(|_| not_found())?;
        self.turn_by_id(session, turn).await?.ok_or_else(not_found)
    }

    async fn turn_by_id(&self, session: &SessionSummary, turn: TurnId) -> Result<Option<TurnSummary>, SessionError> {
        self.log.projected(TurnIndex::NAME, Key { session: session.id, item: Some(turn.ulid()) }).await
    }

    /// A turn's events after its turn sequence number `after` (0: from its start), at most
    /// `limit`. A turn's events lie between its `turn.started` and the next turn's.
    pub async fn turn_events(
        &self,
        session: &SessionSummary,
        turn: &TurnSummary,
        after: u32,
        limit: usize,
    ) -> Result<Vec<RawEvent>, SessionError> {
        let mut from = Some(just_before(turn.first_event));
        let mut out = Vec::new();
        while out.len() < limit {
            let range = ReadRange { after: from, before: None, limit: 512, newest_first: false };
            let events = self.log.read(session.id, range).await?;
            let Some(last) = events.last() else { break };
            from = Some(last.id);
            for event in events {
                match event.turn() {
                    Some((of, n)) if of == turn.id && n > after && out.len() < limit => out.push(event),
                    Some((of, _)) if of != turn.id && event.kind() == "turn.started" => return Ok(out),
                    _ => {}
                }
            }
        }
        Ok(out)
    }

    /// The session's events with these ids, in the order given (ids not in its log are
    /// left out): the queued messages a `turn.input` names, say.
    pub async fn events_by_id(&self, session: &SessionSummary, ids: &[EventId]) -> Result<Vec<RawEvent>, SessionError> {
        let mut found = Vec::with_capacity(ids.len());
        for id in ids {
            if let Some(event) = self.log.event(session.id, *id).await? {
                found.push(self.as_processed(session, &event).await?);
            }
        }
        Ok(found)
    }

    /// The position from which to read after `cursor` (the start when `None`).
    async fn after(&self, session: &SessionSummary, cursor: Option<Cursor>) -> Result<Position, SessionError> {
        match cursor {
            Some(cursor) => self.position(session, cursor).await,
            None => Ok(Position::default()),
        }
    }

    /// The position of `cursor`, which must name a point in this session's log.
    async fn position(&self, session: &SessionSummary, cursor: Cursor) -> Result<Position, SessionError> {
        let unknown = || SessionError::UnknownCursor(cursor.to_string());
        let at = |event: RawEvent| Position { last: Some(event.id), seq: event.seq };
        match cursor {
            Cursor::Event(id) => self.log.event(session.id, id).await?.map(at).ok_or_else(unknown),
            Cursor::Message(message) => self.message(session, message).await?.map(at).ok_or_else(unknown),
            Cursor::Sequence(0) => Ok(Position::default()),
            Cursor::Sequence(n) => self.log.event_at(session.id, n).await?.map(at).ok_or_else(unknown),
            Cursor::Turn { turn, sequence } => {
                let summary = self.turn_by_id(session, turn).await?.ok_or_else(unknown)?;
                if sequence == 0 {
                    return Ok(Position {
                        last: Some(just_before(summary.first_event)),
                        seq: summary.first_sequence - 1,
                    });
                }
                let events = self.turn_events(session, &summary, sequence - 1, 1).await?;
                events.into_iter().find(|e| e.turn() == Some((turn, sequence))).map(at).ok_or_else(unknown)
            }
        }
    }
}

impl Sessions {
    /// The final event of agent message (or thinking) `msg_<message>`, found from the end of
    /// the log back: a client resumes after a message it saw lately, so the search is short
    /// where it matters, and the write path keeps no index for it.
    async fn message(&self, session: &SessionSummary, message: Ulid) -> Result<Option<RawEvent>, SessionError> {
        let field = format!(",\"message_id\":\"msg_{message}\"");
        let mut before = None;
        loop {
            let range = ReadRange { after: None, before, limit: 512, newest_first: true };
            let events = self.log.read(session.id, range).await?;
            let Some(last) = events.last() else { return Ok(None) };
            before = Some(last.id);
            let final_event = |e: &&RawEvent| matches!(e.kind(), "agent.message" | "agent.thinking");
            let named = |e: &&RawEvent| e.json.windows(field.len()).any(|w| w == field.as_bytes());
            if let Some(found) = events.iter().filter(final_event).find(named) {
                return Ok(Some(found.clone()));
            }
        }
    }
}

/// The id just before `event`: reading strictly after it starts at `event`. (Ids are
/// strictly increasing, so every earlier event is at or before it.)
fn just_before(event: EventId) -> EventId {
    EventId(Ulid::from(u128::from(event.ulid()) - 1))
}
