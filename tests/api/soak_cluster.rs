//! The soak test over several nodes: three nats-servers in a cluster (streams with three
//! replicas) and three turnlog nodes (the real binary) on one JetStream log, under the mixed
//! load of the single-node soak (`soak.rs`, whose clients and checks this shares), spread
//! over the three nodes at once:
//! - appenders post batches to the same few sessions, each through a node of its own
//!   (they take turns on the nodes from cycle to cycle);
//! - one turn driver per AAP stream mode runs turns through a node chosen at random;
//! - subscribers follow the native streams from a node chosen at random and, every few
//!   events, resume with `Last-Event-ID` on another node chosen at random;
//! - a `turnlog acp --server URL` client prompts its session through a node chosen at
//!   random (the ACP client of the single-node soak, kept);
//! - a deleter makes and deletes sessions through a node chosen at random.
//!
//! Every cycle SIGKILLs one node chosen at random, at a random moment of the load; every
//! other cycle also SIGKILLs one nats-server, by turns: the events stream's leader, the
//! leases bucket's leader, the projections bucket's leader, and a follower of the events
//! stream (never two at once: the streams keep their quorum). A leader's kill once gave a
//! session's log one sequence number twice, which fits nats-server 2.9 checking
//! `Nats-Expected-Last-Subject-Sequence` on the leader alone (nats-server#4320): the log's
//! second fence (docs/cluster.md) is what these cover. The killed node stays down
//! for a random time up to one and a half lease times to live while the load goes on
//! through the others; then the nats-server starts again on its store and the cycle waits
//! for every stream to be whole again (leaders elected, replicas current), the node starts
//! again on its data dir with its config, and the clients still going are stopped.
//!
//! Every append is keyed (`Idempotency-Key`). A batch whose answer the kill cut off, or
//! that was answered 504 (its fate not known), is sent again with its key after the cycle,
//! through any node, until answered: it must then be in its log exactly once. A batch
//! answered 503 must never be in its log. A probe appends (keyed) and reads through the
//! live nodes one request at a time all cycle long, and the longest stretch after the
//! kills with no answered append, and with no answered read, is printed per cycle and per
//! fault at the end: how long a client waited, however the failover went.
//!
//! A client ends at its first connection error to the killed node. After the kill, a
//! survivor may also end a client with what docs/cluster.md's failover describes: a 503, a 409 for
//! an append that raced another node's as sessions changed hands, and (when a nats-server
//! died) a stream cut off. No turn is closed as interrupted: the killed node's are resumed. In the cycle after a
//! nats-server's kill, a 503 is that failover's aftermath (a stream still settling), and
//! the client goes on (counted, at most 20 a cycle). Anything else, or any of these before
//! the kill, fails the test.
//!
//! Then, polled until they hold (a node catches up with the log, and a turn the killed
//! node left running is resumed once its lease has expired) or a deadline passes, the checks
//! of the single-node soak, through every node: every acknowledged event in its log with
//! the bytes it was acknowledged with; sequence numbers 1..n and increasing ids; the hash
//! chain recomputed from the export and verified by the audit route; every subscriber's
//! events a gapless, duplicate-free run of its log after its first cursor; every answered
//! turn in its log; no turn left running (in the log and in the session's status); a
//! deleted session 404 on every node, and never back; every node reading the same logs.
//! After the last cycle every subscriber catches up through a node and holds exactly its
//! log after its first cursor, and every session takes new work through every node.
//!
//! `TURNLOG_CLUSTER_SOAK_CYCLES` (default 8: each fault twice over, once with each of
//! the nats-server kills) kills, each after a random moment within
//! `TURNLOG_CLUSTER_SOAK_MS` (default 400) of load; `TURNLOG_CLUSTER_SOAK_SEED` repeats a
//! run's choices (the scheduling is the machine's). Each cycle prints one line of figures.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::task::JoinHandle;

use super::cluster::{Cluster, LEASE_TTL_SECS};
use super::helpers::{launch, TestApp};
use super::soak::{
    acp, append, check_until, delete_sessions, drive, env_number, finish, subscribe, Acked, AcpProcess, Appended,
    Clients, Cycle, Driver, Keyed, Soak, Subscriber, APPENDERS, APPEND_SESSIONS, MODES,
};

