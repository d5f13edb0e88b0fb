//! `CodeExecutor`: the SDK facade, the Rust counterpart of Python ipybox's `CodeExecutor`.
//!
//! It composes the kernel engine ([`crate::kernel`]), the kernel's Python environment
//! ([`crate::pyenv`]) and the private runtime directory. Executions on one executor are
//! serialized: a second caller waits its turn. Not here: how kernels are launched or talk
//! (see `kernel/`), and the MCP server (see `mcp_server`).
//!
//! This file holds the executor's shared state (`Inner`, `Running`, `Live`), its small
//! accessors and diagnostics, and the public names; each concern has a room of its own:
//! `builder` (configuration), `start` (composing a started executor: interpreter, tool server,
//! sandbox or confinement, the kernel pool), `lifecycle` (stop, reset), `run` (the cell driver:
//! execute, stream, cancel, the notebook's record of a cell), `snapshots` (snapshot and
//! restore), `install` (registering MCP servers, installing packages) and `error`. They use
//! this file's types and `error`; among themselves the arrows run one way
//! (`install -> start, run`; `snapshots -> lifecycle`).
//!
//! ```no_run
//! # async fn demo() -> Result<(), ipybox::executor::ExecutorError> {
//! use ipybox::CodeExecutor;
//! let executor = CodeExecutor::builder().workspace("/tmp/ws").build();
//! executor.start().await?;
//! let result = executor.execute("x = 6 * 7\nprint(x)", None).await?;
//! assert_eq!(result.text, "42");
//! executor.stop().await;
//! # Ok(()) }
//! ```

mod builder;
mod error;
mod install;
mod lifecycle;
mod run;
mod snapshots;
mod start;
mod trust;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::sync::Mutex;

use crate::host_env::HostEnv;
use crate::kernel::runtime_dir::RuntimeDir;
use crate::kernel::{ExecutionOutput, KernelPool};
use crate::notebook::Notebook;
use crate::pyenv;
use crate::sandbox::SandboxError;
use crate::tools::registry::Registry;
use crate::tools::server::{ToolServer, ToolServerState};

pub use builder::CodeExecutorBuilder;
pub use error::ExecutorError;
pub use run::{Canceller, Execution, ExecutionEvent, RunOptions};

/// Ready kernels kept for resets and restarts unless [`CodeExecutorBuilder::spare_kernels`] says
/// otherwise.
pub const DEFAULT_SPARE_KERNELS: usize = 1;

/// The result of a successful execution.
pub type ExecutionResult = ExecutionOutput;

struct Running {
    pool: KernelPool,
    tools: ToolServer,
    runtime: Arc<RuntimeDir>,
    /// No code has run in the current kernel since it started (or since a reset): a restore
    /// loads into it instead of replacing it first.
    pristine: bool,
    /// Snapshot transfers over the stdin channel (kernels on a Jupyter server).
    snapshot_channel: Option<Arc<crate::snapshot::remote::SnapshotChannel>>,
    /// How this executor's kernels are confined: sealed into their snapshots, and what a
    /// snapshot must restore into.
    confinement: crate::snapshot::KernelConfinement,
    /// A confined session's limits: what it met is noted in each cell's result.
    session: Option<start::SessionUse>,
    /// The egress proxy of `--session-network proxy` (stops when dropped).
    _egress: Option<crate::confine::egress_proxy::EgressProxy>,
    /// The session's own uid (`--session-uids`), handed back after the kernels (fields drop in
    /// order: `pool` first).
    _uid: Option<crate::confine::uids::UidLease>,
    /// A sandboxed executor's window in the workspace trust ledger: closed when dropped, after
    /// the pool (its kernels) is gone.
    _trust_window: Option<crate::workspace_trust::Window>,
}

