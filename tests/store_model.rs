//! The log against a model: random appends (some ending a session, some at a stale
//! position), reads after random cursors in both orders, lookups by sequence number, and
//! restarts (clean and unclean), checked against a `Vec` per session. The same test body
//! runs on the sled log, on the JetStream log (against a real nats-server) and on the
//! in-memory log; so do the tests of two writers racing for one position, of projections
//! rebuilt, and of the chain.

#[path = "common/nats.rs"]
mod nats;

use std::sync::Arc;

use proptest::prelude::*;
use turnlog::domain::{Block, Draft, EventBody, EventId, SessionId};
use turnlog::projection::{SessionIndex, SessionSummary};
use turnlog::store::jetstream::JetStreamLog;
use turnlog::store::memory::MemoryLog;
use turnlog::store::sled::{SledConfig, SledLog};
use turnlog::store::{AppendError, AuditLog, Conflict, Key, Log, Position, Projections, ReadRange, SharedLog};

const SESSIONS: usize = 3;

#[derive(Debug, Clone)]
enum Op {
    Append {
        session: usize,
        texts: Vec<String>,
        terminate: bool,
    },
    /// An append at a position `back` events before the end: a conflict.
    Stale {
        session: usize,
        back: u64,
    },
    Read {
        session: usize,
        after: Option<usize>,
        before: Option<usize>,
        limit: usize,
        newest_first: bool,
    },
    At {
        session: usize,
        seq: u64,
    },
    Restart {
        clean: bool,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..SESSIONS, prop::collection::vec("[a-z\"\\\\ ]{0,12}", 1..6), prop::bool::weighted(0.05))
            .prop_map(|(session, texts, terminate)| Op::Append { session, texts, terminate }),
        1 => (0..SESSIONS, 1..4u64).prop_map(|(session, back)| Op::Stale { session, back }),
        4 => (0..SESSIONS, prop::option::of(0..40usize), prop::option::of(0..40usize), 1..20usize, any::<bool>())
            .prop_map(|(session, after, before, limit, newest_first)| Op::Read { session, after, before, limit, newest_first }),
        1 => (0..SESSIONS, 0..45u64).prop_map(|(session, seq)| Op::At { session, seq }),
        1 => any::<bool>().prop_map(|clean| Op::Restart { clean }),
    ]
}

/// What the model keeps of each stored event.
#[derive(Debug, Clone, PartialEq)]
struct Stored {
    id: EventId,
    seq: u64,
    json: bytes::Bytes,
}

/// A log under test, with what a restart of it takes.
enum Opened {
    Sled(SledLog, Backend),
    Memory(MemoryLog),
    /// The log on its own nats-server.
    JetStream(JetStreamLog, Arc<nats::Nats>),
}

#[derive(Debug, Clone, Copy)]
enum Backend {
    Sled,
    /// sled keeping only about three events of each session in memory: reads start in
    /// the recent run, before it, and past it.
    SledShortRecent,
    Memory,
    JetStream,
}

impl Opened {
    async fn open(backend: Backend, dir: &std::path::Path) -> Opened {
        match backend {
            Backend::Sled | Backend::SledShortRecent => {
                let mut config = SledConfig { path: Some(dir.to_path_buf()), ..SledConfig::default() };
                if matches!(backend, Backend::SledShortRecent) {
                    config.recent_bytes = 1_000;
                }
                Opened::Sled(SledLog::open(config, turnlog::projection::all()).expect("the log opens"), backend)
            }
            Backend::Memory => Opened::Memory(MemoryLog::new(turnlog::projection::all(), 256, 1_000_000)),
            Backend::JetStream => {
                let nats = nats::Nats::single().await;
                Opened::JetStream(nats::open_log(&nats).await, Arc::new(nats))
            }
        }
    }

    fn log(&self) -> &dyn Log {
        match self {
            Opened::Sled(log, _) => log,
            Opened::Memory(log) => log,
            Opened::JetStream(log, _) => log,
        }
    }

    fn projections(&self) -> &dyn Projections {
        match self {
            Opened::Sled(log, _) => log,
            Opened::Memory(log) => log,
            Opened::JetStream(log, _) => log,
        }
    }

    fn audit(&self) -> &dyn AuditLog {
        match self {
            Opened::Sled(log, _) => log,
            Opened::Memory(log) => log,
            Opened::JetStream(log, _) => log,
        }
    }

    fn shared(&self) -> Arc<dyn Log> {
        match self {
            Opened::Sled(log, _) => Arc::new(log.clone()),
            Opened::Memory(log) => Arc::new(log.clone()),
            Opened::JetStream(log, _) => Arc::new(log.clone()),
        }
    }

    /// Closes (cleanly, or as a crash would leave it) and opens again.
    async fn restart(self, dir: &std::path::Path, clean: bool) -> Opened {
        match self {
            Opened::Sled(log, backend) => {
                if clean {
                    log.close().await.unwrap();
                } else {
                    log.close_unclean().unwrap();
                }
                drop(log);
                Opened::open(backend, dir).await
            }
            Opened::Memory(log) => Opened::Memory(log.reopen()),
            // A node restarts on the same engine: nothing of it is kept but what JetStream
            // holds. Unclean: it forgets the projections too, which it rebuilds from the stream.
            Opened::JetStream(log, nats) => {
                if clean {
                    log.close().await.unwrap();
                } else {
                    log.forget_projections().await.unwrap();
                    log.close_unclean();
                }
                Opened::JetStream(nats::open_log(&nats).await, nats)
            }
        }
    }
}

fn stored(events: Vec<turnlog::domain::RawEvent>) -> Vec<Stored> {
    events.into_iter().map(|e| Stored { id: e.id, seq: e.seq, json: e.json }).collect()
}

