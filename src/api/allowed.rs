//! The methods each path of the OpenAPI document takes, so that a request on a known path
//! with another method is answered 405 with `Allow` rather than 404 ([`super::no_route`]).

use actix_web::http::Method;
use actix_web::web;
use utoipa::openapi::path::{Operation, PathItem};
use utoipa::openapi::OpenApi;

/// The document's paths as a table (which methods each path template takes), and the
/// document as JSON, as `/openapi.json` serves it.
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

    /// The document, as JSON.
    pub fn json(&self) -> web::Bytes {
        self.json.clone()
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
