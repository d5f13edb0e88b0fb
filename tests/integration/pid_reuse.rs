//! ipybox never signals a pid or process group it no longer owns (issue 27, item 8).
//!
//! A kernel, or a kernel factory template, dies by its own hand while idle (`os._exit` in a
//! timer thread; a kernel that SIGKILLs its template). Once its pid is free, this test takes
//! that very pid with a process of its own that leads a process group with that id — a host
//! process that happened to get the number, the *bystander* — and drives ipybox through every
//! later action: the next execution, a reset, stop and drop. The bystander must survive all of
//! them. Every path: a plainly launched kernel, a forked kernel and its template, and under
//! `--sandbox` (srt + bubblewrap) a launched kernel (`--no-kernel-factory`) and a forked kernel
//! and its template.
//!
//! The pid is taken deterministically: `clone3` with `set_tid` (needs CAP_SYS_ADMIN, which the
//! test machines' root has), else by forking until the pid counter comes round to it.

use std::ffi::CString;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use ipybox::CodeExecutor;
use ipybox::sandbox::SandboxOptions;

use crate::proc_tree::children;
use crate::support::{pid_alive, pid_exists, require, root, run};

/// A process of this test with a chosen pid: `sleep 600` leading a process group whose id is
/// its pid, as a host program started by a shell's job control or with `setsid` would. Killed
/// and reaped on drop (it is this test's child, unreaped until then, so its pid stays its own).
struct Bystander {
    pid: u32,
}

/// `struct clone_args` of `clone3(2)`.
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

impl Bystander {
    /// Takes `pid`, which must be free. Err says why it could not (the pid is taken, or no way
    /// to choose it here).
    fn take(pid: u32) -> Result<Self, String> {
        let sleep = ["/bin/sleep", "/usr/bin/sleep"]
            .into_iter()
            .find(|p| std::path::Path::new(p).exists())
            .ok_or("no sleep binary")?;
        let sleep = CString::new(sleep).unwrap();
        let arg = CString::new("600").unwrap();
        let argv = [sleep.as_ptr(), arg.as_ptr(), std::ptr::null()];
        let target = pid as libc::pid_t;
        // The child: lead a group of its own and become `sleep` if it got the pid, else leave.
        // Only async-signal-safe calls (this process has threads).
        let child = || -> ! {
            // SAFETY: see above.
            unsafe {
                if libc::getpid() != target {
                    libc::_exit(0);
                }
                libc::setpgid(0, 0);
                libc::execv(argv[0], argv.as_ptr());
                libc::_exit(127);
            }
        };
        let clone = |set_tid: Option<&libc::pid_t>| -> std::io::Result<libc::pid_t> {
            let args = CloneArgs {
                exit_signal: libc::SIGCHLD as u64,
                set_tid: set_tid.map_or(0, |t| t as *const libc::pid_t as u64),
                set_tid_size: u64::from(set_tid.is_some()),
                ..Default::default()
            };
            // SAFETY: clone3 with a valid clone_args and no CLONE_VM behaves like fork; the
            // child runs only `child` (async-signal-safe calls) and never returns here.
            let rc = unsafe {
                libc::syscall(
                    libc::SYS_clone3,
                    &args as *const CloneArgs,
                    std::mem::size_of::<CloneArgs>(),
                )
            };
            match rc {
                0 => child(),
                -1 => Err(std::io::Error::last_os_error()),
                pid => Ok(pid as libc::pid_t),
            }
        };
        match clone(Some(&target)) {
            Ok(got) if got == target => return Ok(Self { pid }),
            Ok(got) => return Err(format!("clone3 gave pid {got}, not {pid}")),
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
                return Err(format!("pid {pid} was taken by another process"));
            }
            // No CAP_SYS_ADMIN (EPERM) or no clone3: cycle the pid counter instead.
            Err(_) => {}
        }
        let pid_max: u64 = std::fs::read_to_string("/proc/sys/kernel/pid_max")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(4_194_304);
        let deadline = Instant::now() + Duration::from_secs(120);
        for _ in 0..pid_max + 1000 {
            if pid_exists(pid) {
                return Err(format!("pid {pid} was taken by another process"));
            }
            if Instant::now() > deadline {
                break;
            }
            let got = clone(None).map_err(|e| format!("fork: {e}"))?;
            if got == target {
                return Ok(Self { pid });
            }
            // SAFETY: reaping a child of ours that exits at once.
            unsafe { libc::waitpid(got, std::ptr::null_mut(), 0) };
        }
        Err(format!(
            "the pid counter did not come round to {pid} within 120 s (pid_max {pid_max}): run as root"
        ))
    }

    /// Whether it still runs (its group is still there: it leads it).
    fn alive(&self) -> bool {
        pid_alive(self.pid)
    }
}

