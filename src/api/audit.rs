//! Audit and time travel over HTTP: a session's chain head (`GET /sessions/{id}/audit`), its
//! export as JSON Lines with the chain (`GET /sessions/{id}/export`), imports of such files
//! (`POST /sessions/import`, admins only), and forks (`POST /sessions/{id}/fork`).

use actix_web::{get, post, web, HttpResponse};
use serde::Deserialize;
use serde_json::json;
use utoipa::{IntoParams, ToSchema};

use crate::api::body::{JsonBody, Query, RawBody};
use crate::api::caller::{Auth, CallerSession};
use crate::api::sse;
use crate::api::{Error, State};
use crate::audit::import::Imported;
use crate::audit::{Audit, Pace};
use crate::domain::event::{AgentSpec, ToolTrust};
use crate::error::ApiError;

pub fn routes(cfg: &mut utoipa_actix_web::service_config::ServiceConfig) {
    // Before `/sessions/{session_id}`, which would take `import` for a session id.
    cfg.service(import).service(audit).service(export).service(fork).service(replay).service(replay_into);
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ReplayQuery {
    speed: Option<f64>,
    from: Option<String>,
}

/// The session's log again as a stream of native frames, at its original pace divided by
/// `speed` (from event `from` on), ending after the last event: a past session, as it happened.
#[utoipa::path(
    tag = "audit",
    operation_id = "sessions_replay",
    params(("session_id" = String, Path, description = "The session's id"), ReplayQuery),
    responses((status = 200, description = "The log as native SSE frames, then the end", body = String, content_type = "text/event-stream")),
)]
#[get("/sessions/{session_id}/replay")]
async fn replay(
    state: State,
    CallerSession { summary, .. }: CallerSession,
    query: Query<ReplayQuery>,
) -> Result<HttpResponse, Error> {
    let mut pace = Pace::new(query.0.speed.unwrap_or(1.0))?;
    let mut replay = state.audit.pages(&summary, query.0.from.as_deref()).await?;
    let (log, shutdown) = (state.audit.clone(), state.shutdown.clone());
    // A slow replay waits long between events: `: ping` meanwhile, as every stream has.
    let heartbeat = std::time::Duration::from_millis(state.settings.streams.heartbeat_ms);
    let body = async_stream::stream! {
        'log: loop {
            let page = match log.next_page(&mut replay).await {
                Ok(page) if page.is_empty() => break,
                Ok(page) => page,
                Err(error) => {
                    tracing::error!(%error, "a replay stopped");
                    yield Err(std::io::Error::other(error.to_string()));
                    break;
                }
            };
            for event in &page {
                let mut beat = tokio::time::interval_at(tokio::time::Instant::now() + heartbeat, heartbeat);
                loop {
                    // The wait is the same whenever it is made again (its deadline is the event's).
                    let due = tokio::select! {
                        _ = shutdown.cancelled() => break 'log,
                        _ = pace.wait(event) => true,
                        _ = beat.tick() => false,
                    };
                    if due {
                        break;
                    }
                    yield Ok(web::Bytes::from_static(sse::PING));
                }
                let mut out = bytes::BytesMut::new();
                sse::native_frame(&mut out, event);
                yield Ok(out.freeze());
            }
        }
    };
    Ok(sse::response().streaming(body))
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct AuditQuery {
    #[serde(default)]
    verify: bool,
}

/// The head of the session's hash chain; with `verify=true`, the whole chain checked.
#[utoipa::path(
    tag = "audit",
    operation_id = "sessions_audit",
    params(("session_id" = String, Path, description = "The session's id"), AuditQuery),
    responses((status = 200, description = "The chain head, or the first broken link", body = Object)),
)]
#[get("/sessions/{session_id}/audit")]
async fn audit(
    state: State,
    CallerSession { summary, .. }: CallerSession,
    query: Query<AuditQuery>,
) -> Result<HttpResponse, Error> {
    let answer = match state.audit.head(&summary, query.0.verify).await? {
        Ok(head) => json!({
            "session_id": summary.id.to_string(),
            "sequence_number": head.seq,
            "last_id": head.last.map(|id| id.to_string()),
            "hash": hex::encode(head.hash),
            "verified": query.0.verify,
        }),
        Err(broken) => json!({
            "session_id": summary.id.to_string(),
            "verified": false,
            "broken": {
                "sequence_number": broken.seq,
                "what": broken.what,
                "expected": broken.expected,
                "found": broken.found,
            },
        }),
    };
    Ok(HttpResponse::Ok().json(answer))
}

/// The session's events exactly as stored, one JSON line each with its chain links.
#[utoipa::path(
    tag = "audit",
    operation_id = "sessions_export",
    params(("session_id" = String, Path, description = "The session's id")),
    responses((status = 200, description = "JSON Lines", body = String, content_type = "application/x-ndjson")),
)]
#[get("/sessions/{session_id}/export")]
async fn export(state: State, CallerSession { summary, .. }: CallerSession) -> Result<HttpResponse, Error> {
    let mut export = state.audit.export(&summary);
    // The first page now, so that a failure is an error answer, not a cut stream.
    let first = state.audit.export_page(&mut export).await?;
    let log = state.audit.clone();
    let body = async_stream::stream! {
        let mut page = first;
        while !page.is_empty() {
            yield Ok::<_, std::io::Error>(web::Bytes::from(page));
            page = match log.export_page(&mut export).await {
                Ok(page) => page,
                Err(error) => {
                    tracing::error!(%error, "an export stopped");
                    yield Err(std::io::Error::other(error.to_string()));
                    break;
                }
            };
        }
    };
    Ok(HttpResponse::Ok().content_type("application/x-ndjson").streaming(body))
}

