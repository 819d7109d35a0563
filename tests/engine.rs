//! The engine, given / when / then, without HTTP: given a session (and what happened in
//! it), when this input, expect these events in the log. Every test runs on the durable
//! sled log, on the JetStream log (one node, a real nats-server) and on the in-memory log
//! (`on_every_log!` at the end).

#[path = "common/nats.rs"]
mod nats;

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use turnlog::domain::event::{AgentSpec, Confirmation, ModelStop, SessionSpec, ToolTrust};
use turnlog::domain::{Block, Event, EventBody, StopReason, Usage};
use turnlog::domain::{Draft, EventId, RawEvent, SessionId};
use turnlog::projection::SessionSummary;
use turnlog::session::{
    Caller, Cursor, EventQuery, Follows, Input, SessionError, Sessions, Submission, Submitted, TurnQuery, WhenBusy,
};
use turnlog::store::memory::MemoryLog;
use turnlog::store::sled::{SledConfig, SledLog};
use turnlog::store::{AppendError, Log, Position, ReadRange, Store, StoreError, Subscription};
use turnlog::{Service, Settings};

/// The log a test runs on.
#[derive(Debug, Clone, Copy)]
enum Backend {
    Sled,
    Memory,
    /// On its own nats-server, one node.
    JetStream,
}

async fn open_log(backend: Backend) -> (Store, Option<Arc<nats::Nats>>) {
    match backend {
        Backend::Sled => {
            (Store::embedded(Arc::new(SledLog::open(SledConfig::default(), turnlog::projection::all()).unwrap())), None)
        }
        Backend::Memory => {
            (Store::embedded(Arc::new(MemoryLog::new(turnlog::projection::all(), 256, 1_000_000))), None)
        }
        Backend::JetStream => {
            let nats = nats::Nats::single().await;
            let log = nats::open_log(&nats).await;
            (Store::shared(Arc::new(log)), Some(Arc::new(nats)))
        }
    }
}

struct Given {
    settings: Settings,
    store: Store,
    /// The store's log, to append to it as another writer would.
    log: Arc<dyn Log>,
    /// Held so that the service (its sweeper, its engine) lives as long as the test.
    _service: Service,
    /// The nats-server under a JetStream log, kept as long as the test.
    _nats: Option<Arc<nats::Nats>>,
    sessions: Sessions,
    session: SessionSummary,
}

/// A session of the default agent, with these server tools enabled (name, trusted) and a
/// client tool `get_weather`.
async fn given(backend: Backend, server_tools: &[(&str, bool)]) -> Given {
    given_with(backend, server_tools, |_| {}).await
}

async fn given_with(backend: Backend, server_tools: &[(&str, bool)], tweak: impl FnOnce(&mut Settings)) -> Given {
    let (log, nats) = open_log(backend).await;
    Given { _nats: nats, ..given_on(log, server_tools, tweak).await }
}

async fn given_on(store: Store, server_tools: &[(&str, bool)], tweak: impl FnOnce(&mut Settings)) -> Given {
    let mut settings = Settings::load(None).unwrap();
    tweak(&mut settings);
    let service = Service::with_store(&settings, store.clone()).await.unwrap();
    let sessions = service.sessions().clone();
    let spec = SessionSpec {
        agent: AgentSpec {
            name: "default".into(),
            tools: Some(
                server_tools.iter().map(|(name, trust)| ToolTrust { name: (*name).into(), trust: *trust }).collect(),
            ),
            ..Default::default()
        },
        tools: vec![serde_json::from_value(
            json!({"name": "get_weather", "description": "weather", "parameters": {"type": "object"}}),
        )
        .unwrap()],
        ..Default::default()
    };
    let caller = Caller { subject: "t".into(), admin: false };
    let session = sessions.create(&caller, spec, None).await.unwrap();
    let log = store.log.clone();
    Given { settings, store, log, _service: service, _nats: None, sessions, session }
}

fn text(t: &str) -> Input {
    Input::Message(vec![Block::text(t)])
}

impl Given {
    async fn when(&self, inputs: Vec<Input>) -> Result<Submitted, SessionError> {
        self.when_with(inputs, true).await
    }

    async fn when_with(&self, inputs: Vec<Input>, all_at_once: bool) -> Result<Submitted, SessionError> {
        let submission = Submission { inputs, all_at_once, ..Submission::default() };
        self.sessions.submit(&self.session, submission).await
    }

