//! `ipybox serve --http HOST:PORT`: the MCP server over Streamable HTTP at `/mcp` (rmcp's
//! service: both MCP eras, handshake-era sessions with SSE and resumption), one kernel session
//! per agent conversation ([`sessions`]), plus `/healthz` and `/metrics`.
//!
//! Every `/mcp` and `/metrics` request needs a configured bearer token when there is one
//! ([`auth`]; a token is required to bind anything but loopback); rmcp checks `Host` and
//! `Origin` (DNS rebinding) and the body size. A handshake-era MCP session belongs to the
//! credential that opened it: another credential's requests are answered as if it did not
//! exist. SIGTERM/SIGINT: stop accepting, give running calls `--shutdown-grace`, then stop
//! every kernel (cancelling what still runs) and exit. Which connections are kept (first
//! request timeout, keep-alive, caps that shed idle unauthenticated connections rather than
//! refuse new ones): [`connections`].
//!
//! Not here: the tools ([`super::mcp_server`]), handles ([`handle`]).

pub(crate) mod admission;
pub(crate) mod auth;
pub(crate) mod connections;
pub(crate) mod handle;
pub(crate) mod notebook_quota;
pub(crate) mod session_store;
pub(crate) mod sessions;

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::body::Incoming;
use hyper::http::{HeaderValue, Method, Request, Response, StatusCode, header};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use tokio_util::sync::CancellationToken;

use super::mcp_server::caller::Caller;
use super::mcp_server::session::SessionSource;
use super::mcp_server::{IpyboxServer, ServerConfig};
use auth::Tokens;
use connections::{Connection, Connections, InFlight};
use sessions::{ExecutorFactory, Registry, SessionConfig};

type Body = BoxBody<Bytes, Infallible>;

const SESSION_HEADER: &str = "mcp-session-id";

/// How long stopping every session's kernel may take at shutdown, after the grace.
const SHUTDOWN_BOUND: Duration = Duration::from_secs(30);

/// What `ipybox serve --http` is told by its command line (beyond the MCP server's config).
/// (Its `Debug` leaves out the session key; `Tokens` shows no token.)
pub(crate) struct HttpOptions {
    pub(crate) addr: SocketAddr,
    pub(crate) tokens: Tokens,
    /// `Host` values accepted (empty: any; loopback binds default to the loopback names).
    pub(crate) allowed_hosts: Vec<String>,
    /// Browser `Origin`s accepted; a request with any other `Origin` is refused (403).
    pub(crate) allowed_origins: Vec<String>,
    pub(crate) max_body_bytes: usize,
    pub(crate) shutdown_grace: Duration,
    /// Annotate `session` for the `Mcp-Param-Session` header (SEP-2243).
    pub(crate) session_header: bool,
    /// Several tokens may share local kernels (`--trust-tenants`).
    pub(crate) trust_tenants: bool,
    /// What tenants (tokens) sharing this service's kernels would still share, if anything:
    /// several tokens are then refused unless `trust_tenants`. `None`: kernels on a gateway, or
    /// confined sessions with a uid of their own each and a network of their own.
    pub(crate) tenant_gap: Option<String>,
    pub(crate) sessions: SessionConfig,
    /// The key of session handles (replicas share it).
    pub(crate) session_key: Vec<u8>,
    /// Which connections are kept ([`connections`]).
    pub(crate) connections: connections::Limits,
}

impl std::fmt::Debug for HttpOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpOptions")
            .field("addr", &self.addr)
            .field("tokens", &self.tokens)
            .field("allowed_hosts", &self.allowed_hosts)
            .field("allowed_origins", &self.allowed_origins)
            .field("max_body_bytes", &self.max_body_bytes)
            .field("shutdown_grace", &self.shutdown_grace)
            .field("session_header", &self.session_header)
            .field("trust_tenants", &self.trust_tenants)
            .field("tenant_gap", &self.tenant_gap)
            .field("connections", &self.connections)
            .field("session_key", &"<redacted>")
            .finish_non_exhaustive()
    }
}

