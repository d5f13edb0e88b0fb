//! `ipybox exec` and `ipybox setup` as a user runs them, plus the managed-environment lock and
//! "kernels never outlive ipybox" (SIGKILL of the ipybox process).

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::require;

fn ipybox() -> Command {
    let mut cmd = Command::new(crate::support::BIN);
    cmd.stdin(Stdio::null());
    cmd
}

#[test]
fn exec_prints_output_and_exits_zero() {
    let ws = tempfile::tempdir().unwrap();
    let out = ipybox()
        .args(["exec", "--workspace"])
        .arg(ws.path())
        .args(["-c", "x = 21\nprint(x * 2)\nx"])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "42\n21\n");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn exec_failure_exits_one_with_traceback_on_stderr() {
    let ws = tempfile::tempdir().unwrap();
    let out = ipybox()
        .args(["exec", "--workspace"])
        .arg(ws.path())
        .args(["-c", "print('partial')\n1/0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "partial\n");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr
            .trim_end()
            .ends_with("ZeroDivisionError: division by zero"),
        "{stderr}"
    );
    assert!(!stderr.contains('\u{1b}'));
}

#[test]
fn exec_reads_code_from_stdin_and_files() {
    let ws = tempfile::tempdir().unwrap();
    let mut child = ipybox()
        .args(["exec", "--workspace"])
        .arg(ws.path())
        .arg("-")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"print('from stdin')")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "from stdin\n");
    let file = ws.path().join("script.py");
    std::fs::write(&file, "print('from file')").unwrap();
    let out = ipybox()
        .args(["exec", "--workspace"])
        .arg(ws.path())
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "from file\n");
    let out = ipybox().args(["exec"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "error: no code given\n  help: pass -c CODE, a FILE, or - to read stdin\n"
    );
}

#[test]
fn explicit_python_without_ipykernel_is_a_clear_error() {
    let venv = tempfile::tempdir().unwrap();
    let ok = Command::new("python3")
        .args(["-m", "venv", "--without-pip"])
        .arg(venv.path())
        .status()
        .unwrap();
    assert!(ok.success());
    let python = venv.path().join("bin/python");
    let out = ipybox()
        .args(["exec", "--python"])
        .arg(&python)
        .args(["-c", "1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let p = python.display();
    assert_eq!(
        stderr,
        format!(
            "error: python interpreter `{p}` lacks ipykernel pydantic\n  help: run `{p} -m pip install ipykernel pydantic` (or `uv pip install --python {p} ipykernel pydantic`), or set no interpreter (and no IPYBOX_PYTHON) to let ipybox manage an environment\n  help: the interpreter comes from --python PATH or IPYBOX_PYTHON\n"
        )
    );
    let out = ipybox()
        .args(["exec", "--python", "/nonexistent/python", "-c", "1"])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .starts_with("error: python interpreter `/nonexistent/python` cannot be run")
    );
}

#[test]
fn setup_provisions_once_under_a_lock() {
    // Two `ipybox setup` processes racing on a fresh IPYBOX_HOME: both succeed, one environment.
    let home = tempfile::tempdir().unwrap();
    let spawn = || {
        ipybox()
            .arg("setup")
            .env("IPYBOX_HOME", home.path())
            .env_remove("IPYBOX_PYTHON")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (a, b) = (spawn(), spawn());
    let (a, b) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
    let env_dir = home.path().join("kernel-env");
    for out in [&a, &b] {
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            format!(
                "kernel environment: {}\npython: {}/bin/python\n",
                env_dir.display(),
                env_dir.display()
            )
        );
    }
    let created = [&a, &b]
        .iter()
        .filter(|o| String::from_utf8_lossy(&o.stderr).contains("kernel environment ready"))
        .count();
    assert_eq!(created, 1, "exactly one process creates the environment");
    let waited = [&a, &b]
        .iter()
        .any(|o| String::from_utf8_lossy(&o.stderr).contains("waiting for another ipybox"));
    assert!(waited, "the other waits for the lock");
    // The environment works.
    let out = ipybox()
        .env("IPYBOX_HOME", home.path())
        .env_remove("IPYBOX_PYTHON")
        .args([
            "exec",
            "-c",
            "import ipykernel, pydantic, cloudpickle; print('ok')",
        ])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "ok\n");

    // An environment an older ipybox made (its marker names fewer packages, cloudpickle is
    // missing) is completed in place: what the user installed there stays.
    let python = env_dir.join("bin/python");
    let site = Command::new(&python)
        .args([
            "-c",
            "import sysconfig; print(sysconfig.get_paths()['purelib'])",
        ])
        .output()
        .unwrap();
    let site = std::path::PathBuf::from(String::from_utf8_lossy(&site.stdout).trim());
    for entry in std::fs::read_dir(&site).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if name.starts_with("cloudpickle") {
            std::fs::remove_dir_all(&path).unwrap();
        }
    }
    std::fs::write(site.join("users_own.py"), "VALUE = 7\n").unwrap();
    std::fs::write(
        env_dir.join(".ipybox-ready"),
        "ipykernel>=6.29 pydantic>=2.7",
    )
    .unwrap();
    let out = ipybox()
        .arg("setup")
        .env("IPYBOX_HOME", home.path())
        .env_remove("IPYBOX_PYTHON")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "adding ipykernel>=6.29 pydantic>=2.7 cloudpickle>=3,<4 to the kernel environment at {}",
            env_dir.display()
        )),
        "{stderr}"
    );
    assert!(
        !stderr.contains("creating the kernel environment"),
        "{stderr}"
    );
    let out = ipybox()
        .env("IPYBOX_HOME", home.path())
        .env_remove("IPYBOX_PYTHON")
        .args([
            "exec",
            "-c",
            "import cloudpickle, users_own; print(users_own.VALUE)",
        ])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "7\n");
}

