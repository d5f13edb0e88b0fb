//! Sessions of `ipybox serve --http` (local kernels) that cannot reach each other: hostile code
//! in one session's real kernel tries what issue 27 found working — another session's
//! connection file, IPC sockets and tool socket (with `jupyter_client`), poisoning a warm kernel
//! that a later session gets, planting files in shared places (the workspace's `mcptools/` and
//! `sitecustomize.py`, `.pth` files, IPython startup files, user site-packages, the kernel
//! environment), signals and `/proc` of ipybox (its token and handle key) — between two
//! sessions of one token and between tokens with `--trust-tenants`, with a client of each MCP
//! era. The same attack succeeds with `--unconfined-sessions` (so the test can fail), which is
//! refused without bubblewrap unless named.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::http_support::*;
use crate::mcp_eras::Era;
use crate::support::*;

const SECRET: &str = "session-secret-0123456789abcdef";

/// A Python string literal of `s` (JSON's is one).
fn py(s: &str) -> String {
    serde_json::to_string(s).unwrap()
}

/// Runs `code` in `session`; the output, asserting it did not fail.
async fn run_ok(
    client: &impl crate::mcp_eras::CallTool,
    code: &str,
    session: Option<&str>,
) -> String {
    let (is_error, text) = cell(client, code, session).await;
    assert!(!is_error, "{code}\n---\n{text}");
    split_note(&text).0
}

/// The runtime directory of a session's executor, as its kernel sees it (the same path on the
/// host): the directory of its tool socket.
async fn runtime_of(client: &impl crate::mcp_eras::CallTool, session: Option<&str>) -> PathBuf {
    let out = run_ok(
        client,
        "import os\nprint(os.path.dirname(os.environ['IPYBOX_TOOL_SOCKET']))",
        session,
    )
    .await;
    PathBuf::from(out.trim())
}

