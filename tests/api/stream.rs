use std::collections::HashSet;
use std::time::Duration;

use futures_util::StreamExt;
use rand::Rng;
use serde_json::{json, Value};

use crate::helpers::{ids, spawn_app, spawn_with, sse, take, texts, TestApp};

#[tokio::test]
async fn the_stream_replays_from_the_start_then_tails() {
    let app = spawn_app().await;
    let session = app.create_session().await;
    app.post_outcomes(&session, &texts("old", 3)).await;
    let mut stream = sse(app.stream(&session, None, None).await);
    let replayed = take(&mut stream, 4, 10).await;
    assert_eq!(replayed[0].event, "session.created");
    for event in &replayed {
        assert_eq!(event.id, event.data["id"].as_str().unwrap(), "the SSE id is the event id");
        assert_eq!(event.event, event.data["type"].as_str().unwrap(), "the SSE event is the type");
    }
    let live = app.post_outcomes(&session, &texts("new", 2)).await;
    let tailed = take(&mut stream, 2, 10).await;
    assert_eq!(tailed.iter().map(|e| e.id.clone()).collect::<Vec<_>>(), ids(&live));
    assert_eq!(tailed[1].data, live[1], "the stream sends exactly the stored event");
}

#[tokio::test]
async fn the_stream_resumes_after_a_cursor_from_the_query_or_the_header_the_later_of_both() {
    let app = spawn_app().await;
    let session = app.create_session().await;
    let stored = ids(&app.post_outcomes(&session, &texts("m", 6)).await);

    let mut by_query = sse(app.stream(&session, Some(&stored[2]), None).await);
    let got: Vec<String> = take(&mut by_query, 3, 10).await.into_iter().map(|e| e.id).collect();
    assert_eq!(got, stored[3..]);

    let mut by_header = sse(app.stream(&session, None, Some(&stored[4])).await);
    assert_eq!(take(&mut by_header, 1, 10).await[0].id, stored[5]);

    // A browser reopening the URL it was given sends the last id it got: the later holds,
    // so a long-lived page does not get again what came after its first cursor.
    let mut reconnected = sse(app.stream(&session, Some(&stored[0]), Some(&stored[4])).await);
    assert_eq!(take(&mut reconnected, 1, 10).await[0].id, stored[5]);
    let mut header_older = sse(app.stream(&session, Some(&stored[4]), Some(&stored[0])).await);
    assert_eq!(take(&mut header_older, 1, 10).await[0].id, stored[5]);

    let mut at_end = sse(app.stream(&session, Some(&stored[5]), None).await);
    let more = ids(&app.post_outcomes(&session, &texts("later", 1)).await);
    assert_eq!(take(&mut at_end, 1, 10).await[0].id, more[0]);
}

#[tokio::test]
async fn a_cursor_that_is_not_in_this_log_is_a_conflict() {
    let app = spawn_app().await;
    let session = app.create_session().await;
    let other = app.create_session().await;
    let foreign = ids(&app.post_outcomes(&other, &texts("x", 1)).await);
    for (query, header) in [
        (Some("evt_01J00000000000000000000000"), None),
        (None, Some("evt_01J00000000000000000000000")),
        (Some(foreign[0].as_str()), None),
        (Some("garbage"), None),
    ] {
        let response = app.stream(&session, query, header).await;
        assert_eq!(response.status(), 409, "{query:?} {header:?}");
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["error"]["code"], "unknown_cursor");
    }
}

#[tokio::test]
async fn many_subscribers_each_get_every_event_once_in_order() {
    let app = spawn_app().await;
    let session = app.create_session().await;
    let mut streams = Vec::new();
    for _ in 0..50 {
        streams.push(sse(app.stream(&session, None, None).await));
    }
    let mut expected = ids(&app.all_events(&session).await);
    for round in 0..10 {
        expected.extend(ids(&app.post_outcomes(&session, &texts(&format!("r{round}"), 20)).await));
    }
    for stream in &mut streams {
        let got: Vec<String> = take(stream, expected.len(), 20).await.into_iter().map(|e| e.id).collect();
        assert_eq!(got, expected);
    }
}

/// Readers that drop the connection at random points while events are appended, and come
/// back with `Last-Event-ID`: what each saw is exactly the log after its first cursor.
#[tokio::test]
async fn reconnects_at_random_points_lose_and_repeat_nothing() {
    let app = spawn_app().await;
    let session = app.create_session().await;
    let first = ids(&app.post_outcomes(&session, &texts("seed", 5)).await);
    const BATCHES: usize = 40;
    const PER_BATCH: usize = 10;
    let total = 1 + 5 + BATCHES * PER_BATCH;

    let mut readers = Vec::new();
    for reader in 0..8 {
        let url = app.url.clone();
        let session = session.clone();
        let start = if reader % 2 == 0 { None } else { Some(first[reader % 5].clone()) };
        readers.push(tokio::spawn(async move { read_with_reconnects(url, session, start, total).await }));
    }
    for batch in 0..BATCHES {
        app.post_outcomes(&session, &texts(&format!("b{batch}"), PER_BATCH)).await;
        if batch % 8 == 0 {
            tokio::task::yield_now().await;
        }
    }
    let log = ids(&app.all_events(&session).await);
    assert_eq!(log.len(), total);
    for reader in readers {
        let (start, got, reconnects) = reader.await.unwrap();
        let from = start.map_or(0, |s| log.iter().position(|id| *id == s).unwrap() + 1);
        assert_eq!(got, log[from..], "a reader from {from} with {reconnects} reconnects");
        assert!(reconnects > 0);
    }
}

