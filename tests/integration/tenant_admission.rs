//! What all sessions of a service may take together (issue 51): a token's share of the
//! sessions (`--max-sessions-per-token`, by default `--max-sessions` shared out among the
//! tokens) and the memory every confined session is promised (`--service-memory`: each
//! session's `--session-memory` reserved in full, the service's cgroup bounded by it). Each
//! refusal runs against the same sessions with the bound `off` as its control, with one token
//! on a 2026-07-28 client and the other on a handshake-era one.

use crate::http_support::*;
use crate::mcp_eras::Era;
use crate::support::*;

const PER_TOKEN: &str = "too many sessions for this token: it already has the maximum of 2 open kernel sessions (--max-sessions-per-token)\n  help: end one of its sessions or let it idle (sessions idle for 600 s are hibernated), or ask the operator for a higher --max-sessions-per-token";

fn two_tokens(extra: &[&'static str]) -> Vec<&'static str> {
    let mut flags = vec![
        "--token",
        TOKEN_A,
        "--token",
        TOKEN_B,
        "--warm-sessions",
        "0",
    ];
    flags.extend_from_slice(extra);
    flags
}

/// With two tokens and `--max-sessions 3`, one token gets 2 (3 shared out, rounded up): its
/// third session is refused while the other token still gets one. The control (`off`): the
/// first token takes all three, and the other is refused by `--max-sessions`.
#[tokio::test(flavor = "multi_thread")]
async fn one_token_cannot_take_every_session() {
    require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    let service = Service::start(ws.path(), &[], &two_tokens(&["--max-sessions", "3"]));
    let a = connect(&service.url(), Some(TOKEN_A), Era::Stateless).await;
    let b = connect(&service.url(), Some(TOKEN_B), Era::Handshake).await;
    new_session(&a, "x = 1").await;
    new_session(&a, "x = 2").await;
    assert_eq!(cell(&a, "x = 3", None).await, (true, PER_TOKEN.into()));
    // A handshake-era client's kernel session is its MCP session's (no handle).
    assert_eq!(cell(&b, "y = 'b'", None).await, (false, String::new()));
    assert_eq!(cell(&b, "print(y)", None).await, (false, "b".into()));
    a.close().await;
    b.close().await;
    drop(service);

    let service = Service::start(
        ws.path(),
        &[],
        &two_tokens(&["--max-sessions", "3", "--max-sessions-per-token", "off"]),
    );
    let a = connect(&service.url(), Some(TOKEN_A), Era::Stateless).await;
    let b = connect(&service.url(), Some(TOKEN_B), Era::Handshake).await;
    for i in 0..3 {
        new_session(&a, &format!("x = {i}")).await;
    }
    let (is_error, text) = cell(&b, "y = 'b'", None).await;
    assert!(is_error, "{text}");
    assert!(
        text.starts_with("too many sessions: this ipybox already runs the maximum of 3 kernel sessions (--max-sessions)"),
        "{text}"
    );
    a.close().await;
    b.close().await;
}

/// The service's cgroup limit, as the kernel holds it (cgroup v1 or v2).
fn service_memory_limit(pid: u32) -> String {
    let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    let file = if std::path::Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
        let own = cgroups.lines().find_map(|l| l.strip_prefix("0::")).unwrap();
        let parent = own.strip_suffix("/ipybox-service").unwrap_or(own);
        format!("/sys/fs/cgroup{parent}/ipybox-{pid}/memory.max")
    } else {
        let own = cgroups
            .lines()
            .find_map(|l| {
                let mut parts = l.splitn(3, ':');
                let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
                controllers
                    .split(',')
                    .any(|c| c == "memory")
                    .then_some(path)
            })
            .unwrap();
        format!(
            "/sys/fs/cgroup/memory{}/ipybox-{pid}/memory.limit_in_bytes",
            own.trim_end_matches('/')
        )
    };
    std::fs::read_to_string(&file)
        .unwrap_or_else(|e| panic!("cannot read {file}: {e}"))
        .trim()
        .to_string()
}

/// Sessions of 300 MiB in a 700 MiB budget: two fit. Alice's second session holds 200 MB; her
/// third is refused at admission (not an OOM kill of anyone's kernel), Bob's session keeps its
/// state and works, and the service's cgroup is bounded by the budget. The control (`off`):
/// the third session opens.
#[tokio::test(flavor = "multi_thread")]
async fn sessions_are_admitted_only_while_their_memory_fits() {
    require!(TestEnv);
    if !cfg!(target_os = "linux") || unsafe { libc::geteuid() } != 0 {
        skip("needs root for cgroups (the service's memory bound is its cgroup's)");
        return;
    }
    let ws = tempfile::tempdir().unwrap();
    let bounded = |memory: &'static str| {
        two_tokens(&[
            "--session-memory",
            "300M",
            "--service-memory",
            memory,
            "--max-sessions-per-token",
            "off",
        ])
    };
    let service = Service::start(ws.path(), &[], &bounded("700M"));
    assert_eq!(
        service_memory_limit(service.pid()),
        (700u64 << 20).to_string()
    );
    let a = connect(&service.url(), Some(TOKEN_A), Era::Stateless).await;
    let b = connect(&service.url(), Some(TOKEN_B), Era::Handshake).await;
    assert_eq!(
        cell(&b, "y = 'still here'", None).await,
        (false, String::new())
    );
    new_session(&a, "hog = bytearray(200 << 20)\nprint(len(hog))").await;
    assert_eq!(
        cell(&a, "x = 3", None).await,
        (
            true,
            "the service's memory is taken: 2 open sessions of 300 MiB each (--session-memory) fill the 700 MiB all sessions may use (--service-memory)\n  help: retry later (sessions idle for 600 s are hibernated), or ask the operator for a lower --session-memory or a higher --service-memory".into()
        )
    );
    assert_eq!(
        cell(&b, "print(y)", None).await,
        (false, "still here".into())
    );
    a.close().await;
    b.close().await;
    drop(service);

    let service = Service::start(ws.path(), &[], &bounded("off"));
    let a = connect(&service.url(), Some(TOKEN_A), Era::Stateless).await;
    new_session(&a, "x = 1").await;
    new_session(&a, "hog = bytearray(200 << 20)").await;
    new_session(&a, "x = 3").await;
    a.close().await;
}