/// What the request handler shares.
struct State {
    tokens: Tokens,
    mcp: StreamableHttpService<IpyboxServer, LocalSessionManager>,
    manager: Arc<LocalSessionManager>,
    /// The credential that opened each handshake-era MCP session.
    owners: std::sync::Mutex<HashMap<String, Caller>>,
    draining: AtomicBool,
}

fn text(status: StatusCode, body: impl Into<String>) -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::from(body.into())).boxed());
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

fn unauthorized(present: bool) -> Response<Body> {
    super::metrics::unauthorized();
    let why = if present {
        "the bearer token was not accepted"
    } else {
        "no bearer token was sent"
    };
    let mut response = text(
        StatusCode::UNAUTHORIZED,
        format!(
            "Unauthorized: {why}. This ipybox needs `Authorization: Bearer <token>` with a token its operator configured (--token, IPYBOX_TOKEN or --token-file).\n"
        ),
    );
    response.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer realm=\"ipybox\""),
    );
    response
}

impl State {
    fn owners(&self) -> std::sync::MutexGuard<'_, HashMap<String, Caller>> {
        self.owners.lock().unwrap_or_else(|p| p.into_inner())
    }

    async fn route(&self, mut req: Request<Incoming>, conn: &Connection) -> Response<Body> {
        let path = req.uri().path();
        match (req.method(), path) {
            (&Method::GET, "/healthz") => {
                // Open to all; a probe that sends an accepted token keeps its connection as a
                // client's (the keep-alive timeout, not the first request timeout).
                if self.tokens.any()
                    && let Some(authorization) = req.headers().get(header::AUTHORIZATION)
                    && self.tokens.check(Some(authorization.as_bytes())).is_some()
                {
                    conn.authenticated();
                }
                if self.draining.load(Ordering::SeqCst) {
                    return text(StatusCode::SERVICE_UNAVAILABLE, "shutting down\n");
                }
                return text(StatusCode::OK, "ok\n");
            }
            (&Method::GET, "/metrics") => {
                let authorization = req.headers().get(header::AUTHORIZATION);
                if self
                    .tokens
                    .check(authorization.map(HeaderValue::as_bytes))
                    .is_none()
                {
                    return unauthorized(authorization.is_some());
                }
                conn.authenticated();
                let mut response = text(StatusCode::OK, super::metrics::render());
                response.headers_mut().insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
                );
                return response;
            }
            (_, "/mcp") => {}
            _ => {
                return text(
                    StatusCode::NOT_FOUND,
                    "Not Found: ipybox serves MCP at /mcp (and /healthz, /metrics)\n",
                );
            }
        }
        let authorization = req.headers().get(header::AUTHORIZATION);
        let Some(caller) = self.tokens.check(authorization.map(HeaderValue::as_bytes)) else {
            return unauthorized(authorization.is_some());
        };
        conn.authenticated();
        let session = req
            .headers()
            .get(SESSION_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        if let Some(id) = &session
            && self.owners().get(id).is_some_and(|owner| *owner != caller)
        {
            // Someone else's MCP session: answered as rmcp answers an unknown one.
            return text(StatusCode::NOT_FOUND, "Not Found: Session not found");
        }
        req.extensions_mut().insert(caller.clone());
        // Checked: nothing after this needs the token (and nothing can log it).
        req.headers_mut().remove(header::AUTHORIZATION);
        let delete = req.method() == Method::DELETE;
        let mut response = self.mcp.handle(req).await;
        if delete && response.status() == StatusCode::ACCEPTED {
            // The session is gone; clients (the Python SDK) expect 200 or 204 for that.
            *response.status_mut() = StatusCode::OK;
        }
        if session.is_none()
            && let Some(id) = response
                .headers()
                .get(SESSION_HEADER)
                .and_then(|v| v.to_str().ok())
        {
            self.owners().insert(id.to_string(), caller);
        }
        response
    }

    /// Forgets the owners of MCP sessions rmcp no longer has.
    async fn prune_owners(&self) {
        let live: std::collections::HashSet<String> = self
            .manager
            .sessions
            .read()
            .await
            .keys()
            .map(ToString::to_string)
            .collect();
        self.owners().retain(|id, _| live.contains(id));
    }
}

