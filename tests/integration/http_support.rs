//! What the tests of `ipybox serve --http` share: the service as a child process (waited for on
//! `/healthz`, stopped with SIGTERM), rmcp clients of either MCP era connected to it over
//! Streamable HTTP with a bearer token, a cell call that returns (is_error, text) and the
//! session handle a result names, a start that must be refused, and a tiny round-robin HTTP proxy (what "a plain load
//! balancer" does: every request to the next backend, a dead backend skipped).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use rmcp::model::{CallToolRequestParams, CallToolResult, ClientConfig};
use rmcp::service::RunningService;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{ClientHandler, RoleClient};
use serde_json::{Map, Value, json};

use crate::mcp_eras::{CallTool, Era};
use crate::support::{BIN, free_port};

/// A token the tests configure (long enough for ipybox's minimum).
pub(crate) const TOKEN_A: &str = "token-a-0123456789abcdef";
pub(crate) const TOKEN_B: &str = "token-b-0123456789abcdef";

/// `ipybox serve --http 127.0.0.1:PORT` as a child process; SIGKILLed when dropped.
pub(crate) struct Service {
    child: Option<Child>,
    pub(crate) port: u16,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Service {
    /// Starts the service for workspace `ws` with `flags` and `env`, and waits until
    /// `/healthz` answers.
    pub(crate) fn start(ws: &Path, env: &[(&str, &str)], flags: &[&str]) -> Self {
        Self::start_on(free_port(), ws, env, flags)
    }

    pub(crate) fn start_on(port: u16, ws: &Path, env: &[(&str, &str)], flags: &[&str]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("ipybox.log");
        let file = std::fs::File::create(&log).unwrap();
        // The sessions' notebooks go to the test's directory, not the user's data directory
        // (unless the test names one: flags, or an IPYBOX_HOME of its own for the default).
        let notebooks = dir.path().join("notebooks");
        let own_notebooks = !flags
            .iter()
            .any(|f| *f == "--notebook-dir" || *f == "--no-notebook")
            && !env.iter().any(|(k, _)| *k == "IPYBOX_HOME");
        let mut command = Command::new(BIN);
        command.args(["serve", "--http", &format!("127.0.0.1:{port}")]);
        if own_notebooks {
            command.arg("--notebook-dir").arg(&notebooks);
        }
        let child = command
            .arg("--workspace")
            .arg(ws)
            .args(flags)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .expect("ipybox serve starts");
        let mut service = Self {
            child: Some(child),
            port,
            log,
            _dir: dir,
        };
        service.wait_healthy();
        service
    }

    fn wait_healthy(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if healthz(self.port) == Some(200) {
                return;
            }
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                panic!("ipybox serve exited early ({status}):\n{}", self.log());
            }
            assert!(
                Instant::now() < deadline,
                "ipybox serve did not answer /healthz within 30 s:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub(crate) fn url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.port)
    }

    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// SIGTERM, then waits up to `within` for the exit; returns the status and how long it took.
    pub(crate) fn terminate(&mut self, within: Duration) -> (ExitStatus, Duration) {
        let mut child = self.child.take().expect("still running");
        let started = Instant::now();
        // SAFETY: signalling our own child.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return (status, started.elapsed());
            }
            if started.elapsed() > within {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "ipybox serve did not exit within {within:?} of SIGTERM:\n{}",
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL (no chance to clean up).
    pub(crate) fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `ipybox serve --http <host>:<free port> --workspace WS FLAGS...` that must refuse to start:
/// asserts exit status 1 and returns its stderr. `env`: variables set (`Some`) or removed
/// (`None`) for it.
pub(crate) fn serve_refused(
    host: &str,
    ws: &Path,
    flags: &[&str],
    env: &[(&str, Option<&str>)],
) -> String {
    let mut command = Command::new(BIN);
    command
        .args(["serve", "--http", &format!("{host}:{}", free_port())])
        .args(flags)
        .arg("--workspace")
        .arg(ws);
    for (name, value) in env {
        match value {
            Some(value) => command.env(name, value),
            None => command.env_remove(name),
        };
    }
    // A service that was not refused serves until killed: waited for 60 s at most.
    let log = tempfile::NamedTempFile::new().unwrap();
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log.reopen().unwrap())
        .spawn()
        .expect("ipybox serve starts");
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "ipybox serve {flags:?} was not refused: still running after 60 s\n{}",
                std::fs::read_to_string(log.path()).unwrap()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let stderr = std::fs::read_to_string(log.path()).unwrap();
    assert_eq!(status.code(), Some(1), "{stderr}");
    stderr
}

/// The status of `GET /healthz`, if the port answers.
pub(crate) fn healthz(port: u16) -> Option<u16> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .ok()?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).ok()?;
    buf.split(' ').nth(1)?.parse().ok()
}

/// An rmcp client connected to an ipybox service over Streamable HTTP.
pub(crate) struct HttpClient<H: ClientHandler> {
    pub(crate) service: RunningService<RoleClient, H>,
}

/// A client that declares nothing.
pub(crate) type PlainHttp = HttpClient<ClientConfig>;

