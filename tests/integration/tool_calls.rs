//! Programmatic tool calling end to end: register real MCP servers, import the generated modules
//! in a real kernel, call tools through the tool server, approve or reject the calls.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::support::*;
use ipybox::CodeExecutor;
use ipybox::executor::{ExecutionEvent, ExecutorError};
use ipybox::kernel::KernelError;
use serde_json::{Value, json};

fn schema_server() -> Value {
    json!({"command": python(), "args": [root().join("tests/fixtures/schema_server.py")]})
}

#[tokio::test(flavor = "multi_thread")]
async fn generated_api_sends_exactly_what_the_caller_set() {
    require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    let modules = register(ws.path(), "sch", &schema_server()).await;
    assert_eq!(
        modules,
        [
            "echo_args",
            "echo_args_2",
            "class_",
            "_2fa",
            "evil___name",
            "structured"
        ]
    );
    let ex = executor(ws.path()).await;
    let out = run(&ex, r#"
from mcptools.sch.echo_args import Params, Nested, Sort, run
print(run(Params(required_nullable=None)))
print(run(Params(from_="a", x_y=1, schema_="s", url="https://Example.COM", id="550E8400-E29B-41D4-A716-446655440000",
                 when="2024-01-01T00:00:00+01:00", maybe=None, required_nullable=7, nested=Nested(inner="i"), sort=Sort.forks)))
print(run(Params(**{"from": "by alias", "x-y": 2, "required_nullable": 0})))
"#).await;
    let lines: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines[0], json!({"required_nullable": null}));
    assert_eq!(
        lines[1],
        json!({"from": "a", "x-y": 1, "schema": "s", "url": "https://Example.COM", "id": "550E8400-E29B-41D4-A716-446655440000",
               "when": "2024-01-01T00:00:00+01:00", "maybe": null, "required_nullable": 7, "nested": {"inner": "i"}, "sort": "forks"})
    );
    assert_eq!(
        lines[2],
        json!({"from": "by alias", "x-y": 2, "required_nullable": 0})
    );
    // A required nullable field must be given.
    let err = ex
        .execute("from mcptools.sch.echo_args import Params\nParams()", None)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ExecutorError::Kernel(KernelError::Failed { ename, .. }) if ename == "ValidationError"),
        "{err}"
    );
    // Renamed modules call the tool under its original name.
    let out = run(&ex, "from mcptools.sch import class_, _2fa, echo_args_2\nprint(class_.run(class_.Params()), _2fa.run(_2fa.Params()), echo_args_2.run(echo_args_2.Params()))").await;
    assert_eq!(out, "{} {} {}");
    // Structured content becomes a validated Result.
    let out = run(&ex, "from mcptools.sch.structured import Params, Result, run\nr = run(Params(n=21))\nprint(type(r) is Result, r.doubled, r.label)").await;
    assert_eq!(out, "True 42 n=21");
    ex.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn schema_strings_cannot_inject_code() {
    require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    let marker = Path::new("/tmp/ipybox_pwned");
    let _ = std::fs::remove_file(marker);
    register(ws.path(), "sch", &schema_server()).await;
    let source = std::fs::read_to_string(ws.path().join("mcptools/sch/evil___name.py")).unwrap();
    assert!(
        source.contains("evil\\\"\\\"\\\"name")
            || source.contains(r#"evil\"\"\"name"#)
            || source.contains("'evil\"\"\"name'"),
        "{source}"
    );
    let ex = executor(ws.path()).await;
    let out = run(&ex, "import json\nfrom mcptools.sch import evil___name as m\nprint(m.run.__doc__.count('os.system'))\nprint(m.run(m.Params.model_validate({'choice': 'a\"b'})))").await;
    assert_eq!(out, "1\n{\"choice\": \"a\\\"b\"}");
    assert!(!marker.exists(), "a schema string was executed");
    ex.stop().await;
}

/// The Python fixture (structured, text, hyphenated, error) over one transport.
async fn fixture_roundtrip(params: Value) {
    let ws = tempfile::tempdir().unwrap();
    let modules = register(ws.path(), "fx", &params).await;
    assert!(modules.contains(&"get_thing".to_string()), "{modules:?}");
    let ex = executor(ws.path()).await;
    let out = run(
        &ex,
        r#"
from mcptools.fx import add, greet, get_thing, fail
from mcptools.fx import ToolError
r = add.run(add.Params(a=2, b=3))
print(type(r).__name__, r.sum, r.operands)
print(greet.run(greet.Params(name="Ada")))
print(get_thing.run(get_thing.Params(id="42")))
try:
    fail.run(fail.Params(message="it broke"))
except ToolError as e:
    print("ToolError:", e)
"#,
    )
    .await;
    assert_eq!(
        out,
        "Result 5 [2, 3]\nHello, Ada!\nthing 42\nToolError: fx.fail failed: Error executing tool fail: it broke"
    );
    ex.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn fixture_over_stdio() {
    require!(TestEnv);
    fixture_roundtrip(fixture_stdio_params("stdio")).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn fixture_over_sse() {
    require!(TestEnv);
    let server = start_fixture("sse", None);
    fixture_roundtrip(json!({"url": server.url("/sse")})).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn fixture_over_streamable_http() {
    require!(TestEnv);
    let server = start_fixture("http", None);
    fixture_roundtrip(json!({"url": server.url("/mcp")})).await;
}

/// server-everything's structured tool and a plain one, over one transport.
async fn everything_roundtrip(params: Value) {
    let ws = tempfile::tempdir().unwrap();
    register(ws.path(), "everything", &params).await;
    let ex = executor(ws.path()).await;
    let out = run(
        &ex,
        r#"
from mcptools.everything import get_structured_content as g, echo, get_sum
r = g.run(g.Params(location=g.Location.Chicago))
print(type(r).__name__, isinstance(r.temperature, float), isinstance(r.conditions, str))
print(echo.run(echo.Params(message="hi there")))
print(get_sum.run(get_sum.Params(a=2, b=40)))
"#,
    )
    .await;
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "Result True True");
    assert_eq!(lines[1], "Echo: hi there");
    assert!(lines[2].contains("42"), "{}", lines[2]);
    ex.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn everything_over_stdio() {
    require!(TestEnv);
    everything_roundtrip(everything_stdio_params()).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn everything_over_sse() {
    require!(TestEnv);
    let server = start_everything("sse");
    everything_roundtrip(json!({"url": server.url("/sse")})).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn everything_over_streamable_http() {
    require!(TestEnv);
    let server = start_everything("streamableHttp");
    everything_roundtrip(json!({"url": server.url("/mcp")})).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn approvals_accept_reject_and_time_out() {
    require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    register(ws.path(), "fx", &fixture_stdio_params("stdio")).await;
    let ex = CodeExecutor::builder()
        .workspace(ws.path())
        .without_spare_kernel()
        .approval_timeout(Duration::from_secs(1))
        .build();
    ex.start().await.unwrap();
    approvals_accept_reject_and_time_out_on(&ex, "local kernel").await;

    // execute() accepts everything.
    assert_eq!(
        run(
            &ex,
            "from mcptools.fx import greet\ngreet.run(greet.Params(name='auto'))"
        )
        .await,
        "'Hello, auto!'"
    );
    ex.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn waiting_for_approval_does_not_count_against_the_timeout() {
    require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    register(ws.path(), "fx", &fixture_stdio_params("stdio")).await;
    let ex = CodeExecutor::builder()
        .workspace(ws.path())
        .without_spare_kernel()
        .approval_timeout(Duration::from_secs(10))
        .build();
    ex.start().await.unwrap();
    // Warm up (import the generated module, start the fixture server) without a timeout, so the
    // timed execution below does nothing slow but wait for its approval.
    let (_, warm) = stream_with(
        &ex,
        "from mcptools.fx import greet\nprint(greet.run(greet.Params(name='warm')))",
        None,
        |_| Some((true, Duration::ZERO)),
    )
    .await;
    assert_eq!(warm.unwrap(), "Hello, warm!");
    let start = Instant::now();
    let (asked, out) = stream_with(
        &ex,
        "print(greet.run(greet.Params(name='patient')))",
        Some(Duration::from_secs(2)),
        |_| Some((true, Duration::from_secs(3))),
    )
    .await;
    assert_eq!(asked.len(), 1);
    assert_eq!(out.unwrap(), "Hello, patient!");
    assert!(start.elapsed() >= Duration::from_secs(3));
    ex.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_leftover_approval_wait_does_not_pause_the_next_execution() {
    require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    register(ws.path(), "fx", &fixture_stdio_params("stdio")).await;
    let ex = CodeExecutor::builder()
        .workspace(ws.path())
        .without_spare_kernel()
        .approval_timeout(Duration::from_secs(30))
        .build();
    ex.start().await.unwrap();
    // A background thread of the first execution asks for approval; the execution ends while
    // the request is still held, undecided.
    let mut first = ex.stream(
        "import threading, time
from mcptools.fx import greet
threading.Thread(target=lambda: greet.run(greet.Params(name='bg')), daemon=True).start()
time.sleep(0.5)
'first'",
        None,
    );
    let mut held = None;
    let mut first_out = None;
    while let Some(ev) = first.next().await {
        match ev {
            ExecutionEvent::Approval(request) => held = Some(request),
            ExecutionEvent::Result(r) => first_out = Some(r.unwrap().text),
            _ => {}
        }
    }
    assert_eq!(first_out.as_deref(), Some("'first'"));
    let held = held.expect("the background call asked for approval");
    // The next execution's timeout runs: the held request belongs to the first one's clock.
    let err = ex
        .execute(
            "import time
time.sleep(5)",
            Some(Duration::from_secs(1)),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(err, ExecutorError::Kernel(KernelError::Timeout { .. })),
        "{err}"
    );
    held.reject();
    ex.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn hundred_concurrent_calls_from_threads() {
    require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    register(ws.path(), "fx", &fixture_stdio_params("stdio")).await;
    let ex = executor(ws.path()).await;
    let out = run(
        &ex,
        r#"
from concurrent.futures import ThreadPoolExecutor
from mcptools.fx import add, sleep
sleep.run(sleep.Params(seconds=0))  # connect first
with ThreadPoolExecutor(100) as pool:
    results = list(pool.map(lambda i: add.run(add.Params(a=i, b=i)).sum, range(100)))
    slept = list(pool.map(lambda i: sleep.run(sleep.Params(seconds=0.5)), range(100)))
print(results == [2 * i for i in range(100)], len(slept), set(slept))
"#,
    )
    .await;
    assert_eq!(out, "True 100 {'slept 0.5'}");
    assert_eq!(ex.mcp_sessions().await, 1);
    ex.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn reset_closes_sessions_and_calls_reconnect() {
    require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    register(ws.path(), "fx", &fixture_stdio_params("stdio")).await;
    let ex = executor(ws.path()).await;
    let pid: u32 = run(
        &ex,
        "from mcptools.fx import get_pid\nget_pid.run(get_pid.Params())",
    )
    .await
    .trim_matches('\'')
    .parse()
    .unwrap();
    assert!(pid_exists(pid));
    assert_eq!(ex.mcp_sessions().await, 1);
    // The server is closed in the background (stdin closed, up to 500 ms of grace) and is gone
    // soon after. That the reset does not wait for it is a timing, measured by `cargo bench
    // --bench mcp_server` ("`reset()` alone, stdio server open"), not asserted here.
    ex.reset().await.unwrap();
    assert_eq!(ex.mcp_sessions().await, 0);
    assert!(
        wait_reaped(pid, Duration::from_secs(3)).await,
        "MCP server {pid} survived reset"
    );
    let again: u32 = run(
        &ex,
        "from mcptools.fx import get_pid\nget_pid.run(get_pid.Params())",
    )
    .await
    .trim_matches('\'')
    .parse()
    .unwrap();
    assert_ne!(again, pid);
    ex.stop().await;
    assert!(!pid_exists(again), "MCP server {again} survived stop");
}

#[tokio::test(flavor = "multi_thread")]
async fn dead_servers_and_bad_params_give_clear_errors() {
    require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    // Registration errors
    let err = ipybox::generate_mcp_sources(
        "fx",
        &json!({"command": "/nonexistent/server"}),
        &ws.path().join("mcptools"),
    )
    .await
    .unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.starts_with("failed to connect to MCP server `fx` (`/nonexistent/server`) (stdio)"),
        "{msg}"
    );
    let err =
        ipybox::generate_mcp_sources("fx", &json!({"comand": "x"}), &ws.path().join("mcptools"))
            .await
            .unwrap_err();
    assert!(
        err.to_string().starts_with("invalid MCP server params"),
        "{err}"
    );
    let err = ipybox::generate_mcp_sources(
        "not-valid",
        &json!({"command": "x"}),
        &ws.path().join("mcptools"),
    )
    .await
    .unwrap_err();
    assert!(
        err.to_string()
            .starts_with("invalid MCP server name \"not-valid\""),
        "{err}"
    );
    assert!(!ws.path().join("mcptools").exists() || !ws.path().join("mcptools/not-valid").exists());

    // A server that goes away after registration
    let server = start_fixture("http", None);
    register(ws.path(), "gone", &json!({"url": server.url("/mcp")})).await;
    drop(server);
    let ex = executor(ws.path()).await;
    let out = run(&ex, "from mcptools.gone import greet, ToolError\ntry:\n    greet.run(greet.Params(name='x'))\nexcept ToolError as e:\n    print(str(e).splitlines()[0])").await;
    assert!(
        out.starts_with("failed to connect to MCP server `gone`"),
        "{out}"
    );
    // A killed stdio server is replaced on the next call
    register(ws.path(), "fx", &fixture_stdio_params("stdio")).await;
    let pid: u32 = run(
        &ex,
        "from mcptools.fx import get_pid\nget_pid.run(get_pid.Params())",
    )
    .await
    .trim_matches('\'')
    .parse()
    .unwrap();
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let out = run(
        &ex,
        "from mcptools.fx import greet\ngreet.run(greet.Params(name='back'))",
    )
    .await;
    assert_eq!(out, "'Hello, back!'");
    ex.stop().await;
}

#[test]
fn cli_apigen_generates_modules() {
    require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    let params = fixture_stdio_params("stdio").to_string();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ipybox"))
        .current_dir(ws.path())
        .args(["apigen", "fx", "--params", &params])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "add\ngreet\nget_thing\nfail\necho\nsleep\nget_header\nget_env\nget_cwd\nget_pid\n"
    );
    assert!(ws.path().join("mcptools/fx/get_thing.py").exists());
    assert!(ws.path().join("mcptools/__init__.py").exists());
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ipybox"))
        .args(["apigen", "fx", "--params", "{not json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).starts_with("error: --params is not valid JSON"));
}

#[test]
fn cli_exec_asks_for_approval_or_needs_yes() {
    require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    let params = fixture_stdio_params("stdio").to_string();
    let ipybox = env!("CARGO_BIN_EXE_ipybox");
    let st = std::process::Command::new(ipybox)
        .current_dir(ws.path())
        .args(["apigen", "fx", "--params", &params])
        .output()
        .unwrap();
    assert!(st.status.success());
    let code = "from mcptools.fx import greet\nprint(greet.run(greet.Params(name='cli')))";
    // No terminal (setsid detaches the controlling tty): rejected, with the hint.
    let out = std::process::Command::new("setsid")
        .current_dir(ws.path())
        .args(["-w", ipybox, "exec", "-c", code])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(
            "no terminal to ask for approval\n  help: pass --yes to approve all tool calls"
        ),
        "{stderr}"
    );
    assert!(
        stderr.trim_end().ends_with(&format!(
            "ApprovalRejectedError: Approval request for fx.greet rejected: tool call fx.greet was rejected by the application\n  help: {REJECTED_HELP}"
        )),
        "{stderr}"
    );
    let out = std::process::Command::new(ipybox)
        .current_dir(ws.path())
        .args(["exec", "--yes", "-c", code])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "Hello, cli!\n");
}

/// `cancel()` while the application holds an undecided approval request (a user pressing stop
/// while a permission prompt is open): the stream ends promptly with `Cancelled`, the pending
/// call is rejected (a late `accept()` runs nothing), and the executor keeps its state.
#[tokio::test(flavor = "multi_thread")]
async fn cancel_while_an_approval_is_pending_ends_the_stream() {
    require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    register(ws.path(), "fx", &fixture_stdio_params("stdio")).await;
    // The default approval timeout (60 s): nothing but the cancel may end the wait.
    let ex = CodeExecutor::builder()
        .workspace(ws.path())
        .without_spare_kernel()
        .build();
    ex.start().await.unwrap();
    run(&ex, "x = 41").await;
    let mut execution = ex.stream(
        "from mcptools.fx import greet\nprint('before')\nprint(greet.run(greet.Params(name='never')))\nprint('after')",
        None,
    );
    let mut held = None;
    while let Some(ev) = execution.next().await {
        if let ExecutionEvent::Approval(request) = ev {
            held = Some(request);
            break;
        }
    }
    let held = held.expect("the call asks for approval");
    let start = Instant::now();
    assert!(ex.cancel(), "an execution is running");
    let mut rest = Vec::new();
    let drained = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(ev) = execution.next().await {
            rest.push(ev);
        }
    })
    .await;
    assert!(drained.is_ok(), "the stream did not end after cancel()");
    let elapsed = start.elapsed();
    assert!(
        elapsed <= Duration::from_secs(1),
        "stream ended after {elapsed:?}"
    );
    match rest.last() {
        Some(ExecutionEvent::Result(Err(ExecutorError::Cancelled))) => {}
        other => panic!("expected a Cancelled result last, got {other:?}"),
    }
    // Too late: the call was rejected when the execution was cancelled; nothing is called.
    held.accept();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(ex.mcp_sessions().await, 0, "the tool was called");
    assert_eq!(run(&ex, "x + 1").await, "42");
    assert_eq!(
        run(&ex, "print(greet.run(greet.Params(name='next')))").await,
        "Hello, next!"
    );
    ex.stop().await;
}

/// The trust rule on the user's own unsandboxed kernel (issue 18): registered servers only, with
/// their recorded params; a server registered while the executor runs is callable at once; the
/// registrations of one workspace do not reach another (generated code copied there is refused).
#[tokio::test(flavor = "multi_thread")]
async fn kernels_reach_only_servers_registered_for_their_workspace() {
    require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    let ex = executor(ws.path()).await;
    // Registered after the executor started (another process could have done it).
    register(ws.path(), "fx", &fixture_params_who()).await;
    forged_params_reach_nothing(&ex, ws.path(), "local kernel").await;
    ex.stop().await;
    // The same generated code in another workspace: not registered there.
    let other = tempfile::tempdir().unwrap();
    copy_dir(&ws.path().join("mcptools"), &other.path().join("mcptools"));
    let ex = executor(other.path()).await;
    let err = ex
        .execute(
            "from mcptools.fx import get_env\nget_env.run(get_env.Params(name='WHO'))",
            Some(Duration::from_secs(30)),
        )
        .await
        .unwrap_err();
    assert!(
        err.error_text().contains(
            "ToolError: MCP server `fx` is not registered for any directory this kernel imports from"
        ),
        "{}",
        err.error_text()
    );
    ex.stop().await;
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}
