//! The one table of error codes: each knows its HTTP status, its error type and its code;
//! and [`SessionError`], what the layers under the views answer, mapped onto it once. No
//! view's shape is here: each view renders an [`ApiError`] in its own protocol's shape
//! (`api::error` for HTTP, JSON-RPC errors for ACP). 5xx bodies say little and the cause
//! is logged.

use crate::domain::SessionId;
use crate::store::follow::FollowError;
use crate::store::{AppendError, StoreError};

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
    KeyReused => (422, "invalid_request_error", "idempotency_key_reused"),
    TooManyStreams => (429, "rate_limit_error", "too_many_streams"),
    Internal => (500, "api_error", "internal_error"),
    Unavailable => (503, "overloaded_error", "unavailable"),
    FateUnknown => (504, "api_error", "write_fate_unknown"),
}

/// What the session layer and the engine answer when they do not do what was asked:
/// refusals a client can act on, and failures of the log underneath.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("session {0} not found")]
    NotFound(String),
    #[error("turn {turn} not found in session {session}")]
    TurnNotFound { turn: String, session: String },
    /// Something a session names that is not there: an agent or environment of the
    /// catalog, an MCP server of the session.
    #[error("{0} not found")]
    CatalogNotFound(String),
    #[error("{0} is not an event of this session")]
    UnknownCursor(String),
    #[error("{0}")]
    Conflict(String),
    /// A turn runs, and the input needs the session idle.
    #[error("{0}")]
    Busy(String),
    /// The turn the client named as the one its new turn follows is not the session's last.
    #[error("{0}")]
    PreviousTurn(String),
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    Limit(String),
    /// A piece of input would be stored as an event larger than `limits.max_event_bytes`.
    #[error("{0}")]
    TooLarge(String),
    /// Something the request needs cannot be reached now (an MCP server): try again later.
    #[error("{0}")]
    Unavailable(String),
    /// The caller may see the session but not do this.
    #[error("{0}")]
    Forbidden(String),
    /// The request's `Idempotency-Key` named another request (another route or body).
    #[error("{0}")]
    KeyReused(String),
    /// The log did not say whether a write was stored (an engine failing over for longer
    /// than the wait): sending it again without a key might store it twice.
    #[error("{0}")]
    FateUnknown(String),
    #[error("the service is shutting down")]
    ShuttingDown,
    #[error(transparent)]
    Storage(#[from] StoreError),
}

impl SessionError {
    /// Whether what was asked could not be done for now (an engine out of reach, an MCP
    /// server down), and may be asked again.
    pub fn is_unavailable(&self) -> bool {
        match self {
            SessionError::Unavailable(_) => true,
            SessionError::Storage(cause) => cause.is_unavailable(),
            _ => false,
        }
    }

    /// Why an append to `session` was not made, as the layers above the log answer it.
    pub fn from_append(session: SessionId, error: AppendError) -> SessionError {
        match error {
            // A terminated log belongs to a deleted session.
            AppendError::Closed => SessionError::NotFound(session.to_string()),
            AppendError::TooManyEvents { .. } => SessionError::Limit(error.to_string()),
            AppendError::ShuttingDown => SessionError::ShuttingDown,
            AppendError::OutOfTurn { .. } => SessionError::Storage(StoreError::new(error)),
            AppendError::Malformed(message) => SessionError::Invalid(message),
            AppendError::Storage(message) => SessionError::Storage(StoreError::new(message)),
            AppendError::Unavailable(message) => SessionError::Unavailable(message),
            AppendError::FateUnknown(message) => SessionError::FateUnknown(message),
            // Between nodes, not the client's doing: not stored, and safe to send again (503).
            AppendError::Raced(message) => SessionError::Unavailable(format!("{message}; send it again")),
        }
    }
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
            SessionError::KeyReused(_) => ApiError::new(Code::KeyReused, message),
            SessionError::FateUnknown(_) => ApiError::new(Code::FateUnknown, message),
            SessionError::ShuttingDown | SessionError::Unavailable(_) => ApiError::new(Code::Unavailable, message),
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