/// Connects `handler` to `url` in `era`, sending `token` as a bearer token; asserts the
/// negotiated revision.
pub(crate) async fn connect_with<H: ClientHandler>(
    url: &str,
    token: Option<&str>,
    handler: H,
    era: Era,
) -> HttpClient<H> {
    let mut config = StreamableHttpClientTransportConfig::with_uri(url.to_string());
    if let Some(token) = token {
        config = config.auth_header(token.to_string());
    }
    let transport = StreamableHttpClientTransport::from_config(config);
    let service = crate::mcp_eras::serve_in(era, handler, transport)
        .await
        .expect("connects to ipybox over HTTP");
    HttpClient { service }
}

/// [`connect_with`] for a client that declares nothing.
pub(crate) async fn connect(url: &str, token: Option<&str>, era: Era) -> PlainHttp {
    let config = ClientConfig::default().with_protocol_version(era.version());
    connect_with(url, token, config, era).await
}

impl<H: ClientHandler> HttpClient<H> {
    /// Ends the client (a handshake-era client DELETEs its MCP session).
    pub(crate) async fn close(self) {
        let _ = self.service.cancel().await;
    }
}

impl<H: ClientHandler> CallTool for HttpClient<H> {
    async fn call_tool_json(
        &self,
        tool: &str,
        arguments: Map<String, Value>,
    ) -> Result<CallToolResult, String> {
        let params = CallToolRequestParams::new(tool.to_string()).with_arguments(arguments);
        self.service
            .call_tool(params)
            .await
            .map_err(|e| e.to_string())
    }
}

/// The text of a tool result and whether it is an error.
pub(crate) fn text_of(result: &CallToolResult) -> (bool, String) {
    let text = result
        .content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect::<Vec<_>>()
        .join("\n");
    (result.is_error == Some(true), text)
}

/// Runs `code` (in `session`, if given); returns (is_error, text).
pub(crate) async fn cell(
    client: &impl CallTool,
    code: &str,
    session: Option<&str>,
) -> (bool, String) {
    let mut arguments = json!({"code": code});
    if let Some(session) = session {
        arguments["session"] = json!(session);
    }
    let result = client
        .call_tool_json(
            "execute_ipython_cell",
            arguments.as_object().unwrap().clone(),
        )
        .await
        .unwrap_or_else(|e| panic!("tools/call failed: {e}"));
    text_of(&result)
}

/// The note a result carries about its session: `(text before it, handle)`.
pub(crate) fn split_note(text: &str) -> (String, Option<String>) {
    match text.rfind("[ipybox session ") {
        Some(at) => {
            let handle = text[at + "[ipybox session ".len()..]
                .split(':')
                .next()
                .map(str::to_string);
            (text[..at].trim_end().to_string(), handle)
        }
        None => (text.to_string(), None),
    }
}

/// Runs `code` in a new session (2026-07-28): returns its output and the new handle.
pub(crate) async fn new_session(client: &impl CallTool, code: &str) -> (String, String) {
    let (is_error, text) = cell(client, code, None).await;
    let (output, handle) = split_note(&text);
    let handle = handle.unwrap_or_else(|| panic!("no session handle in: {text}"));
    assert!(!is_error, "{text}");
    assert_eq!(
        text,
        format!(
            "{}[ipybox session {handle}: a new kernel session; pass session=\"{handle}\" in later calls to keep its state]",
            if output.is_empty() {
                String::new()
            } else {
                format!("{output}\n\n")
            }
        )
    );
    (output, handle)
}

