//! Approval of tool calls: every call from kernel code is a request the application accepts or
//! rejects before it reaches the MCP server.
//!
//! The executor sets an [`ApprovalPolicy`] per execution: `execute()` accepts all, `stream()`
//! hands each [`ApprovalRequest`] to its caller. Between executions the last policy stays; a
//! streamed execution's channel is closed when it ends, so a call made by a leftover background
//! thread is rejected rather than slipping through unapproved. Waiting is bounded by the approval
//! timeout, and the execution's timeout clock is paused meanwhile.
//!
//! Shell commands (`!cmd`, `%%bash`, ... with `approve_shell_cmds`) are requests too: server name
//! [`SHELL_SERVER_NAME`], tool name [`SHELL_TOOL`] or [`SHELL_MAGIC_TOOL`], arguments
//! `{"cmd": ...}`; [`ApprovalRequest::is_shell_command`] tells them apart from a tool call of an MCP
//! server that happens to be registered as `ipybox`.
//!
//! Not here: the transport that carries calls from the kernel ([`super::server`]).

use std::time::Duration;

use serde_json::{Map, Value};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::pause::TimeoutPause;

/// Default time a tool call waits for an approval decision.
pub const DEFAULT_APPROVAL_TIMEOUT: Duration = Duration::from_secs(60);

/// The server name of shell-command approval requests.
pub const SHELL_SERVER_NAME: &str = "ipybox";
/// The tool name of a line command's request: `!cmd`, `!!cmd`, `x = !cmd`, `%sx`, `%system` and
/// shell aliases.
pub const SHELL_TOOL: &str = "shell";
/// The tool name of a cell magic's request: `%%bash`, `%%sh`, `%%script`, and the other script
/// magics (`%%perl`, `%%ruby`, ...).
pub const SHELL_MAGIC_TOOL: &str = "shell_magic";

/// What kind of action a request is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RequestKind {
    ToolCall,
    ShellCommand,
}

/// A tool call (or a shell command) waiting for a decision. Dropping it without deciding rejects
/// the call.
#[derive(Debug)]
pub struct ApprovalRequest {
    /// The server name the tool was registered under ([`SHELL_SERVER_NAME`] for shell
    /// commands).
    pub server_name: String,
    /// The tool's name as the MCP server knows it ([`SHELL_TOOL`] or [`SHELL_MAGIC_TOOL`] for
    /// shell commands).
    pub tool_name: String,
    /// The arguments exactly as they will be sent (`{"cmd": ...}` for shell commands: the command
    /// after variable expansion, or the cell of a cell magic).
    pub arguments: Map<String, Value>,
    /// For tool calls: the registered server's command line or URL, as recorded at registration
    /// (`${VAR}` placeholders unresolved) — what the call reaches. `None` for shell commands.
    pub server_command: Option<String>,
    /// For tool calls: a fingerprint of the registered server's recorded params (for keying
    /// "allow for the session" by the server that really runs).
    server_identity: Option<String>,
    kind: RequestKind,
    reply: oneshot::Sender<Verdict>,
}

/// The answer sent back to the waiting call.
#[derive(Debug)]
enum Verdict {
    Accept,
    /// Rejected, with the reason the kernel's error carries (if any).
    Reject(Option<String>),
}

impl ApprovalRequest {
    /// Lets the call go ahead.
    pub fn accept(self) {
        let _ = self.reply.send(Verdict::Accept);
    }

    /// Fails the call in the kernel with `ApprovalRejected`.
    pub fn reject(self) {
        let _ = self.reply.send(Verdict::Reject(None));
    }

    /// [`ApprovalRequest::reject`], with a reason appended to the kernel's error message (e.g.
    /// why nobody could be asked).
    pub fn reject_with(self, reason: impl Into<String>) {
        let _ = self.reply.send(Verdict::Reject(Some(reason.into())));
    }

    /// For tool calls, a fingerprint of the registered server's recorded params: two requests
    /// with the same server name but a re-registered server differ here.
    pub fn server_identity(&self) -> Option<&str> {
        self.server_identity.as_deref()
    }

