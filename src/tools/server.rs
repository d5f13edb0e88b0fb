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
//! Limits (the kernel is not trusted to be polite; see docs/tool-calling.md, "Limits"):
//!
//! - a request body may be [`MAX_BODY_BYTES`]: a larger `Content-Length` is answered `413` before
//!   the body is read, a chunked body is cut off at the limit while it is read; all bodies being
//!   read at once may hold [`MAX_BODY_BYTES_IN_FLIGHT`] (beyond: `503`), and a body must arrive
//!   within [`BODY_READ_TIMEOUT`];
//! - a connection must send a request head within [`HEADER_READ_TIMEOUT`] of opening or of its
//!   last reply (hyper's header timeout; this is also how long an idle keep-alive connection
//!   stays open);
//! - at most [`MAX_CONNECTIONS`] connections are open: at the cap a new connection closes the
//!   least recently used idle one (no call running, no request bytes waiting to be read), and is
//!   refused (`503`, written at once, closed) when there is none. File handles never grow past
//!   the cap.
//!
//! The bodies are typed in [`super::protocol`]; the kernel-side client is `python/ipybox_runtime`.
//! Kernels on Jupyter servers send `/run` and `/approve` over their stdin channel instead
//! ([`super::stdin_channel`]), to the same functions.
//! Not here: connecting to MCP servers ([`super::sessions`]) or deciding approvals
//! ([`super::approval`]).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use serde::Serialize;
use serde_json::Value;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{Semaphore, oneshot};
use tokio::task::JoinHandle;

use super::approval::{
    self, ApprovalPolicy, CallLog, Decision, RequestKind, SHELL_MAGIC_TOOL, SHELL_SERVER_NAME,
    SHELL_TOOL, Subject, shorten,
};
use super::protocol::{ApproveRequest, ErrorKind, ResetReply, RunReply, RunRequest, StatusReply};
use super::registry::{NotRegistered, Reach};
use super::shown::{self, Syntax};
use super::{SessionCache, tool_output};
use crate::pause::TimeoutPause;

/// The largest request body (bytes): tool arguments beyond this belong in a file.
pub(crate) const MAX_BODY_BYTES: usize = 32 << 20;
/// The most body bytes being read at once, over all connections.
pub(crate) const MAX_BODY_BYTES_IN_FLIGHT: usize = 256 << 20;
/// How long a request body may take to arrive once its head has.
pub(crate) const BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a connection may take to send a request head, counted from its opening or its last
/// reply: also how long an idle keep-alive connection is kept.
pub(crate) const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// The most connections open at once (one per calling thread, one per awaited call in flight).
pub(crate) const MAX_CONNECTIONS: usize = 512;

/// Shared state of the tool server; the executor keeps a handle to change the policy.
pub(crate) struct ToolServerState {
    sessions: SessionCache,
    /// Stdio servers shared with other executors (their reset does not close them).
    shared: Option<Arc<SessionCache>>,
    /// Who approves calls, the clock of the execution they belong to (paused while a call
    /// waits) and where its decisions are recorded: a call keeps what it found when it began,
    /// so a leftover call of an earlier execution never pauses (or lands in the record of) a
    /// later one.
    policy: Mutex<(ApprovalPolicy, TimeoutPause, CallLog)>,
    approval_timeout: Duration,
    /// The servers this executor's kernels may call, with their recorded params (the trust
    /// rule, [`super::registry`]): what a kernel sends is never used.
    reach: Reach,
    /// The longest rendering of a request a person is shown (see `approval::unshowable`).
    text_limit: Option<usize>,
    /// Body bytes that may be read at once ([`MAX_BODY_BYTES_IN_FLIGHT`]).
    bodies: Arc<Semaphore>,
}

impl ToolServerState {
    pub(crate) fn new(sessions: SessionCache, approval_timeout: Duration, reach: Reach) -> Self {
        Self {
            sessions,
            shared: None,
            policy: Mutex::new((
                ApprovalPolicy::AcceptAll,
                TimeoutPause::default(),
                CallLog::default(),
            )),
            approval_timeout,
            reach,
            text_limit: None,
            bodies: Arc::new(Semaphore::new(MAX_BODY_BYTES_IN_FLIGHT)),
        }
    }