async fn run(backend: Backend, ops: Vec<Op>) {
    let dir = tempfile::tempdir().unwrap();
    let mut opened = Opened::open(backend, dir.path()).await;
    let sessions: Vec<SessionId> = (0..SESSIONS).map(|_| SessionId::generate()).collect();
    let mut model: Vec<Vec<Stored>> = vec![Vec::new(); SESSIONS];
    let mut closed = [false; SESSIONS];
    for (i, session) in sessions.iter().enumerate() {
        let created = EventBody::SessionCreated { spec: Default::default(), created_by: format!("s{i}") };
        let events = opened.log().append(*session, 0, vec![Draft::new(None, &created)]).await.unwrap().unwrap();
        model[i].extend(stored(events));
    }
    for op in ops {
        let log = opened.log();
        match op {
            Op::Append { session, texts, terminate } => {
                let mut drafts: Vec<Draft> = texts
                    .iter()
                    .map(|t| Draft::new(None, &EventBody::UserMessage { content: vec![Block::text(t.clone())] }))
                    .collect();
                if terminate {
                    drafts.push(Draft::new(None, &EventBody::Terminated { reason: "done".into() }));
                }
                let at = model[session].last().unwrap().seq;
                let result = log.append(sessions[session], at, drafts).await;
                if closed[session] {
                    assert_eq!(result, Err(AppendError::Closed));
                    continue;
                }
                let events = result.unwrap().unwrap();
                assert_eq!(events.len(), texts.len() + usize::from(terminate));
                for event in events {
                    let last = model[session].last().unwrap();
                    assert_eq!(event.seq, last.seq + 1, "no gaps");
                    assert!(event.id > last.id, "ids increase");
                    let decoded = event.decode().unwrap();
                    assert_eq!(decoded.sequence_number, event.seq);
                    assert_eq!(decoded.session_id, sessions[session]);
                    model[session].extend(stored(vec![event]));
                }
                closed[session] |= terminate;
            }
            Op::Stale { session, back } => {
                let last = model[session].last().unwrap();
                let drafts = vec![Draft::new(None, &EventBody::UserInterrupt {})];
                let result = log.append(sessions[session], last.seq.saturating_sub(back), drafts).await;
                if closed[session] {
                    assert_eq!(result, Err(AppendError::Closed), "a terminated log takes nothing, at any position");
                    continue;
                }
                let actual = Position { last: Some(last.id), seq: last.seq };
                assert_eq!(result, Ok(Err(Conflict { expected: last.seq.saturating_sub(back), actual })));
            }
            Op::Read { session, after, before, limit, newest_first } => {
                let events = &model[session];
                let after = after.filter(|&a| a < events.len());
                let before = before.filter(|&b| b < events.len());
                let range = ReadRange {
                    after: after.map(|a| events[a].id),
                    before: before.map(|b| events[b].id),
                    limit,
                    newest_first,
                };
                let got = stored(log.read(sessions[session], range).await.unwrap());
                let from = after.map_or(0, |a| a + 1);
                let to = before.unwrap_or(events.len());
                let mut expected: Vec<Stored> = events.get(from..to.max(from)).unwrap_or_default().to_vec();
                if newest_first {
                    expected.reverse();
                }
                expected.truncate(limit);
                assert_eq!(got, expected);
            }
            Op::At { session, seq } => {
                let got = log.event_at(sessions[session], seq).await.unwrap().map(|e| stored(vec![e]).remove(0));
                let expected = seq.checked_sub(1).and_then(|i| model[session].get(i as usize)).cloned();
                assert_eq!(got, expected, "event number {seq}");
            }
            Op::Restart { clean } => {
                opened = opened.restart(dir.path(), clean).await;
                let log = opened.log();
                for (i, session) in sessions.iter().enumerate() {
                    let position = log.position(*session).await.unwrap();
                    assert_eq!(position.seq, model[i].last().unwrap().seq);
                    assert_eq!(position.last, Some(model[i].last().unwrap().id));
                    let summary = opened.projections().get(SessionIndex::NAME, Key::session(*session)).await.unwrap();
                    let summary: SessionSummary = serde_json::from_slice(&summary.expect("indexed")).unwrap();
                    assert_eq!(summary.created_by, format!("s{i}"));
                    // Ended by `terminated` alone (as an idle timeout ends one): kept, not deleted.
                    let ended = summary.ended.as_ref().map(|ended| ended.reason.as_str());
                    assert_eq!(ended, closed[i].then_some("done"), "the index knows which sessions ended");
                    assert!(!summary.deleted);
                }
            }
        }
    }
    opened.log().close().await.unwrap();
}

fn block_on(future: impl std::future::Future<Output = ()>) {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(future);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn the_sled_log_agrees_with_a_vec(ops in prop::collection::vec(op(), 1..50)) {
        block_on(run(Backend::Sled, ops));
    }

    #[test]
    fn the_sled_log_with_a_short_recent_run_agrees_with_a_vec(ops in prop::collection::vec(op(), 1..50)) {
        block_on(run(Backend::SledShortRecent, ops));
    }

    #[test]
    fn the_memory_log_agrees_with_a_vec(ops in prop::collection::vec(op(), 1..50)) {
        block_on(run(Backend::Memory, ops));
    }
}

proptest! {
    // Each case starts its own nats-server.
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]

    #[test]
    fn the_jetstream_log_agrees_with_a_vec(ops in prop::collection::vec(op(), 1..50)) {
        block_on(run(Backend::JetStream, ops));
    }
}

/// Appends to one session ordered back to back, none waiting for the one before to be
/// durable, are numbered in order at once and share commits; each resolves once durable,
/// and the log holds them in the order they were made.
#[tokio::test]
async fn appends_to_one_session_made_in_a_row_share_commits() {
    let dir = tempfile::tempdir().unwrap();
    let Opened::Sled(log, _) = Opened::open(Backend::Sled, dir.path()).await else { unreachable!() };
    let session = SessionId::generate();
    let created = EventBody::SessionCreated { spec: Default::default(), created_by: "t".into() };
    log.append(session, 0, vec![Draft::new(None, &created)]).await.unwrap().unwrap();
    let outcome = |i: u64| Draft::new(None, &EventBody::UserDefineOutcome { outcome: serde_json::json!(i) });
    let before = log.commits();
    let mut ordered = Vec::new();
    for i in 0..200u64 {
        let append = log.order(session, 1 + i, vec![outcome(i)]).unwrap();
        let events = append.appended.as_ref().expect("ordered at the end of the log");
        assert_eq!(events[0].seq, 2 + i, "numbered as ordered");
        ordered.push(append);
    }
    let mut made = Vec::new();
    for append in ordered {
        made.extend(append.durable().await.unwrap().unwrap());
    }
    let commits = log.commits() - before;
    assert!(commits <= 100, "200 appends ordered in a row took {commits} commits");
    let range = ReadRange { after: None, before: None, limit: 1000, newest_first: false };
    let stored = log.read(session, range).await.unwrap();
    assert_eq!(stored.len(), 201);
    for (i, (stored, made)) in stored[1..].iter().zip(&made).enumerate() {
        assert_eq!((stored.id, stored.seq, &stored.json), (made.id, made.seq, &made.json), "event {i}");
        let EventBody::UserDefineOutcome { outcome } = stored.decode().unwrap().body else { panic!() };
        assert_eq!(outcome, serde_json::json!(i), "in the order they were made");
    }
}