/// A response body that keeps its connection counted as busy until it is sent (or dropped):
/// an SSE stream or a long call is never closed as idle.
struct Tracked {
    body: Body,
    _in_flight: InFlight,
}

impl hyper::body::Body for Tracked {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Infallible>>> {
        std::pin::Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

/// Raises this process's open-file limit to its maximum (each connection is a file
/// descriptor) and returns what `max_connections` can be with it: room is left for kernels
/// (about 16 descriptors per session, and the notebook's host record it keeps open with its
/// directory) and ipybox's own files.
fn fit_connections(max_connections: usize, max_sessions: usize) -> usize {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut limit = getrlimit(Resource::Nofile);
    if limit.current < limit.maximum {
        let raised = rustix::process::Rlimit {
            current: limit.maximum,
            maximum: limit.maximum,
        };
        if setrlimit(Resource::Nofile, raised).is_ok() {
            limit = getrlimit(Resource::Nofile);
        }
    }
    let Some(files) = limit.current else {
        return max_connections;
    };
    let reserve = 256 + 18 * max_sessions;
    let room = usize::try_from(files)
        .unwrap_or(usize::MAX)
        .saturating_sub(reserve)
        .max(64);
    if room < max_connections {
        tracing::warn!(
            "at most {files} open files (ulimit -n): serving at most {room} connections, not {max_connections} (--max-connections); raise the limit to serve more"
        );
        return room;
    }
    max_connections
}

/// Whether `addr` is a loopback address (binding anything else needs a token).
fn loopback(addr: &SocketAddr) -> bool {
    addr.ip().is_loopback()
}

/// The browser origins accepted: `--allowed-origin`s, plus the loopback origins when bound to
/// loopback (pages on this machine, e.g. the MCP Inspector; DNS rebinding pages carry their
/// own origin and stay refused).
fn allowed_origins(options: &HttpOptions) -> Vec<String> {
    let mut origins = options.allowed_origins.clone();
    if loopback(&options.addr) {
        for host in ["localhost", "127.0.0.1", "[::1]"] {
            for scheme in ["http", "https"] {
                origins.push(format!("{scheme}://{host}:*"));
            }
        }
    }
    origins
}

/// Serves until SIGTERM or SIGINT, then shuts down (see the module docs).
pub(crate) async fn serve_http(
    options: HttpOptions,
    config: ServerConfig,
    factory: ExecutorFactory,
) -> Result<(), std::io::Error> {
    use tokio::signal::unix::{SignalKind, signal};
    refuse_exposure(&options)?;
    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sigint = signal(SignalKind::interrupt())?;
    let listener = tokio::net::TcpListener::bind(options.addr)
        .await
        .map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!(
                    "cannot listen on {}: {e}\n  help: pick a free port, or an address of this machine",
                    options.addr
                ),
            )
        })?;
    let bound = listener.local_addr()?;
    let origins = allowed_origins(&options);
    let registry = Registry::new(options.sessions.clone(), options.session_key, factory);
    let source: Arc<dyn SessionSource> = Arc::new(registry.clone());
    let handlers = IpyboxServer::factory(source, config, options.session_header);
    let mut manager = LocalSessionManager::default();
    // rmcp ends a handshake-era MCP session after this long without any message; its kernel
    // session is closed after --idle-timeout already (a running cell counts as activity there,
    // not here), so this is generous.
    manager.session_config.keep_alive = Some(
        options
            .sessions
            .idle_timeout
            .saturating_mul(2)
            .saturating_add(Duration::from_secs(600)),
    );
    let manager = Arc::new(manager);
    let cancel = CancellationToken::new();
    let mut mcp_config = StreamableHttpServerConfig::default()
        .with_cancellation_token(cancel.clone())
        .with_max_request_body_bytes(options.max_body_bytes)
        .with_json_response(true)
        .with_allowed_origins(origins)
        .enforce_origin_validation();
    mcp_config = if !options.allowed_hosts.is_empty() {
        mcp_config.with_allowed_hosts(options.allowed_hosts.clone())
    } else if loopback(&options.addr) {
        mcp_config // rmcp's default: the loopback names
    } else {
        mcp_config.disable_allowed_hosts()
    };
    let mcp = StreamableHttpService::new(move || Ok(handlers()), manager.clone(), mcp_config);
    let state = Arc::new(State {
        tokens: options.tokens,
        mcp,
        manager,
        owners: Default::default(),
        draining: AtomicBool::new(false),
    });
    tracing::info!(
        "serving MCP at http://{bound}/mcp ({} kernel sessions at most, closed after {} s idle)",
        options.sessions.max_sessions,
        session_store::secs_text(options.sessions.idle_timeout)
    );
    let reaper = spawn_reaper(&options.sessions, registry.clone(), state.clone());
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut limits = options.connections;
    limits.max_connections = fit_connections(limits.max_connections, options.sessions.max_sessions);
    let connections = Connections::new(limits);
    let sweeper = {
        let connections = connections.clone();
        tokio::spawn(async move {
            let mut interval = tokio::time::interval(Duration::from_millis(250));
            loop {
                interval.tick().await;
                connections.sweep();
            }
        })
    };
    // Refusals are logged at most every 10 s (a flood would fill the log).
    let mut refused_logged: Option<(tokio::time::Instant, u64)> = None;
    let signal_name = loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    tracing::warn!("accepting a connection failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = sigterm.recv() => break "SIGTERM",
            _ = sigint.recv() => break "SIGINT",
        };
        let connection = match connections.admit(peer.ip()) {
            Ok(connection) => Arc::new(connection),
            Err(connections::Refused::Busy) => {
                log_refused(&mut refused_logged, limits.max_connections);
                continue;
            }
        };
        serve_connection(stream, connection, &state, &limits, &graceful);
    };
    sweeper.abort();
    tracing::info!(
        "{signal_name}: shutting down (running calls get {} s)",
        session_store::secs_text(options.shutdown_grace)
    );
    state.draining.store(true, Ordering::SeqCst);
    drop(listener);
    reaper.abort();
    // Closing every session is bounded: the grace, then at most SHUTDOWN_BOUND for stopping
    // kernels (gateway calls time out on their own). A second signal exits at once (local
    // kernels end with ipybox: stdin EOF, PDEATHSIG; gateway kernels may be left: the log says).
    tokio::select! {
        () = registry.close_all(options.shutdown_grace) => {}
        () = tokio::time::sleep(options.shutdown_grace + SHUTDOWN_BOUND) => {
            tracing::warn!("sessions still closing after {} s: exiting; kernels on a gateway may be left running", session_store::secs_text(options.shutdown_grace + SHUTDOWN_BOUND));
        }
        _ = sigterm.recv() => tracing::warn!("second SIGTERM: exiting now; kernels on a gateway may be left running"),
        _ = sigint.recv() => tracing::warn!("second SIGINT: exiting now; kernels on a gateway may be left running"),
    }
    // Ends the SSE streams and handshake-era sessions still open.
    cancel.cancel();
    if tokio::time::timeout(Duration::from_secs(2), graceful.shutdown())
        .await
        .is_err()
    {
        tracing::debug!("some connections were still open at exit");
    }
    Ok(())
}

