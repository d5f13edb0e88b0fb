//! Approval benchmark (`cargo bench --bench approvals`); prints a table.
//!
//! - Elicitation (`--approve ask`): a warm tool call from kernel code through the `ipybox` MCP
//!   server whose client answers every `elicitation/create` at once (accept, not for the
//!   session), against the same call with `--approve auto`. The difference is the approval
//!   round trip through the client.
//! - The two MCP eras: a cell with one approved tool call, answered at once, per cell: the
//!   handshake era (one `elicitation/create` inside the call) and 2026-07-28 (two rounds: the
//!   call answers `input_required`, the retry resumes the cell), against the same cell with
//!   `--approve auto`.
//! - Tasks (`--task-after 0`, a client with the tasks extension): `tools/call` → the task
//!   (creation), → the first `tasks/get` answer, and `print(1)` as a task (polled without pause
//!   until completed) against a plain call.
//! - Shell-command approval (`approve_shell_cmds`): `!true` in a loop, through the Rust library
//!   with and without it (`execute()`, which accepts), and with `stream()` answering each request.
//!
//! Needs `bash scripts/test-env.sh` (the fixture MCP server's venv).

// These start fixtures and ipybox itself, not host children of ipybox (clippy.toml).
#![allow(clippy::disallowed_methods)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use ipybox::CodeExecutor;
use ipybox::executor::ExecutionEvent;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, ClientCapabilities, ClientConfig, ElicitRequestParams,
    ElicitResult, ElicitationAction, GetTaskParams, Implementation, ProtocolVersion,
};
use rmcp::service::{ClientLifecycleMode, ClientServiceExt, RequestContext, RunningService};
use rmcp::{ClientHandler, ErrorData, RoleClient, ServiceExt};
use serde_json::{Value, json};

#[path = "common/mod.rs"]
mod common;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Declares elicitation (and the tasks extension) and accepts every question at once, in the
/// handshake era or (`modern`) in 2026-07-28.
#[derive(Clone)]
struct AutoAnswer {
    modern: bool,
}

impl ClientHandler for AutoAnswer {
    fn get_info(&self) -> ClientConfig {
        let mut capabilities = ClientCapabilities::builder().enable_elicitation().build();
        capabilities
            .extensions
            .get_or_insert_with(Default::default)
            .insert(
                rmcp::model::TASKS_EXTENSION_ID.to_string(),
                Default::default(),
            );
        let version = if self.modern {
            ProtocolVersion::V_2026_07_28
        } else {
            ProtocolVersion::LATEST_WITH_INITIALIZE
        };
        ClientConfig::new(capabilities, Implementation::new("bench-client", "1.0"))
            .with_protocol_version(version)
    }