#[test]
fn kernel_exits_when_ipybox_is_sigkilled() {
    let ws = tempfile::tempdir().unwrap();
    let mut child = ipybox()
        .args(["exec", "--workspace"])
        .arg(ws.path())
        .args([
            "-c",
            "import os, time\nprint(os.getpid(), flush=True)\ntime.sleep(60)",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let kernel: i32 = line.trim().parse().unwrap();
    assert!(std::path::Path::new(&format!("/proc/{kernel}")).exists());
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let start = Instant::now();
    while std::path::Path::new(&format!("/proc/{kernel}")).exists()
        && start.elapsed() < Duration::from_secs(3)
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    let stat = std::fs::read_to_string(format!("/proc/{kernel}/stat")).unwrap_or_default();
    assert!(
        stat.is_empty() || stat.contains(") Z"),
        "kernel {kernel} outlived ipybox: {stat}"
    );
}

/// `ipybox exec --approve-shell` in a session without a controlling terminal (as under CI, and
/// never prompting a developer's terminal): shell commands are rejected with a hint; `--yes`
/// accepts them; `--require-shell-escape` blocks subprocess.
#[test]
fn exec_approve_shell_asks_and_yes_accepts() {
    let ws = tempfile::tempdir().unwrap();
    // `setsid -w` detaches the controlling terminal (as tool_calls.rs does for tool calls).
    let run = |extra: &[&str], code: &str| {
        Command::new("setsid")
            .args(["-w", crate::support::BIN, "exec", "--workspace"])
            .arg(ws.path())
            .arg("--approve-shell")
            .args(extra)
            .args(["-c", code])
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let out = run(&[], "print('before')\n!touch made.txt");
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "before\n");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("ipybox: rejected shell command `touch made.txt`: no terminal to ask for approval\n  help: pass --yes"),
        "{stderr}"
    );
    assert!(
        stderr.contains(
            "ApprovalRejectedError: Approval request for ipybox.shell rejected: shell command `touch made.txt` was rejected by the application"
        ),
        "{stderr}"
    );
    assert!(!ws.path().join("made.txt").exists());
    let out = run(&["--yes"], "!echo approved");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // IPython runs `!` commands on a pty: their lines end in \r\n.
    assert_eq!(String::from_utf8_lossy(&out.stdout), "approved\r\n");
    let out = run(
        &["--yes", "--require-shell-escape"],
        "import os\nos.system('true')",
    );
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("ShellEscapeRequired: Direct os.system() calls are not allowed. Use ! syntax. (direct process creation (os.system) is blocked"),
        "{stderr}"
    );
}