async fn read_with_reconnects(
    url: String,
    session: String,
    start: Option<String>,
    total: usize,
) -> (Option<String>, Vec<String>, usize) {
    let client = reqwest::Client::new();
    let mut got: Vec<String> = Vec::new();
    let mut cursor = start.clone();
    let mut reconnects = 0;
    loop {
        let mut request = client.get(format!("{url}/sessions/{session}/events/stream?delta_flush_interval_ms=0"));
        if let Some(cursor) = &cursor {
            request = request.header("Last-Event-ID", cursor.as_str());
        }
        let mut stream = sse(request.send().await.unwrap());
        let quota = rand::rng().random_range(1..60);
        for _ in 0..quota {
            let event = tokio::time::timeout(Duration::from_secs(20), stream.next())
                .await
                .expect("an event within 20 s")
                .expect("the stream stays open");
            cursor = Some(event.id.clone());
            got.push(event.id);
            let last = event.data["sequence_number"].as_u64().unwrap() as usize;
            if last == total {
                return (start, got, reconnects);
            }
        }
        reconnects += 1;
    }
}

/// A commit too large to keep on the live bus (over 64 KiB) goes there as where it ends, and
/// each subscriber reads its events from the log: every one, once, in order, between the
/// small commits around it, which come from the bus.
#[tokio::test]
async fn a_commit_too_large_for_the_bus_reaches_subscribers_from_the_log() {
    let app = spawn_app().await;
    let session = app.create_session().await;
    let mut streams = Vec::new();
    for _ in 0..3 {
        let mut stream = sse(app.stream(&session, None, None).await);
        assert_eq!(take(&mut stream, 1, 10).await[0].event, "session.created");
        streams.push(stream);
    }
    let (replayed, live) = (
        app.metric("turnlog_stream_events_replayed_total").await,
        app.metric("turnlog_stream_events_live_total").await,
    );

    let before = app.post_outcomes(&session, &texts("before", 2)).await;
    let large = app.post_outcomes(&session, &texts(&"x".repeat(3000), 40)).await;
    let after = app.post_outcomes(&session, &texts("after", 2)).await;

    let expected: Vec<String> = [ids(&before), ids(&large), ids(&after)].concat();
    for stream in &mut streams {
        let got = take(stream, expected.len(), 20).await;
        assert_eq!(got.iter().map(|e| e.id.clone()).collect::<Vec<_>>(), expected);
        assert_eq!(got[2].data, large[0], "the stream sends exactly the stored event");
    }
    // The 40 large events came from the log to each of the three, the 4 small ones from the bus.
    let from_log = app.metric("turnlog_stream_events_replayed_total").await - replayed;
    let from_bus = app.metric("turnlog_stream_events_live_total").await - live;
    assert_eq!((from_log, from_bus), (120.0, 12.0));
}

/// A subscriber that stops reading while thousands of events are appended slows neither
/// the writer nor the others; past the backlog limit it is cut off, and it gets the rest
/// by resuming from its last id.
#[tokio::test]
async fn a_subscriber_that_stops_reading_does_not_hold_anyone_back() {
    let app = spawn_with("[streams]\nbus_capacity = 4\nmax_backlog_events = 200\n").await;
    let session = app.create_session().await;
    let mut stalled = sse(app.stream(&session, None, None).await);
    let first = take(&mut stalled, 1, 10).await;
    let mut reader = sse(app.stream(&session, None, None).await);

    let payload = "x".repeat(4000);
    let mut expected = ids(&app.all_events(&session).await);
    for batch in 0..50 {
        let events: Vec<Value> = (0..50)
            .map(|i| json!({"type": "user.define_outcome", "outcome": format!("{batch}-{i}-{payload}")}))
            .collect();
        let response =
            app.post(&format!("/sessions/{session}/events")).json(&json!({"events": events})).send().await.unwrap();
        assert_eq!(response.status(), 200);
        expected.extend(ids(response.json::<Value>().await.unwrap()["data"].as_array().unwrap()));
        let seen = take(&mut reader, if batch == 0 { 51 } else { 50 }, 20).await;
        assert_eq!(seen.last().unwrap().id, *expected.last().unwrap(), "the reading subscriber keeps up");
    }
    assert_eq!(expected.len(), 2501);

    // The stalled subscriber now reads: what it gets is a prefix of the log, in order,
    // ending early because it fell too far behind; resuming by id gives the rest.
    let mut got = vec![first[0].id.clone()];
    while let Ok(Some(event)) = tokio::time::timeout(Duration::from_secs(20), stalled.next()).await {
        got.push(event.id);
    }
    assert!(got.len() < expected.len(), "the stalled stream was cut off");
    assert_eq!(got, expected[..got.len()]);
    assert!(app.metric("turnlog_stream_backlog_disconnects_total").await >= 1.0);
    let mut resumed = sse(app.stream(&session, None, Some(got.last().unwrap())).await);
    let rest: Vec<String> =
        take(&mut resumed, expected.len() - got.len(), 20).await.into_iter().map(|e| e.id).collect();
    got.extend(rest);
    assert_eq!(got, expected);
}

