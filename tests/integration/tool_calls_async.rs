//! The async generated API end to end (`ApiStyle::Async`, `ipybox apigen --async`): `await run(...)`
//! in a real kernel through `ToolRunner.run_async`, calls in flight at once with `asyncio.gather`,
//! one approval request per concurrent call, the same typed errors as the sync path, and a
//! timeout that interrupts awaited calls without losing the kernel.

use std::path::Path;
use std::time::Duration;

use crate::support::*;
use ipybox::CodeExecutor;
use ipybox::apigen::ApiStyle;
use ipybox::executor::{ExecutionEvent, ExecutorError};
use ipybox::kernel::KernelError;

/// Registers the stdio fixture as `fx` with `async def run`.
async fn register_fixture(ws: &Path) {
    register_styled(ws, "fx", &fixture_stdio_params("stdio"), ApiStyle::Async).await;
}

async fn executor_with_approval_timeout(ws: &Path, timeout: Duration) -> CodeExecutor {
    let ex = CodeExecutor::builder()
        .workspace(ws)
        .without_spare_kernel()
        .approval_timeout(timeout)
        .build();
    ex.start().await.expect("executor starts");
    ex
}

#[tokio::test(flavor = "multi_thread")]
async fn awaited_calls_return_what_sync_calls_return() {
    require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    register_fixture(ws.path()).await;
    let ex = executor(ws.path()).await;
    let out = run(
        &ex,
        r#"
import inspect
from mcptools.fx import add, greet, get_thing, fail, ToolError
print(inspect.iscoroutinefunction(add.run), inspect.iscoroutinefunction(greet.run))
r = await add.run(add.Params(a=2, b=3))
print(type(r).__name__, r.sum, r.operands)
print(await greet.run(greet.Params(name="Ada")))
print(await get_thing.run(get_thing.Params(id="42")))
try:
    await fail.run(fail.Params(message="it broke"))
except ToolError as e:
    print("ToolError:", e)
"#,
    )
    .await;
    assert_eq!(
        out,
        "True True\nResult 5 [2, 3]\nHello, Ada!\nthing 42\nToolError: fx.fail failed: Error executing tool fail: it broke"
    );
    // Without a tool server the async path fails like the sync one: the base class, same text.
    let out = run(
        &ex,
        r#"
import inspect, os
from ipybox_runtime import ToolRunnerError
from mcptools.fx import greet
saved = os.environ["IPYBOX_TOOL_SOCKET"]
os.environ["IPYBOX_TOOL_SOCKET"] = "/nonexistent/tool.sock"
try:
    for call in (lambda: greet.runner.run("greet", {"name": "x"}), lambda: greet.run(greet.Params(name="x"))):
        try:
            r = call()
            if inspect.isawaitable(r):
                await r
        except ToolRunnerError as e:
            print(type(e).__name__, str(e).split(":")[0])
finally:
    os.environ["IPYBOX_TOOL_SOCKET"] = saved
"#,
    )
    .await;
    assert_eq!(
        out,
        "ToolRunnerError cannot reach the ipybox tool server at /nonexistent/tool.sock\n\
         ToolRunnerError cannot reach the ipybox tool server at /nonexistent/tool.sock"
    );
    ex.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn gathered_calls_run_concurrently() {
    require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    register_fixture(ws.path()).await;
    let ex = executor(ws.path()).await;
    // The first call starts the fixture (a Python process importing `mcp`): keep it out of the
    // measured time.
    run(
        &ex,
        "from mcptools.fx.sleep import Params, run\nawait run(Params(seconds=0))",
    )
    .await;
    let out = run(
        &ex,
        r#"
import asyncio, time
from mcptools.fx.sleep import Params, run
start = time.perf_counter()
results = await asyncio.gather(*(run(Params(seconds=0.5)) for _ in range(5)))
elapsed = time.perf_counter() - start
print(results)
print(f"{elapsed:.3f}")
"#,
    )
    .await;
    let (results, elapsed) = out.split_once('\n').unwrap();
    assert_eq!(results, format!("[{}]", ["'slept 0.5'"; 5].join(", ")));
    let elapsed: f64 = elapsed.parse().unwrap();
    eprintln!("5 gathered sleep(0.5) calls took {elapsed:.3} s");
    // One after the other they take 2.5 s.
    assert!(elapsed < 1.8, "not concurrent: {elapsed} s");
    assert_eq!(ex.mcp_sessions().await, 1);
    ex.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_rejected_awaited_call_raises_approval_rejected() {
    require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    register_fixture(ws.path()).await;
    let ex = executor_with_approval_timeout(ws.path(), Duration::from_secs(1)).await;
    let code = r#"
from mcptools.fx import greet, ApprovalRejected
try:
    await greet.run(greet.Params(name="no"))
except ApprovalRejected as e:
    print("rejected:", e)
"#;
    let (asked, out) = stream_with(&ex, code, None, |_| Some((false, Duration::ZERO))).await;
    assert_eq!(asked, [r#"fx.greet(name="no")"#]);
    assert_eq!(
        out.unwrap(),
        "rejected: Approval request for fx.greet rejected: tool call fx.greet was rejected by the application"
    );
    // Uncaught, it fails the execution with its own type.
    let code = "from mcptools.fx import greet\nawait greet.run(greet.Params(name='no'))";
    let (_, out) = stream_with(&ex, code, None, |_| Some((false, Duration::ZERO))).await;
    match out.unwrap_err() {
        ExecutorError::Kernel(KernelError::Failed { ename, evalue, .. }) => {
            assert_eq!(ename, "ApprovalRejectedError");
            assert_eq!(
                evalue,
                "Approval request for fx.greet rejected: tool call fx.greet was rejected by the application"
            );
        }
        other => panic!("expected ApprovalRejected, got {other}"),
    }
    // No decision within the approval timeout (1 s).
    let code = "from mcptools.fx import greet, ApprovalTimeout\ntry:\n    await greet.run(greet.Params(name='late'))\nexcept ApprovalTimeout as e:\n    print('timeout:', e)";
    let (_, out) = stream_with(&ex, code, None, |_| None).await;
    assert_eq!(
        out.unwrap(),
        "timeout: Approval request for fx.greet expired: tool call fx.greet was not approved within 1 s, so it was not made"
    );
    ex.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_calls_each_ask_for_approval() {
    require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    register_fixture(ws.path()).await;
    let ex = executor_with_approval_timeout(ws.path(), Duration::from_secs(30)).await;
    let code = r#"
import asyncio
from mcptools.fx import greet
results = await asyncio.gather(*(greet.run(greet.Params(name=n)) for n in "abc"), return_exceptions=True)
print([r if isinstance(r, str) else f"{type(r).__name__}: {r}" for r in results])
"#;
    // No request is answered before all three are waiting: calls made one after the other
    // would never get there.
    let mut execution = ex.stream(code, Some(Duration::from_secs(60)));
    let mut waiting = Vec::new();
    let mut out = None;
    while let Some(ev) = execution.next().await {
        match ev {
            ExecutionEvent::Approval(request) => {
                waiting.push(request);
                if waiting.len() == 3 {
                    waiting.sort_by_key(|r| r.describe());
                    let asked: Vec<String> = waiting.iter().map(|r| r.describe()).collect();
                    assert_eq!(
                        asked,
                        [
                            r#"fx.greet(name="a")"#,
                            r#"fx.greet(name="b")"#,
                            r#"fx.greet(name="c")"#
                        ]
                    );
                    for request in waiting.drain(..) {
                        if request.arguments["name"] == "b" {
                            request.reject();
                        } else {
                            request.accept();
                        }
                    }
                }
            }
            ExecutionEvent::Result(r) => out = Some(r.unwrap().text),
            _ => {}
        }
    }
    assert_eq!(
        out.unwrap(),
        "['Hello, a!', 'ApprovalRejectedError: Approval request for fx.greet rejected: tool call fx.greet was rejected by the application', 'Hello, c!']"
    );
    ex.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_timeout_interrupts_awaited_calls_and_keeps_the_kernel() {
    require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    register_fixture(ws.path()).await;
    let ex = executor(ws.path()).await;
    run(
        &ex,
        "from mcptools.fx.sleep import Params, run\nkept = 'yes'",
    )
    .await;
    let err = ex
        .execute(
            "import asyncio\nawait asyncio.gather(*(run(Params(seconds=30)) for _ in range(3)))",
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
    assert_eq!(
        run(&ex, "print(kept, await run(Params(seconds=0.1)))").await,
        "yes slept 0.1"
    );
    ex.stop().await;
}

#[test]
fn cli_apigen_async_generates_async_run() {
    require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    let params = fixture_stdio_params("stdio").to_string();
    let out = std::process::Command::new(BIN)
        .current_dir(ws.path())
        .args(["apigen", "fx", "--async", "--params", &params])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let source = std::fs::read_to_string(ws.path().join("mcptools/fx/greet.py")).unwrap();
    assert!(
        source.contains(
            "async def run(params: Params) -> str:\n    \"\"\"Greet someone (text output).\"\"\"\n    out = await runner.run_async(\n        \"greet\",\n"
        ),
        "{source}"
    );
    let help = std::process::Command::new(BIN)
        .args(["apigen", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(help.contains("--async"), "{help}");
}
