//! Who a confined session's kernel is (issue 37, "An identity of its own"; docs/http.md "Who a
//! session's kernel is"): from a cell of `ipybox serve --http`, forked from the kernel factory
//! and started in bubblewrap (`--no-kernel-factory`), the seccomp filter refuses system calls a
//! kernel never needs (`ptrace`, `keyctl`, `unshare(CLONE_NEWUSER)`, `perf_event_open`,
//! `userfaultfd`, a non-standard `personality`) with EPERM and `clone3` with ENOSYS (threads
//! still start: glibc falls back to `clone`), and `/proc/self/status` shows the filter,
//! `no_new_privs` and no capabilities. The same probes with `--unconfined-sessions` (the
//! control): each call does what it does without the filter.

use std::path::Path;

use crate::http_support::*;
use crate::mcp_eras::Era;
use crate::support::*;

/// Each call in a child of the cell's process (a traced or unshared kernel would misbehave),
/// which exits with the call's errno (0: it succeeded); then the kernel's status lines.
const PROBE: &str = r#"import ctypes, errno, os, platform, threading
libc = ctypes.CDLL(None, use_errno=True)
x86 = platform.machine() == "x86_64"
calls = {
    "ptrace": (101 if x86 else 117, (0, 0, 0, 0)),
    "keyctl": (250 if x86 else 219, (0, -3, 0)),
    "unshare": (272 if x86 else 97, (0x10000000,)),
    "perf_event_open": (298 if x86 else 241, (0, 0, -1, -1, 0)),
    "userfaultfd": (323 if x86 else 282, (0,)),
    "personality": (135 if x86 else 92, (0x0040000,)),
    "clone3": (435, (0, 0)),
}
for name, (nr, args) in calls.items():
    pid = os.fork()
    if pid == 0:
        rc = libc.syscall(nr, *[ctypes.c_long(a) for a in args])
        os._exit(0 if rc >= 0 else min(ctypes.get_errno(), 255))
    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    print(f"{name}=" + ("ok" if code == 0 else errno.errorcode.get(code, str(code))))
t = threading.Thread(target=lambda: None)
t.start()
t.join()
print("thread=ok")
status = dict(l.split(":", 1) for l in open("/proc/self/status") if ":" in l)
print("Seccomp=" + status["Seccomp"].strip())
print("NoNewPrivs=" + status["NoNewPrivs"].strip())
print("CapEff=" + ("0" if int(status["CapEff"], 16) == 0 else "some"))
init = open("/proc/1/cmdline", "rb").read().split(b"\0")[0]
print("init=" + ("bwrap" if init.endswith(b"bwrap") else "python" if b"python" in init else "other"))
"#;

