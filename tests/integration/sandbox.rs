//! The sandboxed kernel end to end: a real srt with bubblewrap on Linux (provision with
//! `bash scripts/sandbox-deps.sh`; the MCP-server tests also need `bash scripts/test-env.sh`).
//!
//! What the default policy blocks (.env, writes outside the workspace, the host's network and
//! Unix sockets), what a custom policy allows (a domain through srt's proxy, an extra writable
//! directory), that ipybox keeps working inside (tool calls, timeouts, reset, images), how bad
//! configs fail, and that nothing is left running after `stop()`. Not here: the policy's JSON
//! handling in isolation (unit tests in `src/sandbox.rs`).
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::*;
use ipybox::CodeExecutor;
use ipybox::executor::ExecutorError;
use ipybox::kernel::KernelError;
use ipybox::sandbox::{SandboxError, SandboxOptions};
use serde_json::json;

/// srt as `scripts/sandbox-deps.sh` installs it; passed like a user's `IPYBOX_SRT`.
fn srt() -> PathBuf {
    let p = root().join("target/sandbox-deps/node_modules/.bin/srt");
    assert!(
        p.exists(),
        "{} is missing: run `bash scripts/sandbox-deps.sh` first",
        p.display()
    );
    p
}

fn options(config_file: Option<&Path>) -> SandboxOptions {
    SandboxOptions {
        config_file: config_file.map(Path::to_path_buf),
        srt: Some(srt()),
        ..Default::default()
    }
}

async fn sandboxed(ws: &Path, options: SandboxOptions, spare: bool) -> CodeExecutor {
    let mut b = CodeExecutor::builder().workspace(ws).sandbox(options);
    if !spare {
        b = b.without_spare_kernel();
    }
    let ex = b.build();
    ex.start().await.expect("sandboxed executor starts");
    ex
}

/// Live (non-zombie) processes whose command line mentions `needle`.
fn processes_mentioning(needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        if pid == std::process::id() {
            continue;
        }
        let Ok(cmd) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        if cmd.contains(needle) {
            found.push(format!(
                "{pid}: {}",
                cmd.chars().take(200).collect::<String>()
            ));
        }
    }
    found
}

/// Stops the executor and asserts that no sandbox process (srt, bwrap, socat, python) is left
/// and that srt's mount points did not stay behind in the workspace.
async fn stop_and_check(ex: CodeExecutor, ws: &Path) {
    let rt = ex.runtime_dir().await.expect("started");
    let needle = rt.display().to_string();
    assert!(
        !processes_mentioning(&needle).is_empty(),
        "the sandbox processes should be visible before stop"
    );
    ex.stop().await;
    drop(ex);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = processes_mentioning(&needle);
        if left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "processes left after stop():\n{}",
            left.join("\n")
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for name in [".bashrc", ".gitconfig", ".mcp.json", ".vscode", ".claude"] {
        assert!(
            !ws.join(name).exists(),
            "srt's mount point {name} stayed in the workspace"
        );
    }
}

/// A tiny PNG (1x1), base64.
const PNG: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==";

