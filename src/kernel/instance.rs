//! One running kernel, whichever transport: an `ipykernel` process ipybox launches
//! ([`super::local`]) or a kernel on a Jupyter server ([`super::gateway`]). [`Kernel`] hides
//! which: executions see the same receivers and methods either way.
//!
//! A kernel is ready when it answers `kernel_info` on shell AND the matching `status` arrived on
//! iopub (so the subscription is live before the first execute): [`handshake`]. Starting one is
//! [`super::launch`]; what an execution does with the connections is in [`super::execute`].

use std::sync::{Arc, Mutex};
use std::time::Duration;

use jupyter_protocol::messaging::Channel;
use jupyter_protocol::{JupyterMessage, KernelInfoRequest};
use tokio::sync::{mpsc, watch};

use super::KernelError;
use super::completion::Completion;
use super::gateway::connection::RemoteKernel;
use super::local::{Connected, LocalLink};
use super::status::ExitInfo;

/// A running, ready kernel: a local process or a kernel on a Jupyter server. Executions see
/// the same receivers and methods either way.
pub(crate) struct Kernel {
    pub(crate) shell_rx: mpsc::UnboundedReceiver<JupyterMessage>,
    pub(crate) iopub_rx: mpsc::UnboundedReceiver<JupyterMessage>,
    /// msg_id of an execution whose caller went away before it completed (see
    /// `execute::settle_abandoned`); shared with that execution's drop guard.
    pub(crate) abandoned: Arc<Mutex<Option<String>>>,
    link: Link,
}

/// How messages reach the kernel. (One per kernel, moved only when a kernel is swapped in: the
/// size difference between the variants does not matter.)
#[allow(clippy::large_enum_variant)]
enum Link {
    /// ZMQ over IPC sockets to a child process (see [`super::local`]).
    Local(LocalLink),
    /// A WebSocket to a Jupyter server (see [`super::gateway`]).
    Remote(RemoteKernel),
}

impl std::fmt::Debug for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.link {
            Link::Local(local) => f
                .debug_struct("Kernel")
                .field("pid", &local.pid())
                .field("dir", &local.dir())
                .finish(),
            Link::Remote(remote) => f
                .debug_struct("Kernel")
                .field("remote", &remote.describe())
                .finish(),
        }
    }
}

impl Kernel {
    /// A local kernel over its ZMQ link (not yet ready: see [`handshake`]).
    pub(super) fn local(connected: Connected) -> Self {
        Kernel {
            shell_rx: connected.shell_rx,
            iopub_rx: connected.iopub_rx,
            abandoned: Arc::new(Mutex::new(None)),
            link: Link::Local(connected.link),
        }
    }

    /// A kernel on a Jupyter server, whose messages arrive on `shell_rx` and `iopub_rx` (not yet
    /// ready: see [`handshake`]).
    pub(super) fn remote(
        remote: RemoteKernel,
        shell_rx: mpsc::UnboundedReceiver<JupyterMessage>,
        iopub_rx: mpsc::UnboundedReceiver<JupyterMessage>,
    ) -> Self {
        Kernel {
            shell_rx,
            iopub_rx,
            abandoned: Arc::new(Mutex::new(None)),
            link: Link::Remote(remote),
        }
    }

    /// The kernel's id on its Jupyter server (`None` for a local kernel).
    pub(crate) fn remote_id(&self) -> Option<&str> {
        match &self.link {
            Link::Local(_) => None,
            Link::Remote(remote) => Some(&remote.id),
        }
    }

    /// Closes the connection to a kernel on a Jupyter server and leaves it running there
    /// (another replica uses it); a local kernel is stopped as by [`Kernel::shutdown`].
    pub(crate) async fn detach(self) {
        match self.link {
            Link::Local(local) => local.shutdown().await,
            Link::Remote(remote) => remote.detach(),
        }
    }

    /// The local process id (0 for a kernel on a Jupyter server).
    pub(crate) fn pid(&self) -> u32 {
        match &self.link {
            Link::Local(local) => local.pid(),
            Link::Remote(_) => 0,
        }
    }

    /// How the kernel ended, if it has (a local process's exit status, or what the Jupyter
    /// server said).
    pub(crate) fn exited(&self) -> Option<String> {
        match &self.link {
            Link::Local(local) => local.exited(),
            Link::Remote(remote) => remote.exited(),
        }
    }

