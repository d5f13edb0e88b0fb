//! One running kernel, whichever transport: an `ipykernel` process ipybox launches
//! ([`super::local`]) or a kernel on a Jupyter server ([`super::gateway`]). [`Kernel`] hides
//! which: executions see the same receivers and methods either way.
//!
//! A kernel is ready when it answers `kernel_info` on shell AND the matching `status` arrived on
//! iopub (so the subscription is live before the first execute). What an execution does with
//! the connections is in [`super::execute`].

use std::sync::atomic::AtomicU32;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use jupyter_protocol::messaging::Channel;
use jupyter_protocol::{JupyterMessage, KernelInfoRequest};
use tokio::sync::{mpsc, watch};

use super::completion::Completion;
use super::gateway::Gateway;
use super::gateway::connection::{Inbound, RemoteKernel};
use super::local::{self, LocalLink};
use super::runtime_dir::KernelDirs;
use super::{Backend, KernelConfig, KernelError};

/// How a kernel ended.
#[derive(Debug, Clone)]
pub(crate) struct ExitInfo(pub String);

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
    /// Starts a kernel as `config` says (a local process in `dir`, or a kernel on a Jupyter
    /// server) and waits until it answers. `pid` receives a local process's id as soon as the
    /// process exists, so whoever abandons a launch can wait for the process to end.
    pub(crate) async fn launch(
        config: &KernelConfig,
        dir: KernelDirs,
        pid: &AtomicU32,
    ) -> Result<Kernel, KernelError> {
        match &config.backend {
            Backend::Local => Self::launch_local(config, dir, pid).await,
            Backend::Gateway(gateway) => {
                dir.remove();
                Self::launch_remote(config, gateway).await
            }
        }
    }

    async fn launch_local(
        config: &KernelConfig,
        dir: KernelDirs,
        pid: &AtomicU32,
    ) -> Result<Kernel, KernelError> {
        let started = Instant::now();
        let (info, process) = local::spawn(config, dir, pid)?;
        let deadline = tokio::time::Instant::from(started + config.start_timeout);
        let ready = async {
            let connected = local::connect(&info, process).await?;
            let mut kernel = Kernel {
                shell_rx: connected.shell_rx,
                iopub_rx: connected.iopub_rx,
                abandoned: Arc::new(Mutex::new(None)),
                link: Link::Local(connected.link),
            };
            handshake(&mut kernel).await?;
            Ok::<_, KernelError>(kernel)
        };
        match tokio::time::timeout_at(deadline, ready).await {
            Ok(result) => {
                let kernel = result?;
                tracing::debug!(
                    pid = kernel.pid(),
                    elapsed_ms = started.elapsed().as_millis() as u64,
                    "kernel ready"
                );
                Ok(kernel)
            }
            // The process guard was moved into the cancelled future and dropped: kernel killed.
            Err(_) => Err(local::start_err(format!(
                "no kernel_info reply within {} s",
                config.start_timeout.as_secs()
            ))),
        }
    }

    /// Creates a kernel on the Jupyter server, waits until it answers, and runs the bootstrap
    /// cell. A kernel that fails any step is deleted again.
    async fn launch_remote(
        config: &KernelConfig,
        gateway: &Gateway,
    ) -> Result<Kernel, KernelError> {
        let started = Instant::now();
        let (shell, shell_rx) = mpsc::unbounded_channel();
        let (iopub, iopub_rx) = mpsc::unbounded_channel();
        let ready = async {
            let remote = RemoteKernel::create(
                gateway,
                config.ledger.as_ref(),
                &config.env,
                Inbound { shell, iopub },
                config.input_handler.clone(),
            )
            .await?;
            let mut kernel = Kernel {
                shell_rx,
                iopub_rx,
                abandoned: Arc::new(Mutex::new(None)),
                link: Link::Remote(remote),
            };
            handshake(&mut kernel).await?;
            let code = super::gateway::bootstrap::cell(config, &super::RUNTIME);
            super::execute::bootstrap(&mut kernel, config, &code).await?;
            Ok::<_, KernelError>(kernel)
        };
        match tokio::time::timeout(config.start_timeout, ready).await {
            Ok(result) => {
                let kernel = result?;
                tracing::debug!(
                    kernel = ?kernel,
                    elapsed_ms = started.elapsed().as_millis() as u64,
                    "remote kernel ready"
                );
                Ok(kernel)
            }
            Err(_) => Err(KernelError::Start {
                reason: format!(
                    "the kernel on {} did not answer within {} s",
                    gateway.url(),
                    config.start_timeout.as_secs()
                ),
                help: "check the Jupyter server's log; a cluster may need longer to schedule a kernel (kernel_start_timeout)".into(),
            }),
        }
    }

    /// Connects to kernel `id` that already runs on `gateway` (created and set up by another
    /// ipybox: replicas sharing a server's kernels), waits until it answers, and checks that
    /// ipybox's runtime is in it (a kernel the server restarted lost it: that counts as gone).
    /// Nothing of the user's state is touched.
    pub(crate) async fn attach_remote(
        config: &KernelConfig,
        gateway: &Gateway,
        id: &str,
    ) -> Result<Kernel, KernelError> {
        let (shell, shell_rx) = mpsc::unbounded_channel();
        let (iopub, iopub_rx) = mpsc::unbounded_channel();
        let ready = async {
            let remote = RemoteKernel::attach(
                gateway,
                id,
                Inbound { shell, iopub },
                config.input_handler.clone(),
            )
            .await?;
            let mut kernel = Kernel {
                shell_rx,
                iopub_rx,
                abandoned: Arc::new(Mutex::new(None)),
                link: Link::Remote(remote),
            };
            handshake(&mut kernel).await?;
            if super::execute::bootstrap(&mut kernel, config, super::gateway::bootstrap::PROBE)
                .await
                .is_err()
            {
                // Not ours to delete: detach and report it gone.
                kernel.detach().await;
                return Err(KernelError::Gone {
                    what: format!(
                        "kernel {id} on the kernel gateway at {} lost ipybox's runtime (the server restarted it): its state is gone",
                        gateway.url()
                    ),
                });
            }
            Ok::<_, KernelError>(kernel)
        };
        match tokio::time::timeout(config.start_timeout, ready).await {
            Ok(result) => result,
            Err(_) => Err(KernelError::Start {
                reason: format!(
                    "kernel {id} on {} did not answer within {} s",
                    gateway.url(),
                    config.start_timeout.as_secs()
                ),
                help: "check the Jupyter server's log".into(),
            }),
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

/// `kernel_info`, resent every 200 ms until its reply AND its idle status arrived: iopub is a
/// PUB/SUB socket, so messages published before the subscription took hold are lost (the slow
/// joiner); an idle status seen means iopub is connected. (A Jupyter server's WebSocket has the
/// same property: it subscribes when the socket opens.)
async fn handshake(kernel: &mut Kernel) -> Result<(), KernelError> {
    let mut exit = kernel.exit_watch();
    let mut ready: Option<Completion> = None;
    while !ready.as_ref().is_some_and(Completion::is_complete) {
        let req: JupyterMessage = KernelInfoRequest {}.into();
        match ready.as_mut() {
            Some(r) => r.also(req.header.msg_id.clone()),
            None => ready = Some(Completion::new(req.header.msg_id.clone())),
        }
        let Some(done) = ready.as_mut() else { break };
        kernel.send_shell(req).await?;
        let round = tokio::time::sleep(Duration::from_millis(200));
        tokio::pin!(round);
        while !done.is_complete() {
            tokio::select! {
                Some(msg) = kernel.shell_rx.recv() => done.on_shell(msg),
                Some(msg) = kernel.iopub_rx.recv() => {
                    done.on_iopub(&msg);
                }
                _ = exit.changed() => return Err(kernel.exited_err()),
                _ = &mut round => break,
            }
        }
    }
    Ok(())
}
