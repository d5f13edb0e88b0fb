//! What a newcomer meets (issue 53, items 3, 4 and 7): the start-up line, a bare `ipybox` on a
//! terminal, a workspace that does not exist, a loopback service without a token, the `exec`
//! usage line with IPYBOX_PYTHON set, and the messages that used to repeat or hide something.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::mcp_eras::{CallTool, Era, both_eras, start};
use crate::support::*;

fn ipybox() -> Command {
    let mut cmd = Command::new(BIN);
    cmd.stdin(Stdio::null())
        .env_remove("IPYBOX_KERNEL_GATEWAY")
        .env_remove("IPYBOX_TOKEN");
    cmd
}

/// The log lines after the timestamp (`LEVEL target: message`).
fn records(stderr: &str) -> Vec<String> {
    stderr
        .lines()
        .filter_map(|l| l.split_once("Z ").map(|(_, r)| r.trim_start().to_string()))
        .collect()
}

/// The stdio server names its workspace, its transport and where the notebook goes, first.
#[test]
fn the_stdio_server_says_where_it_works() {
    let probe = Probe::new("startup-stdio");
    let ws = probe.path();
    for (flags, notebooks) in [
        (&[][..], format!("{}/notebooks", ws.display())),
        (
            &["--no-notebook"][..],
            "not recorded (--no-notebook)".to_string(),
        ),
    ] {
        let out = ipybox()
            .args(["serve", "--workspace"])
            .arg(ws)
            .args(flags)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            records(&stderr)[0],
            format!(
                "INFO ipybox::serve: ipybox {}: workspace {}, MCP on stdio, notebooks {notebooks}",
                env!("CARGO_PKG_VERSION"),
                ws.display()
            ),
            "{stderr}"
        );
        // stdin is not a terminal: no word for a person (the control of the test below).
        assert!(!stderr.contains("ipybox is an MCP server"), "{stderr}");
    }
}

/// The HTTP service's start-up line; on loopback without a token a warning names the risk and
/// the flag; with a token (the control) no warning.
#[test]
fn a_loopback_service_without_a_token_is_warned_about() {
    let probe = Probe::new("startup-http");
    let ws = probe.path().join("ws");
    std::fs::create_dir(&ws).unwrap();
    let home = probe.path().join("home");
    let tokens = probe.path().join("tokens");
    std::fs::write(&tokens, "a-long-enough-test-token-0123456789\n").unwrap();
    for with_token in [false, true] {
        let addr = format!("127.0.0.1:{}", free_port());
        let mut cmd = ipybox();
        cmd.args([
            "serve",
            "--http",
            &addr,
            "--unconfined-sessions",
            "--workspace",
        ])
        .arg(&ws)
        .env("IPYBOX_HOME", &home)
        .stderr(Stdio::piped());
        if with_token {
            cmd.arg("--token-file").arg(&tokens);
        }
        let mut child = cmd.spawn().unwrap();
        let mut seen = Vec::new();
        for line in BufReader::new(child.stderr.take().unwrap()).lines() {
            let line = line.unwrap();
            let served = line.contains("serving MCP at");
            seen.extend(records(&line));
            if served {
                break;
            }
        }
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(
            seen.iter().any(|l| l.contains("serving MCP at")),
            "{seen:#?}"
        );
        assert_eq!(
            seen[0],
            format!(
                "INFO ipybox::serve: ipybox {}: workspace {}, MCP over HTTP at http://{addr}/mcp, notebooks {}/notebooks",
                env!("CARGO_PKG_VERSION"),
                ws.display(),
                home.display()
            )
        );
        let warning = format!(
            "WARN ipybox::serve::http_options: no token: any local user who can reach {addr} can run code as ipybox's user; pass --token-file FILE (or IPYBOX_TOKEN) so that only clients with a token are served"
        );
        assert_eq!(seen.contains(&warning), !with_token, "{seen:#?}");
    }
}

/// A bare `ipybox` on a terminal (a pty from `script`) says it is an MCP server waiting on
/// stdin and how to try it.
#[test]
fn a_bare_ipybox_on_a_terminal_says_what_it_is() {
    let probe = Probe::new("startup-tty");
    let command = format!("{BIN} --workspace {} --no-notebook", probe.path().display());
    let mut child = Command::new("script")
        .args(["-qec", &command, "/dev/null"])
        .env_remove("IPYBOX_KERNEL_GATEWAY")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut out = Vec::new();
        let mut buf = [0u8; 4096];
        let until = Instant::now() + Duration::from_secs(60);
        while Instant::now() < until {
            match stdout.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => out.extend_from_slice(&buf[..n]),
            }
            if String::from_utf8_lossy(&out).contains("print(1)") {
                break;
            }
        }
        String::from_utf8_lossy(&out).into_owned()
    });
    let out = reader.join().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let _ = stdin.write_all(b"\x04");
    drop(stdin);
    let _ = child.kill();
    child.wait().unwrap();
    let said = out.replace("\r\n", "\n");
    assert!(
        said.contains("ipybox is an MCP server: it waits for an MCP client's messages on stdin (Ctrl-C ends it).\n  help: register it with a client (e.g. `claude mcp add ipybox -- ipybox`), or try code by hand: `ipybox exec -c 'print(1)'` (ipybox --help lists the commands)"),
        "{said:?}"
    );
}

