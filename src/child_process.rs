//! What every child ipybox starts shares. Every process starts from [`host_command`] (or
//! [`host_command_blocking`]): its working directory is [`SAFE_CWD`], never ipybox's own, which
//! with the default `--workspace .` is the workspace a sandboxed kernel can write (a `python -m
//! x`, a pyenv shim, `uv` or `npx` would otherwise pick up what the kernel put there). A child
//! that must run elsewhere says so with `current_dir` at its call site. `Command::new` is
//! disallowed elsewhere (clippy.toml), so this cannot be forgotten.
//!
//! Long-running children lead their own process group (so what they start dies with them), keep
//! a bounded stderr tail for error messages, and are signalled as a group. Kernels
//! (`kernel/local.rs`) and stdio MCP servers (`tools/client.rs`) are started this way;
//! short-lived commands (installers, probes) only use [`tail`] on their collected output.
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
/// Errors (the group is gone: ESRCH) are ignored.
pub(crate) fn signal_group(pgid: u32, sig: i32) {
    let Ok(pgid) = i32::try_from(pgid) else {
        return;
    };
    if pgid <= 1 {
        return;
    }
    // SAFETY: killpg has no memory-safety preconditions. The group id cannot be reused while
    // any member lives, and callers stop signalling once they have reaped the whole group.
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

    /// Whether the process still runs: a pidfd becomes readable when its process exits. While
    /// it is alive its pid names it and nothing else, so a pid (or process group id) checked
    /// right after this is still its own.
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

impl std::os::fd::AsRawFd for PidFd {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.fd.as_raw_fd()
    }
}

/// The parent of process `pid` (field 4 of `/proc/<pid>/stat`, in ipybox's pid namespace);
/// None if it is gone or unreadable.
pub(crate) fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // `pid (comm) state ppid ...`: comm may hold spaces and parentheses.
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(1)?.parse().ok()
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
