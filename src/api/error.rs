//! Errors on the wire. Each view renders an [`ApiError`] in its own protocol's shape by a
//! [`Render`] of its own (its statuses, and a typed body that the OpenAPI document
//! describes); handlers return [`Error<R>`], and the request extractors
//! ([`super::body::JsonBody`], [`super::body::Query`], [`super::caller::Auth`],
//! [`super::caller::CallerSession`]) take the same renderer, so that even a body that does
//! not parse is answered in the view's shape.

use std::fmt;
use std::marker::PhantomData;

use actix_web::http::StatusCode;
use actix_web::{HttpResponse, ResponseError};
use serde::Serialize;
use utoipa::openapi::{RefOr, Schema};
use utoipa::{PartialSchema, ToSchema};

use super::allowed::Routes;
use crate::error::{ApiError, Code};
use crate::session::{FollowError, SessionError};

/// How a view writes an error: the status it answers a code with, and the body.
pub trait Render: 'static {
    /// The error body, as the view's clients read it.
    type Body: Serialize + ToSchema;

    /// The status of an error with this code (the service's code table, unless the view's
    /// protocol says otherwise).
    fn status(code: Code) -> StatusCode {
        status(code)
    }

    fn body(error: &ApiError) -> Self::Body;

    fn render(error: &ApiError) -> HttpResponse {
        HttpResponse::build(Self::status(error.code)).json(Self::body(error))
    }
}

/// turnlog's own shape, used by the native, AAP, audit and console views:
/// `{"type":"error","error":{"type":…,"code":…,"message":…}}`.
pub struct Standard;

/// turnlog's error body.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = Error)]
pub struct StandardBody {
    #[serde(rename = "type")]
    pub kind: ErrorTag,
    #[schema(inline)]
    pub error: StandardDetail,
}

/// The constant `type` of a typed error body: `"error"`.
#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ErrorTag {
    Error,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct StandardDetail {
    /// What kind of error (`invalid_request_error`, `not_found_error`, ...).
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The code of the service's code table (`invalid_request`, `unknown_cursor`, ...).
    pub code: &'static str,
    /// What was wrong, naming the field or parameter.
    pub message: String,
}

impl Render for Standard {
    type Body = StandardBody;

    fn body(error: &ApiError) -> StandardBody {
        StandardBody {
            kind: ErrorTag::Error,
            error: StandardDetail { kind: error.code.kind(), code: error.code.code(), message: error.message.clone() },
        }
    }
}

/// Named schemas, as a document's components hold them.
pub type Schemas = Vec<(String, RefOr<Schema>)>;

/// A view's errors as the OpenAPI document describes them: the tag its operations carry,
/// the statuses it answers, and its body's schema (registered by the route table, which
/// knows the views, so the document needs to know none).
pub struct Shape {
    pub tag: &'static str,
    pub status: fn(Code) -> StatusCode,
    /// The body's schema name, and each schema it needs.
    pub schema: fn() -> (String, Schemas),
}

impl Shape {
    pub fn of<R: Render>(tag: &'static str) -> Shape {
        Shape {
            tag,
            status: R::status,
            schema: || {
                let mut schemas = vec![(R::Body::name().into_owned(), R::Body::schema())];
                R::Body::schemas(&mut schemas);
                (R::Body::name().into_owned(), schemas)
            },
        }
    }
}

pub fn status(code: Code) -> StatusCode {
    StatusCode::from_u16(code.status()).expect("the code table holds valid statuses")
}

/// An error as the view with renderer `R` answers it.
pub struct Error<R: Render = Standard> {
    pub error: ApiError,
    render: PhantomData<fn() -> R>,
}

impl<R: Render> Error<R> {
    pub fn new(error: ApiError) -> Error<R> {
        Error { error, render: PhantomData }
    }
}

impl<R: Render> fmt::Debug for Error<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.error, f)
    }
}

impl<R: Render> fmt::Display for Error<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.error, f)
    }
}

impl<R: Render> ResponseError for Error<R> {
    fn status_code(&self) -> StatusCode {
        R::status(self.error.code)
    }