    /// A receiver that changes when the kernel ends.
    pub(crate) fn exit_watch(&self) -> watch::Receiver<Option<ExitInfo>> {
        match &self.link {
            Link::Local(local) => local.exit_watch(),
            Link::Remote(remote) => remote.exit_watch(),
        }
    }

    /// The kernel's recent stderr (local kernels), for diagnostics.
    pub(crate) fn stderr_tail(&self) -> String {
        match &self.link {
            Link::Local(local) => local.stderr_tail(),
            Link::Remote(remote) => remote.describe(),
        }
    }

    fn exited_err(&self) -> KernelError {
        match &self.link {
            Link::Local(local) => local.exited_err(),
            Link::Remote(remote) => KernelError::Start {
                reason: format!(
                    "{} ended while starting: {}",
                    remote.describe(),
                    remote.exited().unwrap_or_default()
                ),
                help: "check the Jupyter server's log for the kernel's output".into(),
            },
        }
    }

    /// Sends a request on the shell channel.
    pub(crate) async fn send_shell(&mut self, msg: JupyterMessage) -> Result<(), KernelError> {
        match &mut self.link {
            Link::Local(local) => local.send_shell(msg).await,
            Link::Remote(remote) => remote.send(Channel::Shell, msg),
        }
    }

    /// Interrupts the running code: `interrupt_request` on the control channel for a local
    /// kernel (works inside a sandbox, where a host signal would reach the sandbox wrapper), the
    /// server's interrupt endpoint for a remote one.
    pub(crate) async fn interrupt(&mut self) -> Result<(), KernelError> {
        match &mut self.link {
            Link::Local(local) => local.interrupt().await,
            Link::Remote(remote) => remote.interrupt().await,
        }
    }

    /// Stops the kernel. A local one is killed with its process group (there is no state worth
    /// a graceful shutdown, and ipykernel's own shutdown sometimes takes ~10 s) and waited for;
    /// a remote one is deleted on the server.
    pub(crate) async fn shutdown(self) {
        match self.link {
            Link::Local(local) => local.shutdown().await,
            Link::Remote(remote) => remote.shutdown().await,
        }
    }
}

/// `kernel_info`, resent until its reply AND its idle status arrived: iopub is a PUB/SUB socket,
/// so messages published before the subscription took hold are lost (the slow joiner); an idle
/// status seen means iopub is connected. (A Jupyter server's WebSocket has the same property: it
/// subscribes when the socket opens.) The first resend comes after 10 ms, then the wait doubles
/// up to 200 ms: a forked kernel is up within tens of milliseconds, and a lost first status must
/// not cost it a fixed 200 ms. A message on iopub that answers none of our requests (ipykernel 7
/// welcomes each new subscriber) proves the subscription live: the request is resent at once.
pub(super) async fn handshake(kernel: &mut Kernel) -> Result<(), KernelError> {
    let mut exit = kernel.exit_watch();
    let mut ready: Option<Completion> = None;
    let mut wait = Duration::from_millis(10);
    // Whether an iopub message of someone else's (ipykernel's `iopub_welcome` to a new
    // subscriber, say) arrived: then the subscription is live, and a request sent now gets its
    // status through.
    let mut subscribed = false;
    while !ready.as_ref().is_some_and(Completion::is_complete) {
        let req: JupyterMessage = KernelInfoRequest {}.into();
        match ready.as_mut() {
            Some(r) => r.also(req.header.msg_id.clone()),
            None => ready = Some(Completion::new(req.header.msg_id.clone())),
        }
        let Some(done) = ready.as_mut() else { break };
        kernel.send_shell(req).await?;
        let round = tokio::time::sleep(wait);
        wait = (wait * 2).min(Duration::from_millis(200));
        tokio::pin!(round);
        while !done.is_complete() {
            tokio::select! {
                Some(msg) = kernel.shell_rx.recv() => done.on_shell(msg),
                Some(msg) = kernel.iopub_rx.recv() => {
                    if !done.on_iopub(&msg) && !subscribed {
                        subscribed = true;
                        if !done.idle_seen() {
                            break; // resend now rather than at the end of the round
                        }
                    }
                }
                _ = exit.changed() => return Err(kernel.exited_err()),
                _ = &mut round => break,
            }
        }
    }
    Ok(())
}
