//! Which registered servers a kernel reaches (issue 28): those the host registered for a
//! directory the kernel's executor imports from — its workspace or an entry of `kernel_env`'s
//! `PYTHONPATH` — as `root_dir` or as `root_dir`'s parent. The layouts of Python ipybox 0.9.2's
//! users, through the Rust SDK, the CLI (`ipybox apigen --root`) and the MCP server; what no
//! kernel can do about its roots is in `sandbox` (links) and below (sys.path).
//!
//! Not here: the rule's table without kernels (unit tests in `src/tools/registry.rs`), forged
//! params (`tool_calls`, `support::forged_params_reach_nothing`).

use std::path::Path;
use std::time::{Duration, Instant};

use crate::support::*;
use ipybox::CodeExecutor;
use ipybox::apigen::ApiStyle;
use ipybox::executor::{ExecutionEvent, ExecutorError};
use ipybox::tools::DEFAULT_CONNECT_TIMEOUT;
use serde_json::{Value, json};

/// Generates the fixture's package `<root_dir>/<name>/` and registers it for `root_dir`.
async fn generate(root_dir: &Path, name: &str, params: &Value) {
    ipybox::generate_mcp_sources_with(
        name,
        params,
        root_dir,
        &process_env(),
        DEFAULT_CONNECT_TIMEOUT,
        ApiStyle::Sync,
    )
    .await
    .expect("generate_mcp_sources");
}

/// The fixture with `WHO=<who>` in its env: which registration a call reached shows in
/// `get_env(name="WHO")`.
fn fixture_who(who: &str) -> Value {
    json!({"command": python(), "args": [fixture_script(), "stdio"], "env": {"WHO": who}})
}

async fn started(builder: ipybox::executor::CodeExecutorBuilder) -> CodeExecutor {
    let ex = builder.without_spare_kernel().build();
    ex.start().await.expect("executor starts");
    ex
}

/// The fixture (stdio), writing a line to `log` for each `get_pid` call that reaches it.
fn fixture_logging(log: &Path) -> Value {
    json!({"command": python(), "args": [fixture_script(), "stdio"], "env": {"FIXTURE_CALL_LOG": log}})
}

/// The lines of the fixture's call log (none: no call reached it).
fn calls_in(log: &Path) -> String {
    match std::fs::read_to_string(log) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => panic!("cannot read {}: {e}", log.display()),
    }
}

/// What every layout must do with the package imported as `module` (`fx` or `mcptools.fx`,
/// registered as [`fixture_logging`] with `log`): an approved call with a structured result, a
/// rejected one, output streamed around a call, and a cancel while the approval is pending (the
/// call never reaches the server, which the same call approved does; state is kept).
async fn calls_work(ex: &CodeExecutor, module: &str, log: &Path, what: &str) {
    // Approved (execute() accepts), structured result.
    let out = run(
        ex,
        &format!("from {module}.add import Params, Result, run\nr = run(Params(a=2, b=3))\nprint(isinstance(r, Result), r.sum, r.operands)"),
    )
    .await;
    assert_eq!(out, "True 5 [2, 3]", "{what}: approved, structured");
    // Streamed: output arrives as chunks, accepted and rejected calls in between.
    let code = format!(
        "from {module} import greet, ApprovalRejected\nprint('before', flush=True)\nprint(greet.run(greet.Params(name='yes')))\ntry:\n    greet.run(greet.Params(name='no'))\nexcept ApprovalRejected as e:\n    print('rejected:', e)"
    );
    let mut execution = ex.stream(&code, Some(Duration::from_secs(60)));
    let (mut chunks, mut asks) = (String::new(), Vec::new());
    let result = loop {
        match execution.next().await.expect("a result ends the stream") {
            ExecutionEvent::Chunk(text) => chunks.push_str(&text),
            ExecutionEvent::Approval(request) => {
                asks.push(request.describe());
                if request.describe().contains("\"yes\"") {
                    request.accept()
                } else {
                    request.reject()
                }
            }
            ExecutionEvent::Image(_) => {}
            ExecutionEvent::Result(r) => break r,
        }
    };
    let expected = "before\nHello, yes!\nrejected: Approval request for fx.greet rejected: tool call fx.greet was rejected by the application";
    assert_eq!(
        asks,
        [r#"fx.greet(name="yes")"#, r#"fx.greet(name="no")"#],
        "{what}"
    );
    assert_eq!(chunks.trim_end(), expected, "{what}: chunks");
    assert_eq!(result.expect("streamed").text, expected, "{what}: streamed");
    // The control: the call approved reaches the server (a line in its log).
    let get_pid = format!("from {module} import get_pid\nprint(get_pid.run(get_pid.Params()))");
    run(ex, &get_pid).await;
    assert_eq!(calls_in(log), "get_pid\n", "{what}: the approved call");
    // Cancel while the approval is pending.
    run(ex, "kept = 'state'").await;
    let mut execution = ex.stream(&get_pid, None);
    let held = loop {
        match execution.next().await.expect("the call asks first") {
            ExecutionEvent::Approval(request) => break request,
            ExecutionEvent::Result(r) => panic!("{what}: ended before asking: {r:?}"),
            _ => {}
        }
    };
    let start = Instant::now();
    assert!(ex.cancel(), "{what}: an execution is running");
    let last = tokio::time::timeout(Duration::from_secs(10), async {
        let mut last = None;
        while let Some(ev) = execution.next().await {
            last = Some(ev);
        }
        last
    })
    .await
    .expect("the stream ends after cancel()");
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "{what}: {:?}",
        start.elapsed()
    );
    assert!(
        matches!(
            last,
            Some(ExecutionEvent::Result(Err(ExecutorError::Cancelled)))
        ),
        "{what}: {last:?}"
    );
    held.accept(); // too late: nothing is called
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        calls_in(log),
        "get_pid\n",
        "{what}: the cancelled call reached the server"
    );
    assert_eq!(run(ex, "print(kept)").await, "state", "{what}");
}

