//! Session snapshots: what the model built in a kernel (variables, functions and classes defined
//! in cells, imported modules, the working directory), saved by the kernel, stored host-only and
//! sealed to its session and owner, and restored into a fresh kernel of the same executor.
//!
//! - `manifest`: what a snapshot holds, parsed strictly (the kernel that wrote it may be hostile);
//! - `seal`: the binding to a session and owner (HMAC under a host-only key), [`SnapshotBinding`];
//! - `confinement`: the confinement a snapshot was taken in (sealed with it) and where it may be
//!   restored, [`KernelConfinement`];
//! - `store`: the host-only directory of sealed snapshots, [`SnapshotStore`];
//! - `local`: the transport of kernels that share the host's filesystem (a Unix socket per save,
//!   a host-owned directory per restore);
//! - `stream`: the frames a local kernel sends its snapshot in, written into the store;
//! - `remote`: the transport of kernels on Jupyter servers (chunks over the stdin channel);
//! - `report`: what came back and what did not, as data and as text for the model.
//!
//! The kernel side is `python/ipybox_runtime/snapshot.py`; the entry points are
//! [`crate::CodeExecutor::snapshot`] and [`crate::CodeExecutor::restore`]. The host never
//! unpickles anything; a kernel only ever loads a snapshot whose seal verified for its session
//! and owner, taken in a kernel no more confined than it. See docs/snapshots.md.
//!
//! Not here: when sessions are snapshotted or restored (hibernation is the HTTP service's), MCP.

pub mod confinement;
pub(crate) mod local;
pub mod manifest;
pub(crate) mod remote;
pub mod report;
pub(crate) mod seal;
pub mod store;
pub(crate) mod stream;

use std::path::PathBuf;

pub use confinement::KernelConfinement;
pub use manifest::{Manifest, ModuleName, NotSaved, SavedName};
pub use report::{CwdOutcome, NotRestored, RestoreReport, Restored, SnapshotReport};
pub use seal::{SnapshotBinding, host_key, session_key_path};
pub use store::{DEFAULT_SNAPSHOT_LIMIT, SnapshotStore, Swept};

use crate::kernel::KernelError;

/// Why a snapshot could not be taken or restored.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// The kernel failed to save or load (its traceback), timed out or died.
    #[error("{0}")]
    Kernel(#[from] KernelError),
    /// No snapshot is stored for this session.
    #[error(
        "no snapshot is stored for session `{session}`\n  help: take one first (snapshot), or start the session afresh"
    )]
    NotFound { session: String },
    /// The stored snapshot is not this session's and owner's, or changed since it was sealed;
    /// nothing of it reached a kernel.
    #[error(
        "refused to restore the snapshot: {reason}; nothing of it was loaded\n  help: only a snapshot taken by this session and owner can be restored; delete it and start the session afresh"
    )]
    Refused { reason: String },
    /// The snapshot was taken in a kernel more confined than this one (a sandboxed session's
    /// snapshot, restored without the sandbox), or by an ipybox that did not record its
    /// confinement: nothing of it reached a kernel, and it is kept (it can still be restored
    /// where it belongs).
    #[error(
        "refused to restore the snapshot: {reason}; nothing of it was loaded, and it is kept\n  help: {help}"
    )]
    Confinement { reason: String, help: String },
    /// The kernel wrote something that is not a snapshot (a bug, or hostile code).
    #[error(
        "{what} is invalid: {reason}\n  help: nothing was stored; if the kernel's code did not tamper with it, please report this"
    )]
    Invalid { what: String, reason: String },
    /// There is no data directory to keep snapshots in.
    #[error(
        "cannot determine ipybox's data directory for snapshots\n  help: set IPYBOX_HOME to a writable directory"
    )]
    NoHome,
    #[error(
        "i/o error on {path}: {source}\n  help: check that the directory is writable and has room"
    )]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// A background task of ipybox's failed (a bug: please report it).
    #[error("a snapshot task failed: {0}")]
    Task(String),
}
