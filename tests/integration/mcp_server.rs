//! The `ipybox` binary as an MCP server, driven by a real MCP client (rmcp, through ipybox's own
//! client session type) and, for shutdown, by raw JSON-RPC over its stdio.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::mcp_eras::{CallTool, Era, Plain, both_eras, both_eras_blocking, start};
use crate::support::*;
use ipybox::tools::tool_output;
use rmcp::model::ContentBlock;
use serde_json::{Value, json};

async fn connect(ws: &Path, extra_env: &[(&str, &str)], era: Era) -> Plain {
    start(ws, extra_env, &[], era).await
}

async fn err_text(s: &impl CallTool, tool: &str, arguments: Value) -> String {
    let out = tool_output(&call(s, tool, arguments).await);
    assert!(out.is_error, "{tool} should fail, got: {}", out.text);
    out.text
}

async fn exec(s: &impl CallTool, code: &str) -> String {
    ok_text(s, "execute_ipython_cell", json!({"code": code})).await
}

async fn server_identity_and_tool_schemas(era: Era) {
    let ws = tempfile::tempdir().unwrap();
    let s = connect(ws.path(), &[], era).await;
    let info = s.peer().peer_info().unwrap();
    let imp = info.server_info.as_ref().unwrap();
    assert_eq!(imp.name, "ipybox");
    assert_eq!(imp.version, env!("CARGO_PKG_VERSION"));
    let instructions = info.instructions.as_deref().unwrap();
    for word in [
        "register_mcp_server",
        "mcptools/<server_name>/",
        "execute_ipython_cell",
        "reset",
    ] {
        assert!(instructions.contains(word), "instructions lack {word}");
    }
    let mut tools = s.peer().list_all_tools().await.unwrap();
    tools.sort_by(|a, b| a.name.cmp(&b.name));
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    assert_eq!(
        names,
        [
            "execute_ipython_cell",
            "install_package",
            "register_mcp_server",
            "reset"
        ]
    );
    let props = |i: usize| {
        let mut p: Vec<String> = tools[i]
            .input_schema
            .get("properties")
            .and_then(Value::as_object)
            .map(|o| o.keys().cloned().collect())
            .unwrap_or_default();
        p.sort();
        p
    };
    assert_eq!(props(0), ["code", "max_output_chars", "timeout"]);
    assert_eq!(props(1), ["package_name"]);
    assert_eq!(props(2), ["server_name", "server_params"]);
    assert!(props(3).is_empty());
    let exec_props = tools[0].input_schema["properties"].as_object().unwrap();
    assert_eq!(exec_props["timeout"]["default"], json!(120.0));
    assert_eq!(exec_props["max_output_chars"]["default"], json!(5000));
    assert_eq!(tools[0].input_schema["required"], json!(["code"]));
    s.close().await;
}

async fn initialize_does_not_wait_for_the_kernel(era: Era) {
    // An interpreter that takes 3 s to start: initialize must still answer at once.
    let ws = tempfile::tempdir().unwrap();
    let python = kernel_python();
    let slow = ws.path().join("slow-python");
    std::fs::write(
        &slow,
        format!("#!/bin/sh\nsleep 3\nexec {} \"$@\"\n", python.display()),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&slow, std::fs::Permissions::from_mode(0o755)).unwrap();
    let start = Instant::now();
    let s = connect(ws.path(), &[("IPYBOX_PYTHON", slow.to_str().unwrap())], era).await;
    let connected = start.elapsed();
    assert!(
        connected < Duration::from_millis(2500),
        "initialize took {connected:?}"
    );
    assert_eq!(exec(&s, "1 + 1").await, "2");
    assert!(start.elapsed() >= Duration::from_secs(3));
    s.close().await;
}

