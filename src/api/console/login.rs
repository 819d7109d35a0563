//! Who the console's viewer is: a key exchanged once for a signed cookie, renewed while the
//! page is open, and cleared at logout.

use std::time::SystemTime;

use actix_web::cookie::{time, Cookie, SameSite};
use actix_web::{get, post, HttpRequest, HttpResponse};
use serde::Deserialize;
use serde_json::json;
use utoipa::ToSchema;

use crate::api::auth::{from_console, Token, CONSOLE_COOKIE, CONSOLE_TOKEN_TTL};
use crate::api::body::JsonBody;
use crate::api::caller::Auth;
use crate::api::{Error, State};
use crate::domain::EventBody;
use crate::error::{ApiError, Code};

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Login {
    /// An API key.
    key: String,
}

/// Who the caller is, and whether the server runs without keys.
#[utoipa::path(
    tag = "console",
    operation_id = "console_whoami",
    responses((status = 200, description = "`{subject, admin, open, event_types}`", body = Object)),
)]
#[get("/console/api/whoami")]
pub async fn whoami(state: State, Auth(caller, _): Auth) -> HttpResponse {
    HttpResponse::Ok().json(json!({
        "subject": caller.subject,
        "admin": caller.admin,
        "open": state.auth.is_open(),
        "event_types": EventBody::TYPES,
    }))
}

/// Exchanges a key for the console's HttpOnly, SameSite=Strict cookie. Needs the header
/// `X-Turnlog-Console: 1`.
#[utoipa::path(
    tag = "console",
    operation_id = "console_login",
    security(()),
    params(("X-Turnlog-Console" = String, Header, description = "`1`")),
    request_body(content = Login, example = json!({"key": "an API key"})),
    responses((status = 200, description = "`{subject, admin, expires_at}`, with the cookie", body = Object)),
)]
#[post("/console/api/login")]
pub async fn login(state: State, req: HttpRequest, body: JsonBody<Login>) -> Result<HttpResponse, Error> {
    from_console(&req)?;
    if state.auth.is_open() {
        let caller = state.auth.caller(None)?;
        return Ok(HttpResponse::Ok().json(json!({"subject": caller.subject, "admin": true, "expires_at": null})));
    }
    let token = state.auth.issue(&body.0.key, CONSOLE_TOKEN_TTL)?;
    tracing::info!(subject = %token.caller.subject, "console login");
    Ok(with_cookie(&req, token))
}

/// Renews the console's cookie. Needs the header `X-Turnlog-Console: 1`.
#[utoipa::path(
    tag = "console",
    operation_id = "console_refresh",
    security(("console" = [])),
    params(("X-Turnlog-Console" = String, Header, description = "`1`")),
    responses((status = 200, description = "`{subject, admin, expires_at}`, with a new cookie", body = Object)),
)]
#[post("/console/api/refresh")]
pub async fn refresh(state: State, req: HttpRequest) -> Result<HttpResponse, Error> {
    from_console(&req)?;
    let Some(cookie) = req.cookie(CONSOLE_COOKIE) else {
        return Err(ApiError::new(Code::Unauthorized, "not logged in to the console").into());
    };
    let token = state.auth.renew(cookie.value(), CONSOLE_TOKEN_TTL)?;
    Ok(with_cookie(&req, token))
}

/// Clears the console's cookie. Needs the header `X-Turnlog-Console: 1`.
#[utoipa::path(
    tag = "console",
    operation_id = "console_logout",
    security(()),
    params(("X-Turnlog-Console" = String, Header, description = "`1`")),
    responses((status = 204, description = "The cookie, cleared")),
)]
#[post("/console/api/logout")]
pub async fn logout(req: HttpRequest) -> Result<HttpResponse, Error> {
    from_console(&req)?;
    let mut gone = cookie(&req, String::new());
    gone.make_removal();
    Ok(HttpResponse::NoContent().cookie(gone).finish())
}

fn with_cookie(req: &HttpRequest, token: Token) -> HttpResponse {
    let expires_at: chrono::DateTime<chrono::Utc> = token.expires.into();
    let mut cookie = cookie(req, token.value);
    let ttl = token.expires.duration_since(SystemTime::now()).unwrap_or_default();
    cookie.set_max_age(time::Duration::seconds(ttl.as_secs() as i64));
    HttpResponse::Ok().cookie(cookie).json(json!({
        "subject": token.caller.subject,
        "admin": token.caller.admin,
        "expires_at": expires_at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
    }))
}

/// HttpOnly (no script reads it), SameSite=Strict (no other site's request carries it),
/// for every path (the event API and its streams), Secure over HTTPS.
fn cookie(req: &HttpRequest, value: String) -> Cookie<'static> {
    Cookie::build(CONSOLE_COOKIE, value)
        .path("/")
        .http_only(true)
        .same_site(SameSite::Strict)
        .secure(req.connection_info().scheme() == "https")
        .finish()
}
