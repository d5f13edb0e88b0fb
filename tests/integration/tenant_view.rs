//! A confined session's view of the host is built by allowlist (issue 37, items 1–3): from a
//! cell of `ipybox serve --http` (local kernels, the kernel factory's forked kernels and
//! `--no-kernel-factory`'s bwrap'd ones), operator files where an operator keeps them — a token
//! file under `/etc`, a session secret under `/srv` (both passed to ipybox), a TLS key and
//! another service's secret (never named to ipybox) — and `/etc/shadow` are absent, while the
//! kernel still works (CA certificates, name resolution, its user's name — `ipybox`, its own uid —, `/bin` tools) and
//! reads what the operator shows (`--session-show`, a directory and a file; a directory holding
//! a token file is refused). The same probe from an `--unconfined-sessions` service reads every
//! file.

use std::path::{Path, PathBuf};

use crate::http_support::*;
use crate::mcp_eras::Era;
use crate::support::*;

/// An operator's directory under a real system path (`/etc/ipybox-test-<pid>`), removed when
/// dropped. These are the operator's own places, not hidden-path probes of ipybox.
struct OperatorDir(PathBuf);

impl OperatorDir {
    fn new(parent: &str) -> Option<Self> {
        let dir = Path::new(parent).join(format!("ipybox-test-{}", std::process::id()));
        match std::fs::create_dir_all(&dir) {
            Ok(()) => Some(Self(dir)),
            Err(e) => {
                skip(&format!(
                    "cannot create {} ({e}): the test places operator files under /etc and /srv, as root",
                    dir.display()
                ));
                None
            }
        }
    }
}

impl Drop for OperatorDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// What the kernel needs of the host still works in the view.
const WORKS: &str = r#"
import os, pwd, socket, ssl, subprocess
ctx = ssl.create_default_context()
print("certs=" + str(ctx.cert_store_stats()["x509_ca"] > 0))
print("resolve=" + str(bool(socket.getaddrinfo("localhost", 80))))
print("user=" + pwd.getpwuid(os.getuid()).pw_name)
print("ls=" + str(subprocess.run(["ls", "/"], capture_output=True, text=True).returncode))
import numpy
print("numpy=" + str(int(numpy.arange(4).sum())))
"#;

