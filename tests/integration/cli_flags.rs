//! A flag is never dropped (issue 50, part 3): every flag `ipybox --help` lists (the MCP
//! server's) given before a subcommand is that subcommand's, or an error naming where it goes;
//! `--sandbox` is honoured by every command that runs code (`serve`, `exec`, `replay`) and
//! refused, with the commands that have it, by the others (`apigen`, `setup`).
//!
//! The table of which subcommand has which top-level flag is written here and checked against
//! each command's `--help`: a new flag or subcommand fails [`every_flag_before_every_subcommand_is_applied_or_refused`]
//! until it is classified. "Nothing ran" is a marker file each command line would write on the
//! host (its cell, its notebook's cell, its MCP server command, its `--python`), in a probe
//! directory outside `/tmp` and `$HOME`; the control runs each command line alone and sees the
//! marker written.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use crate::support::*;

/// The top-level flags each subcommand has too (the same long name, the same meaning); the
/// others are refused before it. `serve` has them all.
const SHARED: &[(&str, &[&str])] = &[
    ("serve", &["*"]),
    (
        "exec",
        &[
            "workspace",
            "sandbox",
            "sandbox-config",
            "python",
            "approve-shell",
            "require-shell-escape",
            "kernel-gateway",
        ],
    ),
    (
        "replay",
        &[
            "workspace",
            "sandbox",
            "sandbox-config",
            "python",
            "approve-shell",
            "require-shell-escape",
            "kernel-gateway",
        ],
    ),
    ("apigen", &["workspace"]),
    ("setup", &["python"]),
    ("trust", &[]),
];

/// Flags that apply to every command (clap `global`), and help.
const GLOBAL: &[&str] = &["log-level", "log-content", "help", "version"];

fn ipybox() -> Command {
    let mut cmd = Command::new(BIN);
    cmd.stdin(Stdio::null())
        .env_remove("IPYBOX_KERNEL_GATEWAY")
        .env_remove("IPYBOX_PYTHON");
    cmd
}

fn text(out: &Output) -> (Option<i32>, String, String) {
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The long flags of a `--help` text (`      --name` or `  -x, --name`), each with whether it
/// takes a value.
fn flags_of(help: &str) -> Vec<(String, bool)> {
    help.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("      --").or_else(|| {
                l.get(6..)
                    .filter(|_| l.starts_with("  -"))
                    .and_then(|r| r.strip_prefix("--"))
            })?;
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                .collect();
            let value = rest[name.len()..].trim_start().starts_with('<');
            Some((name, value))
        })
        .collect()
}

fn help_of(args: &[&str]) -> String {
    let out = ipybox().args(args).arg("--help").output().unwrap();
    assert!(out.status.success(), "{args:?} --help");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A valid value for a top-level flag.
fn value_of(flag: &str, ws: &Path) -> String {
    match flag {
        "workspace" => ws.display().to_string(),
        "sandbox-config" => "policy.json".into(),
        "python" => "python3".into(),
        "approve" => "ask".into(),
        "checkpoint-after" => "off".into(),
        "kernel-gateway" => "http://127.0.0.1:9".into(),
        "notebook-dir" => "nb".into(),
        "max-output-bytes" | "max-image-bytes" => "4096".into(),
        _ => "1".into(),
    }
}

/// The command line of each subcommand that would write `marker` on the host if it ran.
fn command_line(sub: &str, ws: &Path, marker: &Path) -> Vec<String> {
    let write = format!("open({:?}, 'w').write('ran')", marker.display().to_string());
    let ws_s = ws.display().to_string();
    match sub {
        // The server runs no code of its own before a client asks; nothing to mark.
        "serve" => vec!["serve".into(), "--workspace".into(), ws_s],
        // `trust` runs no code at all (it lists and records); nothing to mark either.
        "trust" => vec!["trust".into(), "--list".into(), ws_s],
        "exec" => vec![
            "exec".into(),
            "--workspace".into(),
            ws_s,
            "-c".into(),
            write,
        ],
        "replay" => {
            let nb = ws.join("marker.ipynb");
            let notebook = serde_json::json!({
                "cells": [{"cell_type": "code", "execution_count": 1, "id": "a", "metadata": {},
                           "outputs": [], "source": write}],
                "metadata": {"ipybox": {"confinement": {"sandbox": false, "kernel": "local"}}},
                "nbformat": 4, "nbformat_minor": 5
            });
            std::fs::write(&nb, notebook.to_string()).unwrap();
            vec![
                "replay".into(),
                nb.display().to_string(),
                "--workspace".into(),
                ws_s,
                "--unsandboxed".into(),
                "--yes".into(),
            ]
        }
        "apigen" => vec![
            "apigen".into(),
            "marked".into(),
            "--params".into(),
            serde_json::json!({"command": "python3", "args": ["-c", write]}).to_string(),
            "--root".into(),
            ws.join("mcptools").display().to_string(),
        ],
        "setup" => {
            let script = ws.join("python-marker.sh");
            std::fs::write(
                &script,
                format!("#!/bin/sh\necho ran > '{}'\nexit 1\n", marker.display()),
            )
            .unwrap();
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
            vec![
                "setup".into(),
                "--python".into(),
                script.display().to_string(),
            ]
        }
        other => panic!(
            "no command line for `ipybox {other}` here: add it, and its row in SHARED (which top-level flags it has)"
        ),
    }
}

fn owners(flag: &str) -> Vec<&'static str> {
    SHARED
        .iter()
        .filter(|(_, flags)| flags.contains(&"*") || flags.contains(&flag))
        .map(|(sub, _)| *sub)
        .collect()
}

