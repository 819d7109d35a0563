//! The entry points of the fuzz targets in `fuzz/` (libFuzzer, `scripts/fuzz`), one per
//! kind of bytes turnlog takes from outside. Each takes the bytes as turnlog takes them and
//! panics only where turnlog is wrong: a parser that panics or hangs, an id that does not
//! print back as it was read, a request answered 5xx or with an error body that is not
//! JSON, a write-ahead log that recovers something that was not written.
//! `tests/fuzz_corpus.rs` runs the kept corpora (`fuzz/corpus/<target>/`) through them in
//! every `cargo test`.

use std::cell::RefCell;
use std::future::Future;
use std::mem::ManuallyDrop;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;

use actix_web::body::BoxBody;
use actix_web::dev::{Service as _, ServiceResponse};
use actix_web::{test, web};

use crate::api::{self, AppState};
use crate::config::Settings;
use crate::domain::{EventId, SessionId, TurnId};
use crate::service::Service;
use crate::session::Cursor;
use crate::store::memory::MemoryLog;

/// Ids and cursors as clients send them (paths, `after_id`, `Last-Event-ID`): whatever
/// parses prints back as the same id.
pub fn ids(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    fn round_trip<T: std::str::FromStr + ToString + PartialEq + std::fmt::Debug>(text: &str) {
        if let Ok(id) = text.parse::<T>() {
            assert_eq!(id.to_string().parse::<T>().ok(), Some(id), "{text:?}");
        }
    }
    round_trip::<SessionId>(text);
    round_trip::<EventId>(text);
    round_trip::<TurnId>(text);
    // The SSE `Last-Event-ID` as the native stream reads it.
    if let Ok(cursor) = Cursor::event(text.trim()) {
        assert_eq!(Cursor::event(&cursor.to_string()).map(|c| c.to_string()).ok(), Some(cursor.to_string()));
    }
}

/// The scripted model's directives, in a user's message.
pub fn scripted(data: &[u8]) {
    crate::agent::scripted::fuzz(&String::from_utf8_lossy(data));
}

/// A config file: read over the defaults, checked, and its agents built.
pub fn config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(settings) = Settings::from_toml(text) {
        let _ = crate::service::agents(&settings);
    }
}

/// A write-ahead log segment, written, damaged and read back.
pub fn wal(data: &[u8]) {
    crate::store::sled::wal::recovers_the_commits_before_any_damage(data);
}

/// An export file, as `turnlog import` and `verify` read it: lines grouped by session, each
/// session's chain checked.
pub fn import(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let lines = text.lines().enumerate().map(|(i, line)| Ok::<_, String>((i + 1, line.to_string())));
    if let Ok(groups) = crate::audit::format::group(lines) {
        for group in groups {
            if let Ok(events) = crate::audit::import::events_of(&group) {
                assert_eq!(events.len(), group.len());
            }
        }
    }
}

