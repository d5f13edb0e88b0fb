//! Shell-command approval through the Rust library: `approve_shell_cmds` turns `!cmd` and
//! `%%bash` into approval requests that [`ApprovalRequest::is_shell_command`] tells apart;
//! `require_shell_escape` blocks direct process creation. (The matrix of line commands, magics
//! and blocked calls runs in the Python SDK suite, tests/python_sdk/test_shell_approval.py.)

use std::path::Path;

use crate::support::*;
use ipybox::CodeExecutor;
use ipybox::executor::ExecutionEvent;
use ipybox::tools::{SHELL_MAGIC_TOOL, SHELL_SERVER_NAME, SHELL_TOOL};

async fn shell_executor(ws: &Path, require_escape: bool) -> CodeExecutor {
    let ex = CodeExecutor::builder()
        .workspace(ws)
        .without_spare_kernel()
        .approve_shell_cmds(true)
        .require_shell_escape(require_escape)
        .build();
    ex.start().await.expect("executor starts");
    ex
}

/// Streams `code`, accepting shell commands whose command contains `accept_if`; returns what
/// was asked (tool name, command, magic) and the output or error text.
async fn asked(
    ex: &CodeExecutor,
    code: &str,
    accept_if: &str,
) -> (
    Vec<(String, String, Option<String>)>,
    Result<String, String>,
) {
    let mut execution = ex.stream(code, None);
    let mut requests = Vec::new();
    while let Some(event) = execution.next().await {
        match event {
            ExecutionEvent::Approval(request) => {
                assert!(request.is_shell_command());
                assert_eq!(request.server_name, SHELL_SERVER_NAME);
                let cmd = request.shell_command().unwrap().to_string();
                let magic = request
                    .arguments
                    .get("magic")
                    .and_then(|m| m.as_str())
                    .map(str::to_string);
                requests.push((request.tool_name.clone(), cmd.clone(), magic));
                if cmd.contains(accept_if) {
                    request.accept();
                } else {
                    request.reject();
                }
            }
            ExecutionEvent::Result(r) => {
                return (requests, r.map(|o| o.text).map_err(|e| e.to_string()));
            }
            _ => {}
        }
    }
    unreachable!("the stream ends with a result")
}

#[tokio::test(flavor = "multi_thread")]
async fn shell_commands_are_approval_requests() {
    let ws = tempfile::tempdir().unwrap();
    let ex = shell_executor(ws.path(), false).await;
    let (requests, out) = asked(&ex, "x = 'there'\n!echo hi {x}", "echo").await;
    assert_eq!(
        requests,
        [(SHELL_TOOL.to_string(), "echo hi there".to_string(), None)]
    );
    assert_eq!(out.unwrap(), "hi there");
    let (requests, out) = asked(&ex, "%%bash\necho $((2 + 3))", "echo").await;
    assert_eq!(
        requests,
        [(
            SHELL_MAGIC_TOOL.to_string(),
            "echo $((2 + 3))\n".to_string(),
            Some("%%bash".to_string())
        )]
    );
    assert_eq!(out.unwrap(), "5");
    // Rejected: the cell fails, the command did not run.
    let (_, out) = asked(&ex, "!touch nope.txt", "echo").await;
    let err = out.unwrap_err();
    assert!(
        err.contains(
            "ApprovalRejected: Approval request for ipybox.shell rejected: shell command `touch nope.txt` was rejected by the application"
        ),
        "{err}"
    );
    assert!(!ws.path().join("nope.txt").exists());
    // execute() accepts them, as it does tool calls.
    assert_eq!(run(&ex, "!echo accepted").await, "accepted");
    ex.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn require_shell_escape_blocks_subprocess_but_not_bang() {
    let ws = tempfile::tempdir().unwrap();
    let ex = shell_executor(ws.path(), true).await;
    let (requests, out) = asked(&ex, "import subprocess\nsubprocess.run(['true'])", "").await;
    assert!(requests.is_empty());
    let err = out.unwrap_err();
    assert!(
        err.contains("ShellEscapeRequired: Direct subprocess calls are not allowed. Use ! syntax. (direct process creation (subprocess) is blocked in this kernel (require_shell_escape): run shell commands as `!cmd`"),
        "{err}"
    );
    let (requests, out) = asked(&ex, "!echo fine", "echo").await;
    assert_eq!(requests.len(), 1);
    assert_eq!(out.unwrap(), "fine");
    ex.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn without_approve_shell_cmds_nothing_is_asked() {
    let ws = tempfile::tempdir().unwrap();
    let ex = executor(ws.path()).await;
    let (requests, out) = asked(&ex, "!echo unasked", "").await;
    assert!(requests.is_empty());
    assert_eq!(out.unwrap(), "unasked");
    ex.stop().await;
}
