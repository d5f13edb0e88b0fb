//! The current kernel plus warm spares (one by default), and the kernel factory they come from.
//!
//! Spares are started in the background, so `reset()` and the restarts after a timeout or a
//! kernel death swap in a ready kernel instead of waiting for one to start. Each swap starts a
//! replacement spare: forked from the factory's template that takes tens of milliseconds,
//! launched plainly ~0.4 s; resets that come faster than that use up the spares, then wait for a
//! start. When spares start is a matter of what they cost ([`KernelPool::spares_on`]): with the
//! kernel factory at the first swap (until then a reset forks its kernel and waits ~0.1 s for
//! it, and a session that never resets keeps no idle kernel: ~15 MB PSS less), without it once
//! the first kernel is ready (a plain launch or a Jupyter server's kernel takes ~0.4 s and
//! more). While resets come faster than a forked kernel starts, one more spare is kept (see
//! [`BURST_EXTRA`]): two kernels start side by side, so a reset waits about half a start.
//! This module decides *when* kernels are started and replaced; starting one is
//! [`super::launch`] (and [`super::factory`]), running code is [`super::execute`].

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::execute::{self, ExecEvent, ExecutionOutput};
use super::factory::Factory;
use super::instance::Kernel;
use super::launch::{attach_remote, launch};
use super::runtime_dir::{KernelDirs, RuntimeDir};
use super::{Backend, KernelConfig, KernelError};
use crate::pause::TimeoutPause;

/// Spares kept beyond the configured count while resets come faster than a kernel starts (a
/// reset found its spare still starting), with the kernel factory only: forks share the
/// template's pages and start side by side, so back-to-back resets wait about half a start
/// (issue 40). Plain launches and Jupyter servers' kernels cost too much to start ahead.
const BURST_EXTRA: usize = 1;

/// A burst of resets is over when a reset finds every remaining spare ready, or when no swap
/// came for this long: the extra spare is then stopped (at the next execution).
const BURST_IDLE: Duration = Duration::from_secs(3);

/// A kernel launching (or launched) in the background, and its process id once it exists.
struct Spare {
    task: JoinHandle<Result<Kernel, KernelError>>,
    pid: Arc<AtomicU32>,
}

/// Owns the kernels of one executor. Not shared: callers serialize access (one execution at a
/// time), which is what makes executions on an executor queue rather than collide.
pub(crate) struct KernelPool {
    config: Arc<KernelConfig>,
    runtime: Arc<RuntimeDir>,
    /// Where local kernels come from, unless the factory is off (`KernelConfig::factory`).
    factory: Option<Arc<Factory>>,
    current: Option<Kernel>,
    /// The current kernel's pid (0: none), readable without access to the pool.
    current_pid: Arc<AtomicU32>,
    /// The current kernel's id on its Jupyter server (remote kernels), readable without access
    /// to the pool.
    current_id: Arc<std::sync::Mutex<Option<String>>>,
    spares: VecDeque<Spare>,
    launched: u32,
    /// How many spares are kept.
    spare_count: usize,
    /// Whether spares are kept yet: from the start without the kernel factory, from the first
    /// swap (reset, restart) with it: a fork is ready in ~0.1 s, so a spare only pays for a
    /// session that resets, and one that never does keeps no idle kernel (issue 40).
    spares_on: bool,
    /// Spares kept now beyond `spare_count` (0 or [`BURST_EXTRA`]).
    extra: usize,
    /// When the last swap took a kernel.
    last_swap: Option<Instant>,
}

impl std::fmt::Debug for KernelPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KernelPool")
            .field("current", &self.current)
            .field("launched", &self.launched)
            .finish()
    }
}

impl KernelPool {
    /// Launches the first kernel, or attaches to kernel `attach` on the Jupyter server (a
    /// kernel another replica created), and once it is ready, without the kernel factory,
    /// `spare_count` spares in the background (with it, they start at the first swap).
    pub(crate) async fn start(
        config: Arc<KernelConfig>,
        runtime: Arc<RuntimeDir>,
        spare_count: usize,
        attach: Option<&str>,
    ) -> Result<Self, KernelError> {
        let factory = match (&config.backend, config.factory, &config.shared) {
            (Backend::Local, true, Some(shared)) => Some(shared.factory.clone()),
            (Backend::Local, true, None) => match Factory::new(config.clone(), &runtime) {
                Ok(f) => Some(Arc::new(f)),
                Err(e) => {
                    tracing::warn!(
                        "kernel factory: cannot bind its socket in {}: {e}\n  kernels start without it",
                        runtime.path().display()
                    );
                    None
                }
            },
            _ => None,
        };
        let mut pool = Self {
            config,
            runtime,
            current: None,
            current_pid: Arc::new(AtomicU32::new(0)),
            current_id: Arc::default(),
            spares: VecDeque::new(),
            launched: 0,
            spare_count,
            spares_on: factory.is_none(),
            factory,
            extra: 0,
            last_swap: None,
        };
        let kernel = match (attach, &pool.config.backend) {
            (Some(id), super::Backend::Gateway(gateway)) => {
                attach_remote(&pool.config, gateway, id).await?
            }
            (Some(_), super::Backend::Local) => {
                return Err(KernelError::Start {
                    reason: "only kernels on a Jupyter server can be attached to".into(),
                    help: "attach with a kernel gateway (--kernel-gateway)".into(),
                });
            }
            (None, _) => pool.launch().await?,
        };
        pool.set_current(Some(kernel));
        pool.refill_spare();
        Ok(pool)
    }

