//! A prompt's line to its client: the requests and notifications it sends the editor while
//! it runs (a permission to ask, an update, an `fs/*` or `terminal/*` request), each given
//! up when the prompt is cancelled.

use agent_client_protocol::v1::schema::{
    PermissionOption, RequestPermissionOutcome, RequestPermissionRequest, SessionNotification, SessionUpdate,
    ToolCallUpdate,
};
use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::Client;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

pub struct Line<'a> {
    pub cx: &'a ConnectionTo<Client>,
    pub session: &'a str,
    pub cancel: &'a CancellationToken,
}

/// The option to reject once, which a client that cannot ask is taken to have chosen (for
/// a server tool: see [`Answer::Failed`]).
pub const REJECT_ONCE: &str = "reject-once";

/// How long a request made to clean up (a kill, a release) waits for the client.
const CLEANUP_WAIT: Duration = Duration::from_secs(5);

/// What the user answered a permission request.
pub enum Answer {
    /// The option chosen.
    Chose(String),
    /// The prompt or the client cancelled it.
    Cancelled,
    /// The client could not ask (its error).
    Failed(String),
}

impl Line<'_> {
    pub fn notify(&self, update: SessionUpdate) {
        // Fails only once the client has gone; the log has it all.
        let _ = self.cx.send_notification(SessionNotification::new(self.session.to_string(), update));
    }

    /// Asks the user about `call`, with `options`.
    pub async fn ask(&self, call: ToolCallUpdate, options: Vec<PermissionOption>) -> Answer {
        let request = RequestPermissionRequest::new(self.session.to_string(), call, options);
        match self.request(request).await {
            None => Answer::Cancelled,
            Some(Ok(answer)) => match answer.outcome {
                RequestPermissionOutcome::Selected(selected) => Answer::Chose(selected.option_id.0.to_string()),
                _ => Answer::Cancelled,
            },
            Some(Err(error)) => {
                tracing::warn!(session_id = %self.session, %error, "the client could not ask for a permission");
                Answer::Failed(error.to_string())
            }
        }
    }

    /// A request to the client, unless the prompt is cancelled first (`None`).
    pub async fn request<R: agent_client_protocol::JsonRpcRequest>(
        &self,
        request: R,
    ) -> Option<Result<R::Response, agent_client_protocol::Error>> {
        tokio::select! {
            biased;
            _ = self.cancel.cancelled() => None,
            answer = self.cx.send_request(request).block_task() => Some(answer),
        }
    }

    /// A request to the client that goes on when the prompt is cancelled (one whose effect
    /// the log is to record, or one that cleans up), for at most a while once it is.
    pub async fn request_anyway<R: agent_client_protocol::JsonRpcRequest>(
        &self,
        request: R,
    ) -> Result<R::Response, agent_client_protocol::Error> {
        let answer = self.cx.send_request(request).block_task();
        tokio::pin!(answer);
        tokio::select! {
            answer = &mut answer => return answer,
            _ = self.cancel.cancelled() => {}
        }
        match tokio::time::timeout(CLEANUP_WAIT, answer).await {
            Ok(answer) => answer,
            Err(_) => Err(agent_client_protocol::Error::internal_error()
                .data(format!("no answer {} s after the prompt was cancelled", CLEANUP_WAIT.as_secs()))),
        }
    }
}
