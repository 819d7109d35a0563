//! The store against a model: random appends (some ending a session), reads after random
//! cursors in both orders, and restarts (clean and unclean), checked against a `Vec` per
//! session.

use proptest::prelude::*;
use turnlog::domain::{Block, Draft, EventBody, SessionId};
use turnlog::projection::{SessionIndex, SessionSummary};
use turnlog::store::{AppendError, ReadRange, Store, StoreConfig};

const SESSIONS: usize = 3;

#[derive(Debug, Clone)]
enum Op {
    Append { session: usize, texts: Vec<String>, terminate: bool },
    Read { session: usize, after: Option<usize>, before: Option<usize>, limit: usize, newest_first: bool },
    Restart { clean: bool },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..SESSIONS, prop::collection::vec("[a-z\"\\\\ ]{0,12}", 1..6), prop::bool::weighted(0.05))
            .prop_map(|(session, texts, terminate)| Op::Append { session, texts, terminate }),
        4 => (0..SESSIONS, prop::option::of(0..40usize), prop::option::of(0..40usize), 1..20usize, any::<bool>())
            .prop_map(|(session, after, before, limit, newest_first)| Op::Read { session, after, before, limit, newest_first }),
        1 => any::<bool>().prop_map(|clean| Op::Restart { clean }),
    ]
}

/// What the model keeps of each stored event.
#[derive(Debug, Clone, PartialEq)]
struct Stored {
    id: turnlog::domain::EventId,
    seq: u64,
    json: bytes::Bytes,
}

fn open(path: &std::path::Path) -> Store {
    let config = StoreConfig { path: Some(path.to_path_buf()), ..StoreConfig::default() };
    Store::open(config, turnlog::projection::all()).expect("store opens")
}

async fn run(ops: Vec<Op>) {
    let dir = tempfile::tempdir().unwrap();
    let mut store = open(dir.path());
    let sessions: Vec<SessionId> = (0..SESSIONS).map(|_| SessionId::generate()).collect();
    let mut model: Vec<Vec<Stored>> = vec![Vec::new(); SESSIONS];
    let mut closed = [false; SESSIONS];
    for (i, session) in sessions.iter().enumerate() {
        let created = EventBody::SessionCreated { spec: Default::default(), created_by: format!("s{i}") };
        let events = store.append(*session, vec![Draft::new(None, &created)]).await.unwrap();
        model[i].extend(events.into_iter().map(|e| Stored { id: e.id, seq: e.seq, json: e.json }));
    }
    for op in ops {
        match op {
            Op::Append { session, texts, terminate } => {
                let mut drafts: Vec<Draft> = texts
                    .iter()
                    .map(|t| Draft::new(None, &EventBody::UserMessage { content: vec![Block::text(t.clone())] }))
                    .collect();
                if terminate {
                    drafts.push(Draft::new(None, &EventBody::Terminated { reason: "done".into() }));
                }
                let result = store.append(sessions[session], drafts).await;
                if closed[session] {
                    assert_eq!(result, Err(AppendError::Closed));
                    continue;
                }
                let events = result.unwrap();
                assert_eq!(events.len(), texts.len() + usize::from(terminate));
                for event in events {
                    let last = model[session].last().unwrap();
                    assert_eq!(event.seq, last.seq + 1, "no gaps");
                    assert!(event.id > last.id, "ids increase");
                    let decoded = event.decode().unwrap();
                    assert_eq!(decoded.sequence_number, event.seq);
                    assert_eq!(decoded.session_id, sessions[session]);
                    model[session].push(Stored { id: event.id, seq: event.seq, json: event.json });
                }
                closed[session] |= terminate;
            }
            Op::Read { session, after, before, limit, newest_first } => {
                let log = &model[session];
                let after = after.filter(|&a| a < log.len());
                let before = before.filter(|&b| b < log.len());
                let range = ReadRange {
                    after: after.map(|a| log[a].id),
                    before: before.map(|b| log[b].id),
                    limit,
                    newest_first,
                };
                let got: Vec<Stored> = store
                    .read(sessions[session], range)
                    .unwrap()
                    .into_iter()
                    .map(|e| Stored { id: e.id, seq: e.seq, json: e.json })
                    .collect();
                let from = after.map_or(0, |a| a + 1);
                let to = before.unwrap_or(log.len());
                let mut expected: Vec<Stored> = log.get(from..to.max(from)).unwrap_or_default().to_vec();
                if newest_first {
                    expected.reverse();
                }
                expected.truncate(limit);
                assert_eq!(got, expected);
            }
            Op::Restart { clean } => {
                if clean {
                    store.close().unwrap();
                } else {
                    store.close_unclean().unwrap();
                }
                drop(store);
                store = open(dir.path());
                for (i, session) in sessions.iter().enumerate() {
                    let position = store.position(*session).unwrap();
                    assert_eq!(position.seq, model[i].last().unwrap().seq);
                    assert_eq!(position.last, Some(model[i].last().unwrap().id));
                    let summary = store.projected(SessionIndex::NAME, *session).unwrap().expect("indexed");
                    let summary: SessionSummary = serde_json::from_slice(&summary).unwrap();
                    assert_eq!(summary.created_by, format!("s{i}"));
                    assert_eq!(summary.deleted, closed[i], "the index knows which sessions ended");
                }
            }
        }
    }
    store.close().unwrap();
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn the_store_agrees_with_a_vec(ops in prop::collection::vec(op(), 1..50)) {
        tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(run(ops));
    }
}