    /// Refuse requests whose rendering is longer than `limit` characters before anyone is asked.
    pub(crate) fn with_text_limit(mut self, limit: Option<usize>) -> Self {
        self.text_limit = limit;
        self
    }

    /// Calls to stdio servers go to `shared`, the cache of several executors.
    pub(crate) fn with_shared_servers(mut self, shared: Option<Arc<SessionCache>>) -> Self {
        self.shared = shared;
        self
    }

    /// The session of registered server `name` (`params` as recorded) for a call that began at
    /// `epoch` of this executor's cache: a stdio server from the shared cache when there is one
    /// (the call is not made if this executor was reset since it began, though the server
    /// stays), else from this executor's own. Errors of a shared server do not carry its
    /// stderr: what it logged may be about another executor's calls.
    async fn session_for(
        &self,
        name: &str,
        params: &Value,
        epoch: u64,
    ) -> Result<(Arc<super::client::McpSession>, bool), super::ToolsError> {
        let stdio = super::params::ServerParams::parse(params)
            .is_ok_and(|p| p.kind() == super::params::TransportKind::Stdio);
        let Some(shared) = self.shared.as_ref().filter(|_| stdio) else {
            let session = self
                .sessions
                .get_or_connect_since(name, params, epoch)
                .await?;
            return Ok((session, false));
        };
        let closed = || super::ToolsError::Closed {
            target: format!("`{name}`"),
        };
        if self.sessions.epoch() != epoch {
            return Err(closed());
        }
        let session = shared.get_or_connect(name, params).await?;
        if self.sessions.epoch() != epoch {
            return Err(closed());
        }
        Ok((session, true))
    }

    /// Sets who approves the next tool calls, the execution clock their approval waits pause,
    /// and where their decisions are recorded.
    pub(crate) fn set_policy(&self, policy: ApprovalPolicy, pause: TimeoutPause, log: CallLog) {
        *self.policy.lock().unwrap_or_else(|p| p.into_inner()) = (policy, pause, log);
    }

