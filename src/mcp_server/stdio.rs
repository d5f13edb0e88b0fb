//! Serving the MCP server on stdio, and shutting everything down within 2 s when the client goes
//! away: stdin EOF, SIGTERM or SIGINT, also while cells run, calls queue and tool calls are in
//! flight.
//!
//! rmcp ends a session on EOF only after its in-flight requests are answered (it waits up to
//! ~5 s for them), and a running cell answers only when it ends. So ipybox watches stdin itself
//! ([`EofSignal`]): at EOF it stops the executor first (kernels, tool server and MCP child
//! servers go; the running and queued calls fail at once), then lets rmcp finish.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, ReadBuf};
use tokio_util::sync::CancellationToken;

use super::IpyboxServer;

/// Everything is gone within this long after EOF or a signal.
const SHUTDOWN_BUDGET: Duration = Duration::from_millis(1700);

/// How long rmcp may take to write the last answers after the executor stopped.
const FLUSH_GRACE: Duration = Duration::from_millis(200);

/// An [`AsyncRead`] that cancels `eof` when the inner reader reports end of file (or fails).
struct EofSignal<R> {
    inner: R,
    eof: CancellationToken,
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
            Poll::Ready(Err(_)) => self.eof.cancel(),
            _ => {}
        }
        polled
    }
}

/// Why serving is ending (for the log).
#[derive(Debug)]
enum End {
    Eof,
    Signal(#[allow(dead_code)] &'static str),
}

/// Serves `server` on stdio until the client closes stdin, the session ends, or SIGTERM/SIGINT
/// arrives; then stops the kernels, MCP child servers and sockets, all within 2 s.
pub(crate) async fn serve_stdio(server: IpyboxServer) -> Result<(), std::io::Error> {
    use rmcp::ServiceExt;
    use tokio::signal::unix::{SignalKind, signal};
    let executor = server.executor().clone();
    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sigint = signal(SignalKind::interrupt())?;
    let eof = CancellationToken::new();
    let stdin = EofSignal {
        inner: tokio::io::stdin(),
        eof: eof.clone(),
    };
    let serving = server.serve((stdin, tokio::io::stdout()));
    let (service, end) = tokio::select! {
        running = serving => match running {
            Ok(service) => (Some(service), None),
            Err(e) => return finish(executor, None, Err(std::io::Error::other(format!("MCP initialization failed: {e}")))).await,
        },
        _ = sigterm.recv() => (None, Some(End::Signal("SIGTERM"))),
        _ = sigint.recv() => (None, Some(End::Signal("SIGINT"))),
    };
    let Some(service) = service else {
        tracing::info!("{end:?} before the session started: shutting down");
        return finish(executor, None, Ok(())).await;
    };
    let cancel = service.cancellation_token();
    let mut waiting = Box::pin(service.waiting());
    let end = tokio::select! {
        reason = &mut waiting => {
            tracing::info!("MCP session ended ({reason:?})");
            return finish(executor, None, Ok(())).await;
        }
        _ = eof.cancelled() => End::Eof,
        _ = sigterm.recv() => End::Signal("SIGTERM"),
        _ = sigint.recv() => End::Signal("SIGINT"),
    };
    tracing::info!("{end:?}: shutting down");
    let deadline = Instant::now() + SHUTDOWN_BUDGET;
    let stopped = finish(executor, Some(deadline), Ok(())).await;
    cancel.cancel();
    // rmcp now writes the answers of the failed calls. It would also wait for handlers that do
    // not depend on the executor (a registration connecting to a server that never answers):
    // those are dropped with the runtime, which kills their child processes.
    let flush = (Instant::now() + FLUSH_GRACE).min(deadline);
    let _ = tokio::time::timeout_at(flush.into(), waiting).await;
    stopped
}

/// Stops the executor, bounded by `deadline` (default: the budget from now), and returns `outcome`.
async fn finish(
    executor: ipybox::CodeExecutor,
    deadline: Option<Instant>,
    outcome: Result<(), std::io::Error>,
) -> Result<(), std::io::Error> {
    let deadline = deadline.unwrap_or_else(|| Instant::now() + SHUTDOWN_BUDGET);
    if tokio::time::timeout_at(deadline.into(), executor.stop())
        .await
        .is_err()
    {
        tracing::warn!(
            "shutdown took longer than 2 s; exiting anyway (kernels exit when ipybox does)"
        );
    }
    outcome
}