/// The issue's example: the package generated into a temporary directory that is put on the
/// kernel's `PYTHONPATH`; the workspace is elsewhere.
#[tokio::test(flavor = "multi_thread")]
async fn a_temp_dir_on_the_kernels_pythonpath() {
    require!(TestEnv);
    let (ws, tmp) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let log = tmp.path().join("calls.log");
    generate(tmp.path(), "fx", &fixture_logging(&log)).await;
    let ex = started(
        CodeExecutor::builder()
            .workspace(ws.path())
            .kernel_env([("PYTHONPATH", tmp.path().display().to_string())]),
    )
    .await;
    calls_work(&ex, "fx", &log, "temp dir on PYTHONPATH").await;
    ex.stop().await;
    // The same workspace without that entry reaches nothing.
    let ex = started(CodeExecutor::builder().workspace(ws.path())).await;
    let err = ex
        .execute(
            "from ipybox_runtime import ToolRunner\nToolRunner('fx', {}).run('greet', {'name': 'x'})",
            Some(Duration::from_secs(30)),
        )
        .await
        .unwrap_err();
    assert!(
        err.error_text().contains(
            "ToolError: MCP server `fx` is not registered for any directory this kernel imports from"
        ) && err
            .error_text()
            .contains(&format!("is one of {} (the workspace", ws.path().canonicalize().unwrap().display())),
        "{}",
        err.error_text()
    );
    ex.stop().await;
}

/// `root_dir=<dir>/mcptools` with `<dir>` on the kernel's `PYTHONPATH` (relative to the
/// workspace, as Python takes it), and a package generated straight into the workspace
/// (`import fx` from the working directory).
#[tokio::test(flavor = "multi_thread")]
async fn mcptools_under_a_pythonpath_entry_and_a_package_in_the_workspace() {
    require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    let log = ws.path().join("calls.log");
    generate(
        &ws.path().join("lib/mcptools"),
        "fx",
        &fixture_logging(&log),
    )
    .await;
    generate(ws.path(), "gx", &fixture_who("in the workspace")).await;
    let ex = started(
        CodeExecutor::builder()
            .workspace(ws.path())
            .kernel_env([("PYTHONPATH", "./lib")]),
    )
    .await;
    calls_work(&ex, "mcptools.fx", &log, "<PYTHONPATH entry>/mcptools").await;
    assert_eq!(
        run(
            &ex,
            "from gx import get_env\nprint(get_env.run(get_env.Params(name='WHO')))"
        )
        .await,
        "in the workspace"
    );
    ex.stop().await;
}