#[tokio::test(flavor = "multi_thread")]
async fn default_policy_confines_the_kernel_and_ipybox_keeps_working() {
    require!(SandboxDeps);
    let ws = tempfile::tempdir().unwrap();
    let ws = ws.path();
    std::fs::write(ws.join(".env"), "SECRET=hunter2\n").unwrap();
    std::fs::create_dir(ws.join("sub")).unwrap();
    std::fs::write(ws.join("sub/.env"), "NESTED=1\n").unwrap();
    std::fs::write(ws.join("data.txt"), "visible\n").unwrap();
    // A host service on loopback and a host Unix socket under /run and /tmp.
    let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = tcp.local_addr().unwrap().port();
    let run_sock = PathBuf::from(format!("/run/ipybox-test-{}.sock", std::process::id()));
    let _ = std::fs::remove_file(&run_sock);
    let _run_listener = std::os::unix::net::UnixListener::bind(&run_sock).unwrap();
    let tmp_marker = PathBuf::from(format!("/tmp/ipybox-test-marker-{}", std::process::id()));
    std::fs::write(&tmp_marker, "host tmp").unwrap();
    // Outside the workspace: a file in HOME and one beside the checkout. Where either lives
    // below a directory the sandbox hides (/tmp, ...), the kernel sees an empty writable tmpfs
    // there instead: the write "works" but never reaches the host. Either way, nothing appears.
    let home = PathBuf::from(std::env::var("HOME").expect("HOME is set"));
    let home_target = home.join(format!("ipybox-sandbox-escape-{}", std::process::id()));
    let outside_target = root()
        .join("target")
        .join(format!("ipybox-sandbox-escape-{}", std::process::id()));
    let hidden = |p: &Path| {
        ipybox::sandbox::policy::HIDDEN_SOCKET_DIRS
            .iter()
            .any(|d| p.starts_with(d))
    };
    let refused = |p: &Path| if hidden(p) { "ok" } else { "OSError" };
    let write_home = format!("write home {}", refused(&home_target));
    let write_outside = format!("write outside {}", refused(&outside_target));

    let ex = sandboxed(ws, options(None), true).await;
    let rt = ex.runtime_dir().await.unwrap();
    assert!(rt.join("sandbox-settings.json").exists());

    let out = run(
        &ex,
        &format!(
            r#"
import os, socket, tempfile
def attempt(f):
    try:
        f()
        return "ok"
    except Exception as e:
        return type(e).__name__
print("env", attempt(lambda: open(".env").read()))
print("nested env", attempt(lambda: open("sub/.env").read()))
print("data", open("data.txt").read().strip())
print("write ws", attempt(lambda: open("out.txt", "w").write("x")))
print("write home", attempt(lambda: open("{home_target}", "w").write("x")))
print("write outside", attempt(lambda: open("{outside_target}", "w").write("x")))
print("write usr", attempt(lambda: open("/usr/ipybox-escape", "w").write("x")))
print("tcp", attempt(lambda: socket.create_connection(("127.0.0.1", {port}), timeout=3)))
print("run sock", os.path.exists("{run_sock}"), sorted(os.listdir("/run")))
print("tmp marker", os.path.exists("{tmp_marker}"))
def unix():
    s = socket.socket(socket.AF_UNIX)
    s.connect("{run_sock}")
print("unix", attempt(unix))
fd, p = tempfile.mkstemp()
os.write(fd, b"t"); os.close(fd)
print("tmpdir", p.startswith("{rt}"), os.environ.get("SANDBOX_RUNTIME"))
import stat
print("stdin is ipybox's socket", stat.S_ISSOCK(os.fstat(0).st_mode))
print("forked", "ipybox_runtime.factory" in open(f"/proc/{{os.getppid()}}/cmdline").read())
"#,
            rt = rt.display(),
            home_target = home_target.display(),
            outside_target = outside_target.display(),
            run_sock = run_sock.display(),
            tmp_marker = tmp_marker.display(),
        ),
    )
    .await;
    // /run is empty inside, except for the path to the runtime directory when it lives there
    // ($XDG_RUNTIME_DIR=/run/user/UID).
    let run_listing = match rt.strip_prefix("/run") {
        Ok(rest) => format!(
            "run sock False ['{}']",
            rest.components()
                .next()
                .unwrap()
                .as_os_str()
                .to_string_lossy()
        ),
        Err(_) => "run sock False []".to_string(),
    };
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines,
        [
            "env PermissionError",
            "nested env PermissionError",
            "data visible",
            "write ws ok",
            write_home.as_str(),
            write_outside.as_str(),
            "write usr OSError",
            "tcp ConnectionRefusedError",
            run_listing.as_str(),
            "tmp marker False",
            "unix FileNotFoundError",
            "tmpdir True 1",
            "stdin is ipybox's socket True",
            "forked True",
        ],
        "{out}"
    );
    assert_eq!(std::fs::read_to_string(ws.join("out.txt")).unwrap(), "x");
    assert!(
        !home_target.exists(),
        "{} reached the host",
        home_target.display()
    );
    assert!(
        !outside_target.exists(),
        "{} reached the host",
        outside_target.display()
    );

    // Images are still written (by the host, from the kernel's display data).
    let r = ex
        .execute(
            &format!(
                "import base64\nfrom IPython.display import Image, display\ndisplay(Image(data=base64.b64decode('{PNG}')))"
            ),
            Some(Duration::from_secs(30)),
        )
        .await
        .unwrap();
    assert_eq!(r.images.len(), 1, "{r:?}");
    assert!(r.images[0].starts_with(ws.join("images")) && r.images[0].exists());

    // A timeout interrupts over the control channel and keeps the state.
    run(&ex, "kept = 41").await;
    let err = ex
        .execute(
            "import time\nprint('before')\ntime.sleep(60)",
            Some(Duration::from_secs(2)),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            ExecutorError::Kernel(KernelError::Timeout {
                state_kept: true,
                ..
            })
        ),
        "{err}"
    );
    assert_eq!(run(&ex, "print(kept + 1)").await, "42");

    // Reset swaps in the warm (sandboxed) spare.
    let pid = ex.kernel_pid().await;
    let t = Instant::now();
    ex.reset().await.unwrap();
    assert_eq!(
        run(
            &ex,
            "print('kept' in globals(), os.environ.get('SANDBOX_RUNTIME') if 'os' in globals() else __import__('os').environ.get('SANDBOX_RUNTIME'))"
        )
        .await,
        "False 1"
    );
    eprintln!("sandboxed reset -> next result: {:?}", t.elapsed());
    assert_ne!(pid, ex.kernel_pid().await);
    assert_eq!(
        run(&ex, "print(open('.env').read() if False else 'ok')").await,
        "ok"
    );

    stop_and_check(ex, ws).await;
    let _ = std::fs::remove_file(&run_sock);
    let _ = std::fs::remove_file(&tmp_marker);
}

