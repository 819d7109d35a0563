//! The engine's vocabulary: what a view can ask of a session (a [`Submission`] of
//! [`Input`], a [`Closing`]), what it gets back ([`Submitted`]), and the limits and settings
//! that hold whichever view asks.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::domain::event::{ClientRun, ClientTool, ToolTrust};
use crate::domain::{Block, RawEvent, RequestKey, TurnId};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineSettings {
    /// Model tokens are merged into at most one delta event per message this often.
    pub delta_coalesce_ms: u64,
    /// An actor with nothing to do for this long is dropped (its state is in the log).
    pub actor_idle_secs: u64,
    /// How long a write's idempotency key is honoured: sent again within this, it is
    /// answered with what was stored the first time.
    pub idempotency_hours: u64,
    /// A session with no event for this long, and no turn running, ends (`terminated`);
    /// 0: never. An agent's `idle_timeout_secs` overrides it for its sessions.
    #[serde(default)]
    pub session_idle_timeout_secs: u64,
    /// What becomes of turns a stopped process left (`[turns]`, set beside this section).
    #[serde(skip)]
    pub turns: TurnSettings,
}

/// Turns a stopped process left running (`[turns]`).
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TurnSettings {
    /// How many times one turn is resumed; a turn that stops the process once more is closed.
    pub max_resumes: u32,
}

impl Default for TurnSettings {
    fn default() -> TurnSettings {
        TurnSettings { max_resumes: 3 }
    }
}

/// How much input one submission may carry, whichever view it came through (`[limits]`).
#[derive(Debug, Clone, Copy)]
pub struct InputLimits {
    /// Pieces of input (events) in one submission.
    pub max_events_per_request: usize,
    /// The size of each event that input is stored as: its body's JSON, the envelope aside.
    pub max_event_bytes: usize,
}

/// One piece of input for a session.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Input {
    /// Starts a turn.
    Message(Vec<Block>),
    /// The result of a client tool call, by event id or tool call id.
    Result {
        call: String,
        content: Vec<Block>,
        is_error: bool,
        /// How the client ran it, where it says (boxed: most results have none).
        ran: Option<Box<ClientRun>>,
    },
    /// A permission decision on a server tool call, by event id or tool call id.
    /// `remember` applies it to every later call of the same tool in the session (ACP's
    /// allow-always and reject-always), including calls of it that wait now.
    Permission {
        call: String,
        granted: bool,
        reason: Option<String>,
        remember: bool,
    },
    /// Starts a turn that compacts the conversation so far, and does nothing else.
    Compact,
    /// Cancels the running turn (or the calls waiting for the client).
    Interrupt,
    /// Cancels the running turn, if one runs, and is answered once the turn's end is
    /// recorded; nothing else. Calls that wait for the client keep waiting (the harness sees
    /// a turn that waits as ended).
    Cancel,
    Outcome(Value),
}

impl Input {
    /// The content it carries: a message's, or a tool result's.
    pub fn content(&self) -> Option<&[Block]> {
        match self {
            Input::Message(content) | Input::Result { content, .. } => Some(content),
            _ => None,
        }
    }
}

/// How a session ends: deleted (its log ends with `terminated`, and every view answers 404
/// for it), or archived (kept and readable, but it takes no more input).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Closing {
    Delete,
    Archive,
    /// Ends the session if nothing happened in it for `idle_ms` and no turn runs: calls
    /// that wait for the client are cancelled, and the log ends with `terminated`.
    Expire {
        idle_ms: u64,
    },
}

/// Changes a submission makes to the session before its input: `tools` and the agent's
/// `tools` replace, its `options` merge by key, `title` and `mode` replace, and `metadata`
/// is a patch (a `null` value deletes its key).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct SessionUpdate {
    pub agent: Option<AgentChanges>,
    pub tools: Option<Vec<ClientTool>>,
    pub title: Option<String>,
    pub metadata: Option<Map<String, Value>>,
    /// One of the agent's `modes`, from the session's next turn on.
    pub mode: Option<String>,
    /// One of the agent's `models` (or `default`), from the session's next turn on.
    pub model: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct AgentChanges {
    pub tools: Option<Vec<ToolTrust>>,
    pub options: Option<Map<String, Value>>,
}

impl SessionUpdate {
    pub fn is_empty(&self) -> bool {
        self.agent.is_none()
            && self.tools.is_none()
            && self.title.is_none()
            && self.metadata.is_none()
            && self.mode.is_none()
            && self.model.is_none()
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Submission {
    pub update: SessionUpdate,
    pub inputs: Vec<Input>,
    /// Every waiting call must be resolved in one request (AAP).
    pub all_at_once: bool,
    /// What a user message does while a turn runs.
    pub when_busy: WhenBusy,
    /// The turn a turn this submission starts must follow.
    pub follows: Follows,
    /// The client's key for this write: sent again, it is answered with what was stored
    /// the first time (see [`crate::domain::request`]).
    #[serde(default)]
    pub request: Option<RequestKey>,
    /// The node that forwarded this submission here, set where it runs (never sent): the
    /// node its client talks to (see the actor's hand-over).
    #[serde(skip)]
    pub forwarded_by: Option<String>,
}

/// The turn a new turn must follow: the session's last, whichever it is (every view but the
/// harness), or one the client names (the harness's `previous_turn_id`), so that two
/// clients that both saw turn A cannot both chain a turn to it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Follows {
    #[default]
    Latest,
    /// No turn: the new turn must be the session's first.
    Nothing,
    Turn(TurnId),
    /// An earlier turn than the last, that the new turn branches from: what a `Turn` the
    /// actor found among the turns a session may branch from becomes.
    Branch(TurnId),
}

/// What a user message does while a turn runs: refused (AAP, native), or stored and
/// answered by the next turn once the running one ends (managed agents, as Anthropic's
/// API does).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum WhenBusy {
    #[default]
    Refuse,
    Queue,
}

/// What a submission did: the events it stored and the turn it started, if any.
#[derive(Debug, Clone)]
pub struct Submitted {
    pub events: Vec<RawEvent>,
    pub turn: Option<TurnId>,
    /// Stored by an earlier copy of this keyed submission (and read back), not by this one:
    /// a view that follows the session from its end must follow from these events instead.
    pub recalled: bool,
}
