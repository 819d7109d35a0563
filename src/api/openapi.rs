//! The OpenAPI 3.1 document of every route of every view, served at `/openapi.json`.
//!
//! It is collected from the handlers as they are registered (`utoipa-actix-web`): each
//! handler carries its method, path, parameters, body and success answers, and a route is
//! registered only through `service(handler)`, so a route cannot be served without being
//! documented. The answers every route shares are added here, in the shape of the view that
//! gives them (each view's [`Shape`], which the route table registers): the error statuses
//! of the service's one code table as the view maps them, and the ways to authenticate.
//! The same document tells a request on a known path with a method the path does not take
//! that it gets 405, with `Allow` ([`super::allowed::Routes`]).

use serde_json::json;
use utoipa::openapi::path::{Operation, PathItem};
use utoipa::openapi::security::{ApiKey, ApiKeyValue, Http, HttpAuthScheme, SecurityRequirement, SecurityScheme};
use utoipa::openapi::{Components, Content, InfoBuilder, OpenApi, RefOr, Response, ResponseBuilder, Schema};
use utoipa_actix_web::AppExt;

pub use super::allowed::Routes;
use super::auth::CONSOLE_COOKIE;
use super::error::{Shape, Standard};
use super::routes::{error_shapes, routes};
use crate::error::Code;

/// The document, built from the route table as the server registers it; `max_page` is the
/// server's largest page (`limits.max_page_size`).
pub fn document(max_page: usize) -> OpenApi {
    let (_, api) = actix_web::App::new().into_utoipa_app().configure(routes).split_for_parts();
    finish(api, max_page, &error_shapes())
}

fn operations_mut(item: &mut PathItem) -> impl Iterator<Item = &mut Operation> {
    [&mut item.get, &mut item.post, &mut item.put, &mut item.patch, &mut item.delete, &mut item.head, &mut item.options]
        .into_iter()
        .filter_map(Option::as_mut)
}

/// `shapes`: how each view answers errors, by the tag its operations carry; any other tag
/// answers as [`Standard`].
fn finish(mut api: OpenApi, max_page: usize, shapes: &[Shape]) -> OpenApi {
    let standard = Shape::of::<Standard>("");
    let mut names = std::collections::HashMap::new();
    api.info = InfoBuilder::new()
        .title("turnlog")
        .version(env!("CARGO_PKG_VERSION"))
        .description(Some(
            "One durable event log per session, spoken as several protocols: the Agent Application \
             Protocol and native event views, the managed-agents events API (`/v1`), the agent harness \
             turn API (`/v1/agents/sessions`), and the console's own routes.",
        ))
        .build();
    let components = api.components.get_or_insert_with(Components::new);
    components.add_security_scheme("bearer", SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)));
    components.add_security_scheme("api_key", SecurityScheme::ApiKey(ApiKey::Header(ApiKeyValue::new("x-api-key"))));
    components.add_security_scheme("console", SecurityScheme::ApiKey(ApiKey::Cookie(ApiKeyValue::new(CONSOLE_COOKIE))));
    for shape in shapes.iter().chain([&standard]) {
        let (name, schemas) = (shape.schema)();
        components.schemas.extend(schemas);
        names.insert(shape.tag, name);
    }
    components.schemas.insert("SseEvent".to_string(), RefOr::T(sse_event()));
    let none: [&str; 0] = [];
    api.security = Some(vec![
        SecurityRequirement::new("bearer", none),
        SecurityRequirement::new("api_key", none),
        SecurityRequirement::new("console", none),
    ]);
    for (path, item) in api.paths.paths.iter_mut() {
        let cloud = path.starts_with("/api/v1/cloud/");
        for operation in operations_mut(item) {
            // The AAP and native routes also answer under `/api/v1/cloud`: one handler, two ids.
            if cloud {
                operation.operation_id = operation.operation_id.as_ref().map(|id| format!("cloud_{id}"));
            }
            let tag = operation.tags.as_ref().and_then(|tags| tags.first()).map_or("", String::as_str).to_string();
            for parameter in operation.parameters.iter_mut().flatten() {
                let RefOr::T(parameter) = parameter else { continue };
                if let Some(schema) = parameter_schema(&parameter.name, &tag, path, max_page) {
                    parameter.schema = Some(RefOr::T(schema));
                }
            }
            for response in operation.responses.responses.values_mut() {
                if let RefOr::T(response) = response {
                    if let Some(RefOr::T(stream)) = response.content.get_mut("text/event-stream") {
                        stream.schema = Some(RefOr::Ref(utoipa::openapi::Ref::from_schema_name("SseEvent")));
                    }
                }
            }
            let shape = shapes.iter().find(|shape| shape.tag == tag).unwrap_or(&standard);
            for status in error_statuses(shape) {
                let schema = &names[shape.tag];
                operation.responses.responses.entry(status.to_string()).or_insert_with(|| error_response(schema));
            }
        }
    }
    api
}

