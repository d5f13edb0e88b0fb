//! What the integration tests share, written once: where prepared components live and the
//! skip rule when they are missing ([`require!`]), real MCP servers to start (the Python fixture
//! `tests/fixtures/mcp_fixture.py` and `@modelcontextprotocol/server-everything`), registering
//! them (sync or async API), an executor (and a streamed execution whose approvals a closure
//! decides), and process checks (clients of the ipybox MCP server, in both MCP eras: `mcp_eras`).
//!
//! Prepared components: `target/test-env/` (`scripts/test-env.sh`),
//! `target/sandbox-deps/` (`scripts/sandbox-deps.sh`) and `target/clients/`
//! (`scripts/clients.sh`). Under plain `cargo test` a test that needs
//! a missing one prints one `skipped` line naming what to run and passes; under
//! `bash scripts/test.sh` (which sets `IPYBOX_TEST_STRICT=1` after preparing them) it fails.

use std::collections::HashMap;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ipybox::CodeExecutor;
use ipybox::apigen::ApiStyle;
use ipybox::executor::{ExecutionEvent, ExecutorError};
use ipybox::tools::{DEFAULT_CONNECT_TIMEOUT, tool_output};
use rmcp::model::CallToolResult;

pub(crate) use crate::apigen_cli::apigen_fx;
pub(crate) use crate::mcp_eras::CallTool;
use serde_json::{Map, Value, json};

/// The ipybox binary under test.
pub(crate) const BIN: &str = env!("CARGO_BIN_EXE_ipybox");

pub(crate) fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A prepared component some tests need.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Need {
    /// `target/test-env/`: the Python `mcp` SDK venv and the npm MCP servers.
    TestEnv,
    /// `target/sandbox-deps/`: srt (plus bubblewrap, socat, ripgrep from apt).
    SandboxDeps,
    /// `target/clients/`: Node 22, the TypeScript MCP SDK's client and Claude Code
    /// (`scripts/clients.sh`).
    Clients,
}

impl Need {
    fn marker(self) -> PathBuf {
        match self {
            Need::TestEnv => root().join("target/test-env/.stamp"),
            Need::SandboxDeps => root().join("target/sandbox-deps/node_modules/.bin/srt"),
            Need::Clients => root().join("target/clients/.stamp"),
        }
    }

    fn script(self) -> &'static str {
        match self {
            Need::TestEnv => "scripts/test-env.sh",
            Need::SandboxDeps => "scripts/sandbox-deps.sh",
            Need::Clients => "scripts/clients.sh",
        }
    }
}

/// True when every component in `needs` is prepared. Otherwise, under `IPYBOX_TEST_STRICT=1`
/// (set by `scripts/test.sh`) it panics; else it prints one `skipped` line saying what to run,
/// straight to stderr (libtest does not capture that), and returns false.
pub(crate) fn ready(needs: &[Need]) -> bool {
    let missing: Vec<Need> = needs
        .iter()
        .copied()
        .filter(|n| !n.marker().exists())
        .collect();
    if missing.is_empty() {
        return true;
    }
    let scripts: Vec<&str> = missing.iter().map(|n| n.script()).collect();
    skip(&format!(
        "needs {} (run `bash scripts/test.sh`, or `bash {}` first)",
        scripts.join(" and "),
        scripts.join(" && bash ")
    ));
    false
}