fn outcome(out: &str) -> std::collections::BTreeMap<String, String> {
    out.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

async fn probe(flags: &[&str]) -> std::collections::BTreeMap<String, String> {
    let ws = tempfile::tempdir().unwrap();
    let service = Service::start(ws.path(), &[("IPYBOX_TOKEN", TOKEN_A)], flags);
    let client = connect(&service.url(), Some(TOKEN_A), Era::Handshake).await;
    let (is_error, text) = cell(&client, PROBE, None).await;
    assert!(!is_error, "{flags:?}: {text}\n{}", service.log());
    outcome(&split_note(&text).0)
}

fn assert_outcome(
    flags: &[&str],
    got: &std::collections::BTreeMap<String, String>,
    want: &[(&str, &str)],
) {
    let want: std::collections::BTreeMap<String, String> = want
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    assert_eq!(got, &want, "{flags:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn confined_kernels_load_the_seccomp_filter_on_both_paths() {
    require!(TestEnv);
    for (flags, init) in [(&[][..], "python"), (&["--no-kernel-factory"][..], "bwrap")] {
        let got = probe(flags).await;
        assert_outcome(
            flags,
            &got,
            &[
                ("ptrace", "EPERM"),
                ("keyctl", "EPERM"),
                ("unshare", "EPERM"),
                ("perf_event_open", "EPERM"),
                ("userfaultfd", "EPERM"),
                ("personality", "EPERM"),
                ("clone3", "ENOSYS"),
                ("thread", "ok"),
                ("Seccomp", "2"),
                ("NoNewPrivs", "1"),
                ("CapEff", "0"),
                ("init", init),
            ],
        );
        // The control: the same probes where nothing filters them (ipybox runs as root here).
        let mut control: Vec<&str> = flags.to_vec();
        control.push("--unconfined-sessions");
        let got = probe(&control).await;
        let mut got = got;
        got.remove("init");
        assert_outcome(
            &control,
            &got,
            &[
                ("ptrace", "ok"),
                ("keyctl", "ok"),
                ("unshare", "ok"),
                // A null attribute: the call's own error, past any filter.
                ("perf_event_open", "EFAULT"),
                ("userfaultfd", "ok"),
                ("personality", "ok"),
                // A zero size: the call's own error.
                ("clone3", "EINVAL"),
                ("thread", "ok"),
                ("Seccomp", "0"),
                ("NoNewPrivs", "0"),
                ("CapEff", "some"),
            ],
        );
    }
}

/// What a session's kernel is, and what its uid lets it do.
fn identity_probe(key: &Path, open: &Path) -> String {
    format!(
        r#"import os, pwd
uid = os.getuid()
print(f"uid={{uid}}")
print("gid=" + ("uid" if os.getgid() == uid else str(os.getgid())))
print("groups=" + ",".join(map(str, os.getgroups())))
print("user=" + pwd.getpwuid(uid).pw_name)
for name, path in (("tmp", "/tmp/t"), ("home", os.path.expanduser("~/h")), ("work", "w.txt")):
    open(path, "w").write("x")
    print(f"{{name}}=" + ("own" if os.stat(path).st_uid == uid else "other"))
for name, path in (("key", {key:?}), ("open", {open:?})):
    try:
        open(path).read()
        print(f"{{name}}=read")
    except PermissionError:
        print(f"{{name}}=denied")
"#
    )
}

/// Issue 37's "an identity of its own": every confined session's kernel runs as a uid of its
/// own from `--session-uids` (forked and bubblewrap'd; one session of each MCP era), with that
/// gid alone, a name in `/etc/passwd`, and `/tmp`, `~` and its working directory writable, so
/// file permissions bind it: an operator's file shown to sessions (`--session-show`) with mode
/// 0600 is denied, a 0644 one read. The control, `--session-uids none`: the kernel is uid 0
/// (without capabilities, but the owner of root's files) and reads the 0600 file.
#[tokio::test(flavor = "multi_thread")]
async fn sessions_run_as_uids_of_their_own() {
    require!(TestEnv);
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        skip("a uid per session needs ipybox to run as root");
        return;
    }
    let probe = probe_dir_or_skip!("tenant-uid");
    let shown = probe.path().join("shown");
    std::fs::create_dir(&shown).unwrap();
    std::fs::set_permissions(&shown, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let (key, open) = (shown.join("key"), shown.join("open.txt"));
    for (path, mode) in [(&key, 0o600), (&open, 0o644)] {
        std::fs::write(path, "planted").unwrap();
        std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(mode)).unwrap();
    }
    let code = identity_probe(&key, &open);
    let shown = shown.display().to_string();
    let first = 1_879_048_192u64;
    for forked in [true, false] {
        for own_uids in [true, false] {
            let mut flags = vec!["--warm-sessions", "0", "--session-show", &shown];
            if !forked {
                flags.push("--no-kernel-factory");
            }
            if !own_uids {
                flags.extend(["--session-uids", "none"]);
            }
            let ws = tempfile::tempdir().unwrap();
            let service = Service::start(ws.path(), &[("IPYBOX_TOKEN", TOKEN_A)], &flags);
            let mut uids = Vec::new();
            for era in [Era::Handshake, Era::Stateless] {
                let client = connect(&service.url(), Some(TOKEN_A), era).await;
                let (is_error, text) = cell(&client, &code, None).await;
                assert!(!is_error, "{flags:?} {era:?}: {text}\n{}", service.log());
                let mut got = outcome(&split_note(&text).0);
                let uid: u64 = got.remove("uid").unwrap().parse().unwrap();
                uids.push(uid);
                if !own_uids {
                    // ipybox's own supplementary groups, whatever they are.
                    got.remove("groups");
                }
                let want: &[(&str, &str)] = if own_uids {
                    &[
                        ("gid", "uid"),
                        ("groups", ""),
                        ("user", "ipybox"),
                        ("tmp", "own"),
                        ("home", "own"),
                        ("work", "own"),
                        ("key", "denied"),
                        ("open", "read"),
                    ]
                } else {
                    &[
                        ("gid", "uid"),
                        ("user", "root"),
                        ("tmp", "own"),
                        ("home", "own"),
                        ("work", "own"),
                        ("key", "read"),
                        ("open", "read"),
                    ]
                };
                assert_outcome(&flags, &got, want);
            }
            if own_uids {
                assert!(
                    uids.iter().all(|u| (first..first + 65536).contains(u)),
                    "{flags:?}: {uids:?}"
                );
                assert_ne!(uids[0], uids[1], "{flags:?}: two sessions, one uid");
            } else {
                assert_eq!(uids, [0, 0], "{flags:?}");
            }
        }
    }
}

/// Sockets a kernel opens, one `name=outcome` line each (`ok` or the errno's name): families it
/// needs (AF_UNIX pairs, IPv4 and IPv6 UDP, netlink route, `getaddrinfo`) and families it does
/// not (AF_VSOCK with a bind: vsock ignores network namespaces; AF_PACKET; netlink sock_diag).
const SOCKETS: &str = r#"import errno, socket
def attempt(name, f):
    try:
        f()
        r = "ok"
    except OSError as e:
        r = errno.errorcode.get(e.errno, str(e.errno))
    print(f"{name}=" + r)
def vsock():
    with socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM) as s:
        s.bind((socket.VMADDR_CID_ANY, 47117))
