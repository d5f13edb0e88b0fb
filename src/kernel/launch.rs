//! Starting a kernel as the config says, up to ready: a local process (forked by the kernel
//! factory, else launched plainly) or a kernel on a Jupyter server (created, handshaken, then
//! bootstrapped with ipybox's setup cell, or one another replica created, attached to).
//!
//! This is the one place that knows every way a kernel starts, so it sits above the transports
//! ([`super::local`], [`super::gateway`]), the factory ([`super::factory`]), the running kernel
//! ([`super::instance`]) and executions ([`super::execute`], for the bootstrap cell); none of
//! them imports it. Not here: when kernels are started (the pool, [`super::pool`]).

use std::sync::atomic::AtomicU32;
use std::time::Instant;

use tokio::sync::mpsc;

use super::factory::Factory;
use super::gateway::Gateway;
use super::gateway::connection::{Inbound, RemoteKernel};
use super::instance::{Kernel, handshake};
use super::local::{self, Process};
use super::runtime_dir::KernelDirs;
use super::status::start_err;
use super::{Backend, KernelConfig, KernelError};
use jupyter_protocol::ConnectionInfo;

/// Starts a kernel as `config` says (a local process in `dir`, or a kernel on a Jupyter server)
/// and waits until it answers. `pid` receives a local process's id as soon as it is known, so
/// whoever abandons a launch can wait for the process to end. Local kernels come from `factory`
/// when there is one; if a forked kernel fails to start, the failure is logged, the factory is
/// told (it rebuilds its template) and the kernel is launched plainly instead.
pub(crate) async fn launch(
    config: &KernelConfig,
    factory: Option<&Factory>,
    dir: KernelDirs,
    pid: &AtomicU32,
) -> Result<Kernel, KernelError> {
    match &config.backend {
        Backend::Local => {
            if let Some(factory) = factory
                && let Some(template) = factory.template().await
            {
                let started = Instant::now();
                let forked = template.fork(config, dir.clone(), pid);
                match until_ready(config, started, forked).await {
                    Ok(kernel) => {
                        factory.forked_ok();
                        return Ok(kernel);
                    }
                    Err(e) => factory.fork_failed(&template, &e),
                }
                // The failed fork may have left its connection file, or removed the directories.
                dir.recreate().map_err(|e| {
                    start_err(format!(
                        "cannot recreate {} after a failed fork: {e}",
                        dir.host.display()
                    ))
                })?;
            }
            let started = Instant::now();
            let spawned = local::spawn(config, dir, pid);
            until_ready(config, started, async { spawned }).await
        }
        Backend::Gateway(gateway) => {
            dir.remove();
            launch_remote(config, gateway).await
        }
    }
}

/// A local kernel process that `start` brings up, connected and handshaken within the start
/// timeout (counted from `started`).
async fn until_ready(
    config: &KernelConfig,
    started: Instant,
    start: impl std::future::Future<Output = Result<(ConnectionInfo, Process), KernelError>>,
) -> Result<Kernel, KernelError> {
    let deadline = tokio::time::Instant::from(started + config.start_timeout);
    let ready = async {
        let (info, process) = start.await?;
        let spawned_ms = started.elapsed().as_millis() as u64;
        let connected = local::connect(&info, process).await?;
        let connected_ms = started.elapsed().as_millis() as u64;
        let mut kernel = Kernel::local(connected);
        handshake(&mut kernel).await?;
        tracing::debug!(
            spawned_ms,
            connected_ms,
            "kernel started, sockets connected"
        );
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
        Err(_) => Err(start_err(format!(
            "no kernel_info reply within {} s",
            config.start_timeout.as_secs()
        ))),
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
        let mut kernel = Kernel::remote(remote, shell_rx, iopub_rx);
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

/// Creates a kernel on the Jupyter server, waits until it answers, and runs the bootstrap
/// cell. A kernel that fails any step is deleted again.
async fn launch_remote(config: &KernelConfig, gateway: &Gateway) -> Result<Kernel, KernelError> {
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
        let mut kernel = Kernel::remote(remote, shell_rx, iopub_rx);
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