impl Drop for Bystander {
    fn drop(&mut self) {
        // SAFETY: our own unreaped child: the pid is its.
        unsafe {
            libc::kill(self.pid as libc::pid_t, libc::SIGKILL);
            libc::waitpid(self.pid as libc::pid_t, std::ptr::null_mut(), 0);
        }
    }
}

/// Which kind of process dies and how ipybox runs kernels.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Path {
    /// `--no-kernel-factory`: the kernel is ipybox's child; it calls `os._exit`.
    Launched,
    /// A forked kernel calls `os._exit` (its template reaps it).
    Forked,
    /// A forked kernel SIGKILLs its template (ipybox's child); the kernel lives on.
    ForkedTemplate,
    /// `--sandbox --no-kernel-factory`: ipybox's child is srt; the kernel calls `os._exit`, and
    /// the sandbox ends with it.
    SandboxLaunched,
    /// `--sandbox`: a forked kernel calls `os._exit` (the template reaps it, inside the
    /// sandbox; its pid is taken outside).
    SandboxForked,
    /// `--sandbox`: a forked kernel SIGKILLs its template; the sandbox (and the kernel) end,
    /// and srt, ipybox's child, exits.
    SandboxTemplate,
}

impl Path {
    fn sandboxed(self) -> bool {
        matches!(
            self,
            Path::SandboxLaunched | Path::SandboxForked | Path::SandboxTemplate
        )
    }

    fn factory(self) -> bool {
        !matches!(self, Path::Launched | Path::SandboxLaunched)
    }

    /// The cell that makes the process die 0.3 s after it returned (ipybox is idle then).
    fn fatal_cell(self) -> &'static str {
        match self {
            Path::ForkedTemplate | Path::SandboxTemplate => {
                "import os, signal, threading\nthreading.Timer(0.3, os.kill, (os.getppid(), signal.SIGKILL)).start()"
            }
            _ => "import os, threading\nthreading.Timer(0.3, os._exit, (3,)).start()",
        }
    }

    /// What the next execution says: the kernel died (with this status), or it lives on.
    fn next_execution(self) -> Result<&'static str, &'static str> {
        match self {
            Path::ForkedTemplate => Ok("2"),
            Path::SandboxTemplate => Err(
                "kernel died (exit status unknown: the kernel factory's template did not report it) — restarted, state lost; the code was not run",
            ),
            _ => Err("kernel died (exit code 3) — restarted, state lost; the code was not run"),
        }
    }
}

/// The later actions, in the order they are taken; each scenario starts with a different one.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Action {
    Execute,
    Reset,
    Stop,
    Drop,
}

const ACTIONS: [Action; 4] = [Action::Execute, Action::Reset, Action::Stop, Action::Drop];

fn srt() -> PathBuf {
    root().join("target/sandbox-deps/node_modules/.bin/srt")
}

fn cmdline(pid: u32) -> String {
    String::from_utf8_lossy(&std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default())
        .replace('\0', " ")
}

/// The parent of `pid` (from /proc).
fn ppid(pid: u32) -> u32 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat.rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().nth(1))
        .and_then(|p| p.parse().ok())
        .unwrap_or(0)
}