/// The documented refusal of `--FLAG` given before `SUB` (docs/mcp-server.md).
fn refusal(flag: &str, sub: &str) -> String {
    let owners = owners(flag);
    let listed: Vec<String> = owners.iter().map(|c| format!("`ipybox {c}`")).collect();
    format!(
        "error: `--{flag}` is given before `{sub}`, which has no such flag (a flag before a subcommand is the subcommand's)\n  help: `--{flag}` is a flag of {} and of `ipybox` without a subcommand (the MCP server on stdio): put it after the subcommand it is for, e.g. `ipybox {} --{flag} …`\n",
        listed.join(", "),
        owners[0]
    )
}

/// Each top-level flag before each subcommand: applied (given again after the subcommand, clap
/// says the subcommand got it twice: it reached the subcommand) or refused with the documented
/// error, and in both cases nothing ran (the marker its command line would write is absent).
/// The controls: each command line alone writes its marker, and the table agrees with every
/// command's `--help`.
#[test]
fn every_flag_before_every_subcommand_is_applied_or_refused() {
    let probe = Probe::new("flags-before");
    let ws = probe.path().join("ws");
    std::fs::create_dir(&ws).unwrap();
    let marker = probe.path().join("ran-on-the-host");

    let top = help_of(&[]);
    let subs: Vec<String> = top
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .map(str::to_string)
        .collect();
    let table: Vec<&str> = SHARED.iter().map(|(s, _)| *s).collect();
    assert_eq!(
        subs, table,
        "every subcommand has its row in SHARED:\n{top}"
    );
    let flags: Vec<(String, bool)> = flags_of(&top)
        .into_iter()
        .filter(|(f, _)| !GLOBAL.contains(&f.as_str()))
        .collect();
    assert!(flags.len() >= 20, "{flags:?}\n{top}");
    for sub in &subs {
        let sub_flags: Vec<String> = flags_of(&help_of(&[sub]))
            .into_iter()
            .map(|(f, _)| f)
            .collect();
        let has: Vec<&str> = flags
            .iter()
            .map(|(f, _)| f.as_str())
            .filter(|f| sub_flags.iter().any(|s| s == f))
            .collect();
        let expected: Vec<&str> = flags
            .iter()
            .map(|(f, _)| f.as_str())
            .filter(|f| owners(f).contains(&sub.as_str()))
            .collect();
        assert_eq!(has, expected, "`ipybox {sub} --help` and SHARED differ");
    }

    let mut applied = 0;
    let mut refused = 0;
    for sub in &subs {
        let rest = command_line(sub, &ws, &marker);
        for (flag, takes_value) in &flags {
            let mut given = vec![format!("--{flag}")];
            if *takes_value {
                given.push(value_of(flag, &ws));
            }
            let mut args = given.clone();
            args.push(rest[0].clone());
            let shared = owners(flag).contains(&sub.as_str());
            if shared {
                args.extend(given.iter().cloned());
            }
            args.extend(rest[1..].iter().cloned());
            let (status, stdout, stderr) = text(&ipybox().args(&args).output().unwrap());
            assert_eq!(status, Some(2), "{args:?}: {stdout}\n{stderr}");
            assert_eq!(stdout, "", "{args:?}: {stderr}");
            if shared {
                assert!(
                    stderr.starts_with(&format!("error: the argument '--{flag}"))
                        && stderr.contains("cannot be used multiple times"),
                    "{args:?}: the flag given before `{sub}` did not reach it: {stderr}"
                );
                applied += 1;
            } else {
                assert_eq!(stderr, refusal(flag, sub), "{args:?}");
                refused += 1;
            }
            assert!(!marker.exists(), "{args:?}: it ran on the host");
        }
    }
    assert_eq!(applied + refused, flags.len() * subs.len());
    assert!(
        applied > 0 && refused > 0,
        "{applied} applied, {refused} refused"
    );

    // The controls: each command line alone does run, on the host (the marker is written; the
    // apigen and setup lines then fail, their command not being an MCP server or a Python).
    for sub in subs.iter().filter(|s| *s != "serve" && *s != "trust") {
        let rest = command_line(sub, &ws, &marker);
        let (status, stdout, stderr) = text(&ipybox().args(&rest).output().unwrap());
        assert_eq!(
            std::fs::read_to_string(&marker)
                .map(|s| s.trim().to_string())
                .ok(),
            Some("ran".to_string()),
            "the control `ipybox {sub}` wrote no marker ({status:?}): {stdout}\n{stderr}"
        );
        std::fs::remove_file(&marker).unwrap();
    }
}