/// A write-ahead log of small segments: each full one is checkpointed into sled and removed
/// while appends go on, and an unclean close (the live segment left behind) loses nothing:
/// the next open has every event, byte for byte, and the numbering goes on after them.
/// (sled writes what it holds when its last handle drops, so replaying the segments after
/// a real crash is shown by the SIGKILL tests in `tests/api`, not here.)
#[tokio::test]
async fn full_segments_are_checkpointed_and_an_unclean_close_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let config = SledConfig { path: Some(dir.path().to_path_buf()), wal_segment_bytes: 4096, ..SledConfig::default() };
    let log = SledLog::open(config.clone(), turnlog::projection::all()).unwrap();
    let session = SessionId::generate();
    let created = EventBody::SessionCreated { spec: Default::default(), created_by: "t".into() };
    log.append(session, 0, vec![Draft::new(None, &created)]).await.unwrap().unwrap();
    let outcome = |i: u64| Draft::new(None, &EventBody::UserDefineOutcome { outcome: serde_json::json!({"n": i}) });
    for i in 0..300u64 {
        log.append(session, 1 + i, vec![outcome(i)]).await.unwrap().unwrap();
    }
    // About 30 segments were filled; the checkpointer removes them as it goes.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while log.wal_segments() > 2 {
        assert!(std::time::Instant::now() < deadline, "{} segments left after checkpoints", log.wal_segments());
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let all = ReadRange { after: None, before: None, limit: 1000, newest_first: false };
    let before = stored(log.read(session, all).await.unwrap());
    assert_eq!(before.len(), 301);
    log.close_unclean().unwrap();
    drop(log);
    let log = SledLog::open(config, turnlog::projection::all()).unwrap();
    assert_eq!(stored(log.read(session, all).await.unwrap()), before);
    let next = log.append(session, 301, vec![outcome(300)]).await.unwrap().unwrap();
    assert_eq!(next[0].seq, 302);
    log.close().await.unwrap();
    assert_eq!(log.wal_bytes(), 0, "a clean close leaves nothing in the write-ahead log");
}

/// Two nodes (two logs on one JetStream stream, each with its own idea of where a session
/// ends) append to one session at the same position at the same time, round after round:
/// exactly one batch is acknowledged, the other node is refused (as raced, or as a conflict
/// if it had seen the other's append), and the log is each round's winner's batch, whole,
/// with no gap. On one server JetStream's expected last subject sequence decides; with
/// three replicas it may store both (nats-server#4320), and the publishers' check of where
/// their message landed decides.
#[tokio::test]
async fn two_nodes_race_for_one_position_on_the_jetstream_log() {
    two_nodes_race_on_jetstream(nats::Nats::single().await, 1).await;
}

#[tokio::test]
async fn two_nodes_race_for_one_position_on_a_jetstream_log_with_three_replicas() {
    two_nodes_race_on_jetstream(nats::Nats::cluster().await, 3).await;
}