async fn execute_ipython_cell_outputs_errors_timeouts_truncation_images(era: Era) {
    let ws = tempfile::tempdir().unwrap();
    let s = connect(ws.path(), &[], era).await;
    assert_eq!(exec(&s, "x = 40").await, "");
    assert_eq!(exec(&s, "print('x is', x)\nx + 2").await, "x is 40\n42");
    // Errors: isError, output printed before, then the traceback, no colour codes.
    let err = err_text(
        &s,
        "execute_ipython_cell",
        json!({"code": "print('partial')\nraise KeyError('k')"}),
    )
    .await;
    assert!(err.starts_with("partial\n\n"), "{err}");
    assert!(err.trim_end().ends_with("KeyError: 'k'"), "{err}");
    assert!(!err.contains('\u{1b}'));
    // Timeout: isError, says so, state kept.
    let start = Instant::now();
    let err = err_text(
        &s,
        "execute_ipython_cell",
        json!({"code": "import time\nprint('waiting')\ntime.sleep(30)", "timeout": 1}),
    )
    .await;
    assert!(start.elapsed() < Duration::from_secs(6));
    assert_eq!(
        err,
        "waiting\n\nexecution timed out after 1 s and was interrupted; kernel state was kept"
    );
    assert_eq!(exec(&s, "x").await, "40");
    // Truncation: first N characters plus the notice.
    let out = ok_text(
        &s,
        "execute_ipython_cell",
        json!({"code": "print('a' * 30)", "max_output_chars": 10}),
    )
    .await;
    assert_eq!(
        out,
        "aaaaaaaaaa\n\n[Output truncated: exceeded 10 character limit]"
    );
    let out = ok_text(
        &s,
        "execute_ipython_cell",
        json!({"code": "print('é' * 6000)"}),
    )
    .await;
    assert_eq!(
        out,
        format!(
            "{}\n\n[Output truncated: exceeded 5000 character limit]",
            "é".repeat(5000)
        )
    );
    // Images: listed under "Generated images:" and returned as image content.
    let r = call(&s, "execute_ipython_cell", json!({"code": "import base64\nfrom IPython.display import Image, display\npng = base64.b64decode('iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==')\nprint('plot')\ndisplay(Image(data=png))"})).await;
    assert_ne!(r.is_error, Some(true));
    let text = match &r.content[0] {
        ContentBlock::Text(t) => t.text.clone(),
        other => panic!("first content should be text: {other:?}"),
    };
    let (before, images) = text
        .split_once("\n\nGenerated images:\n- ")
        .expect("images listed");
    assert_eq!(before, "plot");
    assert!(
        Path::new(images).starts_with(ws.path().canonicalize().unwrap().join("images")),
        "{images}"
    );
    assert!(Path::new(images).exists());
    assert_eq!(r.content.len(), 2);
    match &r.content[1] {
        ContentBlock::Image(i) => {
            assert_eq!(i.mime_type, "image/png");
            assert_eq!(
                i.data,
                "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
            );
        }
        other => panic!("expected image content: {other:?}"),
    }
    // Bad input is a clear error and the server keeps working.
    let err = err_text(
        &s,
        "execute_ipython_cell",
        json!({"code": "1", "timeout": -1}),
    )
    .await;
    assert_eq!(err, "invalid timeout -1: pass a positive number of seconds");
    match s
        .call_tool_json("execute_ipython_cell", args(json!({"timeout": 5})))
        .await
    {
        Err(e) => assert!(e.to_string().contains("code"), "{e}"),
        Ok(r) => {
            let out = tool_output(&r);
            assert!(
                out.is_error && out.text.contains("code"),
                "missing `code` must be an error naming it: {}",
                out.text
            );
        }
    }
    assert_eq!(exec(&s, "x").await, "40");
    s.close().await;
}

