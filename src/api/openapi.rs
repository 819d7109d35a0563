//! The OpenAPI 3.1 document of every route of every view, served at `/openapi.json`.
//!
//! It is collected from the handlers as they are registered (`utoipa-actix-web`): each
//! handler carries its method, path, parameters, body and success answers, and a route is
//! registered only through `service(handler)`, so a route cannot be served without being
//! documented. The answers every route shares are added here, in the shape of the view that
//! gives them: the error statuses of the service's one code table, and the ways to
//! authenticate. The same document tells a request on a known path with a method the path
//! does not take that it gets 405, with `Allow` ([`Routes`]).

use actix_web::http::Method;
use actix_web::{get, web, HttpResponse};
use serde_json::json;
use utoipa::openapi::path::{Operation, PathItem};
use utoipa::openapi::security::{ApiKey, ApiKeyValue, Http, HttpAuthScheme, SecurityRequirement, SecurityScheme};
use utoipa::openapi::{Components, Content, InfoBuilder, OpenApi, RefOr, Response, ResponseBuilder, Schema};
use utoipa_actix_web::AppExt;

use super::auth::CONSOLE_COOKIE;
use crate::error::Code;

/// The document, built from the route table as the server registers it; `max_page` is the
/// server's largest page (`limits.max_page_size`).
pub fn document(max_page: usize) -> OpenApi {
    let (_, api) = actix_web::App::new().into_utoipa_app().configure(super::routes).split_for_parts();
    finish(api, max_page)
}

/// This document, as JSON.
#[utoipa::path(
    tag = "ops",
    operation_id = "openapi",
    security(()),
    responses((status = 200, description = "This document", body = Object, content_type = "application/json")),
)]
#[get("/openapi.json")]
pub async fn serve(routes: web::Data<Routes>) -> HttpResponse {
    HttpResponse::Ok().content_type("application/json").body(routes.json.clone())
}

/// The document's paths as a table: which methods each path template takes.
pub struct Routes {
    json: web::Bytes,
    templates: Vec<(Vec<Segment>, Vec<Method>)>,
}

enum Segment {
    Literal(String),
    Parameter,
}

impl Routes {
    pub fn new(api: &OpenApi) -> Routes {
        let templates = api
            .paths
            .paths
            .iter()
            .map(|(path, item)| {
                let segments = path
                    .split('/')
                    .map(|s| match s.starts_with('{') {
                        true => Segment::Parameter,
                        false => Segment::Literal(s.to_string()),
                    })
                    .collect();
                let methods = operations(item).map(|(method, _)| method).collect();
                (segments, methods)
            })
            .collect();
        let json = serde_json::to_vec(api).expect("the document serialises").into();
        Routes { json, templates }
    }

    /// The methods `path` takes (empty when no route has that path). Where several
    /// templates match (`/sessions/import` and `/sessions/{session_id}`), the one with the
    /// fewest parameters names the path.
    pub fn allowed(&self, path: &str) -> Vec<Method> {
        let parts: Vec<&str> = path.split('/').collect();
        let parameters = |segments: &[Segment]| segments.iter().filter(|s| matches!(s, Segment::Parameter)).count();
        self.templates
            .iter()
            .filter(|(segments, _)| {
                segments.len() == parts.len()
                    && segments.iter().zip(&parts).all(|(segment, part)| match segment {
                        Segment::Literal(literal) => literal == part,
                        Segment::Parameter => !part.is_empty(),
                    })
            })
            .min_by_key(|(segments, _)| parameters(segments))
            .map(|(_, methods)| methods.clone())
            .unwrap_or_default()
    }
}

/// Each operation of a path, with its method.
fn operations(item: &PathItem) -> impl Iterator<Item = (Method, &Operation)> {
    [
        (Method::GET, &item.get),
        (Method::POST, &item.post),
        (Method::PUT, &item.put),
        (Method::PATCH, &item.patch),
        (Method::DELETE, &item.delete),
        (Method::HEAD, &item.head),
        (Method::OPTIONS, &item.options),
    ]
    .into_iter()
    .filter_map(|(method, operation)| operation.as_ref().map(|operation| (method, operation)))
}

