//! Following the stream: the node's one ordered consumer of the whole stream, which hands
//! every message to the sessions loaded here; its replacement when it has gone quiet
//! ([`super::quiet`], shared with the projections' watch); and the turns seen open.

use std::sync::atomic::Ordering;

use async_nats::jetstream::{self, consumer, stream};
use async_nats::HeaderMap;
use bytes::Bytes;
use futures_util::StreamExt;

use super::quiet::{quiet_ticks, Quiet, FETCH_ROUND, QUIET_WAIT};
use super::{store_error, wire, Hashed, JetStreamLog, HEARD};
use crate::metrics;
use crate::store::StoreError;

impl JetStreamLog {
    /// The messages of `subject` (every session's: `None`) from `policy`, in stream order,
    /// through an ordered consumer; `what` says what for, in an error.
    pub(super) async fn read_stream(
        &self,
        subject: Option<&str>,
        policy: consumer::DeliverPolicy,
        headers_only: bool,
        what: &str,
    ) -> Result<consumer::push::Ordered, StoreError> {
        let inner = &self.inner;
        let filter_subject = subject.map_or_else(|| format!("{}.events.*", inner.config.prefix), str::to_string);
        let config = consumer::push::OrderedConfig {
            deliver_subject: inner.client.new_inbox(),
            filter_subject,
            headers_only,
            deliver_policy: policy,
            ..Default::default()
        };
        let consumer = inner.stream.create_consumer(config).await.map_err(|e| store_error(what, e))?;
        consumer.messages().await.map_err(|e| store_error(what, e))
    }

    /// Follows the whole stream from `start`: one consumer for the node, replaced by a new
    /// one from where it stopped when it has gone quiet (see [`QUIET_WAIT`]).
    pub(super) async fn follow(&self, start: u64) -> Result<tokio::task::JoinHandle<()>, StoreError> {
        let mut messages = self.follow_from(start).await?;
        let log = self.clone();
        Ok(tokio::spawn(async move {
            let closed = || log.inner.closed.load(Ordering::SeqCst);
            let mut followed = start - 1;
            let mut quiet = Quiet::new(followed);
            let mut tick = quiet_ticks();
            loop {
                tokio::select! {
                    message = messages.next() => match message {
                        Some(Ok(message)) => {
                            if let Ok(info) = message.info() {
                                followed = followed.max(info.stream_sequence);
                            }
                            log.delivered(message);
                        }
                        Some(Err(error)) => tracing::warn!(%error, "the stream's consumer failed; it resumes"),
                        None => break,
                    },
                    _ = tick.tick() => {
                        if !quiet.stalled(followed, &log.inner.stream).await {
                            continue;
                        }
                        tracing::warn!(from = followed + 1, "the stream's consumer brings nothing the stream holds; following it again");
                        metrics::JETSTREAM_FOLLOWERS_REPLACED.with_label_values(&["events"]).inc();
                        // What the stream holds, fetched from its leader message by message,
                        // then a new consumer: JetStream makes one through its metadata leader,
                        // which may be electing too, and meanwhile the node fetches again.
                        loop {
                            followed = log.fetch_after(followed).await;
                            match tokio::time::timeout(2 * QUIET_WAIT, log.follow_from(followed + 1)).await {
                                Ok(Ok(new)) => break messages = new,
                                _ if closed() => return,
                                Ok(Err(error)) => {
                                    tracing::warn!(%error, "could not follow the stream again; fetching meanwhile")
                                }
                                Err(_) => tracing::warn!("could not follow the stream again in time; fetching meanwhile"),
                            }
                        }
                        tick.reset();
                    }
                }
            }
            if !closed() {
                tracing::error!("the stream's consumer ended");
            }
        }))
    }

