//! What every child ipybox starts shares. Every process starts from [`host_command`] (or
//! [`host_command_blocking`]): its working directory is [`SAFE_CWD`], never ipybox's own, which
//! with the default `--workspace .` is the workspace a sandboxed kernel can write (a `python -m
//! x`, a pyenv shim, `uv` or `npx` would otherwise pick up what the kernel put there). A child
//! that must run elsewhere says so with `current_dir` at its call site. `Command::new` is
//! disallowed elsewhere (clippy.toml), so this cannot be forgotten.
//!
//! Long-running children lead their own process group (so what they start dies with them), keep
//! a bounded stderr tail for error messages, and are signalled as a group, only while ipybox
//! still owns the group (`group_leader.rs`). Kernels (`kernel/local.rs`) and stdio MCP servers
//! (`tools/client.rs`) are started this way; short-lived commands (installers, probes) only use
//! [`tail`] on their collected output. Processes that are not ipybox's children (a forked
//! kernel) are held by a [`PidFd`] and never signalled by pid.
//!
//! Not here: how each kind of child is started, watched and stopped.

use std::collections::VecDeque;
use std::ffi::OsStr;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::task::JoinHandle;

/// The working directory of every child ipybox starts unless its call site names another: the
/// file system root, which neither a sandboxed kernel nor a kernel on a Jupyter server can write,
/// and where no tool finds project configuration (`uv.toml`, `pyproject.toml`, `node_modules`,
/// `.python-version`) or modules to import.
pub(crate) const SAFE_CWD: &str = "/";

/// A command for `program` whose working directory is [`SAFE_CWD`].
#[allow(clippy::disallowed_methods)] // the one place commands are made
pub(crate) fn host_command(program: impl AsRef<OsStr>) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(program);
    cmd.current_dir(SAFE_CWD);
    cmd
}

/// [`host_command`] for blocking code (`std::process`).
#[allow(clippy::disallowed_methods)] // the one place commands are made
pub(crate) fn host_command_blocking(program: impl AsRef<OsStr>) -> std::process::Command {
    let mut cmd = std::process::Command::new(program);
    cmd.current_dir(SAFE_CWD);
    cmd
}

/// A command about to be started: its argv, its whole environment (the child inherits nothing
/// else), its working directory, and a directory of this child's that only the host writes
/// (where a wrapper can leave it files, such as the environment a sandboxed kernel sources
/// inside the sandbox). A wrapper that changes into `cwd` itself returns the directory its own
/// process starts in.
#[derive(Debug, Clone)]
pub(crate) struct ChildCommand {
    pub(crate) argv: Vec<String>,
    pub(crate) env: Vec<(String, String)>,
    pub(crate) cwd: std::path::PathBuf,
    pub(crate) private_dir: std::path::PathBuf,
}

/// Rewrites a child's command before it is started (the sandbox wraps the kernel's this way).
#[derive(Clone)]
pub(crate) struct CommandWrapper(
    pub(crate) Arc<dyn Fn(ChildCommand) -> std::io::Result<ChildCommand> + Send + Sync>,
);

impl std::fmt::Debug for CommandWrapper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CommandWrapper")
    }
}

/// How much of a child's stderr is kept.
pub(crate) const STDERR_TAIL_BYTES: usize = 8 * 1024;

/// The last 15 lines of a child's output, for error messages.
pub(crate) fn tail(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let lines: Vec<&str> = text.trim_end().lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}

/// Makes the command's child the leader of a new process group, killed (the leader) when its
/// handle is dropped. Stdout/stderr/stdin wiring stays with the caller.
pub(crate) fn own_group(cmd: &mut tokio::process::Command) -> &mut tokio::process::Command {
    cmd.kill_on_drop(true).process_group(0)
}

/// Sends `sig` to the process group `pgid` (a child started with [`own_group`]; its pid).
/// Errors (the group is gone: ESRCH) are ignored. Only [`crate::group_leader::GroupLeader`]
/// calls it, while it has not reaped the group's leader: once reaped, `pgid` may name another
/// process's group.
pub(crate) fn signal_group(pgid: u32, sig: i32) {
    let Ok(pgid) = i32::try_from(pgid) else {
        return;
    };
    if pgid <= 1 {
        return;
    }
    // SAFETY: killpg has no memory-safety preconditions. The group id cannot be reused while
    // its leader is unreaped or any member lives; callers signal only before they reap it.
    unsafe {
        libc::killpg(pgid, sig);
    }
}