    /// The events after the first `skip`, up to the last `session.status_idle`, once there
    /// is one (a later input, such as a second interrupt, may follow it).
    async fn then_events(&self, skip: usize) -> Vec<Event> {
        for _ in 0..3000 {
            let events = self.log().await;
            if let Some(end) = events.iter().rposition(|e| e.body_is_idle()).filter(|&end| end >= skip) {
                return events[skip..=end].to_vec();
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the session did not go idle: {:?}", kinds(&self.log().await));
    }

    /// Waits until the log holds an event of this type.
    async fn wait_for(&self, kind: &str) {
        for _ in 0..3000 {
            if kinds_all(&self.log().await).iter().any(|k| k == kind) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("no {kind} in {:?}", kinds_all(&self.log().await));
    }

    async fn log(&self) -> Vec<Event> {
        let query = EventQuery { limit: 100_000, ..EventQuery::default() };
        let page = self.sessions.events(&self.session, query).await.unwrap();
        page.events.iter().map(|raw| raw.decode().unwrap()).collect()
    }

    /// The log once `n` turns have stopped (idle events that end a turn or wait).
    async fn idle_times(&self, n: usize) -> Vec<Event> {
        for _ in 0..3000 {
            let events = self.log().await;
            if events.iter().filter(|e| e.body_is_idle()).count() >= n {
                return events;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("fewer than {n} turns stopped: {:?}", kinds(&self.log().await));
    }

    /// Starts the service again on the same log, as the process would after a crash;
    /// answers how many turns it found running.
    async fn restart(&self) -> usize {
        Service::with_store(&self.settings, self.store.clone()).await.unwrap().recovered()
    }
}

trait IdleCheck {
    fn body_is_idle(&self) -> bool;
}

impl IdleCheck for Event {
    fn body_is_idle(&self) -> bool {
        matches!(self.body, EventBody::StatusIdle { .. })
    }
}

fn kinds_all(events: &[Event]) -> Vec<String> {
    events.iter().map(|e| serde_json::to_value(&e.body).unwrap()["type"].as_str().unwrap().to_string()).collect()
}

/// The types of the events, deltas left out (how many there are depends on timing).
fn kinds(events: &[Event]) -> Vec<String> {
    kinds_all(events).into_iter().filter(|k| !k.ends_with(".delta")).collect()
}

fn stop(events: &[Event]) -> (StopReason, Vec<String>) {
    match &events.last().unwrap().body {
        EventBody::StatusIdle { stop_reason, .. } => {
            (stop_reason.kind, stop_reason.event_ids.iter().map(|id| id.to_string()).collect())
        }
        other => panic!("not idle: {other:?}"),
    }
}

fn said(events: &[Event]) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| match &e.body {
            EventBody::AgentMessage { content, .. } => Some(Block::join_text(content)),
            _ => None,
        })
        .collect()
}

fn tool_results(events: &[Event]) -> Vec<(String, bool)> {
    events
        .iter()
        .filter_map(|e| match &e.body {
            EventBody::AgentToolResult { content, is_error, .. } => Some((Block::join_text(content), *is_error)),
            _ => None,
        })
        .collect()
}

fn call_ids(events: &[Event]) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| match &e.body {
            EventBody::AgentToolUse { tool_call_id, .. } | EventBody::AgentCustomToolUse { tool_call_id, .. } => {
                Some(tool_call_id.clone())
            }
            _ => None,
        })
        .collect()
}

const REPLY: &[&str] = &["span.model_request_start", "agent.message", "span.model_request_end"];

fn with_reply(before: &[&str], after: &[&str]) -> Vec<String> {
    before.iter().chain(REPLY).chain(after).map(|s| s.to_string()).collect()
}

async fn a_message_ends_the_turn_with_a_reply(log: Backend) {
    let g = given(log, &[]).await;
    let submitted = g.when(vec![text("hello there")]).await.unwrap();
    assert!(submitted.turn.is_some());
    let events = g.then_events(1).await;
    assert_eq!(
        kinds(&events),
        with_reply(&["turn.started", "user.message", "session.status_running"], &["session.status_idle"])
    );
    assert_eq!(said(&events), vec!["echo: hello there"]);
    assert_eq!(stop(&events).0, StopReason::EndTurn);
    let turn = submitted.turn.unwrap();
    assert!(events.iter().all(|e| e.turn_id == Some(turn)), "every event of the turn carries its id");
    let numbers: Vec<u32> = events.iter().map(|e| e.turn_sequence_number.unwrap()).collect();
    assert_eq!(numbers, (1..=numbers.len() as u32).collect::<Vec<_>>());
    let deltas: String = events
        .iter()
        .filter_map(|e| match &e.body {
            EventBody::AgentMessageDelta { delta, .. } => Some(delta.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(deltas, "echo: hello there", "deltas add up to the message");
    // The idle event carries the turn's usage: the sum of its model requests'.
    let spans: Vec<Usage> = events
        .iter()
        .filter_map(|e| match &e.body {
            EventBody::ModelRequestEnd { usage, .. } => Some(*usage),
            _ => None,
        })
        .collect();
    let EventBody::StatusIdle { usage, .. } = &events.last().unwrap().body else { unreachable!() };
    assert_eq!(spans.len(), 1);
    assert_eq!(*usage, spans[0]);
    assert_eq!(usage.output_tokens, 3, "echo:, hello, there");
    assert!(usage.input_tokens > 0);
}

async fn an_outcome_sent_during_a_turn_belongs_to_no_turn(log: Backend) {
    let g = given(log, &[]).await;
    g.when(vec![text("/delay 20\n/words 20")]).await.unwrap();
    g.wait_for("agent.message.delta").await;
    g.when(vec![Input::Outcome(json!("a tidy summary"))]).await.unwrap();
    let events = g.then_events(1).await;
    let outcome = events.iter().find(|e| matches!(e.body, EventBody::UserDefineOutcome { .. })).unwrap();
    assert_eq!(outcome.turn_id, None, "as the Qoder catalog says");
    assert_eq!(stop(&events).0, StopReason::EndTurn, "and it does not disturb the turn");
}

async fn thinking_comes_before_the_reply(log: Backend) {
    let g = given(log, &[]).await;
    g.when(vec![text("/think let me see\nhi")]).await.unwrap();
    let events = g.then_events(1).await;
    let thinking: Vec<&str> = events
        .iter()
        .filter_map(|e| match &e.body {
            EventBody::AgentThinking { thinking, .. } => Some(thinking.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(thinking, vec!["let me see"]);
    let k = kinds(&events);
    assert!(k.iter().position(|x| x == "agent.thinking") < k.iter().position(|x| x == "agent.message"));
}

async fn model_stops_become_stop_reasons(log: Backend) {
    for (input, reason) in [
        ("/max_tokens", StopReason::MaxTokens),
        ("/refuse", StopReason::Refusal),
        ("/error model_overloaded_error", StopReason::Error),
    ] {
        let g = given(log, &[]).await;
        g.when(vec![text(input)]).await.unwrap();
        let events = g.then_events(1).await;
        assert_eq!(stop(&events).0, reason, "{input}");
        if reason == StopReason::Error {
            let error = events.iter().find_map(|e| match &e.body {
                EventBody::SessionError { code, .. } => Some(code.clone()),
                _ => None,
            });
            assert_eq!(error.as_deref(), Some("model_overloaded_error"));
        }
    }
}

async fn a_looping_model_stops_at_max_turn_requests(log: Backend) {
    let g =
        given_with(log, &[("calculator", true)], |s| s.agents.get_mut("default").unwrap().max_turn_requests = 3).await;
    g.when(vec![text("/loop")]).await.unwrap();
    let events = g.then_events(1).await;
    assert_eq!(stop(&events).0, StopReason::MaxTurnRequests);
    let requests = events.iter().filter(|e| matches!(e.body, EventBody::ModelRequestStart { .. })).count();
    assert_eq!(requests, 3);
    assert_eq!(tool_results(&events), vec![("2".to_string(), false); 3]);
}

async fn a_trusted_server_tool_runs_inline_and_the_turn_goes_on(log: Backend) {
    let g = given(log, &[("calculator", true)]).await;
    g.when(vec![text("/tool calculator {\"expression\": \"2*(3+4)\"}")]).await.unwrap();
    let events = g.then_events(1).await;
    assert_eq!(
        kinds(&events),
        [
            "turn.started",
            "user.message",
            "session.status_running",
            "span.model_request_start",
            "agent.tool_use",
            "span.model_request_end",
            "agent.tool_result",
            "span.model_request_start",
            "agent.message",
            "span.model_request_end",
            "session.status_idle"
        ]
    );
    assert_eq!(tool_results(&events), vec![("14".to_string(), false)]);
    assert_eq!(said(&events), vec!["tool results: calculator=14"]);
    assert_eq!(stop(&events).0, StopReason::EndTurn);
}

/// A memory log whose appends, from the first one that holds a tool call on, become
/// durable only once the test releases them: what a slow disk looks like to a turn.
struct HeldLog {
    inner: MemoryLog,
    holding: std::sync::atomic::AtomicBool,
    /// Every event type ordered, in order.
    ordered: std::sync::Mutex<Vec<String>>,
    /// Set once anyone waits for a held append to be durable, or a tool's result is ordered.
    checkpoint: tokio::sync::watch::Sender<bool>,
    released: tokio::sync::watch::Sender<bool>,
}

#[async_trait::async_trait]
impl Log for HeldLog {
    fn order(
        &self,
        session: SessionId,
        expected: u64,
        drafts: Vec<Draft>,
    ) -> Result<turnlog::store::Ordered, AppendError> {
        use std::sync::atomic::Ordering::SeqCst;
        if drafts.iter().any(|d| d.kind() == "agent.tool_use") {
            self.holding.store(true, SeqCst);
        }
        self.ordered.lock().unwrap().extend(drafts.iter().map(|d| d.kind().to_string()));
        if drafts.iter().any(|d| d.kind() == "agent.tool_result") {
            self.checkpoint.send_replace(true);
        }
        let (appended, durable) = self.inner.order(session, expected, drafts)?.split();
        if !self.holding.load(SeqCst) {
            return Ok(turnlog::store::Ordered::new(appended, durable));
        }
        let (checkpoint, mut released) = (self.checkpoint.clone(), self.released.subscribe());
        let held = async move {
            checkpoint.send_replace(true);
            let _ = released.wait_for(|r| *r).await;
            durable.await
        };
        Ok(turnlog::store::Ordered::new(appended, Box::pin(held)))
    }
    async fn position(&self, session: SessionId) -> Result<Position, StoreError> {
        self.inner.position(session).await
    }
    async fn read(&self, session: SessionId, range: ReadRange) -> Result<Vec<RawEvent>, StoreError> {
        self.inner.read(session, range).await
    }
    async fn event(&self, session: SessionId, id: EventId) -> Result<Option<RawEvent>, StoreError> {
        self.inner.event(session, id).await
    }
    async fn event_at(&self, session: SessionId, seq: u64) -> Result<Option<RawEvent>, StoreError> {
        self.inner.event_at(session, seq).await
    }
    async fn subscribe(&self, session: SessionId) -> Result<Subscription, StoreError> {
        self.inner.subscribe(session).await
    }
    fn changes(&self) -> tokio::sync::broadcast::Receiver<ulid::Ulid> {
        self.inner.changes()
    }
    fn sweep(&self) {
        self.inner.sweep()
    }
    async fn close(&self) -> Result<(), StoreError> {
        self.inner.close().await
    }
}

/// Another node stores a batch in a session this node holds and has gone quiet in (a
/// previous holder's last batch landing after a failover): this node's log lets go of the
/// session's end as the batch arrives, and tells no actor. The next submission here reads the
/// batch and decides after it, rather than being refused as raced: a 503 on a quiet
/// cluster, as the three-node soak saw now and then.
#[tokio::test]
async fn a_batch_another_node_stored_is_read_before_the_next_decision_on_jetstream() {
    use turnlog::store::SharedLog as _;
    let g = given(Backend::JetStream, &[]).await;
    g.when(vec![Input::Outcome(json!("loads the actor"))]).await.unwrap();
    let other = nats::open_log(g._nats.as_ref().expect("a nats-server")).await;
    let session = g.session.id;
    other.prepare(session).await.unwrap();
    let at = other.position(session).await.unwrap().seq;
    let foreign = Draft::new(None, &EventBody::UserDefineOutcome { outcome: json!("from another node") });
    other.append(session, at, vec![foreign]).await.unwrap().unwrap();
    // This node has taken the batch (its end moved past what its actor folded).
    let mut waited = 0;
    while g.log.position(session).await.unwrap().seq < at + 1 {
        assert!(waited < 1_000, "this node never took the other node's batch");
        waited += 1;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let submitted = g.when(vec![text("hi")]).await.expect("the submission is decided after the batch, not refused");
    echoed_after(&g.then_events(0).await, at + 1, submitted.turn);
    other.close().await.unwrap();
}

/// A tool acts on the world, so it runs only once its call is on disk: a turn whose log is
/// slow to make the call durable waits, and runs the tool once the log catches up.
#[tokio::test]
async fn a_server_tool_runs_only_once_its_call_is_durable() {
    let memory = MemoryLog::new(turnlog::projection::all(), 256, 1_000_000);
    let log = Arc::new(HeldLog {
        inner: memory.clone(),
        holding: false.into(),
        ordered: Default::default(),
        checkpoint: tokio::sync::watch::channel(false).0,
        released: tokio::sync::watch::channel(false).0,
    });
    // The held log, and the memory log's projections and audit side beneath it.
    let store = Store {
        log: log.clone(),
        projections: Arc::new(memory.clone()),
        audit: Arc::new(memory.clone()),
        claims: Arc::new(memory),
        shared: None,
    };
    let g = given_on(store, &[("calculator", true)], |_| {}).await;
    let mut checkpoint = log.checkpoint.subscribe();
    g.when(vec![text("/tool calculator {\"expression\": \"2*(3+4)\"}")]).await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), checkpoint.wait_for(|c| *c))
        .await
        .expect("the turn neither waited for durability nor ran the tool")
        .unwrap();
    let ordered = log.ordered.lock().unwrap().clone();
    assert!(ordered.iter().any(|k| k == "agent.tool_use"), "{ordered:?}");
    assert!(!ordered.iter().any(|k| k == "agent.tool_result"), "the tool ran before its call was durable: {ordered:?}");

    log.released.send_replace(true);
    let events = g.then_events(1).await;
    assert_eq!(tool_results(&events), vec![("14".to_string(), false)]);
    assert_eq!(stop(&events).0, StopReason::EndTurn);
}

async fn an_untrusted_tool_waits_for_permission_and_runs_when_granted(log: Backend) {
    let g = given(log, &[("calculator", false)]).await;
    g.when(vec![text("/tool calculator {\"expression\": \"1+2\"}")]).await.unwrap();
    let events = g.then_events(1).await;
    let (reason, waiting) = stop(&events);
    assert_eq!(reason, StopReason::RequiresAction);
    let ask = events.iter().find(|e| matches!(e.body, EventBody::AgentToolUse { .. })).unwrap();
    assert_eq!(waiting, vec![ask.id.to_string()], "the idle event names the waiting call");
    let call = call_ids(&events)[0].clone();
    let mark = g.log().await.len();
    g.when(vec![Input::Permission { call, granted: true, reason: None, remember: false }]).await.unwrap();
    let events = g.then_events(mark).await;
    assert_eq!(
        kinds(&events),
        with_reply(
            &["turn.started", "user.tool_confirmation", "session.status_running", "agent.tool_result"],
            &["session.status_idle"]
        )
    );
    assert_eq!(said(&events), vec!["tool results: calculator=3"]);
}

async fn a_denied_tool_tells_the_model_why(log: Backend) {
    for (reason, text_seen) in [(Some("not now"), "Tool call denied: not now"), (None, "Tool call denied")] {
        let g = given(log, &[("calculator", false)]).await;
        g.when(vec![text("/tool calculator {\"expression\": \"1+2\"}")]).await.unwrap();
        let events = g.then_events(1).await;
        // Resolved by event id this time (the native API's way).
        let ask = events.iter().find(|e| matches!(e.body, EventBody::AgentToolUse { .. })).unwrap().id.to_string();
        let mark = g.log().await.len();
        g.when(vec![Input::Permission {
            call: ask,
            granted: false,
            reason: reason.map(String::from),
            remember: false,
        }])
        .await
        .unwrap();
        let events = g.then_events(mark).await;
        assert_eq!(tool_results(&events), vec![(text_seen.to_string(), true)]);
        assert_eq!(said(&events), vec![format!("tool results: calculator={text_seen}")]);
    }
}

async fn client_tools_wait_for_results_and_parallel_calls_resolve_together(log: Backend) {
    let g = given(log, &[]).await;
    g.when(vec![text("/tool get_weather {\"city\": \"Oslo\"}\n/tool get_weather {\"city\": \"Rome\"}")]).await.unwrap();
    let events = g.then_events(1).await;
    let (reason, waiting) = stop(&events);
    assert_eq!(reason, StopReason::RequiresAction);
    assert_eq!(waiting.len(), 2);
    let calls = call_ids(&events);
    let mark = g.log().await.len();

    let only_one =
        vec![Input::Result { call: calls[0].clone(), content: vec![Block::text("3C")], is_error: false, ran: None }];
    let error = g.when(only_one.clone()).await.unwrap_err().to_string();
    assert!(error.contains("missing") && error.contains(&calls[1]), "{error}");
    assert_eq!(g.log().await.len(), mark, "a refused submission stores nothing");

    let both = vec![
        Input::Result { call: calls[1].clone(), content: vec![Block::text("20C")], is_error: false, ran: None },
        Input::Result { call: calls[0].clone(), content: vec![Block::text("3C")], is_error: false, ran: None },
    ];
    g.when(both).await.unwrap();
    let events = g.then_events(mark).await;
    assert_eq!(said(&events), vec!["tool results: get_weather=3C; get_weather=20C"], "results in call order");
}

async fn results_may_come_one_at_a_time_through_the_event_api(log: Backend) {
    let g = given(log, &[("calculator", false)]).await;
    g.when(vec![text("/tool get_weather {}\n/tool calculator {\"expression\": \"2+2\"}")]).await.unwrap();
    let events = g.then_events(1).await;
    let calls = call_ids(&events);
    let mark = g.log().await.len();
    let first =
        vec![Input::Result { call: calls[0].clone(), content: vec![Block::text("sunny")], is_error: false, ran: None }];
    g.when_with(first, false).await.unwrap();
    let events = g.then_events(mark).await;
    let (reason, waiting) = stop(&events);
    assert_eq!(reason, StopReason::RequiresAction, "the rest still waits");
    assert_eq!(waiting.len(), 1);
    let mark = g.log().await.len();
    g.when_with(
        vec![Input::Permission { call: calls[1].clone(), granted: true, reason: None, remember: false }],
        false,
    )
    .await
    .unwrap();
    let events = g.then_events(mark).await;
    assert_eq!(said(&events), vec!["tool results: get_weather=sunny; calculator=4"]);
}

/// A decision to remember (ACP's allow-always) answers the other waiting calls of its tool
/// too, and later calls of the tool run without asking. The choice is in the log
/// (`remember` on the confirmation), which the session's state folds.
async fn a_remembered_permission_holds_for_the_tool_from_then_on(log: Backend) {
    let g = given(log, &[("calculator", false)]).await;
    g.when(vec![text("/tool calculator {\"expression\": \"1+1\"}\n/tool calculator {\"expression\": \"2+2\"}")])
        .await
        .unwrap();
    let events = g.then_events(1).await;
    assert_eq!(stop(&events).1.len(), 2, "both calls wait");
    let calls = call_ids(&events);
    let mark = g.log().await.len();
    let always = Input::Permission { call: calls[0].clone(), granted: true, reason: None, remember: true };
    g.when_with(vec![always], false).await.unwrap();
    let events = g.then_events(mark).await;
    let confirmations: Vec<bool> = events
        .iter()
        .filter_map(|e| match &e.body {
            EventBody::UserToolConfirmation { result: Confirmation::Allow, remember, .. } => Some(*remember),
            _ => None,
        })
        .collect();
    assert_eq!(confirmations, vec![true, false], "the second call is granted with the first");
    assert_eq!(said(&events), vec!["tool results: calculator=2; calculator=4"]);

    let mark = g.log().await.len();
    g.when(vec![text("/tool calculator {\"expression\": \"3+3\"}")]).await.unwrap();
    let events = g.then_events(mark).await;
    assert_eq!(stop(&events).0, StopReason::EndTurn, "no permission asked: {:?}", kinds(&events));
    let uses: Vec<_> = events
        .iter()
        .filter_map(|e| match &e.body {
            EventBody::AgentToolUse { evaluated_permission, .. } => Some(*evaluated_permission),
            _ => None,
        })
        .collect();
    assert_eq!(uses, vec![turnlog::domain::event::Permission::Allow]);
    assert_eq!(said(&events), vec!["tool results: calculator=6"]);
}

async fn always_rejecting_a_tool_denies_its_calls_at_once(log: Backend) {
    let g = given(log, &[("calculator", false)]).await;
    g.when(vec![text("/tool calculator {\"expression\": \"1+1\"}")]).await.unwrap();
    let call = call_ids(&g.then_events(1).await)[0].clone();
    let mark = g.log().await.len();
    let never = Input::Permission { call, granted: false, reason: None, remember: true };
    g.when_with(vec![never], false).await.unwrap();
    let events = g.then_events(mark).await;
    assert_eq!(said(&events), vec!["tool results: calculator=Tool call denied"]);

    // Still offered (the history holds its calls), and each call is denied without asking.
    let mark = g.log().await.len();
    g.when(vec![text("/tool calculator {\"expression\": \"3+3\"}")]).await.unwrap();
    let events = g.then_events(mark).await;
    assert_eq!(stop(&events).0, StopReason::EndTurn, "nothing waits: {:?}", kinds(&events));
    let denial = "Tool call denied: the user rejects this tool for this session";
    assert_eq!(tool_results(&events), vec![(denial.to_string(), true)]);
    assert_eq!(said(&events), vec![format!("tool results: calculator={denial}")]);
}

async fn input_that_conflicts_with_the_state_is_refused_naming_the_calls(log: Backend) {
    let g = given(log, &[("calculator", false)]).await;
    let stray = Input::Result { call: "call_x".into(), content: vec![], is_error: false, ran: None };
    let error = g.when(vec![stray]).await.unwrap_err().to_string();
    assert!(error.contains("no tool calls are waiting"), "{error}");

    g.when(vec![text("/tool get_weather {}\n/tool calculator {\"expression\": \"1\"}")]).await.unwrap();
    let events = g.then_events(1).await;
    let calls = call_ids(&events);
    let mark = g.log().await.len();
    let cases: Vec<(Vec<Input>, Vec<&str>)> = vec![
        (vec![text("again")], vec!["tool calls wait", &calls[0], &calls[1]]),
        (
            vec![text("again"), Input::Result { call: calls[0].clone(), content: vec![], is_error: false, ran: None }],
            vec!["cannot be mixed"],
        ),
        (
            vec![Input::Result { call: "call_nope".into(), content: vec![], is_error: false, ran: None }],
            vec!["call_nope", "not a waiting"],
        ),
        (
            vec![
                Input::Result { call: calls[0].clone(), content: vec![], is_error: false, ran: None },
                Input::Result { call: calls[0].clone(), content: vec![], is_error: false, ran: None },
            ],
            vec!["twice"],
        ),
        (
            vec![
                Input::Result { call: calls[0].clone(), content: vec![], is_error: false, ran: None },
                Input::Result { call: calls[1].clone(), content: vec![], is_error: false, ran: None },
            ],
            vec!["needs a permission decision"],
        ),
        (
            vec![
                Input::Permission { call: calls[0].clone(), granted: true, reason: None, remember: false },
                Input::Permission { call: calls[1].clone(), granted: true, reason: None, remember: false },
            ],
            vec!["client tool"],
        ),
    ];
    for (inputs, needles) in cases {
        let error = g.when(inputs).await.unwrap_err().to_string();
        for needle in needles {
            assert!(error.contains(needle), "{error:?} should name {needle:?}");
        }
    }
    assert_eq!(g.log().await.len(), mark, "nothing refused was stored");
}

async fn cancel_stops_the_model_at_once_and_is_idempotent(log: Backend) {
    let g = given(log, &[]).await;
    g.when(vec![text("/delay 20\n/words 500")]).await.unwrap();
    let error = g.when(vec![text("another")]).await.unwrap_err().to_string();
    assert!(error.contains("a turn is running"), "{error}");
    g.wait_for("agent.message.delta").await;
    g.when(vec![Input::Interrupt]).await.unwrap();
    g.when(vec![Input::Interrupt]).await.unwrap();
    let events = g.then_events(1).await;
    assert_eq!(stop(&events).0, StopReason::Cancelled);
    // Both interrupts were durable when they were answered; the turn's end comes after the
    // first, before or after the second.
    let idles = g.log().await.iter().filter(|e| e.body_is_idle()).count();
    assert_eq!(idles, 1, "one end, however many cancels");
    let partial = &said(&events)[0];
    assert!(partial.starts_with("w1") && !partial.ends_with("w500"), "what was said is kept: {partial}");
    // The session takes new input after a cancel.
    let mark = g.log().await.len();
    g.when(vec![text("hi")]).await.unwrap();
    assert_eq!(stop(&g.then_events(mark).await).0, StopReason::EndTurn);
}

async fn a_cancel_right_as_the_turn_starts_is_not_lost(log: Backend) {
    let g = given(log, &[]).await;
    g.when(vec![text("/delay 50\n/words 5")]).await.unwrap();
    g.when(vec![Input::Interrupt]).await.unwrap();
    let events = g.then_events(1).await;
    assert_eq!(stop(&events).0, StopReason::Cancelled);
}

async fn a_cancel_while_calls_wait_closes_them(log: Backend) {
    let g = given(log, &[]).await;
    g.when(vec![text("/tool get_weather {}")]).await.unwrap();
    let events = g.then_events(1).await;
    assert_eq!(stop(&events).0, StopReason::RequiresAction);
    let mark = g.log().await.len();
    g.when(vec![Input::Interrupt]).await.unwrap();
    let events = g.then_events(mark).await;
    assert_eq!(kinds(&events), ["user.interrupt", "agent.tool_result", "session.status_idle"]);
    assert_eq!(tool_results(&events), vec![("Tool call cancelled".to_string(), true)]);
    assert_eq!(stop(&events).0, StopReason::Cancelled);
}

async fn a_call_of_an_unknown_tool_is_answered_with_an_error(log: Backend) {
    let g = given(log, &[]).await;
    g.when(vec![text("/tool launch_rockets {}")]).await.unwrap();
    let events = g.then_events(1).await;
    let results = tool_results(&events);
    assert_eq!(results.len(), 1);
    assert!(results[0].0.starts_with("Tool call denied: no tool named \"launch_rockets\"") && results[0].1);
    assert_eq!(stop(&events).0, StopReason::EndTurn);
}

/// Appends a turn as a process that stopped mid-way leaves it: started, its message, then
/// `bodies`; answers the turn and the number of events before it.
async fn left_running(g: &Given, message: &str, bodies: Vec<EventBody>) -> (turnlog::domain::TurnId, usize) {
    let turn = turnlog::domain::TurnId::generate();
    let mut drafts = vec![
        Draft::new(Some(turn), &EventBody::TurnStarted {}),
        Draft::new(Some(turn), &EventBody::UserMessage { content: vec![Block::text(message)] }),
        Draft::new(Some(turn), &EventBody::StatusRunning { status: "running".into() }),
    ];
    drafts.extend(bodies.iter().map(|body| Draft::new(Some(turn), body)));
    let at = g.log.position(g.session.id).await.unwrap().seq;
    g.log.append(g.session.id, at, drafts).await.unwrap().unwrap();
    (turn, at as usize)
}

fn span_start() -> EventBody {
    EventBody::ModelRequestStart { model: "scripted".into(), span_id: "span_left".into(), input_tokens: None }
}

/// The end of [`span_start`]'s request, whole.
fn span_end(stop: ModelStop) -> EventBody {
    EventBody::ModelRequestEnd {
        span_id: "span_left".into(),
        model: "scripted".into(),
        usage: Usage::default(),
        is_error: false,
        model_request_start_id: None,
        stop_reason: Some(stop),
        context_window: None,
        usage_estimated: false,
    }
}

fn resumed(events: &[Event]) -> (u32, Vec<String>, Vec<EventId>, Vec<EventId>) {
    let found = events.iter().find_map(|e| match &e.body {
        EventBody::TurnResumed { attempt, discarded, rerun, interrupted, .. } => {
            Some((*attempt, discarded.clone(), rerun.clone(), interrupted.clone()))
        }
        _ => None,
    });
    found.expect("a turn.resumed")
}

async fn a_reply_cut_by_a_crash_is_made_again_from_the_history(log: Backend) {
    let g = given(log, &[]).await;
    let partial = EventBody::AgentMessageDelta { message_id: "msg_cut".into(), delta: "w1 w2".into() };
    let (turn, mark) = left_running(&g, "/words 5", vec![span_start(), partial]).await;
    assert_eq!(g.restart().await, 1, "one turn found running");
    let events = g.then_events(mark).await;
    assert_eq!(
        kinds(&events)[4..],
        [
            "turn.resumed",
            "span.model_request_end",
            "session.status_running",
            "span.model_request_start",
            "agent.message",
            "span.model_request_end",
            "session.status_idle"
        ]
    );
    assert!(events.iter().all(|e| e.turn_id == Some(turn)), "one turn, going on");
    let numbers: Vec<u32> = events.iter().filter_map(|e| e.turn_sequence_number).collect();
    assert!(numbers.windows(2).all(|w| w[1] == w[0] + 1), "its numbers go on: {numbers:?}");
    assert_eq!(resumed(&events), (1, vec!["msg_cut".to_string()], vec![], vec![]));
    assert_eq!(said(&events), ["w1 w2 w3 w4 w5"], "one whole message, no half one");
    assert_eq!(stop(&events).0, StopReason::EndTurn);
    assert_eq!(g.restart().await, 0, "resumed once");
}

async fn a_call_left_without_a_result_runs_again_only_if_it_may(log: Backend) {
    let g = given(log, &[("calculator", true), ("current_time", true)]).await;
    let call = |name: &str, input, idempotent| EventBody::AgentToolUse {
        tool_call_id: format!("call_{name}"),
        name: name.into(),
        input,
        evaluated_permission: turnlog::domain::event::Permission::Allow,
        mcp: None,
        idempotent,
    };
    let response = vec![
        span_start(),
        call("calculator", json!({"expression": "1+1"}), true),
        // As a tool that may not run twice would be recorded.
        call("current_time", json!({}), false),
        span_end(ModelStop::ToolUse),
    ];
    let (_, mark) = left_running(&g, "/tool calculator {}\n/tool current_time {}", response).await;
    let log = g.log().await;
    let calls: Vec<EventId> =
        log[mark..].iter().filter(|e| matches!(e.body, EventBody::AgentToolUse { .. })).map(|e| e.id).collect();
    g.restart().await;
    let events = g.then_events(mark).await;
    let (attempt, discarded, rerun, interrupted) = resumed(&events);
    assert_eq!((attempt, discarded, rerun, interrupted), (1, vec![], vec![calls[0]], vec![calls[1]]));
    let results = tool_results(&events);
    assert_eq!(results.len(), 2, "one answer each: {results:?}");
    assert!(results.iter().any(|(text, error)| text == "2" && !error), "the calculator ran again: {results:?}");
    let interrupted = results.iter().find(|(text, _)| text.starts_with("Tool call interrupted")).unwrap();
    assert!(interrupted.1 && interrupted.0.contains("may or may not have taken effect"));
    let reply = said(&events).pop().unwrap();
    assert!(reply.contains("calculator=2") && reply.contains("current_time=Tool call interrupted"), "{reply}");
    assert_eq!(stop(&events).0, StopReason::EndTurn);
}

async fn calls_left_waiting_for_the_client_keep_waiting_after_a_resume(log: Backend) {
    let g = given(log, &[]).await;
    let response = vec![
        span_start(),
        EventBody::AgentCustomToolUse {
            tool_call_id: "c1".into(),
            name: "get_weather".into(),
            input: json!({}),
            ask: false,
            editor: false,
        },
        span_end(ModelStop::ToolUse),
    ];
    let (turn, mark) = left_running(&g, "/tool get_weather {}", response).await;
    g.restart().await;
    let events = g.then_events(mark).await;
    let call = events.iter().find(|e| matches!(e.body, EventBody::AgentCustomToolUse { .. })).unwrap().id;
    assert_eq!(resumed(&events), (1, vec![], vec![], vec![]));
    assert_eq!(stop(&events), (StopReason::RequiresAction, vec![call.to_string()]), "the call still waits");
    let requests = events.iter().filter(|e| matches!(e.body, EventBody::ModelRequestStart { .. })).count();
    assert_eq!(requests, 1, "the model is not asked again while the client's result is missing");
    let result =
        Input::Result { call: call.to_string(), content: vec![Block::text("sunny")], is_error: false, ran: None };
    let mark = g.log().await.len();
    g.when(vec![result]).await.unwrap();
    let events = g.then_events(mark).await;
    assert_eq!(said(&events), ["tool results: get_weather=sunny"], "the result is answered as ever");
    let resumes = g.log().await.iter().filter(|e| matches!(e.body, EventBody::TurnResumed { .. })).count();
    assert_eq!(resumes, 1);
    assert_eq!(events.iter().filter(|e| e.turn_id == Some(turn)).count(), 0, "the resumed turn had stopped");
}

async fn a_turn_resumed_max_resumes_times_is_closed_saying_why(log: Backend) {
    let g = given(log, &[]).await;
    let again = |attempt| EventBody::TurnResumed {
        attempt,
        reason: "the server stopped".into(),
        discarded: vec![],
        rerun: vec![],
        interrupted: vec![],
    };
    let (turn, mark) = left_running(&g, "hi", vec![span_start(), again(1), again(2), again(3), span_start()]).await;
    assert_eq!(g.restart().await, 1);
    let events = g.then_events(mark).await;
    let error = events.iter().find_map(|e| match &e.body {
        EventBody::SessionError { code, error, .. } => Some((code.clone(), error.clone())),
        _ => None,
    });
    let (code, error) = error.expect("a session.error");
    assert_eq!(code, "retries_exhausted");
    assert!(error.contains("turns.max_resumes"), "{error}");
    assert_eq!(stop(&events).0, StopReason::Error);
    assert!(events.iter().all(|e| e.turn_id == Some(turn)));
    assert_eq!(g.restart().await, 0, "closed once");
    let mark = g.log().await.len();
    g.when(vec![text("hi")]).await.unwrap();
    assert_eq!(said(&g.then_events(mark).await), ["echo: hi"], "the session goes on");
}

/// A one-shot HTTP server on loopback that answers every request with `body`.
fn serve_once(body: &'static str) -> u16 {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming().take(4) {
            let mut stream = stream.unwrap();
            let mut buffer = [0u8; 4096];
            let _ = stream.read(&mut buffer);
            let response =
                format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}", body.len());
            let _ = stream.write_all(response.as_bytes());
        }
    });
    port
}

async fn fetch_url_reaches_only_allowed_hosts(log: Backend) {
    let port = serve_once("hello from loopback");
    let g = given_with(log, &[("fetch_url", true)], |s| {
        s.tools.fetch_url.allowed_hosts = vec!["127.0.0.1".into()];
        s.agents
            .get_mut("default")
            .unwrap()
            .tools
            .insert("fetch_url".into(), turnlog::domain::event::Permission::Allow);
    })
    .await;
    let input = format!(
        "/tool fetch_url {{\"url\": \"http://127.0.0.1:{port}/page\"}}\n/tool fetch_url {{\"url\": \"http://localhost:{port}/page\"}}"
    );
    g.when(vec![text(&input)]).await.unwrap();
    let events = g.then_events(1).await;
    let results = tool_results(&events);
    assert_eq!(results[0], ("HTTP 200\n\nhello from loopback".to_string(), false));
    assert!(results[1].1 && results[1].0.contains("\"localhost\" is not on the allow-list"), "{:?}", results[1]);
}

async fn an_ask_tool_in_config_asks_even_when_the_client_trusts_it(log: Backend) {
    let g = given(log, &[("fetch_url", true)]).await;
    g.when(vec![text("/tool fetch_url {\"url\": \"http://127.0.0.1:1/\"}")]).await.unwrap();
    let events = g.then_events(1).await;
    assert_eq!(stop(&events).0, StopReason::RequiresAction, "config says ask; the client cannot trust it past that");
}

async fn turns_are_indexed_and_their_events_read_back_by_number(log: Backend) {
    let g = given(log, &[]).await;
    let first = g.when(vec![text("one two")]).await.unwrap().turn.unwrap();
    let mark = g.then_events(1).await.len() + 1;
    g.when(vec![Input::Outcome(json!("between turns"))]).await.unwrap();
    let second = g.when(vec![text("/tool get_weather {}")]).await.unwrap().turn.unwrap();
    let waiting = g.then_events(mark + 1).await;
    let call = call_ids(&waiting)[0].clone();
    let mark = g.log().await.len();
    let result = Input::Result { call, content: vec![Block::text("sunny")], is_error: false, ran: None };
    let third = g.when(vec![result]).await.unwrap().turn.unwrap();
    g.then_events(mark).await;

    // Newest first, a page at a time.
    let page = g.sessions.turns(&g.session, TurnQuery { before: None, limit: 2 }).await.unwrap();
    assert_eq!(page.items.iter().map(|t| t.id).collect::<Vec<_>>(), [third, second]);
    assert!(page.has_more);
    let page = g.sessions.turns(&g.session, TurnQuery { before: Some(second), limit: 2 }).await.unwrap();
    assert_eq!(page.items.iter().map(|t| t.id).collect::<Vec<_>>(), [first]);
    assert!(!page.has_more);

    // Each turn with how it went.
    let one = g.sessions.turn(&g.session, &first.to_string()).await.unwrap();
    assert_eq!(one.input, vec![Block::text("one two")]);
    assert_eq!(one.stop.as_ref().map(|s| s.kind), Some(StopReason::EndTurn));
    assert_eq!(one.usage.output_tokens, 3, "echo:, one, two");
    let two = g.sessions.turn(&g.session, &second.to_string()).await.unwrap();
    let stop = two.stop.unwrap();
    assert_eq!((stop.kind, stop.event_ids.len()), (StopReason::RequiresAction, 1));
    let three = g.sessions.turn(&g.session, &third.to_string()).await.unwrap();
    assert!(three.input.is_empty(), "a turn that goes on after results has no message");
    assert_eq!(three.stop.map(|s| s.kind), Some(StopReason::EndTurn));
    assert!(matches!(g.sessions.turn(&g.session, "turn_nope").await, Err(SessionError::TurnNotFound { .. })));

    // A turn's events by turn sequence number, and nothing of the next turn.
    let all = g.sessions.turn_events(&g.session, &one, 0, 1000).await.unwrap();
    let numbers: Vec<u32> = all.iter().map(|e| e.turn().unwrap().1).collect();
    assert_eq!(numbers, (1..=all.len() as u32).collect::<Vec<_>>());
    assert!(all.iter().all(|e| e.turn().unwrap().0 == first));
    assert_eq!(all.last().unwrap().kind(), "session.status_idle");
    let some = g.sessions.turn_events(&g.session, &one, 2, 2).await.unwrap();
    assert_eq!(some.iter().map(|e| e.turn().unwrap().1).collect::<Vec<_>>(), [3, 4]);
}

async fn followers_resume_after_any_kind_of_cursor(log: Backend) {
    let g = given(log, &[]).await;
    let turn = g.when(vec![text("a b c")]).await.unwrap().turn.unwrap();
    let events = g.then_events(1).await;
    let first = |cursor: Option<Cursor>| {
        let sessions = g.sessions.clone();
        let session = g.session.clone();
        async move {
            let mut follower = sessions.follow(&session, cursor).await?;
            Ok::<_, SessionError>(follower.next().await.unwrap().unwrap().remove(0))
        }
    };
    assert_eq!(first(None).await.unwrap().seq, 1, "from the start");
    assert_eq!(first(Some(Cursor::Sequence(0))).await.unwrap().seq, 1);
    assert_eq!(first(Some(Cursor::Sequence(3))).await.unwrap().seq, 4);
    assert_eq!(first(Some(Cursor::Event(events[2].id))).await.unwrap().id, events[3].id);
    let turn_start = first(Some(Cursor::Turn { turn, sequence: 0 })).await.unwrap();
    assert_eq!(turn_start.turn(), Some((turn, 1)), "a turn's stream starts at its first event");
    let resumed = first(Some(Cursor::Turn { turn, sequence: 2 })).await.unwrap();
    assert_eq!(resumed.turn(), Some((turn, 3)));
    for unknown in [
        Cursor::Sequence(10_000),
        Cursor::Turn { turn, sequence: 10_000 },
        Cursor::Turn { turn: turnlog::domain::TurnId::generate(), sequence: 0 },
        Cursor::Event(turnlog::domain::EventId(ulid::Ulid::new())),
    ] {
        assert!(matches!(first(Some(unknown)).await, Err(SessionError::UnknownCursor(_))), "{unknown}");
    }
}

async fn another_writer_makes_the_actor_decide_again(log: Backend) {
    let g = given(log, &[]).await;
    g.when(vec![Input::Outcome(json!("loads the actor"))]).await.unwrap();
    let at = g.log.position(g.session.id).await.unwrap().seq;
    let foreign = turnlog::domain::Draft::new(None, &EventBody::UserDefineOutcome { outcome: json!("foreign") });
    g.log.append(g.session.id, at, vec![foreign]).await.unwrap().unwrap();
    let submitted = g.when(vec![text("hi")]).await.unwrap();
    echoed_after(&g.then_events(0).await, at + 1, submitted.turn);
}

/// The log, without a gap, has turn `turn` start right after event `foreign` (another
/// writer's) and answer "hi".
fn echoed_after(events: &[Event], foreign: u64, turn: Option<turnlog::domain::TurnId>) {
    let numbers: Vec<u64> = events.iter().map(|e| e.sequence_number).collect();
    assert_eq!(numbers, (1..=events.len() as u64).collect::<Vec<_>>(), "no gap");
    let started = events.iter().position(|e| matches!(e.body, EventBody::TurnStarted {})).unwrap();
    assert_eq!(events[started].sequence_number, foreign + 1, "the turn starts after the other writer's event");
    assert_eq!(events[started].turn_id, turn);
    assert_eq!(said(events), vec!["echo: hi"]);
}

async fn another_writer_during_a_turn_ends_it_with_a_log_error(log: Backend) {
    let g = given(log, &[]).await;
    g.when(vec![text("/delay 20\n/words 200")]).await.unwrap();
    g.wait_for("agent.message.delta").await;
    let at = g.log.position(g.session.id).await.unwrap().seq;
    let foreign = turnlog::domain::Draft::new(None, &EventBody::UserDefineOutcome { outcome: json!("foreign") });
    g.log.append(g.session.id, at, vec![foreign]).await.unwrap().unwrap();
    let events = g.then_events(1).await;
    let error = events.iter().find_map(|e| match &e.body {
        EventBody::SessionError { code, error, .. } => Some((code.clone(), error.clone())),
        _ => None,
    });
    let (code, message) = error.expect("the turn recorded why it stopped");
    assert_eq!(code, "log_error");
    assert!(message.contains("another writer"), "{message}");
    assert_eq!(stop(&events).0, StopReason::Error);
    let mark = g.log().await.len();
    g.when(vec![text("again")]).await.unwrap();
    assert_eq!(said(&g.then_events(mark).await), vec!["echo: again"], "the session goes on");
}

async fn a_message_sent_while_a_turn_runs_waits_for_the_next_turn(log: Backend) {
    let g = given(log, &[]).await;
    // A turn first, so that the queued message's sequence number has two digits.
    g.when(vec![text("first")]).await.unwrap();
    g.then_events(1).await;
    g.when(vec![text("/delay 20\n/words 10")]).await.unwrap();
    g.wait_for("agent.message.delta").await;
    let queue = |inputs| Submission { inputs, when_busy: WhenBusy::Queue, ..Submission::default() };
    let refused = g.when(vec![text("second")]).await.unwrap_err();
    assert!(matches!(refused, SessionError::Busy(_)), "refused unless asked to queue: {refused}");
    let queued = g.sessions.submit(&g.session, queue(vec![text("second")])).await.unwrap();
    assert_eq!(queued.turn, None, "a queued message starts no turn");
    assert!(queued.events[0].is_queued(), "it is stored unprocessed");
    assert!(queued.events[0].seq >= 10);
    let queued_id = queued.events[0].id;

    // The running turn ends; the next answers the queued message.
    let events = g.idle_times(3).await;
    assert_eq!(said(&events), vec!["echo: first", "w1 w2 w3 w4 w5 w6 w7 w8 w9 w10", "echo: second"]);
    let input = events.iter().find_map(|e| match &e.body {
        EventBody::TurnInput { event_ids } => Some((e.turn_id, event_ids.clone())),
        _ => None,
    });
    let (turn, ids) = input.expect("the third turn names the message it answers");
    assert_eq!(ids, vec![queued_id]);
    let stored = events.iter().find(|e| e.id == queued_id).unwrap();
    assert_eq!(
        stored.processed_at,
        Some(events.iter().find(|e| e.turn_id == turn).unwrap().created_at.clone()),
        "reads as processed when the turn took it"
    );
    let history = g.sessions.history(&g.session, true).await.unwrap();
    let roles: Vec<String> =
        history.iter().map(|m| serde_json::to_value(m).unwrap()["role"].as_str().unwrap().to_string()).collect();
    assert_eq!(
        roles,
        ["user", "assistant", "user", "assistant", "user", "assistant"],
        "the queued message joins after the reply it waited for"
    );
}

async fn a_queued_message_left_by_a_crash_is_answered_at_the_next_start(log: Backend) {
    let g = given(log, &[]).await;
    g.when(vec![text("first")]).await.unwrap();
    g.then_events(1).await;
    // As a crash would leave it: stored while a turn ran, and no turn took it.
    let at = g.log.position(g.session.id).await.unwrap().seq;
    let queued = turnlog::domain::Draft::queued(&EventBody::UserMessage { content: vec![Block::text("left over")] });
    g.log.append(g.session.id, at, vec![queued]).await.unwrap().unwrap();
    g.restart().await;
    let events = g.idle_times(2).await;
    assert_eq!(said(&events), vec!["echo: first", "echo: left over"], "answered without anyone touching the session");
}

async fn an_interrupt_of_waiting_calls_lets_queued_messages_through(log: Backend) {
    let g = given(log, &[]).await;
    g.when(vec![text("/delay 30\nlet me check that\n/tool get_weather {}")]).await.unwrap();
    g.wait_for("agent.message.delta").await;
    let queue = Submission { inputs: vec![text("queued")], when_busy: WhenBusy::Queue, ..Submission::default() };
    g.sessions.submit(&g.session, queue).await.unwrap();
    g.then_events(1).await;
    assert_eq!(stop(&g.log().await).0, StopReason::RequiresAction, "the turn waits for the client");
    g.when(vec![Input::Interrupt]).await.unwrap();
    let events = g.idle_times(3).await;
    assert_eq!(said(&events).last().map(String::as_str), Some("echo: queued"), "the queued message got its turn");
}

async fn an_archived_session_keeps_its_log_and_takes_no_input(log: Backend) {
    let g = given(log, &[]).await;
    g.when(vec![text("hi")]).await.unwrap();
    g.then_events(1).await;
    let mark = g.log().await.len();
    let archived = g.sessions.archive(&g.session).await.unwrap();
    assert!(archived.archived_at.is_some());
    assert_eq!(g.sessions.archive(&g.session).await.unwrap().archived_at, archived.archived_at, "once");
    assert_eq!(g.log().await.len(), mark + 1, "one session.archived");
    let refused = g.when(vec![text("again")]).await.unwrap_err();
    assert!(matches!(refused, SessionError::Conflict(ref m) if m.contains("archived")), "{refused}");
    assert_eq!(g.log().await.len(), mark + 1, "nothing stored");
}

async fn deleting_a_session_ends_its_running_turn_first(log: Backend) {
    let g = given(log, &[]).await;
    g.when(vec![text("/delay 20\n/words 500")]).await.unwrap();
    g.wait_for("agent.message.delta").await;
    let caller = Caller { subject: "t".into(), admin: false };
    g.sessions.delete(&caller, &g.session.id.to_string()).await.unwrap();
    let events = g.log().await;
    let tail: Vec<String> = kinds(&events).into_iter().rev().take(3).collect();
    assert_eq!(tail, ["terminated", "session.deleted", "session.status_idle"], "the turn ends, then the session");
    let ends = events.iter().filter(|e| e.body_is_idle()).collect::<Vec<_>>();
    assert_eq!(ends.len(), 1);
    assert!(
        matches!(&ends[0].body, EventBody::StatusIdle { stop_reason, .. } if stop_reason.kind == StopReason::Cancelled)
    );
    // Gone: a second delete, and any input, find no session; nothing more is stored.
    let again = g.sessions.delete(&caller, &g.session.id.to_string()).await.unwrap_err();
    assert!(matches!(again, SessionError::NotFound(_)), "{again}");
    assert!(matches!(g.when(vec![text("hi")]).await.unwrap_err(), SessionError::NotFound(_)));
    assert_eq!(g.log().await.len(), events.len());
}

async fn archiving_a_running_session_ends_its_turn_and_takes_only_cancels(log: Backend) {
    let g = given(log, &[]).await;
    g.when(vec![text("/delay 20\n/words 500")]).await.unwrap();
    g.wait_for("agent.message.delta").await;
    g.sessions.archive(&g.session).await.unwrap();
    let events = g.log().await;
    let tail: Vec<String> = kinds(&events).into_iter().rev().take(2).collect();
    assert_eq!(tail, ["session.archived", "session.status_idle"], "the turn ends, then the session is archived");
    // An archived session runs nothing: a cancel is answered and stores nothing.
    let cancelled = g.when(vec![Input::Cancel]).await.unwrap();
    assert!(cancelled.events.is_empty() && cancelled.turn.is_none());
    assert_eq!(g.log().await.len(), events.len());
}

async fn metadata_is_a_patch_and_title_replaces(log: Backend) {
    let g = given(log, &[]).await;
    let patch = |pairs: serde_json::Value| turnlog::session::SessionUpdate {
        metadata: Some(pairs.as_object().unwrap().clone()),
        ..Default::default()
    };
    let first = g.sessions.update(&g.session, patch(json!({"a": "1", "b": "2"})), None).await.unwrap();
    assert_eq!(first.spec.metadata, *json!({"a": "1", "b": "2"}).as_object().unwrap());
    let titled = turnlog::session::SessionUpdate { title: Some("t".into()), ..patch(json!({"a": null, "c": "3"})) };
    let second = g.sessions.update(&g.session, titled, None).await.unwrap();
    assert_eq!(second.spec.metadata, *json!({"b": "2", "c": "3"}).as_object().unwrap());
    assert_eq!(second.spec.title.as_deref(), Some("t"));
}

async fn a_model_requests_end_says_how_the_model_stopped(log: Backend) {
    for (input, stop) in [
        ("hi", Some(ModelStop::EndTurn)),
        ("/max_tokens", Some(ModelStop::MaxTokens)),
        ("/refuse", Some(ModelStop::Refusal)),
        ("/tool get_weather {}", Some(ModelStop::ToolUse)),
        ("/error model_overloaded_error", None),
    ] {
        let g = given(log, &[]).await;
        g.when(vec![text(input)]).await.unwrap();
        let ends: Vec<Option<ModelStop>> = g
            .then_events(1)
            .await
            .iter()
            .filter_map(|e| match &e.body {
                EventBody::ModelRequestEnd { stop_reason, .. } => Some(*stop_reason),
                _ => None,
            })
            .collect();
        assert_eq!(ends, vec![stop], "{input}");
    }
}

async fn resolutions_name_the_models_call_too(log: Backend) {
    let g = given(log, &[("calculator", false)]).await;
    g.when(vec![text("/tool get_weather {}\n/tool calculator {\"expression\": \"2+2\"}")]).await.unwrap();
    let events = g.then_events(1).await;
    let calls = call_ids(&events);
    let mark = g.log().await.len();
    let answers = vec![
        Input::Result { call: calls[0].clone(), content: vec![Block::text("sunny")], is_error: false, ran: None },
        Input::Permission { call: calls[1].clone(), granted: false, reason: Some("no".into()), remember: false },
    ];
    g.when(answers).await.unwrap();
    let named: Vec<(String, String)> = g
        .then_events(mark)
        .await
        .iter()
        .filter_map(|e| match &e.body {
            EventBody::UserCustomToolResult { tool_call_id, .. } => Some(("result".into(), tool_call_id.clone()?)),
            EventBody::UserToolConfirmation { tool_call_id, result: Confirmation::Deny, .. } => {
                Some(("denied".into(), tool_call_id.clone()?))
            }
            _ => None,
        })
        .collect();
    assert_eq!(named, vec![("result".into(), calls[0].clone()), ("denied".into(), calls[1].clone())]);
}

async fn a_cancel_stops_a_running_turn_and_nothing_else(log: Backend) {
    let g = given(log, &[]).await;
    let nothing = g.when(vec![Input::Cancel]).await.unwrap();
    assert!(nothing.events.is_empty() && nothing.turn.is_none(), "an idle session: nothing to store");

    g.when(vec![text("/tool get_weather {}")]).await.unwrap();
    let events = g.then_events(1).await;
    let mark = g.log().await.len();
    let nothing = g.when(vec![Input::Cancel]).await.unwrap();
    assert!(nothing.events.is_empty(), "a turn that waits for the client is left waiting");
    assert_eq!(g.log().await.len(), mark);
    let answer = Input::Result {
        call: call_ids(&events)[0].clone(),
        content: vec![Block::text("rain")],
        is_error: false,
        ran: None,
    };
    g.when(vec![answer]).await.unwrap();
    g.idle_times(2).await;

    let mark = g.log().await.len();
    g.when(vec![text("/delay 20\n/words 500")]).await.unwrap();
    g.wait_for("agent.message.delta").await;
    let cancelled = g.when(vec![Input::Cancel]).await.unwrap();
    assert_eq!(
        kinds_all(&cancelled.events.iter().map(|e| e.decode().unwrap()).collect::<Vec<_>>()),
        ["user.interrupt"]
    );
    // Answered once the turn's end is recorded: the session takes a new turn at once.
    let log = g.log().await;
    assert_eq!(stop(&log[mark..]).0, StopReason::Cancelled);
    let next = g.when(vec![text("again")]).await.unwrap();
    assert!(next.turn.is_some(), "a new turn right after the cancel");
}

async fn a_turn_follows_the_turn_the_client_names(log: Backend) {
    let g = given(log, &[]).await;
    let follows = |inputs, follows| Submission { inputs, follows, ..Submission::default() };
    let first = g.sessions.submit(&g.session, follows(vec![text("one")], Follows::Nothing)).await.unwrap();
    let first = first.turn.unwrap();
    g.then_events(1).await;
    let mark = g.log().await.len();
    for stale in [Follows::Nothing, Follows::Turn(turnlog::domain::TurnId::generate())] {
        let refused = g.sessions.submit(&g.session, follows(vec![text("two")], stale)).await.unwrap_err();
        assert!(matches!(refused, SessionError::PreviousTurn(ref m) if m.contains(&first.to_string())), "{refused}");
    }
    assert_eq!(g.log().await.len(), mark, "nothing refused was stored");
    let second = g.sessions.submit(&g.session, follows(vec![text("two")], Follows::Turn(first))).await.unwrap();
    assert!(second.turn.is_some());
    g.idle_times(2).await;
    let turns = g.sessions.turns(&g.session, TurnQuery { before: None, limit: 10 }).await.unwrap();
    assert_eq!(turns.items.iter().map(|t| t.id).collect::<Vec<_>>(), [second.turn.unwrap(), first]);
}

async fn a_turn_that_names_an_earlier_turn_branches_from_its_end(log: Backend) {
    let g = given(log, &[]).await;
    let follows = |inputs, follows| Submission { inputs, follows, ..Submission::default() };
    let mut turns = Vec::new();
    for (i, said) in ["one", "two", "three"].into_iter().enumerate() {
        let submitted = g.sessions.submit(&g.session, follows(vec![text(said)], Follows::Latest)).await.unwrap();
        turns.push(submitted.turn.unwrap());
        g.idle_times(i + 1).await;
    }
    // Branch from the first: the conversation goes on from its end.
    let branch = g.sessions.submit(&g.session, follows(vec![text("again")], Follows::Turn(turns[0]))).await.unwrap();
    let branch = branch.turn.unwrap();
    let log = g.idle_times(4).await;
    let started: Vec<&Event> = log.iter().filter(|e| e.turn_id == Some(branch)).take(2).collect();
    assert!(matches!(started[1].body, EventBody::TurnBranched { from } if from == turns[0]), "{:?}", started[1].body);
    let history = g.sessions.history(&g.session, true).await.unwrap();
    let said: Vec<String> = history.iter().map(|m| m.text()).collect();
    assert_eq!(said, ["one", "echo: one", "again", "echo: again"]);
    // The turns after the branch point stay in the log and the index; the next turn follows the branch.
    let next = g.sessions.submit(&g.session, follows(vec![text("on")], Follows::Turn(branch))).await.unwrap();
    assert!(next.turn.is_some());
    g.idle_times(5).await;
    let said: Vec<String> = g.sessions.history(&g.session, true).await.unwrap().iter().map(|m| m.text()).collect();
    assert_eq!(said, ["one", "echo: one", "again", "echo: again", "on", "echo: on"]);
    let index = g.sessions.turns(&g.session, TurnQuery { before: None, limit: 10 }).await.unwrap();
    assert_eq!(index.items.len(), 5);
    assert_eq!(index.items[1].branched_from, Some(turns[0]));
    // A turn that ended waiting for the client is not branched from (its answers went on
    // in the next turn); nor is a turn the session never had.
    let waiting = g
        .sessions
        .submit(&g.session, follows(vec![text("/tool get_weather {\"city\": \"Oslo\"}")], Follows::Latest))
        .await;
    let waiting = waiting.unwrap().turn.unwrap();
    g.idle_times(6).await;
    let call = g.log().await.iter().rev().find(|e| matches!(e.body, EventBody::AgentCustomToolUse { .. })).unwrap().id;
    let answer =
        Input::Result { call: call.to_string(), content: vec![Block::text("mild")], is_error: false, ran: None };
    let answered = g.sessions.submit(&g.session, follows(vec![answer], Follows::Latest)).await;
    assert!(answered.unwrap().turn.is_some(), "the answer goes on in a turn of its own");
    g.idle_times(7).await;
    let refused = g.sessions.submit(&g.session, follows(vec![text("x")], Follows::Turn(waiting))).await;
    assert!(matches!(refused, Err(SessionError::PreviousTurn(_))), "{refused:?}");
    // A turn the session never had is neither followed nor branched from.
    let refused = g
        .sessions
        .submit(&g.session, follows(vec![text("x")], Follows::Turn(turnlog::domain::TurnId::generate())))
        .await;
    assert!(matches!(refused, Err(SessionError::PreviousTurn(_))), "{refused:?}");
}

/// Each test above, once on each log.
macro_rules! on_every_log {
    ($($name:ident),* $(,)?) => {
        mod sled {
            $(#[tokio::test] async fn $name() { super::$name(super::Backend::Sled).await })*
        }
        mod memory {
            $(#[tokio::test] async fn $name() { super::$name(super::Backend::Memory).await })*
        }
        mod jetstream {
            $(#[tokio::test] async fn $name() { super::$name(super::Backend::JetStream).await })*
        }
    };
}

on_every_log!(
    a_message_ends_the_turn_with_a_reply,
    an_outcome_sent_during_a_turn_belongs_to_no_turn,
    thinking_comes_before_the_reply,
    model_stops_become_stop_reasons,
    a_looping_model_stops_at_max_turn_requests,
    a_trusted_server_tool_runs_inline_and_the_turn_goes_on,
    an_untrusted_tool_waits_for_permission_and_runs_when_granted,
    a_denied_tool_tells_the_model_why,
    client_tools_wait_for_results_and_parallel_calls_resolve_together,
    results_may_come_one_at_a_time_through_the_event_api,
    a_remembered_permission_holds_for_the_tool_from_then_on,
    always_rejecting_a_tool_denies_its_calls_at_once,
    input_that_conflicts_with_the_state_is_refused_naming_the_calls,
    cancel_stops_the_model_at_once_and_is_idempotent,
    a_cancel_right_as_the_turn_starts_is_not_lost,
    a_cancel_while_calls_wait_closes_them,
    a_call_of_an_unknown_tool_is_answered_with_an_error,
    a_reply_cut_by_a_crash_is_made_again_from_the_history,
    a_call_left_without_a_result_runs_again_only_if_it_may,
    a_turn_resumed_max_resumes_times_is_closed_saying_why,
    calls_left_waiting_for_the_client_keep_waiting_after_a_resume,
    fetch_url_reaches_only_allowed_hosts,
    an_ask_tool_in_config_asks_even_when_the_client_trusts_it,
    turns_are_indexed_and_their_events_read_back_by_number,
    followers_resume_after_any_kind_of_cursor,
    another_writer_makes_the_actor_decide_again,
    another_writer_during_a_turn_ends_it_with_a_log_error,
    a_message_sent_while_a_turn_runs_waits_for_the_next_turn,
    an_archived_session_keeps_its_log_and_takes_no_input,
    deleting_a_session_ends_its_running_turn_first,
    archiving_a_running_session_ends_its_turn_and_takes_only_cancels,
    metadata_is_a_patch_and_title_replaces,
    a_queued_message_left_by_a_crash_is_answered_at_the_next_start,
    an_interrupt_of_waiting_calls_lets_queued_messages_through,
    a_model_requests_end_says_how_the_model_stopped,
    resolutions_name_the_models_call_too,
    a_cancel_stops_a_running_turn_and_nothing_else,
    a_turn_follows_the_turn_the_client_names,
    a_turn_that_names_an_earlier_turn_branches_from_its_end,
);
