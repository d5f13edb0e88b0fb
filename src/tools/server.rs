//! The tool server: HTTP/1.1 on a Unix socket (mode 0600, in the private runtime directory)
//! through which generated code in the kernel calls MCP tools.
//!
//! A Unix socket, not a TCP port: it crosses into a sandbox's network namespace where localhost
//! is not the host's. Keep-alive connections, one task per connection, any number of concurrent
//! calls. Endpoints:
//!
//! - `POST /run` runs a tool call (after approval);
//! - `PUT /reset` closes all MCP sessions;
//! - `GET /status` counts them.
//!
//! The bodies are typed in [`super::protocol`]; the kernel-side client is `python/ipybox_runtime`.
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
use tokio::net::UnixListener;
use tokio::task::JoinHandle;

use super::approval::{self, ApprovalPolicy, Decision};
use super::protocol::{ErrorKind, ResetReply, RunReply, RunRequest, StatusReply};
use super::registry::Registry;
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
    /// When set (sandboxed kernels), only servers recorded here are called, with these params.
    registry: Option<Arc<Registry>>,
}

impl ToolServerState {
    pub(crate) fn new(sessions: SessionCache, approval_timeout: Duration) -> Self {
        Self {
            sessions,
            policy: Mutex::new((ApprovalPolicy::AcceptAll, TimeoutPause::default())),
            approval_timeout,
            registry: None,
        }
    }

    /// Only call servers recorded in `registry`, with the recorded params (see
    /// [`super::registry`]); what the kernel sends is then not trusted.
    pub(crate) fn with_registry(mut self, registry: Arc<Registry>) -> Self {
        self.registry = Some(registry);
        self
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

async fn handle(state: Arc<ToolServerState>, req: Request<Incoming>) -> Reply {
    match (req.method(), req.uri().path()) {
        (&Method::POST, "/run") => {
            let body = match req.into_body().collect().await {
                Ok(b) => b.to_bytes(),
                Err(e) => {
                    return json_response(
                        StatusCode::BAD_REQUEST,
                        &RunReply::error(ErrorKind::BadRequest, e.to_string()),
                    );
                }
            };
            let run: RunRequest = match serde_json::from_slice(&body) {
                Ok(r) => r,
                Err(e) => {
                    return json_response(
                        StatusCode::BAD_REQUEST,
                        &RunReply::error(
                            ErrorKind::BadRequest,
                            format!("invalid /run request: {e}"),
                        ),
                    );
                }
            };
            json_response(StatusCode::OK, &run_tool(&state, run).await)
        }
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
                format!("no endpoint {method} {path}: use POST /run, PUT /reset or GET /status"),
            ),
        ),
    }
}

async fn run_tool(state: &ToolServerState, run: RunRequest) -> RunReply {
    // Taken before anything can wait (approval): a reset after this point voids the call.
    let epoch = state.sessions.epoch();
    let RunRequest {
        server_name,
        server_params,
        tool_name,
        arguments,
    } = run;
    let server_params = match &state.registry {
        None => server_params,
        Some(registry) => match registry.get(&server_name) {
            Some(recorded) => recorded,
            None => {
                return RunReply::error(
                    ErrorKind::ToolError,
                    format!(
                        "MCP server `{server_name}` is not registered with this ipybox (a sandboxed kernel can only call servers the host registered)\n  help: call register_mcp_server for `{server_name}` again"
                    ),
                );
            }
        },
    };
    let (policy, pause) = state.policy();
    let decision = approval::decide(
        &policy,
        &server_name,
        &tool_name,
        &arguments,
        state.approval_timeout,
        &pause,
    )
    .await;
    match decision {
        Decision::Accepted => {}
        Decision::Rejected => {
            return RunReply::error(
                ErrorKind::Rejected,
                format!("tool call {server_name}.{tool_name} was rejected by the application"),
            );
        }
        Decision::TimedOut => {
            return RunReply::error(
                ErrorKind::ApprovalTimeout,
                format!(
                    "tool call {server_name}.{tool_name} was not approved within {} s, so it was not made",
                    state.approval_timeout.as_secs_f64()
                ),
            );
        }
    }
    tracing::info!(server = %server_name, tool = %tool_name, "tool call");
    let session = match state
        .sessions
        .get_or_connect_since(&server_name, &server_params, epoch)
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