/// A minimal HTTP server on 127.0.0.1 answering every request with `hello from host`.
fn http_server() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming().take(20) {
            let Ok(mut s) = stream else { continue };
            let mut buf = [0u8; 4096];
            let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
            let _ = s.read(&mut buf);
            let body = "hello from host";
            let _ = write!(
                s,
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    port
}

#[tokio::test(flavor = "multi_thread")]
async fn custom_policy_is_honoured() {
    require!(SandboxDeps);
    let ws = tempfile::tempdir().unwrap();
    let ws = ws.path();
    let extra = tempfile::tempdir().unwrap();
    let port = http_server();
    std::fs::write(
        ws.join("policy.json"),
        serde_json::to_vec(&json!({
            "filesystem": {
                "denyRead": [".env"],
                "allowWrite": [".", extra.path()],
            },
            "network": {"allowedDomains": ["127.0.0.1", "localhost"]},
        }))
        .unwrap(),
    )
    .unwrap();
    let ex = sandboxed(ws, options(Some(Path::new("policy.json"))), false).await;
    let out = run(
        &ex,
        &format!(
            r#"
import os, urllib.request
print("proxy", bool(os.environ.get("HTTP_PROXY")))
# srt exempts loopback names from the proxy (NO_PROXY); go through the proxy to reach the host.
for k in ("no_proxy", "NO_PROXY"):
    os.environ.pop(k, None)
def get(url):
    try:
        return urllib.request.urlopen(url, timeout=10).read().decode()
    except Exception as e:
        return f"refused {{getattr(e, 'code', type(e).__name__)}}"
print(get("http://127.0.0.1:{port}/"))
print(get("http://localhost:{port}/"))
print(get("http://not-allowed.invalid:{port}/"))
open("{extra}/written.txt", "w").write("extra")
print("extra ok")
"#,
            extra = extra.path().display(),
        ),
    )
    .await;
    assert_eq!(
        out,
        "proxy True\nhello from host\nhello from host\nrefused 403\nextra ok"
    );
    assert_eq!(
        std::fs::read_to_string(extra.path().join("written.txt")).unwrap(),
        "extra"
    );
    stop_and_check(ex, ws).await;
}

/// Collects formatted tracing output (a `MakeWriter` into a shared buffer).
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

// current_thread: `start()` runs the sandbox preparation on this thread, where the capturing
// subscriber is installed.
#[tokio::test]
async fn missing_config_falls_back_to_the_default_policy_with_a_warning() {
    require!(SandboxDeps);
    let ws = tempfile::tempdir().unwrap();
    let ws = ws.path();
    std::fs::write(ws.join(".env"), "SECRET=1\n").unwrap();
    let captured = Captured::default();
    let sink = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || sink.clone())
        .with_ansi(false)
        .finish();
    let guard = tracing::subscriber::set_default(subscriber);
    let ex = sandboxed(ws, options(Some(Path::new("no-such-policy.json"))), false).await;
    drop(guard);
    let log = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    assert!(
        log.contains("WARN") && log.contains("no-such-policy.json") && log.contains("default"),
        "{log}"
    );
    assert_eq!(
        run(
            &ex,
            "try:\n    open('.env').read()\nexcept PermissionError:\n    print('denied')"
        )
        .await,
        "denied"
    );
    stop_and_check(ex, ws).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn broken_configs_and_missing_srt_fail_clearly() {
    require!(SandboxDeps);
    let ws = tempfile::tempdir().unwrap();
    let ws = ws.path();
    std::fs::write(ws.join("bad.json"), "{\"filesystem\": {").unwrap();
    std::fs::write(
        ws.join("typo.json"),
        r#"{"filesystem": {"denyRaed": [".env"]}}"#,
    )
    .unwrap();
    for (file, expect) in [
        ("bad.json", "not valid JSON"),
        ("typo.json", "unknown field `denyRaed`"),
    ] {
        let ex = CodeExecutor::builder()
            .workspace(ws)
            .sandbox(options(Some(Path::new(file))))
            .build();
        let err = ex.start().await.unwrap_err();
        let msg = err.to_string();
        assert!(
            matches!(err, ExecutorError::Sandbox(SandboxError::Config { .. })),
            "{msg}"
        );
        assert!(
            msg.contains(expect) && msg.contains(&ws.join(file).display().to_string()),
            "{msg}"
        );
        assert!(ex.kernel_pid().await.is_none(), "no kernel may run");
    }
    let ex = CodeExecutor::builder()
        .workspace(ws)
        .sandbox(SandboxOptions {
            srt: Some("/nonexistent/srt".into()),
            ..Default::default()
        })
        .build();
    let msg = ex.start().await.unwrap_err().to_string();
    assert!(
        msg.contains("/nonexistent/srt")
            && msg.contains("npm install -g @anthropic-ai/sandbox-runtime@"),
        "{msg}"
    );
    assert!(ex.kernel_pid().await.is_none());
}

#[tokio::test(flavor = "multi_thread")]
async fn tool_calls_reach_the_host_from_the_sandbox() {
    require!(SandboxDeps, TestEnv);
    let ws = tempfile::tempdir().unwrap();
    let ws = ws.path();
    let ex = sandboxed(ws, options(None), false).await;
    ex.register_mcp_server("fx", &fixture_stdio_params("stdio"))
        .await
        .expect("registration");
    let out = run(
        &ex,
        r#"
from concurrent.futures import ThreadPoolExecutor
from mcptools.fx import add, greet
print(add.run(add.Params(a=2, b=3)).sum, greet.run(greet.Params(name="Ada")))
with ThreadPoolExecutor(4) as pool:
    print(sorted(pool.map(lambda i: add.run(add.Params(a=i, b=i)).sum, range(8))))
"#,
    )
    .await;
    assert_eq!(out, "5 Hello, Ada!\n[0, 2, 4, 6, 8, 10, 12, 14]");
    stop_and_check(ex, ws).await;
}

/// An MCP server sandboxed on its own: `"command": "srt", "args": ["--settings", F, ...]`, the
/// example in docs/sandbox.md.
#[tokio::test(flavor = "multi_thread")]
async fn an_mcp_server_can_run_under_srt() {
    require!(SandboxDeps, TestEnv);
    let ws = tempfile::tempdir().unwrap();
    let ws = ws.path();
    let settings = ws.join("mcp-srt.json");
    std::fs::write(
        &settings,
        serde_json::to_vec(&json!({
            "filesystem": {"denyRead": [], "allowWrite": [], "denyWrite": []},
            "network": {"allowedDomains": [], "deniedDomains": []},
        }))
        .unwrap(),
    )
    .unwrap();
    let params = json!({
        "command": srt(),
        "args": ["--settings", settings, python(), fixture_script(), "stdio"],
    });
    ipybox::generate_mcp_sources("boxed", &params, &ws.join("mcptools"))
        .await
        .expect("registration through srt");
    let ex = CodeExecutor::builder()
        .workspace(ws)
        .without_spare_kernel()
        .build();
    ex.start().await.unwrap();
    let out = run(
        &ex,
        "from mcptools.boxed import add, get_env\nprint(add.run(add.Params(a=20, b=22)).sum, get_env.run(get_env.Params(name='SANDBOX_RUNTIME')))",
    )
    .await;
    assert_eq!(out, "42 1");
    ex.stop().await;
}

/// Approvals work the same for a sandboxed kernel: `stream()` yields each call and a rejection
/// reaches the sandboxed code as `ApprovalRejected`.
#[tokio::test(flavor = "multi_thread")]
async fn approvals_work_from_the_sandbox() {
    require!(SandboxDeps, TestEnv);
    use ipybox::executor::ExecutionEvent;
    let ws = tempfile::tempdir().unwrap();
    let ws = ws.path();
    let ex = sandboxed(ws, options(None), false).await;
    ex.register_mcp_server("fx", &fixture_stdio_params("stdio"))
        .await
        .expect("registration");
    let code = "from mcptools.fx import greet, ApprovalRejected\nfor n in ['yes', 'no']:\n    try:\n        print(greet.run(greet.Params(name=n)))\n    except ApprovalRejected as e:\n        print('rejected')";
    let mut execution = ex.stream(code, Some(Duration::from_secs(60)));
    let mut asked = Vec::new();
    let mut result = None;
    while let Some(event) = execution.next().await {
        match event {
            ExecutionEvent::Approval(request) => {
                asked.push(request.describe());
                if request.arguments["name"] == "yes" {
                    request.accept()
                } else {
                    request.reject()
                }
            }
            ExecutionEvent::Result(r) => result = Some(r.expect("code runs").text),
            _ => {}
        }
    }
    assert_eq!(asked, [r#"fx.greet(name="yes")"#, r#"fx.greet(name="no")"#]);
    assert_eq!(result.unwrap(), "Hello, yes!\nrejected");
    stop_and_check(ex, ws).await;
}

/// The MCP server with `--sandbox`: `install_package` installs into the workspace's site layer
/// (the installer in a sandbox of its own; the kernel cannot write its environment), in front of
/// the kernel environment, and the sandboxed kernel imports the package without a reset
/// (`sandbox_install` has the attacks).
#[tokio::test(flavor = "multi_thread")]
async fn install_package_reaches_a_sandboxed_kernel() {
    require!(SandboxDeps);
    use ipybox::tools::{McpSession, ServerParams, tool_output};
    let ws = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap(); // a private kernel environment for the install
    let params = json!({
        "command": env!("CARGO_BIN_EXE_ipybox"),
        "args": ["--workspace", ws.path(), "--sandbox", "--log-level", "warn", "--checkpoint-after", "off"],
        "env": {"IPYBOX_SRT": srt(), "IPYBOX_HOME": home.path()},
    });
    let session = McpSession::connect(
        &ServerParams::parse(&params).unwrap(),
        &process_env(),
        Duration::from_secs(60),
    )
    .await
    .expect("sandboxed ipybox MCP server starts");
    let call = |tool: &'static str, args: serde_json::Value| {
        let session = &session;
        async move {
            let r = session
                .call_tool(tool, args.as_object().unwrap().clone())
                .await
                .unwrap();
            let out = tool_output(&r);
            assert!(!out.is_error, "{tool}: {}", out.text);
            out.text
        }
    };
    let denied = call("execute_ipython_cell", json!({"code": "import sys\ntry:\n    open(sys.prefix + '/ipybox-probe', 'w')\n    print('wrote')\nexcept OSError:\n    print('read-only')"})).await;
    assert_eq!(
        denied, "read-only",
        "the sandboxed kernel must not write its environment"
    );
    call("install_package", json!({"package_name": "six==1.16.0"})).await;
    assert_eq!(
        call(
            "execute_ipython_cell",
            json!({"code": "import six\nsix.__version__"})
        )
        .await,
        "'1.16.0'"
    );
    session.close().await;
}

/// A sandboxed kernel is not trusted with server params: it cannot make the host start a command
/// of its choosing, neither under a new server name nor by rewriting a registered server's params.
#[tokio::test(flavor = "multi_thread")]
async fn sandboxed_code_cannot_make_the_host_run_commands() {
    require!(SandboxDeps, TestEnv);
    let ws = tempfile::tempdir().unwrap();
    let ws = ws.path();
    let marker = ws
        .parent()
        .unwrap()
        .join(format!("ipybox-escape-{}", std::process::id()));
    let _ = std::fs::remove_file(&marker);
    let ex = sandboxed(ws, options(None), false).await;
    ex.register_mcp_server("fx", &fixture_stdio_params("stdio"))
        .await
        .expect("registration");
    let code = format!(
        r#"
from ipybox_runtime import ToolRunner, ToolError
evil = {{"command": "sh", "args": ["-c", "touch {m}"]}}
try:
    ToolRunner("evil", evil).run("x", {{}})
except ToolError as e:
    print(str(e).splitlines()[0])
# the registered name with forged params: the host uses the registered params
print(ToolRunner("fx", evil).run("greet", {{"name": "still the fixture"}}))
"#,
        m = marker.display()
    );
    let out = run(&ex, &code).await;
    assert_eq!(
        out,
        "MCP server `evil` is not registered for any directory this kernel imports from: kernel code can only call servers the host registered, with the params recorded then\nHello, still the fixture!"
    );
    assert!(
        !marker.exists(),
        "the host ran a command chosen by sandboxed code"
    );
    stop_and_check(ex, ws).await;
}

/// A sandboxed kernel cannot widen the directories its tool calls are judged by (issue 28): they
/// come from the executor's configuration (workspace, `kernel_env`'s `PYTHONPATH`), so editing
/// `sys.path` or writing a `.pth` changes nothing, and a link in the workspace (planted by an
/// earlier kernel: `lib -> <another project>`) is not followed. The control: the user's own
/// unsandboxed kernel with the same configuration follows the link and reaches the server, so
/// it is the link alone that the sandboxed kernel is denied.
#[tokio::test(flavor = "multi_thread")]
async fn sandboxed_code_cannot_widen_its_import_roots() {
    require!(SandboxDeps, TestEnv);
    let ws = tempfile::tempdir().unwrap();
    let ws = ws.path().canonicalize().unwrap();
    let other = tempfile::tempdir().unwrap();
    let other = other.path().canonicalize().unwrap();
    // Another project's tools, registered by the host for `<other>/tools` (reached from
    // `<other>` or `<other>/tools`).
    ipybox::generate_mcp_sources_with(
        "fx",
        &fixture_stdio_params("stdio"),
        &other.join("tools"),
        &process_env(),
        ipybox::tools::DEFAULT_CONNECT_TIMEOUT,
        ipybox::apigen::ApiStyle::Sync,
    )
    .await
    .expect("registration");
    std::os::unix::fs::symlink(&other, ws.join("lib")).unwrap();
    let pythonpath = [("PYTHONPATH", ws.join("lib").display().to_string())];
    let call = "from ipybox_runtime import ToolRunner, ToolError\ntry:\n    print(ToolRunner('fx', {}).run('greet', {'name': 'other'}))\nexcept ToolError as e:\n    print(str(e).splitlines()[0])";

    let own = CodeExecutor::builder()
        .workspace(&ws)
        .kernel_env(pythonpath.clone())
        .without_spare_kernel()
        .build();
    own.start().await.unwrap();
    assert_eq!(run(&own, call).await, "Hello, other!", "the control");
    own.stop().await;

    let ex = CodeExecutor::builder()
        .workspace(&ws)
        .kernel_env(pythonpath)
        .sandbox(options(None))
        .without_spare_kernel()
        .build();
    ex.start().await.expect("sandboxed executor starts");
    let widen = format!(
        "import sys, site\nsys.path[0:0] = [{o:?}, {t:?}]\nopen('widen.pth', 'w').write({o:?} + '\\n')\nsite.addsitedir('.')\n",
        o = other.display().to_string(),
        t = other.join("tools").display().to_string()
    );
    let refused = "MCP server `fx` is not registered for any directory this kernel imports from: kernel code can only call servers the host registered, with the params recorded then";
    assert_eq!(run(&ex, call).await, refused);
    assert_eq!(run(&ex, &format!("{widen}{call}")).await, refused);
    stop_and_check(ex, &ws).await;
}

/// The JSON-RPC error a failed MCP opening carried (a 2026-07-28 client that falls back to
/// `initialize` reports both attempts: the fallback's).
fn opening_error(e: &rmcp::service::ClientInitializeError) -> Option<&rmcp::ErrorData> {
    use rmcp::service::ClientInitializeError as E;
    match e {
        E::JsonRpcError(error) => Some(error),
        E::LegacyFallbackFailed { discover, fallback } => {
            opening_error(fallback).or_else(|| opening_error(discover))
        }
        _ => None,
    }
}

/// `ipybox --sandbox` where the sandbox cannot run (srt missing from PATH, or `IPYBOX_SRT`
/// naming nothing) says so when its client connects: the opening request (`server/discover` or
/// `initialize`) is answered with a JSON-RPC error that carries the reason and the install line
/// (what Claude Code shows as the reason in `claude mcp list` and `/mcp`), never a server that
/// connects and fails at its first cell; ipybox exits 1 when the client goes.
async fn missing_srt_is_said_when_the_client_connects(era: crate::mcp_eras::Era) {
    let ws = tempfile::tempdir().unwrap();
    let no_srt = tempfile::tempdir().unwrap();
    let on_path = format!(
        "ipybox cannot run code: sandbox unavailable: srt (Anthropic's sandbox-runtime) was not found on PATH; help: install it with `npm install -g @anthropic-ai/sandbox-runtime@{}` (needs Node.js >= 20.11), or point IPYBOX_SRT at an srt executable; then restart this MCP server (Claude Code: /mcp, then Reconnect)",
        ipybox::sandbox::SRT_VERSION
    );
    let named = no_srt.path().join("srt");
    let by_env = format!(
        "ipybox cannot run code: sandbox unavailable: srt {} (from IPYBOX_SRT) does not exist or is not executable; help: install it with `npm install -g @anthropic-ai/sandbox-runtime@{}`, or fix IPYBOX_SRT; then restart this MCP server (Claude Code: /mcp, then Reconnect)",
        named.display(),
        ipybox::sandbox::SRT_VERSION
    );
    for (srt_env, expected) in [(None, on_path), (Some(&named), by_env)] {
        let mut command = tokio::process::Command::new(BIN);
        command
            .arg("--workspace")
            .arg(ws.path())
            .args(["--sandbox", "--log-level", "off"])
            .env_remove("IPYBOX_SRT")
            // A PATH without srt on it.
            .env("PATH", no_srt.path())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true);
        if let Some(srt) = srt_env {
            command.env("IPYBOX_SRT", srt);
        }
        let mut child = command.spawn().unwrap();
        let transport = (child.stdout.take().unwrap(), child.stdin.take().unwrap());
        let config = rmcp::model::ClientConfig::default().with_protocol_version(era.version());
        let Err(refused) = crate::mcp_eras::serve_in(era, config, transport).await else {
            panic!("the opening was not refused");
        };
        let error = opening_error(&refused).unwrap_or_else(|| panic!("{refused:?}"));
        assert_eq!(error.code, rmcp::model::ErrorCode::INTERNAL_ERROR);
        assert_eq!(error.message, expected);
        // The client has gone (its transport was dropped with the failed opening).
        let status = tokio::time::timeout(Duration::from_secs(10), child.wait())
            .await
            .expect("ipybox exits when its client goes")
            .unwrap();
        assert_eq!(status.code(), Some(1));
    }
}
crate::mcp_eras::both_eras!(missing_srt_is_said_when_the_client_connects);
