//! A child of ipybox that leads its own process group (a kernel, a kernel factory template, or
//! the sandbox wrapper around either; a stdio MCP server), and the one rule for signalling it:
//! **its group is signalled only while ipybox has not reaped the leader.**
//!
//! A pid, and a process group id, stay reserved while the process is alive or an unreaped
//! zombie (and a group id while any member lives). Once the leader is reaped and its group has
//! no member left, the number is free, and the next process that gets it (any process of the
//! host, which may lead a group of its own) would receive what ipybox sends. So:
//!
//! - the leader's end is noticed without reaping it (a pidfd that becomes readable, else
//!   `waitid(WNOWAIT)` polling);
//! - then, with the leader still a zombie, what is left of its group is killed (the group id is
//!   certainly the leader's), and only then the leader is reaped ([`GroupLeader::try_reap`],
//!   [`GroupLeader::wait`]);
//! - from then on nothing is signalled: [`GroupLeader::signal`] checks, under the same lock as
//!   the reaping, that the leader is unreaped.
//!
//! Nobody else reaps the child: tokio waits only for a `Child` whose `wait` is polled (never
//! here) or that was dropped unfinished (its orphan queue, after this handle let go of it).
//!
//! Not here: processes that are not ipybox's children (a forked kernel is the template's: see
//! `kernel/factory/template.rs`, which signals it through a pidfd only), and how each kind of
//! child is started (`child_process.rs`, `kernel/local.rs`, `tools/client.rs`).

use std::process::ExitStatus;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::child_process::{PidFd, signal_group};

/// A child of ipybox that leads its own process group (started with
/// [`crate::child_process::own_group`]). Dropping it kills the group if the leader has not been
/// reaped (and tokio's `kill_on_drop` reaps the leader later).
#[derive(Debug)]
pub(crate) struct GroupLeader {
    pid: u32,
    /// Readable once the leader exited (Linux 5.3+); None: `waitid` is polled instead.
    pidfd: Option<Arc<PidFd>>,
    state: Mutex<State>,
}

#[derive(Debug)]
enum State {
    /// Not reaped: the pid and the group id are the leader's.
    Running(tokio::process::Child),
    /// Reaped, with its status: the pid may name any other process by now.
    Reaped(ExitStatus),
    /// The child could not be waited for (an error from the OS); treated as reaped.
    Lost,
}

/// How often the end of a leader is polled for when no pidfd is available.
const POLL: Duration = Duration::from_millis(20);

impl GroupLeader {
    /// Takes charge of `child`, just spawned as the leader of its own process group, before
    /// anything could reap it. Its stdio should have been taken out already.
    pub(crate) fn adopt(child: tokio::process::Child) -> Arc<Self> {
        let pid = child.id().unwrap_or(0);
        // Unreaped (only this handle reaps it), so the pid names this child.
        let pidfd = PidFd::open(pid).map(Arc::new);
        Arc::new(Self {
            pid,
            pidfd,
            state: Mutex::new(State::Running(child)),
        })
    }

