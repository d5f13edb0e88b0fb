//! One connected MCP client session ([`McpSession`]) to an upstream server, over stdio,
//! streamable HTTP or legacy SSE, plus [`tool_output`], which flattens a tool result into what
//! the kernel receives.
//!
//! stdio servers run as children with a minimal environment: the variables in
//! [`STDIO_BASE_ENV`] copied from the caller's env map, then the params' `env`. The child's stdout
//! is the protocol pipe (never ours); its stderr is captured and the last
//! [`crate::child_process::STDERR_TAIL_BYTES`] are kept for error messages. Each child leads its
//! own process group ([`crate::child_process`]);
//! the group is terminated when the session is closed and killed when it is dropped. (If the
//! ipybox process itself is SIGKILLed, children notice only through stdin EOF.)
//!
//! Connecting resolves `${VAR}` placeholders; everything that substitution produced is scrubbed
//! from error text. Logs show the params as written. Not here: caching sessions
//! ([`super::sessions`]), approvals, and the tool server the kernel talks to.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResult, ClientCapabilities, ClientConfig, ContentBlock,
    Implementation, ProtocolVersion, ResourceContents, Tool,
};
use rmcp::service::{RunningService, ServiceError};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{RoleClient, serve_client};
use serde_json::{Map, Value};

use super::ToolsError;
use super::env_subst::{Redactor, substitute_str};
use super::params::{ServerParams, TransportKind, TransportParams};
use super::sse_transport::SseClientTransport;
use crate::child_process::{StderrTail, host_command, own_group};
use crate::group_leader::GroupLeader;

/// Environment variables passed from the caller's env map to stdio servers (when set), with
/// [`crate::host_env::NETWORK`], before the params' own `env`. Everything else (API keys, cloud credentials, ...) stays out unless the
/// params name it.
pub const STDIO_BASE_ENV: &[&str] = &[
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "TERM", "LANG", "LC_ALL", "LC_CTYPE", "TMPDIR",
    "TZ",
];

/// A connected MCP client session.
pub struct McpSession {
    running: RunningService<RoleClient, ClientConfig>,
    child: Mutex<Option<ChildProc>>,
    pid: Option<u32>,
    stderr: Option<StderrTail>,
    target: String,
    kind: TransportKind,
    redactor: Redactor,
}

impl std::fmt::Debug for McpSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpSession")
            .field("target", &self.target)
            .field("transport", &self.kind)
            .field("pid", &self.pid)
            .finish_non_exhaustive()
    }
}

fn client_config() -> ClientConfig {
    ClientConfig::new(
        ClientCapabilities::default(),
        Implementation::new("ipybox", env!("CARGO_PKG_VERSION")),
    )
    .with_protocol_version(ProtocolVersion::LATEST_WITH_INITIALIZE)
}

/// Formats an error with its `source()` chain, deduplicating repeated messages.
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        let m = s.to_string();
        if !out.contains(&m) {
            out.push_str(": ");
            out.push_str(&m);
        }
        cur = s.source();
    }
    out
}