/// The connection file of the (one) kernel of the executor whose runtime directory is `runtime`.
fn connection_file(runtime: &Path) -> PathBuf {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let found = std::fs::read_dir(runtime.join("kernels"))
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path().join("connection.json"))
            .find(|p| p.exists());
        if let Some(file) = found {
            return file;
        }
        assert!(
            Instant::now() < deadline,
            "no kernel in {}",
            runtime.display()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Hostile code: with the victim's runtime directory and connection file (read by the host: the
/// attacker is even given the key), list the runtime directories, read the file, connect to the
/// tool socket, and run `victim_code` in the victim's kernel over its IPC sockets. Prints one
/// `key=value` line per attempt.
fn attack(victim_runtime: &Path, victim_code: &str) -> String {
    let conn = std::fs::read_to_string(connection_file(victim_runtime)).unwrap();
    let runtime = victim_runtime.display().to_string();
    format!(
        r#"import json, os, socket
R = {runtime}
def attempt(name, f):
    try:
        print(f"{{name}}=" + str(f()))
    except Exception as e:
        print(f"{{name}}=" + type(e).__name__)
attempt("listing", lambda: os.path.basename(R) in os.listdir(os.path.dirname(R)))
attempt("conn", lambda: len(open(R + "/kernels/" + os.listdir(R + "/kernels")[0] + "/connection.json").read()) > 0)
def tools():
    s = socket.socket(socket.AF_UNIX)
    s.connect(R + "/tools.sock")
    return "connected"
attempt("tools", tools)
def kernel():
    from jupyter_client import BlockingKernelClient
    c = BlockingKernelClient()
    c.load_connection_info(json.loads({conn}))
    c.start_channels()
    out = []
    def hook(msg):
        if msg["msg_type"] == "stream":
            out.append(msg["content"]["text"])
    try:
        c.execute_interactive({code}, timeout=5, output_hook=hook)
    except TimeoutError:
        return "no answer"
    finally:
        c.stop_channels()
    return "ran:" + "".join(out).strip()
attempt("kernel", kernel)
"#,
        runtime = py(&runtime),
        conn = py(&conn),
        code = py(victim_code),
    )
}

/// The `key=value` lines of an attack's output.
fn outcome(out: &str) -> std::collections::BTreeMap<String, String> {
    out.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn expect(out: &str, want: &[(&str, &str)]) {
    let got = outcome(out);
    for (k, v) in want {
        assert_eq!(got.get(*k).map(String::as_str), Some(*v), "{k} in:\n{out}");
    }
}

/// Two sessions of one token (one client per era), and a session of another token: none
/// reaches another's kernel, files or tool socket, nor a warm kernel, nor ipybox's process.
/// The runtime directories live where a kernel would see them if ipybox did not hide them
/// (`$XDG_RUNTIME_DIR` in a probe directory, not `/tmp`, which every confined kernel sees
/// empty anyway); the control, in the same test, is the same attack from an
/// `--unconfined-sessions` service on the same place, which reaches all of it.
#[tokio::test(flavor = "multi_thread")]
async fn sessions_cannot_reach_each_other() {
    require!(TestEnv);
    let runtime = Probe::new("rt");
    for confined in [true, false] {
        reach_each_other(runtime.path(), confined).await;
    }
}

async fn reach_each_other(runtime_base: &Path, confined: bool) {
    let ws = tempfile::tempdir().unwrap();
    let base = runtime_base.display().to_string();
    let mut flags = vec![
        "--token",
        TOKEN_B,
        "--trust-tenants",
        "--warm-sessions",
        "1",
    ];
    if !confined {
        flags.push("--unconfined-sessions");
    }
    let service = Service::start(
        ws.path(),
        &[
            ("IPYBOX_TOKEN", TOKEN_A),
            ("IPYBOX_SESSION_SECRET", SECRET),
            ("XDG_RUNTIME_DIR", &base),
        ],
        &flags,
    );
    let victim = connect(&service.url(), Some(TOKEN_A), Era::Stateless).await;
    let attacker = connect(&service.url(), Some(TOKEN_A), Era::Handshake).await;
    let tenant = connect(&service.url(), Some(TOKEN_B), Era::Stateless).await;
    let (_, v) = new_session(&victim, "secret_value = 'victim-42'").await;
    let (_, t) = new_session(&tenant, "pass").await;
    let victim_runtime = runtime_of(&victim, Some(&v)).await;
    let attacker_runtime = runtime_of(&attacker, None).await;
    let tenant_runtime = runtime_of(&tenant, Some(&t)).await;
    assert_ne!(victim_runtime, attacker_runtime);
    for dir in [&victim_runtime, &attacker_runtime, &tenant_runtime] {
        assert!(
            dir.starts_with(runtime_base),
            "{} is not under $XDG_RUNTIME_DIR {base}",
            dir.display()
        );
    }

    // (1) Another session's connection file, IPC sockets and tool socket: absent (the
    // control: all there, and the victim's kernel runs the attacker's code).
    let want: &[(&str, &str)] = if confined {
        &[
            ("listing", "False"),
            ("conn", "FileNotFoundError"),
            ("tools", "FileNotFoundError"),
            ("kernel", "no answer"),
        ]
    } else {
        &[
            ("listing", "True"),
            ("conn", "True"),
            ("tools", "connected"),
            ("kernel", "ran:victim-42"),
        ]
    };
    for (who, client, session) in [
        ("the same token", &attacker as &dyn Client, None),
        ("another token", &tenant as &dyn Client, Some(t.as_str())),
    ] {
        let out = client
            .run(&attack(&victim_runtime, "print(secret_value)"), session)
            .await;
        eprintln!("confined: {confined}: {who}: {out}");
        expect(&out, want);
    }
    assert_eq!(
        run_ok(&victim, "print(secret_value)", Some(&v)).await,
        "victim-42"
    );

    // (2) The warm kernel (the runtime directory that is neither session's): unreachable, so a
    // hook planted in it cannot reach the session that takes it (the control: it does).
    let base = victim_runtime.parent().unwrap();
    // The runtime directories of the shared factory's executors (`s-<6 hex>`, in the factory's
    // own `ipybox-<pid>-<6 hex>`).
    assert!(
        base.file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with(&format!("ipybox-{}-", service.pid())),
        "{}",
        base.display()
    );
    let prefix = "s-";
    let deadline = Instant::now() + Duration::from_secs(30);
    let warm = loop {
        let others: Vec<PathBuf> = std::fs::read_dir(base)
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(prefix))
            .map(|e| e.path())
            .filter(|p| ![&victim_runtime, &attacker_runtime, &tenant_runtime].contains(&p))
            .collect();
        if let [one] = &others[..]
            && one
                .join("kernels")
                .read_dir()
                .is_ok_and(|mut d| d.next().is_some())
        {
            break one.clone();
        }
        assert!(Instant::now() < deadline, "no warm kernel: {others:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let poison = "import builtins\nbuiltins.POISONED = True\nprint('planted')";
    let out = run_ok(&attacker, &attack(&warm, poison), None).await;
    if confined {
        expect(
            &out,
            &[("conn", "FileNotFoundError"), ("kernel", "no answer")],
        );
    } else {
        expect(&out, &[("conn", "True"), ("kernel", "ran:planted")]);
    }
    let next = connect(&service.url(), Some(TOKEN_B), Era::Handshake).await;
    let out = run_ok(
        &next,
        "import builtins\nprint(hasattr(builtins, 'POISONED'))",
        None,
    )
    .await;
    assert_eq!(out, if confined { "False" } else { "True" });
    assert_eq!(
        runtime_of(&next, None).await,
        warm,
        "the new session took the warm kernel"
    );

    // (3) ipybox's process and its secrets: no host pid in the kernel's /proc (the control
    // signals ipybox and sees its /proc), and none of the tokens or the handle key anywhere it
    // can read (ipybox keeps them out of its command line and environment: the same there).
    let scan = format!(
        r#"import os
pid = {pid}
try:
    os.kill(pid, 0)
    print("signal=sent")
except Exception as e:
    print("signal=" + type(e).__name__)
print("proc=" + str(os.path.exists(f"/proc/{{pid}}")))
hits = []
for p in os.listdir("/proc"):
    for f in ("environ", "cmdline"):
        try:
            data = open(f"/proc/{{p}}/{{f}}", "rb").read()
        except Exception:
            continue
        for s in ({a}, {b}, {secret}):
            if s.encode() in data:
                hits.append(f"{{p}}/{{f}}")
print("hits=" + ",".join(hits))
print("pids=" + str(sorted(int(p) for p in os.listdir("/proc") if p.isdigit())[-1] < 100))"#,
        pid = service.pid(),
        a = py(TOKEN_A),
        b = py(TOKEN_B),
        secret = py(SECRET),
    );
    let out = run_ok(&attacker, &scan, None).await;
    if confined {
        expect(
            &out,
            &[
                ("signal", "ProcessLookupError"),
                ("proc", "False"),
                ("hits", ""),
                ("pids", "True"),
            ],
        );
    } else {
        expect(&out, &[("signal", "sent"), ("proc", "True")]);
    }

    victim.close().await;
    attacker.close().await;
    tenant.close().await;
    next.close().await;
}

/// Files a session writes in shared places: the workspace (`mcptools/`, `sitecustomize.py`, a
/// `.pth`), IPython startup files, user site-packages, the kernel environment. Each write is
/// refused or lands in the session's own view; the next session (another token) sees none of
/// it, and runs none of it. A session's own files go to its working directory, which the host
/// removes when the session closes.
#[tokio::test(flavor = "multi_thread")]
async fn planted_files_reach_no_other_session() {
    require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    std::fs::write(
        ws.path().join(".env"),
        "KERNEL_ENV_SHARED=yes\nAPI_KEY=host-only-credential\n",
    )
    .unwrap();
    let service = Service::start(
        ws.path(),
        &[("IPYBOX_TOKEN", TOKEN_A)],
        &[
            "--token-file",
            &token_file(TOKEN_B).display().to_string(),
            "--trust-tenants",
        ],
    );
    let attacker = connect(&service.url(), Some(TOKEN_A), Era::Stateless).await;
    let ws_lit = py(&ws.path().display().to_string());
    let plant = format!(
        r#"import os, site, sys, sysconfig
ws = {ws_lit}
targets = {{
    "mcptools": os.path.join(ws, "mcptools", "evil", "__init__.py"),
    "sitecustomize": os.path.join(ws, "sitecustomize.py"),
    "ws_pth": os.path.join(ws, "evil.pth"),
    "startup": os.path.expanduser("~/.ipython/profile_default/startup/00-evil.py"),
    "user_site": os.path.join(site.getusersitepackages(), "evil.pth"),
    "venv": os.path.join(sysconfig.get_paths()["purelib"], "evil.pth"),
}}
for name, path in targets.items():
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write("import builtins; builtins.PLANTED = True\n")
        print(name + "=written")
    except OSError as e:
        print(name + "=" + type(e).__name__ + ":" + str(e.errno))
try:
    print("dotenv=" + open(os.path.join(ws, ".env")).read())
except OSError as e:
    print("dotenv=" + type(e).__name__)
print("env=" + os.environ.get("SHARED", "") + os.environ.get("API_KEY", ""))
open("mine.txt", "w").write("kept for this session")
print("cwd=" + os.getcwd())"#
    );
    let (_, h) = new_session(&attacker, &plant).await;
    let out = run_ok(&attacker, "print(open('mine.txt').read())", Some(&h)).await;
    assert_eq!(out, "kept for this session");
    let out = run_ok(&attacker, &plant, Some(&h)).await;
    let got = outcome(&out);
    let erofs = format!("OSError:{}", libc::EROFS);
    for name in ["mcptools", "sitecustomize", "ws_pth", "venv"] {
        assert_eq!(got[name], erofs, "{name}:\n{out}");
    }
    // Private to the kernel (its own HOME): written, seen by nobody else.
    assert_eq!(got["startup"], "written", "{out}");
    assert_eq!(got["user_site"], "written", "{out}");
    // The workspace's `.env` cannot be read by kernels; KERNEL_ENV_ variables still reach them.
    assert_eq!(got["dotenv"], "PermissionError", "{out}");
    assert_eq!(got["env"], "yes", "{out}");
    let cwd = PathBuf::from(&got["cwd"]);
    assert!(cwd.ends_with("work"), "{out}");
    assert_eq!(
        std::fs::read_to_string(cwd.join("mine.txt")).unwrap(),
        "kept for this session"
    );
    assert!(!ws.path().join("mine.txt").exists());
    for planted in ["mcptools", "sitecustomize.py", "evil.pth"] {
        assert!(!ws.path().join(planted).exists(), "{planted}");
    }

    // The next session (another token, the other era) runs none of it, and sees neither the
    // planted files nor the first session's directory.
    let next = connect(&service.url(), Some(TOKEN_B), Era::Handshake).await;
    let check = format!(
        r#"import builtins, os, site
print("planted=" + str(hasattr(builtins, "PLANTED")))
print("startup=" + str(os.path.exists(os.path.expanduser("~/.ipython/profile_default/startup/00-evil.py"))))
print("user_site=" + str(os.path.exists(os.path.join(site.getusersitepackages(), "evil.pth"))))
print("other=" + str(os.path.exists({other})))
try:
    import mcptools.evil
    print("import=imported")
except ImportError:
    print("import=ImportError")"#,
        other = py(&cwd.join("mine.txt").display().to_string())
    );
    let out = run_ok(&next, &check, None).await;
    expect(
        &out,
        &[
            ("planted", "False"),
            ("startup", "False"),
            ("user_site", "False"),
            ("other", "False"),
            ("import", "ImportError"),
        ],
    );
    // The first session's directory goes when it closes (here: at shutdown).
    next.close().await;
    attacker.close().await;
    let mut service = service;
    let (status, _) = service.terminate(Duration::from_secs(20));
    assert!(status.success(), "{status}");
    assert!(
        !cwd.exists(),
        "{} left after the service stopped",
        cwd.display()
    );
}

/// The same attack with `--unconfined-sessions`: it works (what confinement prevents), though
/// the secrets stay out of reach; and without bubblewrap `serve --http` refuses to start unless
/// that flag is named.
#[tokio::test(flavor = "multi_thread")]
async fn unconfined_sessions_are_an_explicit_choice() {
    require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    // No bwrap on PATH: refused, with the install command and the flag.
    let stderr = serve_refused(
        "127.0.0.1",
        ws.path(),
        &[],
        &[("PATH", Some("/nonexistent"))],
    );
    assert!(
        stderr.contains("cannot confine kernels: bubblewrap (`bwrap`) is not on PATH")
            && stderr.contains("apt-get install bubblewrap")
            && stderr.contains("pass --unconfined-sessions"),
        "{stderr}"
    );

    // An MCP server the sessions call (a host child of ipybox): it must not get the secrets.
    register_fixture(ws.path());
    let service = Service::start(
        ws.path(),
        &[
            ("PATH", "/nonexistent"),
            ("IPYBOX_SESSION_SECRET", SECRET),
            ("IPYBOX_TOKEN", TOKEN_B),
        ],
        &[
            "--unconfined-sessions",
            "--token",
            TOKEN_A,
            "--trust-tenants",
        ],
    );
    assert!(
        service
            .log()
            .contains("--unconfined-sessions: every session's code runs as this user"),
        "{}",
        service.log()
    );
    let victim = connect(&service.url(), Some(TOKEN_A), Era::Stateless).await;
    let attacker = connect(&service.url(), Some(TOKEN_A), Era::Handshake).await;
    let (_, v) = new_session(&victim, "secret_value = 'victim-42'").await;
    let victim_runtime = runtime_of(&victim, Some(&v)).await;
    let out = run_ok(
        &attacker,
        &attack(&victim_runtime, "print(secret_value)"),
        None,
    )
    .await;
    expect(
        &out,
        &[
            ("listing", "True"),
            ("conn", "True"),
            ("tools", "connected"),
            ("kernel", "ran:victim-42"),
        ],
    );
    // Its /proc entries are readable here (root, same user), but hold no secret.
    let scan = format!(
        r#"pid = {pid}
data = open(f"/proc/{{pid}}/cmdline", "rb").read() + open(f"/proc/{{pid}}/environ", "rb").read()
print("cmdline=" + str(b"--token" in data))
print("token=" + str({a}.encode() in data or {b}.encode() in data))
print("secret=" + str({secret}.encode() in data))"#,
        pid = service.pid(),
        a = py(TOKEN_A),
        b = py(TOKEN_B),
        secret = py(SECRET),
    );
    let out = run_ok(&attacker, &scan, None).await;
    expect(
        &out,
        &[("cmdline", "True"), ("token", "False"), ("secret", "False")],
    );
    let out = run_ok(
        &attacker,
        "from mcptools.fx import get_env\nfor name in ('IPYBOX_TOKEN', 'IPYBOX_SESSION_SECRET'):\n    print(name + '=' + get_env.run(get_env.Params(name=name)))",
        None,
    )
    .await;
    expect(
        &out,
        &[
            ("IPYBOX_TOKEN", "<unset>"),
            ("IPYBOX_SESSION_SECRET", "<unset>"),
        ],
    );
    victim.close().await;
    attacker.close().await;
}

/// A token file holding `token` (kept for the test's life).
fn token_file(token: &str) -> PathBuf {
    let dir = tempfile::tempdir().unwrap().keep();
    let file = dir.join("tokens");
    std::fs::write(&file, format!("{token}\n")).unwrap();
    file
}

/// A client of either era, for a loop over both.
trait Client {
    fn run<'a>(
        &'a self,
        code: &'a str,
        session: Option<&'a str>,
    ) -> futures::future::BoxFuture<'a, String>;
}

impl<H: rmcp::ClientHandler> Client for HttpClient<H> {
    fn run<'a>(
        &'a self,
        code: &'a str,
        session: Option<&'a str>,
    ) -> futures::future::BoxFuture<'a, String> {
        Box::pin(run_ok(self, code, session))
    }
}