#[tokio::test]
async fn deleting_a_session_ends_its_streams_after_terminated() {
    let app = spawn_app().await;
    let session = app.create_session().await;
    let mut streams = vec![sse(app.stream(&session, None, None).await), sse(app.stream(&session, None, None).await)];
    for stream in &mut streams {
        take(stream, 1, 10).await;
    }
    assert_eq!(app.delete(&format!("/sessions/{session}")).send().await.unwrap().status(), 204);
    for stream in &mut streams {
        let last = take(stream, 2, 10).await;
        assert_eq!(last[0].event, "session.deleted");
        assert_eq!(last[1].event, "terminated");
        let end = tokio::time::timeout(Duration::from_secs(10), stream.next()).await.expect("the stream ends");
        assert!(end.is_none());
    }
    let response = app.post_event(&session, json!({"type": "user.interrupt"})).await;
    assert_eq!(response.status(), 404);
}

#[tokio::test]
async fn quiet_streams_get_ping_comments() {
    let app = spawn_with("[streams]\nheartbeat_ms = 100\n").await;
    let session = app.create_session().await;
    let response = app.stream(&session, None, None).await;
    let mut body = response.bytes_stream();
    let mut text = String::new();
    while !text.contains(": ping\n\n") {
        let chunk = tokio::time::timeout(Duration::from_secs(10), body.next()).await.unwrap().unwrap().unwrap();
        text.push_str(std::str::from_utf8(&chunk).unwrap());
    }
    assert!(text.starts_with("retry: 1000\n\nid: evt_"), "a browser's reconnect wait, events, then pings: {text}");
}

#[tokio::test]
async fn a_retry_ms_of_zero_sends_no_retry() {
    let app = spawn_with("[streams]\nretry_ms = 0\n").await;
    let session = app.create_session().await;
    let mut body = app.stream(&session, None, None).await.bytes_stream();
    let chunk = tokio::time::timeout(Duration::from_secs(10), body.next()).await.unwrap().unwrap().unwrap();
    assert!(chunk.starts_with(b"id: evt_"), "{:?}", String::from_utf8_lossy(&chunk));
}

#[tokio::test]
async fn streams_per_subject_are_limited() {
    let app = spawn_with("[streams]\nmax_streams_per_subject = 2\nheartbeat_ms = 50\n").await;
    let session = app.create_session().await;
    let one = app.stream(&session, None, None).await;
    let two = app.stream(&session, None, None).await;
    let three = app.stream(&session, None, None).await;
    assert_eq!((one.status().as_u16(), two.status().as_u16(), three.status().as_u16()), (200, 200, 429));
    drop(one);
    // The slot frees when the server notices the closed connection, at the next write.
    let mut opened = false;
    for _ in 0..600 {
        let again = app.stream(&session, None, None).await;
        if again.status() == 200 {
            opened = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(opened, "a closed stream gives its slot back");
}

#[tokio::test]
async fn live_ids_increase_and_sequence_numbers_have_no_gaps() {
    let app = spawn_app().await;
    let session = app.create_session().await;
    let mut writers = Vec::new();
    for w in 0..8 {
        let url = app.url.clone();
        let session = session.clone();
        writers.push(tokio::spawn(async move {
            let client = reqwest::Client::new();
            for i in 0..25 {
                let body = json!({"events": [{"type": "user.define_outcome", "outcome": format!("{w}-{i}")}]});
                let response =
                    client.post(format!("{url}/sessions/{session}/events")).json(&body).send().await.unwrap();
                assert_eq!(response.status(), 200);
            }
        }));
    }
    for writer in writers {
        writer.await.unwrap();
    }
    check_log(&app, &session, 201).await;
}

pub async fn check_log(app: &TestApp, session: &str, expected: usize) -> Vec<Value> {
    let all = app.all_events(session).await;
    assert_eq!(all.len(), expected);
    let mut seen = HashSet::new();
    for (i, event) in all.iter().enumerate() {
        assert_eq!(event["sequence_number"], i as u64 + 1);
        assert!(seen.insert(event["id"].as_str().unwrap().to_string()));
        if i > 0 {
            assert!(event["id"].as_str() > all[i - 1]["id"].as_str(), "ids increase in append order");
        }
    }
    all
}