/// Every error status an operation can answer with: the code table, as its view maps it
/// (never 500, which is a bug, nor 405, which is for the methods a path does not take).
fn error_statuses(shape: &Shape) -> Vec<u16> {
    let mut statuses: Vec<u16> = Code::ALL
        .iter()
        .map(|code| (shape.status)(*code).as_u16())
        .filter(|status| *status != 500 && *status != 405)
        .collect();
    statuses.sort_unstable();
    statuses.dedup();
    statuses
}

/// The schemas of the query parameters every view shares, by name: what the handlers
/// accept, so that generated values test the handlers rather than the parsers' first line.
/// An empty value is taken as no value, as the handlers take it.
fn parameter_schema(name: &str, tag: &str, path: &str, max_page: usize) -> Option<Schema> {
    let schema = super::schema::schema;
    let id = |prefix: &str| {
        schema(json!({"type": "string", "pattern": format!("^$|^{prefix}_[0-7][0-9A-HJKMNP-TV-Z]{{25}}$")}))
    };
    let time =
        || schema(json!({"anyOf": [{"type": "string", "format": "date-time"}, {"type": "string", "maxLength": 0}]}));
    // A number (or a flag), or empty: no value, as the handlers take it.
    let number = |value: serde_json::Value| schema(json!({"anyOf": [value, {"type": "string", "maxLength": 0}]}));
    Some(match name {
        // The managed view cuts a larger page to the largest; the others refuse it.
        "limit" if tag == "managed" => number(json!({"type": "integer", "minimum": 1, "maximum": usize::MAX})),
        // The harness refuses more than its own page sizes, as the harness does.
        "limit" if tag == "harness" => {
            let max = if path.ends_with("/turns/{turn_id}/events") { 25 } else { 100 };
            number(json!({"type": "integer", "minimum": 1, "maximum": max}))
        }
        "speed" => number(json!({"type": "number", "exclusiveMinimum": 0})),
        "status" => schema(json!({"type": "string", "enum": ["running", "idle", "archived", ""]})),
        "statuses[]" => schema(json!({
            "type": "array",
            "items": {"type": "string", "enum": ["idle", "running", "rescheduling", "terminated"]},
        })),
        "limit" => number(json!({"type": "integer", "minimum": 1, "maximum": max_page})),
        "order" => schema(json!({"type": "string", "enum": ["asc", "desc", ""]})),
        "after_id" | "before_id" | "from" => id("evt"),
        "after" if tag != "managed" => id("sess"),
        // The page tokens the server gives: a managed session list's is a session's id, a
        // harness session list's too, an agent's versions' a version.
        "page" if tag == "managed" && path == "/v1/sessions" => id("sess"),
        "page" if path.ends_with("/versions") => schema(json!({"type": "string", "pattern": "^$|^\\+?[0-9]{1,9}$"})),
        "page_token" if path == "/v1/agents/sessions" => id("sess"),
        "page_token" if path.ends_with("/{session_id}/turns") => id("turn"),
        "page_token" if path.ends_with("/{session_id}/events") => {
            schema(json!({"type": "string", "pattern": "^$|^turn_[0-7][0-9A-HJKMNP-TV-Z]{25}:\\+?[0-9]{1,19}$"}))
        }
        "page_token" if path.ends_with("/{turn_id}/events") => {
            schema(json!({"type": "string", "pattern": "^$|^\\+?[0-9]{1,19}$"}))
        }
        "last_turn_id" => id("turn"),
        "agent_version" | "version" => number(json!({"type": "integer", "minimum": 0, "maximum": u32::MAX})),
        "delta_flush_interval_ms" => number(json!({"type": "integer", "minimum": 0})),
        "include_archived" => number(json!({"type": "boolean"})),
        "created_after" | "created_before" | "start_timestamp" | "end_timestamp" => time(),
        name if name.starts_with("created_at[") => time(),
        _ => return None,
    })
}

/// An SSE event as schemathesis and any reader parse it: `data`, with `event` and `id`.
fn sse_event() -> Schema {
    crate::api::schema::schema(json!({
        "type": "object",
        "required": ["data"],
        "properties": {"data": {"type": "string"}, "event": {"type": "string"}, "id": {"type": "string"}},
    }))
}

fn error_response(shape: &str) -> RefOr<Response> {
    let schema = RefOr::Ref(utoipa::openapi::Ref::from_schema_name(shape));
    RefOr::T(
        ResponseBuilder::new().description("An error").content("application/json", Content::new(Some(schema))).build(),
    )
}
