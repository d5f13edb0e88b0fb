//! `ExecutorError`: why an executor operation failed, and what of it a caller shows (the
//! output before the failure, the error itself). A leaf of `executor/`: it wraps the errors of
//! the parts the executor composes and knows nothing of the executor. Not here: the errors of
//! registering servers (`crate::register`) or of snapshots (`crate::snapshot`).

use std::path::PathBuf;

use crate::confine::ConfineError;
use crate::kernel::KernelError;
use crate::pyenv::PyEnvError;
use crate::sandbox::SandboxError;
// Named in doc links only.
#[cfg(doc)]
use super::Canceller;

/// Why an executor operation failed.
#[derive(Debug, thiserror::Error)]
pub enum ExecutorError {
    /// The code failed, timed out, or the kernel died; see [`KernelError`].
    #[error(transparent)]
    Kernel(#[from] KernelError),
    /// The kernel's Python environment could not be found or created.
    #[error(transparent)]
    PythonEnv(#[from] PyEnvError),
    /// The sandbox could not be set up (srt missing, invalid config, ...).
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
    /// Confinement was asked for and cannot be set up (bwrap missing, or combined with a
    /// sandbox or a kernel gateway).
    #[error(transparent)]
    Confine(#[from] ConfineError),
    /// A background task of ipybox's failed (a bug: please report it).
    #[error("{what} failed: {source}")]
    Task {
        what: &'static str,
        #[source]
        source: tokio::task::JoinError,
    },
    /// The execution was cancelled with [`Canceller::cancel`]; the kernel was interrupted and
    /// keeps its state.
    #[error("the execution was cancelled")]
    Cancelled,
    /// The runtime directory's Unix socket paths would be too long (its base is).
    #[error(transparent)]
    SocketPath(#[from] crate::kernel::SocketPathTooLong),
    /// The workspace or runtime directory could not be prepared.
    #[error("cannot prepare {path}: {source}\n  help: choose a writable directory")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl ExecutorError {
    /// What the code printed before it failed (empty when it did not run).
    pub fn output(&self) -> &str {
        match self {
            ExecutorError::Kernel(e) => e.output(),
            _ => "",
        }
    }

    /// The error itself, without the prior output: the traceback when the code raised, else the
    /// message (timeout, kernel death, setup failure).
    pub fn error_text(&self) -> String {
        match self {
            ExecutorError::Kernel(KernelError::Failed { traceback, .. }) => traceback.clone(),
            other => other.to_string(),
        }
    }
}