/// How long the checks after a restart may wait for the nodes to agree and for the turns
/// the killed node left running to be closed (its lease expires within a time to live, and
/// every node's reaper looks once per time to live).
const CONVERGE: Duration = Duration::from_secs(30 + 4 * LEASE_TTL_SECS);
/// How long a nats-server started again may take to catch up with every stream.
const CATCH_UP: Duration = Duration::from_secs(60);
/// The nats-server faults, one every other cycle, by turns: what is killed, and the stream
/// whose leader that is (`None`: a follower of the events stream).
const FAULTS: [(&str, Option<&str>); 4] = [
    ("the events stream's leader", Some("TURNLOG_EVENTS")),
    ("the leases bucket's leader", Some("KV_turnlog_leases")),
    ("the projections bucket's leader", Some("KV_turnlog_projections")),
    ("a follower of the events stream", None),
];

/// What one cycle's probe saw.
#[derive(Default)]
struct Probed {
    appends: Answered,
    reads: Answered,
    acked: Vec<Acked>,
    refused: Vec<(String, Vec<String>)>,
    cut: Vec<Keyed>,
}

/// When each of a probe's requests of one kind was answered (successfully), and when the
/// probe stopped.
#[derive(Default)]
struct Answered(Vec<Instant>, Option<Instant>);

impl Answered {
    /// The longest stretch from `from` on with no request answered: between two answers,
    /// from `from` to the first, or from the last to the probe's end.
    fn window(&self, from: Instant) -> Duration {
        let mut last = from;
        let mut longest = Duration::ZERO;
        for at in self.0.iter().chain(&self.1).filter(|at| **at >= from) {
            longest = longest.max(*at - last);
            last = *at;
        }
        longest
    }
}

