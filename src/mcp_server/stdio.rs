//! Serving the MCP server on stdio, and leaving within [`EXIT_BUDGET`] (100 ms) when the client
//! goes away: stdin EOF, SIGTERM or SIGINT, also while cells run, calls queue and tool calls are
//! in flight. Claude Code sends SIGINT, then SIGTERM ~100 ms later and SIGKILL soon after, and a
//! SIGKILLed ipybox leaves its processes for the next start to sweep.
//!
//! rmcp ends a session on EOF only after its in-flight requests are answered (it waits up to
//! ~5 s for them), and a running cell answers only when it ends. So ipybox watches stdin itself
//! ([`EofSignal`]): at EOF, or at a signal, it stops the executor at once
//! ([`ipybox::CodeExecutor::stop_now`]: every kernel, template and stdio MCP server killed by
//! process group, the runtime directory removed before it returns), cancels the rmcp service
//! (the client that went away gets no answers) and returns. stdin is read without a blocking
//! thread when it is a pipe or socket ([`Stdin`]): a thread blocked in `read` would hold the
//! runtime's shutdown.
//!
//! Not here: the tools ([`super`]); HTTP (`crate::http`), which drains calls gracefully.

use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, ReadBuf};
use tokio_util::sync::CancellationToken;

use serde_json::{Value, json};

use super::IpyboxServer;

/// From EOF or a signal to the process's exit.
const EXIT_BUDGET: Duration = Duration::from_millis(100);

/// What stopping the executor may take of [`EXIT_BUDGET`] (it normally takes a few ms; a
/// running execution is abandoned first). Past it, ipybox returns anyway: what is left is
/// dropped with the runtime, whose drops kill process groups too.
const STOP_BUDGET: Duration = Duration::from_millis(60);

/// With kernels on a Jupyter server (`--kernel-gateway`) nothing can be killed from here: they
/// are deleted over REST within this (else the next start's ledger deletes them).
const REMOTE_STOP_BUDGET: Duration = Duration::from_millis(1700);

/// An [`AsyncRead`] that cancels `eof` when the inner reader reports end of file (or fails),
/// and `read` when it has given a first byte.
struct EofSignal<R> {
    inner: R,
    eof: CancellationToken,
    read: CancellationToken,
}

impl<R: AsyncRead + Unpin> AsyncRead for EofSignal<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let asked = buf.remaining() > 0;
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        match &polled {
            Poll::Ready(Ok(())) if asked && buf.filled().len() == before => self.eof.cancel(),
            Poll::Ready(Ok(())) if buf.filled().len() > before => self.read.cancel(),
            Poll::Ready(Err(_)) => self.eof.cancel(),
            _ => {}
        }
        polled
    }
}

/// The process's stdin. A pipe or socket (what an MCP client gives its server) is read
/// non-blocking through the runtime's reactor; anything else (a terminal, a file) through
/// tokio's stdin, which reads on a blocking thread.
enum Stdin {
    Polled(PolledFd),
    Threaded(tokio::io::Stdin),
}

/// A duplicate of fd 0 in non-blocking mode; the file status flags are restored on drop (they
/// belong to the open file description, which others may share).
struct PolledFd {
    fd: AsyncFd<OwnedFd>,
    flags: i32,
}

impl Stdin {
    fn open() -> Self {
        match PolledFd::open() {
            Some(fd) => Stdin::Polled(fd),
            None => Stdin::Threaded(tokio::io::stdin()),
        }
    }
}