    /// The current kernel's pid (0 while there is none), kept up to date as kernels are
    /// replaced: diagnostics read it while an execution holds the pool.
    pub(crate) fn current_pid(&self) -> Arc<AtomicU32> {
        self.current_pid.clone()
    }

    /// The current kernel's id on its Jupyter server (`None`: none, or a local kernel), kept up
    /// to date as kernels are replaced.
    pub(crate) fn current_id(&self) -> Arc<std::sync::Mutex<Option<String>>> {
        self.current_id.clone()
    }

    fn set_current(&mut self, kernel: Option<Kernel>) {
        self.current_pid
            .store(kernel.as_ref().map_or(0, Kernel::pid), Ordering::SeqCst);
        *self.current_id.lock().unwrap_or_else(|p| p.into_inner()) = kernel
            .as_ref()
            .and_then(Kernel::remote_id)
            .map(str::to_string);
        self.current = kernel;
    }

    fn take_current(&mut self) -> Option<Kernel> {
        self.current_pid.store(0, Ordering::SeqCst);
        self.current_id
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        self.current.take()
    }

    fn next_dir(&mut self) -> Result<KernelDirs, KernelError> {
        self.launched += 1;
        self.runtime
            .kernel_dirs(&format!("k{}", self.launched))
            .map_err(|e| KernelError::Start {
                reason: format!(
                    "cannot create a kernel directory in {}: {e}",
                    self.runtime.path().display()
                ),
                help: "check that the runtime directory (XDG_RUNTIME_DIR or TMPDIR) is writable"
                    .into(),
            })
    }

    async fn launch(&mut self) -> Result<Kernel, KernelError> {
        let dir = self.next_dir()?;
        launch(
            &self.config,
            self.factory.as_deref(),
            dir,
            &AtomicU32::new(0),
        )
        .await
    }

    /// The kernel environment's packages changed (`install_package`): the factory builds a new
    /// template, and spares started before the change are replaced, so the kernels that reset
    /// swaps in see the new packages as a fresh interpreter would. (The current kernel keeps its
    /// state; the executor refreshes its import caches.)
    pub(crate) fn refresh_after_install(&mut self) {
        if let Some(factory) = &self.factory {
            factory.invalidate();
        }
        for spare in self.spares.drain(..) {
            // A spare still starting is dropped with its task, a started one with the finished
            // task's output: either way its process group is killed.
            spare.task.abort();
        }
        self.refill_spare();
    }

    fn refill_spare(&mut self) {
        if !self.spares_on {
            return;
        }
        while self.spares.len() < self.spare_count + self.extra {
            match self.next_dir() {
                Ok(dir) => {
                    let config = self.config.clone();
                    let factory = self.factory.clone();
                    let pid = Arc::new(AtomicU32::new(0));
                    let launched = pid.clone();
                    let task = tokio::spawn(async move {
                        launch(&config, factory.as_deref(), dir, &launched).await
                    });
                    self.spares.push_back(Spare { task, pid });
                }
                Err(e) => {
                    tracing::warn!("cannot prepare a spare kernel: {e}");
                    return;
                }
            }
        }
    }

    /// A ready kernel: a spare that came up, else the oldest spare (waiting for it if it is still
    /// starting), else a freshly launched one.
    async fn take_fresh(&mut self) -> Result<Kernel, KernelError> {
        let ready = self.spares.iter().position(|s| s.task.is_finished());
        let spare = match ready {
            Some(i) => self.spares.remove(i),
            None => self.spares.pop_front(),
        };
        self.pace_spares(spare.is_some() && ready.is_none());
        self.last_swap = Some(Instant::now());
        let fresh = match spare {
            Some(spare) => match spare.task.await {
                Ok(Ok(kernel)) if kernel.exited().is_none() => Ok(kernel),
                Ok(Ok(_)) => self.launch().await,
                Ok(Err(e)) => {
                    tracing::warn!(
                        "spare kernel failed to start ({}); launching a new one",
                        crate::log_text::escaped(&e.to_string())
                    );
                    self.launch().await
                }
                Err(e) => {
                    tracing::warn!("spare kernel task failed ({e}); launching a new one");
                    self.launch().await
                }
            },
            None => self.launch().await,
        };
        self.spares_on = true;
        self.refill_spare();
        fresh
    }

    /// Keeps one more spare while swaps come faster than kernels start (`waited`: this swap takes
    /// a spare still starting), and stops it once they no longer do (every spare left is ready).
    fn pace_spares(&mut self, waited: bool) {
        if waited {
            if self.factory.is_some() && self.spare_count > 0 {
                self.extra = BURST_EXTRA;
            }
        } else if self.extra > 0 && self.spares.iter().all(|s| s.task.is_finished()) {
            self.end_burst();
        }
    }