/// A service with `flags` and `env`; a victim's session (a 2026-07-28 client) holds a secret,
/// whose runtime directory is under `base`; an attacker's session (handshake era) runs
/// [`attack`] on it. Returns the service, both clients and what the attack printed.
async fn attack_across(
    ws: &Path,
    env: &[(&str, &str)],
    flags: &[&str],
    base: &Path,
) -> (
    Service,
    crate::http_support::PlainHttp,
    crate::http_support::PlainHttp,
    String,
) {
    let service = Service::start(ws, env, flags);
    let victim = connect(&service.url(), Some(TOKEN_A), Era::Stateless).await;
    let attacker = connect(&service.url(), Some(TOKEN_A), Era::Handshake).await;
    let (_, v) = new_session(&victim, "secret_value = 'victim-42'").await;
    let victim_runtime = runtime_of(&victim, Some(&v)).await;
    assert!(victim_runtime.starts_with(base), "{victim_runtime:?}");
    let out = run_ok(
        &attacker,
        &attack(&victim_runtime, "print(secret_value)"),
        None,
    )
    .await;
    (service, victim, attacker, out)
}

/// `--sandbox` over HTTP: srt confines each session's kernel (its own pid namespace, `/tmp` and
/// `/run` hidden, and the place runtime directories live), and ipybox keeps the workspace from
/// being a channel: read-only to every session, which works in a directory of its own. The
/// runtime directories live where a kernel would see them if nothing hid them
/// (`$XDG_RUNTIME_DIR` in a probe directory, not `/tmp`, which srt shows a kernel empty
/// anyway); the control, in the same test, is the same attack from an unsandboxed
/// `--unconfined-sessions` service on the same place, which reaches the other session.
#[tokio::test(flavor = "multi_thread")]
async fn sandboxed_sessions_cannot_reach_each_other() {
    require!(TestEnv, SandboxDeps);
    // Not under /tmp (which srt shows a kernel empty): the workspace in the kernel's view is the
    // host's, so a refused write there is the workspace refusing it.
    let ws = probe_dir_or_skip!("sandboxed-ws");
    // The runtime base holds a sandboxed executor's sockets, the longest of them srt's proxy
    // bridges in a sandboxed install's scratch directory, with a seven-digit pid: a probe
    // directory short enough for them whatever the checkout's path.
    let longest = "/ipybox-4194304-000000/i000000/srt/claude-socks-0123456789abcdef.sock";
    let runtime = Probe::within("srt", ipybox::kernel::SOCKET_PATH_MAX - longest.len());
    let base = runtime.path().display().to_string();
    let srt = root().join("target/sandbox-deps/node_modules/.bin/srt");
    let srt = srt.display().to_string();
    let env = [
        ("IPYBOX_TOKEN", TOKEN_A),
        ("IPYBOX_SRT", srt.as_str()),
        ("XDG_RUNTIME_DIR", base.as_str()),
    ];
    // The control first: unsandboxed and unconfined, the attack reaches the other session.
    {
        let (_service, victim, attacker, out) = attack_across(
            ws.path(),
            &env,
            &["--unconfined-sessions", "--warm-sessions", "0"],
            runtime.path(),
        )
        .await;
        expect(
            &out,
            &[
                ("listing", "True"),
                ("conn", "True"),
                ("tools", "connected"),
                ("kernel", "ran:victim-42"),
            ],
        );
        victim.close().await;
        attacker.close().await;
    }
    let (_service, victim, attacker, out) = attack_across(
        ws.path(),
        &env,
        &["--sandbox", "--warm-sessions", "0"],
        runtime.path(),
    )
    .await;
    expect(
        &out,
        &[
            ("listing", "False"),
            ("conn", "FileNotFoundError"),
            ("tools", "FileNotFoundError"),
            ("kernel", "no answer"),
        ],
    );
    let plant = format!(
        r#"import os
try:
    os.makedirs(os.path.join({ws}, "mcptools", "evil"))
    print("mcptools=written")
except OSError as e:
    import errno
    print("mcptools=" + errno.errorcode.get(e.errno, type(e).__name__))
open("mine.txt", "w").write("mine")
print("cwd=" + os.getcwd())
print("pid=" + str(os.getpid() < 100))"#,
        ws = py(&ws.path().display().to_string())
    );
    let got = outcome(&run_ok(&attacker, &plant, None).await);
    // Refused as a read-only file system (the same code writes its own directory: below).
    assert_eq!(got["mcptools"], "EROFS", "{got:?}");
    assert!(!ws.path().join("mcptools").exists());
    assert!(got["cwd"].ends_with("/box/work"), "{got:?}");
    assert_eq!(got["pid"], "True");
    // The kernel's own file is in its working directory on the host, not in the workspace.
    assert_eq!(
        std::fs::read_to_string(Path::new(&got["cwd"]).join("mine.txt")).unwrap(),
        "mine"
    );
    assert!(!ws.path().join("mine.txt").exists());
    victim.close().await;
    attacker.close().await;
}