struct Inner {
    builder: CodeExecutorBuilder,
    /// The builder's host environment, else the process environment read at `build()`.
    host: HostEnv,
    state: Mutex<Option<Running>>,
    /// Set by `stop()`: a running execution is abandoned so stopping never waits for it.
    stopping: tokio::sync::watch::Sender<bool>,
    /// The servers kernels may call: this workspace's registrations (the trust rule,
    /// `tools::registry`).
    registry: std::sync::OnceLock<Arc<Registry>>,
    /// The kernel's interpreter, known after the first successful start.
    python: std::sync::OnceLock<PathBuf>,
    /// What diagnostics read while an execution holds `state`; set by start, cleared by stop.
    live: std::sync::Mutex<Option<Live>>,
    /// The canceller of the execution that holds `state` (for [`CodeExecutor::cancel`]).
    current: std::sync::Mutex<Option<Canceller>>,
    /// The session notebook, if recording.
    notebook: Option<Arc<Notebook>>,
}

/// Read-only views of a started executor, shared with its [`Running`] parts.
#[derive(Clone)]
struct Live {
    runtime: PathBuf,
    kernel_pid: Arc<std::sync::atomic::AtomicU32>,
    kernel_id: Arc<std::sync::Mutex<Option<String>>>,
    tools: Arc<ToolServerState>,
}

/// Runs Python code in a stateful IPython kernel. Cheap to clone; clones share the kernel.
#[derive(Clone)]
pub struct CodeExecutor {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for CodeExecutor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CodeExecutor")
            .field("builder", &self.inner.builder)
            .finish()
    }
}

impl CodeExecutor {
    pub fn builder() -> CodeExecutorBuilder {
        CodeExecutorBuilder::default()
    }

    fn host_env(&self) -> &HostEnv {
        &self.inner.host
    }

    /// The workspace as an absolute path (created if missing).
    pub fn workspace(&self) -> Result<PathBuf, ExecutorError> {
        resolve_workspace(self.inner.builder.workspace.as_deref())
    }

    /// Where images are written: [`CodeExecutorBuilder::images_dir`], else `<workspace>/images`.
    pub fn images_dir(&self) -> Result<PathBuf, ExecutorError> {
        Ok(match &self.inner.builder.images_dir {
            Some(d) if d.is_absolute() => d.clone(),
            Some(d) => self.workspace()?.join(d),
            None => self.workspace()?.join("images"),
        })
    }

    /// Removes the images directory and everything in it, for an executor whose images
    /// directory is its own (a session of a service). Nothing is followed where a kernel could
    /// have planted a link: a link inside (or at the directory's place) is removed, never its
    /// target; the directory's parent must be a directory, not a link. Nothing there is not an
    /// error.
    pub fn remove_images_dir(&self) -> std::io::Result<()> {
        let dir = self.images_dir().map_err(std::io::Error::other)?;
        let (Some(parent), Some(name)) = (dir.parent(), dir.file_name().and_then(|n| n.to_str()))
        else {
            return Ok(());
        };
        let failed = |e: std::io::Error| {
            std::io::Error::new(e.kind(), format!("cannot remove {}: {e}", dir.display()))
        };
        match crate::safe_fs::NoFollowDir::open(parent, None) {
            Ok(parent) => parent.remove_tree(name).map_err(failed),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(failed(e)),
        }
    }

    fn tool_env(&self) -> HashMap<String, String> {
        self.inner
            .builder
            .tool_env
            .clone()
            .unwrap_or_else(|| self.host_env().vars().clone())
    }

    fn registry(&self) -> Result<Arc<Registry>, ExecutorError> {
        if let Some(r) = self.inner.registry.get() {
            return Ok(r.clone());
        }
        let registry = match pyenv::data_dir(self.host_env()) {
            Ok(dir) => {
                // ipybox's data directory is private (0700): registrations are written there.
                crate::safe_fs::create_private_dir(&dir).map_err(|source| ExecutorError::Io {
                    path: dir.clone(),
                    source,
                })?;
                Registry::open(&dir)
            }
            Err(_) => Registry::in_memory(),
        };
        Ok(self
            .inner
            .registry
            .get_or_init(|| Arc::new(registry))
            .clone())
    }

