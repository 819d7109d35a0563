//! A prompt's line to its client: the requests and notifications it sends the editor while
//! it runs (a permission to ask, an update, an `fs/*` or `terminal/*` request), each given
//! up when the prompt is cancelled.

use agent_client_protocol::v1::schema::{
    PermissionOption, RequestPermissionOutcome, RequestPermissionRequest, SessionNotification, SessionUpdate,
    ToolCallUpdate,
};
use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::Client;
use tokio_util::sync::CancellationToken;

pub struct Line<'a> {
    pub cx: &'a ConnectionTo<Client>,
    pub session: &'a str,
    pub cancel: &'a CancellationToken,
}

/// The option a client that cannot ask is taken to have chosen.
pub const REJECT_ONCE: &str = "reject-once";

impl Line<'_> {
    pub fn notify(&self, update: SessionUpdate) {
        // Fails only once the client has gone; the log has it all.
        let _ = self.cx.send_notification(SessionNotification::new(self.session.to_string(), update));
    }

    /// Asks the user about `call`, with `options`; the option chosen (`None`: the prompt or
    /// the client cancelled). A client that cannot ask rejects, once.
    pub async fn ask(&self, call: ToolCallUpdate, options: Vec<PermissionOption>) -> Option<String> {
        let request = RequestPermissionRequest::new(self.session.to_string(), call, options);
        match self.request(request).await? {
            Ok(answer) => match answer.outcome {
                RequestPermissionOutcome::Selected(selected) => Some(selected.option_id.0.to_string()),
                _ => None,
            },
            Err(error) => {
                // Not the user's cancel: the client could not ask. Rejected, once.
                tracing::warn!(session_id = %self.session, %error, "the permission request failed; rejecting the call");
                Some(REJECT_ONCE.to_string())
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

    /// A request to the client that is made even once the prompt is cancelled (to clean up).
    pub async fn request_anyway<R: agent_client_protocol::JsonRpcRequest>(
        &self,
        request: R,
    ) -> Result<R::Response, agent_client_protocol::Error> {
        self.cx.send_request(request).block_task().await
    }
}