async fn dotenv_kernel_env_and_secrets(era: Era) {
    require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    std::fs::write(
        ws.path().join(".env"),
        "# comment\nKERNEL_ENV_GREETING=from dotenv\nKERNEL_ENV_WINNER=file\nFIXTURE_TOKEN=s3cr3t-value\nexport QUOTED=\"a b\"\n",
    )
    .unwrap();
    let s = connect(ws.path(), &[("KERNEL_ENV_WINNER", "process")], era).await;
    let out = exec(&s, "import os\nprint(os.environ.get('GREETING'), os.environ.get('WINNER'), os.environ.get('FIXTURE_TOKEN'), os.environ.get('KERNEL_ENV_GREETING'))").await;
    assert_eq!(out, "from dotenv process None None");
    // Other variables reach MCP servers through ${VAR} only, and never the generated code.
    let params = json!({"command": python(), "args": [fixture_script(), "stdio"], "env": {"TOKEN": "${FIXTURE_TOKEN}", "Q": "${QUOTED}"}});
    let modules = ok_text(
        &s,
        "register_mcp_server",
        json!({"server_name": "fx", "server_params": params}),
    )
    .await;
    assert_eq!(
        modules,
        "add\ngreet\nget_thing\nfail\necho\nsleep\nget_header\nget_env\nget_cwd\nget_pid"
    );
    let init = std::fs::read_to_string(ws.path().join("mcptools/fx/__init__.py")).unwrap();
    assert!(
        init.contains("${FIXTURE_TOKEN}") && !init.contains("s3cr3t"),
        "{init}"
    );
    let out = exec(&s, "from mcptools.fx import get_env\nprint(get_env.run(get_env.Params(name='TOKEN')), get_env.run(get_env.Params(name='Q')))").await;
    assert_eq!(out, "s3cr3t-value a b");
    s.close().await;
}

async fn register_and_call(s: &impl CallTool, name: &str, params: Value) {
    let modules = ok_text(
        s,
        "register_mcp_server",
        json!({"server_name": name, "server_params": params}),
    )
    .await;
    assert!(modules.lines().any(|m| m == "greet"), "{modules}");
    let out = exec(s, &format!("from mcptools.{name} import greet, add\nprint(greet.run(greet.Params(name='{name}')))\nadd.run(add.Params(a=1, b=2)).sum")).await;
    assert_eq!(out, format!("Hello, {name}!\n3"));
}

async fn register_servers_over_all_transports_and_call_them(era: Era) {
    require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    let s = connect(ws.path(), &[], era).await;
    register_and_call(&s, "over_stdio", fixture_stdio_params("stdio")).await;
    let sse = start_fixture("sse", None);
    register_and_call(&s, "over_sse", json!({"url": sse.url("/sse")})).await;
    let http = start_fixture("http", None);
    register_and_call(&s, "over_http", json!({"url": http.url("/mcp")})).await;
    // Registration errors are tool errors; the server keeps working.
    let err = err_text(
        &s,
        "register_mcp_server",
        json!({"server_name": "bad-name", "server_params": {"command": "x"}}),
    )
    .await;
    assert!(
        err.starts_with("invalid MCP server name \"bad-name\""),
        "{err}"
    );
    let err = err_text(
        &s,
        "register_mcp_server",
        json!({"server_name": "missing", "server_params": {"command": "/nonexistent/mcp"}}),
    )
    .await;
    assert!(
        err.starts_with("failed to connect to MCP server `missing`"),
        "{err}"
    );
    let err = err_text(&s, "register_mcp_server", json!({"server_name": "novar", "server_params": {"command": "x", "env": {"A": "${IPYBOX_TEST_UNSET_VAR}"}}})).await;
    assert!(
        err.starts_with("environment variable `IPYBOX_TEST_UNSET_VAR` is not set"),
        "{err}"
    );
    assert_eq!(exec(&s, "'still fine'").await, "'still fine'");
    s.close().await;
}

