//! Shell-command approval through the Rust library: `approve_shell_cmds` turns `!cmd` and
//! `%%bash` into approval requests that [`ApprovalRequest::is_shell_command`] tells apart;
//! `require_shell_escape` blocks direct process creation. (The matrix of line commands, magics
//! and blocked calls runs in the Python SDK suite, tests/python_sdk/test_shell_approval.py.)

use std::path::Path;

use crate::support::*;
use ipybox::CodeExecutor;
use ipybox::executor::ExecutionEvent;
use ipybox::tools::shown::HUMAN_TEXT_LIMIT;
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
                assert_eq!(request.shell_magic(), magic.as_deref());
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
            "ApprovalRejectedError: Approval request for ipybox.shell rejected: shell command `touch nope.txt` was rejected by the application"
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

fn magic(cmd: &str, line: &str) -> (String, String, Option<String>) {
    (
        SHELL_MAGIC_TOOL.to_string(),
        cmd.to_string(),
        Some(line.to_string()),
    )
}

fn line(cmd: &str) -> (String, String, Option<String>) {
    (SHELL_TOOL.to_string(), cmd.to_string(), None)
}

/// `%%script {prog}`: IPython expands the magic line once; the request carries the expanded
/// line (`arguments["magic"]`, `shell_magic()`), and that line is what runs.
#[tokio::test(flavor = "multi_thread")]
async fn a_script_magic_line_is_asked_about_expanded_and_runs_as_asked() {
    let ws = tempfile::tempdir().unwrap();
    let ex = shell_executor(ws.path(), false).await;
    assert_eq!(
        run(&ex, "prog = '/bin/sh'\nflag = '--no-raise-error'").await,
        ""
    );
    let (requests, out) = asked(&ex, "%%script {prog} {flag}\necho ran by $0", "ran by").await;
    assert_eq!(
        requests,
        [magic(
            "echo ran by $0\n",
            "%%script /bin/sh --no-raise-error"
        )]
    );
    assert_eq!(out.unwrap(), "ran by /bin/sh");
    // The same cell under another program is another request (and rejected here).
    assert_eq!(run(&ex, "prog = 'bash'").await, "");
    let (requests, out) = asked(&ex, "%%script {prog}\ntouch other.txt", "ran by").await;
    assert_eq!(requests, [magic("touch other.txt\n", "%%script bash")]);
    assert!(out.unwrap_err().contains("ApprovalRejected"));
    assert!(!ws.path().join("other.txt").exists());
    ex.stop().await;
}

/// Every other way IPython runs a shell command asks too: `system_raw`, `%alias_magic` aliases
/// (asked about the magic that really runs), `find_cell_magic` / `find_line_magic`, the magics
/// dict, and `ScriptMagics.shebang` reached directly.
#[tokio::test(flavor = "multi_thread")]
async fn system_raw_magic_aliases_and_direct_lookups_are_asked() {
    let ws = tempfile::tempdir().unwrap();
    let ex = shell_executor(ws.path(), false).await;
    assert!(run(&ex, "%alias_magic mysh sh").await.contains("%%mysh"));
    let cases = [
        (
            "get_ipython().system_raw('touch raw.txt')",
            line("touch raw.txt"),
            "raw.txt",
        ),
        (
            "%%mysh\ntouch alias.txt",
            magic("touch alias.txt\n", "%%sh"),
            "alias.txt",
        ),
        (
            "get_ipython().find_cell_magic('bash')('', 'touch find.txt')",
            magic("touch find.txt", "%%bash"),
            "find.txt",
        ),
        (
            "get_ipython().magics_manager.magics['cell']['bash']('', 'touch dict.txt')",
            magic("touch dict.txt", "%%bash"),
            "dict.txt",
        ),
        (
            "get_ipython().find_line_magic('sx')('touch line.txt')",
            line("touch line.txt"),
            "line.txt",
        ),
        (
            "get_ipython().magics_manager.registry['ScriptMagics'].shebang('bash', 'touch shebang.txt')",
            magic("touch shebang.txt", "%%script bash"),
            "shebang.txt",
        ),
    ];
    for (code, request, file) in cases {
        let (requests, out) = asked(&ex, code, "never").await;
        assert_eq!(requests, [request], "{code}");
        let err = out.unwrap_err();
        assert!(err.contains("ApprovalRejected"), "{code}: {err}");
        assert!(!ws.path().join(file).exists(), "{code} ran");
    }
    // Accepted, an alias runs as asked (and is asked once).
    let (requests, out) = asked(&ex, "%%mysh\necho via alias", "via alias").await;
    assert_eq!(requests, [magic("echo via alias\n", "%%sh")]);
    assert_eq!(out.unwrap(), "via alias");
    ex.stop().await;
}

/// A command padded with zero-width characters is shown whole, each one visible (and refused
/// unasked when that is too long to show).
#[tokio::test(flavor = "multi_thread")]
async fn a_padded_shell_command_is_shown_whole_or_refused() {
    let ws = tempfile::tempdir().unwrap();
    let ex = CodeExecutor::builder()
        .workspace(ws.path())
        .without_spare_kernel()
        .approve_shell_cmds(true)
        .approval_text_limit(HUMAN_TEXT_LIMIT)
        .build();
    ex.start().await.expect("executor starts");
    let describe = |n: usize| {
        let code = format!("!echo hi{}; touch padded.txt", "\u{200b}".repeat(n));
        let ex = ex.clone();
        async move {
            let mut execution = ex.stream(&code, None);
            let mut shown = Vec::new();
            loop {
                match execution.next().await.expect("a result") {
                    ExecutionEvent::Approval(request) => {
                        shown.push(request.describe());
                        request.reject();
                    }
                    ExecutionEvent::Result(r) => break (shown, r.map_err(|e| e.to_string())),
                    _ => {}
                }
            }
        }
    };
    let (shown, out) = describe(1500).await;
    assert_eq!(
        shown,
        [format!(
            "shell command `echo hi{}; touch padded.txt`",
            "\\u{200b}".repeat(1500)
        )]
    );
    assert!(out.unwrap_err().contains("ApprovalRejected"));
    let (shown, out) = describe(3000).await;
    assert!(shown.is_empty());
    let err = out.unwrap_err();
    assert!(
        err.contains("not shown to anyone: it is 24041 characters long when shown, over the limit of 16384 for an approval prompt"),
        "{err}"
    );
    assert!(!ws.path().join("padded.txt").exists());
    assert_eq!(run(&ex, "!echo usable").await, "usable");
    ex.stop().await;
}