/// The one way a test skips (every skip goes through here): under `IPYBOX_TEST_STRICT=1` it
/// panics (a skip is a failure); else it prints one `skipped <test>: <why>` line straight to
/// stderr (libtest does not capture that). The caller then returns.
pub(crate) fn skip(why: &str) {
    let test = std::thread::current()
        .name()
        .unwrap_or("a test")
        .to_string();
    let line = format!("skipped {test}: {why}");
    assert!(std::env::var_os("IPYBOX_TEST_STRICT").is_none(), "{line}");
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// Where a kernel sees nothing whatever ipybox hides: `/tmp`, `/var/tmp`, `$TMPDIR`, `$HOME`,
/// `$XDG_RUNTIME_DIR`, `/run` and ipybox's data directory are empty (or private) in every
/// confined kernel, so a probe of a "hidden" path there passes whatever the product does (and
/// srt makes `/tmp`, `/var/tmp` and `/run` empty *writable* tmpfs: a sandboxed write there
/// "succeeds" and never reaches the host).
pub(crate) fn private_to_kernels(path: &Path) -> bool {
    let host = ipybox::host_env::HostEnv::from_process();
    let mut places: Vec<PathBuf> = vec!["/tmp".into(), "/var/tmp".into(), "/run".into()];
    places.extend(
        ["TMPDIR", "HOME", "XDG_RUNTIME_DIR"]
            .iter()
            .filter_map(|v| host.get(v).map(PathBuf::from)),
    );
    places.extend(host.data_dir());
    let canonical = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    places.iter().any(|p| {
        let p = p.canonicalize().unwrap_or_else(|_| p.clone());
        p.components().count() > 1 && (path.starts_with(&p) || canonical.starts_with(&p))
    })
}

/// A fresh directory where an operator's files would be (their `/etc`, `/srv`), which kernels
/// see (read-only), unlike `/tmp` and `$HOME`: under `$IPYBOX_TEST_PROBE_DIR` if set, else this
/// checkout's `target/`, else (a checkout under `/tmp` or `$HOME`) `/var/lib/ipyprobe`
/// (not `/var/tmp`, which srt hides). Probes of
/// what ipybox hides put their files here, next to a file that is not hidden (the control: the
/// kernel reads that one, so the place is in its view). `None` (after [`skip`]) when there is no
/// such place.
pub(crate) fn probe_dir(name: &str) -> Option<tempfile::TempDir> {
    probe_dir_within(name, usize::MAX)
}

/// A [`probe_dir`] whose path has at most `max` bytes (a runtime base for sockets): the first
/// place that is short enough (`/var/lib/ipyprobe` when the checkout's `target/` is not).
pub(crate) fn probe_dir_within(name: &str, max: usize) -> Option<tempfile::TempDir> {
    let mut candidates: Vec<PathBuf> = std::env::var_os("IPYBOX_TEST_PROBE_DIR")
        .map(PathBuf::from)
        .into_iter()
        .collect();
    if candidates.is_empty() {
        candidates = vec![root().join("target"), PathBuf::from("/var/lib/ipyprobe")];
    }
    let prefix = format!("p-{name}-");
    // The directory's own name: the prefix and six random characters.
    let fits = |c: &Path| c.as_os_str().len() + 1 + prefix.len() + 6 <= max;
    let Some(base) = candidates
        .iter()
        .find(|c| fits(c) && std::fs::create_dir_all(c).is_ok() && !private_to_kernels(c))
    else {
        skip(&format!(
            "none of {candidates:?} is outside what every kernel sees empty (/tmp, $HOME, $TMPDIR, /run, the data directory) and short enough ({max} bytes with the probe's name): a probe of a hidden path there proves nothing; set IPYBOX_TEST_PROBE_DIR to a short writable directory elsewhere"
        ));
        return None;
    };
    let dir = tempfile::Builder::new()
        .prefix(&prefix)
        .tempdir_in(base)
        .unwrap();
    Some(dir)
}

/// A [`probe_dir`] kept until dropped, by its canonical path: for tests that hand the path to
/// kernels and compare it with what they print. Panics (a failure, not a skip) when there is no
/// probe place.
pub(crate) struct Probe(PathBuf);

impl Probe {
    pub(crate) fn new(name: &str) -> Self {
        Self::within(name, usize::MAX)
    }

    /// A probe directory of at most `max` bytes ([`probe_dir_within`]).
    pub(crate) fn within(name: &str, max: usize) -> Self {
        let dir = probe_dir_within(name, max)
            .expect("a probe directory (see support::probe_dir)")
            .keep();
        Self(dir.canonicalize().unwrap())
    }

    pub(crate) fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Returns from the calling test (after one `skipped` line) unless [`probe_dir`] has a place.
macro_rules! probe_dir_or_skip {
    ($name:expr) => {
        match $crate::support::probe_dir($name) {
            Some(dir) => dir,
            None => return,
        }
    };
}
pub(crate) use probe_dir_or_skip;

/// Returns from the calling test (after one `skipped` line) unless the components are there.
macro_rules! require {
    ($($need:ident),+) => {
        if !$crate::support::ready(&[$($crate::support::Need::$need),+]) {
            return;
        }
    };
}
pub(crate) use require;

fn existing(path: PathBuf) -> String {
    assert!(
        path.exists(),
        "{} is missing: run `bash scripts/test-env.sh` first to provision the test environment",
        path.display()
    );
    path.to_string_lossy().into_owned()
}

/// Python of the test venv (has `mcp`, pydantic, hypothesis-jsonschema).
pub(crate) fn python() -> String {
    existing(root().join("target/test-env/venv/bin/python"))
}

/// The `mcp-server-everything` launcher.
pub(crate) fn everything_bin() -> String {
    existing(root().join("target/test-env/node_modules/.bin/mcp-server-everything"))
}

pub(crate) fn fixture_script() -> String {
    existing(root().join("tests/fixtures/mcp_fixture.py"))
}

/// The process environment, as ipybox would pass it to the session layer.
pub(crate) fn process_env() -> HashMap<String, String> {
    std::env::vars().collect()
}

/// stdio params for the fixture in `mode` (`stdio`, `crash`, `hang`).
pub(crate) fn fixture_stdio_params(mode: &str) -> Value {
    json!({"command": python(), "args": [fixture_script(), mode]})
}

pub(crate) fn everything_stdio_params() -> Value {
    json!({"command": everything_bin(), "args": ["stdio"]})
}

pub(crate) fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A server process listening on a loopback port; killed on drop.
pub(crate) struct HttpServer {
    child: Child,
    pub port: u16,
}

impl HttpServer {
    pub(crate) fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{}", self.port, path)
    }

    fn wait_ready(mut self) -> Self {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return self;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("test MCP server exited early ({status})");
            }
            assert!(
                Instant::now() < deadline,
                "test MCP server did not listen on port {} within 30 s",
                self.port
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts the Python fixture over `sse` or `http` (streamable), optionally at a custom path.
pub(crate) fn start_fixture(mode: &str, path: Option<&str>) -> HttpServer {
    let port = free_port();
    let mut cmd = Command::new(python());
    cmd.arg(fixture_script()).arg(mode).arg(port.to_string());
    if let Some(p) = path {
        cmd.arg(p);
    }
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn fixture");
    HttpServer { child, port }.wait_ready()
}

/// Starts server-everything over `sse` or `streamableHttp`.
pub(crate) fn start_everything(mode: &str) -> HttpServer {
    let port = free_port();
    let child = Command::new(everything_bin())
        .arg(mode)
        .env("PORT", port.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn server-everything");
    HttpServer { child, port }.wait_ready()
}

/// True while a process with this pid exists (zombies count as existing).
pub(crate) fn pid_exists(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// Waits up to `within` for `pid` to be reaped (its /proc entry gone, zombie included).
pub(crate) async fn wait_reaped(pid: u32, within: Duration) -> bool {
    let start = Instant::now();
    while pid_exists(pid) && start.elapsed() < within {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    !pid_exists(pid)
}

/// True while `pid` runs; a zombie counts as gone (its state is read from /proc).
pub(crate) fn pid_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .split(") ")
            .nth(1)
            .is_some_and(|rest| rest.starts_with('Z')),
        Err(_) => false,
    }
}

/// Waits up to `within` for `pid` to be gone.
pub(crate) async fn wait_gone(pid: u32, within: Duration) -> bool {
    let start = Instant::now();
    while start.elapsed() < within {
        if !pid_alive(pid) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    !pid_alive(pid)
}

/// A started executor on `ws` without a spare kernel.
pub(crate) async fn executor(ws: &Path) -> CodeExecutor {
    let ex = CodeExecutor::builder()
        .workspace(ws)
        .without_spare_kernel()
        .build();
    ex.start().await.expect("executor starts");
    ex
}

/// Generates `ws/mcptools/<name>/` (`run()` in `style`) from the server at `params`; returns the
/// module names.
pub(crate) async fn register_styled(
    ws: &Path,
    name: &str,
    params: &Value,
    style: ApiStyle,
) -> Vec<String> {
    ipybox::generate_mcp_sources_with(
        name,
        params,
        &ws.join("mcptools"),
        &process_env(),
        DEFAULT_CONNECT_TIMEOUT,
        style,
    )
    .await
    .expect("registration")
}

/// [`register_styled`] with the default (synchronous) `run()`.
pub(crate) async fn register(ws: &Path, name: &str, params: &Value) -> Vec<String> {
    register_styled(ws, name, params, ApiStyle::Sync).await
}

/// Runs `code` (60 s timeout) and returns its text; panics with the output when it fails.
pub(crate) async fn run(ex: &CodeExecutor, code: &str) -> String {
    match ex.execute(code, Some(Duration::from_secs(60))).await {
        Ok(r) => r.text,
        Err(e) => panic!("code failed: {e}\noutput: {}", e.output()),
    }
}

/// Runs `code` with `stream()`, answering approval requests with `decide` (or not at all).
pub(crate) async fn stream_with(
    ex: &CodeExecutor,
    code: &str,
    timeout: Option<Duration>,
    decide: impl Fn(&str) -> Option<(bool, Duration)>,
) -> (Vec<String>, Result<String, ExecutorError>) {
    let mut execution = ex.stream(code, timeout);
    let mut asked = Vec::new();
    let mut held = Vec::new();
    while let Some(ev) = execution.next().await {
        match ev {
            ExecutionEvent::Approval(request) => {
                let described = request.describe();
                asked.push(described.clone());
                match decide(&described) {
                    Some((accept, delay)) => {
                        tokio::spawn(async move {
                            tokio::time::sleep(delay).await;
                            if accept {
                                request.accept()
                            } else {
                                request.reject()
                            }
                        });
                    }
                    None => held.push(request), // never answered
                }
            }
            ExecutionEvent::Result(r) => return (asked, r.map(|o| o.text)),
            _ => {}
        }
    }
    unreachable!("stream ends with a result")
}

/// A JSON object as tool-call arguments.
pub(crate) fn args(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => panic!("arguments must be an object"),
    }
}

/// Starts `ipybox --workspace WS EXTRA_ARGS` as an MCP server (with `extra_env` added to the
/// process environment) and connects ipybox's own MCP client to it (which keeps the server's
/// stderr: what the kernel factory tests read).
pub(crate) async fn connect_ipybox_with(
    ws: &Path,
    extra_args: &[&str],
    extra_env: &[(&str, &str)],
) -> ipybox::tools::McpSession {
    let env: Map<String, Value> = extra_env
        .iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect();
    let mut args = vec![
        json!("--workspace"),
        json!(ws),
        json!("--log-level"),
        json!("warn"),
    ];
    args.extend(extra_args.iter().map(|a| json!(a)));
    // No session handle in results (see `mcp_eras::start_with`).
    args.extend(
        crate::mcp_eras::checkpoints_off(extra_args)
            .iter()
            .map(|a| json!(a)),
    );
    let params = json!({"command": BIN, "args": args, "env": env});
    let params = ipybox::tools::ServerParams::parse(&params).unwrap();
    ipybox::tools::McpSession::connect(&params, &process_env(), Duration::from_secs(60))
        .await
        .expect("ipybox MCP server starts")
}

/// `tools/call` on an MCP session (or a client of the ipybox MCP server); panics if the
/// request itself fails.
pub(crate) async fn call(s: &impl CallTool, tool: &str, arguments: Value) -> CallToolResult {
    s.call_tool_json(tool, args(arguments))
        .await
        .unwrap_or_else(|e| panic!("{tool}: tools/call failed: {e}"))
}

/// Text of a successful, text-only result (panics with the text on isError).
pub(crate) async fn ok_text(s: &impl CallTool, tool: &str, arguments: Value) -> String {
    let r = call(s, tool, arguments).await;
    let out = tool_output(&r);
    assert!(!out.is_error, "{tool} failed:\n{}", out.text);
    assert!(
        r.structured_content.is_none(),
        "no structuredContent expected"
    );
    out.text
}

/// The kernel's interpreter, as ipybox resolves it from this process's environment.
pub(crate) fn kernel_python() -> PathBuf {
    let host = ipybox::host_env::HostEnv::from_process();
    ipybox::pyenv::resolve(None, &host, &ipybox::pyenv::log_progress())
        .expect("kernel environment")
        .python
}

/// Defines `emit(i, n)` in the kernel: prints `n` characters of a pattern that depends on `i`.
const EMIT_DEF: &str = "def emit(i, n):\n    line = ''.join(chr(97 + (i * 7 + j) % 26) for j in range(64))\n    s = (line * (n // 64 + 1))[:n]\n    print(s, end='')";

/// 1 000 executions printing pseudo-random sizes in 0..=100 000 bytes: each result must be
/// exactly what was printed. `what` names the executor in failures.
pub(crate) async fn thousand_random_sizes_arrive_intact(ex: &CodeExecutor, what: &str) {
    run(ex, EMIT_DEF).await;
    let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
    for i in 0..1000u64 {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let n = (seed % 100_001) as usize;
        let line: String = (0..64)
            .map(|j| (b'a' + ((i * 7 + j) % 26) as u8) as char)
            .collect();
        let expected: String = line.repeat(n / 64 + 1).chars().take(n).collect();
        let got = run(ex, &format!("emit({i}, {n})")).await;
        assert_eq!(got.len(), n, "{what}: execution {i}: size");
        assert!(got == expected, "{what}: execution {i}: content differs");
    }
}

/// Prints 10 MB: 100 000 numbered lines of 100 bytes.
pub(crate) const TEN_MEGABYTES: &str =
    "import sys\nfor i in range(100_000):\n    sys.stdout.write(f'{i:09d}' + 'x' * 90 + '\\n')";

/// One execution printing 10 MB ([`TEN_MEGABYTES`]): every line must arrive, in order.
pub(crate) async fn ten_megabytes_arrive_intact(ex: &CodeExecutor, what: &str) {
    let out = run(ex, TEN_MEGABYTES).await;
    assert_eq!(out.len(), 100_000 * 100 - 1, "{what}");
    for (i, line) in out.lines().enumerate() {
        assert_eq!(
            line,
            format!("{i:09}{}", "x".repeat(90)),
            "{what}: line {i}"
        );
    }
}

/// On an executor with `fx` (the fixture server) registered and an approval timeout of 1 s:
/// an accepted call runs, a rejected one raises `ApprovalRejected` in the kernel, an unanswered
/// one `ApprovalTimeout`. `what` names the executor in failures.
pub(crate) async fn approvals_accept_reject_and_time_out_on(ex: &CodeExecutor, what: &str) {
    let code = r#"
from mcptools.fx import greet, ApprovalRejected, ApprovalTimeout
for name in ["ok", "no"]:
    try:
        print(greet.run(greet.Params(name=name)))
    except ApprovalRejected as e:
        print("rejected:", e)
"#;
    let (asked, out) = stream_with(ex, code, None, |d| {
        Some((!d.contains("\"no\""), Duration::ZERO))
    })
    .await;
    assert_eq!(
        asked,
        [r#"fx.greet(name="ok")"#, r#"fx.greet(name="no")"#],
        "{what}"
    );
    assert_eq!(
        out.unwrap(),
        "Hello, ok!\nrejected: Approval request for fx.greet rejected: tool call fx.greet was rejected by the application",
        "{what}"
    );

    // No decision within the approval timeout (1 s): the call fails in the kernel.
    let code = "from mcptools.fx import greet, ApprovalTimeout\ntry:\n    greet.run(greet.Params(name='late'))\nexcept ApprovalTimeout as e:\n    print('timeout:', e)";
    let (_, out) = stream_with(ex, code, None, |_| None).await;
    assert_eq!(
        out.unwrap(),
        "timeout: Approval request for fx.greet expired: tool call fx.greet was not approved within 1 s, so it was not made",
        "{what}"
    );

    // Not caught: the error is the user's frames and the error, not ipybox's plumbing.
    let code = "from mcptools.fx import greet\ndef hello(name):\n    return greet.run(greet.Params(name=name))\nprint('before')\nhello('no')";
    let (_, out) = stream_with(ex, code, None, |_| Some((false, Duration::ZERO))).await;
    let e = out.expect_err("the rejection ends the cell");
    assert_eq!(e.output(), "before", "{what}");
    assert_eq!(
        cell_numbers_as_n(&e.error_text()),
        [
            "Traceback (most recent call last):",
            "  Cell In[N], line 5",
            "    hello('no')",
            "  Cell In[N], line 3, in hello",
            "    return greet.run(greet.Params(name=name))",
            "ApprovalRejectedError: Approval request for fx.greet rejected: tool call fx.greet was rejected by the application",
            &format!("  help: {REJECTED_HELP}"),
        ]
        .join("\n"),
        "{what}"
    );
}

/// The `help:` line of a rejected call that ends a cell (`python/ipybox_runtime/tracebacks.py`).
pub(crate) const REJECTED_HELP: &str = "the call was not made, and the cell stopped there (what ran before it stands); do not make it again unless the user asks for it";
/// ... and of one nobody answered in time.
pub(crate) const TIMEOUT_HELP: &str = "the call was not made: nobody answered in time, and the cell stopped there (what ran before it stands); make it again only when the user is there to answer";

/// `text` with every `In[<n>]` (IPython's cell labels) as `In[N]`.
pub(crate) fn cell_numbers_as_n(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(i) = rest.find("In[") {
        out.push_str(&rest[..i + 3]);
        rest = &rest[i + 3..];
        let digits = rest.chars().take_while(char::is_ascii_digit).count();
        if digits > 0 && rest[digits..].starts_with(']') {
            out.push('N');
            rest = &rest[digits..];
        }
    }
    out.push_str(rest);
    out
}

/// The trust rule, seen from a kernel (issue 18, path 1): with `fx` (the fixture, `WHO` set to
/// `registered` in its recorded env) registered for `ws`, kernel code that sends its own params
/// reaches nothing of its own: an unregistered name with a shell command is refused (no process,
/// no marker), and the registered name with forged params (a command, `${HOME}` from the host's
/// environment, a URL) reaches the registered server with the recorded params.
pub(crate) async fn forged_params_reach_nothing(ex: &CodeExecutor, ws: &Path, what: &str) {
    let marker = ws.join("host-ran-it");
    let code = format!(
        r#"from ipybox_runtime import ToolRunner, ToolError
evil = {{"command": "sh", "args": ["-c", "touch {m}"], "env": {{"WHO": "${{HOME}}"}}}}
try:
    ToolRunner("evil", evil).run("x", {{}})
except ToolError as e:
    print(str(e).splitlines()[0])
print(ToolRunner("fx", evil).run("get_env", {{"name": "WHO"}}))
print(ToolRunner("fx", {{"url": "http://127.0.0.1:9/${{HOME}}"}}).run("get_env", {{"name": "WHO"}}))"#,
        m = marker.display()
    );
    assert_eq!(
        run(ex, &code).await,
        "MCP server `evil` is not registered for any directory this kernel imports from: kernel code can only call servers the host registered, with the params recorded then\nregistered\nregistered",
        "{what}"
    );
    assert!(
        !marker.exists(),
        "{what}: the host ran the kernel's command"
    );
}

/// The fixture's params with `WHO=registered` in its env (see [`forged_params_reach_nothing`]).
pub(crate) fn fixture_params_who() -> Value {
    json!({"command": python(), "args": [fixture_script(), "stdio"], "env": {"WHO": "registered"}})
}

/// Registers the Python fixture server as `fx` for workspace `ws` with `ipybox apigen`, as an
/// operator does.
pub(crate) fn register_fixture(ws: &Path) {
    apigen_fx(ws, &fixture_stdio_params("stdio"), None);
}
