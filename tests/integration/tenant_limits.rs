//! What one session may use (issue 37, item 4): from a cell over `ipybox serve --http` with
//! small limits, a bounded fork bomb (`--session-max-procs`), a memory hog (`--session-memory`)
//! and a work-directory filler (`--session-work-size`) each meet their limit, and the cell's
//! result names the limit and its flag; the same cells with `--unconfined-sessions` (no limits:
//! they need confinement) show the attack code works. A session's cgroup is gone after the
//! session closes and after shutdown. Needs root (cgroups and tmpfs mounts), as the other
//! confinement tests do.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::http_support::*;
use crate::mcp_eras::Era;
use crate::support::*;

const LIMITS: [&str; 6] = [
    "--session-max-procs",
    "50",
    "--session-memory",
    "200M",
    "--session-work-size",
    "20M",
];

fn start(ws: &std::path::Path, unconfined: bool) -> Service {
    let mut flags = LIMITS.to_vec();
    if unconfined {
        flags.push("--unconfined-sessions");
    }
    Service::start(ws, &[("IPYBOX_TOKEN", TOKEN_A)], &flags)
}

/// Starts 200 `sleep 30` (bounded), kills them; prints `started=N error=E`.
const FORK_BOMB: &str = r#"import subprocess
procs, err = [], None
for i in range(200):
    try:
        procs.append(subprocess.Popen(["sleep", "30"]))
    except OSError as e:
        err = f"{type(e).__name__}:{e.errno}"
        break
for p in procs:
    p.kill()
for p in procs:
    p.wait()
print(f"started={len(procs)} error={err}")"#;