/// A round-robin HTTP/1.1 proxy: each request goes to the next backend; a backend that cannot
/// be reached is skipped (the request goes to the one after). Responses stream through (SSE).
pub(crate) struct Proxy {
    pub(crate) port: u16,
    /// How many requests each backend served.
    pub(crate) served: Arc<Vec<AtomicUsize>>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    pub(crate) async fn start(backends: Vec<u16>) -> Self {
        use http_body_util::{BodyExt, StreamBody};
        use hyper::body::Frame;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let served: Arc<Vec<AtomicUsize>> =
            Arc::new(backends.iter().map(|_| AtomicUsize::new(0)).collect());
        let next = Arc::new(AtomicUsize::new(0));
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(2))
            .build()
            .unwrap();
        let backends = Arc::new(backends);
        let counts = served.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let (client, backends, next, counts) = (
                    client.clone(),
                    backends.clone(),
                    next.clone(),
                    counts.clone(),
                );
                let service = hyper::service::service_fn(
                    move |req: hyper::Request<hyper::body::Incoming>| {
                        let (client, backends, next, counts) = (
                            client.clone(),
                            backends.clone(),
                            next.clone(),
                            counts.clone(),
                        );
                        async move {
                            let (parts, body) = req.into_parts();
                            let body = body
                                .collect()
                                .await
                                .map(|b| b.to_bytes())
                                .unwrap_or_default();
                            let first = next.fetch_add(1, Ordering::SeqCst);
                            for attempt in 0..backends.len() {
                                let i = (first + attempt) % backends.len();
                                let url = format!(
                                    "http://127.0.0.1:{}{}",
                                    backends[i],
                                    parts.uri.path_and_query().map_or("/", |p| p.as_str())
                                );
                                let mut out = client.request(parts.method.clone(), url);
                                for (name, value) in &parts.headers {
                                    if name != hyper::header::HOST
                                        && name != hyper::header::CONNECTION
                                        && name != hyper::header::CONTENT_LENGTH
                                    {
                                        out = out.header(name, value);
                                    }
                                }
                                match out.body(body.clone()).send().await {
                                    Ok(resp) => {
                                        counts[i].fetch_add(1, Ordering::SeqCst);
                                        let mut builder = hyper::Response::builder()
                                            .status(resp.status().as_u16());
                                        for (name, value) in resp.headers() {
                                            if name != hyper::header::CONTENT_LENGTH
                                                && name != hyper::header::TRANSFER_ENCODING
                                                && name != hyper::header::CONNECTION
                                            {
                                                builder = builder.header(name, value);
                                            }
                                        }
                                        let stream =
                                            futures::StreamExt::map(resp.bytes_stream(), |chunk| {
                                                chunk.map(Frame::data)
                                            });
                                        let body = StreamBody::new(stream).boxed();
                                        return Ok::<_, std::convert::Infallible>(
                                            builder.body(body).unwrap(),
                                        );
                                    }
                                    Err(e) if e.is_connect() => continue,
                                    Err(e) => {
                                        let body = http_body_util::Full::new(bytes::Bytes::from(
                                            format!("proxy: {e}"),
                                        ))
                                        .map_err(|never| match never {})
                                        .boxed();
                                        return Ok(hyper::Response::builder()
                                            .status(502)
                                            .body(body)
                                            .unwrap());
                                    }
                                }
                            }
                            let body = http_body_util::Full::new(bytes::Bytes::from(
                                "proxy: no backend answers",
                            ))
                            .map_err(|never| match never {})
                            .boxed();
                            Ok(hyper::Response::builder().status(502).body(body).unwrap())
                        }
                    },
                );
                tokio::spawn(async move {
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Self { port, served, task }
    }

    pub(crate) fn url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.port)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The metric `name` (with its labels) from `/metrics`.
pub(crate) async fn metric(port: u16, token: Option<&str>, name: &str) -> f64 {
    let mut req = reqwest::Client::new().get(format!("http://127.0.0.1:{port}/metrics"));
    if let Some(token) = token {
        req = req.bearer_auth(token);
    }
    let text = req.send().await.unwrap().text().await.unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix(' ')))
        .unwrap_or_else(|| panic!("no {name} in:\n{text}"))
        .parse()
        .unwrap()
}

/// What every file a hidden-path probe plants holds (and [`read_probe`] looks for).
pub(crate) const PLANTED: &str = "planted-secret-5e1f";

/// Python that reads each `(label, path)` and prints one `label=<outcome>` line: `read` when
/// the text holds [`PLANTED`], `empty` when there is none (a file hidden behind an empty one),
/// `other` for any other text, else the error's type (`FileNotFoundError`: a file in a hidden
/// directory).
pub(crate) fn read_probe(paths: &[(&str, &Path)]) -> String {
    let mut code = String::from(
        "def _probe(label, path):\n    try:\n        text = open(path).read()\n        print(f'{label}=' + ('read' if '",
    );
    code.push_str(PLANTED);
    code.push_str("' in text else 'empty' if text == '' else 'other'))\n    except OSError as e:\n        print(f'{label}=' + type(e).__name__)\n");
    for (label, path) in paths {
        code.push_str(&format!(
            "_probe({}, {})\n",
            serde_json::to_string(label).unwrap(),
            serde_json::to_string(&path.display().to_string()).unwrap()
        ));
    }
    code.push_str("del _probe");
    code
}

/// The lines [`read_probe`] prints for these `(label, outcome)`s.
pub(crate) fn probe_outcome(labels: &[(&str, &str)]) -> String {
    labels
        .iter()
        .map(|(label, outcome)| format!("{label}={outcome}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// A host-side signal that kernel code ran, which a confined kernel can send (it cannot write
/// anywhere the host looks): a TCP connection to a loopback port the test listens on. The host's
/// loopback is in a confined kernel's reach only with `--session-network host`.
pub(crate) struct Knock {
    listener: std::net::TcpListener,
    seen: std::cell::Cell<usize>,
}

impl Knock {
    pub(crate) fn new() -> Self {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        Self {
            listener,
            seen: std::cell::Cell::new(0),
        }
    }

    /// Python that knocks once.
    pub(crate) fn code(&self) -> String {
        format!(
            "__import__('socket').create_connection(('127.0.0.1', {})).close()",
            self.listener.local_addr().unwrap().port()
        )
    }

    /// How many knocks came so far.
    pub(crate) fn count(&self) -> usize {
        while self.listener.accept().is_ok() {
            self.seen.set(self.seen.get() + 1);
        }
        self.seen.get()
    }
}
