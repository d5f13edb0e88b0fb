//! The seed's exact outputs over stdio (issue 38): with default flags a result is the cell's
//! output and nothing else, as the Python ipybox returns it (its own MCP-server tests compare the
//! first results for equality: `print('hello world')` → `hello world`, `2 + 2` → `4`), and the
//! tools take no `session` argument. The codeact plugins pass `--checkpoint-after 3`: then the
//! first result names the session's handle (the control, same cells).

use std::path::Path;
use std::process::Stdio;

use rmcp::RoleClient;
use rmcp::model::{CallToolRequestParams, CallToolResult, ClientConfig};
use rmcp::service::RunningService;
use serde_json::{Map, Value, json};

use crate::mcp_eras::{CallTool, Era, both_eras, serve_in};
use crate::stdio_resume::handle_note;
use crate::support::{BIN, call, kernel_python};
use ipybox::tools::tool_output;

/// An ipybox stdio server started with exactly `flags` (nothing added) and a client of `era`.
pub(crate) struct Exact {
    service: RunningService<RoleClient, ClientConfig>,
    _child: tokio::process::Child,
}

impl CallTool for Exact {
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

/// `ipybox --workspace WS FLAGS...` with `IPYBOX_HOME=home` and the shared kernel environment.
pub(crate) async fn exact(ws: &Path, home: &Path, flags: &[&str], era: Era) -> Exact {
    let mut child = tokio::process::Command::new(BIN)
        .arg("--workspace")
        .arg(ws)
        .args(flags)
        .env("IPYBOX_HOME", home)
        .env("IPYBOX_PYTHON", kernel_python())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("ipybox starts");
    let transport = (child.stdout.take().unwrap(), child.stdin.take().unwrap());
    let config = ClientConfig::default().with_protocol_version(era.version());
    let service = serve_in(era, config, transport)
        .await
        .expect("ipybox MCP server starts");
    Exact {
        service,
        _child: child,
    }
}

async fn text(s: &Exact, code: &str) -> String {
    let out = tool_output(&call(s, "execute_ipython_cell", json!({"code": code})).await);
    assert!(!out.is_error, "{code}: {}", out.text);
    out.text
}

/// Whether `execute_ipython_cell` offers a `session` argument.
async fn has_session_argument(s: &Exact) -> bool {
    let tools = s.service.list_all_tools().await.expect("tools/list");
    let tool = tools
        .iter()
        .find(|t| t.name == "execute_ipython_cell")
        .expect("execute_ipython_cell listed");
    tool.input_schema
        .get("properties")
        .and_then(|p| p.get("session"))
        .is_some()
}

async fn first_results_are_exactly_the_output_by_default(era: Era) {
    let ws = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();

    // Defaults: the seed's results, as its tests compare them.
    let s = exact(ws.path(), home.path(), &[], era).await;
    assert!(
        !has_session_argument(&s).await,
        "no session argument by default"
    );
    assert_eq!(text(&s, "print('hello world')").await, "hello world");
    assert_eq!(text(&s, "2 + 2").await, "4");
    drop(s);

    // Control: what the codeact plugins pass; the first result names the handle.
    let s = exact(ws.path(), home.path(), &["--checkpoint-after", "3"], era).await;
    assert!(
        has_session_argument(&s).await,
        "session argument with checkpoints"
    );
    let first = text(&s, "print('hello world')").await;
    let (note, _) = handle_note(&first);
    assert_eq!(first, format!("hello world\n\n{note}"));
    assert_eq!(text(&s, "2 + 2").await, "4");
}
both_eras!(first_results_are_exactly_the_output_by_default);
