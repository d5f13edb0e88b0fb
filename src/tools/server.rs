//! The tool server: HTTP/1.1 on a Unix socket (mode 0600, in the private runtime directory)
//! through which generated code in the kernel calls MCP tools.
//!
//! A Unix socket, not a TCP port: it crosses into a sandbox's network namespace where localhost
//! is not the host's. Keep-alive connections, one task per connection, any number of concurrent
//! calls. Endpoints:
//!
//! - `POST /run` runs a tool call (after approval);
//! - `POST /approve` asks for approval of a shell command (`approve_shell_cmds`);
//! - `PUT /reset` closes all MCP sessions;
//! - `GET /status` counts them.
//!
//! The bodies are typed in [`super::protocol`]; the kernel-side client is `python/ipybox_runtime`.
//! Kernels on Jupyter servers send `/run` and `/approve` over their stdin channel instead
//! ([`super::stdin_channel`]), to the same functions.
//! Not here: connecting to MCP servers ([`super::sessions`]) or deciding approvals
//! ([`super::approval`]).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use serde::Serialize;
use serde_json::Value;
use tokio::net::UnixListener;
use tokio::task::JoinHandle;

use super::approval::{
    self, ApprovalPolicy, Decision, RequestKind, SHELL_MAGIC_TOOL, SHELL_SERVER_NAME, SHELL_TOOL,
    Subject, shorten,
};
use super::protocol::{ApproveRequest, ErrorKind, ResetReply, RunReply, RunRequest, StatusReply};
use super::registry::{NotRegistered, Registry};
use super::{SessionCache, tool_output};
use crate::pause::TimeoutPause;

/// Shared state of the tool server; the executor keeps a handle to change the policy.
pub(crate) struct ToolServerState {
    sessions: SessionCache,
    /// Who approves calls, and the clock of the execution they belong to (paused while a call
    /// waits): a call keeps the pair it found when it began, so a leftover call of an earlier
    /// execution never pauses a later one.
    policy: Mutex<(ApprovalPolicy, TimeoutPause)>,
    approval_timeout: Duration,
    /// The servers kernels may call, with their recorded params (the trust rule,
    /// [`super::registry`]): what a kernel sends is never used.
    registry: Arc<Registry>,
}

impl ToolServerState {
    pub(crate) fn new(
        sessions: SessionCache,
        approval_timeout: Duration,
        registry: Arc<Registry>,
    ) -> Self {
        Self {
            sessions,
            policy: Mutex::new((ApprovalPolicy::AcceptAll, TimeoutPause::default())),
            approval_timeout,
            registry,
        }
    }

    /// Sets who approves the next tool calls, and the execution clock their approval waits
    /// pause.
    pub(crate) fn set_policy(&self, policy: ApprovalPolicy, pause: TimeoutPause) {
        *self.policy.lock().unwrap_or_else(|p| p.into_inner()) = (policy, pause);
    }