/// A pidfd (`pidfd_open`, Linux 5.3+): a handle on one process that, unlike its pid, can never
/// come to mean another process. Used for processes that are not ipybox's children (a forked
/// kernel) before signalling their group: a pid read earlier may since have been reused.
#[derive(Debug)]
pub(crate) struct PidFd {
    fd: std::os::fd::OwnedFd,
    pid: u32,
}

impl PidFd {
    /// A pidfd for `pid`; None if there is no such process (or no pidfd support: not Linux, or
    /// a kernel before 5.3).
    pub(crate) fn open(pid: u32) -> Option<Self> {
        #[cfg(target_os = "linux")]
        {
            use std::os::fd::FromRawFd;
            let raw = libc::pid_t::try_from(pid).ok().filter(|p| *p > 0)?;
            // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
            let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, raw, 0) };
            let fd = i32::try_from(fd).ok().filter(|fd| *fd >= 0)?;
            // SAFETY: the descriptor was just created and is owned by nothing else.
            let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
            Some(Self { fd, pid })
        }
        #[cfg(not(target_os = "linux"))]
        {
            let _ = pid;
            None
        }
    }

    /// The pid it was opened for (the same process as long as [`PidFd::alive`]).
    pub(crate) fn pid(&self) -> u32 {
        self.pid
    }

    /// Whether the process still runs: a pidfd becomes readable when its process exits (it may
    /// still be an unreaped zombie then, or its pid may already be free).
    pub(crate) fn alive(&self) -> bool {
        use std::os::fd::AsRawFd;
        let mut poll = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, a zero timeout.
        let n = unsafe { libc::poll(&mut poll, 1, 0) };
        n == 0
    }
}

impl PidFd {
    /// Sends `sig` to this very process (`pidfd_send_signal`, Linux 5.1): never to another one
    /// that took its pid (an ended process gets nothing: a zombie ignores it, a reaped one is
    /// not found). False if it could not be sent (reaped, or no pidfd support).
    pub(crate) fn send_signal(&self, sig: i32) -> bool {
        #[cfg(target_os = "linux")]
        {
            use std::os::fd::AsRawFd;
            // SAFETY: pidfd_send_signal takes a descriptor, a signal number, a null siginfo and
            // flags; it touches no memory of ours.
            let rc = unsafe {
                libc::syscall(
                    libc::SYS_pidfd_send_signal,
                    self.fd.as_raw_fd(),
                    sig,
                    std::ptr::null::<libc::siginfo_t>(),
                    0,
                )
            };
            rc == 0
        }
        #[cfg(not(target_os = "linux"))]
        {
            let _ = sig;
            false
        }
    }

    /// Returns once the process has exited (whoever its parent is, reaped or not). The pidfd is
    /// watched by the event loop; if it cannot be registered there, it is polled every 20 ms.
    pub(crate) async fn exited(self: Arc<Self>) {
        // SAFETY: the AsyncFd holds an Arc of the PidFd, whose descriptor stays open and the
        // same for the AsyncFd's lifetime.
        let registered = unsafe {
            tokio::io::unix::AsyncFd::register_with_interest(
                self.clone(),
                tokio::io::Interest::READABLE,
            )
        };
        match registered {
            Ok(fd) => {
                // Readable = exited; an error means the fd is unusable: poll instead.
                if fd.readable().await.is_ok() {
                    return;
                }
            }
            Err(e) => tracing::debug!(
                "cannot watch the pidfd of {}: {}",
                self.pid,
                e.into_parts().1
            ),
        }
        while self.alive() {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }
}

impl std::os::fd::AsRawFd for PidFd {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.fd.as_raw_fd()
    }
}

/// Field `n` after the command name of `/proc/<pid>/stat` (0: state, 1: parent, 2: process
/// group, 3: session), in ipybox's pid namespace; None if it is gone or unreadable.
fn stat_field(pid: u32, n: usize) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // `pid (comm) state ppid pgrp session ...`: comm may hold spaces and parentheses.
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(n)?.parse().ok()
}

/// The parent of process `pid` (field 4 of `/proc/<pid>/stat`, in ipybox's pid namespace);
/// None if it is gone or unreadable.
pub(crate) fn parent_of(pid: u32) -> Option<u32> {
    stat_field(pid, 1)
}

