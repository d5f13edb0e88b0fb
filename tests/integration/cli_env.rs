//! One workspace environment (issue 53, item 1): every command that runs code or starts MCP
//! servers (`exec`, `replay`, `apigen`, `serve`) reads the workspace's `.env` the same way:
//! `KERNEL_ENV_X` reaches the kernel as `X`, `${VAR}` in server params is taken from it, and a
//! malformed file is the same refusal everywhere, before anything runs.

use std::path::Path;
use std::process::{Command, Output, Stdio};

use crate::support::*;

fn ipybox() -> Command {
    let mut cmd = Command::new(BIN);
    cmd.stdin(Stdio::null())
        .env_remove("IPYBOX_KERNEL_GATEWAY")
        .env_remove("OK")
        .env_remove("KERNEL_ENV_OK")
        .env_remove("FX_PY");
    cmd
}

fn text(out: &Output) -> (Option<i32>, String, String) {
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

const PRINT_OK: &str = "import os; print(os.environ.get('OK'))";

fn exec(ws: &Path) -> (Option<i32>, String, String) {
    text(
        &ipybox()
            .args(["exec", "--workspace"])
            .arg(ws)
            .args(["-c", PRINT_OK])
            .output()
            .unwrap(),
    )
}

fn replay(ws: &Path) -> (Option<i32>, String, String) {
    let nb = ws.join("env.ipynb");
    let notebook = serde_json::json!({
        "cells": [{"cell_type": "code", "execution_count": 1, "id": "a", "metadata": {},
                   "outputs": [], "source": PRINT_OK}],
        "metadata": {"ipybox": {"confinement": {"sandbox": false, "kernel": "local"}}},
        "nbformat": 4, "nbformat_minor": 5
    });
    std::fs::write(&nb, notebook.to_string()).unwrap();
    text(
        &ipybox()
            .arg("replay")
            .arg(&nb)
            .arg("--workspace")
            .arg(ws)
            .args(["--unsandboxed", "--yes"])
            .output()
            .unwrap(),
    )
}

fn apigen(ws: &Path) -> (Option<i32>, String, String) {
    let params = serde_json::json!({"command": "${FX_PY}", "args": [fixture_script(), "stdio"]});
    text(
        &ipybox()
            .args(["apigen", "fx", "--workspace"])
            .arg(ws)
            .arg("--params")
            .arg(params.to_string())
            .output()
            .unwrap(),
    )
}

/// `KERNEL_ENV_OK=yes` in `.env` is `OK` in the kernel of `exec` and of `replay` (the
/// control: without the file, `None`).
#[test]
fn exec_and_replay_kernels_get_the_workspace_env() {
    let probe = Probe::new("env-kernel");
    let ws = probe.path();
    let (status, stdout, stderr) = exec(ws);
    assert_eq!((status, stdout.as_str()), (Some(0), "None\n"), "{stderr}");
    let (status, stdout, stderr) = replay(ws);
    assert!(
        status == Some(0) && stdout.contains("None\n"),
        "{stdout}\n{stderr}"
    );

    std::fs::write(ws.join(".env"), "KERNEL_ENV_OK=yes\n").unwrap();
    let (status, stdout, stderr) = exec(ws);
    assert_eq!((status, stdout.as_str()), (Some(0), "yes\n"), "{stderr}");
    let (status, stdout, stderr) = replay(ws);
    assert!(
        status == Some(0) && stdout.contains("yes\n"),
        "{stdout}\n{stderr}"
    );
}

/// `${FX_PY}` in `apigen --params` is taken from the workspace's `.env`; without it, the
/// refusal's advice is one that works for apigen (set it in the workspace's `.env`).
#[test]
fn apigen_takes_variables_from_the_workspace_env() {
    let probe = Probe::new("env-apigen");
    let ws = probe.path();
    let (status, _, stderr) = apigen(ws);
    assert_eq!(status, Some(1), "{stderr}");
    assert!(
        stderr.contains("environment variable `FX_PY` is not set (referenced as `${FX_PY}` at `command` in the server params)\n  help: set `FX_PY` in the environment or in the workspace's `.env`, or remove the reference"),
        "{stderr}"
    );
    assert!(!ws.join("mcptools/fx").exists());

    std::fs::write(ws.join(".env"), format!("FX_PY={}\n", python())).unwrap();
    let (status, stdout, stderr) = apigen(ws);
    assert_eq!(status, Some(0), "{stderr}");
    assert!(
        ws.join("mcptools/fx/__init__.py").is_file(),
        "{stdout}\n{stderr}"
    );
}

/// A malformed `.env` is the same refusal, exit 1, from every command, and nothing runs (the
/// cell would write a marker; apigen's server would be generated).
#[test]
fn a_malformed_env_is_refused_by_every_command() {
    let probe = Probe::new("env-bad");
    let ws = probe.path();
    std::fs::write(ws.join(".env"), "A=1\nnot a line\n").unwrap();
    let refusal = format!(
        "error: cannot read {}/.env: line 2: expected NAME=value\n  help: fix the line (format: NAME=value, # comments) or remove the file\n",
        ws.display()
    );
    for (name, (status, stdout, stderr)) in [
        ("exec", exec(ws)),
        ("replay", replay(ws)),
        ("apigen", apigen(ws)),
        (
            "serve",
            text(
                &ipybox()
                    .args(["serve", "--workspace"])
                    .arg(ws)
                    .output()
                    .unwrap(),
            ),
        ),
    ] {
        assert_eq!(status, Some(1), "{name}: {stdout}\n{stderr}");
        assert!(stderr.ends_with(&refusal), "{name}: {stderr}");
        assert_eq!(stdout, "", "{name}");
    }
    assert!(!ws.join("mcptools/fx").exists());
}