    fn policy(&self) -> (ApprovalPolicy, TimeoutPause) {
        self.policy
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The MCP session cache (closed on reset and stop).
    pub(crate) fn sessions(&self) -> &SessionCache {
        &self.sessions
    }
}

/// A running tool server. Dropping it stops accepting connections and removes the socket.
pub(crate) struct ToolServer {
    path: PathBuf,
    state: Arc<ToolServerState>,
    task: JoinHandle<()>,
}

impl ToolServer {
    /// Binds `path` (mode 0600) and serves in the background.
    pub(crate) fn start(path: &Path, state: Arc<ToolServerState>) -> std::io::Result<Self> {
        let _ = std::fs::remove_file(path);
        let listener = UnixListener::bind(path)?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
        let served = state.clone();
        let task = tokio::spawn(async move {
            loop {
                let (stream, _) = match listener.accept().await {
                    Ok(conn) => conn,
                    Err(e) => {
                        tracing::warn!("tool server accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let state = served.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req| handle(state.clone(), req));
                    let io = hyper_util::rt::TokioIo::new(stream);
                    if let Err(e) = hyper::server::conn::http1::Builder::new()
                        .keep_alive(true)
                        .serve_connection(io, service)
                        .await
                    {
                        tracing::debug!("tool server connection ended: {e}");
                    }
                });
            }
        });
        Ok(Self {
            path: path.to_path_buf(),
            state,
            task,
        })
    }

    pub(crate) fn state(&self) -> &Arc<ToolServerState> {
        &self.state
    }

    /// Stops serving and closes every MCP session.
    pub(crate) async fn stop(self) {
        self.task.abort();
        self.state.sessions.close_all().await;
    }
}

impl Drop for ToolServer {
    fn drop(&mut self) {
        self.task.abort();
        let _ = std::fs::remove_file(&self.path);
    }
}

pub(super) type Reply = Result<Response<Full<Bytes>>, std::convert::Infallible>;

/// A JSON body with `status` (also what the protocol's round-trip test serves).
pub(super) fn json_response(status: StatusCode, body: &impl Serialize) -> Reply {
    // The protocol types serialize infallibly (strings, numbers and JSON values only).
    let bytes = serde_json::to_vec(body).unwrap_or_default();
    let mut response = Response::new(Full::new(Bytes::from(bytes)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    Ok(response)
}

/// The JSON body of a request, or the `400` reply that says why it is not one.
async fn read_json<T: serde::de::DeserializeOwned>(
    req: Request<Incoming>,
    endpoint: &str,
) -> Result<T, Reply> {
    let bad = |message: String| {
        json_response(
            StatusCode::BAD_REQUEST,
            &RunReply::error(ErrorKind::BadRequest, message),
        )
    };
    let body = req
        .into_body()
        .collect()
        .await
        .map_err(|e| bad(e.to_string()))?
        .to_bytes();
    serde_json::from_slice(&body).map_err(|e| bad(format!("invalid {endpoint} request: {e}")))
}

async fn handle(state: Arc<ToolServerState>, req: Request<Incoming>) -> Reply {
    match (req.method(), req.uri().path()) {
        (&Method::POST, "/run") => match read_json::<RunRequest>(req, "/run").await {
            Ok(run) => json_response(StatusCode::OK, &run_tool(&state, run).await),
            Err(reply) => reply,
        },
        (&Method::POST, "/approve") => match read_json::<ApproveRequest>(req, "/approve").await {
            Ok(approve) => json_response(StatusCode::OK, &approve_shell(&state, approve).await),
            Err(reply) => reply,
        },
        (&Method::PUT, "/reset") => {
            let closed = state.sessions.len();
            state.sessions.close_all().await;
            json_response(StatusCode::OK, &ResetReply { closed })
        }
        (&Method::GET, "/status") => json_response(
            StatusCode::OK,
            &StatusReply {
                sessions: state.sessions.len(),
            },
        ),
        (method, path) => json_response(
            StatusCode::NOT_FOUND,
            &RunReply::error(
                ErrorKind::BadRequest,
                format!(
                    "no endpoint {method} {path}: use POST /run, POST /approve, PUT /reset or GET /status"
                ),
            ),
        ),
    }
}

/// Asks for approval under the current policy; `None` when accepted, else the error reply that
/// says `what` was rejected or not approved in time (and so not `done`).
async fn approve(
    state: &ToolServerState,
    subject: Subject<'_>,
    what: &str,
    done: &str,
) -> Option<RunReply> {
    let (policy, pause) = state.policy();
    // Python ipybox 0.9.2's sentence first ("Approval request for fx.add rejected" / "expired"):
    // code and prompts written for it match on these words. Then what ipybox adds.
    let request = format!(
        "Approval request for {}.{}",
        subject.server_name, subject.tool_name
    );
    match approval::decide(&policy, subject, state.approval_timeout, &pause).await {
        Decision::Accepted => None,
        Decision::Rejected(reason) => Some(RunReply::error(
            ErrorKind::Rejected,
            match reason {
                None => format!("{request} rejected: {what} was rejected by the application"),
                Some(reason) => format!("{request} rejected: {what} was rejected: {reason}"),
            },
        )),
        Decision::TimedOut => Some(RunReply::error(
            ErrorKind::ApprovalTimeout,
            format!(
                "{request} expired: {what} was not approved within {} s, so it was not {done}",
                state.approval_timeout.as_secs_f64()
            ),
        )),
    }
}

/// `POST /approve`: a shell command about to run in the kernel (`approve_shell_cmds`). Accepted
/// → `Done` (the kernel runs it); otherwise the same rejection kinds as tool calls.
pub(super) async fn approve_shell(state: &ToolServerState, request: ApproveRequest) -> RunReply {
    let ApproveRequest {
        tool_name,
        arguments,
    } = request;
    if tool_name != SHELL_TOOL && tool_name != SHELL_MAGIC_TOOL {
        return RunReply::error(
            ErrorKind::BadRequest,
            format!(
                "invalid /approve request: tool_name must be `{SHELL_TOOL}` or `{SHELL_MAGIC_TOOL}`, not `{tool_name}`"
            ),
        );
    }
    let Some(cmd) = arguments.get("cmd").and_then(Value::as_str) else {
        return RunReply::error(
            ErrorKind::BadRequest,
            "invalid /approve request: arguments need a string `cmd`",
        );
    };
    let what = match arguments.get("magic").and_then(Value::as_str) {
        Some(magic) => format!("{} cell", shorten(magic, 200)),
        None => format!("shell command `{}`", shorten(cmd, 200)),
    };
    let subject = Subject {
        server_name: SHELL_SERVER_NAME,
        tool_name: &tool_name,
        arguments: &arguments,
        kind: RequestKind::ShellCommand,
        server: None,
    };
    if let Some(refused) = approve(state, subject, &what, "run").await {
        return refused;
    }
    tracing::info!(tool = %tool_name, "shell command approved");
    RunReply::Done {
        structured: None,
        text: String::new(),
    }
}

pub(super) async fn run_tool(state: &ToolServerState, run: RunRequest) -> RunReply {
    // Taken before anything can wait (approval): a reset after this point voids the call.
    let epoch = state.sessions.epoch();
    let RunRequest {
        server_name,
        server_params: _, // never trusted: the registration decides (super::registry)
        tool_name,
        arguments,
    } = run;
    let server = match state.registry.resolve(&server_name) {
        Ok(server) => server,
        Err(NotRegistered(why)) => return RunReply::error(ErrorKind::ToolError, why),
    };
    let subject = Subject {
        server_name: &server_name,
        tool_name: &tool_name,
        arguments: &arguments,
        kind: RequestKind::ToolCall,
        server: Some(&server),
    };
    let what = format!("tool call {server_name}.{tool_name}");
    if let Some(refused) = approve(state, subject, &what, "made").await {
        return refused;
    }
    tracing::info!(server = %server_name, tool = %tool_name, "tool call");
    let session = match state
        .sessions
        .get_or_connect_since(&server_name, &server.params, epoch)
        .await
    {
        Ok(s) => s,
        Err(e) => return RunReply::error(ErrorKind::ToolError, e.to_string()),
    };
    match session.call_tool(&tool_name, arguments).await {
        Ok(result) => {
            let out = tool_output(&result);
            if out.is_error {
                RunReply::error(
                    ErrorKind::ToolError,
                    format!("{server_name}.{tool_name} failed: {}", out.text),
                )
            } else {
                RunReply::Done {
                    structured: out.structured,
                    text: out.text,
                }
            }
        }
        Err(e) => RunReply::error(ErrorKind::ToolError, e.to_string()),
    }
}