    /// Takes the stream's messages after `followed` that its leader holds (as many as
    /// [`FETCH_ROUND`]), one request each, while the node has no consumer; answers the last
    /// taken (or skipped: a message removed from the stream).
    async fn fetch_after(&self, mut followed: u64) -> u64 {
        let stream = &self.inner.stream;
        let Ok(Ok(info)) = tokio::time::timeout(QUIET_WAIT, stream.get_info()).await else { return followed };
        let last = info.state.last_sequence.min(followed + FETCH_ROUND);
        while followed < last {
            let seq = followed + 1;
            match tokio::time::timeout(QUIET_WAIT, stream.get_raw_message(seq)).await {
                Ok(Ok(message)) => {
                    let subject = message.subject.as_str();
                    self.taken_from_stream(subject, seq, last - seq, Some(&message.headers), &message.payload);
                }
                Ok(Err(error)) if error.kind() == stream::RawMessageErrorKind::NoMessageFound => {}
                _ => break,
            }
            followed = seq;
        }
        followed
    }

    /// A consumer of the whole stream from `start_sequence`.
    async fn follow_from(&self, start_sequence: u64) -> Result<consumer::push::Ordered, StoreError> {
        let from = consumer::DeliverPolicy::ByStartSequence { start_sequence };
        self.read_stream(None, from, false, "could not follow the stream").await
    }

    /// What the last message of every session says of its turn ([`wire::TURN`]): the turns
    /// left open before this node started, which its consumer (from the stream's end) will
    /// not see go by. Read before the consumer starts, whose messages then come after.
    pub(super) async fn learn_open_turns(&self, messages: u64) -> Result<(), StoreError> {
        if messages == 0 {
            return Ok(());
        }
        const WHAT: &str = "could not read the sessions' last messages";
        let failed = |e: &dyn std::fmt::Display| store_error(WHAT, e);
        let read = async {
            let last = consumer::DeliverPolicy::LastPerSubject;
            let mut messages = self.read_stream(None, last, true, WHAT).await?;
            let mut open = Vec::new();
            while let Some(message) = messages.next().await {
                let message = message.map_err(|e| failed(&e))?;
                let pending = message.info().map_err(|e| failed(&e))?.pending;
                if let Some(session) = self.session_of(message.subject.as_str()) {
                    if wire::turn(message.headers.as_ref()) == Some(true) {
                        open.push(session);
                    }
                }
                if pending == 0 {
                    break;
                }
            }
            Ok::<_, StoreError>(open)
        };
        let open = tokio::time::timeout(self.inner.config.failover_wait, read)
            .await
            .map_err(|_| StoreError::unavailable("reading the sessions' last messages took too long"))??;
        self.inner.seen_open.lock().extend(open);
        Ok(())
    }

    /// One message of the stream, from any node: to the session, if this node has it loaded.
    fn delivered(&self, message: jetstream::Message) {
        let Ok(info) = message.info() else { return };
        let (stream_seq, pending) = (info.stream_sequence, info.pending);
        self.taken_from_stream(
            message.subject.as_str(),
            stream_seq,
            pending,
            message.headers.as_ref(),
            &message.payload,
        );
    }

    /// One message of the stream, by its parts (from the node's consumer, or fetched while
    /// the node has none: see [`JetStreamLog::fetch_after`]).
    fn taken_from_stream(
        &self,
        subject: &str,
        stream_seq: u64,
        pending: u64,
        headers: Option<&HeaderMap>,
        payload: &Bytes,
    ) {
        metrics::JETSTREAM_CONSUMER_PENDING.set(pending as i64);
        let Some(session) = self.session_of(subject) else { return };
        {
            let mut heard = self.inner.heard.lock();
            if heard.len() == HEARD {
                heard.pop_front();
            }
            heard.push_back((session, stream_seq));
        }
        // Every session's, loaded here or not: the message's header says whether it left a
        // turn open, whatever the node that appended it managed to project.
        if let Some(open) = wire::turn(headers) {
            let mut seen = self.inner.seen_open.lock();
            match open {
                true => seen.insert(session),
                false => seen.remove(&session),
            };
        }
        let Some(loaded) = self.inner.sessions.get(&session).map(|s| s.clone()) else { return };
        let decoded =
            wire::entry(stream_seq, headers).and_then(|entry| Ok((entry, Hashed::from(wire::decode(payload)?))));
        match decoded {
            Ok((entry, events)) => {
                loaded.apply(entry, events);
            }
            Err(error) => {
                tracing::error!(%error, stream_seq, session_id = %session, "a message of the stream is not turnlog's")
            }
        }
    }
}