/// stdin closed before any byte came (no MCP client connected: Ctrl-D or Ctrl-C on a
/// terminal, `< /dev/null`, a pipe closed at once) ends the stdio server with 0 and no
/// "initialization failed"; the control: a first message that is not MCP is still an error.
#[test]
fn stdin_closed_before_any_message_ends_quietly() {
    let probe = Probe::new("stdin-closed");
    let run = |stdin: Stdio, input: &[u8]| {
        let mut child = ipybox()
            .arg("--workspace")
            .arg(probe.path())
            .arg("--no-notebook")
            .stdin(stdin)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        if let Some(mut stdin) = child.stdin.take() {
            stdin.write_all(input).unwrap();
        }
        let out = child.wait_with_output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    for (stdin, what) in [(Stdio::null(), "/dev/null"), (Stdio::piped(), "a pipe")] {
        let (code, stderr) = run(stdin, b"");
        assert_eq!(code, Some(0), "{what}: {stderr}");
        assert!(
            !stderr.contains("initialization failed"),
            "{what}: {stderr}"
        );
        assert!(
            records(&stderr).contains(
                &"INFO ipybox::mcp_server::stdio: stdin closed before an MCP client sent a message: stopped".to_string()
            ),
            "{what}: {stderr}"
        );
    }
    let (code, stderr) = run(Stdio::piped(), b"garbage\n");
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr
            .ends_with("error: MCP initialization failed: connection closed: initialize request\n"),
        "{stderr}"
    );
}

/// `exec --workspace` that does not exist is refused, and not created; a file in its place too
/// (the control: an existing directory runs).
#[test]
fn exec_refuses_a_workspace_that_does_not_exist() {
    let probe = Probe::new("exec-ws");
    let missing = probe.path().join("typo/path");
    let out = ipybox()
        .args(["exec", "--workspace"])
        .arg(&missing)
        .args(["-c", "print(1)"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        format!(
            "error: the workspace {0} does not exist\n  help: pass an existing directory as --workspace (create it first: mkdir -p {0})\n",
            missing.display()
        )
    );
    assert!(!probe.path().join("typo").exists());
    let file = probe.path().join("file");
    std::fs::write(&file, "").unwrap();
    let out = ipybox()
        .args(["exec", "--workspace"])
        .arg(&file)
        .args(["-c", "print(1)"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).starts_with(&format!(
        "error: the workspace {} is not a directory\n",
        file.display()
    )));
    let out = ipybox()
        .args(["exec", "--workspace"])
        .arg(probe.path())
        .args(["-c", "print(1)"])
        .output()
        .unwrap();
    assert_eq!(
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).as_ref()
        ),
        (Some(0), "1\n")
    );
}

/// With IPYBOX_PYTHON set, `exec`'s usage line does not show `--python` as required (nor
/// without it).
#[test]
fn exec_usage_does_not_require_python() {
    for python in [Some("python3"), None] {
        let mut cmd = ipybox();
        cmd.args(["exec", "--no-such-flag"]);
        match python {
            Some(p) => cmd.env("IPYBOX_PYTHON", p),
            None => cmd.env_remove("IPYBOX_PYTHON"),
        };
        let out = cmd.output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2));
        assert!(
            stderr.contains("\nUsage: ipybox exec [OPTIONS] <-c CODE | FILE | ->\n"),
            "{python:?}: {stderr}"
        );
    }
}

/// `exec FILE`: a traceback names the file and its line, not `Cell In[1]`; `exec --timeout`
/// does not say the kernel's state was kept (the kernel is stopped); a bad `--params` puts the
/// parse position in the error, not in the advice.
#[test]
fn exec_and_apigen_messages_say_what_happened() {
    let probe = Probe::new("messages");
    let ws = probe.path();
    let file = ws.join("job.py");
    std::fs::write(&file, "x = 1\n\n1 / 0\n").unwrap();
    let out = ipybox()
        .args(["exec", "--workspace"])
        .arg(ws)
        .arg(&file)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr.contains(&format!("\nFile \"{}\", line 3\n", file.display()))
            && !stderr.contains("Cell In["),
        "{stderr}"
    );

    let out = ipybox()
        .args(["exec", "--workspace"])
        .arg(ws)
        .args(["--timeout", "500ms", "-c", "import time; time.sleep(30)"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "execution timed out after 0.5 s and was interrupted (ipybox exec stops the kernel: nothing is kept)\n"
    );

    let out = ipybox()
        .args(["apigen", "x", "--workspace"])
        .arg(ws)
        .args(["--params", "{nope"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "error: --params is not valid JSON (key must be a string at line 1 column 2)\n  help: pass e.g. --params '{\"command\": \"npx\", \"args\": [\"-y\", \"@modelcontextprotocol/server-memory\"]}'\n"
    );
}

/// Calling a tool the server does not have: the error names it and the tools there are.
async fn an_unknown_tool_is_named(era: Era) {
    let ws = tempfile::tempdir().unwrap();
    let s = start(ws.path(), &[], &[], era).await;
    let err = s
        .call_tool_json("execute_python", serde_json::Map::new())
        .await
        .unwrap_err();
    assert!(
        err.contains("tool not found: `execute_python` (this server's tools: "),
        "{err}"
    );
    assert!(err.contains("execute_ipython_cell"), "{err}");
}
both_eras!(an_unknown_tool_is_named);
