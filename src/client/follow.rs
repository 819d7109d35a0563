//! SSE frames, and following a session's native stream across drops: it is opened again
//! with `Last-Event-ID` after the last event seen, so each event comes once, in order.

use std::time::Duration;

use eventsource_stream::Eventsource;
use futures_util::stream::BoxStream;
use futures_util::StreamExt;

use super::{Client, ClientError, StreamFrom};

/// One SSE frame: its `id:`, `event:` and `data:` (empty where the frame had none).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Frame {
    pub id: String,
    pub event: String,
    pub data: String,
}

/// The frames of an SSE answer, until the server ends it.
pub type Frames = BoxStream<'static, Result<Frame, ClientError>>;

pub(super) fn frames(response: reqwest::Response) -> Frames {
    response
        .bytes_stream()
        .eventsource()
        .map(|frame| {
            let frame = frame.map_err(ClientError::Stream)?;
            Ok(Frame { id: frame.id, event: frame.event, data: frame.data })
        })
        .boxed()
}

/// When a dropped stream is opened again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reconnect {
    /// The pause before the first attempt after a drop; it doubles after each failed
    /// attempt, up to `max_pause`, and starts over once a stream is open.
    pub pause: Duration,
    pub max_pause: Duration,
    /// Failed attempts in a row after which the follow gives up (`None`: never).
    pub attempts: Option<u32>,
}

/// What following a stream brings.
#[derive(Debug)]
pub enum Followed {
    /// An event's frame, never one that came before.
    Event(Frame),
    /// The stream dropped, or could not be opened: the next call opens it again after
    /// `after` (the last event seen; `None`, the start), after a pause.
    Dropped { after: Option<String>, cause: ClientError },
}

/// A session's native stream, followed until the session ends (its `terminated` event),
/// a refusal, or too many failed attempts to open it again. See [`Client::follow`].
pub struct Follow {
    client: Client,
    session: String,
    reconnect: Reconnect,
    /// The last event seen, where the stream starts again.
    last: Option<String>,
    frames: Option<Frames>,
    /// Before the next attempt to open the stream.
    pause: Option<Duration>,
    /// The pause after the next failed attempt.
    backoff: Duration,
    failures: u32,
    ended: bool,
}

impl Follow {
    pub(super) fn new(client: Client, session: &str, after: Option<String>, reconnect: Reconnect) -> Follow {
        Follow {
            client,
            session: session.to_string(),
            reconnect,
            last: after,
            frames: None,
            pause: None,
            backoff: reconnect.pause,
            failures: 0,
            ended: false,
        }
    }

    /// Opens the stream now, so that a caller hears at once whatever the server answers
    /// (an unknown session, a refused key, no server), where [`Follow::next`] would retry
    /// what may pass.
    pub async fn connect(&mut self) -> Result<(), ClientError> {
        let from = match &self.last {
            Some(id) => StreamFrom::LastEventId(id.clone()),
            None => StreamFrom::Start,
        };
        let response = self.client.stream_raw(&self.session, &from).await?;
        self.frames = Some(frames(response));
        (self.failures, self.backoff) = (0, self.reconnect.pause);
        Ok(())
    }

    /// The next event, or word that the stream dropped and is being opened again; `None`
    /// once the session has ended.
    pub async fn next(&mut self) -> Result<Option<Followed>, ClientError> {
        loop {
            if self.ended {
                return Ok(None);
            }
            if self.frames.is_none() {
                if let Some(pause) = self.pause.take() {
                    tokio::time::sleep(pause).await;
                }
                if let Err(cause) = self.connect().await {
                    return self.dropped(cause);
                }
            }
            let frames = self.frames.as_mut().expect("an open stream");
            let cause = match frames.next().await {
                Some(Ok(frame)) => match self.seen(frame) {
                    Some(frame) => return Ok(Some(Followed::Event(frame))),
                    None => continue,
                },
                Some(Err(cause)) => cause,
                None => ClientError::Closed,
            };
            self.frames = None;
            return self.dropped(cause);
        }
    }

    /// The last event seen (or the one the follow started after).
    pub fn last_id(&self) -> Option<&str> {
        self.last.as_deref()
    }

    /// A frame to hand on, or `None` for one without data or already seen (ids grow with
    /// the log, and all have one length, so they compare as text).
    fn seen(&mut self, frame: Frame) -> Option<Frame> {
        if frame.data.is_empty() {
            return None;
        }
        if !frame.id.is_empty() {
            if self.last.as_deref().is_some_and(|last| frame.id.as_str() <= last) {
                return None;
            }
            self.last = Some(frame.id.clone());
        }
        // The native stream ends after the session's last event.
        self.ended = frame.event == "terminated";
        Some(frame)
    }

    fn dropped(&mut self, cause: ClientError) -> Result<Option<Followed>, ClientError> {
        if !cause.is_transient() {
            return Err(cause);
        }
        self.failures += 1;
        if self.reconnect.attempts.is_some_and(|most| self.failures > most) {
            return Err(ClientError::GaveUp { attempts: self.failures - 1, last: Box::new(cause) });
        }
        self.pause = Some(self.backoff);
        self.backoff = (self.backoff * 2).min(self.reconnect.max_pause);
        Ok(Some(Followed::Dropped { after: self.last.clone(), cause }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn follow(reconnect: Reconnect) -> Follow {
        Client::new("http://127.0.0.1:9", None).follow("sess_1", Some("evt_02".into()), reconnect)
    }

    fn frame(id: &str, event: &str) -> Frame {
        Frame { id: id.into(), event: event.into(), data: "{}".into() }
    }

    const STEADY: Reconnect =
        Reconnect { pause: Duration::from_millis(100), max_pause: Duration::from_millis(300), attempts: Some(3) };

    #[test]
    fn each_event_comes_once_and_the_session_s_end_ends_the_follow() {
        let mut follow = follow(STEADY);
        assert_eq!(follow.seen(frame("evt_01", "a")), None, "before the cursor");
        assert_eq!(follow.seen(frame("evt_02", "a")), None, "the cursor itself");
        assert_eq!(follow.seen(frame("evt_03", "a")), Some(frame("evt_03", "a")));
        assert_eq!(follow.seen(frame("evt_03", "a")), None, "again after a reconnect");
        assert_eq!(follow.seen(Frame { data: String::new(), ..frame("evt_04", "a") }), None, "no data");
        assert_eq!(follow.last_id(), Some("evt_03"));
        assert!(!follow.ended);
        assert!(follow.seen(frame("evt_05", "terminated")).is_some());
        assert!(follow.ended);
    }

    #[test]
    fn drops_back_off_and_give_up_after_the_attempts_allowed_but_a_refusal_stands() {
        let mut dropping = follow(STEADY);
        let mut pauses = Vec::new();
        for _ in 0..3 {
            let dropped = dropping.dropped(ClientError::Closed).expect("retried");
            assert!(matches!(dropped, Some(Followed::Dropped { after: Some(ref id), .. }) if id == "evt_02"));
            pauses.push(dropping.pause.take().unwrap().as_millis());
        }
        assert_eq!(pauses, [100, 200, 300]);
        assert!(matches!(dropping.dropped(ClientError::Closed), Err(ClientError::GaveUp { attempts: 3, .. })));

        let refused = ClientError::Invalid("no".into());
        assert!(matches!(follow(STEADY).dropped(refused), Err(ClientError::Invalid(_))));
    }
}
