//! The observer console: a small web app, embedded in the binary and served at `/console`,
//! and the few routes of its own that it needs: exchanging a key for a cookie (a browser's
//! `EventSource` sends no headers), and a live list of the caller's sessions. Everything
//! else it reads and sends through the native event API, as any client does.

mod login;
mod sessions;

use actix_web::{get, web, HttpResponse};

use crate::api::error::Standard;
use crate::error::{ApiError, Code};

pub fn routes(cfg: &mut utoipa_actix_web::service_config::ServiceConfig) {
    cfg.service(index)
        .service(index_slash)
        .service(login::whoami)
        .service(login::login)
        .service(login::refresh)
        .service(login::logout)
        .service(sessions::list)
        .service(sessions::stream)
        .service(asset);
}

/// The app's files, as built into the binary.
const FILES: &[(&str, &str, &str)] = &[
    ("index.html", "text/html; charset=utf-8", include_str!("../../../console/index.html")),
    ("app.js", "text/javascript; charset=utf-8", include_str!("../../../console/app.js")),
    ("net.js", "text/javascript; charset=utf-8", include_str!("../../../console/net.js")),
    ("list.js", "text/javascript; charset=utf-8", include_str!("../../../console/list.js")),
    ("session.js", "text/javascript; charset=utf-8", include_str!("../../../console/session.js")),
    ("replay.js", "text/javascript; charset=utf-8", include_str!("../../../console/replay.js")),
    ("render.js", "text/javascript; charset=utf-8", include_str!("../../../console/render.js")),
    ("sections.js", "text/javascript; charset=utf-8", include_str!("../../../console/sections.js")),
    ("table.js", "text/javascript; charset=utf-8", include_str!("../../../console/table.js")),
    ("style.css", "text/css; charset=utf-8", include_str!("../../../console/style.css")),
];

/// Only the app's own files, scripts and connections: nothing from elsewhere, no framing.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
                   img-src 'self' data:; base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

/// The console's page.
#[utoipa::path(
    tag = "console",
    operation_id = "console",
    security(()),
    responses((status = 200, description = "The page", body = String, content_type = "text/html")),
)]
#[get("/console")]
async fn index() -> HttpResponse {
    file("index.html").expect("the console has an index")
}

/// The console's page.
#[utoipa::path(
    tag = "console",
    operation_id = "console_slash",
    security(()),
    responses((status = 200, description = "The page", body = String, content_type = "text/html")),
)]
#[get("/console/")]
async fn index_slash() -> HttpResponse {
    file("index.html").expect("the console has an index")
}

/// One of the console's files.
#[utoipa::path(
    tag = "console",
    operation_id = "console_file",
    security(()),
    params(("file" = String, Path, description = "`index.html`, a script (`app.js`, `net.js`, `list.js`, `session.js`, `replay.js`, `render.js`, `sections.js`, `table.js`) or `style.css`")),
    responses((status = 200, description = "The file", content(
        (String = "text/html"), (String = "text/javascript"), (String = "text/css"),
    ))),
)]
#[get("/console/{file}")]
async fn asset(name: web::Path<String>) -> Result<HttpResponse, crate::api::Error<Standard>> {
    file(&name).ok_or_else(|| ApiError::new(Code::NotFound, format!("the console has no file {name:?}")).into())
}

fn file(name: &str) -> Option<HttpResponse> {
    let (_, content_type, body) = FILES.iter().find(|(file, ..)| *file == name)?;
    Some(
        HttpResponse::Ok()
            .content_type(*content_type)
            .insert_header(("cache-control", "no-cache"))
            .insert_header(("content-security-policy", CSP))
            .insert_header(("x-content-type-options", "nosniff"))
            .insert_header(("referrer-policy", "no-referrer"))
            .body(*body),
    )
}