async fn reset_clears_state_and_closes_mcp_sessions(era: Era) {
    require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    let s = connect(ws.path(), &[], era).await;
    ok_text(
        &s,
        "register_mcp_server",
        json!({"server_name": "fx", "server_params": fixture_stdio_params("stdio")}),
    )
    .await;
    let pid: u32 = exec(
        &s,
        "from mcptools.fx import get_pid\nkept = 1\nprint(get_pid.run(get_pid.Params()))",
    )
    .await
    .parse()
    .unwrap();
    assert!(pid_exists(pid));
    let out = ok_text(&s, "reset", json!({})).await;
    assert_eq!(
        out,
        "Kernel reset: a fresh kernel is running and MCP sessions were closed."
    );
    assert!(
        wait_reaped(pid, Duration::from_secs(3)).await,
        "MCP server {pid} survived reset"
    );
    assert_eq!(exec(&s, "'kept' in globals()").await, "False");
    // Generated code stays.
    assert_eq!(
        exec(
            &s,
            "from mcptools.fx import greet\ngreet.run(greet.Params(name='again'))"
        )
        .await,
        "'Hello, again!'"
    );
    s.close().await;
}

async fn install_package_from_index_and_git(era: Era) {
    let ws = tempfile::tempdir().unwrap();
    // A tiny package in a local git repository, installed through a git+file:// URL.
    let repo = ws.path().join("pkgrepo");
    std::fs::create_dir_all(repo.join("ipybox_demo_pkg")).unwrap();
    std::fs::write(
        repo.join("ipybox_demo_pkg/__init__.py"),
        "VALUE = 'from git'\n",
    )
    .unwrap();
    std::fs::write(
        repo.join("pyproject.toml"),
        "[build-system]\nrequires = [\"setuptools>=61\"]\nbuild-backend = \"setuptools.build_meta\"\n\n[project]\nname = \"ipybox-demo-pkg\"\nversion = \"0.1.0\"\n",
    )
    .unwrap();
    for git in [
        &["init", "-q"][..],
        &["add", "."],
        &[
            "-c",
            "user.email=t@t",
            "-c",
            "user.name=t",
            "commit",
            "-qm",
            "init",
        ],
    ] {
        assert!(
            Command::new("git")
                .args(git)
                .current_dir(&repo)
                .status()
                .unwrap()
                .success()
        );
    }
    let home = tempfile::tempdir().unwrap(); // a private kernel environment: installs must not leak into the shared one
    let s = connect(
        ws.path(),
        &[("IPYBOX_HOME", home.path().to_str().unwrap())],
        era,
    )
    .await;
    assert_eq!(
        exec(
            &s,
            "import importlib.util\nimportlib.util.find_spec('six') is None"
        )
        .await,
        "True"
    );
    let summary = ok_text(
        &s,
        "install_package",
        json!({"package_name": "six==1.16.0"}),
    )
    .await;
    assert!(
        summary.contains("six==1.16.0") || summary.contains("six-1.16.0"),
        "{summary}"
    );
    assert_eq!(exec(&s, "import six\nsix.__version__").await, "'1.16.0'");
    // Kernels started after an install import afresh (the kernel factory builds a new template,
    // spares are replaced): a new kernel sees the package, and a package the old template had
    // imported (`packaging`, which ipykernel imports) in the version just installed.
    let probe = "import os, packaging\nprint(os.getppid(), packaging.__version__)";
    let before = exec(&s, probe).await;
    let (old_template, old_version) = before.split_once(' ').unwrap();
    let version = if old_version == "24.2" {
        "24.1"
    } else {
        "24.2"
    };
    ok_text(
        &s,
        "install_package",
        json!({"package_name": format!("packaging=={version}")}),
    )
    .await;
    ok_text(&s, "reset", json!({})).await;
    let after = exec(&s, probe).await;
    let (new_template, new_version) = after.split_once(' ').unwrap();
    assert_eq!(new_version, version, "{before} -> {after}");
    assert_ne!(
        new_template, old_template,
        "a new template: {before} -> {after}"
    );
    assert_eq!(exec(&s, "import six\nsix.__version__").await, "'1.16.0'");
    let url = format!("git+file://{}", repo.display());
    ok_text(&s, "install_package", json!({"package_name": url})).await;
    assert_eq!(
        exec(&s, "import ipybox_demo_pkg\nipybox_demo_pkg.VALUE").await,
        "'from git'"
    );
    let err = err_text(
        &s,
        "install_package",
        json!({"package_name": "--index-url=http://evil"}),
    )
    .await;
    assert!(
        err.starts_with("refusing to install `--index-url=http://evil`: it is an installer option"),
        "{err}"
    );
    let err = err_text(
        &s,
        "install_package",
        json!({"package_name": "ipybox-no-such-package-xyz==0.0.1"}),
    )
    .await;
    assert!(
        err.starts_with("installing `ipybox-no-such-package-xyz==0.0.1` failed"),
        "{err}"
    );
    s.close().await;
}