    fn policy(&self) -> (ApprovalPolicy, TimeoutPause, CallLog) {
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
            let connections = Arc::new(Connections::default());
            loop {
                // While evicted connections are still closing, new ones wait in the listen
                // backlog (the kernel's, not ours): file handles stay bounded however fast
                // connections come.
                connections.room().await;
                let (stream, _) = match listener.accept().await {
                    Ok(conn) => conn,
                    Err(e) => {
                        tracing::warn!("tool server accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                use std::os::fd::AsRawFd;
                match connections.admit(stream.as_raw_fd()) {
                    Some((id, evicted)) => {
                        let state = served.clone();
                        tokio::spawn(serve(state, connections.clone(), id, evicted, stream));
                    }
                    None => refuse(stream),
                }
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

    /// Stops serving and kills every stdio MCP server's process group at once, waiting for
    /// nothing (see `CodeExecutor::stop_now`).
    pub(crate) fn kill_now(self) {
        self.task.abort();
        self.state.sessions.kill_all();
    }
}

impl Drop for ToolServer {
    fn drop(&mut self) {
        self.task.abort();
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Serves one admitted connection until it ends, or until it is evicted (closed when idle).
async fn serve(
    state: Arc<ToolServerState>,
    connections: Arc<Connections>,
    id: u64,
    evicted: oneshot::Receiver<Eviction>,
    stream: UnixStream,
) {
    use std::os::fd::AsRawFd;
    let fd = stream.as_raw_fd();
    let busy_in = connections.clone();
    let service = hyper::service::service_fn(move |req| {
        let (state, connections) = (state.clone(), busy_in.clone());
        async move {
            let _busy = connections.busy(id);
            handle(state, req).await
        }
    });
    let io = hyper_util::rt::TokioIo::new(stream);
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .keep_alive(true)
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT);
    let conn = builder.serve_connection(io, service);
    tokio::pin!(conn);
    // Dropped before `conn` (and so before the socket closes): the table never holds the file
    // descriptor of a closed socket.
    let _gone = Gone(&connections, id);
    let mut evicted = Some(evicted);
    let ended = loop {
        tokio::select! {
            ended = conn.as_mut() => break ended,
            Ok(eviction) = async { evicted.as_mut().expect("guarded").await }, if evicted.is_some() => {
                evicted = None;
                if request_waiting(fd) {
                    // A request arrived since it was chosen: serve it, close nothing.
                    continue;
                }
                match eviction {
                    // Nothing was ever answered on it: no reply can be cut short, close at once.
                    Eviction::Unused => break Ok(()),
                    // Idle after a reply: hyper closes an idle keep-alive connection at once
                    // (and finishes a reply still being written first).
                    Eviction::Idle => {
                        conn.as_mut().graceful_shutdown();
                        break tokio::time::timeout(Duration::from_secs(1), conn.as_mut())
                            .await
                            .unwrap_or(Ok(()));
                    }
                }
            }
        }
    };
    if let Err(e) = ended {
        tracing::debug!("tool server connection ended: {e}");
    }
}

/// Answers a connection beyond [`MAX_CONNECTIONS`] (all busy) with `503` and closes it, without
/// waiting for anything: refusing must not hold a file handle.
fn refuse(stream: UnixStream) {
    tracing::warn!(
        "tool server: refused a connection, {MAX_CONNECTIONS} are open and busy with calls"
    );
    let body = serde_json::to_string(&RunReply::error(
        ErrorKind::BadRequest,
        format!(
            "the ipybox tool server refused the connection: {MAX_CONNECTIONS} connections are open and every one is busy with a call (a limit that keeps kernel code from exhausting the host's file handles)\n  help: make fewer calls at once (each calling thread keeps a connection open), then call again"
        ),
    ))
    .unwrap_or_default();
    let response = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    // A plain write on the socket (tokio's try_write would give up on a socket the reactor has
    // not seen writable yet): the send buffer of a new connection is empty, so it fits.
    if let Ok(stream) = stream.into_std() {
        use std::io::Write;
        let _ = (&stream).write(response.as_bytes());
    }
}

/// The open connections of a tool server: which are busy with a call, which idle since when,
/// and how to close an idle one.
#[derive(Default)]
struct Connections {
    table: Mutex<ConnectionTable>,
    /// Signalled when a connection ends.
    ended: tokio::sync::Notify,
}

/// How many evicted connections may still be closing before accepting waits.
const CLOSING_SLACK: usize = 16;

#[derive(Default)]
struct ConnectionTable {
    next_id: u64,
    live: HashMap<u64, Connection>,
}

struct Connection {
    /// The socket's file descriptor (open while the entry exists), to see whether a request is
    /// waiting to be read.
    fd: std::os::fd::RawFd,
    /// Requests being handled.
    busy: usize,
    /// Whether a request was ever handled on it.
    used: bool,
    last_active: Instant,
    /// Closes the connection when idle; `None` once asked to.
    evict: Option<oneshot::Sender<Eviction>>,
}

/// How an evicted connection closes.
enum Eviction {
    /// No request was ever handled on it: dropped at once.
    Unused,
    /// Idle after replies: a graceful shutdown.
    Idle,
}

impl Connections {
    fn table(&self) -> std::sync::MutexGuard<'_, ConnectionTable> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Returns when fewer than [`MAX_CONNECTIONS`] + [`CLOSING_SLACK`] connections are open.
    async fn room(&self) {
        loop {
            let ended = self.ended.notified();
            if self.table().live.len() < MAX_CONNECTIONS + CLOSING_SLACK {
                return;
            }
            ended.await;
        }
    }

    /// A new connection's id and eviction signal, or `None` when it must be refused: at
    /// [`MAX_CONNECTIONS`] the least recently used idle connection is closed to make room, and
    /// if every one is busy the new one is refused.
    fn admit(&self, fd: std::os::fd::RawFd) -> Option<(u64, oneshot::Receiver<Eviction>)> {
        let mut table = self.table();
        let open = table.live.values().filter(|c| c.evict.is_some()).count();
        if open >= MAX_CONNECTIONS {
            // Not one whose request is waiting to be read: closing it would lose the call. (A
            // client evicted before it sends gets EPIPE, and the kernel-side client then sends
            // on a new connection.)
            let idle = table
                .live
                .values_mut()
                .filter(|c| c.busy == 0 && c.evict.is_some() && !request_waiting(c.fd))
                .min_by_key(|c| c.last_active)?;
            let how = if idle.used {
                Eviction::Idle
            } else {
                Eviction::Unused
            };
            if let Some(evict) = idle.evict.take() {
                let _ = evict.send(how);
            }
        }
        let (evict, evicted) = oneshot::channel();
        let id = table.next_id;
        table.next_id += 1;
        table.live.insert(
            id,
            Connection {
                fd,
                busy: 0,
                used: false,
                last_active: Instant::now(),
                evict: Some(evict),
            },
        );
        Some((id, evicted))
    }

    /// Marks `id` busy until the guard drops.
    fn busy(self: &Arc<Self>, id: u64) -> Busy {
        if let Some(c) = self.table().live.get_mut(&id) {
            c.busy += 1;
            c.used = true;
        }
        Busy(self.clone(), id)
    }
}

/// Whether bytes wait to be read on the socket `fd` (a request hyper has not parsed yet).
fn request_waiting(fd: std::os::fd::RawFd) -> bool {
    let mut byte = 0u8;
    // SAFETY: `fd` is an open socket (its table entry is removed before it closes, under the
    // same lock); MSG_PEEK | MSG_DONTWAIT reads nothing and never blocks.
    let n = unsafe {
        libc::recv(
            fd,
            (&raw mut byte).cast(),
            1,
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    n > 0
}

/// A request being handled on a connection.
struct Busy(Arc<Connections>, u64);

impl Drop for Busy {
    fn drop(&mut self) {
        if let Some(c) = self.0.table().live.get_mut(&self.1) {
            c.busy = c.busy.saturating_sub(1);
            c.last_active = Instant::now();
        }
    }
}

/// Forgets a connection when its task ends.
struct Gone<'a>(&'a Connections, u64);

impl Drop for Gone<'_> {
    fn drop(&mut self) {
        self.0.table().live.remove(&self.1);
        self.0.ended.notify_waiters();
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

/// The JSON body of a request, or the reply that says why it is not one: `413` when it is over
/// [`MAX_BODY_BYTES`] (from `Content-Length`, before reading; or while reading a chunked body),
/// `503` when [`MAX_BODY_BYTES_IN_FLIGHT`] are being read already, `408` when it does not arrive
/// within [`BODY_READ_TIMEOUT`], `400` when it is not the endpoint's JSON.
async fn read_json<T: serde::de::DeserializeOwned>(
    state: &ToolServerState,
    req: Request<Incoming>,
    endpoint: &str,
) -> Result<T, Reply> {
    let refuse = |status: StatusCode, message: String| {
        let mut reply = json_response(status, &RunReply::error(ErrorKind::BadRequest, message));
        if let Ok(response) = reply.as_mut() {
            // The rest of the body is not read: this connection is done.
            response.headers_mut().insert(
                hyper::header::CONNECTION,
                hyper::header::HeaderValue::from_static("close"),
            );
        }
        reply
    };
    let declared = req
        .headers()
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if let Some(n) = declared.filter(|n| *n > MAX_BODY_BYTES as u64) {
        return Err(refuse(
            StatusCode::PAYLOAD_TOO_LARGE,
            too_large(endpoint, Some(n)),
        ));
    }
    let reserve = declared.map_or(MAX_BODY_BYTES, |n| n as usize).max(1);
    let Ok(_reserved) = state.bodies.try_acquire_many(reserve as u32) else {
        return Err(refuse(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "the ipybox tool server is already reading {} MiB of request bodies, its limit: this {endpoint} request was not read\n  help: make fewer calls with large arguments at once",
                MAX_BODY_BYTES_IN_FLIGHT >> 20
            ),
        ));
    };
    let body = http_body_util::Limited::new(req.into_body(), MAX_BODY_BYTES);
    let body = match tokio::time::timeout(BODY_READ_TIMEOUT, body.collect()).await {
        Err(_) => {
            return Err(refuse(
                StatusCode::REQUEST_TIMEOUT,
                format!(
                    "the body of this {endpoint} request did not arrive within {} s",
                    BODY_READ_TIMEOUT.as_secs()
                ),
            ));
        }
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => {
            return Err(refuse(
                StatusCode::PAYLOAD_TOO_LARGE,
                too_large(endpoint, None),
            ));
        }
        Ok(Err(e)) => return Err(refuse(StatusCode::BAD_REQUEST, e.to_string())),
        Ok(Ok(collected)) => collected.to_bytes(),
    };
    serde_json::from_slice(&body).map_err(|e| {
        json_response(
            StatusCode::BAD_REQUEST,
            &RunReply::error(
                ErrorKind::BadRequest,
                format!("invalid {endpoint} request: {e}"),
            ),
        )
    })
}

/// Why a request over [`MAX_BODY_BYTES`] was not read (the socket's and the stdin channel's).
pub(super) fn too_large(endpoint: &str, declared: Option<u64>) -> String {
    let size = match declared {
        Some(n) => format!("{n} bytes"),
        None => "over that".to_string(),
    };
    format!(
        "this {endpoint} request was not read: its body is {size}, and the ipybox tool server takes at most {} MiB ({MAX_BODY_BYTES} bytes) per request, so that kernel code cannot fill the host's memory\n  help: pass large data through a file in the workspace",
        MAX_BODY_BYTES >> 20
    )
}

async fn handle(state: Arc<ToolServerState>, req: Request<Incoming>) -> Reply {
    match (req.method(), req.uri().path()) {
        (&Method::POST, "/run") => match read_json::<RunRequest>(&state, req, "/run").await {
            Ok(run) => json_response(StatusCode::OK, &run_tool(&state, run).await),
            Err(reply) => reply,
        },
        (&Method::POST, "/approve") => {
            match read_json::<ApproveRequest>(&state, req, "/approve").await {
                Ok(approve) => json_response(StatusCode::OK, &approve_shell(&state, approve).await),
                Err(reply) => reply,
            }
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
    let (policy, pause, log) = state.policy();
    // Python ipybox 0.9.2's sentence first ("Approval request for fx.add rejected" / "expired"):
    // code and prompts written for it match on these words. Then what ipybox adds.
    let request = format!(
        "Approval request for {}.{}",
        shorten(&shown::name(subject.server_name, Syntax::Json), 200),
        shorten(&shown::name(subject.tool_name, Syntax::Json), 200)
    );
    let timeout = state.approval_timeout;
    match approval::decide(&policy, subject, timeout, &pause, state.text_limit, &log).await {
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
    // The kernel's error names the command (escaped, shortened: an error is not a prompt).
    let what = match arguments.get("magic").and_then(Value::as_str) {
        Some(magic) => format!("{} cell", shorten(&approval::magic_line(magic), 200)),
        None => format!("shell command `{}`", shorten(&shown::command(cmd), 200)),
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
        // Never used: the registration decides; only compared, to tell two registrations of
        // one name apart (super::registry).
        server_params,
        tool_name,
        arguments,
    } = run;
    let server = match state.reach.resolve(&server_name, &server_params) {
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
    let what = format!(
        "tool call {}.{}",
        shorten(&shown::name(&server_name, Syntax::Json), 200),
        shorten(&shown::name(&tool_name, Syntax::Json), 200)
    );
    if let Some(refused) = approve(state, subject, &what, "made").await {
        return refused;
    }
    // Names the kernel chose: quoted and escaped (never the arguments).
    tracing::info!(server = ?server_name, tool = ?tool_name, "tool call");
    let (session, shared) = match state.session_for(&server_name, &server.params, epoch).await {
        Ok(s) => s,
        Err(e) => return RunReply::error(ErrorKind::ToolError, e.to_string()),
    };
    match session
        .call_tool(&tool_name, arguments)
        .await
        .map_err(|e| if shared { e.without_stderr() } else { e })
    {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernel-side client checks the body limit before sending and stops reusing idle
    /// connections well before the host closes them: its numbers must be the host's.
    #[test]
    fn the_kernel_side_client_knows_the_limits() {
        let runtime = include_str!("../../python/ipybox_runtime/__init__.py");
        assert!(runtime.contains(&format!("\n_MAX_BODY_BYTES = {MAX_BODY_BYTES}\n")));
        assert!(runtime.contains(&format!(
            "\n_HOST_IDLE_TIMEOUT = {:.1}\n",
            HEADER_READ_TIMEOUT.as_secs_f64()
        )));
    }
}
