//! Noticing at once that a process which is not ipybox's child has ended: a forked kernel is the
//! template's child, so ipybox cannot `wait()` for it. On Linux a pidfd (`pidfd_open`, 5.3+)
//! becomes readable when the process exits, whoever its parent is and whether or not it has been
//! reaped; where that is unavailable, `/proc` is polled every 20 ms.
//!
//! Only *that* it ended: its exit status is known to its parent alone (the template reports it,
//! see [`super::template`]). Not here: children of ipybox, which tokio waits for.

use std::time::Duration;

/// Returns once process `pid` has exited (or if it does not exist).
pub(super) async fn ended(pid: u32) {
    #[cfg(target_os = "linux")]
    if let Some(fd) = pidfd(pid) {
        // SAFETY: `fd` is an OwnedFd moved into the AsyncFd: it stays open and the same for the
        // AsyncFd's lifetime.
        let registered = unsafe {
            tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE)
        };
        match registered {
            Ok(fd) => {
                // Readable = exited; an error means the fd is unusable: poll instead.
                if fd.readable().await.is_ok() {
                    return;
                }
            }
            Err(e) => tracing::debug!("cannot watch pidfd of {pid}: {}", e.into_parts().1),
        }
    }
    while !crate::child_process::process_ended(pid) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A pidfd for `pid`, or None (no such process, or no pidfd support).
#[cfg(target_os = "linux")]
fn pidfd(pid: u32) -> Option<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    let pid = libc::pid_t::try_from(pid).ok()?;
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return None;
    }
    let fd = i32::try_from(fd).ok()?;
    // SAFETY: the descriptor was just created and is owned by nothing else.
    Some(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn notices_the_end_of_a_process_it_did_not_start() {
        // `sh` starts `sleep` and exits: `sleep` is not our child.
        let out = crate::child_process::host_command_blocking("sh")
            .args(["-c", "sleep 0.5 >/dev/null 2>&1 & echo $!"])
            .output()
            .unwrap();
        let pid: u32 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
        assert!(!crate::child_process::process_ended(pid));
        let start = std::time::Instant::now();
        tokio::time::timeout(Duration::from_secs(5), ended(pid))
            .await
            .expect("noticed");
        let took = start.elapsed();
        assert!(took >= Duration::from_millis(150), "too early: {took:?}");
        assert!(crate::child_process::process_ended(pid));
        // A process that is gone already.
        tokio::time::timeout(Duration::from_secs(1), ended(pid))
            .await
            .expect("gone at once");
    }
}
