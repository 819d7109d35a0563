//! What the stream scenarios share: followers that read a session's stream until they have
//! the writer's last event (opened a bounded number at a time), a writer appending at a
//! steady rate, and the check of every follower against its session's log.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;

use super::{message, Deadline};
use crate::check::{Log, Violations};
use crate::client::{parse_event_id, Api, Cursor, EventStream, Frame};
use crate::stats::Latency;

/// Streams being opened at once: more only overflows the server's accept queue.
pub const OPENING: usize = 64;

/// What one follower received.
#[derive(Default)]
pub struct Received {
    pub frames: Vec<Frame>,
    /// When the stream's response head arrived.
    pub opened: Option<Instant>,
    pub error: Option<String>,
    pub deadline_hit: bool,
}

impl Received {
    pub fn ids(&self) -> Vec<u128> {
        self.frames.iter().map(|f| f.id).collect()
    }
}

/// One follower: which client it is, the session (an index) it follows from `first`.
pub struct Follower {
    pub client: usize,
    pub session: usize,
    pub first: Cursor,
    pub received: Received,
}

/// Followers from the start of the log: follower `i` on session `i mod sessions`, done
/// once it has the event its session's target names.
pub struct Followers {
    tasks: JoinSet<Follower>,
    connected: Arc<AtomicUsize>,
    count: usize,
}

impl Followers {
    pub fn spawn(
        api: &Api,
        sessions: &[String],
        count: usize,
        targets: &[watch::Receiver<Option<u128>>],
        deadline: Deadline,
    ) -> Followers {
        let connected = Arc::new(AtomicUsize::new(0));
        let opening = Arc::new(Semaphore::new(OPENING));
        let mut tasks = JoinSet::new();
        for client in 0..count {
            let session = client % sessions.len();
            let (api, id, target) = (api.clone(), sessions[session].clone(), targets[session].clone());
            let (connected, opening) = (connected.clone(), opening.clone());
            tasks.spawn(async move {
                let permit = opening.acquire_owned().await;
                let received = follow(&api, &id, Cursor::Start, target, deadline, move || {
                    drop(permit);
                    connected.fetch_add(1, Ordering::Relaxed);
                })
                .await;
                Follower { client, session, first: Cursor::Start, received }
            });
        }
        Followers { tasks, connected, count }
    }

    /// Waits until every follower has its first event (its replay has begun).
    pub async fn connected(&self, deadline: Deadline, quiet: bool) -> Result<(), String> {
        if wait_for(&self.connected, self.count, deadline, quiet).await {
            return Ok(());
        }
        Err(format!(
            "only {} of {} streams had their first event before the deadline",
            self.connected.load(Ordering::Relaxed),
            self.count
        ))
    }

    pub async fn join(self) -> Vec<Follower> {
        let mut followers = self.tasks.join_all().await;
        followers.sort_by_key(|f| f.client);
        followers
    }
}