/// The pid that will be freed: the kernel's, or its template's (under `--sandbox`, the srt
/// process around the template, the child of ipybox that exits when the sandbox ends).
async fn victim(ex: &CodeExecutor, path: Path) -> u32 {
    let kernel = ex.kernel_pid().await.expect("a kernel");
    match path {
        Path::ForkedTemplate => {
            let template = ppid(kernel);
            assert!(cmdline(template).contains("ipybox_runtime.factory"));
            template
        }
        Path::SandboxTemplate => {
            let rt = ex.runtime_dir().await.unwrap();
            let needle = format!("{}/kernels/t", rt.display());
            let srt: Vec<u32> = children(std::process::id())
                .into_iter()
                .filter(|p| cmdline(*p).contains(&needle))
                .collect();
            assert_eq!(srt.len(), 1, "one template's srt: {srt:?}");
            srt[0]
        }
        Path::SandboxLaunched => {
            // A launched sandboxed kernel's process is srt (ipybox's child).
            assert_eq!(ppid(kernel), std::process::id());
            assert!(cmdline(kernel).contains("srt"), "{}", cmdline(kernel));
            kernel
        }
        Path::Launched => {
            assert_eq!(ppid(kernel), std::process::id());
            kernel
        }
        Path::Forked | Path::SandboxForked => {
            assert!(cmdline(ppid(kernel)).contains("ipybox_runtime.factory"));
            kernel
        }
    }
}

/// Whether `pid` is in use: by a process (a zombie included), or as the process group or
/// session id of one (fields 5 and 6 of `/proc/<pid>/stat`).
fn in_use(pid: u32) -> bool {
    if pid_exists(pid) {
        return true;
    }
    std::fs::read_dir("/proc").unwrap().flatten().any(|entry| {
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        stat.rsplit_once(')').is_some_and(|(_, rest)| {
            rest.split_whitespace()
                .skip(2)
                .take(2)
                .any(|f| f == pid.to_string())
        })
    })
}