/// Describes a failed handshake: the transport's own error (root cause included) rather than
/// rmcp's wrapper text with type names.
fn init_error_text(e: &rmcp::service::ClientInitializeError) -> String {
    use rmcp::service::ClientInitializeError as E;
    use rmcp::transport::streamable_http_client::StreamableHttpError;
    match e {
        E::TransportError { error, context } => {
            let inner: &(dyn std::error::Error + 'static) = error.error.as_ref();
            let text = match inner.downcast_ref::<StreamableHttpError<reqwest::Error>>() {
                Some(StreamableHttpError::Client(re)) => error_chain(re),
                _ => error_chain(inner),
            };
            format!("{text} (while trying to {context})")
        }
        other => error_chain(other),
    }
}

impl McpSession {
    /// Connects to the server: resolves `${VAR}` from `env`, spawns or contacts it and completes
    /// the MCP handshake, all within `timeout`.
    pub async fn connect(
        params: &ServerParams,
        env: &HashMap<String, String>,
        timeout: Duration,
    ) -> Result<Self, ToolsError> {
        Self::connect_named(None, params, env, timeout).await
    }

    /// [`Self::connect`] with the server's configured name, used in messages.
    pub async fn connect_named(
        name: Option<&str>,
        params: &ServerParams,
        env: &HashMap<String, String>,
        timeout: Duration,
    ) -> Result<Self, ToolsError> {
        let target = match name {
            Some(n) => format!("`{n}` ({})", params.target()),
            None => params.target(),
        };
        tracing::debug!(server = ?name, params = ?params, "connecting to MCP server");
        let started = std::time::Instant::now();
        let session = match &params.transport {
            TransportParams::Stdio {
                command,
                args,
                env: penv,
                cwd,
            } => connect_stdio(target, command, args, penv, cwd.as_deref(), env, timeout).await,
            TransportParams::Http { kind, url, headers } => {
                connect_http(target, *kind, url, headers, env, timeout).await
            }
        }?;
        tracing::debug!(
            server = ?name,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "connected to MCP server"
        );
        Ok(session)
    }

    /// The transport in use.
    pub fn kind(&self) -> TransportKind {
        self.kind
    }

    /// The stdio child's pid (None for HTTP servers).
    pub fn pid(&self) -> Option<u32> {
        self.pid
    }

    /// The server's identity and capabilities from the handshake.
    pub fn server_info(&self) -> Option<Arc<rmcp::model::ServerPeerInfo>> {
        self.running.peer_info()
    }

    /// True once the connection is gone (server exited, stream closed, or closed by us).
    pub fn is_closed(&self) -> bool {
        self.running.is_closed() || self.running.is_transport_closed()
    }

    /// The captured tail of the stdio server's stderr (secrets redacted).
    pub fn stderr_tail(&self) -> Option<String> {
        self.stderr
            .as_ref()
            .map(|s| self.redactor.redact(&s.text()))
    }

    fn request_error(&self, method: &str, e: ServiceError) -> ToolsError {
        let stderr = if self.is_closed() {
            self.stderr_tail()
        } else {
            None
        };
        ToolsError::Request {
            target: self.target.clone(),
            method: method.to_string(),
            reason: self.redactor.redact(&error_chain(&e)),
            stderr,
        }
    }

    /// Lists all tools (following pagination).
    pub async fn list_tools(&self) -> Result<Vec<Tool>, ToolsError> {
        self.running
            .peer()
            .list_all_tools()
            .await
            .map_err(|e| self.request_error("tools/list", e))
    }

    /// Calls a tool by its original name. A tool-level failure is an `Ok` result with
    /// `is_error: Some(true)`; `Err` means the request itself failed.
    pub async fn call_tool(
        &self,
        name: &str,
        arguments: Map<String, Value>,
    ) -> Result<CallToolResult, ToolsError> {
        let params = CallToolRequestParams::new(name.to_string()).with_arguments(arguments);
        self.running
            .call_tool(params)
            .await
            .map_err(|e| self.request_error("tools/call", e))
    }

    /// Closes the session; a stdio child gets stdin EOF, then SIGTERM, then SIGKILL (to its
    /// whole process group) and is reaped before this returns.
    pub async fn close(self) {
        self.shutdown().await;
    }

    /// Like [`Self::close`] through a shared reference (for sessions behind an `Arc`). In-flight
    /// requests fail with "transport closed".
    pub async fn shutdown(&self) {
        self.running.cancellation_token().cancel();
        let child = self.child.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(mut child) = child {
            child.terminate().await;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// stdio

/// A spawned stdio server, leader of its own process group; signalled only until it is reaped
/// (when what is left of its group is killed), and killed with its group when dropped unreaped
/// ([`GroupLeader`]).
struct ChildProc {
    leader: Arc<GroupLeader>,
    reader: Option<tokio::task::JoinHandle<()>>,
}

impl ChildProc {
    /// Waits up to `d` for the child to exit (then reaps it; the rest of its group is killed).
    async fn wait_for(&self, d: Duration) -> Option<std::process::ExitStatus> {
        self.leader.wait_for(d).await
    }

    /// Graceful-then-forceful termination of the whole group; reaps the child.
    async fn terminate(&mut self) {
        if self.wait_for(Duration::from_millis(500)).await.is_none() {
            self.leader.signal(libc::SIGTERM);
            if self.wait_for(Duration::from_secs(1)).await.is_none() {
                self.leader.signal(libc::SIGKILL);
                let _ = self.wait_for(Duration::from_secs(2)).await;
            }
        }
        // Grandchildren that outlived the leader were killed when it was reaped.
        if let Some(r) = self.reader.take() {
            let _ = tokio::time::timeout(Duration::from_secs(1), r).await;
        }
    }

    /// Kills the group now and collects the stderr reader (for error reports).
    async fn kill_and_collect(&mut self) -> Option<std::process::ExitStatus> {
        // Give a crashing server a moment to finish exiting so its status is known.
        let status = self.wait_for(Duration::from_millis(200)).await;
        if status.is_none() {
            self.leader.signal(libc::SIGKILL);
            let _ = self.wait_for(Duration::from_secs(2)).await;
        }
        if let Some(r) = self.reader.take() {
            let _ = tokio::time::timeout(Duration::from_secs(1), r).await;
        }
        status
    }
}

#[allow(clippy::too_many_arguments)]
async fn connect_stdio(
    target: String,
    command: &str,
    args: &[String],
    penv: &BTreeMap<String, String>,
    cwd: Option<&str>,
    env: &HashMap<String, String>,
    timeout: Duration,
) -> Result<McpSession, ToolsError> {
    let kind = TransportKind::Stdio;
    let mut secrets = Vec::new();
    let command_r = substitute_str(command, env, "command", &mut secrets)?;
    let args_r = args
        .iter()
        .enumerate()
        .map(|(i, a)| substitute_str(a, env, &format!("args[{i}]"), &mut secrets))
        .collect::<Result<Vec<_>, _>>()?;
    let mut env_r = BTreeMap::new();
    for (k, v) in penv {
        env_r.insert(
            k.clone(),
            substitute_str(v, env, &format!("env.{k}"), &mut secrets)?,
        );
    }
    let cwd_r = cwd
        .map(|c| substitute_str(c, env, "cwd", &mut secrets))
        .transpose()?;
    let redactor = Redactor::new(secrets);
    let fail = |reason: String, stderr: Option<String>, help: &str| ToolsError::Connect {
        target: target.clone(),
        transport: kind.as_str(),
        reason: redactor.redact(&reason),
        stderr: stderr.map(|s| redactor.redact(&s)),
        help: help.to_string(),
    };

    if let Some(c) = &cwd_r
        && !std::path::Path::new(c).is_dir()
    {
        return Err(fail(
            format!("the working directory `{c}` (`cwd`) does not exist or is not a directory"),
            None,
            "fix `cwd` in the server params or create the directory",
        ));
    }

    // Without a `cwd` of its own the server runs from `/` (host_command), never from ipybox's
    // working directory, which may be the workspace a sandboxed kernel writes.
    let mut cmd = host_command(&command_r);
    cmd.args(&args_r).env_clear();
    for k in STDIO_BASE_ENV.iter().chain(crate::host_env::NETWORK) {
        if let Some(v) = env.get(*k) {
            cmd.env(k, v);
        }
    }
    cmd.envs(&env_r);
    if let Some(c) = &cwd_r {
        cmd.current_dir(c);
    }
    cmd.stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    own_group(&mut cmd);
    let mut child = cmd.spawn().map_err(|e| {
        let help = if e.kind() == std::io::ErrorKind::NotFound {
            "check that the command is installed and on PATH (the server sees PATH from ipybox's environment unless `env` sets it)"
        } else {
            "check that `command` names an executable file"
        };
        fail(format!("cannot start `{command_r}`: {e}"), None, help)
    })?;
    let pid = child.id();
    let (Some(stdout), Some(stdin), Some(stderr)) =
        (child.stdout.take(), child.stdin.take(), child.stderr.take())
    else {
        return Err(fail(
            "child stdio pipes missing".into(),
            None,
            "report this bug",
        ));
    };
    let (tail, reader) = StderrTail::capture(stderr);
    let mut proc = ChildProc {
        leader: GroupLeader::adopt(child),
        reader: Some(reader),
    };
    tracing::debug!(pid, "spawned stdio MCP server");

    let result =
        tokio::time::timeout(timeout, serve_client(client_config(), (stdout, stdin))).await;
    match result {
        Ok(Ok(running)) => Ok(McpSession {
            running,
            child: Mutex::new(Some(proc)),
            pid,
            stderr: Some(tail),
            target,
            kind,
            redactor,
        }),
        Ok(Err(e)) => {
            let status = proc.kill_and_collect().await;
            let reason = match status {
                Some(s) => format!(
                    "the server exited ({s}) before completing the MCP handshake ({})",
                    init_error_text(&e)
                ),
                None => format!("the MCP handshake failed: {}", init_error_text(&e)),
            };
            Err(fail(
                reason,
                Some(tail.text()),
                "run the command yourself to see why it fails; its stderr tail is above",
            ))
        }
        Err(_) => {
            proc.kill_and_collect().await;
            let stderr = tail.text();
            Err(ToolsError::Timeout {
                target: target.clone(),
                transport: kind.as_str(),
                timeout,
                stderr: Some(redactor.redact(&stderr)),
            })
        }
    }
}

// ---------------------------------------------------------------------------------------------
// HTTP (streamable and legacy SSE)

async fn connect_http(
    target: String,
    kind: TransportKind,
    url: &str,
    headers: &BTreeMap<String, String>,
    env: &HashMap<String, String>,
    timeout: Duration,
) -> Result<McpSession, ToolsError> {
    use reqwest::header::{HeaderMap, HeaderName, HeaderValue};

    let mut secrets = Vec::new();
    let url_r = substitute_str(url, env, "url", &mut secrets)?;
    let mut header_map = HeaderMap::new();
    for (k, v) in headers {
        let v_r = substitute_str(v, env, &format!("headers.{k}"), &mut secrets)?;
        let name = HeaderName::from_bytes(k.as_bytes()).map_err(|_| ToolsError::InvalidParams {
            problem: format!("`headers.{k}` is not a valid HTTP header name"),
            help: "header names are ASCII tokens such as `Authorization`".into(),
        })?;
        let mut value = HeaderValue::from_str(&v_r).map_err(|_| ToolsError::InvalidParams {
            problem: format!(
                "the value of `headers.{k}` (after `${{VAR}}` substitution) is not a valid HTTP header value"
            ),
            help: "header values must be visible ASCII without line breaks; check the variables it uses".into(),
        })?;
        value.set_sensitive(true);
        header_map.insert(name, value);
    }
    let redactor = Redactor::new(secrets);
    let parsed = reqwest::Url::parse(&url_r).map_err(|e| ToolsError::InvalidParams {
        problem: redactor.redact(&format!("`url` `{url_r}` is not a valid URL: {e}")),
        help: "write a full URL such as `http://127.0.0.1:8000/mcp`".into(),
    })?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(ToolsError::InvalidParams {
            problem: redactor.redact(&format!("`url` `{url_r}` is not an http(s) URL")),
            help: "write a full URL such as `http://127.0.0.1:8000/mcp`".into(),
        });
    }
    // Redirects are followed only within the origin, so configured headers (credentials)
    // never reach another host.
    let redirects = reqwest::redirect::Policy::custom(|attempt| {
        let same_origin = attempt
            .previous()
            .first()
            .is_some_and(|first| first.origin() == attempt.url().origin());
        if attempt.previous().len() > 5 {
            attempt.error("too many redirects")
        } else if same_origin {
            attempt.follow()
        } else {
            attempt.stop()
        }
    });
    let client = reqwest::Client::builder()
        .connect_timeout(timeout)
        .redirect(redirects)
        .build()
        .map_err(|e| ToolsError::Connect {
            target: target.clone(),
            transport: kind.as_str(),
            reason: format!("cannot build an HTTP client: {}", error_chain(&e)),
            stderr: None,
            help: "report this bug".into(),
        })?;

    let connect = async {
        match kind {
            TransportKind::Sse => {
                let transport = SseClientTransport::connect(client, parsed, header_map)
                    .await
                    .map_err(|e| format!("opening the SSE stream failed: {}", error_chain(&e)))?;
                serve_client(client_config(), transport)
                    .await
                    .map_err(|e| init_error_text(&e))
            }
            _ => {
                let config = StreamableHttpClientTransportConfig::with_uri(url_r.as_str())
                    .custom_headers(
                        header_map
                            .into_iter()
                            .filter_map(|(k, v)| Some((k?, v)))
                            .collect(),
                    );
                let transport = StreamableHttpClientTransport::with_client(client, config);
                serve_client(client_config(), transport)
                    .await
                    .map_err(|e| init_error_text(&e))
            }
        }
    };
    match tokio::time::timeout(timeout, connect).await {
        Ok(Ok(running)) => Ok(McpSession {
            running,
            child: Mutex::new(None),
            pid: None,
            stderr: None,
            target,
            kind,
            redactor,
        }),
        Ok(Err(reason)) => Err(ToolsError::Connect {
            target,
            transport: kind.as_str(),
            reason: redactor.redact(&reason),
            stderr: None,
            help: match kind {
                TransportKind::Sse => "check that the server is running and serves legacy MCP SSE at this URL (or set `\"type\": \"streamable_http\"`)".into(),
                _ => "check that the server is running and serves MCP streamable HTTP at this URL (or set `\"type\": \"sse\"` for a legacy SSE server)".into(),
            },
        }),
        Err(_) => Err(ToolsError::Timeout {
            target,
            transport: kind.as_str(),
            timeout,
            stderr: None,
        }),
    }
}

// ---------------------------------------------------------------------------------------------
// results

/// A tool result flattened for the kernel.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolOutput {
    /// `structuredContent`, when the server sent it.
    pub structured: Option<Value>,
    /// Text contents joined with `"\n"`; non-text contents described in brackets, e.g.
    /// `[image: image/png, 67 bytes]`.
    pub text: String,
    /// The tool reported an error (`isError: true`).
    pub is_error: bool,
}

fn base64_len(data: &str) -> usize {
    let trimmed = data.trim_end_matches('=');
    trimmed.len() * 3 / 4
}

/// Flattens a [`CallToolResult`] into a [`ToolOutput`].
pub fn tool_output(result: &CallToolResult) -> ToolOutput {
    let parts: Vec<String> = result
        .content
        .iter()
        .map(|c| match c {
            ContentBlock::Text(t) => t.text.clone(),
            ContentBlock::Image(i) => {
                format!("[image: {}, {} bytes]", i.mime_type, base64_len(&i.data))
            }
            ContentBlock::Audio(a) => {
                format!("[audio: {}, {} bytes]", a.mime_type, base64_len(&a.data))
            }
            ContentBlock::Resource(r) => match &r.resource {
                ResourceContents::TextResourceContents { uri, text, .. } => {
                    format!("[resource: {uri}]\n{text}")
                }
                ResourceContents::BlobResourceContents {
                    uri,
                    mime_type,
                    blob,
                    ..
                } => format!(
                    "[resource: {uri}, {}, {} bytes]",
                    mime_type.as_deref().unwrap_or("application/octet-stream"),
                    base64_len(blob)
                ),
                _ => "[resource]".to_string(),
            },
            ContentBlock::ResourceLink(l) => format!("[resource link: {} ({})]", l.uri, l.name),
            #[allow(unreachable_patterns)]
            _ => "[unsupported content]".to_string(),
        })
        .collect();
    ToolOutput {
        structured: result.structured_content.clone(),
        text: parts.join("\n"),
        is_error: result.is_error.unwrap_or(false),
    }
}