/// Appends one keyed event to `session`, then reads its last event, through the nodes
/// still up in turn, one request at a time, every 50 ms, until the cycle stops; never
/// ends at a failure (a request waits as long as its node makes it wait).
async fn probe(cycle: Arc<Cycle>, session: String, seed: u64) -> Probed {
    let client = reqwest::Client::new();
    let mut rng = StdRng::seed_from_u64(seed);
    let mut probed = Probed::default();
    for i in 0.. {
        if cycle.is_stopped() {
            break;
        }
        let node = cycle.live_node(&mut rng);
        let url = cycle.urls[node].clone();
        let outcome = format!("probe c{}-{i}", cycle.number);
        let batch = Keyed {
            session: session.clone(),
            key: format!("probe-c{}-{i}", cycle.number),
            body: serde_json::json!({"events": [{"type": "user.define_outcome", "outcome": outcome}]}),
            outcomes: vec![outcome],
        };
        let sent = client
            .post(format!("{url}/sessions/{session}/events"))
            .header("Idempotency-Key", &batch.key)
            .json(&batch.body)
            .send();
        let answer = match cycle.until_stopped(sent).await {
            None => break,
            Some(Ok(response)) => Some((response.status().as_u16(), response.text().await.unwrap_or_default())),
            Some(Err(_)) => None,
        };
        match answer {
            Some((200, body)) => {
                probed.appends.0.push(Instant::now());
                probed.acked.extend(batch.acknowledged(&body));
            }
            Some((503, _)) => probed.refused.push((session.clone(), batch.outcomes.clone())),
            // Cut off, or stored or not, not known: sent again with its key after the cycle.
            None | Some((504, _)) => probed.cut.push(batch),
            Some((409, _)) => {}
            Some((status, body)) => panic!("the probe's append through node {node}: {status} {body}"),
        }
        let read = client.get(format!("{url}/sessions/{session}/events?limit=1&order=desc")).send();
        match cycle.until_stopped(read).await {
            None => break,
            Some(Ok(response)) if response.status() == 200 => probed.reads.0.push(Instant::now()),
            Some(_) => {}
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let stopped = Some(Instant::now());
    (probed.appends.1, probed.reads.1) = (stopped, stopped);
    probed
}

/// Starts a killed node again on its data dir and config, once: a node whose streams are
/// still failing over waits for them as it starts.
async fn restart(node: &mut TestApp) {
    match launch(&node.dir.path().join("config.toml"), &node.data_dir(), "127.0.0.1:0").await {
        Ok((child, url)) => node.restarted(child, url),
        Err(log) => panic!("node did not start again: {log}"),
    }
}

/// The end of each node's log, printed if the test fails (the nodes' dirs go with it); the
/// whole logs are copied to the folder `TURNLOG_TEST_KEEP_LOGS` names, if set.
struct LogsOnFailure(Vec<Arc<tempfile::TempDir>>);

impl Drop for LogsOnFailure {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        let keep = std::env::var_os("TURNLOG_TEST_KEEP_LOGS").map(std::path::PathBuf::from);
        for (n, dir) in self.0.iter().enumerate() {
            if let Some(keep) = &keep {
                let copied = std::fs::create_dir_all(keep)
                    .and_then(|_| std::fs::copy(dir.path().join("data.log"), keep.join(format!("node-{n}.log"))));
                if let Err(error) = copied {
                    eprintln!("node {n}'s log was not kept in {}: {error}", keep.display());
                }
            }
            let log = std::fs::read_to_string(dir.path().join("data.log")).unwrap_or_default();
            let tail: String = log.chars().rev().take(6000).collect::<Vec<_>>().into_iter().rev().collect();
            eprintln!("--- node {n}'s log, its end:\n{tail}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_three_nodes_sigkilled_under_mixed_load() {
    let _heavy = crate::helpers::HEAVY.lock().await;
    let cycles = env_number("TURNLOG_CLUSTER_SOAK_CYCLES", 8) as usize;
    let load_ms = env_number("TURNLOG_CLUSTER_SOAK_MS", 400);
    let seed = env_number("TURNLOG_CLUSTER_SOAK_SEED", rand::random::<u32>() as u64);
    println!("cluster soak: {cycles} cycles, kills within {load_ms} ms of load, TURNLOG_CLUSTER_SOAK_SEED={seed}");
    let mut rng = StdRng::seed_from_u64(seed);
    let started = Instant::now();

    let mut cluster = Cluster::start().await;
    let _logs = LogsOnFailure(cluster.nodes.iter().map(|node| node.dir.clone()).collect());
    let nodes = cluster.nodes.len();
    let dir = tempfile::tempdir().unwrap();
    let cwd = dir.path().to_str().unwrap().to_string();
    let mut soak = Soak::default();
    let probed = cluster.nodes[0].create_session().await;
    soak.append_sessions.push(probed.clone());
    let mut windows: Vec<(&'static str, Duration, Duration)> = Vec::new();
    // Sessions made through every node, each read back through the one it was made on.
    for s in 0..APPEND_SESSIONS + MODES.len() {
        let node = &cluster.nodes[s % nodes];
        let session = node.create_session().await;
        if s < APPEND_SESSIONS {
            let created = node.all_events(&session).await[0]["id"].as_str().unwrap().to_string();
            for (k, start) in [None, Some(created)].into_iter().enumerate() {
                soak.subscribers.push(Subscriber::new(format!("subscriber {s}.{k}"), session.clone(), start));
            }
            soak.append_sessions.push(session);
        } else {
            let mode = MODES[s - APPEND_SESSIONS];
            soak.subscribers.push(Subscriber::new(format!("subscriber {mode}"), session.clone(), None));
            soak.drivers.push(Driver::new(mode, session));
        }
    }

    for number in 0..cycles {
        let urls: Vec<String> = cluster.nodes.iter().map(|node| node.url.clone()).collect();
        let cycle = Cycle::new(number, urls.clone());
        if number % 2 == 0 && number > 0 {
            cycle.after_server_kill();
        }
        let before = (
            soak.subscribers.iter().map(|s| (s.got.len(), s.reconnects)).collect::<Vec<_>>(),
            soak.drivers.iter().map(|d| (d.acked.len(), d.cut)).collect::<Vec<_>>(),
            (soak.acp.acked.len(), soak.deleter.created, soak.deleter.deleted),
        );
        let appenders: Vec<JoinHandle<Appended>> = (0..APPENDERS)
            .map(|w| {
                let rng = StdRng::seed_from_u64(rng.random());
                tokio::spawn(append(cycle.clone(), w, (w + number) % nodes, soak.append_sessions.clone(), rng))
            })
            .collect();
        let subscribers: Vec<JoinHandle<Subscriber>> = std::mem::take(&mut soak.subscribers)
            .into_iter()
            .map(|sub| {
                let node = rng.random_range(0..nodes);
                tokio::spawn(subscribe(cycle.clone(), sub, node, StdRng::seed_from_u64(rng.random())))
            })
            .collect();
        let driver_nodes: Vec<usize> = soak.drivers.iter().map(|_| rng.random_range(0..nodes)).collect();
        let drivers: Vec<JoinHandle<Driver>> = std::mem::take(&mut soak.drivers)
            .into_iter()
            .zip(&driver_nodes)
            .map(|(d, node)| tokio::spawn(drive(cycle.clone(), d, *node)))
            .collect();
        let deleter_node = rng.random_range(0..nodes);
        let deleter = tokio::spawn(delete_sessions(
            cycle.clone(),
            std::mem::take(&mut soak.deleter),
            deleter_node,
            StdRng::seed_from_u64(rng.random()),
        ));
        let acp_node = rng.random_range(0..nodes);
        let (mut acp_child, process) =
            AcpProcess::spawn(&urls[acp_node], &dir.path().join(format!("acp-{number}.log")));
        let acp_client =
            tokio::spawn(acp(cycle.clone(), std::mem::take(&mut soak.acp), process, acp_node, cwd.clone()));

        // The load under way (every client going), then the kills at a random moment.
        let clients = Clients { appenders, subscribers, drivers, deleter, acp: acp_client };
        let probe = tokio::spawn(probe(cycle.clone(), probed.clone(), rng.random()));
        clients.under_way(&cycle).await;
        let victim = rng.random_range(0..nodes);
        // Every other cycle a nats-server too, by turns: a stream's leader, or a follower.
        let server = match number % 2 {
            1 => Some(match FAULTS[(number / 2) % FAULTS.len()] {
                (what, Some(stream)) => (cluster.nats.stream_leader(stream).await, what),
                (what, None) => {
                    let leader = cluster.nats.stream_leader("TURNLOG_EVENTS").await;
                    let followers: Vec<usize> = (0..cluster.nats.servers.len()).filter(|s| *s != leader).collect();
                    (followers[rng.random_range(0..followers.len())], what)
                }
            }),
            _ => None,
        };
        let delay = rng.random_range(0..=load_ms);
        let down_ms = rng.random_range(0..=LEASE_TTL_SECS * 1500);
        if !clients.ended() {
            tokio::time::sleep(Duration::from_millis(delay)).await;
        }
        cycle.kill(victim);
        let killed_at = Instant::now();
        if server.is_some() {
            cycle.kill_server();
        }
        cluster.nodes[victim].kill().await;
        if let Some((server, _)) = server {
            cluster.nats.kill(server);
        }
        if acp_node == victim {
            // It would otherwise keep trying the node.
            acp_child.start_kill().expect("kill turnlog acp");
        }
        // The survivors' load goes on while the node is down; the nats-server comes back
        // first, and the streams are whole again before the node starts (see `restart`).
        tokio::time::sleep(Duration::from_millis(down_ms)).await;
        if let Some((server, _)) = server {
            cluster.nats.restart(server).await;
            let deadline = Instant::now() + CATCH_UP;
            while !cluster.nats.all_current(nodes).await {
                assert!(Instant::now() < deadline, "the nats-server started again has not caught up in {CATCH_UP:?}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        restart(&mut cluster.nodes[victim]).await;
        cycle.stop();
        for (n, node) in cluster.nodes.iter_mut().enumerate() {
            assert!(node.exited().is_none(), "cycle {number}: node {n} exited: {:?}", node.exited());
        }
        let _ = acp_child.start_kill();
        acp_child.wait().await.expect("reap turnlog acp");

        let (appended, requests) = soak.gather(clients).await;
        let probed_cycle = probe.await.expect("the probe");
        let (append_window, read_window) =
            (probed_cycle.appends.window(killed_at), probed_cycle.reads.window(killed_at));
        soak.acked.extend(probed_cycle.acked);
        soak.refused.extend(probed_cycle.refused);
        soak.cut.extend(probed_cycle.cut);
        windows.push((server.map_or("a node only", |(_, what)| what), append_window, read_window));
        // The batches whose answers were cut off, sent again with their keys, through any node.
        let resent = soak.resent;
        let urls: Vec<String> = cluster.nodes.iter().map(|node| node.url.clone()).collect();
        soak.resend(&urls, &mut rng).await;
        let resent = soak.resent - resent;

        let checking = Instant::now();
        let urls: Vec<String> = cluster.nodes.iter().map(|node| node.url.clone()).collect();
        let (checked, waited) = check_until(&urls, &mut soak, CONVERGE, || cluster.logs()).await;
        let checked_in = checking.elapsed();
        let waited = match waited {
            Some(why) => format!(" (waiting first for: {})", why.chars().take(100).collect::<String>()),
            None => String::new(),
        };

        let received: usize = soak.subscribers.iter().zip(&before.0).map(|(s, (got, _))| s.got.len() - got).sum();
        let reconnects: usize = soak.subscribers.iter().zip(&before.0).map(|(s, (_, r))| s.reconnects - r).sum();
        let turns: Vec<String> = soak
            .drivers
            .iter()
            .zip(&before.1)
            .zip(&driver_nodes)
            .map(|((d, (acked, cut)), node)| {
                format!("{} on {node} {}{}", d.mode, d.acked.len() - acked, if d.cut > *cut { "+cut" } else { "" })
            })
            .collect();
        let server = match server {
            Some((server, how)) => format!(" and nats-server {server} ({how})"),
            None => String::new(),
        };
        println!(
            "cycle {:>2}/{cycles}: node {victim}{server} killed {delay} ms into the load, down {down_ms} ms | \
             longest wait for an append {} ms, for a read {} ms | acked {appended} events in {requests} requests, \
             {resent} cut off or answered 504 and sent again with their keys | turns {} | acp prompts {} on {acp_node} | \
             subscribers got {received} events over {reconnects} reconnects | sessions created {} deleted {} on {deleter_node} | \
             clients ended: {} cut by the kill, {} refused by a survivor, {} still going; {} went on after a refusal | \
             then through every node: {} sessions, {} events, {} turns, {} resumes, {} closed after max_resumes, \
             {} closed as interrupted, all held after {} ms{waited}",
            number + 1,
            append_window.as_millis(),
            read_window.as_millis(),
            turns.join(", "),
            soak.acp.acked.len() - before.2 .0,
            soak.deleter.created - before.2 .1,
            soak.deleter.deleted - before.2 .2,
            cycle.ended_cut.load(Ordering::SeqCst),
            cycle.ended_refused.load(Ordering::SeqCst),
            cycle.ended_stopped.load(Ordering::SeqCst),
            cycle.retried.load(Ordering::SeqCst),
            checked.sessions,
            checked.events,
            checked.turns,
            checked.resumed,
            checked.exhausted,
            checked.interrupted,
            checked_in.as_millis(),
        );
        assert_eq!(checked.interrupted, 0, "a turn the killed node left running was closed, not resumed");
    }

    // After the last restart, with no load: every subscriber catches up through a node
    // chosen at random; every session takes new work, through every node.
    let urls: Vec<String> = cluster.nodes.iter().map(|node| node.url.clone()).collect();
    finish(&urls, &mut soak, &cwd, dir.path(), || rng.random_range(0..nodes)).await;

    // The longest waits, per fault.
    for (what, _) in FAULTS.iter().chain(&[("a node only", None)]) {
        let of: Vec<&(&str, Duration, Duration)> = windows.iter().filter(|(w, ..)| w == what).collect();
        if let (Some(append), Some(read)) = (of.iter().map(|w| w.1).max(), of.iter().map(|w| w.2).max()) {
            println!(
                "cluster soak: {what} killed (with a node), {} times: longest wait for an append {} ms, for a read {} ms",
                of.len(),
                append.as_millis(),
                read.as_millis()
            );
        }
    }
    let total_received: usize = soak.subscribers.iter().map(|s| s.got.len()).sum();
    let turns: usize = soak.drivers.iter().map(|d| d.acked.len()).sum();
    assert!(!soak.acked.is_empty() && total_received > 0, "the load ran");
    println!(
        "cluster soak: {cycles} node kills in {:.1} s: {} events acknowledged, {turns} turns and {} acp prompts answered, \
         {total_received} events received by {} subscribers, {} sessions deleted; all checks held",
        started.elapsed().as_secs_f64(),
        soak.acked.len(),
        soak.acp.acked.len(),
        soak.subscribers.len(),
        soak.deleter.deleted,
    );
}
