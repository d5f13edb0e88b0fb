//! Ending and renewing a started executor's kernel: `stop` (polite, waited for), `stop_now`
//! (killed, for a process about to exit), `stop_detaching` (a Jupyter server's kernel left for
//! another replica), and `reset` (a fresh kernel from the pool's spares, MCP sessions closed).
//! Not here: starting (`start`), and the pool's own spare and replacement policy
//! (`crate::kernel::pool`).

use super::{CodeExecutor, ExecutorError, Running};
use crate::kernel::KernelError;
use crate::notebook::Section;
// Named in doc links only.
#[cfg(doc)]
use super::CodeExecutorBuilder;

impl CodeExecutor {
    /// Stops the kernels and removes the runtime directory. The executor can be started again.
    /// A running execution is abandoned (its caller gets [`KernelError::Stopped`]).
    pub async fn stop(&self) {
        self.stop_inner(false).await;
    }

    /// [`Self::stop`], except that a kernel on a Jupyter server is left running there (its
    /// WebSocket is closed): for replicas that share a server's kernels, when another replica
    /// still uses it. Spare kernels are deleted; local kernels are stopped.
    pub async fn stop_detaching(&self) {
        self.stop_inner(true).await;
    }

    /// Stops at once, for a process that is about to exit (the MCP server when its client goes
    /// away): a running execution is abandoned; every kernel, spare kernel, factory template and
    /// stdio MCP server is killed (SIGKILL to its process group, nothing waited for: they are
    /// reaped by whoever reaps them once this process exits), and the runtime directory is
    /// removed before this returns. Nothing is asked to shut down politely, so this takes
    /// milliseconds where [`Self::stop`] takes a few hundred.
    ///
    /// Kernels on a Jupyter server cannot be killed from here: with
    /// [`CodeExecutorBuilder::kernel_gateway`] this is [`Self::stop`] (they are deleted).
    pub async fn stop_now(&self) {
        if self.uses_kernel_gateway() {
            return self.stop().await;
        }
        self.inner.stopping.send_replace(true);
        let running = self.inner.state.lock().await.take();
        self.inner.stopping.send_replace(false);
        let live = self
            .inner
            .live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(Running {
            pool,
            tools,
            runtime,
            ..
        }) = running
        {
            tools.kill_now();
            // Dropping the pool kills its kernels' and its template's process groups.
            drop(pool);
            drop(runtime);
        }
        // Whoever else still holds the runtime directory (a spare's launch being aborted), it
        // goes now.
        if let Some(live) = live {
            let _ = crate::safe_fs::remove_path_tree(&live.runtime);
        }
    }

    async fn stop_inner(&self, detach: bool) {
        self.inner.stopping.send_replace(true);
        let running = self.inner.state.lock().await.take();
        self.inner.stopping.send_replace(false);
        self.inner
            .live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(Running {
            pool,
            tools,
            runtime,
            ..
        }) = running
        {
            tokio::join!(pool.shutdown(detach), tools.stop());
            drop(runtime);
        }
        // The notebook's file holds every cell once stopped.
        if let Some(notebook) = self.inner.notebook.clone() {
            let _ = tokio::task::spawn_blocking(move || notebook.flush()).await;
        }
    }

    /// Replaces the kernel with a fresh one (all state is lost) and closes the MCP sessions.
    /// Waits for a running execution to finish first, but not for stdio MCP servers to exit:
    /// they are closed in the background (no call can reach them any more; `stop()` waits for
    /// them).
    pub async fn reset(&self) -> Result<(), ExecutorError> {
        let mut state = self.inner.state.lock().await;
        let running = state.as_mut().ok_or(KernelError::Stopped)?;
        Self::reset_running(running).await?;
        if let Some(notebook) = &self.inner.notebook {
            notebook.section(Section::Reset);
        }
        Ok(())
    }

    pub(super) async fn reset_running(running: &mut Running) -> Result<(), KernelError> {
        let sessions = running.tools.state().sessions();
        // Closed in the background: the new epoch already keeps the old sessions from being
        // used, and stop() waits for the closes.
        sessions.close_all_in_background();
        let kernel = running.pool.reset().await;
        // The old kernel is gone now; a leftover thread of it may have called a tool while it
        // was being replaced. Close what that opened, and void such calls still in flight.
        sessions.close_all_in_background();
        kernel?;
        running.pristine = true;
        Ok(())
    }
}
