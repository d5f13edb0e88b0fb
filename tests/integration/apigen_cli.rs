//! Registering an MCP server as an operator does, with `ipybox apigen` (a child process of
//! the test): one function for the integration tests (`register_fixture` in `support.rs`, and
//! the tests that register other params or another `IPYBOX_HOME`) and the benchmarks that
//! include this file with `#[path]`. Uses nothing of the test crate; not for registrations
//! through the SDK (`support::register`).

use std::path::Path;

use serde_json::Value;

/// Registers `params` as server `fx` for workspace `ws` (`ws/mcptools/fx/`) with `ipybox
/// apigen`; `home`: the `IPYBOX_HOME` that keeps the registration, else the environment's.
/// Panics with apigen's stderr if it fails.
pub(crate) fn apigen_fx(ws: &Path, params: &Value, home: Option<&Path>) {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_ipybox"));
    command
        .args(["apigen", "fx", "--params"])
        .arg(params.to_string())
        .arg("--root")
        .arg(ws.join("mcptools"));
    if let Some(home) = home {
        command.env("IPYBOX_HOME", home);
    }
    let out = command.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
