//! What a call to a server can come to besides its answer: the server out of reach, a
//! refusal in turnlog's error shape, an answer that broke off or does not decode.

use serde::Deserialize;

/// Why a call did not get its answer.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// No answer: the server could not be reached, or the connection failed before the
    /// answer's head (`{base}: {error}`).
    #[error("{base}: {error}")]
    Unreachable {
        base: String,
        #[source]
        error: reqwest::Error,
    },
    /// The server answered with an error status.
    #[error("the server answered {}: {}", .0.status, .0.message())]
    Refused(Refusal),
    /// The answer's body broke off, or does not decode as the route's answer.
    #[error(transparent)]
    Body(reqwest::Error),
    /// An event stream broke off, or is not SSE.
    #[error(transparent)]
    Stream(eventsource_stream::EventStreamError<reqwest::Error>),
    /// The server ended an event stream before the session ended.
    #[error("the server closed the stream")]
    Closed,
    /// A stream that dropped could not be opened again in the attempts allowed.
    #[error("the event stream is gone: {attempts} attempts to open it again failed; the last: {last}")]
    GaveUp { attempts: u32, last: Box<ClientError> },
    /// An answer that decodes but says something no turnlog server says.
    #[error("{0}")]
    Invalid(String),
}

impl ClientError {
    /// Whether the same call may succeed later: the server was out of reach, failed
    /// (5xx), or dropped the connection. A refusal (4xx) stands.
    pub fn is_transient(&self) -> bool {
        match self {
            ClientError::Refused(refusal) => !refusal.status.is_client_error(),
            ClientError::Unreachable { .. } | ClientError::Body(_) | ClientError::Stream(_) | ClientError::Closed => {
                true
            }
            ClientError::GaveUp { .. } | ClientError::Invalid(_) => false,
        }
    }

    /// The refusal, if the server refused.
    pub fn refusal(&self) -> Option<&Refusal> {
        match self {
            ClientError::Refused(refusal) => Some(refusal),
            _ => None,
        }
    }
}

/// An error answer: its status and, where the body is turnlog's error shape
/// (`{"type":"error","error":{"type","code","message"}}`), what it says.
#[derive(Debug, Clone)]
pub struct Refusal {
    pub status: reqwest::StatusCode,
    /// The error's type (`invalid_request_error`, `not_found_error`, ...).
    pub kind: Option<String>,
    /// The code of turnlog's table of errors (`unknown_cursor`, `turn_running`, ...).
    pub code: Option<String>,
    pub message: Option<String>,
}

#[derive(Deserialize)]
struct ErrorBody {
    error: ErrorFields,
}

#[derive(Deserialize)]
struct ErrorFields {
    #[serde(rename = "type")]
    kind: Option<String>,
    code: Option<String>,
    message: Option<String>,
}

impl Refusal {
    /// Reads an error answer; a body that is not turnlog's error shape (a proxy's page, or
    /// none) leaves only the status.
    pub(super) async fn read(response: reqwest::Response) -> Refusal {
        let status = response.status();
        Refusal::parse(status, &response.bytes().await.unwrap_or_default())
    }

    fn parse(status: reqwest::StatusCode, body: &[u8]) -> Refusal {
        let fields = serde_json::from_slice::<ErrorBody>(body).ok().map(|body| body.error);
        let (kind, code, message) = fields.map_or((None, None, None), |f| (f.kind, f.code, f.message));
        Refusal { status, kind, code, message }
    }

    /// The message, or `no message` when the answer had none.
    pub fn message(&self) -> &str {
        self.message.as_deref().unwrap_or("no message")
    }

    /// Whether the error's code is `code`.
    pub fn is(&self, code: &str) -> bool {
        self.code.as_deref() == Some(code)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(status: u16, body: &str) -> ClientError {
        ClientError::Refused(Refusal::parse(reqwest::StatusCode::from_u16(status).unwrap(), body.as_bytes()))
    }

    #[test]
    fn a_refusal_says_its_status_and_message_and_only_4xx_stands() {
        let body = r#"{"type":"error","error":{"type":"not_found_error","code":"not_found","message":"no sess_1"}}"#;
        let gone = refusal(404, body);
        assert_eq!(gone.to_string(), "the server answered 404 Not Found: no sess_1");
        assert!(!gone.is_transient());
        assert!(gone.refusal().unwrap().is("not_found"));
        assert_eq!(gone.refusal().unwrap().kind.as_deref(), Some("not_found_error"));
        let failed = refusal(503, "<html>a proxy's page</html>");
        assert_eq!(failed.to_string(), "the server answered 503 Service Unavailable: no message");
        assert!(failed.is_transient());
        assert!(ClientError::Closed.is_transient());
    }
}