/// Writes up to 50 MiB into `path` (a Python expression), a MiB at a time; prints
/// `mib=N errno=E`. The file stays: the host sees a full directory after the cell.
fn filler(path: &str) -> String {
    format!(
        r#"import os
n, err = 0, None
fd = os.open({path}, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
try:
    for i in range(50):
        os.write(fd, b"x" * (1 << 20))
        n += 1
except OSError as e:
    err = e.errno
finally:
    os.close(fd)
print(f"mib={{n}} errno={{err}}")"#
    )
}

/// [`filler`] of the working directory.
fn work_filler() -> String {
    filler("\"fill.bin\"")
}

const HOG: &str = "x = b'x' * (400 << 20)\nprint(len(x))";

const PROCS_NOTE: &str = "[ipybox] this session reached its process limit (50 processes and threads, --session-max-procs)";
const WORK_NOTE: &str =
    "[ipybox] this session's work directory is full (20 MiB, --session-work-size)";
const MEMORY_DIED: &str = "kernel died (killed for memory: this session reached its memory limit, 200 MiB, --session-memory) — restarted, state lost";
const MEMORY_NOTE: &str =
    "[ipybox] this session reached its memory limit (200 MiB, --session-memory)";

/// The session's cgroup directories on the host, from the kernel's `/proc/self/cgroup` (the
/// pids hierarchy on cgroup v1, the unified one on v2).
async fn cgroup_of(client: &impl crate::mcp_eras::CallTool, session: Option<&str>) -> PathBuf {
    let (is_error, text) = cell(client, "print(open('/proc/self/cgroup').read())", session).await;
    assert!(!is_error, "{text}");
    let text = split_note(&text).0;
    let v2 = std::path::Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
    let line = text
        .lines()
        .find(|l| {
            let mut parts = l.splitn(3, ':');
            let list = parts.nth(1).unwrap_or("");
            if v2 {
                list.is_empty()
            } else {
                list.split(',').any(|c| c == "pids")
            }
        })
        .unwrap_or_else(|| panic!("no pids line in {text}"));
    let path = line.splitn(3, ':').nth(2).unwrap().trim_start_matches('/');
    assert!(line.contains("/ipybox-") && line.contains("/s-"), "{line}");
    if v2 {
        PathBuf::from("/sys/fs/cgroup").join(path)
    } else {
        PathBuf::from("/sys/fs/cgroup/pids").join(path)
    }
}

fn wait_gone(path: &std::path::Path, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while path.exists() {
        assert!(
            Instant::now() < deadline,
            "{} still exists {what}",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The fork bomb and the work-directory filler, confined and unconfined, in both eras; the
/// session's cgroup goes with the session (DELETE) and the service's at shutdown.
#[tokio::test(flavor = "multi_thread")]
async fn fork_bomb_and_work_filler_meet_their_limits() {
    require!(TestEnv);
    // SAFETY: geteuid has no preconditions.
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "the limits tests run as root"
    );
    let ws = tempfile::tempdir().unwrap();
    let mut confined = start(ws.path(), false);
    let open = ws.path().join("open");
    std::fs::create_dir(&open).unwrap();
    let unconfined = start(&open, true);
    assert!(
        confined
            .log()
            .contains("session limits: a cgroup per session, cgroup v"),
        "{}",
        confined.log()
    );

    // Confined, a handshake-era client (its close DELETEs the MCP session).
    let client = connect(&confined.url(), Some(TOKEN_A), Era::Handshake).await;
    let (is_error, text) = cell(&client, FORK_BOMB, None).await;
    // (The handshake era's session is the MCP session: no handle.)
    let out = split_note(&text).0;
    assert!(!is_error, "{text}");
    let mut lines = out.lines();
    let first = lines.next().unwrap_or("");
    let started: usize = first
        .strip_prefix("started=")
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{out}"));
    assert!(
        (10..50).contains(&started),
        "at most 50 processes and threads: {out}"
    );
    assert!(first.ends_with(" error=BlockingIOError:11"), "{out}");
    assert!(out.contains(PROCS_NOTE), "{out}");
    // The session goes on (its processes were ended by the cell): the note is not repeated.
    let (is_error, text) = cell(&client, &work_filler(), None).await;
    let out = split_note(&text).0;
    assert!(!is_error, "{text}");
    let mib: usize = out
        .strip_prefix("mib=")
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{out}"));
    assert!((18..=20).contains(&mib), "{out}");
    assert!(out.contains(" errno=28\n\n"), "ENOSPC: {out}");
    assert!(out.contains(WORK_NOTE), "{out}");
    assert!(!out.contains(PROCS_NOTE), "{out}");
    let cgroup = cgroup_of(&client, None).await;
    assert!(cgroup.is_dir(), "{}", cgroup.display());
    let service_dir = cgroup.parent().unwrap().to_path_buf();
    assert!(
        service_dir
            .file_name()
            .is_some_and(|n| n.to_string_lossy() == format!("ipybox-{}", confined.pid())),
        "{}",
        service_dir.display()
    );
    client.close().await;
    wait_gone(&cgroup, "after the session was closed (DELETE)");

    // Unconfined (a stateless-era client): no limit, the same code does what it says.
    let client = connect(&unconfined.url(), Some(TOKEN_A), Era::Stateless).await;
    let (is_error, text) = cell(&client, FORK_BOMB, None).await;
    let (out, handle) = split_note(&text);
    assert!(!is_error, "{text}");
    assert_eq!(out, "started=200 error=None");
    let handle = handle.unwrap();
    let (is_error, text) = cell(&client, &work_filler(), Some(&handle)).await;
    assert!(!is_error, "{text}");
    assert_eq!(split_note(&text).0, "mib=50 errno=None");

    // A bubblewrap'd kernel (no kernel factory) joins its cgroup between fork and exec.
    let launched_ws = ws.path().join("launched");
    std::fs::create_dir(&launched_ws).unwrap();
    let mut flags = LIMITS.to_vec();
    flags.push("--no-kernel-factory");
    let mut launched = Service::start(&launched_ws, &[("IPYBOX_TOKEN", TOKEN_A)], &flags);
    let client = connect(&launched.url(), Some(TOKEN_A), Era::Stateless).await;
    let (is_error, text) = cell(&client, FORK_BOMB, None).await;
    let out = split_note(&text).0;
    assert!(!is_error, "{text}");
    assert!(out.contains(" error=BlockingIOError:11\n\n"), "{out}");
    assert!(out.contains(PROCS_NOTE), "{out}");
    launched.terminate(Duration::from_secs(30));

    // A session open at shutdown: its cgroup and the service's go with the service.
    let client = connect(&confined.url(), Some(TOKEN_A), Era::Stateless).await;
    let (_, text) = cell(&client, "print(1)", None).await;
    let handle = split_note(&text).1.unwrap_or_else(|| panic!("{text}"));
    let cgroup = cgroup_of(&client, Some(&handle)).await;
    assert!(cgroup.is_dir());
    confined.terminate(Duration::from_secs(30));
    assert!(!cgroup.exists(), "{}", cgroup.display());
    assert!(!service_dir.exists(), "{}", service_dir.display());
}

/// A memory hog: confined, the kernel is killed, the error says which limit and flag, and the
/// next call runs in a new kernel; unconfined, the same cell allocates.
#[tokio::test(flavor = "multi_thread")]
async fn memory_hog_meets_the_memory_limit() {
    require!(TestEnv);
    // SAFETY: geteuid has no preconditions.
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "the limits tests run as root"
    );
    let ws = tempfile::tempdir().unwrap();
    let mut confined = start(ws.path(), false);
    let open = ws.path().join("open");
    std::fs::create_dir(&open).unwrap();
    let unconfined = start(&open, true);

    let client = connect(&confined.url(), Some(TOKEN_A), Era::Stateless).await;
    let (_, text) = cell(&client, "kept = 1\nprint('ready')", None).await;
    let handle = split_note(&text).1.unwrap_or_else(|| panic!("{text}"));
    let (is_error, text) = cell(&client, HOG, Some(&handle)).await;
    assert!(is_error, "{text}");
    assert!(text.contains(MEMORY_DIED), "{text}");
    assert!(text.contains(MEMORY_NOTE), "{text}");
    let (is_error, text) = cell(&client, "print(2 + 2, 'kept' in globals())", Some(&handle)).await;
    assert!(!is_error, "{text}");
    assert_eq!(split_note(&text).0, "4 False");

    let client = connect(&unconfined.url(), Some(TOKEN_A), Era::Handshake).await;
    let (is_error, text) = cell(&client, HOG, None).await;
    assert!(!is_error, "{text}");
    assert_eq!(split_note(&text).0, (400usize << 20).to_string());
    client.close().await;
    // (Stopped, not killed: a killed service's cgroups and mounts wait for the next start.)
    confined.terminate(Duration::from_secs(30));
}

/// [`filler`] of the kernel's own directory (`box/`, beside its working directory).
fn box_filler() -> String {
    filler("os.path.join(os.getcwd(), \"..\", \"box\", \"fill.bin\")")
}

const BOX_NOTE: &str =
    "[ipybox] this session's kernel directory is full (4 MiB, --session-box-size)";

/// A confined session's `box/` (its sockets; on the host's disk before `--session-box-size`)
/// holds at most its size: a filler meets ENOSPC and the result names the flag; with
/// `--session-box-size off` (the control) the same cell writes all 50 MiB. With its box full, the
/// session still hibernates and comes back holding 30 MiB (snapshots do not pass through it).
#[tokio::test(flavor = "multi_thread")]
async fn a_box_filler_meets_its_limit_and_bigger_sessions_still_hibernate() {
    require!(TestEnv);
    // SAFETY: geteuid has no preconditions.
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "the limits tests run as root"
    );
    let ws = tempfile::tempdir().unwrap();
    let saved = tempfile::tempdir().unwrap();
    let replica = format!("box-{:08x}", rand::random::<u32>());
    let service = |size: &'static str, hibernate: &'static str| {
        Service::start(
            ws.path(),
            &[("IPYBOX_TOKEN", TOKEN_A)],
            &[
                "--session-memory",
                "300M",
                "--session-box-size",
                size,
                "--hibernate-after",
                hibernate,
                "--warm-sessions",
                "0",
                "--replica-id",
                &replica,
                "--snapshot-dir",
                saved.path().to_str().unwrap(),
            ],
        )
    };
    // The control: no limit on box/.
    {
        let open = service("off", "3600");
        let client = connect(&open.url(), Some(TOKEN_A), Era::Handshake).await;
        let (is_error, text) = cell(&client, &box_filler(), None).await;
        assert!(!is_error, "{text}");
        assert_eq!(text, "mib=50 errno=None");
        client.close().await;
    }
    let bounded = service("4M", "1");
    assert!(
        bounded
            .log()
            .contains("kernel directory 4 MiB (--session-box-size)"),
        "{}",
        bounded.log()
    );
    let client = connect(&bounded.url(), Some(TOKEN_A), Era::Stateless).await;
    let (_, h) = new_session(&client, "blob = bytearray(30 << 20)\nblob[-1] = 7").await;
    let (is_error, text) = cell(&client, &box_filler(), Some(&h)).await;
    assert!(!is_error, "{text}");
    assert_eq!(
        text,
        format!(
            "mib=4 errno=28\n\n{BOX_NOTE}: it holds the kernel's sockets, and writes into it fail with ENOSPC (No space left on device). Remove what you wrote there and write files into the working directory instead."
        )
    );
    // Idle for a second: the session is saved and its kernel stopped.
    let deadline = Instant::now() + Duration::from_secs(60);
    while metric(bounded.port, Some(TOKEN_A), "ipybox_sessions_hibernated").await < 1.0 {
        assert!(
            Instant::now() < deadline,
            "never hibernated:\n{}",
            bounded.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (is_error, text) = cell(&client, "print(len(blob), blob[-1])", Some(&h)).await;
    assert!(!is_error, "{text}");
    assert!(
        text.starts_with("[ipybox] This session's kernel was restored from a snapshot")
            && text.ends_with("\n\n31457280 7"),
        "{text}"
    );
    client.close().await;
}