async fn concurrent_requests_queue_executions_and_register_while_running(era: Era) {
    require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    let s = std::sync::Arc::new(connect(ws.path(), &[], era).await);
    exec(&s, "log = []").await;
    // The slow cell runs until the test creates `go` (no timing: a loaded machine only makes
    // it slower); `started` says it is running.
    let slow = {
        let s = s.clone();
        tokio::spawn(async move {
            exec(&s, "import os, time\nlog.append('slow start')\nopen('started', 'w').close()\nwhile not os.path.exists('go'):\n    time.sleep(0.02)\nlog.append('slow end')\n'slow'").await
        })
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    while !ws.path().join("started").exists() {
        assert!(Instant::now() < deadline, "the slow cell did not start");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let queued = {
        let s = s.clone();
        tokio::spawn(async move { exec(&s, "log.append('queued')\n'queued'").await })
    };
    // Registration does not wait for the running execution (which waits for it: a
    // registration that waited would never return).
    tokio::time::timeout(
        Duration::from_secs(120),
        ok_text(
            &s,
            "register_mcp_server",
            json!({"server_name": "fx", "server_params": fixture_stdio_params("stdio")}),
        ),
    )
    .await
    .expect("registration waited for the execution");
    assert!(!slow.is_finished(), "registration waited for the execution");
    std::fs::write(ws.path().join("go"), "").unwrap();
    assert_eq!(slow.await.unwrap(), "'slow'");
    assert_eq!(queued.await.unwrap(), "'queued'");
    assert_eq!(
        exec(&s, "log").await,
        "['slow start', 'slow end', 'queued']"
    );
    std::sync::Arc::try_unwrap(s).ok().unwrap().close().await;
}

/// A raw JSON-RPC client over the server's stdio, for shutdown tests.
struct Raw {
    child: std::process::Child,
    stdin: Option<std::process::ChildStdin>,
    stdout: BufReader<std::process::ChildStdout>,
    next_id: u64,
    era: Era,
}

impl Raw {
    fn start(ws: &Path, era: Era) -> Raw {
        Self::start_in(ws, era, None)
    }

    /// With `runtime_base`: the runtime directory goes there (`XDG_RUNTIME_DIR`).
    fn start_in(ws: &Path, era: Era, runtime_base: Option<&Path>) -> Raw {
        let mut command = Command::new(BIN);
        if let Some(base) = runtime_base {
            command.env("XDG_RUNTIME_DIR", base);
        }
        let mut child = command
            .args(["--workspace"])
            .arg(ws)
            // No session handle in results (see `mcp_eras::start_with`);
            // `stdio_resume` has the exit test with checkpoints on.
            .args(["--checkpoint-after", "off"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let mut raw = Raw {
            child,
            stdin,
            stdout,
            next_id: 1,
            era,
        };
        match era {
            Era::Handshake => {
                let init = raw.request("initialize", json!({"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}));
                assert_eq!(init["result"]["serverInfo"]["name"], "ipybox");
                raw.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
            }
            Era::Stateless => {
                let found = raw.request("server/discover", json!({}));
                assert_eq!(
                    found["result"]["_meta"]["io.modelcontextprotocol/serverInfo"]["name"],
                    "ipybox",
                    "{found}"
                );
            }
        }
        raw
    }

    /// `_meta` of a request: 2026-07-28 requests carry the revision and the client's
    /// capabilities in every request; `extra` is merged in.
    fn meta(&self, extra: Value) -> Value {
        let mut meta = match self.era {
            Era::Handshake => json!({}),
            Era::Stateless => json!({
                "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "io.modelcontextprotocol/clientCapabilities": {},
                "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "0"},
            }),
        };
        if let (Some(meta), Value::Object(extra)) = (meta.as_object_mut(), extra) {
            meta.extend(extra);
        }
        meta
    }

    /// Sends `tools/call` with request id `id` without waiting for the answer.
    fn send_call(&mut self, id: u64, tool: &str, arguments: Value, meta: Value) {
        let meta = self.meta(meta);
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": tool, "arguments": arguments, "_meta": meta}}));
    }

    fn send(&mut self, msg: Value) {
        let stdin = self.stdin.as_mut().unwrap();
        writeln!(stdin, "{msg}").unwrap();
        stdin.flush().unwrap();
    }

    fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        let mut params = params;
        if let Some(p) = params.as_object_mut() {
            p.insert("_meta".into(), self.meta(json!({})));
        }
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        loop {
            let mut line = String::new();
            assert!(
                self.stdout.read_line(&mut line).unwrap() > 0,
                "server closed stdout"
            );
            let msg: Value = serde_json::from_str(&line).expect("stdout carries only JSON-RPC");
            if msg["id"] == json!(id) {
                return msg;
            }
        }
    }

    fn call(&mut self, tool: &str, arguments: Value) -> String {
        let r = self.request("tools/call", json!({"name": tool, "arguments": arguments}));
        r["result"]["content"][0]["text"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    /// Closes stdin or sends a signal, then waits up to `within` for ipybox to exit (polling
    /// `waitpid` every millisecond); returns the status and how long after the trigger the exit
    /// was seen.
    fn trigger_and_wait(
        &mut self,
        trigger: Trigger,
        within: Duration,
    ) -> (Option<std::process::ExitStatus>, Duration) {
        let start = Instant::now();
        match trigger {
            Trigger::StdinEof => drop(self.stdin.take()),
            Trigger::Signal(sig) => unsafe {
                libc::kill(self.child.id() as i32, sig);
            },
        }
        while start.elapsed() < within {
            if let Some(status) = self.child.try_wait().unwrap() {
                return (Some(status), start.elapsed());
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        (None, start.elapsed())
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn gone_within(pids: &[u32], within: Duration) -> Vec<u32> {
    let start = Instant::now();
    loop {
        let alive: Vec<u32> = pids
            .iter()
            .copied()
            .filter(|p| {
                std::fs::read_to_string(format!("/proc/{p}/stat")).is_ok_and(|s| !s.contains(") Z"))
            })
            .collect();
        if alive.is_empty() || start.elapsed() > within {
            return alive;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// How the client goes away.
#[derive(Debug, Clone, Copy)]
enum Trigger {
    StdinEof,
    Signal(i32),
}

/// How soon ipybox must be gone after the client closes stdin or signals it: Claude Code sends
/// SIGINT, SIGTERM 100 ms later and SIGKILL 400 ms after that.
const EXIT_WITHIN: Duration = Duration::from_millis(100);

/// A private directory on tmpfs for ipybox's runtime directory, as `XDG_RUNTIME_DIR`
/// (`/run/user/UID`) is on a desktop where Claude Code runs. Without it the runtime directory
/// is in `/tmp`, on this machine a disk shared with concurrent builds, where removing its ~30
/// entries took 3 to 50 ms: the exit bound would measure the disk's queue, not ipybox.
pub(crate) fn tmpfs_runtime_base() -> Option<tempfile::TempDir> {
    let shm = Path::new("/dev/shm");
    let dir = tempfile::Builder::new()
        .prefix("ipybox-test-xdg-")
        .tempdir_in(shm)
        .ok()?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).ok()?;
    Some(dir)
}

/// The runtime directories of ipybox `pid` under `base` (`None`: where ipybox makes them with
/// this process's environment: `$XDG_RUNTIME_DIR`, which scripts/test.sh sets, else the
/// temporary directory).
fn runtime_dirs(base: Option<&Path>, pid: u32) -> Vec<PathBuf> {
    let base = base.map_or_else(
        || {
            std::env::var_os("XDG_RUNTIME_DIR")
                .map(PathBuf::from)
                .filter(|p| p.is_dir())
                .unwrap_or_else(std::env::temp_dir)
        },
        Path::to_path_buf,
    );
    std::fs::read_dir(base)
        .unwrap()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with(&format!("ipybox-{pid}-"))
        })
        .map(|e| e.path())
        .collect()
}

/// The server has several calls in flight — a cell whose tool call is running in an MCP server,
/// a second cell queued behind it, a registration of a server that never answers — when the
/// client goes away: ipybox exits within [`EXIT_WITHIN`] of the trigger (timestamped here, the
/// exit seen by `waitpid`), its runtime directory is gone when it has exited, and its kernels
/// and every MCP child server are gone (killed by process group, reaped once ipybox is gone).
fn shutdown_with_calls_in_flight(trigger: Trigger, era: Era) {
    let ws = tempfile::tempdir().unwrap();
    let base = tmpfs_runtime_base();
    let base = base.as_ref().map(|b| b.path());
    let mut raw = Raw::start_in(ws.path(), era, base);
    let params = fixture_stdio_params("stdio");
    raw.call(
        "register_mcp_server",
        json!({"server_name": "fx", "server_params": params}),
    );
    assert_eq!(
        raw.call(
            "execute_ipython_cell",
            json!({"code": "from mcptools.fx import sleep\n6 * 7"})
        ),
        "42"
    );
    // 1: a cell whose tool call sleeps in the fixture server; 2: a cell queued behind it;
    // 3: a registration of a server that never speaks MCP.
    raw.send_call(
        901,
        "execute_ipython_cell",
        json!({"code": "print(sleep.run(sleep.Params(seconds=60)))"}),
        json!({}),
    );
    raw.send_call(
        902,
        "execute_ipython_cell",
        json!({"code": "import time\ntime.sleep(60)"}),
        json!({}),
    );
    let hang = json!({"command": python(), "args": [fixture_script(), "hang"]});
    raw.send_call(
        903,
        "register_mcp_server",
        json!({"server_name": "hang", "server_params": hang}),
        json!({}),
    );
    std::thread::sleep(Duration::from_millis(1500));
    let children = crate::proc_tree::descendants(raw.child.id());
    // kernel (+ spare), the fixture server, the hanging server, at least.
    assert!(
        children.len() >= 3,
        "expected ipybox's children, found {children:?}"
    );
    let pid = raw.child.id();
    assert_eq!(
        runtime_dirs(base, pid).len(),
        1,
        "the runtime directory is there"
    );
    let (status, exited) = raw.trigger_and_wait(trigger, Duration::from_secs(2));
    let status = status.unwrap_or_else(|| panic!("ipybox still running 2 s after {trigger:?}"));
    assert!(status.success(), "{trigger:?}: {status}");
    assert!(
        exited <= EXIT_WITHIN,
        "{trigger:?}: ipybox exited {exited:?} after it (Claude Code sends SIGTERM after 100 ms)"
    );
    assert_eq!(
        runtime_dirs(base, pid),
        Vec::<PathBuf>::new(),
        "{trigger:?}: runtime dir left behind"
    );
    assert_eq!(
        gone_within(&children, Duration::from_secs(2)),
        Vec::<u32>::new(),
        "{trigger:?}: children alive 2 s after ipybox exited (after {exited:?})"
    );
}

fn stdin_eof_with_calls_in_flight_exits_within_100_ms_leaving_nothing(era: Era) {
    require!(TestEnv);
    shutdown_with_calls_in_flight(Trigger::StdinEof, era);
}

fn sigterm_with_calls_in_flight_exits_within_100_ms_leaving_nothing(era: Era) {
    require!(TestEnv);
    shutdown_with_calls_in_flight(Trigger::Signal(libc::SIGTERM), era);
}

fn sigint_with_calls_in_flight_exits_within_100_ms_leaving_nothing(era: Era) {
    require!(TestEnv);
    shutdown_with_calls_in_flight(Trigger::Signal(libc::SIGINT), era);
}

fn stdin_eof_when_idle_exits_at_once(era: Era) {
    let ws = tempfile::tempdir().unwrap();
    let base = tmpfs_runtime_base();
    let base = base.as_ref().map(|b| b.path());
    let mut raw = Raw::start_in(ws.path(), era, base);
    assert_eq!(
        raw.call("execute_ipython_cell", json!({"code": "6 * 7"})),
        "42"
    );
    let children = crate::proc_tree::descendants(raw.child.id());
    let pid = raw.child.id();
    let (status, exited) = raw.trigger_and_wait(Trigger::StdinEof, Duration::from_secs(2));
    status.expect("ipybox exits within 2 s of stdin EOF");
    assert!(exited <= EXIT_WITHIN, "exited {exited:?} after stdin EOF");
    assert_eq!(runtime_dirs(base, pid), Vec::<PathBuf>::new());
    assert_eq!(
        gone_within(&children, Duration::from_secs(2)),
        Vec::<u32>::new()
    );
}

fn cancelled_requests_interrupt_the_execution_and_keep_state(era: Era) {
    cancelled_request_keeps_state(json!({}), era);
}

/// The same with a progress token (progress notifications while it runs).
fn cancelled_requests_with_progress_interrupt_the_execution_and_keep_state(era: Era) {
    cancelled_request_keeps_state(json!({"progressToken": "p1"}), era);
}

fn cancelled_request_keeps_state(meta: Value, era: Era) {
    let ws = tempfile::tempdir().unwrap();
    let mut raw = Raw::start(ws.path(), era);
    assert_eq!(
        raw.call("execute_ipython_cell", json!({"code": "kept = 1"})),
        ""
    );
    raw.send_call(
        777,
        "execute_ipython_cell",
        json!({"code": "import time\ntime.sleep(60)\nkept = 2"}),
        meta,
    );
    std::thread::sleep(Duration::from_millis(700));
    raw.send(json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 777, "reason": "user pressed Esc"}}));
    let start = Instant::now();
    assert_eq!(
        raw.call("execute_ipython_cell", json!({"code": "kept"})),
        "1"
    );
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "waited {:?} behind the cancelled cell",
        start.elapsed()
    );
}

both_eras!(server_identity_and_tool_schemas);
both_eras!(initialize_does_not_wait_for_the_kernel);
both_eras!(execute_ipython_cell_outputs_errors_timeouts_truncation_images);
both_eras!(dotenv_kernel_env_and_secrets);
both_eras!(register_servers_over_all_transports_and_call_them);
both_eras!(reset_clears_state_and_closes_mcp_sessions);
both_eras!(install_package_from_index_and_git);
both_eras!(concurrent_requests_queue_executions_and_register_while_running);
both_eras_blocking!(stdin_eof_with_calls_in_flight_exits_within_100_ms_leaving_nothing);
both_eras_blocking!(sigterm_with_calls_in_flight_exits_within_100_ms_leaving_nothing);
both_eras_blocking!(sigint_with_calls_in_flight_exits_within_100_ms_leaving_nothing);
both_eras_blocking!(stdin_eof_when_idle_exits_at_once);
both_eras_blocking!(cancelled_requests_interrupt_the_execution_and_keep_state);
both_eras_blocking!(cancelled_requests_with_progress_interrupt_the_execution_and_keep_state);
