//! The factory's Unix socket, `<runtime dir>/factory/sock` (mode 0600): where the template and
//! every kernel it forks connect back to ipybox and say who they are, `ipybox-factory TOKEN\n`,
//! with a token ipybox handed out for that one connection ([`Listener::expect`]). Each
//! connection goes to whoever waits for its token, with the peer's pid from `SO_PEERCRED`, which
//! the kernel translates into ipybox's pid namespace (so it is right for a kernel inside the
//! sandbox's pid namespace too; see [`super::template`] for how that pid is checked). A
//! connection with an unknown or already used token, or one that does not greet within 1 s, is
//! closed, as is one accepted while [`MAX_GREETING`] others are greeting.
//!
//! A path-named Unix socket rather than an inherited descriptor, because it crosses the sandbox
//! wrapper (srt passes a command only its stdio) and its network namespace, as the tool socket
//! does. Not here: what the connections carry afterwards ([`super::template`]).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::net::UnixListener;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::{Semaphore, oneshot};
use tokio::task::JoinHandle;

/// What a connection says first.
pub(super) const HELLO: &str = "ipybox-factory";

/// How many connections may be greeting at once (each is a task and a descriptor); one more is
/// closed as soon as it is accepted.
const MAX_GREETING: usize = 32;

/// How long a connection may take to greet (ipybox's template and kernels greet as soon as they
/// connect).
const GREETING_TIMEOUT: Duration = Duration::from_secs(1);

/// A connection that said its token.
pub(super) struct Hello {
    /// The peer's process id in ipybox's pid namespace.
    pub(super) pid: Option<u32>,
    /// What the peer sends after its greeting (buffered: it may already hold some).
    pub(super) reader: BufReader<OwnedReadHalf>,
    /// Ours to write; dropping it is the peer's EOF.
    pub(super) writer: OwnedWriteHalf,
}

type Waiting = Arc<Mutex<HashMap<String, oneshot::Sender<Hello>>>>;

/// The bound socket and its accept loop. Dropping it stops accepting and removes the file.
pub(crate) struct Listener {
    path: PathBuf,
    waiting: Waiting,
    task: JoinHandle<()>,
}

impl Listener {
    /// Binds `path` (0600) and accepts in the background.
    pub(super) fn bind(path: &Path) -> std::io::Result<Self> {
        let _ = std::fs::remove_file(path);
        let listener = UnixListener::bind(path)?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
        let waiting: Waiting = Arc::default();
        let routes = waiting.clone();
        let task = tokio::spawn(async move {
            let greeting = Arc::new(Semaphore::new(MAX_GREETING));
            loop {
                // Accept always (a full backlog would fail every fork), then close what is over
                // the limit at once: idle connections from the sandbox cannot stall the hellos.
                let stream = match listener.accept().await {
                    Ok((stream, _)) => stream,
                    Err(e) => {
                        tracing::warn!("kernel factory: accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let Ok(permit) = greeting.clone().try_acquire_owned() else {
                    tracing::debug!(
                        "kernel factory: {MAX_GREETING} connections are greeting; closing another"
                    );
                    continue;
                };
                let routes = routes.clone();
                tokio::spawn(async move {
                    let _permit = permit;
                    let pid = stream
                        .peer_cred()
                        .ok()
                        .and_then(|c| c.pid())
                        .and_then(|p| u32::try_from(p).ok());
                    let (read, writer) = stream.into_split();
                    let mut reader = BufReader::new(read);
                    let mut line = String::new();
                    let greeted = tokio::time::timeout(
                        GREETING_TIMEOUT,
                        (&mut reader).take(128).read_line(&mut line),
                    )
                    .await;
                    if !matches!(greeted, Ok(Ok(n)) if n > 0) {
                        return;
                    }
                    let Some(token) = line
                        .trim_end()
                        .strip_prefix(HELLO)
                        .and_then(|t| t.strip_prefix(' '))
                    else {
                        return;
                    };
                    let waiter = routes
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .remove(token);
                    if let Some(waiter) = waiter {
                        let _ = waiter.send(Hello {
                            pid,
                            reader,
                            writer,
                        });
                    }
                });
            }
        });
        Ok(Self {
            path: path.to_path_buf(),
            waiting,
            task,
        })
    }

    pub(super) fn path(&self) -> &Path {
        &self.path
    }

    /// A fresh token and the wait for the one connection that will say it.
    pub(super) fn expect(&self) -> Expected {
        let token = uuid::Uuid::new_v4().simple().to_string();
        let (tx, rx) = oneshot::channel();
        self.waiting
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(token.clone(), tx);
        Expected {
            token,
            rx,
            waiting: self.waiting.clone(),
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.task.abort();
        let _ = std::fs::remove_file(&self.path);
    }
}

/// A token handed out and the connection that will say it. Dropping it withdraws the token.
pub(super) struct Expected {
    pub(super) token: String,
    rx: oneshot::Receiver<Hello>,
    waiting: Waiting,
}

impl Expected {
    /// The connection, once it greeted; None if the listener is gone.
    pub(super) async fn hello(&mut self) -> Option<Hello> {
        (&mut self.rx).await.ok()
    }
}

impl Drop for Expected {
    fn drop(&mut self) {
        self.waiting
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.token);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;
    use tokio::net::UnixStream;

    #[tokio::test]
    async fn idle_connections_do_not_stall_a_hello() {
        let dir = tempfile::tempdir().unwrap();
        let listener = Listener::bind(&dir.path().join("sock")).unwrap();
        // More idle connections than greeting slots (sandboxed code can make them).
        let mut idle = Vec::new();
        for _ in 0..MAX_GREETING + 8 {
            idle.push(UnixStream::connect(listener.path()).await.unwrap());
        }
        let mut expected = listener.expect();
        let started = std::time::Instant::now();
        let hello = loop {
            let mut conn = UnixStream::connect(listener.path()).await.unwrap();
            let _ = conn
                .write_all(format!("{HELLO} {}\n", expected.token).as_bytes())
                .await;
            if let Ok(Some(hello)) =
                tokio::time::timeout(Duration::from_millis(100), expected.hello()).await
            {
                break hello;
            }
            // Closed because the slots were full: the idle ones time out within 1 s.
            assert!(started.elapsed() < Duration::from_secs(3), "hello stalled");
        };
        assert_eq!(hello.pid, Some(std::process::id()));
        assert!(started.elapsed() < GREETING_TIMEOUT * 2);
    }
}