fn operations_mut(item: &mut PathItem) -> impl Iterator<Item = &mut Operation> {
    [&mut item.get, &mut item.post, &mut item.put, &mut item.patch, &mut item.delete, &mut item.head, &mut item.options]
        .into_iter()
        .filter_map(Option::as_mut)
}

/// The views' error shapes, by the tag their operations carry.
const SHAPES: &[(&str, &str)] = &[("managed", "ManagedError"), ("harness", "HarnessError")];

fn finish(mut api: OpenApi, max_page: usize) -> OpenApi {
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
    for (name, schema) in error_schemas().into_iter().chain([("SseEvent", sse_event())]) {
        components.schemas.insert(name.to_string(), RefOr::T(schema));
    }
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
            let tag = tag.as_str();
            let shape = SHAPES.iter().find(|(view, _)| *view == tag).map_or("Error", |(_, shape)| shape);
            for status in error_statuses(tag) {
                operation.responses.responses.entry(status.to_string()).or_insert_with(|| error_response(shape));
            }
        }
    }
    api
}

/// Every error status an operation can answer with: the code table, as its view maps it
/// (never 500, which is a bug, nor 405, which is for the methods a path does not take).
fn error_statuses(tag: &str) -> Vec<u16> {
    let mut statuses: Vec<u16> = Code::ALL
        .iter()
        .map(|code| match tag {
            "harness" => super::harness::status(*code).as_u16(),
            _ => code.status(),
        })
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
    let schema = |value: serde_json::Value| serde_json::from_value::<Schema>(value).expect("a valid schema");
    let id =
        |prefix: &str| schema(json!({"type": "string", "pattern": format!("^$|^{prefix}_[0-9A-HJKMNP-TV-Z]{{26}}$")}));
    let time =
        || schema(json!({"anyOf": [{"type": "string", "format": "date-time"}, {"type": "string", "maxLength": 0}]}));
    // A number (or a flag), or empty: no value, as the handlers take it.
    let number = |value: serde_json::Value| schema(json!({"anyOf": [value, {"type": "string", "maxLength": 0}]}));
    Some(match name {
        // The managed view cuts a larger page to the largest; the others refuse it.
        "limit" if tag == "managed" => number(json!({"type": "integer", "minimum": 1})),
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
    serde_json::from_value(json!({
        "type": "object",
        "required": ["data"],
        "properties": {"data": {"type": "string"}, "event": {"type": "string"}, "id": {"type": "string"}},
    }))
    .expect("a valid schema")
}

fn error_response(shape: &str) -> RefOr<Response> {
    let schema = RefOr::Ref(utoipa::openapi::Ref::from_schema_name(shape));
    RefOr::T(
        ResponseBuilder::new().description("An error").content("application/json", Content::new(Some(schema))).build(),
    )
}

/// The three error shapes: `{"type":"error","error":{…}}` (turnlog's, and the managed
/// view's without `code`) and the harness's `{"error":{…}}`.
fn error_schemas() -> Vec<(&'static str, Schema)> {
    let shape = |typed: bool, fields: &[&str]| {
        let properties: serde_json::Map<String, serde_json::Value> =
            fields.iter().map(|f| (f.to_string(), json!({"type": "string"}))).collect();
        let error = json!({"type": "object", "required": fields, "properties": properties});
        let value = match typed {
            true => json!({
                "type": "object",
                "required": ["type", "error"],
                "properties": {"type": {"type": "string", "enum": ["error"]}, "error": error},
            }),
            false => json!({"type": "object", "required": ["error"], "properties": {"error": error}}),
        };
        serde_json::from_value::<Schema>(value).expect("a valid schema")
    };
    vec![
        ("Error", shape(true, &["type", "code", "message"])),
        ("ManagedError", shape(true, &["type", "message"])),
        ("HarnessError", shape(false, &["message", "type", "code"])),
    ]
}