attempt("vsock", vsock)
attempt("packet", lambda: socket.socket(socket.AF_PACKET, socket.SOCK_DGRAM).close())
attempt("netlink_diag", lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 4).close())
attempt("netlink_route", lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0).close())
attempt("unix_pair", lambda: [s.close() for s in socket.socketpair()])
attempt("inet", lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).close())
attempt("inet6", lambda: socket.socket(socket.AF_INET6, socket.SOCK_DGRAM).close())
attempt("getaddrinfo", lambda: socket.getaddrinfo("localhost", 80))
"#;

/// Issue 51: a confined kernel opens only the socket families it needs. From a cell, forked and
/// `--no-kernel-factory`: AF_VSOCK (and its bind), AF_PACKET and netlink other than route get
/// EAFNOSUPPORT, while AF_UNIX, IPv4, IPv6, netlink route and `getaddrinfo` work, and so does
/// the egress bridge (an HTTPS GET through the proxy) and the kernel itself (ZMQ over IPC: the
/// cell ran). The control, `--unconfined-sessions`: every one of them opens.
#[tokio::test(flavor = "multi_thread")]
async fn confined_kernels_open_only_the_socket_families_they_need() {
    require!(TestEnv);
    let pypi = "\nimport urllib.request\nprint('pypi=' + str(urllib.request.urlopen('https://pypi.org/simple/six/', timeout=20).status))\n";
    let code = format!("{SOCKETS}{pypi}");
    let run = |flags: Vec<&'static str>, era: Era| {
        let code = code.clone();
        async move {
            let ws = tempfile::tempdir().unwrap();
            let service = Service::start(ws.path(), &[], &flags);
            let client = connect(&service.url(), None, era).await;
            let (is_error, text) = cell(&client, &code, None).await;
            assert!(!is_error, "{flags:?}: {text}\n{}", service.log());
            (flags, outcome(&split_note(&text).0))
        }
    };
    let (forked, launched, control) = tokio::join!(
        run(vec![], Era::Handshake),
        run(vec!["--no-kernel-factory"], Era::Stateless),
        run(vec!["--unconfined-sessions"], Era::Handshake),
    );
    let needed = [
        ("netlink_route", "ok"),
        ("unix_pair", "ok"),
        ("inet", "ok"),
        ("inet6", "ok"),
        ("getaddrinfo", "ok"),
        ("pypi", "200"),
    ];
    for (flags, got) in [&forked, &launched] {
        let mut want = vec![
            ("vsock", "EAFNOSUPPORT"),
            ("packet", "EAFNOSUPPORT"),
            ("netlink_diag", "EAFNOSUPPORT"),
        ];
        want.extend(needed);
        assert_outcome(flags, got, &want);
    }
    let mut want = vec![("vsock", "ok"), ("packet", "ok"), ("netlink_diag", "ok")];
    want.extend(needed);
    assert_outcome(&control.0, &control.1, &want);
}

