//! Noticing at once that a process which is not ipybox's child has ended: a forked kernel is the
//! template's child, so ipybox cannot `wait()` for it. ipybox holds a pidfd for it (opened when
//! the kernel connected, see [`super::template`]), which becomes readable when the process exits,
//! whoever its parent is and whether or not it has been reaped; if the pidfd cannot be
//! registered with the event loop, it is polled every 20 ms. The pidfd is never re-opened by pid:
//! it keeps naming the kernel even after its pid is reused.
//!
//! Only *that* it ended: its exit status is known to its parent alone (the template reports it,
//! see [`super::template`]). Not here: children of ipybox, which tokio waits for.

use std::sync::Arc;
use std::time::Duration;

use crate::child_process::PidFd;

/// Returns once the process of `pidfd` has exited.
pub(super) async fn ended(pidfd: Arc<PidFd>) {
    let pid = pidfd.pid();
    // SAFETY: the AsyncFd holds an Arc of the PidFd, whose descriptor stays open and the same
    // for the AsyncFd's lifetime.
    let registered = unsafe {
        tokio::io::unix::AsyncFd::register_with_interest(
            pidfd.clone(),
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
        Err(e) => tracing::debug!("cannot watch the pidfd of {pid}: {}", e.into_parts().1),
    }
    while pidfd.alive() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
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
        let fd = Arc::new(PidFd::open(pid).expect("pidfd"));
        assert!(fd.alive());
        let start = std::time::Instant::now();
        tokio::time::timeout(Duration::from_secs(5), ended(fd.clone()))
            .await
            .expect("noticed");
        let took = start.elapsed();
        assert!(took >= Duration::from_millis(150), "too early: {took:?}");
        assert!(crate::child_process::process_ended(pid));
        assert!(!fd.alive());
        // A process that is gone already.
        tokio::time::timeout(Duration::from_secs(1), ended(fd))
            .await
            .expect("gone at once");
    }
}
