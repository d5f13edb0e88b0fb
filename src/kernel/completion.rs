//! When a request to the kernel is complete: iopub reported `status: idle` for it AND its reply
//! arrived on the shell channel. The two travel on different sockets in no fixed order, and
//! output (iopub) can arrive after the reply; waiting for both is what makes "no output is ever
//! dropped" hold. One rule for every request ipybox makes: executions, the settling of an
//! abandoned execution, and the `kernel_info` handshake at start.
//!
//! Not here: what to do with the messages (output assembly is [`super::output`]).

use jupyter_protocol::{ExecutionState, JupyterMessage, JupyterMessageContent};

/// Tracks one request (or several retries of the same request, for `kernel_info`).
#[derive(Debug)]
pub(crate) struct Completion {
    ids: Vec<String>,
    idle: bool,
    reply: Option<JupyterMessageContent>,
}

impl Completion {
    pub(crate) fn new(msg_id: impl Into<String>) -> Self {
        Self {
            ids: vec![msg_id.into()],
            idle: false,
            reply: None,
        }
    }

    /// A retry of the same request: its messages count too.
    pub(crate) fn also(&mut self, msg_id: impl Into<String>) {
        self.ids.push(msg_id.into());
    }

    /// Whether `msg` answers one of the tracked requests.
    pub(crate) fn is_ours(&self, msg: &JupyterMessage) -> bool {
        msg.parent_header
            .as_ref()
            .is_some_and(|h| self.ids.contains(&h.msg_id))
    }

    /// Notes an iopub message; returns whether it belongs to the request.
    pub(crate) fn on_iopub(&mut self, msg: &JupyterMessage) -> bool {
        let ours = self.is_ours(msg);
        if ours
            && let JupyterMessageContent::Status(s) = &msg.content
            && s.execution_state == ExecutionState::Idle
        {
            self.idle = true;
        }
        ours
    }

    /// Notes a shell message; the request's reply is kept.
    pub(crate) fn on_shell(&mut self, msg: JupyterMessage) {
        if self.reply.is_none() && self.is_ours(&msg) {
            self.reply = Some(msg.content);
        }
    }

    /// Whether the idle status of one of the tracked requests arrived.
    pub(crate) fn idle_seen(&self) -> bool {
        self.idle
    }

    pub(crate) fn is_complete(&self) -> bool {
        self.idle && self.reply.is_some()
    }

    /// The reply, once it arrived.
    pub(crate) fn reply(&self) -> Option<&JupyterMessageContent> {
        self.reply.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use jupyter_protocol::{ExecuteReply, ExecuteRequest, ReplyStatus, Status};

    fn child(parent: &JupyterMessage, content: JupyterMessageContent) -> JupyterMessage {
        JupyterMessage::new(content, Some(parent))
    }

    #[test]
    fn needs_idle_and_reply_in_either_order() {
        let request: JupyterMessage = ExecuteRequest::new("1".into()).into();
        let other: JupyterMessage = ExecuteRequest::new("2".into()).into();
        let idle = || {
            JupyterMessageContent::Status(Status {
                execution_state: ExecutionState::Idle,
            })
        };
        let reply = || {
            JupyterMessageContent::ExecuteReply(ExecuteReply {
                status: ReplyStatus::Ok,
                execution_count: Default::default(),
                payload: vec![],
                user_expressions: None,
                error: None,
            })
        };
        let mut c = Completion::new(request.header.msg_id.clone());
        // Another request's idle and reply do not count.
        assert!(!c.on_iopub(&child(&other, idle())));
        c.on_shell(child(&other, reply()));
        assert!(!c.is_complete());
        // Reply first, then idle.
        c.on_shell(child(&request, reply()));
        assert!(!c.is_complete(), "output may still come before idle");
        assert!(c.on_iopub(&child(&request, idle())));
        assert!(c.is_complete());
        // Idle first, then reply.
        let mut c = Completion::new(request.header.msg_id.clone());
        c.on_iopub(&child(&request, idle()));
        assert!(!c.is_complete());
        c.on_shell(child(&request, reply()));
        assert!(c.is_complete());
    }
}