/// Waits until `count` reaches `target`, or the deadline.
pub async fn wait_for(count: &AtomicUsize, target: usize, deadline: Deadline, quiet: bool) -> bool {
    let bar = crate::progress::bar(quiet || target < 500, target as u64, "connecting");
    let reached = loop {
        let now = count.load(Ordering::Relaxed);
        bar.set_position(now as u64);
        if now >= target || deadline.passed() {
            break now >= target;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    bar.finish_and_clear();
    reached
}

/// Each follower's events must be exactly its session's log after its first cursor; a log
/// that could not be read or is malformed is a violation of its own. Answers how many
/// followers had exactly their suffix.
pub fn check_followers(logs: &[Result<Log, String>], followers: &[Follower], violations: &mut Violations) -> usize {
    for log in logs {
        if let Err(violation) = log {
            violations.push(violation.clone());
        }
    }
    let mut exact = 0;
    for f in followers {
        if let Some(error) = &f.received.error {
            violations.push(format!("client {}: {error}", f.client));
        }
        if let Ok(log) = &logs[f.session] {
            let who = format!("client {} (from {})", f.client, f.first);
            exact += usize::from(violations.check(log.check(&who, f.first.id(), &f.received.ids())));
        }
    }
    exact
}

/// Reads a stream from `cursor` until it has the event `target` names (once it is set), the
/// stream fails, or the deadline. `on_first` runs at the first event.
pub async fn follow(
    api: &Api,
    session: &str,
    cursor: Cursor,
    target: watch::Receiver<Option<u128>>,
    deadline: Deadline,
    on_first: impl FnOnce(),
) -> Received {
    let mut received = Received::default();
    match deadline.run(api.stream(session, cursor)).await {
        None => received.deadline_hit = true,
        Some(Err(error)) => received.error = Some(format!("{error:#}")),
        Some(Ok(stream)) => {
            received.opened = Some(Instant::now());
            read_until(stream, &mut received, target, deadline, on_first).await;
        }
    }
    received
}

async fn read_until(
    mut stream: EventStream,
    received: &mut Received,
    mut target: watch::Receiver<Option<u128>>,
    deadline: Deadline,
    on_first: impl FnOnce(),
) {
    let mut on_first = Some(on_first);
    let mut watching = true;
    loop {
        let done = *target.borrow();
        if done.is_some_and(|done| received.frames.last().is_some_and(|got| got.id >= done)) {
            return;
        }
        tokio::select! {
            next = deadline.run(stream.next()) => {
                match next {
                    None => received.deadline_hit = true,
                    Some(Ok(Some(frame))) => received.frames.push(frame),
                    Some(Ok(None)) => received.error = Some("the server ended the stream".into()),
                    Some(Err(error)) => received.error = Some(format!("{error:#}")),
                }
                if received.deadline_hit || received.error.is_some() {
                    return;
                }
                if let Some(first) = on_first.take() {
                    first();
                }
            }
            changed = target.changed(), if watching => watching = changed.is_ok(),
        }
    }
}

/// How a writer appends: `per_sec` single-event requests for `duration` seconds, at most
/// `count`, each event of about `event_bytes`.
#[derive(Debug, Clone, Copy)]
pub struct Rate {
    pub per_sec: f64,
    pub duration: f64,
    pub count: u64,
    pub event_bytes: usize,
}

/// One append: the event's id, when the request was sent, when its acknowledgement came.
#[derive(Debug, Clone, Copy)]
pub struct Append {
    pub id: u128,
    pub sent: Instant,
    pub acked: Instant,
}

#[derive(Default)]
pub struct Written {
    /// Every acknowledged append, in order.
    pub acked: Vec<Append>,
    pub latency: Latency,
    pub elapsed: f64,
    pub error: Option<String>,
    pub deadline_hit: bool,
}

impl Written {
    pub fn last(&self) -> Option<u128> {
        self.acked.last().map(|a| a.id)
    }
}

/// [`write_at_rate`] on a thread and runtime of its own, so the acknowledgement times are
/// not delayed behind the followers' work in the load client.
pub async fn write_on_own_thread(url: &str, session: &str, rate: Rate, deadline: Deadline) -> Written {
    let (url, session) = (url.to_string(), session.to_string());
    let writer = std::thread::spawn(move || {
        let runtime =
            tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime for the writer");
        runtime.block_on(async move { write_at_rate(&Api::new(&url), &session, rate, deadline).await })
    });
    tokio::task::spawn_blocking(move || writer.join())
        .await
        .ok()
        .and_then(Result::ok)
        .unwrap_or_else(|| Written { error: Some("the writer thread panicked".into()), ..Written::default() })
}

/// Appends one event at a time at a steady rate (a late acknowledgement delays the next).
pub async fn write_at_rate(api: &Api, session: &str, rate: Rate, deadline: Deadline) -> Written {
    let mut written = Written::default();
    let started = Instant::now();
    let stop = started + Duration::from_secs_f64(rate.duration);
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate.per_sec.max(0.001)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    for n in 0..rate.count {
        tick.tick().await;
        if Instant::now() >= stop {
            break;
        }
        let text = message(&format!("live{n}"), rate.event_bytes);
        let sent = Instant::now();
        match deadline.run(api.post_events(session, &[text])).await {
            None => written.deadline_hit = true,
            Some(Err(error)) => written.error = Some(format!("the writer: {error:#}")),
            Some(Ok((stored, _))) => {
                let acked = Instant::now();
                written.latency.record(acked - sent);
                let id = parse_event_id(&stored[0].id).unwrap_or_default();
                written.acked.push(Append { id, sent, acked });
            }
        }
        if written.deadline_hit || written.error.is_some() {
            break;
        }
    }
    written.elapsed = started.elapsed().as_secs_f64();
    written
}