async fn two_nodes_race_on_jetstream(nats: nats::Nats, replicas: usize) {
    let (a, b) = (nats::open_log_with(&nats, replicas).await, nats::open_log_with(&nats, replicas).await);
    let (a, b) = (Arc::new(a), Arc::new(b));
    let session = created_session(&a).await;
    let batch = |node: &str, round: usize| -> Vec<Draft> {
        let outcome =
            |k: usize| EventBody::UserDefineOutcome { outcome: serde_json::json!(format!("{node}-{round}-{k}")) };
        (0..3).map(|k| Draft::new(None, &outcome(k))).collect()
    };
    let mut winners = Vec::new();
    let mut raced = 0;
    for round in 0..30 {
        // Each node takes the session as it now ends, as a node does that takes it over.
        let mut at = 0;
        for node in [&a, &b] {
            node.release(session);
            node.prepare(session).await.unwrap();
            at = at.max(node.position(session).await.unwrap().seq);
        }
        let (first, second) = (batch("a", round), batch("b", round));
        let (x, y) = (a.clone(), b.clone());
        let racing = (
            tokio::spawn(async move { x.append(session, at, first).await }),
            tokio::spawn(async move { y.append(session, at, second).await }),
        );
        let (first, second) = (racing.0.await.unwrap(), racing.1.await.unwrap());
        // Refused, and by JetStream itself (raced) or by the node's own view (a conflict).
        let refused = |outcome: &Result<turnlog::store::Appended, AppendError>| match outcome {
            Err(AppendError::Raced(_)) => Some(true),
            Ok(Err(conflict)) if conflict.expected == at => Some(false),
            _ => None,
        };
        let won = match (&first, &second) {
            (Ok(Ok(events)), other) if refused(other).is_some() => ("a", events.clone(), refused(other) == Some(true)),
            (other, Ok(Ok(events))) if refused(other).is_some() => ("b", events.clone(), refused(other) == Some(true)),
            _ => panic!("round {round}: not one winner and one refusal: {first:?} / {second:?}"),
        };
        assert_eq!(won.1.iter().map(|e| e.seq).collect::<Vec<_>>(), [at + 1, at + 2, at + 3], "round {round}");
        raced += usize::from(won.2);
        winners.push(won.0);
    }
    assert!(raced > 0, "JetStream itself refused none of the losers: the race was never on the wire");
    let range = ReadRange { after: None, before: None, limit: 10_000, newest_first: false };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let all = loop {
        let all = b.read(session, range).await.unwrap();
        if all.len() > 30 * 3 || std::time::Instant::now() > deadline {
            break all;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    assert_eq!(all.len(), 1 + 30 * 3, "every winning batch, on the other node too");
    for (i, event) in all.iter().enumerate() {
        assert_eq!(event.seq, i as u64 + 1, "no gap");
    }
    for (round, winner) in winners.iter().enumerate() {
        let texts: Vec<String> = all[1 + round * 3..1 + round * 3 + 3]
            .iter()
            .map(|e| match e.decode().unwrap().body {
                EventBody::UserDefineOutcome { outcome } => outcome.as_str().unwrap().to_string(),
                other => panic!("{other:?}"),
            })
            .collect();
        let expected: Vec<String> = (0..3).map(|k| format!("{winner}-{round}-{k}")).collect();
        assert_eq!(texts, expected, "round {round} is one node's batch, not interleaved");
    }
    a.close().await.unwrap();
    b.close().await.unwrap();
}

/// Two nodes publish batches that start with the same event id: two logs imported into one
/// new session at once through two nodes, or two writers numbering from one tail within a
/// millisecond of its last event (or on clocks that disagree), whose ids then each follow
/// the last one's by one. JetStream's duplicate detection, keyed on a batch's message id,
/// must not answer the second as if it were the first: exactly one is acknowledged, and
/// the log holds that one, byte for byte, on both nodes.
#[tokio::test]
async fn batches_that_start_with_one_id_are_not_taken_for_each_other_on_jetstream() {
    batches_that_start_with_one_id(nats::Nats::single().await, 1).await;
}

#[tokio::test]
async fn batches_that_start_with_one_id_are_not_taken_for_each_other_with_three_replicas() {
    batches_that_start_with_one_id(nats::Nats::cluster().await, 3).await;
}

async fn batches_that_start_with_one_id(nats: nats::Nats, replicas: usize) {
    use turnlog::domain::event::Envelope;
    use turnlog::domain::RawEvent;
    let (a, b) = (nats::open_log_with(&nats, replicas).await, nats::open_log_with(&nats, replicas).await);
    for round in 0..5 {
        let session = SessionId::generate();
        let first = ulid::Ulid::new();
        let log_of = |who: &str, count: usize| -> Vec<RawEvent> {
            let mut id = first;
            (0..count as u64)
                .map(|i| {
                    let body = match i {
                        0 => EventBody::SessionCreated { spec: Default::default(), created_by: who.into() },
                        _ => EventBody::UserDefineOutcome { outcome: serde_json::json!(format!("{who}-{i}")) },
                    };
                    let envelope =
                        Envelope { id: EventId(id), session, turn: None, seq: i + 1, now: "2026-11-27T00:00:00Z" };
                    let event =
                        RawEvent { id: EventId(id), seq: i + 1, json: envelope.write(&Draft::new(None, &body)) };
                    id = id.increment().unwrap();
                    event
                })
                .collect()
        };
        let (x, y) = (log_of("a", 2), log_of("b", 3));
        a.prepare(session).await.unwrap();
        b.prepare(session).await.unwrap();
        let (by_a, by_b) = tokio::join!(a.adopt(session, x.clone()), b.adopt(session, y.clone()));
        let acknowledged: Vec<&Vec<RawEvent>> = [(&by_a, &x), (&by_b, &y)]
            .into_iter()
            .filter(|(outcome, _)| matches!(outcome, Ok(Ok(_))))
            .map(|(_, events)| events)
            .collect();
        assert_eq!(acknowledged.len(), 1, "round {round}: exactly one import stands: {by_a:?} / {by_b:?}");
        let range = ReadRange { after: None, before: None, limit: 100, newest_first: false };
        for node in [&a, &b] {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            let mut held = node.read(session, range).await.unwrap();
            while held.len() < acknowledged[0].len() && std::time::Instant::now() < deadline {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                held = node.read(session, range).await.unwrap();
            }
            assert_eq!(
                stored(held),
                stored(acknowledged[0].clone()),
                "round {round}: the log is the acknowledged import"
            );
        }
    }
    a.close().await.unwrap();
    b.close().await.unwrap();
}

/// Appends ordered in a row while one is being published go out together, but never as a
/// message larger than one append may be: 10 MB of appends of 50 KB each, more than the test
/// servers' 8 MB `max_payload`, all land, in order.
#[tokio::test]
async fn appends_queued_on_the_jetstream_log_are_published_in_messages_that_fit() {
    let nats = nats::Nats::single().await;
    let log = nats::open_log(&nats).await;
    let session = SessionId::generate();
    let created = EventBody::SessionCreated { spec: Default::default(), created_by: "t".into() };
    log.prepare(session).await.unwrap();
    log.append(session, 0, vec![Draft::new(None, &created)]).await.unwrap().unwrap();
    let big = |i: u64| {
        let outcome = serde_json::json!({"n": i, "pad": "x".repeat(50_000)});
        Draft::new(None, &EventBody::UserDefineOutcome { outcome })
    };
    let ordered: Vec<_> = (0..200u64).map(|i| log.order(session, 1 + i, vec![big(i)]).unwrap()).collect();
    for (i, append) in ordered.into_iter().enumerate() {
        let events = append.durable().await.unwrap_or_else(|e| panic!("append {i}: {e}")).unwrap();
        assert_eq!(events[0].seq, 2 + i as u64);
    }
    let range = ReadRange { after: None, before: None, limit: 1000, newest_first: false };
    let stored = log.read(session, range).await.unwrap();
    assert_eq!(stored.len(), 201);
    assert!(stored.iter().enumerate().all(|(i, e)| e.seq == i as u64 + 1));
    log.close().await.unwrap();
}

/// Two writers append to one session at the same expected position at the same time,
/// round after round: exactly one wins each round, the other gets the conflict, and the
/// log is each round's winner's events in one piece, with no gap.
async fn two_writers_race_for_one_position(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let opened = Opened::open(backend, dir.path()).await;
    let log = opened.shared();
    let session = SessionId::generate();
    let created = EventBody::SessionCreated { spec: Default::default(), created_by: "t".into() };
    log.append(session, 0, vec![Draft::new(None, &created)]).await.unwrap().unwrap();
    let batch = |writer: &str, round: usize| -> Vec<Draft> {
        let outcome =
            |k: usize| EventBody::UserDefineOutcome { outcome: serde_json::json!(format!("{writer}-{round}-{k}")) };
        (0..3).map(|k| Draft::new(None, &outcome(k))).collect()
    };
    let mut winners = Vec::new();
    for round in 0..50 {
        let at = log.position(session).await.unwrap().seq;
        let (a, b) = (log.clone(), log.clone());
        let (first, second) = (batch("a", round), batch("b", round));
        let racing = (
            tokio::spawn(async move { a.append(session, at, first).await }),
            tokio::spawn(async move { b.append(session, at, second).await }),
        );
        let (first, second) = (racing.0.await.unwrap().unwrap(), racing.1.await.unwrap().unwrap());
        let (won, lost) = match (first, second) {
            (Ok(events), Err(conflict)) => (("a", events), conflict),
            (Err(conflict), Ok(events)) => (("b", events), conflict),
            other => panic!("round {round}: not exactly one winner: {other:?}"),
        };
        assert_eq!(lost.expected, at);
        assert_eq!(lost.actual.seq, at + 3, "the loser is told where the log now ends");
        assert_eq!(won.1.iter().map(|e| e.seq).collect::<Vec<_>>(), [at + 1, at + 2, at + 3]);
        winners.push(won.0);
    }
    let range = ReadRange { after: None, before: None, limit: 10_000, newest_first: false };
    let all = log.read(session, range).await.unwrap();
    assert_eq!(all.len(), 1 + 50 * 3);
    for (i, event) in all.iter().enumerate() {
        assert_eq!(event.seq, i as u64 + 1, "no gap");
    }
    for (round, winner) in winners.iter().enumerate() {
        let texts: Vec<String> = all[1 + round * 3..1 + round * 3 + 3]
            .iter()
            .map(|e| match e.decode().unwrap().body {
                EventBody::UserDefineOutcome { outcome } => outcome.as_str().unwrap().to_string(),
                other => panic!("{other:?}"),
            })
            .collect();
        let expected: Vec<String> = (0..3).map(|k| format!("{winner}-{round}-{k}")).collect();
        assert_eq!(texts, expected, "round {round} is one writer's batch, not interleaved");
    }
    log.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_writers_race_on_the_sled_log() {
    two_writers_race_for_one_position(Backend::Sled).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_writers_race_on_the_memory_log() {
    two_writers_race_for_one_position(Backend::Memory).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_writers_race_on_the_jetstream_log() {
    two_writers_race_for_one_position(Backend::JetStream).await;
}

/// Every projection comes back exactly as it was when an unclean stop makes the log
/// rebuild them from the events (and the turn index holds every turn).
async fn projections_rebuild_to_what_they_were(backend: Backend) {
    use turnlog::domain::event::{StopInfo, StopReason};
    use turnlog::domain::{TurnId, Usage};
    let dir = tempfile::tempdir().unwrap();
    let mut opened = Opened::open(backend, dir.path()).await;
    let sessions: Vec<SessionId> = (0..3).map(|_| SessionId::generate()).collect();
    for (i, session) in sessions.iter().enumerate() {
        let log = opened.log();
        let mut drafts = vec![Draft::new(
            None,
            &EventBody::SessionCreated { spec: Default::default(), created_by: format!("s{i}") },
        )];
        for stop in [StopReason::EndTurn, StopReason::Error] {
            let turn = Some(TurnId::generate());
            drafts.push(Draft::new(turn, &EventBody::TurnStarted {}));
            drafts.push(Draft::new(turn, &EventBody::UserMessage { content: vec![Block::text(format!("{i}"))] }));
            if stop == StopReason::Error {
                drafts.push(Draft::new(
                    turn,
                    &EventBody::SessionError { error: "boom".into(), code: "x".into(), mcp_server: None },
                ));
            }
            let usage = Usage { input_tokens: 3, output_tokens: 4 };
            let idle = EventBody::StatusIdle {
                status: "idle".into(),
                stop_reason: StopInfo { kind: stop, event_ids: vec![] },
                usage,
            };
            drafts.push(Draft::new(turn, &idle));
        }
        // The last session has a turn still open, and the first one is deleted.
        if i == 2 {
            drafts.push(Draft::new(Some(TurnId::generate()), &EventBody::TurnStarted {}));
        }
        if i == 0 {
            drafts.push(Draft::new(None, &EventBody::SessionDeleted {}));
        }
        log.append(*session, 0, drafts).await.unwrap().unwrap();
    }
    let before = snapshot(opened.projections()).await;
    assert_eq!(before.iter().map(Vec::len).collect::<Vec<_>>(), [3, 3, 7], "sessions, open turns, turns");
    opened = opened.restart(dir.path(), false).await;
    assert_eq!(snapshot(opened.projections()).await, before);
    opened.log().close().await.unwrap();
}

/// Every value of every projection, in key order.
async fn snapshot(log: &dyn Projections) -> Vec<Vec<(Key, bytes::Bytes)>> {
    let mut all = Vec::new();
    for name in ["sessions", "open_turns", "turns"] {
        let scan = turnlog::store::Scan { session: None, after: None, newest_first: false, limit: 1000 };
        all.push(log.scan(name, scan).await.unwrap());
    }
    all
}

#[tokio::test]
async fn projections_rebuild_on_the_sled_log() {
    projections_rebuild_to_what_they_were(Backend::Sled).await;
}

#[tokio::test]
async fn projections_rebuild_on_the_memory_log() {
    projections_rebuild_to_what_they_were(Backend::Memory).await;
}

#[tokio::test]
async fn projections_rebuild_on_the_jetstream_log() {
    projections_rebuild_to_what_they_were(Backend::JetStream).await;
}

/// Every event's chain hash links it to the one before, across restarts; a whole log
/// adopted by another log (an import) keeps its bytes and gets the same chain; a log that
/// already has events, or one the numbering could not have made, is refused.
async fn the_chain_links_every_event_and_an_adopted_log_keeps_it(backend: Backend) {
    use turnlog::store::chain;
    let (dir, other_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut opened = Opened::open(backend, dir.path()).await;
    let session = SessionId::generate();
    let created = EventBody::SessionCreated { spec: Default::default(), created_by: "t".into() };
    opened.log().append(session, 0, vec![Draft::new(None, &created)]).await.unwrap().unwrap();
    let outcome = |i: u64| Draft::new(None, &EventBody::UserDefineOutcome { outcome: serde_json::json!(i) });
    for i in 0..5 {
        opened.log().append(session, 1 + 2 * i, vec![outcome(i), outcome(i + 100)]).await.unwrap().unwrap();
    }
    opened = opened.restart(dir.path(), false).await;
    opened.log().append(session, 11, vec![outcome(7)]).await.unwrap().unwrap();
    let all = ReadRange { after: None, before: None, limit: 1000, newest_first: false };
    let events = opened.log().read(session, all).await.unwrap();
    let chained = opened.audit().chained(session, all).await.unwrap();
    assert_eq!((events.len(), chained.len()), (12, 12));
    let mut head = chain::GENESIS;
    let mut hashes = Vec::new();
    for (event, (same, hash)) in events.iter().zip(&chained) {
        head = chain::link(&head, &event.json);
        assert_eq!((&same.json, *hash), (&event.json, Some(head)), "event {}", event.seq);
        hashes.push(head);
    }
    let newest = ReadRange { limit: 1, newest_first: true, ..all };
    let last = opened.audit().chained(session, newest).await.unwrap();
    assert_eq!((last[0].0.id, last[0].1), (events[11].id, Some(head)));

    let other = Opened::open(backend, other_dir.path()).await;
    other.audit().adopt(session, events.clone()).await.unwrap().unwrap();
    let adopted = other.audit().chained(session, all).await.unwrap();
    assert_eq!(stored(adopted.iter().map(|(e, _)| e.clone()).collect()), stored(events.clone()), "byte for byte");
    assert_eq!(adopted.iter().map(|(_, h)| h.unwrap()).collect::<Vec<_>>(), hashes, "the same chain");
    let again = other.audit().adopt(session, events.clone()).await.unwrap();
    assert!(matches!(again, Err(Conflict { expected: 0, .. })), "a session with events takes no import");
    let mut gapped = events.clone();
    gapped.remove(3);
    let fresh = SessionId::generate();
    let error = other.audit().adopt(fresh, gapped).await.expect_err("a gap is refused");
    assert!(matches!(error, AppendError::Malformed(_)), "{error}");
    opened.log().close().await.unwrap();
    other.log().close().await.unwrap();
}

#[tokio::test]
async fn the_chain_on_the_sled_log() {
    the_chain_links_every_event_and_an_adopted_log_keeps_it(Backend::Sled).await;
}

#[tokio::test]
async fn the_chain_on_the_memory_log() {
    the_chain_links_every_event_and_an_adopted_log_keeps_it(Backend::Memory).await;
}

#[tokio::test]
async fn the_chain_on_the_jetstream_log() {
    the_chain_links_every_event_and_an_adopted_log_keeps_it(Backend::JetStream).await;
}

/// A replay reads the log page by page (a thousand events at a time), from any event on,
/// and finds every event once, in order, across pages.
#[tokio::test]
async fn a_replay_reads_every_event_once_across_pages() {
    use turnlog::audit::export::Pages;
    let log = MemoryLog::new(turnlog::projection::all(), 256, 1_000_000);
    let session = SessionId::generate();
    let created = EventBody::SessionCreated { spec: Default::default(), created_by: "t".into() };
    log.append(session, 0, vec![Draft::new(None, &created)]).await.unwrap().unwrap();
    let outcome = |i: u64| Draft::new(None, &EventBody::UserDefineOutcome { outcome: serde_json::json!(i) });
    for batch in 0..25u64 {
        let drafts = (0..100).map(|i| outcome(batch * 100 + i)).collect();
        log.append(session, 1 + batch * 100, drafts).await.unwrap().unwrap();
    }
    let all = log.read(session, ReadRange { after: None, before: None, limit: 10_000, newest_first: false }).await;
    let all: Vec<EventId> = all.unwrap().iter().map(|e| e.id).collect();
    assert_eq!(all.len(), 2501);
    let replayed = |from: Option<EventId>| {
        let log = &log;
        async move {
            let mut replay = Pages::start(log, session, from).await.unwrap()?;
            let mut ids = Vec::new();
            loop {
                let page = replay.next(log).await.unwrap();
                if page.is_empty() {
                    return Some(ids);
                }
                ids.extend(page.iter().map(|e| e.id));
            }
        }
    };
    assert_eq!(replayed(None).await.unwrap(), all);
    assert_eq!(replayed(Some(all[1199])).await.unwrap(), all[1199..], "from event 1200 on");
    assert_eq!(replayed(Some(all[0])).await.unwrap(), all, "from the first event");
    let missing = EventId(ulid::Ulid::from(1u128));
    assert!(replayed(Some(missing)).await.is_none(), "no such event");
}

/// What JetStream 2.9 may store beside a session's log when two publishes at one expected
/// position are in flight at once (nats-server#4320): a second copy of a batch (a publish
/// sent again across a leader change) and another batch at a position already taken. Neither
/// is part of the log: the node that appended, a node following the session live, a node
/// that loads it afresh and a rebuild of the projections all skip them alike, and the
/// session takes its next appends after them, through either node.
#[tokio::test]
async fn void_messages_on_the_jetstream_log_are_skipped_alike_by_every_node() {
    use turnlog::store::jetstream::wire;
    let nats = nats::Nats::single().await;
    let (a, b) = (nats::open_log(&nats).await, nats::open_log(&nats).await);
    let session = SessionId::generate();
    let created = EventBody::SessionCreated { spec: Default::default(), created_by: "t".into() };
    let outcome = |text: &str| Draft::new(None, &EventBody::UserDefineOutcome { outcome: serde_json::json!(text) });
    a.prepare(session).await.unwrap();
    a.append(session, 0, vec![Draft::new(None, &created)]).await.unwrap().unwrap();
    a.append(session, 1, vec![outcome("a1"), outcome("a2")]).await.unwrap().unwrap();
    b.prepare(session).await.unwrap();

    // Published as JetStream would have let them in: no expected sequence, no message id.
    let client = async_nats::connect(nats.urls()[0].as_str()).await.unwrap();
    let js = async_nats::jetstream::new(client);
    let stream = js.get_stream("EVENTS").await.unwrap();
    let subject = format!("t.events.{}", session.ulid());
    let last = stream.get_last_raw_message_by_subject(&subject).await.unwrap();
    let mut copy = async_nats::HeaderMap::new();
    for name in [wire::FIRST_SEQ, wire::COUNT, wire::FIRST_ID, wire::LAST_ID] {
        copy.insert(name, last.headers.get(name).expect("turnlog's header").as_str());
    }
    js.publish_with_headers(subject.clone(), copy, last.payload.clone()).await.unwrap().await.unwrap();
    // Another batch at #2: the session deleted, which no node may take.
    let other = MemoryLog::new(turnlog::projection::all(), 256, 1_000_000);
    let deleted = vec![Draft::new(None, &created), Draft::new(None, &EventBody::SessionDeleted {})];
    other.append(session, 0, deleted).await.unwrap().unwrap();
    let range = ReadRange { after: None, before: None, limit: 100, newest_first: false };
    let conflicting: Vec<_> =
        other.read(session, range).await.unwrap().into_iter().skip(1).map(|e| (e, [7; 32])).collect();
    let (headers, payload) = wire::encode(&conflicting, None);
    js.publish_with_headers(subject.clone(), headers, payload).await.unwrap().await.unwrap();

    // The next append names the subject's last message: JetStream refuses the one this
    // node expected, and the node finds that only void messages came after it. So does the
    // other node, once it holds the first one's append.
    let appended = a.append(session, 3, vec![outcome("a3")]).await;
    assert_eq!(appended.unwrap().unwrap()[0].seq, 4, "a's append after the void messages");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while b.position(session).await.unwrap().seq < 4 {
        assert!(std::time::Instant::now() < deadline, "b never had a's append");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    b.release(session);
    b.prepare(session).await.unwrap();
    let appended = b.append(session, 4, vec![outcome("b4")]).await;
    assert_eq!(appended.unwrap().unwrap()[0].seq, 5, "b's append after them");

    let c = nats::open_log(&nats).await;
    for (name, log) in [("a", &a), ("b", &b), ("c, loading it afresh", &c)] {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let all = loop {
            let all = log.read(session, range).await.unwrap();
            if all.len() >= 5 || std::time::Instant::now() > deadline {
                break all;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        };
        let seen: Vec<(u64, String)> = all
            .iter()
            .map(|event| {
                let text = match event.decode().unwrap().body {
                    EventBody::SessionCreated { .. } => "created".to_string(),
                    EventBody::UserDefineOutcome { outcome } => outcome.as_str().unwrap().to_string(),
                    other => panic!("node {name} took an event of a void message: {other:?}"),
                };
                (event.seq, text)
            })
            .collect();
        let expected: Vec<(u64, String)> = ["created", "a1", "a2", "a3", "b4"]
            .iter()
            .enumerate()
            .map(|(i, t)| (i as u64 + 1, t.to_string()))
            .collect();
        assert_eq!(seen, expected, "the log through node {name}");
    }

    // Rebuilt from the stream, the projections are what the appends made of them.
    let before = snapshot(&c).await;
    assert!(!before[0].is_empty(), "the session is in the index");
    c.forget_projections().await.unwrap();
    c.close_unclean();
    let d = nats::open_log(&nats).await;
    assert_eq!(snapshot(&d).await, before, "the projections rebuilt from the stream");
    for log in [a, b, d] {
        log.close().await.unwrap();
    }
}

/// A node that starts learns which sessions were left with a turn open from the last
/// message of each (its turn header, which a message without turn events carries over from
/// the one before), not only from the messages it sees go by: a node whose writer died
/// before it put the open-turn index still has its turn closed by whichever node starts next.
#[tokio::test]
async fn a_node_that_starts_knows_the_turns_left_open() {
    use turnlog::domain::event::{StopInfo, StopReason};
    use turnlog::domain::{TurnId, Usage};
    let nats = nats::Nats::single().await;
    let a = nats::open_log(&nats).await;
    let (open, closed, never) = (SessionId::generate(), SessionId::generate(), SessionId::generate());
    let created = EventBody::SessionCreated { spec: Default::default(), created_by: "t".into() };
    let outcome = Draft::new(None, &EventBody::UserDefineOutcome { outcome: serde_json::json!("later") });
    let idle = EventBody::StatusIdle {
        status: "idle".into(),
        stop_reason: StopInfo { kind: StopReason::EndTurn, event_ids: vec![] },
        usage: Usage::default(),
    };
    for session in [open, closed, never] {
        a.prepare(session).await.unwrap();
        a.append(session, 0, vec![Draft::new(None, &created)]).await.unwrap().unwrap();
    }
    for session in [open, closed] {
        let turn = Some(TurnId::generate());
        a.append(session, 1, vec![Draft::new(turn, &EventBody::TurnStarted {})]).await.unwrap().unwrap();
        // A message with no turn event after it: the turn is still open.
        a.append(session, 2, vec![outcome.clone()]).await.unwrap().unwrap();
        if session == closed {
            a.append(session, 3, vec![Draft::new(turn, &idle)]).await.unwrap().unwrap();
            a.append(session, 4, vec![outcome.clone()]).await.unwrap().unwrap();
        }
    }
    let b = nats::open_log(&nats).await;
    assert_eq!(b.turns_seen_open(), vec![open], "what a node that starts now learns");
    a.close().await.unwrap();
    b.close().await.unwrap();
}

/// An event acknowledged through one node is found through every other at once, whether
/// or not that node's consumer has brought it yet (a client resuming on another node by
/// `Last-Event-ID`): appends through one node, each of their ids looked up at once
/// through the other, which has the session loaded, or loads it then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_acknowledged_on_one_node_is_found_on_another_at_once() {
    let nats = nats::Nats::single().await;
    let (a, b) = (nats::open_log(&nats).await, nats::open_log(&nats).await);
    for round in 0..20 {
        let session = SessionId::generate();
        let created = EventBody::SessionCreated { spec: Default::default(), created_by: "t".into() };
        a.prepare(session).await.unwrap();
        a.append(session, 0, vec![Draft::new(None, &created)]).await.unwrap().unwrap();
        // Half the rounds, the other node has the session loaded before the appends.
        if round % 2 == 0 {
            b.position(session).await.unwrap();
        }
        let mut at = 1;
        for i in 0..50 {
            let text = format!("{round}-{i}");
            let drafts = vec![Draft::new(None, &EventBody::UserDefineOutcome { outcome: serde_json::json!(text) })];
            let events = a.append(session, at, drafts).await.unwrap().unwrap();
            at = events[0].seq;
            let found = b.event(session, events[0].id).await.unwrap();
            assert_eq!(found.map(|e| e.seq), Some(at), "round {round}, append {i}: the other node finds it");
        }
        a.release(session);
    }
    a.close().await.unwrap();
    b.close().await.unwrap();
}

/// The bucket's keys that hold `session`'s projected values (and its watermark).
async fn projection_keys(bucket: &async_nats::jetstream::kv::Store, session: SessionId) -> Vec<String> {
    use futures_util::TryStreamExt;
    let id = session.ulid().to_string();
    let keys: Vec<String> = bucket.keys().await.unwrap().try_collect().await.unwrap();
    keys.into_iter().filter(|key| key.contains(&id)).collect()
}

/// The projections bucket the test nodes keep their values in.
async fn projections_bucket(nats: &nats::Nats) -> async_nats::jetstream::kv::Store {
    let client = async_nats::connect(nats.urls()[0].as_str()).await.unwrap();
    async_nats::jetstream::new(client).get_key_value("projections").await.unwrap()
}

/// A new session on `log`: its `session.created` appended.
async fn created_session(log: &JetStreamLog) -> SessionId {
    let session = SessionId::generate();
    let created = EventBody::SessionCreated { spec: Default::default(), created_by: "t".into() };
    log.prepare(session).await.unwrap();
    log.append(session, 0, vec![Draft::new(None, &created)]).await.unwrap().unwrap();
    session
}

/// The bucket key of a session's summary.
fn summary_key(session: SessionId) -> String {
    format!("{}.{}", SessionIndex::NAME, session.ulid())
}

/// A node that stopped between storing a session's first events and putting their
/// projections leaves a session that no summary lists: the next read of it, on any node,
/// finds its log in the stream and puts what is missing, rather than answer "no such
/// session" until someone appends to it (which nobody can: it is not found).
#[tokio::test]
async fn a_session_whose_projections_were_never_put_is_repaired_on_its_first_read() {
    let nats = nats::Nats::single().await;
    let a = nats::open_log(&nats).await;
    let session = created_session(&a).await;
    a.close().await.unwrap();
    // As if node a had died before its puts: none of the session's values is in the bucket.
    let bucket = projections_bucket(&nats).await;
    let keys = projection_keys(&bucket, session).await;
    assert!(!keys.is_empty(), "node a put the session's projections");
    for key in &keys {
        bucket.purge(key).await.unwrap();
    }

    let b = nats::open_log(&nats).await;
    let summary = b.get(SessionIndex::NAME, Key::session(session)).await.unwrap();
    let summary: SessionSummary = serde_json::from_slice(&summary.expect("the summary, repaired")).unwrap();
    assert_eq!(summary.id, session);
    assert!(!projection_keys(&bucket, session).await.is_empty(), "put back in the bucket, for every node");
    // A session that has no log is not made up.
    let nobody = SessionId::generate();
    assert_eq!(b.get(SessionIndex::NAME, Key::session(nobody)).await.unwrap(), None);
    b.close().await.unwrap();
}

/// A projection's put is conditional on the revision the node folded it from: a node whose
/// copy of the bucket is behind (one that lost a lease, or has not seen another node's put
/// yet) does not overwrite a value folded further, however its put is timed.
#[tokio::test]
async fn a_projection_put_from_a_stale_copy_keeps_the_value_folded_further() {
    let nats = nats::Nats::single().await;
    let a = nats::open_log(&nats).await;
    let bucket = projections_bucket(&nats).await;
    let session = created_session(&a).await;
    let key = summary_key(session);
    for round in 0..5u64 {
        // Another node's value, folded as far as event 100 + round: put under node a's copy.
        let stored = bucket.get(&key).await.unwrap().expect("the summary");
        let mut summary: serde_json::Value = serde_json::from_slice(&stored[8..]).unwrap();
        let further = format!("folded further {round}");
        summary["title"] = serde_json::json!(further);
        let value = [&(100 + round).to_be_bytes()[..], &serde_json::to_vec(&summary).unwrap()].concat();
        bucket.put(&key, value.into()).await.unwrap();
        // Node a folds its next event on the copy it has, at once.
        let title = EventBody::SessionUpdated {
            agent: None,
            tools: None,
            title: Some(format!("stale {round}")),
            metadata: None,
            mode: None,
            model: None,
        };
        a.append(session, 1 + round, vec![Draft::new(None, &title)]).await.unwrap().unwrap();
        let kept = bucket.get(&key).await.unwrap().expect("the summary");
        assert_eq!(u64::from_be_bytes(kept[..8].try_into().unwrap()), 100 + round, "round {round}");
        let kept: serde_json::Value = serde_json::from_slice(&kept[8..]).unwrap();
        assert_eq!(kept["title"], further, "round {round}: the value folded further stays");
    }
    a.close().await.unwrap();
}

/// A node that died between an append and its projections' puts leaves the session's
/// values behind its log while they still exist: a node that has the session loaded (it
/// serves it to a reader) finds it behind at two sweeps in a row and puts what is missing,
/// without waiting for the session's next append.
#[tokio::test]
async fn projections_left_behind_their_log_are_repaired_by_a_sweep_on_another_node() {
    let nats = nats::Nats::single().await;
    let a = nats::open_log(&nats).await;
    let bucket = projections_bucket(&nats).await;
    let session = created_session(&a).await;
    let key = summary_key(session);
    let watermark = format!("_projected.{}", session.ulid());
    let before = bucket.get(&key).await.unwrap().expect("the summary");
    let titled = EventBody::SessionUpdated {
        agent: None,
        tools: None,
        title: Some("renamed".into()),
        metadata: None,
        mode: None,
        model: None,
    };
    a.append(session, 1, vec![Draft::new(None, &titled)]).await.unwrap().unwrap();
    a.close().await.unwrap();
    // As if node a had died before it put the second append's projections.
    bucket.put(&key, before).await.unwrap();
    bucket.put(&watermark, "1".into()).await.unwrap();

    let b = nats::open_log(&nats).await;
    let title = |b: &JetStreamLog| {
        let b = b.clone();
        async move {
            let summary = b.get(SessionIndex::NAME, Key::session(session)).await.unwrap().expect("the summary");
            serde_json::from_slice::<SessionSummary>(&summary).unwrap().spec.title
        }
    };
    // Served here (a reader follows it live), with its old summary.
    let _following = b.subscribe(session).await.unwrap();
    let range = ReadRange { after: None, before: None, limit: 10, newest_first: false };
    assert_eq!(b.read(session, range).await.unwrap().len(), 2);
    assert_eq!(title(&b).await, None, "the summary as node a left it");
    b.sweep();
    b.sweep();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while title(&b).await.as_deref() != Some("renamed") {
        assert!(std::time::Instant::now() < deadline, "the sweep did not repair the summary");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    b.close().await.unwrap();
}
