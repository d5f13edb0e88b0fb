//! `CodeExecutor::snapshot` and `restore`: the executor's side of session snapshots, taking
//! the executor's lock, choosing the transport (the runtime directory for local kernels, the
//! stdin channel for kernels on a Jupyter server), replacing a used kernel before a restore,
//! and the notebook's section. Not here: what a snapshot holds, its seal, store and transports
//! (`crate::snapshot`).

use std::sync::Arc;
use std::time::Duration;

use super::CodeExecutor;
use crate::kernel::KernelError;
use crate::notebook::Section;
use crate::snapshot::{
    KernelConfinement, RestoreReport, SnapshotBinding, SnapshotError, SnapshotReport, SnapshotStore,
};

impl CodeExecutor {
    /// Saves what the model built in the kernel (variables, functions and classes defined in
    /// cells, modules by name, the working directory) into `store` for `binding`, replacing the
    /// snapshot stored for it before, and reports what was saved and what could not be (open
    /// files, sockets, threads, generators, objects that refuse to be pickled), by name with the
    /// reason. The kernel keeps running with its state. Waits for a running execution; `timeout`
    /// bounds the kernel's part (`None`: as long as it takes). See docs/snapshots.md.
    /// A local kernel writes the snapshot into the runtime directory, a kernel on a Jupyter
    /// server sends it over its stdin channel.
    pub async fn snapshot(
        &self,
        store: &SnapshotStore,
        binding: &SnapshotBinding,
        timeout: Option<Duration>,
    ) -> Result<SnapshotReport, SnapshotError> {
        let mut state = self.inner.state.lock().await;
        let running = state.as_mut().ok_or(KernelError::Stopped)?;
        let runtime = running.runtime.clone();
        let confinement = running.confinement.clone();
        let mut stopping = self.inner.stopping.subscribe();
        let work = async {
            match &running.snapshot_channel {
                Some(channel) => {
                    crate::snapshot::remote::snapshot(
                        &mut running.pool,
                        channel,
                        &runtime,
                        store,
                        binding,
                        &confinement,
                        timeout,
                    )
                    .await
                }
                None => {
                    crate::snapshot::local::snapshot(
                        &mut running.pool,
                        &runtime,
                        store,
                        binding,
                        &confinement,
                        timeout,
                    )
                    .await
                }
            }
        };
        tokio::select! {
            result = work => result,
            _ = stopping.wait_for(|s| *s) => Err(KernelError::Stopped.into()),
        }
    }

    /// Restores `binding`'s snapshot from `store`: the kernel is replaced by a fresh one (unless
    /// no code has run in it since it started), then modules are imported again, names loaded
    /// one by one (one that fails is reported, the others load) and the working directory
    /// restored. The report says exactly what came back and what did not;
    /// [`RestoreReport::text`] is that for the model.
    ///
    /// A snapshot whose seal does not verify for `binding` (another session's or owner's, or
    /// changed by a single byte) is refused with [`SnapshotError::Refused`] before anything of it
    /// reaches a kernel, and the current kernel keeps its state. So is, with
    /// [`SnapshotError::Confinement`], a snapshot taken in a kernel more confined than this
    /// executor's (a sandboxed one restored without the sandbox or under another policy, see
    /// [`KernelConfinement::restores_into`]); it stays in the store. Waits for a running
    /// execution.
    pub async fn restore(
        &self,
        store: &SnapshotStore,
        binding: &SnapshotBinding,
        timeout: Option<Duration>,
    ) -> Result<RestoreReport, SnapshotError> {
        let mut state = self.inner.state.lock().await;
        let running = state.as_mut().ok_or(KernelError::Stopped)?;
        let runtime = running.runtime.clone();
        let here = running.confinement.clone();
        let mut stopping = self.inner.stopping.subscribe();
        let work = async {
            use crate::snapshot::{local, remote};
            enum Prepared {
                Local(local::Prepared),
                Remote(remote::Prepared, Arc<remote::SnapshotChannel>),
            }
            // Verified (and copied for the kernel) before the kernel is touched.
            let prepared = match &running.snapshot_channel {
                Some(channel) => Prepared::Remote(
                    remote::prepare(&runtime, store, binding, &here).await?,
                    channel.clone(),
                ),
                None => Prepared::Local(local::prepare(&runtime, store, binding, &here).await?),
            };
            if !running.pristine {
                Self::reset_running(running).await?;
            }
            running.pristine = false;
            match prepared {
                Prepared::Local(p) => local::load(&mut running.pool, &runtime, p, timeout).await,
                Prepared::Remote(p, channel) => {
                    remote::load(&mut running.pool, &channel, p, timeout).await
                }
            }
        };
        let restored = tokio::select! {
            result = work => result,
            _ = stopping.wait_for(|s| *s) => Err(KernelError::Stopped.into()),
        };
        if let (Ok(_), Some(notebook)) = (&restored, &self.inner.notebook) {
            notebook.section(Section::Restored);
        }
        restored
    }

    /// How this executor's kernels are confined (what its snapshots are sealed with, and what a
    /// snapshot must restore into); `None` until it is started.
    pub async fn kernel_confinement(&self) -> Option<KernelConfinement> {
        let state = self.inner.state.lock().await;
        state.as_ref().map(|running| running.confinement.clone())
    }

    /// Whether [`Self::restore`] would accept `binding`'s snapshot (its seal verifies and it may
    /// be restored into this executor's kernels), without loading anything: the error `restore`
    /// would give. The executor must be started.
    pub async fn check_restore(
        &self,
        store: &SnapshotStore,
        binding: &SnapshotBinding,
    ) -> Result<(), SnapshotError> {
        let here = self
            .kernel_confinement()
            .await
            .ok_or(KernelError::Stopped)?;
        crate::snapshot::store::open_verified(store, binding, &here)
            .await
            .map(drop)
    }
}