/// SIGKILLs the other members of the process group that `leader` leads (a process that is not
/// ipybox's child, so ipybox cannot keep its pid from being reused), found in /proc. Each
/// member is pinned with a pidfd, then its group is read again, then `leader` is checked to
/// still run: a group id read while its leader runs is that leader's group, so the signal (sent
/// through the member's pidfd) reaches a member of it and nothing else. Once `leader` has
/// ended nothing is sent. Not atomic like `killpg`: a member that forks meanwhile may leave a
/// child behind. Linux only (pidfds and /proc); elsewhere it does nothing.
pub(crate) fn kill_group_members(leader: &PidFd) {
    let pgid = leader.pid();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return;
    };
    for entry in procs.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == pgid || stat_field(pid, 2) != Some(pgid) {
            continue;
        }
        let Some(member) = PidFd::open(pid) else {
            continue;
        };
        if stat_field(pid, 2) != Some(pgid) {
            continue;
        }
        if !leader.alive() {
            return;
        }
        member.send_signal(libc::SIGKILL);
    }
}

/// Whether process `pid` has ended: gone, or a zombie waiting to be reaped (it runs nothing).
pub(crate) fn process_ended(pid: u32) -> bool {
    #[cfg(target_os = "linux")]
    {
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            // The state follows the parenthesized command name, which may itself hold spaces.
            Ok(stat) => stat
                .rsplit_once(')')
                .is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X'])),
            Err(_) => true,
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let Ok(pid) = i32::try_from(pid) else {
            return true;
        };
        // SAFETY: kill with signal 0 only checks that the process exists.
        unsafe { libc::kill(pid, 0) != 0 }
    }
}