    /// The leader's pid (= its process group id). Only an identifier for logs and diagnostics:
    /// once the leader is reaped it may name another process.
    pub(crate) fn pid(&self) -> u32 {
        self.pid
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sends `sig` to the leader's process group if the leader has not been reaped (alive, or a
    /// zombie: either way the group id is its own). Returns whether it was sent.
    pub(crate) fn signal(&self, sig: i32) -> bool {
        let state = self.lock();
        if self.pid == 0 || !matches!(*state, State::Running(_)) {
            return false;
        }
        signal_group(self.pid, sig);
        true
    }

    /// Whether the leader has been reaped (it ended and nothing more is ever signalled).
    pub(crate) fn reaped(&self) -> bool {
        !matches!(*self.lock(), State::Running(_))
    }

    /// Returns once the leader has exited (it may not be reaped yet).
    pub(crate) async fn exited(&self) {
        if let Some(fd) = &self.pidfd {
            fd.clone().exited().await;
            return;
        }
        while !self.reaped() && child_state(self.pid) == ChildState::Running {
            tokio::time::sleep(POLL).await;
        }
    }

    /// If the leader has exited: kills what is left of its group (SIGKILL, while the leader is
    /// still a zombie, so the group id is certainly its own) and reaps it. Returns its status
    /// once reaped (now or before); None while it runs.
    pub(crate) fn try_reap(&self) -> Option<ExitStatus> {
        let mut state = self.lock();
        let State::Running(child) = &mut *state else {
            return match *state {
                State::Reaped(s) => Some(s),
                _ => None,
            };
        };
        match child_state(self.pid) {
            ChildState::Running => return None,
            // What the leader started and left in its group (a kernel's subprocesses, srt's
            // bridges) dies with it.
            ChildState::Exited => signal_group(self.pid, libc::SIGKILL),
            // Not waitable (reaped behind our back?): nothing is signalled; let tokio say why.
            ChildState::Unknown => {}
        }
        match child.try_wait() {
            Ok(Some(status)) => {
                *state = State::Reaped(status);
                Some(status)
            }
            Ok(None) => None,
            Err(e) => {
                tracing::debug!("cannot reap process {}: {e}", self.pid);
                *state = State::Lost;
                None
            }
        }
    }

    /// Waits until the leader has exited, kills what is left of its group and reaps it
    /// ([`GroupLeader::try_reap`]). None if its status could not be had.
    pub(crate) async fn wait(&self) -> Option<ExitStatus> {
        loop {
            self.exited().await;
            if let Some(status) = self.try_reap() {
                return Some(status);
            }
            if matches!(*self.lock(), State::Lost) {
                return None;
            }
            // The pidfd said it exited but waitid does not see it yet: look again shortly.
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// [`GroupLeader::wait`], at most `within`.
    pub(crate) async fn wait_for(&self, within: Duration) -> Option<ExitStatus> {
        tokio::time::timeout(within, self.wait())
            .await
            .ok()
            .flatten()
    }
}

impl Drop for GroupLeader {
    fn drop(&mut self) {
        // The leader itself is killed and later reaped by tokio (`kill_on_drop`, its orphan
        // queue); this covers the rest of its group.
        self.signal(libc::SIGKILL);
    }
}

/// What `waitid` says of a child of ours.
#[derive(Debug, PartialEq, Eq)]
enum ChildState {
    Running,
    /// Exited, waiting to be reaped (a zombie: its pid and group id are still its own).
    Exited,
    /// Not an unreaped child of ours (or the call failed).
    Unknown,
}

/// The state of child `pid`, from `waitid` with `WNOWAIT` (which leaves an exited child a
/// zombie, to be reaped later).
fn child_state(pid: u32) -> ChildState {
    let id = pid as libc::id_t;
    if id == 0 {
        return ChildState::Unknown;
    }
    // SAFETY: a zeroed siginfo_t is a valid out-parameter for waitid.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: waitid writes into `info` only; WNOWAIT leaves the child unreaped.
    let rc = unsafe {
        libc::waitid(
            libc::P_PID,
            id,
            &mut info,
            libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
        )
    };
    #[cfg(target_os = "linux")]
    // SAFETY: after a successful waitid, si_pid is set (0 when no child has exited).
    let found = unsafe { info.si_pid() };
    #[cfg(not(target_os = "linux"))]
    let found = info.si_pid;
    match (rc, found) {
        (0, 0) => ChildState::Running,
        (0, _) => ChildState::Exited,
        _ => ChildState::Unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::child_process::{host_command, own_group};

    /// `sh` (leading its own group) starts `sleep` in the group, then exits (or, with `stay`,
    /// waits for it); returns the leader and sleep's pid.
    async fn group(stay: bool) -> (Arc<GroupLeader>, u32) {
        use tokio::io::AsyncBufReadExt;
        let script = if stay {
            "sleep 30 >/dev/null 2>&1 & echo $!; wait"
        } else {
            "sleep 30 >/dev/null 2>&1 & echo $!"
        };
        let mut cmd = host_command("sh");
        cmd.args(["-c", script])
            .stdout(std::process::Stdio::piped());
        let mut child = own_group(&mut cmd).spawn().unwrap();
        let out = child.stdout.take().unwrap();
        let leader = GroupLeader::adopt(child);
        let mut line = String::new();
        tokio::io::BufReader::new(out)
            .read_line(&mut line)
            .await
            .unwrap();
        (leader, line.trim().parse().unwrap())
    }

    async fn ended(pid: u32) -> bool {
        crate::child_process::wait_ended(pid, Duration::from_secs(5)).await
    }

    #[tokio::test]
    async fn the_rest_of_the_group_dies_with_its_leader_and_nothing_is_signalled_after() {
        let (leader, member) = group(false).await;
        let status = leader.wait_for(Duration::from_secs(5)).await.unwrap();
        assert!(status.success());
        // Killed while the leader was a zombie, before it was reaped.
        assert!(ended(member).await, "the group outlived its leader");
        assert!(leader.reaped());
        // The pid is free now: nothing goes to whatever takes it.
        assert!(!leader.signal(libc::SIGKILL));
        assert_eq!(leader.try_reap(), Some(status));
    }

    #[tokio::test]
    async fn a_running_group_is_signalled_and_then_reaped() {
        let (leader, member) = group(true).await;
        assert_eq!(leader.try_reap(), None, "it runs");
        assert!(!leader.reaped());
        assert!(leader.signal(libc::SIGKILL));
        let status = leader.wait_for(Duration::from_secs(5)).await.unwrap();
        assert!(!status.success());
        assert!(ended(member).await);
        assert!(!leader.signal(libc::SIGKILL));
    }

    #[tokio::test]
    async fn dropping_an_unreaped_leader_kills_its_group() {
        let (leader, member) = group(false).await;
        leader.exited().await;
        // Exited, not reaped: the group id is still the leader's, so this is its group.
        assert!(!leader.reaped());
        drop(leader);
        assert!(ended(member).await);
    }

    #[test]
    fn the_state_of_a_child_is_read_without_reaping_it() {
        let mut child = crate::child_process::host_command_blocking("sleep")
            .arg("0.2")
            .spawn()
            .unwrap();
        let pid = child.id();
        assert_eq!(child_state(pid), ChildState::Running);
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while child_state(pid) != ChildState::Exited {
            assert!(std::time::Instant::now() < deadline);
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(
            child_state(pid),
            ChildState::Exited,
            "still there to be reaped"
        );
        assert!(child.wait().unwrap().success());
        assert_eq!(
            child_state(pid),
            ChildState::Unknown,
            "reaped: not ours any more"
        );
    }
}
