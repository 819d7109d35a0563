//! Compressed responses (`[server] compress`, `compress_streams`): a client that asks gets
//! pages (and, where allowed, streams) in the coding it prefers, byte for byte what it would
//! get uncompressed; a live event on a compressed stream is not held back; small answers,
//! streams by default, and every answer when compression is off, go as they are.

use std::io::Write;
use std::time::Duration;

use futures_util::StreamExt;

use crate::helpers::{ids, spawn_app, spawn_with, texts, TestApp};

/// Decodes a body (or a stream's bytes so far) as `coding` says.
struct Decoder(Inner);

enum Inner {
    Gzip(flate2::write::GzDecoder<Vec<u8>>),
    Zstd(zstd::stream::write::Decoder<'static, Vec<u8>>),
}

impl Decoder {
    fn new(coding: &str) -> Decoder {
        Decoder(match coding {
            "gzip" => Inner::Gzip(flate2::write::GzDecoder::new(Vec::new())),
            "zstd" => Inner::Zstd(zstd::stream::write::Decoder::new(Vec::new()).unwrap()),
            other => panic!("no decoder for {other:?}"),
        })
    }

    /// Takes more compressed bytes; returns all the text decoded so far.
    fn feed(&mut self, bytes: &[u8]) -> String {
        let decoded = match &mut self.0 {
            Inner::Gzip(d) => {
                d.write_all(bytes).unwrap();
                d.flush().unwrap();
                d.get_ref()
            }
            Inner::Zstd(d) => {
                d.write_all(bytes).unwrap();
                d.flush().unwrap();
                d.get_ref()
            }
        };
        String::from_utf8(decoded.clone()).expect("UTF-8")
    }
}

async fn get(app: &TestApp, path: &str, accept: Option<&str>) -> reqwest::Response {
    let mut request = app.get(path);
    if let Some(accept) = accept {
        request = request.header("accept-encoding", accept);
    }
    let response = request.send().await.unwrap();
    assert_eq!(response.status(), 200, "GET {path}");
    response
}

fn coding(response: &reqwest::Response) -> Option<String> {
    response.headers().get("content-encoding").map(|v| v.to_str().unwrap().to_string())
}

#[tokio::test]
async fn a_page_comes_in_the_coding_the_client_prefers_and_decodes_to_the_same_bytes() {
    let app = spawn_app().await;
    let session = app.create_session().await;
    app.post_outcomes(&session, &texts("a fairly ordinary outcome", 200)).await;
    let page = format!("/sessions/{session}/events?limit=1000");
    let plain = get(&app, &page, None).await;
    assert_eq!(coding(&plain), None);
    let plain = plain.bytes().await.unwrap();
    assert!(plain.len() > 40_000, "a page of 201 events: {} bytes", plain.len());

    for (accept, expected) in [
        ("zstd", "zstd"),
        ("gzip", "gzip"),
        ("gzip, deflate, br, zstd", "zstd"),
        ("gzip, deflate", "gzip"),
        ("zstd;q=0.5, gzip", "gzip"),
    ] {
        let response = get(&app, &page, Some(accept)).await;
        assert_eq!(coding(&response).as_deref(), Some(expected), "Accept-Encoding: {accept}");
        assert!(
            response.headers().get_all("vary").iter().any(|v| v.to_str().unwrap().contains("accept-encoding")),
            "Vary names Accept-Encoding: {:?}",
            response.headers()
        );
        let compressed = response.bytes().await.unwrap();
        assert!(compressed.len() * 5 < plain.len(), "{expected}: {} of {} bytes", compressed.len(), plain.len());
        assert_eq!(Decoder::new(expected).feed(&compressed).as_bytes(), &plain[..], "{expected} decodes to the page");
    }

    // Codings turnlog does not make, and a refusal of all: the page as it is.
    for accept in ["br", "identity", "zstd;q=0, gzip;q=0"] {
        let response = get(&app, &page, Some(accept)).await;
        assert_eq!(coding(&response), None, "Accept-Encoding: {accept}");
        assert_eq!(response.bytes().await.unwrap(), plain, "Accept-Encoding: {accept}");
    }

    // Streams are not compressed unless `compress_streams` says so.
    let stream = get(&app, &format!("/sessions/{session}/events/stream"), Some("gzip, zstd")).await;
    assert_eq!(coding(&stream), None, "a stream by default");

    // An append's small answer is not worth compressing.
    let response = app
        .post(&format!("/sessions/{session}/events"))
        .header("accept-encoding", "gzip, zstd")
        .json(&serde_json::json!({"events": [{"type": "user.define_outcome", "outcome": "small"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(coding(&response), None, "a {:?}-byte answer", response.content_length());
}

#[tokio::test]
async fn a_compressed_stream_sends_each_live_event_at_once() {
    for accept in ["gzip", "zstd"] {
        let app = spawn_with("[server]\ncompress_streams = [\"gzip\", \"zstd\"]\n").await;
        let session = app.create_session().await;
        let old = ids(&app.post_outcomes(&session, &texts("before", 20)).await);
        let response = get(&app, &format!("/sessions/{session}/events/stream"), Some(accept)).await;
        assert_eq!(coding(&response).as_deref(), Some(accept));
        let mut chunks = response.bytes_stream();
        let mut decoder = Decoder::new(accept);
        let mut text = String::new();
        // Waits (at most 10 s: a frame held in the encoder never comes) for `id` in the stream.
        let mut until_seen = async |id: &str, text: &mut String| {
            let wait = async {
                while !text.contains(&format!("id: {id}\n")) {
                    let chunk = chunks.next().await.expect("the stream stays open").unwrap();
                    *text = decoder.feed(&chunk);
                }
            };
            tokio::time::timeout(Duration::from_secs(10), wait)
                .await
                .unwrap_or_else(|_| panic!("{accept}: {id} did not arrive; the stream so far: {text}"));
        };
        until_seen(old.last().unwrap(), &mut text).await;
        // Each live event alone, while the stream stays open: only a flush lets it through.
        // (A frame over 1 KiB is compressed on actix's blocking pool, a smaller one in place.)
        for i in 0..4 {
            let outcome =
                if i % 2 == 0 { format!("live {i}") } else { format!("live {i} {}", "and more ".repeat(200)) };
            let live = ids(&app.post_outcomes(&session, &[outcome]).await);
            until_seen(&live[0], &mut text).await;
        }
        assert!(text.starts_with("retry: "), "{accept}: the stream as sent: {}", &text[..80]);
    }
}

#[tokio::test]
async fn with_compression_off_nothing_is_compressed() {
    let app = spawn_with("[server]\ncompress = []\n").await;
    let session = app.create_session().await;
    app.post_outcomes(&session, &texts("outcome", 100)).await;
    let response = get(&app, &format!("/sessions/{session}/events?limit=1000"), Some("gzip, zstd")).await;
    assert_eq!(coding(&response), None);
    assert!(response.headers().get("vary").is_none(), "{:?}", response.headers());
    let response = get(&app, &format!("/sessions/{session}/events/stream"), Some("gzip, zstd")).await;
    assert_eq!(coding(&response), None);
}

#[tokio::test]
async fn a_coding_turnlog_does_not_know_is_refused_at_start() {
    let refused = crate::helpers::try_spawn_with("[server]\ncompress = [\"brotli\"]\n").await.err().expect("refused");
    assert!(refused.contains("brotli") && refused.contains("compress"), "{refused}");
}