    fn error_response(&self) -> HttpResponse {
        R::render(&self.error)
    }
}

impl<R: Render> From<ApiError> for Error<R> {
    fn from(error: ApiError) -> Error<R> {
        Error::new(error)
    }
}

impl<R: Render> From<SessionError> for Error<R> {
    fn from(error: SessionError) -> Error<R> {
        Error::new(error.into())
    }
}

impl<R: Render> From<FollowError> for Error<R> {
    fn from(error: FollowError) -> Error<R> {
        Error::new(error.into())
    }
}

/// Any request no route matched, in view `R`'s shape: 405 with `Allow` when its path is a
/// route's that takes other methods, else 404.
pub async fn no_route<R: Render>(req: actix_web::HttpRequest) -> HttpResponse {
    let routes = req.app_data::<actix_web::web::Data<Routes>>();
    let allowed = routes.map(|routes| routes.allowed(req.path())).unwrap_or_default();
    if allowed.is_empty() {
        return R::render(&ApiError::new(Code::NotFound, format!("no route for {} {}", req.method(), req.path())));
    }
    let allow: Vec<&str> = allowed.iter().map(|m| m.as_str()).collect();
    let message = format!("{} does not take {}: it takes {}", req.path(), req.method(), allow.join(", "));
    let mut response = R::render(&ApiError::new(Code::MethodNotAllowed, message));
    let value = actix_web::http::header::HeaderValue::from_str(&allow.join(", ")).expect("method names are ASCII");
    response.headers_mut().insert(actix_web::http::header::ALLOW, value);
    response
}

#[cfg(test)]
mod tests {
    use actix_web::{test, web, App};

    use super::*;
    use crate::api::body::{JsonBody, Query};

    /// A view with a shape of its own, as the managed-agents and harness views have.
    struct Plain;

    #[derive(Serialize, ToSchema)]
    struct PlainBody {
        error: PlainDetail,
    }

    #[derive(Serialize, ToSchema)]
    struct PlainDetail {
        message: String,
    }

    impl Render for Plain {
        type Body = PlainBody;

        fn body(error: &ApiError) -> PlainBody {
            PlainBody { error: PlainDetail { message: error.message.clone() } }
        }
    }

    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Body {
        #[allow(dead_code)]
        name: String,
    }

    #[derive(serde::Deserialize)]
    struct Page {
        #[allow(dead_code)]
        limit: Option<usize>,
    }

    async fn plain(_: JsonBody<Body, Plain>, _: Query<Page, Plain>) -> HttpResponse {
        HttpResponse::NoContent().finish()
    }

    async fn standard(_: JsonBody<Body>) -> HttpResponse {
        HttpResponse::NoContent().finish()
    }

    #[actix_web::test]
    async fn extractors_answer_in_the_shape_of_their_view() {
        let app = test::init_service(
            App::new().route("/plain", web::post().to(plain)).route("/standard", web::post().to(standard)),
        )
        .await;
        let request = |path: &str, body: &str| {
            test::TestRequest::post()
                .uri(path)
                .insert_header(("content-type", "application/json"))
                .set_payload(body.to_string())
        };
        let response = test::call_service(&app, request("/plain", r#"{"name":1}"#).to_request()).await;
        assert_eq!(response.status(), 400);
        let body: serde_json::Value = test::read_body_json(response).await;
        assert!(body["error"]["message"].as_str().unwrap().contains("`name`"), "{body}");
        assert_eq!(body.as_object().unwrap().len(), 1, "only the view's own fields: {body}");

        let response = test::call_service(&app, request("/plain?limit=x", r#"{"name":"a"}"#).to_request()).await;
        let body: serde_json::Value = test::read_body_json(response).await;
        assert!(body["error"]["message"].as_str().unwrap().contains("`limit`"), "{body}");

        let response = test::call_service(&app, request("/standard", r#"{"name":1}"#).to_request()).await;
        assert_eq!(response.status(), 400);
        let body: serde_json::Value = test::read_body_json(response).await;
        assert_eq!((body["type"].as_str(), body["error"]["code"].as_str()), (Some("error"), Some("invalid_request")));
    }
}