impl PolledFd {
    fn open() -> Option<Self> {
        use std::os::unix::fs::FileTypeExt;
        // SAFETY: fd 0 is open for the life of the process (if it is not, dup fails below).
        let stdin = unsafe { BorrowedFd::borrow_raw(0) };
        let fd = stdin.try_clone_to_owned().ok()?;
        let kind = std::fs::File::from(fd.try_clone().ok()?)
            .metadata()
            .ok()?
            .file_type();
        if !(kind.is_fifo() || kind.is_socket()) {
            return None;
        }
        // SAFETY: plain fcntl calls on a descriptor we own.
        let flags = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) };
        if flags < 0
            || unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0
        {
            return None;
        }
        // SAFETY: the `OwnedFd` is a valid descriptor that the `AsyncFd` owns from now on and
        // that nothing replaces or closes meanwhile.
        match unsafe { AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) } {
            Ok(fd) => Some(Self { fd, flags }),
            Err(e) => {
                tracing::debug!("stdin cannot be polled ({e}): reading it on a thread");
                // SAFETY: puts back the flags of stdin's open file description.
                unsafe { libc::fcntl(0, libc::F_SETFL, flags) };
                None
            }
        }
    }
}

impl Drop for PolledFd {
    fn drop(&mut self) {
        // SAFETY: restores the flags read at open on a descriptor we still own.
        unsafe { libc::fcntl(self.fd.get_ref().as_raw_fd(), libc::F_SETFL, self.flags) };
    }
}

impl AsyncRead for Stdin {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stdin::Threaded(stdin) => Pin::new(stdin).poll_read(cx, buf),
            Stdin::Polled(polled) => loop {
                let mut guard = std::task::ready!(polled.fd.poll_read_ready(cx))?;
                let unfilled = buf.initialize_unfilled();
                let read = guard.try_io(|fd| {
                    // SAFETY: reads into the initialized, unfilled part of `buf`.
                    let n = unsafe {
                        libc::read(
                            fd.get_ref().as_raw_fd(),
                            unfilled.as_mut_ptr().cast(),
                            unfilled.len(),
                        )
                    };
                    if n < 0 {
                        Err(std::io::Error::last_os_error())
                    } else {
                        Ok(n as usize)
                    }
                });
                match read {
                    Ok(Ok(n)) => {
                        buf.advance(n);
                        return Poll::Ready(Ok(()));
                    }
                    Ok(Err(e)) => return Poll::Ready(Err(e)),
                    Err(_would_block) => continue,
                }
            },
        }
    }
}

