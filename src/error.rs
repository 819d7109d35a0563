//! The one table of error codes: each knows its HTTP status, its error type and its code.
//! No view's shape is here: each view renders an [`ApiError`] in its own protocol's shape
//! (`api::error` for HTTP, JSON-RPC errors for ACP). 5xx bodies say little and the cause
//! is logged.

use crate::session::{FollowError, SessionError};

macro_rules! codes {
    ($($variant:ident => ($status:literal, $kind:literal, $code:literal),)*) => {
        /// An error code: status, type and code string.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum Code { $($variant,)* }

        impl Code {
            /// Every code, for the OpenAPI document's error answers.
            pub const ALL: &'static [Code] = &[$(Code::$variant,)*];

            /// The HTTP status.
            pub fn status(self) -> u16 {
                match self { $(Code::$variant => $status,)* }
            }
            /// The error type, in the style of the Anthropic and OpenAI APIs.
            pub fn kind(self) -> &'static str {
                match self { $(Code::$variant => $kind,)* }
            }
            /// The stable machine-readable code.
            pub fn code(self) -> &'static str {
                match self { $(Code::$variant => $code,)* }
            }
        }
    };
}

codes! {
    InvalidRequest => (400, "invalid_request_error", "invalid_request"),
    InvalidJson => (400, "invalid_request_error", "invalid_json"),
    Unauthorized => (401, "authentication_error", "unauthorized"),
    Forbidden => (403, "permission_error", "forbidden"),
    NotFound => (404, "not_found_error", "not_found"),
    MethodNotAllowed => (405, "invalid_request_error", "method_not_allowed"),
    SessionNotFound => (404, "not_found_error", "session_not_found"),
    UnknownCursor => (409, "invalid_request_error", "unknown_cursor"),
    Conflict => (409, "invalid_request_error", "conflict"),
    Busy => (409, "invalid_request_error", "turn_running"),
    PreviousTurn => (409, "invalid_request_error", "previous_turn_mismatch"),
    RequestTimeout => (408, "timeout_error", "request_timeout"),
    PayloadTooLarge => (413, "request_too_large", "payload_too_large"),
    LimitExceeded => (422, "invalid_request_error", "limit_exceeded"),
    TooManyStreams => (429, "rate_limit_error", "too_many_streams"),
    Internal => (500, "api_error", "internal_error"),
    Unavailable => (503, "overloaded_error", "unavailable"),
}

/// An error as every view sees it: a code and a message naming what was wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ApiError {
    pub code: Code,
    pub message: String,
}

impl ApiError {
    pub fn new(code: Code, message: impl Into<String>) -> ApiError {
        ApiError { code, message: message.into() }
    }

    pub fn invalid(message: impl Into<String>) -> ApiError {
        ApiError::new(Code::InvalidRequest, message)
    }

    /// A server-side failure: the cause goes to the log, the client gets a short message.
    pub fn internal(cause: impl std::fmt::Display) -> ApiError {
        tracing::error!(%cause, "request failed");
        ApiError::new(Code::Internal, "internal error; the cause is in the server log")
    }
}

impl From<SessionError> for ApiError {
    fn from(error: SessionError) -> ApiError {
        let message = error.to_string();
        match error {
            SessionError::NotFound(_) => ApiError::new(Code::SessionNotFound, message),
            SessionError::TurnNotFound { .. } | SessionError::CatalogNotFound(_) => {
                ApiError::new(Code::NotFound, message)
            }
            SessionError::UnknownCursor(_) => ApiError::new(Code::UnknownCursor, message),
            SessionError::Conflict(_) => ApiError::new(Code::Conflict, message),
            SessionError::Busy(_) => ApiError::new(Code::Busy, message),
            SessionError::PreviousTurn(_) => ApiError::new(Code::PreviousTurn, message),
            SessionError::Invalid(_) => ApiError::new(Code::InvalidRequest, message),
            SessionError::Limit(_) => ApiError::new(Code::LimitExceeded, message),
            SessionError::TooLarge(_) => ApiError::new(Code::PayloadTooLarge, message),
            SessionError::Forbidden(_) => ApiError::new(Code::Forbidden, message),
            SessionError::ShuttingDown | SessionError::Retry(_) | SessionError::Unavailable(_) => {
                ApiError::new(Code::Unavailable, message)
            }
            // The engine under a shared log is out of reach for now: try again.
            SessionError::Storage(cause) if cause.is_unavailable() => ApiError::new(Code::Unavailable, message),
            SessionError::Storage(cause) => ApiError::internal(cause),
        }
    }
}

impl From<FollowError> for ApiError {
    fn from(error: FollowError) -> ApiError {
        match error {
            FollowError::Backlog { .. } => ApiError::new(Code::Conflict, error.to_string()),
            FollowError::Storage(cause) if cause.is_unavailable() => {
                ApiError::new(Code::Unavailable, cause.to_string())
            }
            FollowError::Storage(cause) => ApiError::internal(cause),
        }
    }
}
