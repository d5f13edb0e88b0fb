//! What an executor's kernels are to the workspace trust ledger ([`crate::workspace_trust`]): a
//! trusted kernel (local, neither sandboxed nor confined) is given the ledger, so that it does
//! not import what a sandboxed kernel wrote; a sandboxed executor opens a window over the
//! directories its kernels can write, from before its first kernel starts until its kernels are
//! gone (the window closes when [`super::Running`] drops it, after the pool).

use std::path::{Path, PathBuf};

use super::{CodeExecutor, ExecutorError};
use crate::snapshot::KernelConfinement;
use crate::workspace_trust::{self, LEDGER_ENV, Ledger, Window};

impl CodeExecutor {
    /// For a trusted kernel: the ledger's variable (stale windows closed first). For a
    /// sandboxed executor: its window, open. Nothing for confined and remote kernels (they
    /// write nothing a trusted kernel imports: the workspace is read-only to a confined kernel
    /// and out of a remote one's reach).
    pub(super) fn workspace_trust(
        &self,
        confinement: &KernelConfinement,
        workspace: &Path,
        policy: Option<&crate::sandbox::SandboxPolicy>,
        env: &mut std::collections::BTreeMap<String, String>,
    ) -> Result<Option<Window>, ExecutorError> {
        let Some(data_dir) = self.host_env().data_dir() else {
            return match confinement {
                KernelConfinement::Sandbox { .. } => Err(ExecutorError::Io {
                    path: workspace.to_path_buf(),
                    source: std::io::Error::other(
                        "no data directory for the trust ledger (what the sandboxed kernel may \
                         write is recorded there): set IPYBOX_HOME or HOME",
                    ),
                }),
                _ => Ok(None),
            };
        };
        let ledger = Ledger::in_data_dir(&data_dir);
        let io = |source| ExecutorError::Io {
            path: ledger.path().to_path_buf(),
            source,
        };
        match confinement {
            KernelConfinement::Unconfined => {
                if let Err(e) = workspace_trust::close_stale(&ledger) {
                    tracing::warn!(error = %e, ledger = %ledger.path().display(), "cannot close stale sandbox windows");
                }
                env.insert(LEDGER_ENV.into(), ledger.path().display().to_string());
                Ok(None)
            }
            KernelConfinement::Sandbox { .. } => {
                let roots = self.sandbox_write_roots(workspace, policy);
                if roots.is_empty() {
                    return Ok(None);
                }
                Window::open(&ledger, roots, &confinement.describe())
                    .map(Some)
                    .map_err(io)
            }
            KernelConfinement::Confined | KernelConfinement::Remote { .. } => Ok(None),
        }
    }

    /// The directories a sandboxed kernel of this executor can write (its policy's writable
    /// roots; the workspace only when it is not isolated).
    fn sandbox_write_roots(
        &self,
        workspace: &Path,
        policy: Option<&crate::sandbox::SandboxPolicy>,
    ) -> Vec<PathBuf> {
        let (Some(options), Some(policy)) = (&self.inner.builder.sandbox, policy) else {
            return Vec::new();
        };
        let home = self.host_env().get("HOME").map(PathBuf::from);
        let mut roots = policy.writable_roots(workspace, home.as_deref());
        if options.isolate_workspace {
            roots.retain(|r| r != workspace);
        }
        roots
    }
}