/// A flag before a subcommand is used, not only parsed: the workspace before `exec` is the
/// kernel's working directory, a `--max-output-bytes` before `serve` is checked by the server
/// (the control: the same value after `serve`, the same error), `--python` before `setup` is
/// the interpreter checked.
#[test]
fn a_flag_before_its_subcommand_is_used() {
    let probe = Probe::new("flags-used");
    let ws = probe.path().join("ws");
    std::fs::create_dir(&ws).unwrap();
    let ws_s = ws.display().to_string();

    let (status, stdout, stderr) = text(
        &ipybox()
            .args([
                "--workspace",
                &ws_s,
                "exec",
                "-c",
                "import os; print(os.getcwd())",
            ])
            .current_dir(probe.path())
            .output()
            .unwrap(),
    );
    assert_eq!(status, Some(0), "{stderr}");
    assert_eq!(stdout, format!("{ws_s}\n"), "{stderr}");

    let invalid = "error: invalid --max-output-bytes 1\n  help: pass at least 1024 (bytes of a cell's output ipybox keeps)\n";
    for args in [
        &["--max-output-bytes", "1", "serve", "--workspace", &ws_s][..],
        &["serve", "--max-output-bytes", "1", "--workspace", &ws_s][..],
    ] {
        let (status, stdout, stderr) = text(&ipybox().args(args).output().unwrap());
        assert_eq!(status, Some(1), "{args:?}: {stdout}\n{stderr}");
        assert!(stderr.ends_with(invalid), "{args:?}: {stderr}");
    }

    let missing = probe.path().join("no-python-here");
    let missing_s = missing.display().to_string();
    for args in [
        &["--python", &missing_s, "setup"][..],
        &["setup", "--python", &missing_s][..],
    ] {
        let (status, stdout, stderr) = text(&ipybox().args(args).output().unwrap());
        assert_eq!(status, Some(1), "{args:?}: {stdout}\n{stderr}");
        assert!(stderr.contains(&missing_s), "{args:?}: {stderr}");
    }
}

fn srt() -> PathBuf {
    root().join("target/sandbox-deps/node_modules/.bin/srt")
}

/// A cell that writes `file` and prints `wrote`, or prints `denied <errno name>`.
fn write_probe(file: &Path) -> String {
    format!(
        "import errno\ntry:\n    with open({:?}, 'w') as f:\n        f.write('ran')\n    print('wrote')\nexcept OSError as e:\n    print('denied', errno.errorcode[e.errno])",
        file.display().to_string()
    )
}