/// Why serving is ending (for the log).
#[derive(Debug)]
enum End {
    Eof,
    Signal(#[allow(dead_code)] &'static str),
    /// The MCP session ended (rmcp's reason).
    Session(#[allow(dead_code)] String),
}

/// Serves `server` on stdio until the client closes stdin, the session ends, or SIGTERM/SIGINT
/// arrives; then stops the kernels, MCP child servers and sockets (within [`EXIT_BUDGET`] when
/// the client went away).
pub(crate) async fn serve_stdio(server: IpyboxServer) -> Result<(), std::io::Error> {
    use rmcp::ServiceExt;
    use tokio::signal::unix::{SignalKind, signal};
    let executor = server.executor().clone();
    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sigint = signal(SignalKind::interrupt())?;
    let eof = CancellationToken::new();
    let read = CancellationToken::new();
    let stdin = EofSignal {
        inner: Stdin::open(),
        eof: eof.clone(),
        read: read.clone(),
    };
    let serving = server.serve((stdin, tokio::io::stdout()));
    let (service, end) = tokio::select! {
        running = serving => match running {
            Ok(service) => (Some(service), None),
            Err(e) => {
                stop_now(&executor, Instant::now()).await;
                // stdin closed (Ctrl-D or Ctrl-C on a terminal, `< /dev/null`) before any
                // byte came: no client connected, nothing failed. A first message that came
                // but was not an MCP one is an error.
                if eof.is_cancelled() && !read.is_cancelled() {
                    tracing::info!("stdin closed before an MCP client sent a message: stopped");
                    return Ok(());
                }
                return Err(std::io::Error::other(format!("MCP initialization failed: {e}")));
            }
        },
        _ = sigterm.recv() => (None, Some(End::Signal("SIGTERM"))),
        _ = sigint.recv() => (None, Some(End::Signal("SIGINT"))),
    };
    let Some(service) = service else {
        stop_now(&executor, Instant::now()).await;
        tracing::info!("{end:?} before the session started: stopped");
        return Ok(());
    };
    let cancel = service.cancellation_token();
    let mut waiting = Box::pin(service.waiting());
    // The session ends by itself when rmcp sees stdin's end (often before `eof` is noticed
    // here): the client is gone either way.
    let end = tokio::select! {
        reason = &mut waiting => End::Session(format!("{reason:?}")),
        _ = eof.cancelled() => End::Eof,
        _ = sigterm.recv() => End::Signal("SIGTERM"),
        _ = sigint.recv() => End::Signal("SIGINT"),
    };
    let started = Instant::now();
    stop_now(&executor, started).await;
    // The client is gone or going: the answers of the calls that were in flight (they failed
    // when the executor stopped) are not written. Handlers that do not depend on the executor
    // (a registration connecting to a server that never answers) are dropped with the runtime,
    // which kills their child processes.
    cancel.cancel();
    let took = started.elapsed();
    if took > EXIT_BUDGET {
        tracing::warn!(
            "{end:?}: stopping took {} ms (the client waits {} ms before it kills ipybox)",
            took.as_millis(),
            EXIT_BUDGET.as_millis()
        );
    } else {
        tracing::info!("{end:?}: stopped in {} ms", took.as_millis());
    }
    Ok(())
}

/// The JSON-RPC error code of [`refuse_stdio`]'s answers (internal error: the server cannot
/// work here; nothing is wrong with the request).
const REFUSED_CODE: i64 = -32603;

/// Serves a server that cannot work here (`--sandbox` without srt, say): every request, the
/// opening `server/discover` or `initialize` included, is answered with a JSON-RPC error whose
/// message is `reason` on one line (Claude Code shows it in `claude mcp list` and `/mcp` as the
/// reason the server failed: "✘ Failed to connect — -32603: ipybox cannot run code: …"), until
/// the client closes stdin or a signal comes. A client then never shows a server that connected
/// but fails at its first cell.
pub(crate) async fn refuse_stdio(reason: &str) -> Result<(), std::io::Error> {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    use tokio::signal::unix::{SignalKind, signal};
    let message = reason.lines().map(str::trim).collect::<Vec<_>>().join("; ");
    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut lines = BufReader::new(Stdin::open()).lines();
    let mut stdout = tokio::io::stdout();
    loop {
        let line = tokio::select! {
            line = lines.next_line() => line?,
            _ = sigterm.recv() => None,
            _ = sigint.recv() => None,
        };
        let Some(line) = line else { return Ok(()) };
        let Ok(request) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        // Requests only: notifications (no id) and responses (no method) get no answer.
        let (Some(id), Some(_)) = (request.get("id"), request.get("method")) else {
            continue;
        };
        let answer = json!({
            "jsonrpc": "2.0",
            "id": id,
            "error": {"code": REFUSED_CODE, "message": message},
        });
        let mut bytes = serde_json::to_vec(&answer).unwrap_or_default();
        bytes.push(b'\n');
        stdout.write_all(&bytes).await?;
        stdout.flush().await?;
    }
}

/// Stops the executor at once, bounded by [`STOP_BUDGET`] (kernels on a Jupyter server:
/// [`REMOTE_STOP_BUDGET`]) from `started`.
async fn stop_now(executor: &ipybox::CodeExecutor, started: Instant) {
    let budget = if executor.uses_kernel_gateway() {
        REMOTE_STOP_BUDGET
    } else {
        STOP_BUDGET
    };
    if tokio::time::timeout_at((started + budget).into(), executor.stop_now())
        .await
        .is_err()
    {
        tracing::warn!(
            "stopping took longer than {} ms; exiting anyway (what is left is killed as ipybox exits)",
            budget.as_millis()
        );
    }
}