/// Issue 18: on a terminal (a pty from `script`), the prompt shows names quoted and escaped: an
/// ANSI escape cannot clear the screen, a newline cannot print a fake prompt line. Answered `n`:
/// nothing runs.
#[test]
fn exec_prompt_on_a_terminal_shows_the_request_escaped() {
    require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    // Registered with `ipybox apigen` (kernels only reach registered servers).
    let params = crate::support::fixture_stdio_params("stdio").to_string();
    let registered = Command::new(crate::support::BIN)
        .args(["apigen", "fx", "--params", &params])
        .current_dir(ws.path())
        .output()
        .unwrap();
    assert!(registered.status.success(), "{registered:?}");
    let file = ws.path().join("attack.py");
    std::fs::write(
        &file,
        "from mcptools.fx import runner\nrunner.run('\\x1b[2Jadd', {'a': 1, 'b\\r\\nipybox: approve tool call fx.add(a=1)? [y/N] ': 2})\n",
    )
    .unwrap();
    let command = format!(
        "{} exec --workspace {} {}",
        crate::support::BIN,
        ws.path().display(),
        file.display()
    );
    let mut child = Command::new("script")
        .args(["-qec", &command, "/dev/null"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // The answer waits in the terminal until ipybox reads it; stdin stays open until the end.
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"n\n").unwrap();
    let mut out = Vec::new();
    std::io::Read::read_to_end(&mut child.stdout.take().unwrap(), &mut out).unwrap();
    drop(stdin);
    child.wait().unwrap();
    let out = String::from_utf8_lossy(&out);
    let start = out
        .find("ipybox: approve tool call ")
        .unwrap_or_else(|| panic!("no prompt in {out:?}"));
    // One line on the terminal (what follows it is the answer's output).
    let line = out[start..].split(['\r', '\n']).next().unwrap();
    let expected = r#"ipybox: approve tool call fx."\u001b[2Jadd"(a=1, "b\r\nipybox: approve tool call fx.add(a=1)? [y/N] "=2)? [y/N] "#;
    assert!(line.starts_with(expected), "{line:?}");
    // No line of the terminal is a second prompt.
    let prompts = out
        .split(['\r', '\n'])
        .filter(|l| l.starts_with("ipybox: approve"))
        .count();
    assert_eq!(prompts, 1, "{out:?}");
    assert!(
        !out.contains('\u{1b}'),
        "a raw escape reached the terminal: {out:?}"
    );
    assert!(
        out.contains(r#"ApprovalRejectedError: Approval request for fx."\u001b[2Jadd" rejected"#),
        "{out:?}"
    );
    // The registered server's command line comes first: what the call reaches.
    let server = format!(
        "ipybox: MCP server fx is {} {} stdio\r\nipybox: approve tool call",
        crate::support::python(),
        crate::support::fixture_script()
    );
    assert!(out.contains(&server), "{out:?}");
}

/// Every command's `--help` is text for its user: no rustdoc link (`` [`elicit`] ``) leaks
/// from a doc comment into it.
#[test]
fn help_shows_no_doc_comment_links() {
    let top = ipybox().arg("--help").output().unwrap();
    let top = String::from_utf8_lossy(&top.stdout).into_owned();
    let commands: Vec<&str> = top
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .collect();
    assert!(commands.contains(&"serve"), "{top}");
    let mut helps = vec![("ipybox".to_string(), top.clone())];
    for command in &commands {
        let out = ipybox().args([command, "--help"]).output().unwrap();
        assert!(out.status.success(), "{command} --help");
        helps.push((
            format!("ipybox {command}"),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        ));
    }
    for (command, help) in helps {
        for line in help.lines() {
            assert!(
                !line.contains("[`") && !line.contains("`]") && !line.contains("]("),
                "{command} --help shows a doc-comment link: {line}"
            );
        }
    }
}