/// `ipybox exec --sandbox` runs the cell in srt, as the server does: its write outside the
/// workspace is refused (EROFS), before the subcommand (`ipybox --sandbox exec`) too, and
/// `--sandbox-config` is the policy (one that lets it write there: written). With srt missing
/// the command fails before anything runs, never falls back to the host. The control: without
/// `--sandbox` the same cell writes the file.
#[cfg(target_os = "linux")]
#[test]
fn exec_sandbox_runs_the_cell_in_the_sandbox() {
    require!(SandboxDeps);
    let probe = Probe::new("exec-sandbox");
    let ws = probe.path().join("ws");
    std::fs::create_dir(&ws).unwrap();
    let file = probe.path().join("written-on-the-host");
    let code = write_probe(&file);
    let ws_s = ws.display().to_string();
    let run = |args: &[&str], srt: &Path| {
        text(&ipybox().args(args).env("IPYBOX_SRT", srt).output().unwrap())
    };

    for args in [
        &["exec", "--sandbox", "--workspace", &ws_s, "-c", &code][..],
        &["--sandbox", "exec", "--workspace", &ws_s, "-c", &code][..],
    ] {
        let (status, stdout, stderr) = run(args, &srt());
        assert_eq!(status, Some(0), "{args:?}: {stderr}");
        assert_eq!(stdout, "denied EROFS\n", "{args:?}: {stderr}");
        assert!(!file.exists(), "{args:?}");

        // No sandbox here: refused before anything runs.
        let (status, stdout, stderr) = run(args, &probe.path().join("no-srt-here"));
        assert_eq!(status, Some(1), "{args:?}: {stdout}\n{stderr}");
        assert_eq!(stdout, "", "{args:?}: {stderr}");
        assert!(
            stderr.starts_with("error: cannot run the code in the sandbox: sandbox unavailable: ")
                && stderr.contains("help: make the sandbox available here (docs/sandbox.md, Requirements), or leave out --sandbox to run the code on this host, unsandboxed"),
            "{args:?}: {stderr}"
        );
        assert!(!file.exists(), "{args:?}");
    }

    // --sandbox-config is the policy: this one lets the kernel write the probe directory.
    let policy = probe.path().join("policy.json");
    std::fs::write(
        &policy,
        serde_json::json!({"filesystem": {"allowWrite": [".", probe.path()]}}).to_string(),
    )
    .unwrap();
    let policy_s = policy.display().to_string();
    let (status, stdout, stderr) = run(
        &[
            "exec",
            "--sandbox",
            "--sandbox-config",
            &policy_s,
            "--workspace",
            &ws_s,
            "-c",
            &code,
        ],
        &srt(),
    );
    assert_eq!((status, stdout.as_str()), (Some(0), "wrote\n"), "{stderr}");
    std::fs::remove_file(&file).unwrap();

    // The control: unsandboxed, the same cell writes the file.
    let (status, stdout, stderr) = run(&["exec", "--workspace", &ws_s, "-c", &code], &srt());
    assert_eq!((status, stdout.as_str()), (Some(0), "wrote\n"), "{stderr}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "ran");
}

/// `ipybox --sandbox serve` serves a sandboxed kernel (issue 50: it served an unsandboxed one):
/// a client's cell cannot write outside the workspace; with srt missing the server refuses to
/// run code, as `ipybox --sandbox` does. The control: `ipybox serve` without it, the same cell
/// writes the file.
#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread")]
async fn sandbox_before_serve_sandboxes_the_server() {
    require!(SandboxDeps);
    let probe = Probe::new("serve-sandbox");
    let ws = probe.path().join("ws");
    std::fs::create_dir(&ws).unwrap();
    let file = probe.path().join("written-on-the-host");
    let code = write_probe(&file);
    let ws_s = ws.display().to_string();
    let srt_s = srt().display().to_string();

    // Without srt: the server says it cannot run code (the client gets the reason).
    for args in [
        &["--sandbox", "serve", "--workspace", &ws_s][..],
        &["--sandbox", "--workspace", &ws_s][..],
    ] {
        let (status, stdout, stderr) = text(
            &ipybox()
                .args(args)
                .env("IPYBOX_SRT", probe.path().join("no-srt-here"))
                .output()
                .unwrap(),
        );
        assert_eq!(status, Some(1), "{args:?}: {stdout}\n{stderr}");
        assert!(
            stderr.contains("ipybox cannot run code: sandbox unavailable: "),
            "{args:?}: {stderr}"
        );
    }

    // One cell through `ipybox ARGS` as an MCP server.
    let cell_through = |args: Vec<String>| {
        let srt_s = srt_s.clone();
        let code = code.clone();
        async move {
            let mut env = serde_json::Map::new();
            env.insert("IPYBOX_SRT".into(), srt_s.into());
            let params = serde_json::json!({"command": BIN, "args": args, "env": env});
            let params = ipybox::tools::ServerParams::parse(&params).unwrap();
            let s = ipybox::tools::McpSession::connect(
                &params,
                &process_env(),
                std::time::Duration::from_secs(60),
            )
            .await
            .expect("ipybox MCP server starts");
            let out = ok_text(
                &s,
                "execute_ipython_cell",
                serde_json::json!({ "code": code }),
            )
            .await;
            s.close().await;
            out
        }
    };
    let out = cell_through(vec![
        "--sandbox".into(),
        "serve".into(),
        "--workspace".into(),
        ws_s.clone(),
    ])
    .await;
    assert_eq!(out, "denied EROFS");
    assert!(!file.exists());

    let out = cell_through(vec!["serve".into(), "--workspace".into(), ws_s.clone()]).await;
    assert_eq!(out, "wrote");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "ran");
}
