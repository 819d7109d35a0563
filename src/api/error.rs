//! Errors on the wire. Each view renders an [`ApiError`] in its own protocol's shape by a
//! [`Render`] of its own; handlers return [`Error<R>`], and the request extractors
//! ([`super::body::JsonBody`], [`super::body::Query`], [`super::auth::Auth`]) take the same
//! renderer, so that even a body that does not parse is answered in the view's shape.

use std::fmt;
use std::marker::PhantomData;

use actix_web::http::StatusCode;
use actix_web::{HttpResponse, ResponseError};

use crate::error::{ApiError, Code};
use crate::session::{FollowError, SessionError};

/// How a view writes an error.
pub trait Render: 'static {
    fn render(error: &ApiError) -> HttpResponse;
}

/// turnlog's own shape, used by the native and AAP views:
/// `{"type":"error","error":{"type":…,"code":…,"message":…}}`.
pub struct Standard;

impl Render for Standard {
    fn render(error: &ApiError) -> HttpResponse {
        HttpResponse::build(status(error.code)).json(serde_json::json!({
            "type": "error",
            "error": {"type": error.code.kind(), "code": error.code.code(), "message": error.message},
        }))
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
        status(self.error.code)
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
    let routes = req.app_data::<actix_web::web::Data<super::openapi::Routes>>();
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

    impl Render for Plain {
        fn render(error: &ApiError) -> HttpResponse {
            HttpResponse::build(status(error.code)).json(serde_json::json!({"error": {"message": error.message}}))
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
