//! Several nodes on one log: three nats-servers in a cluster (streams with three replicas)
//! and three turnlog nodes (the real binary) on it. A session made on one node is listed
//! and streamed on the others, appends through all three interleave with no gap, an
//! interrupt sent to one node stops the turn running on another, an agent made on one node
//! runs on another, a session deleted through one node is gone on every node, a node
//! killed mid-turn is taken over once its lease expires, and a nats-server killed under
//! load loses nothing acknowledged.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::{json, Value};

use super::helpers::{get_json, ids, launch, post_json, spawn_with, sse, take, try_spawn_with, Sse, TestApp};
use super::nats::Nats;

/// A lease expires this long after its node stops renewing it.
pub(super) const LEASE_TTL_SECS: u64 = 2;

/// Three nats-servers in a cluster and three turnlog nodes (named a, b and c) on them; each
/// node started again (`TestApp::restart`) keeps its config and data dir.
pub(super) struct Cluster {
    pub nats: Nats,
    pub nodes: Vec<TestApp>,
}

impl Cluster {
    pub async fn start() -> Cluster {
        let nats = Nats::cluster().await;
        let mut nodes = Vec::new();
        for name in ["a", "b", "c"] {
            let config = format!(
                "[store]\nbackend = \"jetstream\"\n[store.jetstream]\nservers = {}\nreplicas = 3\nnode = \"{name}\"\n\
                 lease_ttl_secs = {LEASE_TTL_SECS}\n\
                 [shutdown]\ngrace_ms = 300\n\
                 [agents.other]\nsystem = \"Another.\"\nmodel = {{ provider = \"scripted\", name = \"scripted\" }}\n",
                nats.toml_servers()
            );
            // Started at once: a node waits for a fresh cluster to elect its leaders.
            nodes.push(spawn_with(&config).await);
        }
        Cluster { nats, nodes }
    }
}

impl Cluster {
    /// The end of each node's log, for a failure's message.
    pub fn logs(&self) -> String {
        let tail = |node: &TestApp| {
            let log = std::fs::read_to_string(node.dir.path().join("data.log")).unwrap_or_default();
            log[log.len().saturating_sub(4000)..].to_string()
        };
        self.nodes.iter().map(|node| format!("--- {}\n{}", node.url, tail(node))).collect()
    }
}

