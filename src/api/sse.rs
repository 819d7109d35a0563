//! Server-sent events: framing, and the driver that turns a [`Follower`] into a response
//! body with heartbeats, delta merging, and a clean end at `terminated` or shutdown (after
//! sending what is already published).

use std::convert::Infallible;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use futures_util::{FutureExt, Stream};
use tokio_util::sync::CancellationToken;

use super::state::StreamGuard;
use crate::domain::RawEvent;
use crate::session::{Coalescer, Follower};

pub const PING: &[u8] = b": ping\n\n";

/// The `retry:` field that tells a browser how long to wait before it reconnects, then
/// `then`; `None` if there is neither (a `retry_ms` of 0 sends none).
pub fn retry(ms: u64, then: &[u8]) -> Option<Bytes> {
    let mut out = BytesMut::new();
    if ms > 0 {
        out.put_slice(format!("retry: {ms}\n\n").as_bytes());
    }
    out.put_slice(then);
    (!out.is_empty()).then(|| out.freeze())
}

/// The head of every SSE answer: `text/event-stream` (the harness SDK insists on it, and
/// no client's `Accept` is asked), never cached, and not buffered by a proxy on the way.
pub fn response() -> actix_web::HttpResponseBuilder {
    let mut response = actix_web::HttpResponse::Ok();
    response
        .content_type("text/event-stream")
        .insert_header(("cache-control", "no-cache"))
        .insert_header(("x-accel-buffering", "no"));
    response
}

/// At shutdown a stream sends at most this many batches that are ready at once, then ends.
const SHUTDOWN_DRAIN_BATCHES: usize = 16;

/// Writes one frame. `data` must be one line (compact JSON always is).
pub fn frame(out: &mut BytesMut, id: Option<&str>, event: &str, data: &[u8]) {
    out.reserve(data.len() + event.len() + 48);
    if let Some(id) = id {
        out.put_slice(b"id: ");
        out.put_slice(id.as_bytes());
        out.put_u8(b'\n');
    }
    out.put_slice(b"event: ");
    out.put_slice(event.as_bytes());
    out.put_slice(b"\ndata: ");
    out.put_slice(data);
    out.put_slice(b"\n\n");
}

/// The native frame: the event id, its type, and the stored JSON as it is.
pub fn native_frame(out: &mut BytesMut, event: &RawEvent) -> Flow {
    frame(out, Some(event.id.text().as_str()), event.kind(), &event.json);
    Flow::Continue
}

/// Whether a stream goes on after an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    Continue,
    End,
}

pub struct Follow {
    /// Sent before anything else (e.g. [`retry`], AAP's `turn_start`).
    pub preamble: Option<Bytes>,
    pub follower: Follower,
    pub heartbeat: Duration,
    pub merge_window: Option<Duration>,
    pub shutdown: CancellationToken,
    pub guard: StreamGuard,
}

/// The body of a stream that follows a log, rendering events with `render`.
pub fn follow<R>(follow: Follow, mut render: R) -> impl Stream<Item = Result<Bytes, Infallible>>
where
    R: FnMut(&mut BytesMut, &RawEvent) -> Flow + 'static,
{
    let Follow { preamble, mut follower, heartbeat, merge_window, shutdown, guard } = follow;
    async_stream::stream! {
        let _guard = guard;
        if let Some(preamble) = preamble {
            yield Ok(preamble);
        }
        let mut coalescer = Coalescer::new(merge_window);
        let start = tokio::time::Instant::now() + heartbeat;
        let mut ping = tokio::time::interval_at(start, heartbeat);
        loop {
            let mut out = BytesMut::new();
            let deadline = coalescer.deadline();
            let more = tokio::select! {
                biased;
                _ = shutdown.cancelled() => {
                    // What is already published goes out first: a turn the shutdown stopped
                    // has recorded its end by now, and the stream's client should see it.
                    for _ in 0..SHUTDOWN_DRAIN_BATCHES {
                        let Some(Ok(Some(events))) = follower.next().now_or_never() else { break };
                        let ready = coalescer.push(events, tokio::time::Instant::now());
                        if !ready.iter().all(|event| render(&mut out, event) == Flow::Continue) {
                            break;
                        }
                    }
                    false
                }
                next = follower.next() => match next {
                    Ok(Some(events)) => coalescer
                        .push(events, tokio::time::Instant::now())
                        .iter()
                        .all(|event| render(&mut out, event) == Flow::Continue),
                    Ok(None) => false,
                    Err(error) => {
                        tracing::info!(%error, "closing a stream");
                        false
                    }
                },
                _ = sleep_until(deadline), if deadline.is_some() => {
                    coalescer.flush().is_none_or(|event| render(&mut out, &event) == Flow::Continue)
                }
                _ = ping.tick() => {
                    out.put_slice(PING);
                    true
                }
            };
            if !more {
                if let Some(event) = coalescer.flush() {
                    let _ = render(&mut out, &event);
                }
            }
            if !out.is_empty() {
                yield Ok(out.freeze());
            }
            if !more {
                break;
            }
        }
    }
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    if let Some(deadline) = deadline {
        tokio::time::sleep_until(deadline).await;
    }
}