#[tokio::test(flavor = "multi_thread")]
async fn a_confined_session_sees_only_the_allowlist() {
    require!(TestEnv);
    let (Some(etc), Some(srv)) = (OperatorDir::new("/etc"), OperatorDir::new("/srv")) else {
        return;
    };
    let tokens = etc.0.join("tokens");
    std::fs::write(&tokens, format!("# {PLANTED}\n{TOKEN_A}\n")).unwrap();
    let tls_key = etc.0.join("tls.key");
    std::fs::write(&tls_key, PLANTED).unwrap();
    let secret = srv.0.join("secret");
    std::fs::write(
        &secret,
        format!("{PLANTED}-session-secret-0123456789abcdef\n"),
    )
    .unwrap();
    std::fs::create_dir_all(srv.0.join("app")).unwrap();
    let app_secret = srv.0.join("app/secret.env");
    std::fs::write(&app_secret, PLANTED).unwrap();
    // What the operator shows with --session-show: a directory and a file.
    std::fs::create_dir_all(srv.0.join("shared")).unwrap();
    let shown_dir_file = srv.0.join("shared/data.txt");
    std::fs::write(&shown_dir_file, PLANTED).unwrap();
    let shown_file = srv.0.join("shown.txt");
    std::fs::write(&shown_file, PLANTED).unwrap();
    let probe = probe_dir_or_skip!("tenant-view");
    let ws = probe.path().join("ws");
    std::fs::create_dir(&ws).unwrap();
    std::fs::write(ws.join("visible.txt"), PLANTED).unwrap();
    let python = crate::support::root()
        .join("target/test-env/kernel-data/bin/python")
        .display()
        .to_string();
    let home = probe.path().join("home").display().to_string();
    let env = [
        ("IPYBOX_HOME", home.as_str()),
        ("IPYBOX_PYTHON", python.as_str()),
    ];
    let code = read_probe(&[
        ("workspace", &ws.join("visible.txt")),
        ("tokens", &tokens),
        ("secret", &secret),
        ("tls-key", &tls_key),
        ("app-secret", &app_secret),
        ("shadow", Path::new("/etc/shadow")),
        ("shown-dir", &shown_dir_file),
        ("shown-file", &shown_file),
    ]);
    let (tokens, secret) = (tokens.display().to_string(), secret.display().to_string());
    let (shown_dir, shown_file) = (
        srv.0.join("shared").display().to_string(),
        shown_file.display().to_string(),
    );
    // Showing a directory that holds an operator file is refused, naming it.
    let etc_dir = etc.0.display().to_string();
    let stderr = serve_refused(
        "127.0.0.1",
        &ws,
        &["--token-file", &tokens, "--session-show", &etc_dir],
        &[("IPYBOX_HOME", Some(home.as_str()))],
    );
    assert!(
        stderr.contains(&format!(
            "--session-show {etc_dir} would show ipybox's token file {tokens} to every session"
        )),
        "{stderr}"
    );
    for forked in [true, false] {
        for confined in [true, false] {
            let mut flags = vec![
                "--token-file",
                &tokens,
                "--session-secret-file",
                &secret,
                "--warm-sessions",
                "0",
                "--session-show",
                &shown_dir,
                "--session-show",
                &shown_file,
            ];
            if !forked {
                flags.push("--no-kernel-factory");
            }
            if !confined {
                flags.push("--unconfined-sessions");
            }
            let service = Service::start(&ws, &env, &flags);
            let client = connect(&service.url(), Some(TOKEN_A), Era::Stateless).await;
            let started = std::time::Instant::now();
            let (_, h) = new_session(&client, "print(1)").await;
            eprintln!(
                "session start (forked: {forked}, confined: {confined}): {:?}",
                started.elapsed()
            );
            let (is_error, out) = cell(&client, &code, Some(&h)).await;
            assert!(!is_error, "{out}");
            // /etc/shadow holds no planted text: `other` is read.
            let want = if confined {
                probe_outcome(&[
                    ("workspace", "read"),
                    ("tokens", "FileNotFoundError"),
                    ("secret", "FileNotFoundError"),
                    ("tls-key", "FileNotFoundError"),
                    ("app-secret", "FileNotFoundError"),
                    ("shadow", "FileNotFoundError"),
                    ("shown-dir", "read"),
                    ("shown-file", "read"),
                ])
            } else {
                probe_outcome(&[
                    ("workspace", "read"),
                    ("tokens", "read"),
                    ("secret", "read"),
                    ("tls-key", "read"),
                    ("app-secret", "read"),
                    ("shadow", "other"),
                    ("shown-dir", "read"),
                    ("shown-file", "read"),
                ])
            };
            assert_eq!(
                split_note(&out).0,
                want,
                "forked: {forked}, confined: {confined}"
            );
            // The host's top directories an allowlist leaves out (those this host has): the
            // control is the same listing from an unconfined session, which shows each.
            let probe_top = probe
                .path()
                .components()
                .nth(1)
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .expect("the probe directory is below a top directory");
            // Where runtime directories live (`$XDG_RUNTIME_DIR` when it is a directory, else
            // `$TMPDIR`, else /tmp: the test command's long base is under /var/tmp): its top
            // directory holds the session's runtime directory, bound into the view.
            let runtime_top = ["XDG_RUNTIME_DIR", "TMPDIR"]
                .into_iter()
                .filter_map(std::env::var_os)
                .map(std::path::PathBuf::from)
                .find(|p| p.is_dir())
                .unwrap_or_else(|| "/tmp".into())
                .components()
                .nth(1)
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .unwrap_or_default();
            let left_out: Vec<&str> = ["opt", "home", "var", "boot", "mnt", "media"]
                .into_iter()
                // The probe directory's and the runtime base's top directories are mount
                // points of shown paths (`/var` when probes go to
                // /var/lib/ipyprobe).
                .filter(|d| *d != probe_top && *d != runtime_top && Path::new("/").join(d).is_dir())
                .collect();
            assert!(
                left_out.len() >= 3,
                "this host has too few of the usual top directories to tell an allowlist: {left_out:?}"
            );
            let (is_error, out) = cell(
                &client,
                "import os\nprint(' '.join(sorted(os.listdir('/'))))",
                Some(&h),
            )
            .await;
            assert!(!is_error, "{out}");
            let root = split_note(&out).0;
            for dir in &left_out {
                assert_eq!(
                    root.split(' ').any(|e| e == *dir),
                    !confined,
                    "forked: {forked}, confined: {confined}: /{dir} in the view: {root}"
                );
            }
            if confined {
                let (is_error, out) = cell(&client, WORKS, Some(&h)).await;
                assert!(!is_error, "forked: {forked}\n{out}");
                let out = split_note(&out).0;
                let lines: Vec<&str> = out.lines().collect();
                assert_eq!(
                    lines[..5],
                    [
                        "certs=True",
                        "resolve=True",
                        "user=ipybox",
                        "ls=0",
                        "numpy=6"
                    ],
                    "forked: {forked}\n{out}"
                );
            }
            client.close().await;
        }
    }
}