/// Refuses a service that anyone who reaches it could use to run code (no token off
/// loopback), or whose tenants would share local kernels they could reach each other through.
fn refuse_exposure(options: &HttpOptions) -> Result<(), std::io::Error> {
    if !loopback(&options.addr) && !options.tokens.any() {
        return Err(std::io::Error::other(format!(
            "refusing to serve on {} without a bearer token: anyone who reaches it could run code\n  help: pass --token-file FILE (or --token, or IPYBOX_TOKEN) with a long random token, or bind 127.0.0.1",
            options.addr
        )));
    }
    if options.tokens.count() > 1
        && !options.trust_tenants
        && let Some(shared) = &options.tenant_gap
    {
        let fix = if options.sessions.confined {
            "confine sessions fully (as root, without --session-uids none, --session-network host, --allow-register and --allow-install), "
        } else {
            "confine sessions (drop --unconfined-sessions and --sandbox), "
        };
        return Err(std::io::Error::other(format!(
            "{} tokens (tenants) would share local kernels: {shared}\n  help: {fix}run kernels on a gateway (--kernel-gateway: kernels never touch this host's files), or pass --trust-tenants if these tenants trust each other",
            options.tokens.count()
        )));
    }
    Ok(())
}

/// The reaper: idle sessions expired, hibernated and checkpointed, and gone owners pruned,
/// looking often enough for the shortest of the idle times it acts on.
fn spawn_reaper(
    sessions: &SessionConfig,
    registry: Arc<Registry>,
    state: Arc<State>,
) -> tokio::task::JoinHandle<()> {
    let shortest = [
        Some(sessions.idle_timeout),
        sessions.hibernate_after,
        sessions.checkpoint_after,
    ]
    .into_iter()
    .flatten()
    .min()
    .unwrap_or(sessions.idle_timeout);
    let tick = (shortest / 10).clamp(Duration::from_millis(100), Duration::from_secs(5));
    tokio::spawn(async move {
        let mut interval = tokio::time::interval(tick);
        loop {
            interval.tick().await;
            registry.reap();
            state.prune_owners().await;
        }
    })
}

