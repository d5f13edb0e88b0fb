//! Sizes and durations (issue 53, item 2): every flag whose value is a size or a duration
//! (found in `--help` by its `SIZE` / `DURATION` value name, so a new one is covered too) takes
//! each unit, refuses a wrong one with the same error, and prints its default in the same form;
//! `0` is refused where `off` turns the limit off.
//!
//! A value is accepted when the command line gets past clap to the first check of the command
//! itself: `serve` refuses the address `--http 127.0.0.1:x` (read before anything is set up),
//! `exec` and `replay` a workspace that does not exist. Nothing starts.

use std::process::{Command, Stdio};

use crate::support::*;

const BAD_HTTP: &str = "error: invalid --http `127.0.0.1:x`\n  help: pass HOST:PORT, e.g. 127.0.0.1:8000 or 0.0.0.0:8000\n";
const SIZE_UNITS: &[&str] = &[
    "4096", "4096B", "64K", "64k", "64KiB", "64KB", "8M", "8MiB", "2G", "1.5G", "1T",
];
const DURATION_UNITS: &[&str] = &["30", "0.5", "500ms", "30s", "10m", "2h", "7d", "1.5m"];

fn ipybox() -> Command {
    let mut cmd = Command::new(BIN);
    cmd.stdin(Stdio::null())
        .env_remove("IPYBOX_KERNEL_GATEWAY")
        .env_remove("IPYBOX_PYTHON");
    cmd
}

fn run(args: &[&str]) -> (Option<i32>, String) {
    let out = ipybox().args(args).output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `(flag, value name, default shown)` of every size or duration flag in `help`.
fn unit_flags(help: &str) -> Vec<(String, String, Option<String>)> {
    let mut flags = Vec::new();
    let lines: Vec<&str> = help.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        let Some(rest) = line.trim_start().strip_prefix("--") else {
            continue;
        };
        let Some((name, value)) = rest.split_once(" <") else {
            continue;
        };
        let value = value.split('>').next().unwrap().to_string();
        if !(value.starts_with("SIZE") || value.starts_with("DURATION")) {
            continue;
        }
        // The help is on the flag's line when the flag is short, else on the next one.
        let next = lines.get(i + 1).copied().unwrap_or("");
        let text = if line.contains("[default: ") || next.trim_start().starts_with('-') {
            line
        } else {
            next
        };
        let default = text
            .split_once("[default: ")
            .map(|(_, d)| d.split(']').next().unwrap().to_string());
        flags.push((name.to_string(), value, default));
    }
    flags
}