/// Loads an export (admins only); refuses a file whose chain does not verify, or a session
/// that exists with other content.
#[utoipa::path(
    tag = "audit",
    operation_id = "sessions_import",
    request_body(description = "An export, as JSON Lines", content((String = "application/x-ndjson"), (String = "text/plain"))),
    responses((status = 200, description = "`{\"sessions\": [{session_id, status, events}]}`", body = Object)),
)]
#[post("/sessions/import")]
async fn import(state: State, Auth(caller, _): Auth, body: RawBody) -> Result<HttpResponse, Error> {
    Audit::may_import(&caller)?;
    let text = std::str::from_utf8(&body.0).map_err(|_| ApiError::invalid("the body is not UTF-8"))?;
    let lines = text.lines().enumerate().map(|(i, line)| Ok::<_, std::convert::Infallible>((i + 1, line.to_string())));
    let groups = crate::audit::format::group(lines).map_err(ApiError::invalid)?;
    if groups.is_empty() {
        return Err(ApiError::invalid("the body has no export lines").into());
    }
    let done = state.audit.import(&caller, groups).await?;
    let sessions: Vec<_> = done
        .into_iter()
        .map(|(session, imported)| {
            let (status, events) = match imported {
                Imported::New { events } => ("imported", events),
                Imported::Unchanged { events } => ("unchanged", events),
            };
            json!({"session_id": session.to_string(), "status": status, "events": events})
        })
        .collect();
    Ok(HttpResponse::Ok().json(json!({ "sessions": sessions })))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReplayInto {
    /// How much faster than the original (default 1).
    #[serde(default)]
    #[schema(exclusive_minimum = 0)]
    speed: Option<f64>,
    /// The event to start at (default: the start); the history before it is the seed.
    #[serde(default)]
    #[schema(pattern = "^$|^evt_[0-7][0-9A-HJKMNP-TV-Z]{25}$")]
    from: Option<String>,
}

/// A new session into which this one's events are re-emitted at their original pace divided
/// by `speed`: watch it live through any view's stream.
#[utoipa::path(
    tag = "audit",
    operation_id = "sessions_replay_into",
    params(("session_id" = String, Path, description = "The session's id")),
    request_body(content = ReplayInto, example = json!({"speed": 10})),
    responses((status = 201, description = "`{\"sessionId\", \"replay_of\"}`", body = Object)),
)]
#[post("/sessions/{session_id}/replay")]
async fn replay_into(
    state: State,
    CallerSession { caller, summary: source, .. }: CallerSession,
    body: JsonBody<ReplayInto>,
) -> Result<HttpResponse, Error> {
    let ReplayInto { speed, from } = body.0;
    let copy = state.audit.replay_into(&caller, &source, from.as_deref(), speed.unwrap_or(1.0)).await?;
    tracing::info!(session_id = %copy.id, source = %source.id, "replay started");
    let answer = json!({"sessionId": copy.id.to_string(), "replay_of": copy.spec.replay_of});
    Ok(HttpResponse::Created().json(answer))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Fork {
    /// The id of the last event the fork keeps.
    #[schema(pattern = "^evt_[0-7][0-9A-HJKMNP-TV-Z]{25}$")]
    at: String,
    /// The agent the fork goes on with (by default the source's, with its settings).
    #[serde(default, deserialize_with = "crate::api::body::objects")]
    agent: Option<ForkAgent>,
    /// Metadata of the fork's own, set over the source's key by key (`null` deletes a key).
    #[serde(default)]
    metadata: serde_json::Map<String, serde_json::Value>,
}

/// Another agent for a fork: its name, and the server tools enabled with their trust.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ForkAgent {
    name: String,
    #[serde(default, deserialize_with = "crate::api::body::objects")]
    tools: Option<Vec<ForkTool>>,
    #[serde(default)]
    options: serde_json::Map<String, serde_json::Value>,
}

/// A server tool enabled for the fork's agent, and whether the client trusts it.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ForkTool {
    name: String,
    #[serde(default)]
    trust: bool,
}

/// A new session whose history is this one's up to event `at`.
#[utoipa::path(
    tag = "audit",
    operation_id = "sessions_fork",
    params(("session_id" = String, Path, description = "The session's id")),
    request_body(content = Fork, example = json!({"at": "evt_01JD0000000000000000000000", "agent": {"name": "default"}})),
    responses((status = 201, description = "`{\"sessionId\", \"forked_from\"}`", body = Object)),
)]
#[post("/sessions/{session_id}/fork")]
async fn fork(
    state: State,
    CallerSession { caller, summary: source, .. }: CallerSession,
    body: JsonBody<Fork>,
) -> Result<HttpResponse, Error> {
    let Fork { at, agent, metadata } = body.0;
    let agent = agent.map(|a| AgentSpec {
        name: a.name,
        version: None,
        tools: a.tools.map(|tools| tools.into_iter().map(|t| ToolTrust { name: t.name, trust: t.trust }).collect()),
        options: a.options,
    });
    let forked = state.audit.fork(&caller, &source, &at, agent, metadata).await?;
    tracing::info!(session_id = %forked.id, source = %source.id, "session forked");
    let answer = json!({"sessionId": forked.id.to_string(), "forked_from": forked.spec.forked_from});
    Ok(HttpResponse::Created().json(answer))
}