    async fn create_elicitation(
        &self,
        _request: ElicitRequestParams,
        _context: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, ErrorData> {
        Ok(ElicitResult::new(ElicitationAction::Accept).with_content(json!({})))
    }
}

struct Server {
    service: RunningService<RoleClient, AutoAnswer>,
    _child: tokio::process::Child,
}

async fn start(ws: &Path, flags: &[&str], modern: bool) -> Server {
    use std::process::Stdio;
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_ipybox"))
        .arg("--workspace")
        .arg(ws)
        .args(["--log-level", "warn"])
        .args(flags)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let transport = (child.stdout.take().unwrap(), child.stdin.take().unwrap());
    let client = AutoAnswer { modern };
    let service = if modern {
        let lifecycle = ClientLifecycleMode::Discover {
            preferred_versions: vec![ProtocolVersion::V_2026_07_28],
        };
        client.serve_with_lifecycle(transport, lifecycle).await
    } else {
        client.serve(transport).await
    }
    .expect("ipybox starts");
    Server {
        service,
        _child: child,
    }
}

async fn call(s: &Server, tool: &str, arguments: Value) -> String {
    let params = CallToolRequestParams::new(tool.to_string())
        .with_arguments(arguments.as_object().unwrap().clone());
    // RunningService::call_tool drives input_required rounds (2026-07-28).
    let result = s.service.call_tool(params).await.unwrap();
    let out = ipybox::tools::tool_output(&result);
    assert!(!out.is_error, "{}", out.text);
    out.text
}

/// Per-call seconds of `n` calls of `body`, timed inside the kernel, median of `rounds`.
fn timed_loop(body: &str, n: usize) -> String {
    format!(
        "import time as _t\n_s = _t.perf_counter()\nfor _i in range({n}):\n    {body}\nprint((_t.perf_counter() - _s) / {n})"
    )
}

fn per_call(samples: Vec<f64>) -> Duration {
    common::median(samples.into_iter().map(Duration::from_secs_f64).collect())
}

async fn tool_call_with(approve: &str, fixture: &Value) -> Duration {
    let ws = tempfile::tempdir().unwrap();
    let s = start(ws.path(), &["--approve", approve], false).await;
    call(
        &s,
        "register_mcp_server",
        json!({"server_name": "fx", "server_params": fixture}),
    )
    .await;
    let code = "from mcptools.fx import add\nadd.run(add.Params(a=1, b=2))";
    call(&s, "execute_ipython_cell", json!({"code": code})).await; // warm: session open
    let looped = timed_loop("add.run(add.Params(a=1, b=2))", 50);
    let mut samples = Vec::new();
    for _ in 0..5 {
        let out = call(&s, "execute_ipython_cell", json!({"code": looped})).await;
        samples.push(out.trim().parse::<f64>().unwrap());
    }
    let _ = s.service.cancel().await;
    per_call(samples)
}

/// Median time of a whole `tools/call` of a cell with one tool call (warm), with `approve`, in
/// the handshake era or 2026-07-28.
async fn cell_with_one_call(approve: &str, modern: bool, fixture: &Value) -> Duration {
    let ws = tempfile::tempdir().unwrap();
    let s = start(
        ws.path(),
        &["--approve", approve, "--task-after", "off"],
        modern,
    )
    .await;
    call(
        &s,
        "register_mcp_server",
        json!({"server_name": "fx", "server_params": fixture}),
    )
    .await;
    let code = "from mcptools.fx import add\nadd.run(add.Params(a=1, b=2)).sum";
    let mut samples = Vec::new();
    for i in 0..33 {
        let start = std::time::Instant::now();
        assert_eq!(
            call(&s, "execute_ipython_cell", json!({"code": code})).await,
            "3"
        );
        if i >= 3 {
            samples.push(start.elapsed()); // the first ones open the session
        }
    }
    let _ = s.service.cancel().await;
    common::median(samples)
}

/// (tools/call → task, tools/call → first tasks/get answer, `print(1)` as a task until its
/// result, the same as a plain call): medians over 30.
async fn tasks() -> (Duration, Duration, Duration, Duration) {
    let ws = tempfile::tempdir().unwrap();
    let s = start(ws.path(), &["--task-after", "0"], true).await;
    let params = || {
        CallToolRequestParams::new("execute_ipython_cell")
            .with_arguments(json!({"code": "print(1)"}).as_object().unwrap().clone())
    };
    let (mut created, mut first_poll, mut whole) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..33 {
        let start = std::time::Instant::now();
        let task = match s.service.call_tool_once(params()).await.unwrap() {
            CallToolResponse::Task(t) => t.task,
            other => panic!("expected a task: {other:?}"),
        };
        let t_created = start.elapsed();
        let mut polls = 0;
        loop {
            let got = s
                .service
                .peer()
                .get_task(GetTaskParams::new(task.task_id.clone()))
                .await
                .unwrap();
            polls += 1;
            if polls == 1 && i >= 3 {
                first_poll.push(start.elapsed());
            }
            if got.task.status().is_terminal() {
                break;
            }
        }
        if i >= 3 {
            created.push(t_created);
            whole.push(start.elapsed());
        }
    }
    let _ = s.service.cancel().await;
    // The same cell as a plain call (a client without the extension gets plain results).
    let ws = tempfile::tempdir().unwrap();
    let plain = start(ws.path(), &["--task-after", "off"], true).await;
    let mut plain_samples = Vec::new();
    for i in 0..33 {
        let start = std::time::Instant::now();
        assert_eq!(
            call(&plain, "execute_ipython_cell", json!({"code": "print(1)"})).await,
            "1"
        );
        if i >= 3 {
            plain_samples.push(start.elapsed());
        }
    }
    let _ = plain.service.cancel().await;
    (
        common::median(created),
        common::median(first_poll),
        common::median(whole),
        common::median(plain_samples),
    )
}

async fn shell_with(approve: bool, stream: bool) -> Duration {
    let ws = tempfile::tempdir().unwrap();
    let ex = CodeExecutor::builder()
        .workspace(ws.path())
        .without_spare_kernel()
        .approve_shell_cmds(approve)
        .build();
    ex.start().await.unwrap();
    let looped = timed_loop("!true", 20);
    let mut samples = Vec::new();
    for _ in 0..5 {
        let text = if stream {
            let mut execution = ex.stream(&looped, None);
            let mut text = None;
            while let Some(ev) = execution.next().await {
                match ev {
                    ExecutionEvent::Approval(r) => r.accept(),
                    ExecutionEvent::Result(r) => text = Some(r.unwrap().text),
                    _ => {}
                }
            }
            text.unwrap()
        } else {
            ex.execute(&looped, None).await.unwrap().text
        };
        samples.push(text.trim().parse::<f64>().unwrap());
    }
    ex.stop().await;
    per_call(samples)
}

fn main() {
    let python = root().join("target/test-env/venv/bin/python");
    assert!(python.exists(), "run scripts/test-env.sh first");
    let fixture =
        json!({"command": python, "args": [root().join("tests/fixtures/mcp_fixture.py"), "stdio"]});
    common::run(|| async move {
        let auto = tool_call_with("auto", &fixture).await;
        let ask = tool_call_with("ask", &fixture).await;
        let cell_auto = cell_with_one_call("auto", false, &fixture).await;
        let cell_handshake = cell_with_one_call("ask", false, &fixture).await;
        let cell_auto_modern = cell_with_one_call("auto", true, &fixture).await;
        let cell_modern = cell_with_one_call("ask", true, &fixture).await;
        let (created, first_poll, as_task, plain) = tasks().await;
        let shell_plain = shell_with(false, false).await;
        let approved = shell_with(true, false).await;
        let streamed = shell_with(true, true).await;
        println!("\n| measurement | median per call |");
        println!("|---|---|");
        println!("| tool call, --approve auto | {} |", common::ms(auto));
        println!(
            "| tool call, --approve ask (client answers at once) | {} |",
            common::ms(ask)
        );
        println!(
            "| elicitation round trip (ask − auto) | {} (target ≤ 5 ms) |",
            common::ms(ask.saturating_sub(auto))
        );
        println!(
            "| cell with one tool call, --approve auto (handshake / 2026-07-28) | {} / {} |",
            common::ms(cell_auto),
            common::ms(cell_auto_modern)
        );
        println!(
            "| the same cell, --approve ask, handshake era (elicitation/create) | {} (+{}) |",
            common::ms(cell_handshake),
            common::ms(cell_handshake.saturating_sub(cell_auto))
        );
        println!(
            "| the same cell, --approve ask, 2026-07-28 (two rounds) | {} (+{}; target ≤ 5 ms) |",
            common::ms(cell_modern),
            common::ms(cell_modern.saturating_sub(cell_auto_modern))
        );
        println!(
            "| task: tools/call → task created | {} |",
            common::ms(created)
        );
        println!(
            "| task: tools/call → first tasks/get answer | {} |",
            common::ms(first_poll)
        );
        println!(
            "| `print(1)` as a task (polled until completed) / as a plain call | {} / {} |",
            common::ms(as_task),
            common::ms(plain)
        );
        let plain = shell_plain;
        println!("| `!true`, no shell approval | {} |", common::ms(plain));
        println!(
            "| `!true`, approve_shell_cmds, execute() | {} |",
            common::ms(approved)
        );
        println!(
            "| `!true`, approve_shell_cmds, stream() accepting | {} |",
            common::ms(streamed)
        );
        println!(
            "| shell approval overhead (stream − plain) | {} |",
            common::ms(streamed.saturating_sub(plain))
        );
    });
}