/// Waits up to `within` until `pid` is free: its process gone and reaped, and no process left
/// in a group or session with that id.
async fn freed(pid: u32, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while in_use(pid) {
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    true
}

/// Asserts that the bystander survives a while (kills go out asynchronously: a request to a
/// template, a task that drops a kernel).
async fn survives(bystander: &Bystander, path: Path, after: &str) {
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(
        bystander.alive(),
        "{path:?}: the bystander holding pid {} was killed by {after}",
        bystander.pid
    );
}

/// One scenario: the process of `path` dies, the bystander takes its pid, then `first` and the
/// actions after it.
async fn scenario(path: Path, first: Action) {
    let ws = tempfile::tempdir().unwrap();
    let mut builder = CodeExecutor::builder()
        .workspace(ws.path())
        .kernel_factory(path.factory());
    if path.sandboxed() {
        builder = builder.sandbox(SandboxOptions {
            srt: Some(srt()),
            ..Default::default()
        });
    }
    let ex = builder.build();
    ex.start().await.expect("starts");
    assert_eq!(run(&ex, "1 + 1").await, "2");
    let pid = victim(&ex, path).await;
    assert_eq!(run(&ex, path.fatal_cell()).await, "");
    assert!(
        freed(pid, Duration::from_secs(15)).await,
        "{path:?}: pid {pid} is still taken (by a process, or a group or session of one)"
    );
    let bystander = match Bystander::take(pid) {
        Ok(b) => b,
        Err(why) => {
            // Something else took the pid: ipybox must not get the chance to signal it.
            std::mem::forget(ex);
            panic!("{path:?}: cannot stage the bystander: {why}");
        }
    };
    assert!(bystander.alive());
    let mut ex = Some(ex);
    for action in ACTIONS.into_iter().skip_while(|a| *a != first) {
        match action {
            Action::Execute => {
                let ex = ex.as_ref().unwrap();
                let got = ex
                    .execute("1 + 1", Some(Duration::from_secs(60)))
                    .await
                    .map(|r| r.text)
                    .map_err(|e| e.to_string());
                let want = path
                    .next_execution()
                    .map(str::to_string)
                    .map_err(str::to_string);
                if first == Action::Execute {
                    assert_eq!(got, want, "{path:?}: the next execution");
                } else {
                    assert_eq!(got.as_deref(), Ok("2"), "{path:?}: a later execution");
                }
            }
            Action::Reset => ex.as_ref().unwrap().reset().await.expect("reset"),
            Action::Stop => ex.as_ref().unwrap().stop().await,
            Action::Drop => drop(ex.take()),
        }
        survives(&bystander, path, &format!("{action:?} (first: {first:?})")).await;
    }
}

async fn every_action(path: Path) {
    for first in ACTIONS {
        scenario(path, first).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_launched_kernel_that_exited_leaves_its_pid_alone() {
    every_action(Path::Launched).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_forked_kernel_that_exited_leaves_its_pid_alone() {
    every_action(Path::Forked).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_template_killed_by_its_kernel_leaves_its_pid_alone() {
    every_action(Path::ForkedTemplate).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sandboxed_launched_kernel_that_exited_leaves_its_pid_alone() {
    require!(SandboxDeps);
    every_action(Path::SandboxLaunched).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sandboxed_forked_kernel_that_exited_leaves_its_pid_alone() {
    require!(SandboxDeps);
    every_action(Path::SandboxForked).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sandboxed_template_killed_by_its_kernel_leaves_its_pid_alone() {
    require!(SandboxDeps);
    every_action(Path::SandboxTemplate).await;
}

/// The template itself (`python/ipybox_runtime/factory.py`), driven over its protocol by this
/// test: a kernel it forked exits and is reaped by it; the bystander takes the pid; then the
/// host asks the template to kill that kernel (as ipybox does for a kernel it gave up on). The
/// template must not signal a pid it has reaped.
#[test]
fn the_template_never_signals_a_kernel_it_reaped() {
    use std::io::{BufRead, BufReader, Write};
    use std::os::unix::net::UnixListener;

    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("sock");
    let listener = UnixListener::bind(&sock).unwrap();
    let mut template = std::process::Command::new(crate::support::kernel_python())
        .args([
            "-c",
            "from ipybox_runtime.factory import main; main()",
            sock.to_str().unwrap(),
            "tok",
        ])
        .env("PYTHONPATH", root().join("python"))
        .current_dir(dir.path())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let (mut chan, _) = listener.accept().unwrap();
    let mut lines = BufReader::new(chan.try_clone().unwrap());
    let mut line = String::new();
    let mut next_line = |line: &mut String| {
        line.clear();
        lines.read_line(line).unwrap();
        line.trim().to_string()
    };
    assert_eq!(next_line(&mut line), "ipybox-factory tok");
    let send = |chan: &mut std::os::unix::net::UnixStream, v: serde_json::Value| {
        chan.write_all(format!("{v}\n").as_bytes()).unwrap();
    };
    send(
        &mut chan,
        serde_json::json!({"op": "fork", "id": "k1", "argv": ["-f", "/nonexistent/conn.json"], "cwd": dir.path()}),
    );
    let forked: serde_json::Value = serde_json::from_str(&next_line(&mut line)).unwrap();
    assert_eq!(forked["op"], "forked", "{forked}");
    let pid = forked["pid"].as_u64().unwrap() as u32;
    // The kernel connects back; closing its connection makes it exit (its lifeline).
    let (mut kernel, _) = listener.accept().unwrap();
    let mut hello = [0u8; 64];
    let n = std::io::Read::read(&mut kernel, &mut hello).unwrap();
    assert_eq!(&hello[..n], b"ipybox-factory k1\n");
    drop(kernel);
    let exit: serde_json::Value = serde_json::from_str(&next_line(&mut line)).unwrap();
    assert_eq!(exit["op"], "exit", "{exit}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while in_use(pid) {
        assert!(Instant::now() < deadline, "pid {pid} still in use");
        std::thread::sleep(Duration::from_millis(10));
    }
    let bystander = Bystander::take(pid).unwrap_or_else(|why| {
        let _ = template.kill();
        panic!("cannot stage the bystander: {why}");
    });
    send(&mut chan, serde_json::json!({"op": "kill", "id": "k1"}));
    // A fork request after it: its answer means the kill was handled.
    send(
        &mut chan,
        serde_json::json!({"op": "fork", "id": "k2", "argv": ["-f", "/nonexistent/conn.json"], "cwd": dir.path()}),
    );
    let forked: serde_json::Value = serde_json::from_str(&next_line(&mut line)).unwrap();
    assert_eq!(forked["id"], "k2", "{forked}");
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        bystander.alive(),
        "the template killed the group of a pid it had reaped"
    );
    // The host goes away: the template kills its running kernels and exits.
    chan.shutdown(std::net::Shutdown::Both).unwrap();
    let status = template.wait().unwrap();
    assert!(status.success(), "{status:?}");
}