/// Logs a connection refused because every connection is busy, at most every 10 s (a flood
/// would fill the log), with how many more were refused meanwhile.
fn log_refused(logged: &mut Option<(tokio::time::Instant, u64)>, max_connections: usize) {
    let now = tokio::time::Instant::now();
    match logged {
        Some((at, n)) if now.duration_since(*at) < Duration::from_secs(10) => *n += 1,
        _ => {
            let before = logged.map_or(0, |(_, n)| n);
            tracing::warn!(
                "refused a connection: all {} connections are busy with requests (--max-connections){}",
                max_connections,
                if before > 0 {
                    format!("; {before} more refused in the last 10 s")
                } else {
                    String::new()
                }
            );
            *logged = Some((now, 0));
        }
    }
}

/// Serves one admitted connection (HTTP/1.1) until it ends, the table closes it or the
/// service shuts down.
fn serve_connection(
    stream: tokio::net::TcpStream,
    connection: Arc<Connection>,
    state: &Arc<State>,
    limits: &connections::Limits,
    graceful: &hyper_util::server::graceful::GracefulShutdown,
) {
    let _ = stream.set_nodelay(true);
    let closing = connection.closing();
    let service = {
        let (state, connection) = (state.clone(), connection.clone());
        service_fn(move |req: Request<Incoming>| {
            let (state, connection) = (state.clone(), connection.clone());
            async move {
                let in_flight = connection.request();
                let response = state.route(req, &connection).await;
                super::metrics::http_response(response.status().as_u16());
                Ok::<_, Infallible>(response.map(|body| {
                    Tracked {
                        body,
                        _in_flight: in_flight,
                    }
                    .boxed()
                }))
            }
        })
    };
    // Timeouts are the connection table's (a silent connection, an idle keep-alive one);
    // hyper's own header timeout is a backstop above both.
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(limits.keep_alive + limits.first_request + Duration::from_secs(5))
        .serve_connection(TokioIo::new(stream), service);
    let watched = graceful.watch(conn);
    tokio::spawn(async move {
        tokio::select! {
            ended = watched => {
                if let Err(e) = ended {
                    tracing::debug!("connection ended: {e}");
                }
            }
            () = closing.cancelled() => {}
        }
        drop(connection);
    });
}
