//! Approval benchmark (`cargo bench --bench approvals`); prints a table.
//!
//! - Elicitation (`--approve ask`): a warm tool call from kernel code through the `ipybox` MCP
//!   server whose client answers every `elicitation/create` at once (accept, not for the
//!   session), against the same call with `--approve auto`. The difference is the approval
//!   round trip through the client.
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
    CallToolRequestParams, ClientCapabilities, ClientConfig, ElicitRequestParams, ElicitResult,
    ElicitationAction, Implementation, ProtocolVersion,
};
use rmcp::service::{RequestContext, RunningService};
use rmcp::{ClientHandler, ErrorData, RoleClient, ServiceExt};
use serde_json::{Value, json};

#[path = "common/mod.rs"]
mod common;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Declares elicitation and accepts every question at once.
#[derive(Clone)]
struct AutoAnswer;

impl ClientHandler for AutoAnswer {
    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(
            ClientCapabilities::builder().enable_elicitation().build(),
            Implementation::new("bench-client", "1.0"),
        )
        .with_protocol_version(ProtocolVersion::LATEST_WITH_INITIALIZE)
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

async fn start(ws: &Path, approve: &str) -> Server {
    use std::process::Stdio;
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_ipybox"))
        .arg("--workspace")
        .arg(ws)
        .args(["--log-level", "warn", "--approve", approve])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let transport = (child.stdout.take().unwrap(), child.stdin.take().unwrap());
    let service = AutoAnswer.serve(transport).await.expect("ipybox starts");
    Server {
        service,
        _child: child,
    }
}

async fn call(s: &Server, tool: &str, arguments: Value) -> String {
    let params = CallToolRequestParams::new(tool.to_string())
        .with_arguments(arguments.as_object().unwrap().clone());
    let result = s.service.peer().call_tool(params).await.unwrap();
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
    let s = start(ws.path(), approve).await;
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
        let plain = shell_with(false, false).await;
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