/// The shared kernel template (the default with local kernels): the service runs one template
/// (one bubblewrap, holding `CAP_SYS_ADMIN`) and every session's kernel is a fork of it that
/// confined itself. Hostile code in one session's kernel tries to reach the template and a
/// sibling kernel (signals, ptrace), the factory's socket, and to undo its view: unmount or
/// remount it without capabilities, and again with the capabilities a new user namespace
/// gives (`unshare(CLONE_NEWUSER|CLONE_NEWNS)`). Each attempt fails; the other session's
/// kernel is unharmed.
#[tokio::test(flavor = "multi_thread")]
async fn forked_kernels_cannot_reach_the_template_or_each_other() {
    require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    // The shared factory's directory where a kernel would see it if ipybox did not hide it
    // (`$XDG_RUNTIME_DIR` in a probe directory, not `/tmp`, which every confined kernel sees
    // empty anyway). The control (at the end): an `--unconfined-sessions` service on the same
    // place, whose kernels see the directory, the socket and the other session.
    let runtime = Probe::new("fork-rt");
    let base = runtime.path().display().to_string();
    let env = [
        ("IPYBOX_TOKEN", TOKEN_A),
        ("IPYBOX_SESSION_SECRET", SECRET),
        ("XDG_RUNTIME_DIR", base.as_str()),
    ];
    let service = Service::start(ws.path(), &env, &["--warm-sessions", "1"]);
    let victim = connect(&service.url(), Some(TOKEN_A), Era::Stateless).await;
    let attacker = connect(&service.url(), Some(TOKEN_A), Era::Handshake).await;
    let (_, v) = new_session(&victim, "secret_value = 'victim-42'").await;
    let own = runtime_of(&attacker, None).await;
    let victim_runtime = runtime_of(&victim, Some(&v)).await;
    // Both runtime directories live in the shared factory's directory, next to its socket.
    let shared = own.parent().unwrap().to_path_buf();
    assert!(shared.starts_with(runtime.path()), "{}", shared.display());
    assert_eq!(victim_runtime.parent(), Some(shared.as_path()));
    let sock = shared.join("factory").join("sock");
    assert!(sock.exists(), "no factory socket at {}", sock.display());
    // Every process of the service (the template's bubblewrap and template, each kernel's
    // outer process, init and kernel): no bubblewrap but the template's, so the kernels were
    // forked.
    let host: Vec<u32> = crate::proc_tree::descendants(service.pid());
    let cmdline = |p: &u32| {
        std::fs::read(format!("/proc/{p}/cmdline"))
            .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
            .unwrap_or_default()
    };
    let bwraps: Vec<String> = host
        .iter()
        .map(cmdline)
        .filter(|c| c.split(' ').next().is_some_and(|a| a.ends_with("bwrap")))
        .collect();
    // (bubblewrap forks itself: an outer process and pid 1 of the template's namespace.)
    assert!(
        !bwraps.is_empty() && bwraps.iter().all(|c| c.contains("ipybox_runtime.factory")),
        "only the template's bubblewrap: {bwraps:?}"
    );
    assert!(
        !service.log().contains("kernel factory:"),
        "{}",
        service.log()
    );
    // Pids a kernel's own namespace may also have (it has a few) are left out.
    let host: Vec<String> = host
        .iter()
        .filter(|p| **p > 100)
        .map(u32::to_string)
        .collect();
    assert!(host.len() >= 4, "{host:?}");
    let host = host.join(",");
    // What a kernel sees of the shared directory: its own runtime directory, and the
    // template's (read-only) copy of ipybox's kernel-side Python its modules came from.
    let mut own_name = [
        own.file_name().unwrap().to_string_lossy().into_owned(),
        "python".into(),
    ];
    own_name.sort();
    let own_name = own_name.join(",");
    let prelude = format!(
        r#"import ctypes, errno, os, socket, subprocess, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
HOST = [{host}]
SHARED = {shared}
SOCK = {sock}
def err(rc):
    return "ok" if rc == 0 else errno.errorcode.get(ctypes.get_errno(), "?")
def kill(pid):
    try:
        os.kill(pid, 0)
        return "ok"
    except OSError as e:
        return errno.errorcode[e.errno]
def status():
    return {{k: v.strip() for k, v in (l.split(":", 1) for l in open("/proc/self/status") if ":" in l)}}
"#,
        shared = py(&shared.display().to_string()),
        sock = py(&sock.display().to_string()),
    );
    let kernel = format!(
        r#"{prelude}
print("signal=" + ",".join(sorted({{kill(p) for p in HOST}})))
print("ptrace=" + ",".join(sorted({{err(libc.ptrace(16, p, None, None)) for p in HOST}})))
print("ptrace_init=" + err(libc.ptrace(16, 1, None, None)))
s = status()
print("caps=" + ",".join(sorted({{s[f] for f in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")}})))
print("nnp=" + s["NoNewPrivs"])
print("shared=" + ",".join(sorted(os.listdir(SHARED))))
print("sock=" + str(os.path.exists(SOCK)))
try:
    socket.socket(socket.AF_UNIX).connect(SOCK)
    print("connect=ok")
except Exception as e:
    print("connect=" + type(e).__name__)
print("umount=" + err(libc.umount2(SHARED.encode(), 2)))
print("remount=" + err(libc.mount(None, b"/", None, 32 | 4096, None)))
print("tmpfs=" + err(libc.mount(b"tmpfs", b"/tmp", b"tmpfs", 0, None)))
"#
    );
    let out = run_ok(&attacker, &kernel, None).await;
    expect(
        &out,
        &[
            ("signal", "ESRCH"),
            // The seccomp filter refuses ptrace before the pid is looked up (docs/http.md
            // "Who a session's kernel is").
            ("ptrace", "EPERM"),
            ("ptrace_init", "EPERM"),
            ("caps", "0000000000000000"),
            ("nnp", "1"),
            ("shared", &own_name),
            ("sock", "False"),
            ("connect", "FileNotFoundError"),
            ("umount", "EPERM"),
            ("remount", "EPERM"),
            ("tmpfs", "EPERM"),
        ],
    );
    // A process of its own (one thread: unshare refuses a threaded caller) takes a new user
    // and mount namespace, where it holds every capability, and tries again.
    let child = format!(
        r#"{prelude}
print("unshare=" + err(libc.unshare(0x10000000 | 0x00020000)))
print("userns_caps=" + str(int(status()["CapEff"], 16) != 0))
print("umount2=" + err(libc.umount2(SHARED.encode(), 0)))
print("detach2=" + err(libc.umount2(SHARED.encode(), 2)))
print("remount2=" + err(libc.mount(None, b"/", None, 32 | 4096, None)))
print("shared2=" + ",".join(sorted(os.listdir(SHARED))))
print("hostname2=" + err(libc.sethostname(b"x", 1)))
print("signal2=" + ",".join(sorted({{kill(p) for p in HOST}})))
"#
    );
    let out = run_ok(
        &attacker,
        &format!(
            "import subprocess, sys\nr = subprocess.run([sys.executable, '-c', {}], capture_output=True, text=True)\nprint(r.stdout + r.stderr)",
            py(&child)
        ),
        None,
    )
    .await;
    expect(
        &out,
        &[
            // The seccomp filter refuses a new user namespace (and umount2) outright; without
            // it the namespace is made but the inherited mounts stay locked (EINVAL).
            ("unshare", "EPERM"),
            ("userns_caps", "False"),
            ("umount2", "EPERM"),
            ("detach2", "EPERM"),
            ("remount2", "EPERM"),
            ("shared2", &own_name),
            ("hostname2", "EPERM"),
            ("signal2", "ESRCH"),
        ],
    );
    assert_eq!(
        run_ok(&victim, "print(secret_value)", Some(&v)).await,
        "victim-42"
    );
    victim.close().await;
    attacker.close().await;
    drop(service);

    // The control: the same place, kernels forked unconfined. The attacker's kernel sees the
    // shared directory (the victim's runtime directory, the factory's), the socket, and
    // reaches ipybox's processes (signal 0 only: nothing here may harm the host).
    let service = Service::start(
        ws.path(),
        &env,
        &["--warm-sessions", "1", "--unconfined-sessions"],
    );
    let victim = connect(&service.url(), Some(TOKEN_A), Era::Stateless).await;
    let attacker = connect(&service.url(), Some(TOKEN_A), Era::Handshake).await;
    let (_, v) = new_session(&victim, "pass").await;
    let own = runtime_of(&attacker, None).await;
    let victim_runtime = runtime_of(&victim, Some(&v)).await;
    let shared = own.parent().unwrap().to_path_buf();
    assert_eq!(victim_runtime.parent(), Some(shared.as_path()));
    assert!(shared.starts_with(runtime.path()), "{}", shared.display());
    let sock = shared.join("factory").join("sock");
    let host: Vec<String> = crate::proc_tree::descendants(service.pid())
        .iter()
        .map(u32::to_string)
        .collect();
    let control = format!(
        r#"import os, socket
SHARED = {shared}
SOCK = {sock}
def kill(pid):
    try:
        os.kill(pid, 0)
        return "ok"
    except OSError as e:
        return type(e).__name__
print("signal=" + ",".join(sorted({{kill(p) for p in [{host}]}})))
print("victim=" + str({victim} in os.listdir(SHARED)))
print("factory=" + str("factory" in os.listdir(SHARED)))
print("sock=" + str(os.path.exists(SOCK)))
s = socket.socket(socket.AF_UNIX)
s.connect(SOCK)
s.close()
print("connect=ok")
"#,
        shared = py(&shared.display().to_string()),
        sock = py(&sock.display().to_string()),
        host = host.join(","),
        victim = py(&victim_runtime.file_name().unwrap().to_string_lossy()),
    );
    let out = run_ok(&attacker, &control, None).await;
    expect(
        &out,
        &[
            ("signal", "ok"),
            ("victim", "True"),
            ("factory", "True"),
            ("sock", "True"),
            ("connect", "ok"),
        ],
    );
    victim.close().await;
    attacker.close().await;
}

/// The operator's files (issue 42) where an operator keeps them (outside `/tmp` and `$HOME`,
/// which every confined kernel sees empty anyway): the token files (one a link, as a
/// Kubernetes secret's file is), the session-secret file, and the sessions' notebooks (a
/// relative `--notebook-dir`: in `$IPYBOX_HOME`, never the workspace). A confined session reads
/// none of them, while it reads a file next to each (so the place is in its view and only
/// ipybox's hiding keeps them out); the same probe from an `--unconfined-sessions` service reads
/// every one. `--session-show` shows a directory without any of them (read by both), and
/// refuses one holding the session-secret file, the notebook, snapshot or data directory.
#[tokio::test(flavor = "multi_thread")]
async fn operators_files_are_hidden_from_confined_sessions() {
    require!(TestEnv);
    let probe = probe_dir_or_skip!("operator");
    let etc = probe.path();
    let tokens = etc.join("tokens");
    std::fs::write(&tokens, format!("# {PLANTED}\n{TOKEN_A}\n")).unwrap();
    // A Kubernetes secret volume: `token` -> `..data/token`.
    std::fs::create_dir_all(etc.join("k8s/..data")).unwrap();
    let linked = etc.join("k8s/..data/token");
    std::fs::write(&linked, format!("# {PLANTED}\n{TOKEN_B}\n")).unwrap();
    std::os::unix::fs::symlink("..data/token", etc.join("k8s/token")).unwrap();
    let secret = etc.join("session.secret");
    std::fs::write(&secret, format!("{PLANTED}-{SECRET}\n")).unwrap();
    let visible = etc.join("visible.txt");
    std::fs::write(&visible, PLANTED).unwrap();
    let ws = etc.join("ws");
    std::fs::create_dir(&ws).unwrap();
    std::fs::write(ws.join("visible.txt"), PLANTED).unwrap();
    // The service's data directory, where a relative --notebook-dir goes.
    let home = etc.join("home");
    let notebooks = home.join("nb");
    let python = kernel_python().display().to_string();
    let home_env = home.display().to_string();
    let env = [
        ("IPYBOX_HOME", home_env.as_str()),
        ("IPYBOX_PYTHON", python.as_str()),
    ];
    // What the operator shows with --session-show: a directory that holds none of ipybox's
    // files is shown (the control, read below) ...
    let shown = etc.join("shown");
    std::fs::create_dir(&shown).unwrap();
    std::fs::write(shown.join("visible.txt"), PLANTED).unwrap();
    let shown_flag = shown.display().to_string();
    // ... while one that holds the session-secret file, the notebook directory, the snapshot
    // directory or the data directory is refused, naming it (with nothing else of ipybox's
    // in it, so each refusal is for its own reason).
    for sub in ["nbs", "snaps"] {
        std::fs::create_dir(etc.join(sub)).unwrap();
    }
    std::fs::create_dir_all(&home).unwrap();
    let secret_s = secret.display().to_string();
    let (nb_dir, snap_dir) = (etc.join("nbs/nb"), etc.join("snaps/saved"));
    let (nb_s, snap_s) = (nb_dir.display().to_string(), snap_dir.display().to_string());
    let (etc_s, nbs_s, snaps_s) = (
        etc.display().to_string(),
        etc.join("nbs").display().to_string(),
        etc.join("snaps").display().to_string(),
    );
    let refused_env: Vec<(&str, Option<&str>)> = env.iter().map(|(k, v)| (*k, Some(*v))).collect();
    for (flags, refusal) in [
        (
            vec!["--session-secret-file", &secret_s, "--session-show", &etc_s],
            format!(
                "--session-show {etc_s} would show ipybox's session-secret file {secret_s} to every session"
            ),
        ),
        (
            vec!["--notebook-dir", &nb_s, "--session-show", &nbs_s],
            format!(
                "--session-show {nbs_s} would show ipybox's notebook directory {nb_s} to every session"
            ),
        ),
        (
            vec!["--snapshot-dir", &snap_s, "--session-show", &snaps_s],
            format!(
                "--session-show {snaps_s} would show ipybox's snapshot directory {snap_s} to every session"
            ),
        ),
        (
            vec!["--no-notebook", "--session-show", &home_env],
            format!(
                "--session-show {home_env} would show ipybox's data directory ($IPYBOX_HOME) {home_env} to every session"
            ),
        ),
    ] {
        let stderr = serve_refused("127.0.0.1", &ws, &flags, &refused_env);
        assert!(stderr.contains(&refusal), "{flags:?}: {stderr}");
    }
    for confined in [true, false] {
        let (tokens, link, secret) = (
            tokens.display().to_string(),
            etc.join("k8s/token").display().to_string(),
            secret.display().to_string(),
        );
        let mut flags = vec![
            "--token-file",
            &tokens,
            "--token-file",
            &link,
            "--trust-tenants",
            "--session-secret-file",
            &secret,
            "--notebook-dir",
            "nb",
            "--warm-sessions",
            "0",
            "--session-show",
            &shown_flag,
        ];
        if !confined {
            flags.push("--unconfined-sessions");
        }
        let service = Service::start(&ws, &env, &flags);
        let client = connect(&service.url(), Some(TOKEN_B), Era::Stateless).await;
        let (_, h) = new_session(&client, &format!("print({:?})", PLANTED)).await;
        // The notebook is written in the background: waited for.
        let deadline = Instant::now() + Duration::from_secs(30);
        let notebook = loop {
            let found = std::fs::read_dir(&notebooks)
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| e.path())
                .find(|p| std::fs::read_to_string(p).is_ok_and(|t| t.contains(PLANTED)));
            if let Some(found) = found {
                break found;
            }
            assert!(
                Instant::now() < deadline,
                "no notebook in {}",
                notebooks.display()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let code = read_probe(&[
            ("visible", &visible),
            ("workspace", &ws.join("visible.txt")),
            ("tokens", Path::new(&tokens)),
            ("token-link", Path::new(&link)),
            ("token-target", &linked),
            ("secret", Path::new(&secret)),
            ("notebook", &notebook),
            ("shown", &shown.join("visible.txt")),
        ]);
        let out = run_ok(&client, &code, Some(&h)).await;
        let want = if confined {
            // The view is an allowlist (tenant_view.rs): the probe directory is not in it.
            probe_outcome(&[
                ("visible", "FileNotFoundError"),
                ("workspace", "read"),
                ("tokens", "FileNotFoundError"),
                ("token-link", "FileNotFoundError"),
                ("token-target", "FileNotFoundError"),
                ("secret", "FileNotFoundError"),
                ("notebook", "FileNotFoundError"),
                ("shown", "read"),
            ])
        } else {
            probe_outcome(&[
                ("visible", "read"),
                ("workspace", "read"),
                ("tokens", "read"),
                ("token-link", "read"),
                ("token-target", "read"),
                ("secret", "read"),
                ("notebook", "read"),
                ("shown", "read"),
            ])
        };
        assert_eq!(out, want, "confined: {confined}");
        assert!(!ws.join("nb").exists());
        client.close().await;
    }
}