    /// Whether this is a shell command (`approve_shell_cmds`) rather than an MCP tool call.
    pub fn is_shell_command(&self) -> bool {
        self.kind == RequestKind::ShellCommand
    }

    /// The command of a shell-command request.
    pub fn shell_command(&self) -> Option<&str> {
        match self.kind {
            RequestKind::ShellCommand => self.arguments.get("cmd").and_then(Value::as_str),
            RequestKind::ToolCall => None,
        }
    }

    /// `server.tool(arguments)` (or ``shell command `cmd` ``) for prompts and logs.
    pub fn describe(&self) -> String {
        if let Some(cmd) = self.shell_command() {
            return format!("shell command `{cmd}`");
        }
        format!(
            "{}.{}({})",
            self.server_name,
            self.tool_name,
            Value::Object(self.arguments.clone())
        )
    }
}

/// The first `max` characters of `text`, with `…` when cut: long commands and argument values
/// in approval messages and questions.
pub fn shorten(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        None => text.to_string(),
        Some((cut, _)) => format!("{}…", &text[..cut]),
    }
}

/// Who decides about tool calls.
#[derive(Debug, Clone)]
pub(crate) enum ApprovalPolicy {
    /// Every call is approved (the `execute()` and MCP-server behaviour).
    AcceptAll,
    /// Each call is sent to this channel and waits for `accept()` / `reject()`, or until the
    /// token is cancelled (the execution that asks was cancelled): then it is rejected, also
    /// while the application still holds the request.
    Ask(mpsc::UnboundedSender<ApprovalRequest>, CancellationToken),
}

/// What became of a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Decision {
    Accepted,
    /// Rejected, with the decider's reason if it gave one.
    Rejected(Option<String>),
    TimedOut,
}

/// What a decision is asked about.
pub(crate) struct Subject<'a> {
    pub(crate) server_name: &'a str,
    pub(crate) tool_name: &'a str,
    pub(crate) arguments: &'a Map<String, Value>,
    pub(crate) kind: RequestKind,
    /// The registered server a tool call reaches (`None` for shell commands).
    pub(crate) server: Option<&'a super::registry::Registered>,
}

/// Asks for a decision under `policy`, pausing the execution clock while waiting.
pub(crate) async fn decide(
    policy: &ApprovalPolicy,
    subject: Subject<'_>,
    timeout: Duration,
    pause: &TimeoutPause,
) -> Decision {
    let (tx, cancelled) = match policy {
        ApprovalPolicy::AcceptAll => return Decision::Accepted,
        ApprovalPolicy::Ask(tx, cancelled) => (tx, cancelled),
    };
    if cancelled.is_cancelled() {
        return Decision::Rejected(Some(CANCELLED.into()));
    }
    let (reply, decision) = oneshot::channel();
    let request = ApprovalRequest {
        server_name: subject.server_name.to_string(),
        tool_name: subject.tool_name.to_string(),
        arguments: subject.arguments.clone(),
        server_command: subject.server.map(|s| s.target.clone()),
        server_identity: subject.server.map(|s| s.identity.clone()),
        kind: subject.kind,
        reply,
    };
    if tx.send(request).is_err() {
        // Nobody listens: the streamed execution that asked has ended.
        return Decision::Rejected(None);
    }
    let _paused = pause.pause();
    tokio::select! {
        decided = tokio::time::timeout(timeout, decision) => match decided {
            Ok(Ok(Verdict::Accept)) => Decision::Accepted,
            Ok(Ok(Verdict::Reject(reason))) => Decision::Rejected(reason),
            Ok(Err(_)) => Decision::Rejected(None),
            Err(_) => Decision::TimedOut,
        },
        // A late accept() finds the reply channel closed: the call never goes ahead.
        () = cancelled.cancelled() => Decision::Rejected(Some(CANCELLED.into())),
    }
}

/// Why a call waiting for approval was rejected when its execution was cancelled.
const CANCELLED: &str = "the execution was cancelled";
