//! Who calls, and the session the call is about: the extractors every handler starts with.
//! Each answers in the shape of its view's renderer `R`, so that a request turned away
//! before its handler runs looks like any other error of that view.

use std::future::{ready, Ready};
use std::marker::PhantomData;

use actix_web::{dev::Payload, web, FromRequest, HttpRequest};
use futures_util::future::LocalBoxFuture;
use serde::Deserialize;

use super::auth::request_caller;
use super::error::{Error, Render, Standard};
use super::state::State;
use crate::error::{ApiError, Code};
use crate::projection::SessionSummary;
use crate::session::Caller;

/// The caller a request's key names; a missing or unknown key is answered (401) in the
/// shape of the view's renderer `R`.
pub struct Auth<R: Render = Standard>(pub Caller, pub PhantomData<fn() -> R>);

impl<R: Render> FromRequest for Auth<R> {
    type Error = Error<R>;
    type Future = Ready<Result<Auth<R>, Error<R>>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        let state = req.app_data::<State>().expect("app state is registered");
        ready(request_caller(&state.auth, req).map(|caller| Auth(caller, PhantomData)).map_err(Error::new))
    }
}

/// The session the path names (`{session_id}`), as its caller may see it: the caller is
/// authenticated (401), then the session is loaded with its ownership checked (404: another
/// subject's session is as absent as one that never was), each in view `R`'s shape.
///
/// Put it first among a handler's extractors: actix polls them together, and with the
/// session known before the body is read, a request about a session the caller may not
/// see is a 404 whatever its body.
pub struct CallerSession<R: Render = Standard> {
    pub caller: Caller,
    pub summary: SessionSummary,
    render: PhantomData<fn() -> R>,
}

/// The path's session id, decoded as `web::Path` decodes it; a route's other parameters
/// (`turn_id`) are read by its handler.
#[derive(Deserialize)]
struct SessionPath {
    session_id: String,
}

impl<R: Render> FromRequest for CallerSession<R> {
    type Error = Error<R>;
    type Future = LocalBoxFuture<'static, Result<CallerSession<R>, Error<R>>>;

    fn from_request(req: &HttpRequest, payload: &mut Payload) -> Self::Future {
        let state = req.app_data::<State>().expect("app state is registered").clone();
        let caller = request_caller(&state.auth, req);
        let path = web::Path::<SessionPath>::from_request(req, payload).into_inner();
        Box::pin(async move {
            let caller = caller.map_err(Error::new)?;
            let path = path.map_err(|_| ApiError::new(Code::NotFound, "the path names no session"))?;
            let summary = state.sessions.get(&caller, &path.session_id).await?;
            Ok(CallerSession { caller, summary, render: PhantomData })
        })
    }
}
