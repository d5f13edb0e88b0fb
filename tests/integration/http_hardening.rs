//! Issue 27's service hardening, attacked as an attacker would: what ipybox's log may carry
//! (no code, output or handle at any level; text from kernels escaped, one record per line),
//! bounded retention of output and finished tasks (ipybox's RSS read from /proc), images capped
//! per cell and removed with their session, and connection floods from unauthenticated peers
//! (thousands of real sockets) while real clients keep working.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::http_support::*;
use crate::mcp_eras::Era;
use crate::support::*;

/// Registers the Python fixture server as `fx` for workspace `ws`, as an operator does.
fn register_fixture(ws: &Path) {
    let out = std::process::Command::new(BIN)
        .args(["apigen", "fx", "--params"])
        .arg(fixture_stdio_params("stdio").to_string())
        .arg("--root")
        .arg(ws.join("mcptools"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Waits until `log()` contains `needle` (records are written as they happen).
async fn wait_logged(service: &Service, needle: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let log = service.log();
        if log.contains(needle) {
            return log;
        }
        assert!(Instant::now() < deadline, "`{needle}` never logged:\n{log}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

const CODE: &str = "x = 'OUT' + 'PUT-7f3a'  # CODE-MARKER-19c2\nprint(x)";

/// Runs a cell with code and output markers in a new 2026-07-28 session and in a handshake-era
/// session; returns the 2026-07-28 session's handle.
async fn marked_cells(url: &str) -> String {
    let c = connect(url, Some(TOKEN_A), Era::Stateless).await;
    let (out, handle) = new_session(&c, CODE).await;
    assert_eq!(out, "OUTPUT-7f3a");
    assert_eq!(
        cell(&c, CODE, Some(&handle)).await,
        (false, "OUTPUT-7f3a".into())
    );
    let h = connect(url, Some(TOKEN_A), Era::Handshake).await;
    assert_eq!(cell(&h, CODE, None).await, (false, "OUTPUT-7f3a".into()));
    h.close().await;
    handle
}

/// Items 7 and 11: at `trace` (IPYBOX_LOG=trace and --log-level trace) the log carries no
/// cell's code, output, session handle or token; a tool name chosen by kernel code and a dying
/// kernel's stderr are written escaped, so they forge no record; every record is one line.
/// With --log-content the same run does log the code (what the guard keeps out).
#[tokio::test(flavor = "multi_thread")]
async fn logs_carry_no_code_output_or_handle_and_kernel_text_forges_no_record() {
    require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    register_fixture(ws.path());
    let service = Service::start(
        ws.path(),
        &[("IPYBOX_LOG", "trace")],
        &["--log-level", "trace", "--token", TOKEN_A],
    );
    let handle = marked_cells(&service.url()).await;
    let c = connect(&service.url(), Some(TOKEN_A), Era::Stateless).await;
    // A tool name with a newline and a terminal escape, from kernel code.
    let forged_tool = "from mcptools.fx import runner\ntry:\n    runner.run('add\\nERROR forged-record\\x1b[2J', {'a': 1})\nexcept Exception as e:\n    print(type(e).__name__)";
    assert_eq!(
        cell(&c, forged_tool, Some(&handle)).await,
        (false, "ToolError".into())
    );
    // A kernel that writes a forged record to its real stderr (ipykernel captures fd 2 for
    // the cell's output: the original is its copy), then dies.
    let (is_error, text) = cell(
        &c,
        "import os, sys, time\nfd = getattr(sys.stderr, '_original_stdstream_copy', None) or 2\nos.write(fd, b'\\nERROR forged-by-stderr\\x1b[31m\\n')\ntime.sleep(0.5)\nos._exit(3)",
        Some(&handle),
    )
    .await;
    assert!(is_error, "{text}");
    let log = wait_logged(&service, "the kernel died").await;
    drop(service);

    assert!(log.lines().count() > 10, "a trace log has records:\n{log}");
    assert!(log.contains("session{id="), "{log}");
    for secret in ["CODE-MARKER-19c2", "OUTPUT-7f3a", &handle, TOKEN_A] {
        assert!(!log.contains(secret), "the log carries `{secret}`:\n{log}");
    }
    let payload = handle.rsplit('.').next().unwrap();
    assert!(
        !log.contains(payload),
        "the log carries the handle's payload"
    );
    // Kernel text is escaped: one record per line, no terminal escape, nothing forged.
    assert!(!log.contains('\u{1b}'), "{log}");
    for line in log.lines() {
        assert!(
            line.starts_with(|c: char| c.is_ascii_digit()),
            "not a record of its own (forged?): {line:?}"
        );
    }
    assert!(
        log.contains(r#"tool="add\nERROR forged-record\u{1b}[2J""#),
        "{log}"
    );
    assert!(
        log.contains(r#"stderr="\nERROR forged-by-stderr\u{1b}[31m""#),
        "{log}"
    );
    assert!(log.contains(r#"status="exit code 3""#), "{log}");

    // The guard is what keeps them out: asked for, the content is there.
    let service = Service::start(
        ws.path(),
        &[("IPYBOX_LOG", "trace")],
        &["--log-content", "--token", TOKEN_A],
    );
    marked_cells(&service.url()).await;
    let log = wait_logged(&service, "CODE-MARKER-19c2").await;
    assert!(log.contains("OUTPUT-7f3a"));
}