/// Waits until `check` holds, failing after `secs` seconds with `what`.
async fn eventually<F, Fut>(secs: u64, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !check().await {
        assert!(Instant::now() < deadline, "not within {secs} s: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn listed(node: &TestApp, session: &str) -> bool {
    let list: Value = node.get("/sessions?limit=100").send().await.unwrap().json().await.unwrap();
    list["sessions"].as_array().unwrap().iter().any(|s| s["sessionId"] == session)
}

/// Every event of the session through `node`, once it answers: while a server fails over,
/// a read may be refused for a moment (503), never answered wrong.
async fn read_all(node: &TestApp, session: &str) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let response = node.get(&format!("/sessions/{session}/events?limit=1000")).send().await.unwrap();
        let status = response.status().as_u16();
        let body: Value = response.json().await.unwrap_or_default();
        if status == 200 {
            assert_eq!(body["has_more"], false, "one page holds this test's events");
            return body["data"].as_array().unwrap().clone();
        }
        assert!(status == 503 && Instant::now() < deadline, "a read was refused with {status}: {body}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn assert_gapless(events: &[Value]) {
    let numbers: Vec<u64> = events.iter().map(|e| e["sequence_number"].as_u64().unwrap()).collect();
    assert_eq!(numbers, (1..=events.len() as u64).collect::<Vec<_>>(), "sequence numbers 1, 2, 3, ... with no gap");
    let unique: BTreeSet<&str> = events.iter().map(|e| e["id"].as_str().unwrap()).collect();
    assert_eq!(unique.len(), events.len(), "no event twice");
}

/// Reads a stream until an event of type `kind`, failing after `secs` seconds.
async fn until(stream: &mut (impl futures_util::Stream<Item = Sse> + Unpin), kind: &str, secs: u64) -> Vec<Sse> {
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, stream.next()).await {
            Ok(Some(event)) => {
                let done = event.data["type"] == kind;
                seen.push(event);
                if done {
                    return seen;
                }
            }
            Ok(None) => panic!("the stream ended before {kind}"),
            Err(_) => {
                panic!("no {kind} within {secs} s; saw {:?}", seen.iter().map(|e| &e.data["type"]).collect::<Vec<_>>())
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_list_stream_and_append_to_one_session() {
    let cluster = Cluster::start().await;
    let [a, b, c] = &cluster.nodes[..] else { unreachable!() };

    // Made on A, listed on B and C.
    let session = a.create_session().await;
    for node in [b, c] {
        eventually(5, "the session is listed on every node", || listed(node, &session)).await;
    }

    // A turn driven through A streams live to observers on B and C.
    let mut on_b = sse(b.stream(&session, None, None).await);
    let mut on_c = sse(c.stream(&session, None, None).await);
    let path = format!("/sessions/{session}/turns");
    let (status, body) =
        post_json(a, &path, json!({"stream": "none", "messages": [{"role": "user", "content": "hello"}]})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["messages"][0]["content"], "echo: hello");
    let log = a.all_events(&session).await;
    for (node, stream) in [("B", &mut on_b), ("C", &mut on_c)] {
        let seen: Vec<String> = take(stream, log.len(), 10).await.into_iter().map(|e| e.id).collect();
        assert_eq!(seen, ids(&log), "node {node} streamed the turn's events exactly once, in order");
    }
    // The turn index A folded answers on C.
    let turn = log.iter().find(|e| e["type"] == "turn.started").unwrap()["turn_id"].clone();
    let turns = format!("/v1/agents/sessions/{session}/turns");
    eventually(5, "the turn is listed on C", || async {
        let (status, page) = get_json(c, &turns).await;
        status == 200
            && page["data"]
                .as_array()
                .is_some_and(|t| t.iter().any(|t| t["id"] == turn && t["state"]["status"] != "running"))
    })
    .await;

    // Appends through all three nodes at once, to the one session.
    let mut writers = Vec::new();
    for (n, node) in cluster.nodes.iter().enumerate() {
        let (url, client, session) = (node.url.clone(), node.client.clone(), session.clone());
        writers.push(tokio::spawn(async move {
            let mut acknowledged = Vec::new();
            for i in 0..15 {
                let event = json!({"type": "user.define_outcome", "outcome": format!("{n}-{i}")});
                let response = client
                    .post(format!("{url}/sessions/{session}/events"))
                    .json(&json!({"events": [event]}))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(response.status(), 200, "{}", response.text().await.unwrap());
                let body: Value = response.json().await.unwrap();
                acknowledged.extend(body["data"].as_array().unwrap().iter().cloned());
            }
            acknowledged
        }));
    }
    let mut acknowledged = Vec::new();
    for writer in writers {
        acknowledged.extend(writer.await.unwrap());
    }
    assert_eq!(acknowledged.len(), 45);
    let all = c.all_events(&session).await;
    assert_gapless(&all);
    for event in &acknowledged {
        assert!(all.contains(event), "an acknowledged event is in the log as acknowledged: {event}");
    }
    // The observers saw them all too.
    let rest = all.len() - log.len();
    let seen: Vec<String> = take(&mut on_b, rest, 10).await.into_iter().map(|e| e.id).collect();
    assert_eq!(seen, ids(&all[log.len()..]));

    // An observer on C drops its connection halfway; events go on through B; it resumes on
    // A by Last-Event-ID and gets exactly the rest, the new ones included.
    let half = log.len() + rest / 2;
    let seen_on_c = take(&mut on_c, half - log.len(), 10).await;
    assert_eq!(seen_on_c.iter().map(|e| e.id.clone()).collect::<Vec<_>>(), ids(&all[log.len()..half]));
    drop(on_c);
    let last_seen = seen_on_c.last().unwrap().id.clone();
    let more: Vec<String> = (0..5).map(|i| format!("after the drop {i}")).collect();
    b.post_outcomes(&session, &more).await;
    let now = read_all(a, &session).await;
    let mut resumed = sse(a.stream(&session, None, Some(&last_seen)).await);
    let after: Vec<String> = take(&mut resumed, now.len() - half, 10).await.into_iter().map(|e| e.id).collect();
    assert_eq!(after, ids(&now[half..]), "exactly the rest, once each");
    let more_on_b = take(&mut on_b, 5, 10).await;
    assert_eq!(more_on_b.iter().map(|e| e.id.clone()).collect::<Vec<_>>(), ids(&now[all.len()..]));
    // A turn running on A (which holds the session) is interrupted through C.
    let (url, client, turn_session) = (a.url.clone(), a.client.clone(), session.clone());
    let long = json!({"stream": "delta", "messages": [{"role": "user", "content": "/words 2000\n/delay 20"}]});
    let running = tokio::spawn(async move {
        client.post(format!("{url}/sessions/{turn_session}/turns")).json(&long).send().await.unwrap().text().await
    });
    until(&mut on_b, "agent.message.delta", 10).await;
    let interrupted = c.post_event(&session, json!({"type": "user.interrupt"})).await;
    assert_eq!(interrupted.status(), 200, "{}", interrupted.text().await.unwrap());
    let ended = until(&mut on_b, "session.status_idle", 10).await;
    assert_eq!(
        ended.last().unwrap().data["stop_reason"],
        json!({"type": "cancel", "detail": "cancelled"}),
        "the turn on A stopped"
    );
    let answer = tokio::time::timeout(Duration::from_secs(10), running).await.unwrap().unwrap().unwrap();
    assert!(answer.contains("turn_stop"), "A's client saw its turn end: {answer}");

    // An agent made through A's managed-agents API runs a session made on B.
    let (status, env) = post_json(a, "/v1/environments", json!({"name": "e"})).await;
    assert_eq!(status, 200, "{env}");
    let (status, agent) = post_json(a, "/v1/agents", json!({"name": "made on a", "model": "scripted"})).await;
    assert_eq!(status, 200, "{agent}");
    let body = json!({"agent": agent["id"], "environment_id": env["id"]});
    let deadline = Instant::now() + Duration::from_secs(5);
    let made = loop {
        let (status, made) = post_json(b, "/v1/sessions", body.clone()).await;
        if status == 200 {
            break made;
        }
        assert!(Instant::now() < deadline, "node B never knew the agent made on A: {status} {made}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let managed = made["id"].as_str().unwrap().to_string();
    let mut watched = sse(c.stream(&managed, None, None).await);
    let message = json!({"type": "user.message", "content": [{"type": "text", "text": "on b"}]});
    let (status, sent) = post_json(b, &format!("/v1/sessions/{managed}/events"), json!({"events": [message]})).await;
    assert_eq!(status, 200, "{sent}");
    let turn = until(&mut watched, "session.status_idle", 10).await;
    let reply = turn.iter().find(|e| e.data["type"] == "agent.message").expect("the agent answered");
    assert_eq!(reply.data["content"][0]["text"], "echo: on b");

    // What a node exports about the engine: publishes timed, leases taken, the consumer's lag.
    let (mut publishes, mut leases) = (0.0, 0.0);
    for node in &cluster.nodes {
        publishes += node.metric("turnlog_jetstream_publish_seconds_count").await;
        leases += node.metric("turnlog_lease_changes_total{change=\"acquired\"}").await;
        let text = node.get("/metrics").send().await.unwrap().text().await.unwrap();
        assert!(text.contains("turnlog_jetstream_consumer_pending"), "the consumer's lag is exported");
    }
    assert!(publishes >= 45.0, "every append's publish is timed ({publishes})");
    // The session's lease, still held, is renewed every third of its time to live.
    let renewed = || async {
        let mut renewals = 0.0;
        for node in &cluster.nodes {
            renewals += node.metric("turnlog_lease_changes_total{change=\"renewed\"}").await;
        }
        renewals >= 1.0
    };
    eventually(2 * LEASE_TTL_SECS, "a held lease is renewed", renewed).await;
    assert!(leases >= 2.0, "the two sessions' leases were taken ({leases})");

    let health: Value = b.get("/healthz").send().await.unwrap().json().await.unwrap();
    let version = health["version"].as_str().unwrap_or_default().to_string();
    assert!(version.starts_with("2."), "the nats-server's version: {health}");
    let durability = if version.starts_with("2.9.") { "synced_on_timer" } else { "engine_configured" };
    let expected =
        json!({"status": "ok", "store": "jetstream", "connected": true, "version": version, "durability": durability});
    assert_eq!(health, expected);
}

/// A session whose writes all come through one node moves to it, as behind a load balancer
/// that hashes on the session id (docs/cluster.md): run by A (which took its lease with a
/// first write, as a node's reaper takes a dead node's sessions), then written only through
/// B, it is forwarded to A for a few submissions, then A lets it go and B runs it, with
/// nothing lost, doubled or out of order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_written_through_one_node_moves_to_that_node() {
    let cluster = Cluster::start().await;
    let [a, b, _] = &cluster.nodes[..] else { unreachable!() };
    let session = a.create_session().await;
    let mut outcomes = vec!["through a".to_string()];
    a.post_outcomes(&session, &outcomes).await;
    assert_eq!(a.metric("turnlog_lease_changes_total{change=\"acquired\"}").await, 1.0, "A runs the session");
    let path = format!("/sessions/{session}/events");
    let through_b: Vec<String> = (0..16).map(|i| format!("through b {i}")).collect();
    for outcome in &through_b {
        let (status, body) =
            post_json(b, &path, json!({"events": [{"type": "user.define_outcome", "outcome": outcome}]})).await;
        assert_eq!(status, 200, "{outcome}: {body}\n{}", cluster.logs());
    }
    let handed = a.metric("turnlog_lease_changes_total{change=\"handed_over\"}").await;
    let served = a.metric("turnlog_forwarded_total{way=\"served\"}").await;
    let sent = b.metric("turnlog_forwarded_total{way=\"sent\"}").await;
    let logs = format!("handed over {handed}, served {served}, sent {sent}\n{}", cluster.logs());
    assert_eq!(handed, 1.0, "A let the session go once B had sent it eight in a row\n{logs}");
    // The ninth may reach A as it lets go: taken by the old actor, which hands it back, and
    // A sends it on to B, which runs it.
    assert!((8.0..=9.0).contains(&served), "A ran the first eight of B's submissions, then none\n{logs}");
    assert!((8.0..=9.0).contains(&sent), "B forwarded {sent} of its 16 submissions, not only the first\n{logs}");
    assert!(b.metric("turnlog_lease_changes_total{change=\"acquired\"}").await >= 1.0, "B holds the lease");

    let log = read_all(b, &session).await;
    assert_gapless(&log);
    outcomes.extend(through_b);
    let stored: Vec<&str> = log.iter().filter_map(|e| e["outcome"].as_str()).collect();
    assert_eq!(stored, outcomes, "every write once, in the order sent");
    // Reads on A see the whole log too.
    eventually(5, "A reads what B wrote", || async { read_all(a, &session).await.len() == log.len() }).await;
}

/// A session made through A, appended to through B and deleted through C (the delete
/// forwarded to A, which runs it): the delete is answered once stored, and the session is
/// gone through every node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_deleted_through_one_node_is_gone_on_every_node() {
    let cluster = Cluster::start().await;
    let [a, b, c] = &cluster.nodes[..] else { unreachable!() };
    let session = a.create_session().await;
    b.post_outcomes(&session, &["before the delete".to_string()]).await;
    let deleted = c.delete(&format!("/sessions/{session}")).send().await.unwrap();
    assert_eq!(deleted.status(), 204, "{}", deleted.text().await.unwrap());
    for node in &cluster.nodes {
        let path = format!("/sessions/{session}");
        eventually(5, "the session is gone through every node", || async {
            node.get(&path).send().await.unwrap().status() == 404
        })
        .await;
        let event = json!({"type": "user.define_outcome", "outcome": "after the delete"});
        assert_eq!(node.post_event(&session, event).await.status(), 404, "nothing is appended after a delete");
    }
}

/// Sessions made through every node, of two agents: each node lists them all, filtered by
/// agent and by creation time, newest first, page by page.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_node_lists_every_session_filtered_and_paged() {
    let cluster = Cluster::start().await;
    let mut made = Vec::new();
    for round in 0..3 {
        for (n, node) in cluster.nodes.iter().enumerate() {
            let agent = if (round + n) % 2 == 0 { "other" } else { "default" };
            let (status, body) = post_json(node, "/sessions", json!({"agent": {"name": agent}})).await;
            assert_eq!(status, 201, "{body}");
            made.push((body["sessionId"].as_str().unwrap().to_string(), agent));
        }
    }
    let newest_first = |agent: Option<&str>| -> Vec<String> {
        made.iter().rev().filter(|(_, a)| agent.is_none_or(|agent| *a == agent)).map(|(s, _)| s.clone()).collect()
    };
    for node in &cluster.nodes {
        for agent in [None, Some("other"), Some("default")] {
            let query = agent.map_or(String::new(), |agent| format!("&agent={agent}"));
            let expected = newest_first(agent);
            eventually(10, "every session is listed, page by page", || async {
                let mut listed = Vec::new();
                let mut after: Option<String> = None;
                loop {
                    let cursor = after.as_ref().map_or(String::new(), |after| format!("&after={after}"));
                    let (status, page) = get_json(node, &format!("/sessions?limit=2{query}{cursor}")).await;
                    assert_eq!(status, 200, "{page}");
                    let items = page["sessions"].as_array().unwrap();
                    assert!(items.len() <= 2);
                    listed.extend(items.iter().map(|s| s["sessionId"].as_str().unwrap().to_string()));
                    match page["next"].as_str() {
                        Some(next) => after = Some(next.to_string()),
                        None => break,
                    }
                }
                listed == expected
            })
            .await;
        }
        // Created after the fifth session: the last four, on every node.
        let fifth = cluster.nodes[0].all_events(&made[4].0).await[0]["created_at"].as_str().unwrap().to_string();
        let (status, page) = get_json(node, &format!("/sessions?created_after={fifth}")).await;
        assert_eq!(status, 200, "{page}");
        let listed: Vec<&str> =
            page["sessions"].as_array().unwrap().iter().map(|s| s["sessionId"].as_str().unwrap()).collect();
        let expected: Vec<&str> = made[5..].iter().rev().map(|(s, _)| s.as_str()).collect();
        assert_eq!(listed, expected, "node {}", node.url);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn turns_ride_through_the_death_of_the_leases_buckets_leader() {
    let _heavy = crate::helpers::HEAVY.lock().await;
    let mut cluster = Cluster::start().await;
    let whole = (1..=100).map(|i| format!("w{i}")).collect::<Vec<_>>().join(" ");
    let mut sessions = Vec::new();
    for node in &cluster.nodes {
        let session = node.create_session().await;
        let long = json!({"type": "user.message", "content": "/words 100\n/delay 40"});
        assert_eq!(node.post_event(&session, long).await.status(), 200);
        sessions.push(session);
    }
    for (node, session) in cluster.nodes.iter().zip(&sessions) {
        eventually(10, "the turn streams", || async {
            read_all(node, session).await.iter().any(|e| e["type"] == "agent.message.delta")
        })
        .await;
    }
    let leader = cluster.nats.stream_leader("KV_turnlog_leases").await;
    cluster.nats.kill(leader);
    for (i, session) in sessions.iter().enumerate() {
        let node = &cluster.nodes[(i + 1) % 3];
        eventually(60, "the turn ends", || async {
            read_all(node, session).await.last().is_some_and(|e| e["type"] == "session.status_idle")
        })
        .await;
        let events = read_all(node, session).await;
        let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
        assert_gapless(&events);
        assert_eq!(events.last().unwrap()["stop_reason"]["type"], "end_turn", "{kinds:?}\n{}", cluster.logs());
        assert!(!kinds.contains(&"session.error"), "{kinds:?}");
        let said: Vec<&Value> = events.iter().filter(|e| e["type"] == "agent.message").collect();
        assert_eq!(said.len(), 1, "{kinds:?}");
        assert_eq!(said[0]["content"][0]["text"], whole.as_str());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_stopped_mid_turn_hands_the_turn_over_to_another() {
    let _heavy = crate::helpers::HEAVY.lock().await;
    let mut cluster = Cluster::start().await;
    let session = cluster.nodes[0].create_session().await;
    let mut on_b = sse(cluster.nodes[1].stream(&session, None, None).await);
    // Posted to A, which runs the session: 80 words at 40 ms, longer than A's 300 ms grace.
    let long = json!({"type": "user.message", "content": "/words 80\n/delay 40"});
    assert_eq!(cluster.nodes[0].post_event(&session, long).await.status(), 200);
    until(&mut on_b, "agent.message.delta", 10).await;
    let stopping = Instant::now();
    let status = cluster.nodes[0].terminate().await;
    assert!(status.success(), "{status:?}");

    // A left the turn and gave its lease up: another node resumes it at once, not a time to
    // live later, and finishes it.
    let resumed = until(&mut on_b, "turn.resumed", 10).await;
    let taken_over = stopping.elapsed();
    assert!(taken_over < Duration::from_secs(LEASE_TTL_SECS), "before the lease could expire: {taken_over:?}");
    assert!(resumed.iter().all(|e| e.data["type"] != "session.status_idle"), "A recorded no end");
    let finished = until(&mut on_b, "session.status_idle", 20).await;
    let whole = (1..=80).map(|i| format!("w{i}")).collect::<Vec<_>>().join(" ");
    let said: Vec<&Sse> = finished.iter().filter(|e| e.data["type"] == "agent.message").collect();
    assert_eq!(said.len(), 1, "one whole message");
    assert_eq!(said[0].data["content"][0]["text"], whole.as_str());
    assert_eq!(finished.last().unwrap().data["stop_reason"]["type"], "end_turn");
    assert!(resumed.iter().chain(&finished).all(|e| e.data["type"] != "session.error"), "nothing closed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_killed_mid_turn_is_taken_over_once_its_lease_expires() {
    let _heavy = crate::helpers::HEAVY.lock().await;
    let mut cluster = Cluster::start().await;
    let session = cluster.nodes[0].create_session().await;
    let mut on_b = sse(cluster.nodes[1].stream(&session, None, None).await);
    let (url, client, turn_session) = (cluster.nodes[0].url.clone(), cluster.nodes[0].client.clone(), session.clone());
    let long = json!({"stream": "delta", "messages": [{"role": "user", "content": "/words 60\n/delay 20"}]});
    let running = tokio::spawn(async move {
        // The answer is cut off with its node; only the log matters here.
        let _ = client.post(format!("{url}/sessions/{turn_session}/turns")).json(&long).send().await;
    });
    until(&mut on_b, "agent.message.delta", 10).await;
    cluster.nodes[0].kill().await;
    let killed = Instant::now();
    running.abort();

    // Another node resumes the turn once A's lease has expired, and finishes it.
    let resumed = until(&mut on_b, "turn.resumed", 10 + 3 * LEASE_TTL_SECS).await;
    let taken_over = killed.elapsed();
    assert!(taken_over >= Duration::from_secs(1), "not before the lease could expire");
    assert!(
        taken_over <= Duration::from_secs(LEASE_TTL_SECS + 2),
        "within the lease's time to live and 2 s: {taken_over:?}"
    );
    let cut = resumed.last().unwrap().data["discarded"].as_array().unwrap().len();
    assert_eq!(cut, 1, "the reply A had begun is retracted");
    let finished = until(&mut on_b, "session.status_idle", 20).await;
    let said: Vec<&Sse> = finished.iter().filter(|e| e.data["type"] == "agent.message").collect();
    let whole = (1..=60).map(|i| format!("w{i}")).collect::<Vec<_>>().join(" ");
    assert_eq!(said.len(), 1, "one whole message");
    assert_eq!(said[0].data["content"][0]["text"], whole.as_str());
    assert_eq!(finished.last().unwrap().data["stop_reason"]["type"], "end_turn");
    assert!(resumed.iter().chain(&finished).all(|e| e.data["type"] != "session.error"), "nothing closed");

    // And the session goes on through B.
    let b = &cluster.nodes[1];
    let path = format!("/sessions/{session}/turns");
    let (status, body) =
        post_json(b, &path, json!({"stream": "none", "messages": [{"role": "user", "content": "after"}]})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["messages"][0]["content"], "echo: after");
    // Read through C, which follows B's appends within moments of their acknowledgement.
    let c = &cluster.nodes[2];
    eventually(5, "C holds the turn's end", || async {
        let all = c.all_events(&session).await;
        assert_gapless(&all);
        all.last().unwrap()["type"] == "session.status_idle"
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nats_server_killed_under_load_loses_nothing_acknowledged() {
    let _heavy = crate::helpers::HEAVY.lock().await;
    let mut cluster = Cluster::start().await;
    let session = cluster.nodes[0].create_session().await;
    let stop = tokio_util::sync::CancellationToken::new();
    let acks = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut writers = Vec::new();
    for (n, node) in cluster.nodes.iter().enumerate() {
        let (url, client, session, stop) = (node.url.clone(), node.client.clone(), session.clone(), stop.clone());
        let acks = acks.clone();
        writers.push(tokio::spawn(async move {
            let (mut acknowledged, mut refused) = (Vec::new(), std::collections::BTreeMap::<String, usize>::new());
            let mut i = 0;
            while !stop.is_cancelled() {
                let event = json!({"type": "user.define_outcome", "outcome": format!("{n}-{i}")});
                i += 1;
                let sent = client
                    .post(format!("{url}/sessions/{session}/events"))
                    .json(&json!({"events": [event]}))
                    .timeout(Duration::from_secs(30))
                    .send()
                    .await;
                match sent {
                    Ok(response) if response.status() == 200 => {
                        let body: Value = response.json().await.unwrap();
                        acknowledged.push((Instant::now(), body["data"][0].clone()));
                        acks.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    }
                    // Refused while the engine fails over: not acknowledged, so not owed.
                    Ok(response) => {
                        let status = response.status().as_u16();
                        let text = response.text().await.unwrap_or_default();
                        *refused.entry(format!("{status} {}", &text[..text.len().min(120)])).or_insert(0) += 1;
                    }
                    Err(error) => *refused.entry(error.to_string()).or_insert(0) += 1,
                }
            }
            (acknowledged, refused)
        }));
    }
    let count = || acks.load(std::sync::atomic::Ordering::SeqCst);
    eventually(10, "appends are acknowledged", || std::future::ready(count() >= 30)).await;
    // The stream's leader: its death makes the stream elect another while appends go on.
    let leader = cluster.nats.stream_leader("TURNLOG_EVENTS").await;
    cluster.nats.kill(leader);
    let killed = Instant::now();
    let before = count();
    while count() < before + 30 && killed.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let recovered_in = killed.elapsed();
    let recovered = count() >= before + 30;
    stop.cancel();
    let (mut acknowledged, mut refused) = (Vec::new(), std::collections::BTreeMap::<String, usize>::new());
    for writer in writers {
        let (acks, refusals) = writer.await.unwrap();
        acknowledged.extend(acks);
        for (why, n) in refusals {
            *refused.entry(why).or_insert(0) += n;
        }
    }
    eprintln!(
        "{} acknowledged, refused: {refused:#?}; 30 more acknowledged {recovered_in:?} after the kill",
        acknowledged.len()
    );
    assert!(
        recovered,
        "appends did not go on within 30 s of a server's death; refused: {refused:#?}\n{}",
        cluster.logs()
    );
    // Every node comes to hold every acknowledged event (a node whose consumer was on the
    // killed server catches up once it has followed the stream again).
    for node in &cluster.nodes {
        let mut all = Vec::new();
        let has_all = |all: &Vec<Value>| acknowledged.iter().all(|(_, event)| all.contains(event));
        let deadline = Instant::now() + Duration::from_secs(30);
        while !has_all(&all) {
            assert!(Instant::now() < deadline, "node {} lacks acknowledged events", node.url);
            tokio::time::sleep(Duration::from_millis(100)).await;
            all = read_all(node, &session).await;
            assert_gapless(&all);
        }
    }
}

/// A node whose consumer of the events stream lived on a nats-server that died, while the
/// node's own connection is to another server, replaces the consumer as soon as the stream
/// holds a message it has not brought: its client alone would notice only after two missed
/// heartbeats (10 s after the last message), and meanwhile the node's live streams, reads
/// and appends would wait. A live stream on the node gets the next append, and `/metrics`
/// counts the replacement.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_that_died_with_its_server_is_replaced_at_once() {
    let _heavy = crate::helpers::HEAVY.lock().await;
    let mut nats = Nats::cluster().await;
    let urls = nats.urls();
    let config = |name: &str, server: usize| {
        format!(
            "[store]\nbackend = \"jetstream\"\n[store.jetstream]\nservers = [{:?}]\nreplicas = 3\nnode = \"{name}\"\n\
             lease_ttl_secs = {LEASE_TTL_SECS}\n",
            urls[server]
        )
    };
    let admin = async_nats::jetstream::new(async_nats::connect(urls.clone()).await.unwrap());
    // Node x connects to one server; its consumer must live on another (JetStream places it,
    // usually with the stream's leader): x starts again on another server until it does.
    let mut x = spawn_with(&config("x", 0)).await;
    let (mut connected, mut earlier) = (0, BTreeSet::new());
    let consumer_on = loop {
        let (name, on) = follower(&admin, &earlier).await;
        if on != connected {
            break on;
        }
        assert!(earlier.len() < 8, "node x's consumer kept to the server x is connected to");
        earlier.insert(name);
        connected = (connected + 1) % 3;
        x.kill().await;
        std::fs::write(x.dir.path().join("config.toml"), config("x", connected)).unwrap();
        x.restart().await;
    };
    let other = (0..3).find(|s| *s != connected && *s != consumer_on).unwrap();
    let y = spawn_with(&config("y", other)).await;
    let session = y.create_session().await;
    let made = x.all_events(&session).await;
    let last = made.last().unwrap()["id"].as_str().unwrap().to_string();
    let mut live = sse(x.stream(&session, Some(&last), None).await);
    // Just before the kill, so that x's client has had a message a moment ago: its own
    // check would wait the whole 10 s.
    let before = json!({"type": "user.define_outcome", "outcome": "before"});
    assert_eq!(y.post_event(&session, before).await.status(), 200);
    assert_eq!(take(&mut live, 1, 10).await[0].data["outcome"], "before");
    nats.kill(consumer_on);
    // Appended through y once the stream has elected another leader (refused until then).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let after = json!({"type": "user.define_outcome", "outcome": "after"});
        let response = y.post_event(&session, after).await;
        match response.status().as_u16() {
            200 => break,
            503 if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(100)).await,
            status => panic!("an append after the kill was refused with {status}: {}", response.text().await.unwrap()),
        }
    }
    let acknowledged = Instant::now();
    let delivered = take(&mut live, 1, 20).await;
    assert_eq!(delivered[0].data["outcome"], "after", "{}", x.log());
    eprintln!("node x's live stream had the append {:?} after its acknowledgement", acknowledged.elapsed());
    let replaced = x.metric("turnlog_jetstream_followers_replaced_total{follower=\"events\"}").await;
    assert!(replaced >= 1.0, "x's consumer was not replaced; it recovered by its client's heartbeats:\n{}", x.log());
}

/// The consumer following the whole events stream (a node's: from a start sequence, on
/// every session's subject) not named in `earlier`, and the server whose JetStream runs it.
async fn follower(js: &async_nats::jetstream::Context, earlier: &BTreeSet<String>) -> (String, usize) {
    use async_nats::jetstream::consumer::DeliverPolicy;
    let stream = js.get_stream("TURNLOG_EVENTS").await.expect("the stream exists");
    let consumers: Vec<_> = stream.consumers().collect::<Vec<_>>().await.into_iter().map(|c| c.unwrap()).collect();
    let follower = consumers
        .into_iter()
        .filter(|c| c.config.filter_subject == "turnlog.events.*" && !earlier.contains(&c.name))
        .find(|c| matches!(c.config.deliver_policy, DeliverPolicy::ByStartSequence { .. }))
        .expect("a node's consumer");
    let server = follower.cluster.and_then(|cluster| cluster.leader).expect("the consumer's server");
    (follower.name, server.strip_prefix('n').and_then(|n| n.parse().ok()).expect("servers are named n0, n1, ..."))
}

/// A node started while its cluster has no quorum (a fresh cluster still electing its
/// leaders, or two of three servers down) waits for it, says so in its log, and starts once
/// the servers are back, on the streams it makes then.
#[tokio::test]
async fn a_node_started_before_its_cluster_is_ready_waits_for_it() {
    let _heavy = crate::helpers::HEAVY.lock().await;
    let mut nats = Nats::cluster().await;
    nats.kill(1);
    nats.kill(2);
    let dir = tempfile::tempdir().unwrap();
    let (config, data) = (dir.path().join("config.toml"), dir.path().join("data"));
    let toml = format!(
        "[store]\nbackend = \"jetstream\"\n[store.jetstream]\nservers = {}\nreplicas = 3\n",
        nats.toml_servers()
    );
    std::fs::write(&config, toml).unwrap();
    let starting = tokio::spawn({
        let (config, data) = (config.clone(), data.clone());
        async move { launch(&config, &data, "127.0.0.1:0").await }
    });
    let log = data.with_extension("log");
    eventually(20, "the node says it waits for JetStream", || async {
        std::fs::read_to_string(&log).unwrap_or_default().contains("JetStream is not ready for this node yet")
    })
    .await;
    nats.restart(1).await;
    nats.restart(2).await;
    let (_child, url) = starting.await.unwrap().unwrap_or_else(|log| panic!("the node did not start: {log}"));
    let client = reqwest::Client::new();
    let created = client.post(format!("{url}/sessions")).json(&json!({"agent": {"name": "default"}})).send().await;
    assert_eq!(created.unwrap().status(), 201, "the node works");
}

/// A stream of the configured name made for other subjects (another application's, or
/// another turnlog's prefix) is refused at start, named, never written to.
#[tokio::test]
async fn a_node_refuses_a_stream_made_for_something_else() {
    let nats = Nats::single().await;
    let client = async_nats::connect(nats.urls()[0].as_str()).await.unwrap();
    let js = async_nats::jetstream::new(client);
    let other = async_nats::jetstream::stream::Config {
        name: "TURNLOG_EVENTS".into(),
        subjects: vec!["orders.>".into()],
        ..Default::default()
    };
    js.create_stream(other).await.unwrap();
    let config = format!("[store]\nbackend = \"jetstream\"\n[store.jetstream]\nservers = {}\n", nats.toml_servers());
    let refused = match try_spawn_with(&config).await {
        Ok(_) => panic!("a node started on a stream made for other subjects"),
        Err(log) => log,
    };
    assert!(refused.contains("TURNLOG_EVENTS") && refused.contains("orders.>"), "{refused}");
    let stream = js.get_stream("TURNLOG_EVENTS").await.unwrap().info().await.unwrap().clone();
    assert_eq!(stream.state.messages, 0, "nothing was written to it");
}

/// The buckets a node decides by (leases, claims, projections) answer reads from their
/// leader only: a direct get may be answered by a replica still catching up after a restart,
/// and a revision-checked write made from what it read fails on every try. Buckets made
/// with direct gets (by an earlier turnlog, or by the client's `create_key_value`) are
/// changed when a node opens them, their entries kept.
#[tokio::test]
async fn the_buckets_a_node_decides_by_are_read_from_their_leader() {
    let nats = Nats::single().await;
    let client = async_nats::connect(nats.urls()[0].as_str()).await.unwrap();
    let js = async_nats::jetstream::new(client);
    // As turnlog made it before, and as the client's `create_key_value` does (which cannot
    // talk to nats-server 2.9 itself).
    let old = async_nats::jetstream::stream::Config {
        name: "KV_turnlog_leases".into(),
        subjects: vec!["$KV.turnlog_leases.>".into()],
        max_messages_per_subject: 1,
        // The lease time to live the node is given below: long enough for `kept` to stay.
        max_age: Duration::from_secs(600),
        allow_rollup: true,
        deny_delete: true,
        allow_direct: true,
        discard: async_nats::jetstream::stream::DiscardPolicy::New,
        ..Default::default()
    };
    js.create_stream(old).await.unwrap();
    let leases = js.get_key_value("turnlog_leases").await.unwrap();
    leases.put("kept", "a value".into()).await.unwrap();
    let direct = |name: &'static str| {
        let js = js.clone();
        async move { js.get_stream(name).await.unwrap().info().await.unwrap().config.allow_direct }
    };
    assert!(direct("KV_turnlog_leases").await, "the client makes buckets with direct gets");
    let config = format!(
        "[store]\nbackend = \"jetstream\"\n[store.jetstream]\nservers = {}\nlease_ttl_secs = 600\n",
        nats.toml_servers()
    );
    let node = spawn_with(&config).await;
    for stream in ["KV_turnlog_leases", "KV_turnlog_claims", "KV_turnlog_projections"] {
        assert!(!direct(stream).await, "{stream} still answers direct gets");
    }
    let leases = js.get_key_value("turnlog_leases").await.unwrap();
    assert_eq!(leases.get("kept").await.unwrap().as_deref(), Some(&b"a value"[..]), "the bucket kept its entries");
    let session = node.create_session().await;
    assert_eq!(node.all_events(&session).await.len(), 1, "the node works on the changed buckets");
}

#[tokio::test]
async fn a_node_says_when_the_engine_is_out_of_reach() {
    // At start: a clear refusal naming the servers, never a fallback to sled.
    let dir = tempfile::tempdir().unwrap();
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let config = dir.path().join("config.toml");
    let servers = format!("[\"nats://127.0.0.1:{closed}\"]");
    std::fs::write(
        &config,
        format!("[store]\nbackend = \"jetstream\"\n[store.jetstream]\nservers = {servers}\nconnect_timeout_ms = 500\n"),
    )
    .unwrap();
    let refused =
        launch(&config, &dir.path().join("data"), "127.0.0.1:0").await.expect_err("no start without the engine");
    assert!(refused.contains(&format!("nats://127.0.0.1:{closed}")), "{refused}");

    // Running: /healthz says so while the node is cut off, and recovers with the server.
    let mut nats = Nats::single().await;
    let config = format!("[store]\nbackend = \"jetstream\"\n[store.jetstream]\nservers = {}\n", nats.toml_servers());
    let node = spawn_with(&config).await;
    let health = || async { node.get("/healthz").send().await.unwrap().status().as_u16() };
    assert_eq!(health().await, 200);
    nats.kill(0);
    eventually(10, "/healthz answers 503 without the engine", || async { health().await == 503 }).await;
    nats.restart(0).await;
    eventually(20, "/healthz answers 200 with the engine back", || async { health().await == 200 }).await;
    let session = node.create_session().await;
    assert_eq!(node.all_events(&session).await.len(), 1, "the node works again");
}

/// A keyed write through one node, that node killed as it ran (its answer cut off), and the
/// same write sent again through another node until it is answered: stored once, and
/// answered with the turn its first copy started; a session made with a key through one
/// node is the same session through another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_write_sent_again_through_another_node_after_the_first_died_is_stored_once() {
    use super::idempotency::keyed;
    let _heavy = crate::helpers::HEAVY.lock().await;
    let mut cluster = Cluster::start().await;
    let make = json!({"agent": {"name": "default"}, "title": "keyed"});
    let (status, made) = keyed(&cluster.nodes[0], "/sessions", "make-1", &make).await;
    assert_eq!(status, 201, "{made}");
    let (status, again) = keyed(&cluster.nodes[1], "/sessions", "make-1", &make).await;
    assert_eq!((status, &again), (201, &made), "the same session through another node");
    let session = made["sessionId"].as_str().unwrap().to_string();

    let path = format!("/sessions/{session}/turns");
    let turn = json!({"stream": "none", "messages": [{"role": "user", "content": "/words 40\n/delay 20"}]});
    let mut on_c = sse(cluster.nodes[2].stream(&session, None, None).await);
    let (url, client, body, first_path) =
        (cluster.nodes[0].url.clone(), cluster.nodes[0].client.clone(), turn.clone(), path.clone());
    let first = tokio::spawn(async move {
        let sent = client.post(format!("{url}{first_path}")).header("Idempotency-Key", "turn-1").json(&body).send();
        sent.await.map(|response| response.status().as_u16())
    });
    until(&mut on_c, "agent.message.delta", 10).await;
    cluster.nodes[0].kill().await;
    assert!(first.await.unwrap().is_err(), "the first copy's answer was cut off with its node");

    // Sent again through node b, as a client does after a dropped connection, until it is
    // answered: b takes the session over once a's lease expires, and finds the write.
    let deadline = Instant::now() + Duration::from_secs(30 + 3 * LEASE_TTL_SECS);
    let answer = loop {
        let (status, answer) = keyed(&cluster.nodes[1], &path, "turn-1", &turn).await;
        match status {
            200 => break answer,
            503 | 504 => assert!(Instant::now() < deadline, "not answered in time: {status} {answer}"),
            _ => panic!("{status} {answer}"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let whole = (1..=40).map(|i| format!("w{i}")).collect::<Vec<_>>().join(" ");
    assert_eq!(answer["messages"].as_array().unwrap().last().unwrap()["content"], whole.as_str(), "{answer}");
    let (status, again) = keyed(&cluster.nodes[2], &path, "turn-1", &turn).await;
    assert_eq!((status, &again), (200, &answer), "and the same answer through a third node");

    let all = read_all(&cluster.nodes[2], &session).await;
    assert_gapless(&all);
    let count = |kind: &str| all.iter().filter(|e| e["type"] == kind).count();
    assert_eq!((count("user.message"), count("turn.started")), (1, 1), "stored once");
    let marked: Vec<&Value> = all.iter().filter(|e| e["request"]["idempotency_key"] == "turn-1").collect();
    assert_eq!(marked.len(), 1, "the write's mark, on its first event");
}

/// A nats-server as it comes (`max_payload` 1 MB, less than one append of the default
/// `server.max_body_bytes` needs): the node starts, says once that it holds request bodies
/// to what one message carries, takes bodies that fit and answers 413 for larger ones; its
/// `/healthz` names the server's version and when an acknowledged append is on disk.
#[tokio::test]
async fn a_node_on_a_stock_nats_server_starts_and_takes_the_bodies_it_can_carry() {
    let nats = Nats::stock().await;
    let config = format!("[store]\nbackend = \"jetstream\"\n[store.jetstream]\nservers = {}\n", nats.toml_servers());
    let node = spawn_with(&config).await;
    let said = node.log();
    assert_eq!(said.matches("request bodies are held to what one message carries").count(), 1, "{said}");
    let (status, health) = get_json(&node, "/healthz").await;
    assert_eq!(status, 200, "{health}");
    assert_eq!(health["durability"], "synced_on_timer", "nats-server 2.9 syncs on its own timer: {health}");
    assert!(health["version"].as_str().is_some_and(|v| v.starts_with("2.")), "{health}");

    let session = node.create_session().await;
    let outcome = |bytes: usize| json!({"events": [{"type": "user.define_outcome", "outcome": "x".repeat(bytes)}]});
    let (status, body) = post_json(&node, &format!("/sessions/{session}/events"), outcome(300_000)).await;
    assert_eq!(status, 200, "a body that fits is stored: {body}");
    let (status, body) = post_json(&node, &format!("/sessions/{session}/events"), outcome(900_000)).await;
    assert_eq!(status, 413, "{body}");
    assert!(body.to_string().contains("limit"), "the answer names the limit: {body}");
    assert_eq!(node.all_events(&session).await.len(), 2, "created, and the body that fit");
}