/// Waits (polling) until process `pid` has ended, at most `within`; true if it did.
pub(crate) async fn wait_ended(pid: u32, within: std::time::Duration) -> bool {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if pid == 0 || process_ended(pid) {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

/// The last [`STDERR_TAIL_BYTES`] of a child's stderr. Cheap to clone; clones share the buffer.
#[derive(Debug, Clone, Default)]
pub(crate) struct StderrTail {
    buf: Arc<Mutex<VecDeque<u8>>>,
}

impl StderrTail {
    /// Reads `stderr` to its end on a task, keeping the tail.
    pub(crate) fn capture(
        mut stderr: impl AsyncRead + Unpin + Send + 'static,
    ) -> (Self, JoinHandle<()>) {
        let tail = Self::default();
        let sink = tail.clone();
        let reader = tokio::spawn(async move {
            let mut chunk = [0u8; 4096];
            while let Ok(n) = stderr.read(&mut chunk).await {
                if n == 0 {
                    break;
                }
                sink.push(&chunk[..n]);
            }
        });
        (tail, reader)
    }

    fn push(&self, bytes: &[u8]) {
        let mut buf = self.buf.lock().unwrap_or_else(|p| p.into_inner());
        buf.extend(bytes);
        let excess = buf.len().saturating_sub(STDERR_TAIL_BYTES);
        buf.drain(..excess);
    }

    fn bytes(&self) -> Vec<u8> {
        let buf = self.buf.lock().unwrap_or_else(|p| p.into_inner());
        let (a, b) = buf.as_slices();
        [a, b].concat()
    }

    /// Everything kept, as text.
    pub(crate) fn text(&self) -> String {
        String::from_utf8_lossy(&self.bytes()).into_owned()
    }

    /// The last lines kept (see [`tail`]).
    pub(crate) fn last_lines(&self) -> String {
        tail(&self.bytes())
    }
}

/// Whether a process `pid` exists (signal 0; a process of another user counts).
pub(crate) fn process_alive(pid: i32) -> bool {
    // SAFETY: kill with signal 0 only checks for existence/permission.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// A child's exit status in words.
pub(crate) fn describe_exit(status: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit code {code}"),
        (None, Some(sig)) => format!("killed by signal {sig}{}", signal_name(sig)),
        _ => "unknown exit status".to_string(),
    }
}

/// An exit status as Python's `os.waitstatus_to_exitcode` gives it (the kernel factory's
/// template reports its children's this way): `n >= 0` is an exit code, `-n` death by signal `n`.
pub(crate) fn describe_code(code: i32) -> String {
    if code >= 0 {
        format!("exit code {code}")
    } else {
        let sig = code.unsigned_abs();
        format!(
            "killed by signal {sig}{}",
            i32::try_from(sig).map_or("", signal_name)
        )
    }
}

fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGKILL => " (SIGKILL)",
        libc::SIGSEGV => " (SIGSEGV)",
        libc::SIGABRT => " (SIGABRT)",
        libc::SIGTERM => " (SIGTERM)",
        libc::SIGBUS => " (SIGBUS)",
        _ => "",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn keeps_only_the_end_of_stderr() {
        let input: Vec<u8> = (0..3000)
            .flat_map(|i| format!("line {i}\n").into_bytes())
            .collect();
        let (tail, reader) = StderrTail::capture(std::io::Cursor::new(input));
        reader.await.unwrap();
        let text = tail.text();
        assert_eq!(text.len(), STDERR_TAIL_BYTES);
        assert!(text.ends_with("line 2999\n"));
        let last = tail.last_lines();
        assert_eq!(last.lines().count(), 15);
        assert!(last.starts_with("line 2985\n"));
    }

    #[tokio::test]
    async fn notices_the_end_of_a_process_it_did_not_start() {
        // `sh` starts `sleep` and exits: `sleep` is not our child.
        let out = host_command_blocking("sh")
            .args(["-c", "sleep 0.5 >/dev/null 2>&1 & echo $!"])
            .output()
            .unwrap();
        let pid: u32 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
        assert!(!process_ended(pid));
        let fd = Arc::new(PidFd::open(pid).expect("pidfd"));
        assert!(fd.alive());
        let start = std::time::Instant::now();
        tokio::time::timeout(std::time::Duration::from_secs(5), fd.clone().exited())
            .await
            .expect("noticed");
        let took = start.elapsed();
        assert!(
            took >= std::time::Duration::from_millis(150),
            "too early: {took:?}"
        );
        assert!(process_ended(pid));
        assert!(!fd.alive());
        // A process that is gone already.
        tokio::time::timeout(std::time::Duration::from_secs(1), fd.clone().exited())
            .await
            .expect("gone at once");
    }

    /// `sh` leading its own group starts `sleep 30` in it and then waits for it (`stay`) or
    /// exits; returns sh, sh's pidfd and sleep's pid.
    fn group(stay: bool) -> (std::process::Child, PidFd, u32) {
        use std::io::BufRead;
        use std::os::unix::process::CommandExt;
        let script = if stay {
            "sleep 30 >/dev/null 2>&1 & echo $!; wait"
        } else {
            "sleep 30 >/dev/null 2>&1 & echo $!"
        };
        let mut child = host_command_blocking("sh")
            .args(["-c", script])
            .stdout(std::process::Stdio::piped())
            .process_group(0)
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let fd = PidFd::open(child.id()).unwrap();
        (child, fd, line.trim().parse().unwrap())
    }

    fn ends_within_5s(pid: u32) -> bool {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while !process_ended(pid) && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        process_ended(pid)
    }

    #[test]
    fn the_members_of_a_running_leaders_group_are_killed_one_by_one() {
        let (mut sh, fd, sleep) = group(true);
        kill_group_members(&fd);
        assert!(ends_within_5s(sleep), "the member lives");
        // The leader itself is not signalled: it ends because its `wait` returned.
        assert_eq!(sh.wait().unwrap().code(), Some(0));
    }

    #[test]
    fn nothing_is_killed_once_the_leader_has_ended() {
        let (mut sh, fd, sleep) = group(false);
        sh.wait().unwrap();
        assert!(!fd.alive());
        // The group id may be another's by now (not here: `sleep` still holds it).
        kill_group_members(&fd);
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert!(!process_ended(sleep), "killed after its leader ended");
        // SAFETY: `sleep` runs (checked just above), a process of this test.
        unsafe { libc::kill(sleep as i32, libc::SIGKILL) };
        assert!(ends_within_5s(sleep));
    }

    #[tokio::test]
    async fn group_signal_reaches_grandchildren() {
        let mut cmd = host_command("sh");
        cmd.args(["-c", "sleep 30 & wait"]);
        let mut child = own_group(&mut cmd).spawn().unwrap();
        let pid = child.id().unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        signal_group(pid, libc::SIGKILL);
        let status = child.wait().await.unwrap();
        assert!(!status.success());
        // The background `sleep` was in the group: nothing of it is left once its orphan is
        // reaped (by init or a subreaper, not us).
        let gone = || {
            // SAFETY: probing a process group with signal 0.
            unsafe { libc::killpg(pid as i32, 0) != 0 }
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while !gone() && std::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        assert!(gone(), "the group survived");
    }
}