/// The pids of the host's processes whose real uid is `uid`.
fn processes_of(uid: u32) -> Vec<u32> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(status) = std::fs::read_to_string(entry.path().join("status")) else {
            continue;
        };
        let real = status
            .lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|r| r.split_whitespace().next()?.parse::<u32>().ok());
        if real == Some(uid) {
            pids.push(pid);
        }
    }
    pids
}

/// Issue 51: a uid is handed to a new session only once its previous session's processes are
/// gone. With a range of one uid: Alice's session has it (and a background process); Bob's
/// session cannot start while she holds it. A process with her uid outlives her session (the
/// test starts it on the host: one the kill missed); once her session has ended, Carol's
/// session is still refused and the log says the uid is kept out of the pool. The control:
/// once that process is gone, Dave's session gets the uid and runs.
#[tokio::test(flavor = "multi_thread")]
async fn a_uid_is_reused_only_once_its_sessions_processes_are_gone() {
    require!(TestEnv);
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        skip("a uid per session needs ipybox to run as root");
        return;
    }
    let uid: u32 = 1_879_500_000 + std::process::id() % 1000;
    let range = format!("{uid}-{uid}");
    let ws = tempfile::tempdir().unwrap();
    let service = Service::start(
        ws.path(),
        &[],
        &["--session-uids", &range, "--warm-sessions", "0"],
    );
    let who = "import os, subprocess\nsubprocess.Popen(['sleep', '600'], start_new_session=True)\nprint('uid=' + str(os.getuid()))\n";
    let alice = connect(&service.url(), None, Era::Handshake).await;
    let (is_error, text) = cell(&alice, who, None).await;
    assert!(!is_error, "{text}\n{}", service.log());
    assert!(text.contains(&format!("uid={uid}")), "{text}");
    let alices = processes_of(uid);
    assert!(!alices.is_empty());

    let bob = connect(&service.url(), None, Era::Stateless).await;
    let (is_error, text) = cell(&bob, "print('bob ran')", None).await;
    assert!(is_error && text.contains("is in use"), "{text}");
    assert!(!text.contains("bob ran"), "{text}");

    // A process of Alice's uid that outlives her session.
    let mut left = {
        use std::os::unix::process::CommandExt;
        std::process::Command::new("sleep")
            .arg("600")
            .uid(uid)
            .gid(uid)
            .spawn()
            .unwrap()
    };
    alice.close().await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while processes_of(uid).iter().any(|p| alices.contains(p)) {
        assert!(
            std::time::Instant::now() < deadline,
            "Alice's processes outlived her session:\n{}",
            service.log()
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    // Her session ended (its processes are gone, the lease given back) ...
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !service
        .log()
        .contains("a process still has it after its session ended")
    {
        assert!(
            std::time::Instant::now() < deadline,
            "no release of uid {uid} seen:\n{}",
            service.log()
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    // ... and still no one gets the uid while a process has it.
    let carol = connect(&service.url(), None, Era::Handshake).await;
    let (is_error, text) = cell(&carol, "print('carol ran')", None).await;
    assert!(is_error && text.contains("is in use"), "{text}");
    assert!(!text.contains("carol ran"), "{text}");

    // The control: that process gone, the uid is leased again.
    left.kill().unwrap();
    left.wait().unwrap();
    let dave = connect(&service.url(), None, Era::Stateless).await;
    let (is_error, text) = cell(&dave, who, None).await;
    assert!(!is_error, "{text}\n{}", service.log());
    assert!(text.contains(&format!("uid={uid}")), "{text}");
}
