//! Each HTTP connection's record, for the clients that hold a connection without using it:
//! one that never sends a whole request head (actix answers 408 and closes it; counted here
//! when it goes), and one that stops reading a streamed answer (cut off here).
//!
//! A client that stops reading a stream would hold its connection and its stream slot for
//! ever: once actix's write buffer is full it stops polling the body, so nothing of ours
//! runs again. [`Watched`] notes when the body handed out bytes that actix has not come
//! back for since, and a watchdog cuts the socket once that has lasted
//! `streams.stall_timeout_ms`: with a reset, not a FIN that would queue behind the unread
//! data. Memory stays bounded before that (actix buffers at most its write buffer, the
//! kernel its socket buffers; a stream behind the live bus re-reads the store), so the cut
//! is about what the offender holds, not what it costs.
//!
//! To cut a socket that actix holds, the server hands actix a [`Socket`]: the connection's
//! one descriptor, shared with its record, which can shut it down. A duplicated descriptor
//! would do the same at the cost of a second open file a connection.

use std::cell::Cell;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::rc::{Rc, Weak};
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant};

use actix_web::body::{BodySize, BoxBody, MessageBody};
use actix_web::dev::Extensions;
use actix_web::rt::net::TcpStream;
use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::oneshot;

use crate::metrics;

/// How often actix moves the clock it counts timeouts from.
const ACTIX_CLOCK_STEP: Duration = Duration::from_millis(500);

/// What turnlog keeps of a connection while it is open.
pub struct Conn {
    opened: Instant,
    /// The connection's socket, to cut it off while actix holds it.
    socket: Weak<TcpStream>,
    /// Requests whose head arrived whole.
    requests: Cell<u64>,
    head_timeout: Duration,
}

/// For the HTTP service's `on_connect_ext`: records the connection.
pub fn on_connect(socket: &Socket, data: &mut Extensions, head_timeout: Duration) {
    // Small SSE frames must not wait for the peer's delayed ACK (about 40 ms a frame).
    let _ = socket.0.set_nodelay(true);
    metrics::CONNECTIONS_OPEN.inc();
    let socket = Rc::downgrade(&socket.0);
    data.insert(Conn { opened: Instant::now(), socket, requests: Cell::new(0), head_timeout });
}

/// An accepted connection as actix reads and writes it: the TCP stream, shared with the
/// connection's [`Conn`] so that a stalled stream can be cut off. Dropped by actix when the
/// connection ends, which closes the socket.
pub struct Socket(Rc<TcpStream>);

impl Socket {
    pub fn new(tcp: TcpStream) -> Socket {
        Socket(Rc::new(tcp))
    }
}

/// `TcpStream`'s own reads and writes need `&mut`; these are its `&self` forms, as tokio
/// documents them: wait until ready, try, and wait again if the readiness was stale.
impl AsyncRead for Socket {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        loop {
            ready!(self.0.poll_read_ready(cx))?;
            match self.0.try_read_buf(buf) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                done => return Poll::Ready(done.map(drop)),
            }
        }
    }
}

impl AsyncWrite for Socket {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        loop {
            ready!(self.0.poll_write_ready(cx))?;
            match self.0.try_write(buf) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                done => return Poll::Ready(done),
            }
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        loop {
            ready!(self.0.poll_write_ready(cx))?;
            match self.0.try_write_vectored(bufs) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                done => return Poll::Ready(done),
            }
        }
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(rustix::net::shutdown(&*self.0, rustix::net::Shutdown::Write).map_err(io::Error::from))
    }
}

impl Conn {
    /// A request's head arrived whole.
    pub fn requested(&self) {
        self.requests.set(self.requests.get() + 1);
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        metrics::CONNECTIONS_OPEN.dec();
        // Open as long as the head timeout with no request: actix cut it off (or would
        // have, had the client not gone just then). actix counts from a clock it moves on
        // every 500 ms, so its cut may come up to that much early.
        let cut_after = self.head_timeout.saturating_sub(ACTIX_CLOCK_STEP);
        if self.requests.get() == 0 && self.opened.elapsed() >= cut_after {
            metrics::CLIENTS_CUT_OFF.with_label_values(&["request_timeout"]).inc();
            tracing::info!(
                "cut off a connection that sent no whole request head within {} ms (server.request_head_timeout_ms)",
                self.head_timeout.as_millis()
            );
        }
    }
}

/// A streamed response body, watched for a client that stops taking it.
pub struct Watched {
    body: BoxBody,
    watch: Rc<Watch>,
    /// Dropped with the body: the watchdog lets the socket go at once.
    _done: oneshot::Sender<()>,
}

struct Watch {
    /// Since when the body has had bytes taken from it that actix has not come back after.
    waiting: Cell<Option<Instant>>,
}

impl Watched {
    /// Watches `body` if it is a stream on a connection that can be cut off; else gives it
    /// back. `route` names it in the log.
    pub fn new<B: MessageBody + 'static>(
        body: B,
        conn: Option<&Conn>,
        stall: Duration,
        route: impl FnOnce() -> String,
    ) -> Result<Watched, B> {
        match conn.map(|conn| conn.socket.clone()) {
            Some(socket) if body.size() == BodySize::Stream => {
                let watch = Rc::new(Watch { waiting: Cell::new(None) });
                let (done, dropped) = oneshot::channel();
                actix_web::rt::spawn(watchdog(Rc::downgrade(&watch), dropped, socket, stall, route()));
                Ok(Watched { body: body.boxed(), watch, _done: done })
            }
            _ => Err(body),
        }
    }
}

/// Cuts the socket off once the body has waited `stall` for actix to come back; ends when
/// the body is dropped.
async fn watchdog(
    watch: Weak<Watch>,
    mut dropped: oneshot::Receiver<()>,
    socket: Weak<TcpStream>,
    stall: Duration,
    route: String,
) {
    let tick = (stall / 4).max(Duration::from_millis(10));
    loop {
        tokio::select! {
            _ = &mut dropped => return,
            _ = tokio::time::sleep(tick) => {}
        }
        let Some(watch) = watch.upgrade() else { return };
        if watch.waiting.get().is_some_and(|since| since.elapsed() >= stall) {
            // Gone already: actix closed the connection.
            let Some(socket) = socket.upgrade() else { return };
            metrics::CLIENTS_CUT_OFF.with_label_values(&["stalled_stream"]).inc();
            tracing::warn!(
                %route,
                "cut off a client that took none of its stream for {} ms (streams.stall_timeout_ms)",
                stall.as_millis()
            );
            // A reset: the unread data is dropped, and actix's next write fails.
            let _ = rustix::net::sockopt::set_socket_linger(&*socket, Some(Duration::ZERO));
            let _ = rustix::net::shutdown(&*socket, rustix::net::Shutdown::Both);
            return;
        }
    }
}

impl MessageBody for Watched {
    type Error = Box<dyn std::error::Error>;

    fn size(&self) -> BodySize {
        self.body.size()
    }

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Bytes, Self::Error>>> {
        let next = Pin::new(&mut self.body).poll_next(cx);
        // Bytes handed out: actix comes back at once unless its client is not reading.
        self.watch.waiting.set(matches!(next, Poll::Ready(Some(Ok(_)))).then(Instant::now));
        next
    }
}
