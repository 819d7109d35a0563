//! Slow and hostile clients on the real binary: a subscriber that never reads, one that reads
//! a byte a second, two thousand connections that never finish a request head, oversized
//! heads, and a body that never finishes. Each offender is cut off with its reason in the
//! log and the metrics; the server's memory stays bounded (its RSS is printed); the writer
//! and a well-behaved subscriber get everything meanwhile.

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

use crate::helpers::{spawn_with, sse, take, TestApp};

/// Every cut-off comes quickly here; the defaults are 5 s, 30 s and 30 s.
const CONFIG: &str = "[server]\nrequest_head_timeout_ms = 1000\nbody_timeout_ms = 1000\n\
    [streams]\nstall_timeout_ms = 1000\nheartbeat_ms = 200\n[store]\ncache_capacity_mb = 8\n";

/// The server's resident memory, in KiB.
fn rss_kib(app: &TestApp) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", app.pid())).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).expect("VmRSS");
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// A connection to the server with a small receive buffer, so that one that stops reading
/// backs up quickly.
async fn connect(app: &TestApp) -> TcpStream {
    let addr = app.url.trim_start_matches("http://").parse().unwrap();
    let socket = TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    socket.connect(addr).await.unwrap()
}

/// Waits until the metric reaches `at_least`, or fails after `secs`.
async fn metric_reaches(app: &TestApp, name: &str, at_least: f64, secs: u64) -> f64 {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let value = app.metric(name).await;
        if value >= at_least {
            return value;
        }
        assert!(Instant::now() < deadline, "{name} is {value} after {secs} s, not {at_least}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until the metric is `value`, or fails after `secs`.
async fn metric_settles(app: &TestApp, name: &str, value: f64, secs: u64) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let now = app.metric(name).await;
        if now == value {
            return;
        }
        assert!(Instant::now() < deadline, "{name} is {now} after {secs} s, not {value}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Reads what the server sends until it closes or resets the connection; fails after `secs`.
async fn read_to_close(stream: &mut TcpStream, secs: u64) -> Vec<u8> {
    let mut all = Vec::new();
    let mut buf = vec![0u8; 64 << 10];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Err(_) => panic!("the server did not close the connection within {secs} s"),
            Ok(Ok(0)) | Ok(Err(_)) => return all,
            Ok(Ok(n)) => all.extend_from_slice(&buf[..n]),
        }
    }
}

#[tokio::test]
async fn subscribers_that_stop_reading_are_cut_off_and_slow_no_one() {
    let app = spawn_with(CONFIG).await;
    let session = app.create_session().await;
    let stream = format!("GET /sessions/{session}/events/stream HTTP/1.1\r\nHost: turnlog\r\n\r\n");

    // One that never reads, one that reads a byte a second, one that reads everything.
    let mut never = connect(&app).await;
    never.write_all(stream.as_bytes()).await.unwrap();
    let mut trickle = connect(&app).await;
    trickle.write_all(stream.as_bytes()).await.unwrap();
    // It reads a byte a second until told to read what its socket still holds, to the end.
    let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
    let trickled = tokio::spawn(async move {
        let mut byte = [0u8; 1];
        let mut read = 0usize;
        loop {
            tokio::select! {
                _ = &mut stopped => return (read, read_to_close(&mut trickle, 30).await),
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
            match trickle.read(&mut byte).await {
                Ok(0) | Err(_) => return (read, Vec::new()),
                Ok(_) => read += 1,
            }
        }
    });
    let burst = append_burst(&app, &session).await;

    // Both offenders are cut off, for that reason, in the metrics and the log.
    metric_reaches(&app, "turnlog_clients_cut_off_total{reason=\"stalled_stream\"}", 2.0, 30).await;
    let read = read_to_close(&mut never, 30).await;
    assert!(read.starts_with(b"HTTP/1.1 200"), "{:?}", String::from_utf8_lossy(&read[..read.len().min(200)]));
    stop.send(()).unwrap();
    let (trickled, rest) = trickled.await.unwrap();
    assert!(trickled > 0 && trickled + rest.len() < 1 << 20, "the trickler read {trickled} + {} bytes", rest.len());
    let cuts = app.log().matches("cut off a client that took none of its stream").count();
    assert_eq!(cuts, 2, "{}", app.log());
    metric_settles(&app, "turnlog_streams_open", 1.0, 5).await;

    // Memory stayed bounded: the same burst on a server with only the healthy subscriber
    // grows it by as much as the log's own buffers and the allocator's slack take; the
    // offenders may add at most what a session's live bus can hold (256 commits of at most
    // 64 KiB; these commits are larger, so it holds only where each ends), far from the
    // 80 MB they left unread.
    let quiet = spawn_with(CONFIG).await;
    let quiet_session = quiet.create_session().await;
    let baseline = append_burst(&quiet, &quiet_session).await;
    println!(
        "hostile subscribers: {BURST_EVENTS} events appended in {:?} (slowest request {:?}); server RSS {} KiB before, peak +{} KiB; \
         with no offenders: {:?}, slowest {:?}, peak +{} KiB; the trickler read {trickled} bytes",
        burst.took, burst.slowest, burst.before, burst.grown, baseline.took, baseline.slowest, baseline.grown
    );
    let extra = burst.grown.saturating_sub(baseline.grown);
    assert!(extra < 16 << 10, "the two subscribers that did not read cost the server {extra} KiB more than none");
}

const BURST_EVENTS: usize = 20_000;

/// What appending a burst cost the server, while one subscriber took every event.
struct Burst {
    took: Duration,
    slowest: Duration,
    /// RSS before the burst, and its peak growth during it (KiB).
    before: u64,
    grown: u64,
}

/// Appends 20,000 events of about 2 KB (40 MB: far more than any buffer) in 200 requests
/// while a subscriber reads them all, and checks that it got every one, in order.
async fn append_burst(app: &TestApp, session: &str) -> Burst {
    let mut healthy = sse(app.stream(session, None, None).await);
    let before = rss_kib(app);
    let (batches, per_batch) = (200, BURST_EVENTS / 200);
    let pad = "x".repeat(2000);
    let started = Instant::now();
    let mut slowest = Duration::ZERO;
    let mut peak = before;
    // The stream starts with `session.created`.
    let reader = tokio::spawn(async move { take(&mut healthy, 1 + BURST_EVENTS, 120).await });
    for b in 0..batches {
        let events: Vec<Value> = (0..per_batch)
            .map(|i| json!({"type": "user.define_outcome", "outcome": {"n": b * per_batch + i, "pad": pad}}))
            .collect();
        let sent = Instant::now();
        let response =
            app.post(&format!("/sessions/{session}/events")).json(&json!({"events": events})).send().await.unwrap();
        assert_eq!(response.status(), 200);
        slowest = slowest.max(sent.elapsed());
        peak = peak.max(rss_kib(app));
    }
    let took = started.elapsed();
    let got = reader.await.unwrap();
    assert_eq!(got.len(), 1 + BURST_EVENTS);
    for (i, event) in got[1..].iter().enumerate() {
        assert_eq!(event.data["outcome"]["n"], i, "event {i} out of order");
    }
    Burst { took, slowest, before, grown: peak.saturating_sub(before) }
}

/// The server's open file descriptors.
fn open_fds(app: &TestApp) -> usize {
    std::fs::read_dir(format!("/proc/{}/fd", app.pid())).unwrap().count()
}

/// A connection costs the server one descriptor, also while a stream on it is watched for a
/// stalled client: the open-file limit is what caps how many subscribers a node can hold.
#[tokio::test]
async fn an_idle_subscriber_holds_one_descriptor() {
    let app = spawn_with(CONFIG).await;
    let session = app.create_session().await;
    let request = format!("GET /sessions/{session}/events/stream HTTP/1.1\r\nHost: turnlog\r\n\r\n");
    let before = open_fds(&app);
    let subscribers = 300;
    let mut held = Vec::new();
    for _ in 0..subscribers {
        let mut stream = connect(&app).await;
        stream.write_all(request.as_bytes()).await.unwrap();
        held.push(stream);
    }
    // Each has its answer's head: the stream is open, and watched.
    for stream in &mut held {
        let mut head = [0u8; 12];
        stream.read_exact(&mut head).await.unwrap();
        assert_eq!(&head, b"HTTP/1.1 200");
    }
    let during = open_fds(&app);
    println!("{subscribers} subscribers: the server's descriptors went from {before} to {during}");
    let added = during - before;
    assert!(added >= subscribers, "{added} descriptors for {subscribers} connections: not counted right");
    assert!(added < subscribers + 20, "{added} descriptors for {subscribers} connections");
}

#[tokio::test]
async fn connections_that_never_finish_a_request_head_are_cut_off() {
    let app = spawn_with(CONFIG).await;
    let before = rss_kib(&app);
    // 2,000 connections: half send nothing, half the start of a head and no more.
    let mut idle = Vec::new();
    for i in 0..2000 {
        let mut stream = connect(&app).await;
        if i % 2 == 1 {
            stream.write_all(b"GET /sessions HTTP/1.1\r\nHost: turnlog\r\nX-Slow: ").await.unwrap();
        }
        idle.push(stream);
    }
    let held = rss_kib(&app);

    // Meanwhile the server answers everyone else.
    let session = app.create_session().await;
    let stored = app.post_outcomes(&session, &["while 2,000 connections idle".to_string()]).await;
    assert_eq!(stored.len(), 1);

    // Each is answered 408 (or closed) and let go.
    let mut answered = 0;
    for stream in &mut idle {
        let read = read_to_close(stream, 30).await;
        answered += usize::from(read.starts_with(b"HTTP/1.1 408"));
    }
    let cut = metric_reaches(&app, "turnlog_clients_cut_off_total{reason=\"request_timeout\"}", 2000.0, 30).await;
    println!(
        "half-open connections: server RSS {before} KiB before, {held} KiB with 2,000 open (+{} KiB); {answered} answered 408, {cut} counted cut off",
        held.saturating_sub(before)
    );
    assert!(answered >= 1000, "only {answered} of 2,000 were answered 408");
    assert!(held.saturating_sub(before) < 64 << 10, "2,000 idle connections took {} KiB", held - before);
    // The one left open is the metrics request's own.
    metric_settles(&app, "turnlog_http_connections_open", 1.0, 10).await;

    // Oversized heads: one huge header, and too many headers.
    for head in [
        format!("GET /sessions HTTP/1.1\r\nHost: turnlog\r\nX-Big: {}\r\n\r\n", "a".repeat(200 << 10)),
        format!(
            "GET /sessions HTTP/1.1\r\nHost: turnlog\r\n{}\r\n",
            (0..200).map(|i| format!("X-H{i}: v\r\n")).collect::<String>()
        ),
    ] {
        let mut stream = connect(&app).await;
        let _ = stream.write_all(head.as_bytes()).await;
        let read = read_to_close(&mut stream, 10).await;
        assert!(read.starts_with(b"HTTP/1.1 431"), "{:?}", String::from_utf8_lossy(&read));
    }
    assert_eq!(app.all_events(&session).await.len(), 2, "session.created and the one appended");
}

#[tokio::test]
async fn a_body_that_never_finishes_is_answered_408_in_the_views_shape_and_stores_nothing() {
    let app = spawn_with(CONFIG).await;
    let session = app.create_session().await;
    let before = app.all_events(&session).await;
    let body = json!({"events": [{"type": "user.message", "content": [{"type": "text", "text": "hi"}]}]}).to_string();
    for (path, shape) in [
        (format!("/sessions/{session}/events"), "/error/code"),
        (format!("/v1/sessions/{session}/events"), "/error/type"),
    ] {
        let mut stream = connect(&app).await;
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: turnlog\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            body.len() + 100
        );
        stream.write_all(head.as_bytes()).await.unwrap();
        stream.write_all(body.as_bytes()).await.unwrap();
        let read = String::from_utf8(read_to_close(&mut stream, 10).await).unwrap();
        assert!(read.starts_with("HTTP/1.1 408"), "{read}");
        let json: Value = serde_json::from_str(read.split_once("\r\n\r\n").unwrap().1).unwrap();
        let expected = if shape == "/error/code" { "request_timeout" } else { "timeout_error" };
        assert_eq!(json.pointer(shape), Some(&json!(expected)), "{json}");
    }
    assert_eq!(app.metric("turnlog_clients_cut_off_total{reason=\"body_timeout\"}").await, 2.0);
    assert!(app.log().contains("cut off a request whose body did not arrive"), "{}", app.log());
    assert_eq!(app.all_events(&session).await, before, "nothing was stored");
}