    /// The extra spare of a burst goes: the newest spares beyond `spare_count` are stopped.
    fn end_burst(&mut self) {
        self.extra = 0;
        while self.spares.len() > self.spare_count {
            if let Some(spare) = self.spares.pop_back() {
                // Dropped with its task (still starting) or the task's output (started): either
                // way its process group is killed.
                spare.task.abort();
            }
        }
    }

    /// Replaces the current kernel with a fresh one (state is lost).
    pub(crate) async fn reset(&mut self) -> Result<(), KernelError> {
        if let Some(old) = self.take_current() {
            tokio::spawn(old.shutdown());
        }
        let fresh = self.take_fresh().await?;
        self.set_current(Some(fresh));
        Ok(())
    }

    /// Runs `code` on the current kernel. After a timeout the kernel ignored, or a kernel death,
    /// the kernel is replaced before this returns, so the next execution runs.
    pub(crate) async fn execute(
        &mut self,
        code: &str,
        timeout: Option<Duration>,
        events: Option<&mpsc::UnboundedSender<ExecEvent>>,
        pause: &TimeoutPause,
        text_cap: Option<usize>,
    ) -> Result<ExecutionOutput, KernelError> {
        self.execute_as(code, timeout, events, pause, text_cap, false)
            .await
    }

    /// [`Self::execute`] of ipybox's own `code`, silently (no history, no execution count, no
    /// post-cell hooks): snapshots and restores.
    pub(crate) async fn execute_hidden(
        &mut self,
        code: &str,
        timeout: Option<Duration>,
    ) -> Result<ExecutionOutput, KernelError> {
        self.execute_as(code, timeout, None, &TimeoutPause::default(), None, true)
            .await
    }

    async fn execute_as(
        &mut self,
        code: &str,
        timeout: Option<Duration>,
        events: Option<&mpsc::UnboundedSender<ExecEvent>>,
        pause: &TimeoutPause,
        text_cap: Option<usize>,
        hidden: bool,
    ) -> Result<ExecutionOutput, KernelError> {
        if self.extra > 0 && self.last_swap.is_some_and(|t| t.elapsed() >= BURST_IDLE) {
            self.end_burst();
        }
        self.settle().await;
        if self.current.is_none() {
            // A previous replacement failed; try again now.
            let fresh = self.take_fresh().await?;
            self.set_current(Some(fresh));
        }
        let Some(kernel) = self.current.as_mut() else {
            return Err(KernelError::Stopped);
        };
        let outcome = match hidden {
            false => {
                execute::run(kernel, &self.config, code, timeout, events, pause, text_cap).await
            }
            true => execute::run_hidden(kernel, &self.config, code, timeout, pause).await,
        };
        if outcome.replace_kernel
            && let Err(e) = self.reset().await
        {
            tracing::error!(
                "could not restart the kernel: {}",
                crate::log_text::escaped(&e.to_string())
            );
        }
        outcome.result
    }

    /// Stops an execution whose caller went away (interrupt; replace the kernel if it does not
    /// stop). Called before every execution, and by the executor right after a caller drops one.
    pub(crate) async fn settle(&mut self) {
        let Some(kernel) = self.current.as_mut() else {
            return;
        };
        if !execute::settle_abandoned(kernel, &self.config).await
            && let Err(e) = self.reset().await
        {
            tracing::error!(
                "could not restart the kernel: {}",
                crate::log_text::escaped(&e.to_string())
            );
        }
    }

    /// Stops every kernel and waits until they are gone; with `detach`, the current kernel, if
    /// it is on a Jupyter server, is left running there (another replica uses it).
    pub(crate) async fn shutdown(mut self, detach: bool) {
        if let Some(k) = self.take_current() {
            if detach {
                k.detach().await;
            } else {
                k.shutdown().await;
            }
        }
        let spares: Vec<_> = self.spares.drain(..).collect();
        futures::future::join_all(spares.into_iter().map(|spare| async move {
            spare.task.abort();
            match spare.task.await {
                Ok(Ok(k)) => k.shutdown().await,
                // An abandoned launch killed its process when it was dropped; wait until the
                // process has ended so nothing of this pool outlives shutdown.
                _ => {
                    let pid = spare.pid.load(Ordering::SeqCst);
                    if !crate::child_process::wait_ended(pid, Duration::from_secs(2)).await {
                        tracing::warn!("spare kernel {pid} still running after SIGKILL");
                    }
                }
            }
        }))
        .await;
        // A factory shared with other pools stays (its owner shuts it down).
        if let Some(factory) = self.factory.take()
            && self.config.shared.is_none()
        {
            factory.shutdown().await;
        }
    }
}

impl Drop for KernelPool {
    fn drop(&mut self) {
        for spare in self.spares.drain(..) {
            // Aborting drops a kernel that is still launching (its guard kills the process); a
            // kernel that already launched sits in the finished task and is dropped with it.
            spare.task.abort();
        }
    }
}