fn help(args: &[&str]) -> String {
    let out = ipybox().args(args).arg("--help").output().unwrap();
    assert!(out.status.success());
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Every size and duration flag of `serve` with every unit; a wrong unit refused by the one
/// parser's error; the defaults printed as a person writes them.
#[test]
fn every_serve_size_and_duration_flag_takes_every_unit() {
    let flags = unit_flags(&help(&["serve"]));
    let names: Vec<&str> = flags.iter().map(|(n, _, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "approval-timeout",
            "task-after",
            "task-ttl",
            "max-output-bytes",
            "max-image-bytes",
            "checkpoint-after",
            "idle-timeout",
            "hibernate-after",
            "snapshot-quota",
            "notebook-quota",
            "max-body-bytes",
            "shutdown-grace",
            "first-request-timeout",
            "keep-alive-timeout",
            "service-memory",
            "session-memory",
            "session-work-size",
            "session-box-size",
        ],
        "the size and duration flags of `serve --help` (in its order)"
    );
    let defaults: Vec<(&str, Option<&str>)> = flags
        .iter()
        .map(|(n, _, d)| (n.as_str(), d.as_deref()))
        .collect();
    for expected in [
        ("approval-timeout", Some("2m")),
        ("task-after", Some("5s")),
        ("task-ttl", Some("5m")),
        ("max-output-bytes", Some("1M")),
        ("max-image-bytes", Some("16M")),
        ("max-body-bytes", Some("4M")),
        ("shutdown-grace", Some("10s")),
        ("first-request-timeout", Some("5s")),
        ("keep-alive-timeout", Some("2m")),
        ("session-memory", Some("2G")),
        ("session-work-size", Some("1G")),
        ("session-box-size", Some("16M")),
        ("hibernate-after", Some("10m")),
        ("snapshot-quota", Some("4G")),
        ("notebook-quota", Some("256M")),
        ("service-memory", Some("auto")),
    ] {
        assert!(defaults.contains(&expected), "{expected:?} in {defaults:?}");
    }
    for (flag, value, _) in &flags {
        let units = if value.starts_with("SIZE") {
            SIZE_UNITS
        } else {
            DURATION_UNITS
        };
        let flag = format!("--{flag}");
        for unit in units {
            let (status, stderr) = run(&["serve", "--http", "127.0.0.1:x", &flag, unit]);
            assert_eq!(
                (status, stderr.as_str()),
                (Some(1), BAD_HTTP),
                "{flag} {unit}"
            );
        }
        let (wrong, error) = if value.starts_with("SIZE") {
            (
                "4X",
                "`4X` is not a size: pass bytes, or a number with K, M, G or T (powers of 1024), e.g. 4096, 512K, 1.5G",
            )
        } else {
            (
                "7w",
                "`7w` is not a duration: pass seconds, or a number with ms, s, m, h or d, e.g. 500ms, 30s, 10m, 7d",
            )
        };
        let (status, stderr) = run(&["serve", "--http", "127.0.0.1:x", &flag, wrong]);
        let off = match value.as_str() {
            v if v.ends_with("|auto|off") => "; or `auto` or `off`",
            v if v.ends_with("|off") => "; or `off`",
            _ => "",
        };
        assert_eq!(status, Some(2), "{flag} {wrong}: {stderr}");
        assert!(
            stderr.starts_with(&format!(
                "error: invalid value '{wrong}' for '{flag} <{value}>': {error}{off}\n"
            )),
            "{flag} {wrong}: {stderr}"
        );
        if value.ends_with("off") {
            let (status, stderr) = run(&["serve", "--http", "127.0.0.1:x", &flag, "off"]);
            assert_eq!((status, stderr.as_str()), (Some(1), BAD_HTTP), "{flag} off");
        }
    }
}

/// `exec --timeout` and `replay --timeout` take every duration unit; a wrong unit and 0 are
/// refused.
#[test]
fn exec_and_replay_timeouts_take_every_unit() {
    let missing = "/does/not/exist/ipybox-units";
    let refused = format!(
        "error: the workspace {missing} does not exist\n  help: pass an existing directory as --workspace (create it first: mkdir -p {missing})\n"
    );
    for sub in ["exec", "replay"] {
        let tail: &[&str] = if sub == "exec" {
            &["-c", "1"]
        } else {
            &["nb.ipynb"]
        };
        for unit in DURATION_UNITS {
            let mut args = vec![sub, "--workspace", missing, "--timeout", unit];
            args.extend(tail);
            let (status, stderr) = run(&args);
            assert_eq!(
                (status, stderr.as_str()),
                (Some(1), refused.as_str()),
                "{sub} {unit}"
            );
        }
        let mut args = vec![sub, "--workspace", missing, "--timeout", "0ms"];
        args.extend(tail);
        let (status, stderr) = run(&args);
        assert_eq!(
            (status, stderr.as_str()),
            (
                Some(1),
                "error: invalid --timeout 0\n  help: pass a positive duration (500ms, 30s, 10m, 7d)\n"
            ),
            "{sub}"
        );
        let mut args = vec![sub, "--timeout", "1x"];
        args.extend(tail);
        let (status, stderr) = run(&args);
        assert_eq!(status, Some(2), "{sub}: {stderr}");
        assert!(
            stderr.starts_with(
                "error: invalid value '1x' for '--timeout <DURATION>': `1x` is not a duration"
            ),
            "{sub}: {stderr}"
        );
    }
}

/// The value is the one the unit says: `--max-output-bytes 0.5K` is 512 bytes, under the
/// 1024 it needs (the control: `1K` passes that check). `0` is refused where `off` turns a
/// limit off, with the same advice for every such flag; `0` of `--task-after` (every cell) is
/// accepted.
#[test]
fn units_mean_what_they_say_and_zero_is_never_off() {
    // Checked after the address: a free loopback port, where nothing is served (each command
    // line is refused before the service starts).
    let addr = format!("127.0.0.1:{}", free_port());
    let ws = Probe::new("units-zero");
    let ws_s = ws.path().display().to_string();
    let serve = |flags: &[&str]| {
        let mut args = vec![
            "serve",
            "--http",
            &addr,
            "--unconfined-sessions",
            "--workspace",
            &ws_s,
        ];
        args.extend(flags);
        run(&args)
    };
    let (status, stderr) = serve(&["--max-output-bytes", "0.5K"]);
    assert_eq!(status, Some(1));
    assert!(
        stderr.ends_with("error: invalid --max-output-bytes 512\n  help: pass at least 1024 (bytes of a cell's output ipybox keeps)\n"),
        "{stderr}"
    );
    // The control: 1K passes that check (the refusal is the next flag's).
    let (status, stderr) = serve(&["--max-output-bytes", "1K", "--hibernate-after", "0"]);
    assert_eq!(status, Some(1));
    assert!(
        stderr.ends_with("error: invalid --hibernate-after 0\n  help: pass a positive duration (500ms, 30s, 10m, 7d), or `off`\n"),
        "{stderr}"
    );
    for (flag, help) in [
        (
            "--hibernate-after",
            "pass a positive duration (500ms, 30s, 10m, 7d), or `off`",
        ),
        (
            "--checkpoint-after",
            "pass a positive duration (500ms, 30s, 10m, 7d), or `off`",
        ),
        (
            "--approval-timeout",
            "pass a positive duration (500ms, 30s, 10m, 7d), or `off` to wait without limit",
        ),
        (
            "--snapshot-quota",
            "pass a size (512M, 2G), or `off` for no limit",
        ),
        (
            "--notebook-quota",
            "pass a size (512M, 2G), or `off` for no limit",
        ),
        (
            "--session-memory",
            "pass a size (512M, 2G), or `off` for no limit",
        ),
        (
            "--session-work-size",
            "pass a size (512M, 2G), or `off` for no limit",
        ),
        (
            "--session-box-size",
            "pass a size (512M, 2G), or `off` for no limit",
        ),
    ] {
        let (status, stderr) = serve(&[flag, "0"]);
        assert_eq!(status, Some(1), "{flag}: {stderr}");
        assert!(
            stderr.ends_with(&format!("error: invalid {flag} 0\n  help: {help}\n")),
            "{flag}: {stderr}"
        );
    }
    for (flag, error) in [
        (
            "--session-max-procs",
            "`0` is not a number of processes: pass 1 or more, or `off` for no limit",
        ),
        (
            "--session-cpus",
            "0 cores would run nothing: pass cores (0.5, 1, 2), or `off` for no limit",
        ),
    ] {
        let (status, stderr) = run(&["serve", "--http", "127.0.0.1:x", flag, "0"]);
        assert_eq!(status, Some(2), "{flag}: {stderr}");
        assert!(stderr.contains(error), "{flag}: {stderr}");
        let (status, stderr) = run(&["serve", "--http", "127.0.0.1:x", flag, "off"]);
        assert_eq!((status, stderr.as_str()), (Some(1), BAD_HTTP), "{flag} off");
    }
    // `--task-after 0`: every cell becomes a task; accepted (the control of the refusals).
    let (status, stderr) = run(&["serve", "--http", "127.0.0.1:x", "--task-after", "0"]);
    assert_eq!((status, stderr.as_str()), (Some(1), BAD_HTTP));
}
