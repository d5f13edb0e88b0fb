//! Who a confined session's kernel is (issue 37, "An identity of its own"; docs/http.md "Who a
//! session's kernel is"): from a cell of `ipybox serve --http`, forked from the kernel factory
//! and started in bubblewrap (`--no-kernel-factory`), the seccomp filter refuses system calls a
//! kernel never needs (`ptrace`, `keyctl`, `unshare(CLONE_NEWUSER)`, `perf_event_open`,
//! `userfaultfd`, a non-standard `personality`) with EPERM and `clone3` with ENOSYS (threads
//! still start: glibc falls back to `clone`), and `/proc/self/status` shows the filter,
//! `no_new_privs` and no capabilities. The same probes with `--unconfined-sessions` (the
//! control): each call does what it does without the filter.

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
