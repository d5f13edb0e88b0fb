//! Tools: everything between generated tool code in the kernel and upstream MCP servers.
//!
//! This module owns the MCP *client* side: parsing server params ([`params`]), `${VAR}`
//! substitution (`env_subst`), connecting to upstream servers over stdio, streamable HTTP and
//! legacy SSE (`client`, `sse_transport`) and the per-server session cache ([`sessions`]);
//! the tool server the kernel calls through (`server`) and approvals (`approval`).
//!
//! It is not the MCP server ipybox itself exposes (that is `mcp_server`), and it does not
//! generate Python code from tool schemas (that is `apigen`).

pub(crate) mod approval;
pub(crate) mod client;
pub(crate) mod env_subst;
pub mod params;
pub(crate) mod protocol;
pub(crate) mod registry;
pub(crate) mod server;
pub mod sessions;
pub mod shown;
pub(crate) mod sse_transport;
pub(crate) mod stdin_channel;

use std::time::Duration;

pub(crate) use approval::ApprovalPolicy;
pub(crate) use approval::CallLog;
#[doc(hidden)]
pub use approval::testing;
pub use approval::{
    Answer, ApprovalRequest, CallRecord, DEFAULT_APPROVAL_TIMEOUT, MAX_OUTSTANDING_PROMPTS,
    SHELL_MAGIC_TOOL, SHELL_SERVER_NAME, SHELL_TOOL, magic_line, shorten,
};
pub use client::{McpSession, STDIO_BASE_ENV, ToolOutput, tool_output};
pub use env_subst::substitute;
pub use params::{ServerParams, TransportKind, TransportParams};
pub use sessions::{SessionCache, SharedMcpServers};

/// Default time allowed for spawning/contacting an MCP server and completing the MCP handshake.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// Errors of the MCP client side.
///
/// Messages follow cargo/uv: what failed, why, what to do. They never contain values that came
/// from `${VAR}` substitution (those are replaced by `***`), so they are safe to show and log.
/// The type is `Clone` (all causes are kept as text) so that one failed connect can be reported
/// to every caller that was waiting for it.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum ToolsError {
    /// The server params are malformed (unknown key, wrong type, missing `command`/`url`, ...).
    #[error("invalid MCP server params: {problem}\n  help: {help}")]
    InvalidParams { problem: String, help: String },

    /// A `${NAME}` placeholder names a variable that is not set.
    #[error(
        "environment variable `{name}` is not set (referenced as `${{{name}}}` at `{at}` in the server params)\n  help: set `{name}` in the environment or in the workspace's `.env`, or remove the reference"
    )]
    MissingVariable { name: String, at: String },

    /// A `${...}` placeholder is malformed.
    #[error(
        "invalid placeholder at `{at}` in the server params: {problem}\n  help: placeholders look like `${{NAME}}` (letters, digits and `_`); write `$${{` for a literal `${{`"
    )]
    InvalidPlaceholder { at: String, problem: String },

    /// The server could not be started or the MCP handshake failed.
    #[error(
        "failed to connect to MCP server {target} ({transport})\n  caused by: {reason}{}\n  help: {help}",
        stderr_section(.stderr)
    )]
    Connect {
        target: String,
        transport: &'static str,
        reason: String,
        stderr: Option<String>,
        help: String,
    },

    /// Spawn + handshake did not finish within the connect timeout.
    #[error(
        "timed out after {:.1}s connecting to MCP server {target} ({transport}): the server did not complete the MCP handshake{}\n  help: check that the server speaks MCP over {transport} at this address/command, or raise the connect timeout",
        .timeout.as_secs_f64(),
        stderr_section(.stderr)
    )]
    Timeout {
        target: String,
        transport: &'static str,
        timeout: Duration,
        stderr: Option<String>,
    },

    /// The sessions were closed (reset or stop) after the call began; it was not made.
    #[error(
        "the call to MCP server {target} was not made: ipybox was reset or stopped while it waited\n  help: run the code again (calls from threads of a previous kernel end here)"
    )]
    Closed { target: String },

    /// A request on an established session failed (transport closed, protocol error, ...).
    #[error("MCP request `{method}` to server {target} failed: {reason}{}", stderr_section(.stderr))]
    Request {
        target: String,
        method: String,
        reason: String,
        stderr: Option<String>,
    },
}

impl ToolsError {
    /// The error without the server's stderr (of a server shared by several executors, whose
    /// stderr may be about another's calls).
    pub(crate) fn without_stderr(self) -> Self {
        match self {
            ToolsError::Request {
                target,
                method,
                reason,
                stderr: Some(_),
            } => ToolsError::Request {
                target,
                method,
                reason: format!(
                    "{reason} (its stderr is not shown: the server is shared with other sessions)"
                ),
                stderr: None,
            },
            other => other,
        }
    }
}

fn stderr_section(stderr: &Option<String>) -> String {
    match stderr.as_deref().map(str::trim_end) {
        Some(s) if !s.is_empty() => {
            let mut out = String::from("\n  server stderr (tail):");
            for line in s.lines() {
                out.push_str("\n    | ");
                out.push_str(line);
            }
            out
        }
        _ => String::new(),
    }
}