/// Several executors in one process, each told to import from its own directory: each reaches
/// the server registered there (one name, different params), not the other's; an executor that
/// imports from both reaches each through its package, and a call from no package of theirs
/// gets an error that says what to do.
#[tokio::test(flavor = "multi_thread")]
async fn several_executors_each_reach_their_own() {
    require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    let (one, two) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    generate(one.path(), "fx", &fixture_who("one")).await;
    generate(two.path(), "fx", &fixture_who("two")).await;
    generate(two.path(), "gx", &fixture_who("two's gx")).await;
    let on = |dirs: &[&Path]| {
        let path: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
        CodeExecutor::builder()
            .workspace(ws.path())
            .kernel_env([("PYTHONPATH", path.join(":"))])
    };
    let (e1, e2) = tokio::join!(started(on(&[one.path()])), started(on(&[two.path()])));
    let who = "from fx import get_env\nprint(get_env.run(get_env.Params(name='WHO')))";
    let (a, b) = tokio::join!(run(&e1, who), run(&e2, who));
    assert_eq!((a.as_str(), b.as_str()), ("one", "two"));
    // gx is two's only: the first executor's kernel cannot call it, whatever it puts on sys.path.
    let code = format!(
        "import sys\nsys.path.insert(0, {two:?})\nfrom gx import get_env, ToolError\ntry:\n    get_env.run(get_env.Params(name='WHO'))\nexcept ToolError as e:\n    print(str(e).splitlines()[0])",
        two = two.path().display().to_string()
    );
    assert_eq!(
        run(&e1, &code).await,
        "MCP server `gx` is not registered for any directory this kernel imports from: kernel code can only call servers the host registered, with the params recorded then"
    );
    assert_eq!(
        run(
            &e2,
            "from gx import get_env\nprint(get_env.run(get_env.Params(name='WHO')))"
        )
        .await,
        "two's gx"
    );
    // Both directories: the call goes to the registration whose package made it (Python
    // imports `fx` from the first entry, then `fx` of the second under another name); a call
    // that no registration's package makes is refused, saying what to do.
    let both = started(on(&[one.path(), two.path()])).await;
    let code = format!(
        "import importlib.util, sys\nfrom fx import get_env\nprint(get_env.run(get_env.Params(name='WHO')))\nspec = importlib.util.spec_from_file_location('fx_two', {init:?}, submodule_search_locations=[{dir:?}])\nfx_two = importlib.util.module_from_spec(spec)\nsys.modules['fx_two'] = fx_two\nspec.loader.exec_module(fx_two)\nprint(fx_two.runner.run('get_env', {{'name': 'WHO'}}))",
        init = two.path().join("fx/__init__.py").display().to_string(),
        dir = two.path().join("fx").display().to_string(),
    );
    assert_eq!(run(&both, &code).await, "one\ntwo");
    let err = both
        .execute(
            "from ipybox_runtime import ToolRunner\nToolRunner('fx', {}).run('get_env', {'name': 'WHO'})",
            Some(Duration::from_secs(30)),
        )
        .await
        .unwrap_err();
    let canonical = |p: &Path| p.canonicalize().unwrap().display().to_string();
    let expected = format!(
        "ToolError: MCP server `fx` is registered for 2 directories this kernel imports from, with different params, and the calling code's params are those of none of them, so ipybox cannot tell which one it means:\n    {}\n    {}\n  help: call it through the package generated in one of these directories",
        canonical(one.path()).min(canonical(two.path())),
        canonical(one.path()).max(canonical(two.path())),
    );
    assert!(err.error_text().contains(&expected), "{}", err.error_text());
    for ex in [e1, e2, both] {
        ex.stop().await;
    }
}

/// `ipybox apigen NAME --root DIR` (DIR relative to its working directory), then the MCP server
/// with `KERNEL_ENV_PYTHONPATH=DIR` in the workspace `.env`: its kernel reaches the server; and
/// its own `register_mcp_server` works as before, side by side.
#[tokio::test(flavor = "multi_thread")]
async fn apigen_root_and_the_mcp_servers_kernel() {
    require!(TestEnv);
    let (ws, elsewhere) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let out = std::process::Command::new(BIN)
        .current_dir(elsewhere.path())
        .args([
            "apigen",
            "fx",
            "--root",
            "tools",
            "--params",
            &fixture_who("apigen --root").to_string(),
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::write(
        ws.path().join(".env"),
        format!(
            "KERNEL_ENV_PYTHONPATH={}\n",
            elsewhere.path().join("tools").display()
        ),
    )
    .unwrap();
    let session = connect_ipybox_with(ws.path(), &[], &[]).await;
    let text = ok_text(
        &session,
        "execute_ipython_cell",
        json!({"code": "from fx import get_env\nprint(get_env.run(get_env.Params(name='WHO')))"}),
    )
    .await;
    assert_eq!(text, "apigen --root");
    ok_text(
        &session,
        "register_mcp_server",
        json!({"server_name": "gx", "server_params": fixture_who("register_mcp_server")}),
    )
    .await;
    let text = ok_text(
        &session,
        "execute_ipython_cell",
        json!({"code": "from mcptools.gx import get_env\nprint(get_env.run(get_env.Params(name='WHO')))"}),
    )
    .await;
    assert_eq!(text, "register_mcp_server");
    session.close().await;
}