    /// With a sandbox ([`CodeExecutorBuilder::sandbox`]): whether it can run here (srt found,
    /// the platform's prerequisites present), checked without starting anything, for a server
    /// that says so when its client connects rather than at the first cell. `Ok` without a
    /// sandbox. Starting a kernel checks the same (the probes run once per process).
    pub async fn check_sandbox(&self) -> Result<(), SandboxError> {
        match &self.inner.builder.sandbox {
            Some(options) => crate::sandbox::preflight(options, self.host_env()).await,
            None => Ok(()),
        }
    }

    /// Whether kernels run on a Jupyter server ([`CodeExecutorBuilder::kernel_gateway`]).
    pub fn uses_kernel_gateway(&self) -> bool {
        self.inner.builder.kernel_gateway.is_some()
    }

    fn live(&self) -> Option<Live> {
        self.inner
            .live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// How many MCP sessions are open (they open on a tool's first call and close on reset).
    /// Does not wait for a running execution.
    pub async fn mcp_sessions(&self) -> usize {
        self.live().map_or(0, |l| l.tools.sessions().len())
    }

    /// The current kernel's process id, if started (None while a kernel is being replaced).
    /// Does not wait for a running execution.
    pub async fn kernel_pid(&self) -> Option<u32> {
        self.live()
            .map(|l| l.kernel_pid.load(std::sync::atomic::Ordering::SeqCst))
            .filter(|pid| *pid != 0)
    }

    /// The current kernel's id on its Jupyter server (with [`CodeExecutorBuilder::kernel_gateway`]),
    /// if started (None while a kernel is being replaced). Does not wait for a running execution.
    pub fn remote_kernel_id(&self) -> Option<String> {
        self.live().and_then(|l| {
            l.kernel_id
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone()
        })
    }

    /// What the Jupyter server says about the current kernel (open connections, last activity):
    /// `Ok(None)` if it has no such kernel any more, or if this executor has no remote kernel.
    /// Does not wait for a running execution.
    pub async fn remote_kernel_status(
        &self,
    ) -> Result<Option<crate::kernel::KernelStatus>, ExecutorError> {
        let (Some(spec), Some(id)) = (&self.inner.builder.kernel_gateway, self.remote_kernel_id())
        else {
            return Ok(None);
        };
        Ok(self.gateway(&spec.0)?.kernel_status(&id).await?)
    }

    /// The kernel's Python interpreter, if started.
    pub async fn python(&self) -> Option<PathBuf> {
        // Not behind the execution lock: install_package must not wait for a running cell.
        self.inner.python.get().cloned()
    }

    /// The session notebook, when this executor records one ([`CodeExecutorBuilder::notebook`]).
    pub fn notebook(&self) -> Option<&Notebook> {
        self.inner.notebook.as_deref()
    }

    /// The private runtime directory (sockets, connection files), if started. Does not wait
    /// for a running execution.
    pub async fn runtime_dir(&self) -> Option<PathBuf> {
        self.live().map(|l| l.runtime)
    }
}

/// `dir` (default: the current directory) as an absolute, canonical path, created if missing.
pub fn resolve_workspace(dir: Option<&Path>) -> Result<PathBuf, ExecutorError> {
    let cwd = || {
        std::env::current_dir().map_err(|source| ExecutorError::Io {
            path: PathBuf::from("."),
            source,
        })
    };
    let dir = match dir {
        Some(d) if d.is_absolute() => d.to_path_buf(),
        Some(d) => cwd()?.join(d),
        None => cwd()?,
    };
    std::fs::create_dir_all(&dir).map_err(|source| ExecutorError::Io {
        path: dir.clone(),
        source,
    })?;
    dir.canonicalize()
        .map_err(|source| ExecutorError::Io { path: dir, source })
}