/// What a session learns of another from its own mount table (issue 51): Alice's session runs
/// (its work directory's tmpfs mounted, its uid leased), then Bob's kernel starts and reads
/// `/proc/self/mountinfo`. Confined, forked and `--no-kernel-factory`: nothing names Alice's
/// runtime directory or her uid, while Bob's own runtime directory is listed (the table is
/// read, and names runtime directories the way searched for). The control: the host's mount
/// table at that moment lists Alice's work directory with its runtime directory and `uid=`.
#[tokio::test(flavor = "multi_thread")]
async fn a_sessions_mount_table_names_no_other_session() {
    require!(TestEnv);
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        skip("work directories are tmpfs mounts, and sessions have uids of their own, as root");
        return;
    }
    const WHO: &str = "import os\nprint('cwd=' + os.getcwd())\nprint('uid=' + str(os.getuid()))\n";
    // The mounts that could name another session: under the directory runtime directories
    // live in, or with a `uid=` option (the whole table is longer than a result shows).
    const TABLE: &str = "base = os.path.dirname(os.path.dirname(os.getcwd()))\nprint('table=' + ' | '.join(l for l in open('/proc/self/mountinfo').read().splitlines() if base in l or 'uid=' in l))\n";
    for flags in [
        &["--warm-sessions", "0"][..],
        &["--warm-sessions", "0", "--no-kernel-factory"],
    ] {
        let ws = tempfile::tempdir().unwrap();
        let service = Service::start(ws.path(), &[], flags);
        let alice = connect(&service.url(), None, Era::Handshake).await;
        let (is_error, text) = cell(&alice, WHO, None).await;
        assert!(!is_error, "{text}");
        let a = outcome(&split_note(&text).0);
        let a_runtime = std::path::Path::new(&a["cwd"])
            .parent()
            .and_then(|p| p.file_name())
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let a_uid = format!("uid={}", a["uid"]);
        let bob = connect(&service.url(), None, Era::Stateless).await;
        let (is_error, text) = cell(&bob, &format!("{WHO}{TABLE}"), None).await;
        assert!(!is_error, "{text}");
        let b = outcome(&split_note(&text).0);
        let b_runtime = std::path::Path::new(&b["cwd"])
            .parent()
            .and_then(|p| p.file_name())
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let table = &b["table"];
        assert_ne!(a_runtime, b_runtime);
        // The control: the host's table lists Alice's work directory, by name and uid.
        let host = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let alices = host
            .lines()
            .find(|l| l.contains(&a_runtime))
            .unwrap_or_else(|| panic!("{flags:?}: no mount of {a_runtime} on the host:\n{host}"));
        assert!(alices.contains(&a_uid), "{alices}");
        // Bob's own is in his table; nothing of Alice's is.
        assert!(table.contains(&b_runtime), "{flags:?}: {table}");
        assert!(
            !table.contains(&a_runtime),
            "{flags:?}: Alice's {a_runtime} in Bob's table: {table}"
        );
        assert!(
            !table.contains(&a_uid),
            "{flags:?}: Alice's {a_uid} in Bob's table: {table}"
        );
        alice.close().await;
    }
}

fn outcome(out: &str) -> std::collections::BTreeMap<String, String> {
    out.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}
