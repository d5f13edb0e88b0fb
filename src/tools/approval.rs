//! Approval of tool calls: every call from kernel code is a request the application accepts or
//! rejects before it reaches the MCP server.
//!
//! The executor sets an [`ApprovalPolicy`] per execution: `execute()` accepts all, `stream()`
//! hands each [`ApprovalRequest`] to its caller. Between executions the last policy stays; a
//! streamed execution's channel is closed when it ends, so a call made by a leftover background
//! thread is rejected rather than slipping through unapproved. Waiting is bounded by the approval
//! timeout, and the execution's timeout clock is paused meanwhile.
//!
//! Not here: the transport that carries calls from the kernel ([`super::server`]).

use std::time::Duration;

use serde_json::{Map, Value};
use tokio::sync::{mpsc, oneshot};

use crate::pause::TimeoutPause;

/// Default time a tool call waits for an approval decision.
pub const DEFAULT_APPROVAL_TIMEOUT: Duration = Duration::from_secs(60);

/// A tool call waiting for a decision. Dropping it without deciding rejects the call.
#[derive(Debug)]
pub struct ApprovalRequest {
    /// The server name the tool was registered under.
    pub server_name: String,
    /// The tool's name as the MCP server knows it.
    pub tool_name: String,
    /// The arguments exactly as they will be sent.
    pub arguments: Map<String, Value>,
    reply: oneshot::Sender<bool>,
}

impl ApprovalRequest {
    /// Lets the call go ahead.
    pub fn accept(self) {
        let _ = self.reply.send(true);
    }

    /// Fails the call in the kernel with `ApprovalRejected`.
    pub fn reject(self) {
        let _ = self.reply.send(false);
    }

    /// `server.tool(arguments)` for prompts and logs.
    pub fn describe(&self) -> String {
        format!(
            "{}.{}({})",
            self.server_name,
            self.tool_name,
            Value::Object(self.arguments.clone())
        )
    }
}

/// Who decides about tool calls.
#[derive(Debug, Clone)]
pub(crate) enum ApprovalPolicy {
    /// Every call is approved (the `execute()` and MCP-server behaviour).
    AcceptAll,
    /// Each call is sent to this channel and waits for `accept()` / `reject()`.
    Ask(mpsc::UnboundedSender<ApprovalRequest>),
}

/// What became of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decision {
    Accepted,
    Rejected,
    TimedOut,
}

/// Asks for a decision under `policy`, pausing the execution clock while waiting.
pub(crate) async fn decide(
    policy: &ApprovalPolicy,
    server_name: &str,
    tool_name: &str,
    arguments: &Map<String, Value>,
    timeout: Duration,
    pause: &TimeoutPause,
) -> Decision {
    let tx = match policy {
        ApprovalPolicy::AcceptAll => return Decision::Accepted,
        ApprovalPolicy::Ask(tx) => tx,
    };
    let (reply, decision) = oneshot::channel();
    let request = ApprovalRequest {
        server_name: server_name.to_string(),
        tool_name: tool_name.to_string(),
        arguments: arguments.clone(),
        reply,
    };
    if tx.send(request).is_err() {
        // Nobody listens: the streamed execution that asked has ended.
        return Decision::Rejected;
    }
    let _paused = pause.pause();
    match tokio::time::timeout(timeout, decision).await {
        Ok(Ok(true)) => Decision::Accepted,
        Ok(Ok(false)) | Ok(Err(_)) => Decision::Rejected,
        Err(_) => Decision::TimedOut,
    }
}