/// Limits that cannot be honoured together are refused at start, saying which flag to change.
#[test]
fn a_budget_that_holds_no_session_is_refused_at_start() {
    let ws = tempfile::tempdir().unwrap();
    let err = serve_refused(
        "127.0.0.1",
        ws.path(),
        &[
            "--session-memory",
            "512M",
            "--service-memory",
            "600M",
            "--warm-sessions",
            "1",
        ],
        &[],
    );
    assert!(
        err.contains("--service-memory 600 MiB holds 1 session(s) of --session-memory 512 MiB, and 1 are started ahead (--warm-sessions): no client's session would fit"),
        "{err}"
    );
    let err = serve_refused("127.0.0.1", ws.path(), &["--service-memory", "64T"], &[]);
    assert!(err.contains("is more than this machine has"), "{err}");
}

/// The log records of a service's stderr after the timestamp (`LEVEL target: message`).
fn records(stderr: &str) -> Vec<String> {
    stderr
        .lines()
        .filter_map(|l| l.split_once("Z ").map(|(_, r)| r.trim_start().to_string()))
        .collect()
}

/// A service started with `/proc/meminfo` hidden (`masked`: /dev/null bound over it in a mount
/// namespace of its own) or not; its stderr once it answers `/healthz`.
fn start_up_log(masked: bool) -> String {
    let ws = tempfile::tempdir().unwrap();
    let log = tempfile::NamedTempFile::new().unwrap();
    let port = free_port();
    let mask = if masked {
        "mount --bind /dev/null /proc/meminfo && "
    } else {
        ""
    };
    let mut child = std::process::Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c"])
        .arg(format!("{mask}exec \"$0\" \"$@\""))
        .arg(BIN)
        .args([
            "serve",
            "--http",
            &format!("127.0.0.1:{port}"),
            "--no-notebook",
        ])
        .args(["--warm-sessions", "0", "--workspace"])
        .arg(ws.path())
        .env_remove("IPYBOX_KERNEL_GATEWAY")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(log.reopen().unwrap())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while healthz(port) != Some(200) && std::time::Instant::now() < deadline {
        assert!(
            child.try_wait().unwrap().is_none(),
            "{}",
            std::fs::read_to_string(log.path()).unwrap()
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    std::fs::read_to_string(log.path()).unwrap()
}

/// `--service-memory auto` on a machine whose memory cannot be read warns on one log line
/// (`; help:`, not a `\n` escaped into the record); the control: with /proc/meminfo readable
/// there is no such warning.
#[test]
fn an_unreadable_machine_memory_is_one_warning_line() {
    if !cfg!(target_os = "linux")
        || unsafe { libc::geteuid() } != 0
        || std::process::Command::new("unshare")
            .arg("--version")
            .output()
            .is_err()
    {
        skip("needs root and unshare (to hide /proc/meminfo in a mount namespace)");
        return;
    }
    const WARNING: &str = "WARN ipybox::http::admission: cannot read this machine's memory (/proc/meminfo): the sessions' memory together is not bounded; help: pass --service-memory BYTES";
    let log = start_up_log(true);
    assert!(records(&log).contains(&WARNING.to_string()), "{log}");
    assert!(!log.contains("\\n"), "{log}");
    let log = start_up_log(false);
    assert!(log.contains("INFO ipybox::serve:"), "{log}");
    assert!(!log.contains("cannot read this machine's memory"), "{log}");
}