/// One in-process turnlog (the memory log, the scripted model, no keys) per fuzzing thread,
/// made again now and then so that what the inputs store does not pile up.
struct Fixture {
    system: actix_web::rt::SystemRunner,
    call: Call,
    service: Arc<Service>,
    /// The operations of the OpenAPI document: method and path template.
    routes: Vec<(actix_web::http::Method, String)>,
    /// A value for each path parameter: a session, an agent and an environment made at start.
    ids: Vec<(&'static str, String)>,
    inputs: usize,
}

type Call =
    Box<dyn Fn(test::TestRequest) -> Pin<Box<dyn Future<Output = Result<ServiceResponse<BoxBody>, actix_web::Error>>>>>;

/// Inputs one fixture takes before it is made again.
const FIXTURE_INPUTS: usize = 2_000;

// Never dropped at thread exit (actix's own thread locals may be gone by then); a fixture
// made again drops the old one first.
thread_local! {
    static FIXTURE: RefCell<ManuallyDrop<Option<Fixture>>> = const { RefCell::new(ManuallyDrop::new(None)) };
}

fn fixture() -> Fixture {
    let system = actix_web::rt::System::new();
    let settings = Settings::from_toml("[streams]\nheartbeat_ms = 60000\n").expect("the defaults load");
    let document = api::openapi::document(settings.limits.max_page_size);
    let routes = document
        .paths
        .paths
        .iter()
        .flat_map(|(path, item)| {
            let methods = [
                (&item.get, actix_web::http::Method::GET),
                (&item.post, actix_web::http::Method::POST),
                (&item.put, actix_web::http::Method::PUT),
                (&item.delete, actix_web::http::Method::DELETE),
                (&item.patch, actix_web::http::Method::PATCH),
            ];
            methods.into_iter().filter(|(op, _)| op.is_some()).map(|(_, method)| (method, path.clone()))
        })
        .collect();
    let (call, service, ids) = system.block_on(async move {
        let log = Arc::new(MemoryLog::new(crate::projection::all(), 256, 1_000_000));
        let service = Arc::new(
            Service::with_store(&settings, crate::store::Store::embedded(log)).await.expect("the service starts"),
        );
        let state = web::Data::new(AppState::new(&service, Arc::new(settings), api::auth::Keys::new(&[])));
        let routes = web::Data::new(api::openapi::Routes::new(&document));
        let app = Rc::new(test::init_service(crate::app::views(state, routes)).await);
        let call: Call = Box::new(move |request| {
            let app = app.clone();
            Box::pin(async move { app.call(request.to_request()).await.map(ServiceResponse::map_into_boxed_body) })
        });
        let mut ids = Vec::new();
        for (param, path, body, field) in [
            ("session_id", "/sessions", r#"{"agent":{"name":"default"}}"#, "sessionId"),
            ("agent_id", "/v1/agents", r#"{"name":"fuzz","model":"scripted"}"#, "id"),
            ("environment_id", "/v1/environments", r#"{"name":"fuzz"}"#, "id"),
        ] {
            let request = test::TestRequest::post()
                .uri(path)
                .insert_header(("content-type", "application/json"))
                .set_payload(body);
            let response = call(request).await.expect("a fixture request");
            let body: serde_json::Value = serde_json::from_slice(&test::read_body(response).await).expect("JSON");
            ids.push((param, body[field].as_str().expect("an id").to_string()));
        }
        ids.push(("turn_id", TurnId::generate().to_string()));
        ids.push(("file", "app.js".to_string()));
        (call, service, ids)
    });
    Fixture { system, call, service, routes, ids, inputs: 0 }
}

/// Any request to any route of any view. The input is lines: the operation (`POST
/// /sessions/{session_id}/events`, from the OpenAPI document, so that a new route is fuzzed
/// by being served; any other text picks one by its bytes), the path parameters' text
/// (empty: the fixture's ids), the query string, a `Last-Event-ID`, and the rest is the
/// body. No answer may be a 5xx; an error's body must be JSON.
pub fn http(data: &[u8]) {
    if asks_to_wait(data) {
        return;
    }
    let mut parts = data.splitn(5, |b| *b == b'\n');
    let (operation, own, query, last_event_id, body) = (
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or_default(),
        parts.next(),
        parts.next(),
        parts.next().unwrap_or_default(),
    );
    FIXTURE.with(|cell| {
        let mut cell = cell.borrow_mut();
        if cell.as_ref().is_none_or(|f| f.inputs >= FIXTURE_INPUTS) {
            if let Some(old) = cell.take() {
                old.system.block_on(async move { old.service.shutdown().await }).expect("the memory log closes");
            }
            **cell = Some(fixture());
        }
        let fixture = cell.as_mut().expect("made above");
        fixture.inputs += 1;
        let named = fixture.routes.iter().position(|(method, template)| {
            operation.strip_prefix(method.as_str().as_bytes()).and_then(|rest| rest.strip_prefix(b" "))
                == Some(template.as_bytes())
        });
        let pick = named.unwrap_or_else(|| operation.iter().map(|b| usize::from(*b)).sum::<usize>());
        let (method, template) = &fixture.routes[pick % fixture.routes.len()];
        let mut path = template.clone();
        for (param, id) in &fixture.ids {
            let value = if own.is_empty() { id.clone() } else { percent(own) };
            path = path.replace(&format!("{{{param}}}"), &value);
        }
        if let Some(query) = query.filter(|query| !query.is_empty()) {
            path.push('?');
            path.push_str(&percent_query(query));
        }
        let mut request = test::TestRequest::default().method(method.clone()).uri(&path);
        if let Some(value) = last_event_id.and_then(|v| actix_web::http::header::HeaderValue::from_bytes(v).ok()) {
            request = request.insert_header(("last-event-id", value));
        }
        if !body.is_empty() {
            request = request.insert_header(("content-type", "application/json")).set_payload(body.to_vec());
        }
        // What ends the fixture's own session, agent or environment ends the fixture too.
        if own.is_empty() && (*method == actix_web::http::Method::DELETE || template.ends_with("/archive")) {
            fixture.inputs = FIXTURE_INPUTS;
        }
        let call = &fixture.call;
        fixture.system.block_on(async {
            let response = call(request).await.expect("an answer");
            let status = response.status();
            assert!(!status.is_server_error(), "{method} {path}: {status}");
            let streams = response.headers().get("content-type").is_some_and(|t| t.as_bytes() == b"text/event-stream");
            if status.is_client_error() && !streams {
                let body = test::read_body(response).await;
                if !body.is_empty() {
                    let parsed = serde_json::from_slice::<serde_json::Value>(&body);
                    assert!(parsed.is_ok(), "{method} {path}: {status} with a body that is not JSON: {body:?}");
                }
            }
        });
    });
}

/// Whether an input tells the scripted model to wait (`/delay`, up to a minute a token):
/// waiting as told is not a fault, and would only slow the fuzzer down.
fn asks_to_wait(data: &[u8]) -> bool {
    data.windows(6).any(|w| w.eq_ignore_ascii_case(b"/delay") || w.eq_ignore_ascii_case(b"\\/dela"))
}

/// Path text as a client would send it: every byte but unreserved ones percent-encoded.
fn percent(bytes: &[u8]) -> String {
    bytes
        .iter()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => char::from(*b).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A query string as sent: `&`, `=` and brackets stay, anything else unsafe is encoded.
fn percent_query(bytes: &[u8]) -> String {
    bytes
        .iter()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b'&' | b'=' | b'[' | b']' | b'%' => {
                char::from(*b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The Agent Client Protocol's lines, as an editor would send them on `turnlog acp`'s stdin,
/// served by an embedded turnlog (memory log, scripted model) until they end.
pub fn acp(data: &[u8]) {
    if asks_to_wait(data) {
        return;
    }
    ACP.with(|cell| {
        let mut cell = cell.borrow_mut();
        if cell.as_ref().is_none_or(|(_, _, inputs)| *inputs >= FIXTURE_INPUTS) {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
            let settings = Settings::from_toml("").expect("the defaults load");
            let service = runtime.block_on(async {
                let log = Arc::new(MemoryLog::new(crate::projection::all(), 256, 1_000_000));
                Arc::new(
                    Service::with_store(&settings, crate::store::Store::embedded(log))
                        .await
                        .expect("the service starts"),
                )
            });
            **cell = Some((runtime, service, 0));
        }
        let (runtime, service, inputs) = cell.as_mut().expect("made above");
        *inputs += 1;
        let door = Arc::new(crate::acp::door::Embedded::new(service.clone()));
        let acp = crate::acp::Acp::new(door, "default".to_string());
        let lines = agent_client_protocol::ByteStreams::new(
            futures_util::io::sink(),
            futures_util::io::Cursor::new(data.to_vec()),
        );
        // A protocol error ends the connection; only a panic is a finding.
        let _ = runtime.block_on(acp.serve_until_closed(lines));
    });
}

/// An embedded turnlog for the ACP target, and the inputs it has taken.
type AcpFixture = (tokio::runtime::Runtime, Arc<Service>, usize);

thread_local! {
    static ACP: RefCell<ManuallyDrop<Option<AcpFixture>>> = const { RefCell::new(ManuallyDrop::new(None)) };
}
