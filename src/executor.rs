//! `CodeExecutor`: the SDK facade, the Rust counterpart of Python ipybox's `CodeExecutor`.
//!
//! It composes the kernel engine ([`crate::kernel`]), the kernel's Python environment
//! ([`crate::pyenv`]) and the private runtime directory. Executions on one executor are
//! serialized: a second caller waits its turn. Not here: how kernels are launched or talk
//! (see `kernel/`), and the MCP server (see `mcp_server`).
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

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use include_dir::Dir;
use tokio::sync::{Mutex, mpsc};
use tokio_util::sync::CancellationToken;

use crate::apigen::ApiStyle;
use crate::confine::{ConfineError, Confinement};
use crate::host_env::HostEnv;
use crate::kernel::gateway::Gateway;
use crate::kernel::gateway::ledger::Ledger;
use crate::kernel::runtime_dir::RuntimeDir;
use crate::kernel::{
    Backend, ExecEvent, ExecutionOutput, KernelConfig, KernelError, KernelPool, SharedFactoryError,
    SharedFork, SharedKernelFactory, ShellApproval,
};
use crate::notebook::{CellRecord, Ending, Notebook, NotebookConfig, Section};
use crate::pause::TimeoutPause;
use crate::pyenv::{self, Progress, PyEnvError};
use crate::register::RegisterError;
use crate::sandbox::{SandboxError, SandboxOptions};
use crate::snapshot::{
    RestoreReport, SnapshotBinding, SnapshotError, SnapshotReport, SnapshotStore,
};
use crate::tools::registry::{ImportRoots, Reach, Registry};
use crate::tools::server::{ToolServer, ToolServerState};
use crate::tools::{
    ApprovalPolicy, ApprovalRequest, CallLog, DEFAULT_APPROVAL_TIMEOUT, DEFAULT_CONNECT_TIMEOUT,
    SessionCache, SharedMcpServers,
};

/// Ready kernels kept for resets and restarts unless [`CodeExecutorBuilder::spare_kernels`] says
/// otherwise.
pub const DEFAULT_SPARE_KERNELS: usize = 1;

/// The result of a successful execution.
pub type ExecutionResult = ExecutionOutput;

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

/// One item of [`CodeExecutor::stream`].
#[derive(Debug)]
pub enum ExecutionEvent {
    /// Output text as it arrives.
    Chunk(String),
    /// An image file written by the execution.
    Image(PathBuf),
    /// A tool call (or, with `approve_shell_cmds`, a shell command) waiting for
    /// [`ApprovalRequest::accept`] or [`ApprovalRequest::reject`].
    Approval(ApprovalRequest),
    /// The final result; always the last item.
    Result(Result<ExecutionResult, ExecutorError>),
}

/// Configures a [`CodeExecutor`].
#[derive(Debug, Clone, Default)]
pub struct CodeExecutorBuilder {
    workspace: Option<PathBuf>,
    images_dir: Option<PathBuf>,
    kernel_env: BTreeMap<String, String>,
    python: Option<PathBuf>,
    spare_kernels: Option<usize>,
    tool_env: Option<HashMap<String, String>>,
    approval_timeout: Option<Duration>,
    approval_text_limit: Option<usize>,
    connect_timeout: Option<Duration>,
    kernel_start_timeout: Option<Duration>,
    restore_working_dir: bool,
    approve_shell_cmds: bool,
    require_shell_escape: bool,
    sandbox: Option<SandboxOptions>,
    confinement: Option<Confinement>,
    kernel_gateway: Option<GatewayUrl>,
    attach_kernel: Option<String>,
    kernel_factory: Option<bool>,
    shared_kernel_factory: Option<SharedKernelFactory>,
    shared_mcp_servers: Option<SharedMcpServers>,
    host_env: Option<HostEnv>,
    progress: Option<ProgressSink>,
    output: crate::kernel::OutputLimits,
    notebook: Option<NotebookConfig>,
}

/// A kernel gateway URL as given, with a `Debug` that leaves out its query (it may hold a token).
#[derive(Clone)]
struct GatewayUrl(String);

impl std::fmt::Debug for GatewayUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&crate::kernel::gateway::redact_query(&self.0))
    }
}

/// The provisioning progress callback, with a `Debug` that does not try to print a closure.
#[derive(Clone)]
struct ProgressSink(Progress);

impl std::fmt::Debug for ProgressSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ProgressSink")
    }
}

impl CodeExecutorBuilder {
    /// The kernel's working directory (created if missing; default: the current directory).
    pub fn workspace(mut self, dir: impl Into<PathBuf>) -> Self {
        self.workspace = Some(dir.into());
        self
    }

    /// Where PNG outputs are written (default: `<workspace>/images`).
    pub fn images_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.images_dir = Some(dir.into());
        self
    }

    /// Adds variables to the kernel's environment (which otherwise holds a minimal base only).
    /// The entries of `PYTHONPATH` are also import roots for tool calls: servers registered for
    /// one of them, or for a directory in one, are callable (see `generate_mcp_sources`).
    pub fn kernel_env<K: Into<String>, V: Into<String>>(
        mut self,
        vars: impl IntoIterator<Item = (K, V)>,
    ) -> Self {
        self.kernel_env
            .extend(vars.into_iter().map(|(k, v)| (k.into(), v.into())));
        self
    }

    /// An explicit interpreter with ipykernel and pydantic (default: `IPYBOX_PYTHON`, else the
    /// managed environment, see [`crate::pyenv`]).
    pub fn python(mut self, python: impl Into<PathBuf>) -> Self {
        self.python = Some(python.into());
        self
    }

    /// Disables the warm spare kernel (saves ~15 MB with the kernel factory, ~35 MB without;
    /// reset then waits for a kernel to start). Same as `spare_kernels(0)`.
    pub fn without_spare_kernel(self) -> Self {
        self.spare_kernels(0)
    }

    /// How many ready kernels wait for resets and restarts (default
    /// [`DEFAULT_SPARE_KERNELS`]). A reset swaps one in (~10 ms) and starts a replacement: forked
    /// by the kernel factory that is ready ~30 ms later, so one spare covers resets back to back;
    /// each idle spare costs ~15 MB (PSS). Without the factory a replacement takes ~0.2–0.4 s and
    /// ~35 MB, and `n` spares cover `n` resets in a row.
    pub fn spare_kernels(mut self, n: usize) -> Self {
        self.spare_kernels = Some(n);
        self
    }

    /// Variables for `${VAR}` placeholders in MCP server params and for the base environment
    /// of stdio MCP servers (default: this process's environment).
    pub fn tool_env<K: Into<String>, V: Into<String>>(
        mut self,
        vars: impl IntoIterator<Item = (K, V)>,
    ) -> Self {
        self.tool_env = Some(
            vars.into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
        );
        self
    }

    /// How long a tool call waits for an approval decision in [`CodeExecutor::stream`]
    /// (default 60 s; `Duration::MAX` waits without limit); waiting does not count against the
    /// execution timeout.
    pub fn approval_timeout(mut self, timeout: Duration) -> Self {
        self.approval_timeout = Some(timeout);
        self
    }

    /// The longest an approval request may be when shown (characters of
    /// [`ApprovalRequest::describe`]); a longer one is rejected in the kernel before anyone is
    /// asked (`ApprovalRejected`, saying so). Nothing in a prompt is ever cut: set this when a
    /// person reads the prompts (the MCP server and `ipybox exec` use
    /// [`crate::tools::shown::HUMAN_TEXT_LIMIT`]). Default: no limit, the application gets every
    /// request whole. Names over [`crate::tools::shown::MAX_NAME_CHARS`] are refused either way.
    pub fn approval_text_limit(mut self, chars: usize) -> Self {
        self.approval_text_limit = Some(chars);
        self
    }

    /// Keeps at most `bytes` of each execution's text output (default: all of it): longer text
    /// keeps its first and last halves, the middle replaced by a line saying how many bytes
    /// were cut. Applied while the code runs, so code that prints without end holds no more
    /// than this in ipybox. [`CodeExecutor::stream_with_options`] can cap one execution lower.
    pub fn max_output_bytes(mut self, bytes: usize) -> Self {
        self.output.max_text_bytes = Some(bytes);
        self
    }

    /// Saves and returns at most `n` images per execution (default
    /// [`crate::kernel::DEFAULT_MAX_IMAGES`]); more are dropped and counted in
    /// [`ExecutionResult::images_dropped`].
    pub fn max_images(mut self, n: usize) -> Self {
        self.output.max_images = n;
        self
    }

    /// Saves and returns at most `bytes` of images (decoded PNG, all of one execution's
    /// together; default [`crate::kernel::DEFAULT_MAX_IMAGE_BYTES`], 16 MiB); an image that
    /// would go over is dropped and counted in [`ExecutionResult::images_dropped`].
    pub fn max_image_bytes(mut self, bytes: usize) -> Self {
        self.output.max_image_bytes = bytes;
        self
    }

    /// How long a kernel may take to start and answer its first request (default 60 s).
    pub fn kernel_start_timeout(mut self, timeout: Duration) -> Self {
        self.kernel_start_timeout = Some(timeout);
        self
    }

    /// After every execution that left the kernel in another directory, change back to the
    /// workspace and append `[ipybox] cwd reset to <workspace>` to its output (Python ipybox's
    /// `working_dir` behaviour). Default: off, a `cd` persists until code changes it again.
    pub fn restore_working_dir(mut self, restore: bool) -> Self {
        self.restore_working_dir = restore;
        self
    }

    /// Shell commands need approval like tool calls: every `!cmd`, `!!cmd`, `x = !cmd`, `%sx`,
    /// shell alias and `%pip`, and every `%%bash` / `%%sh` / `%%script` (and other script-magic)
    /// cell is an [`ApprovalRequest`] for which [`ApprovalRequest::is_shell_command`] is true:
    /// server name `ipybox`, tool name `shell` (line commands) or `shell_magic` (cell magics),
    /// arguments `{"cmd": <the command after variable expansion, or the cell>}` (plus `magic`,
    /// the magic's line, for cell magics). A rejected command fails the cell with
    /// `ApprovalRejected` and does not run. [`CodeExecutor::execute`] accepts them all, as it
    /// does tool calls. Default: off.
    pub fn approve_shell_cmds(mut self, approve: bool) -> Self {
        self.approve_shell_cmds = approve;
        self
    }

    /// Blocks direct process creation from Python in the kernel (`subprocess`, `os.system`,
    /// `os.popen`, `os.exec*`, `os.spawn*`, `os.posix_spawn*`, `pty.spawn`) with a
    /// `PermissionError` that says to use `!cmd`, so shell commands can only run approved.
    /// Implies [`CodeExecutorBuilder::approve_shell_cmds`]. A guard against accidents inside a
    /// cooperating interpreter, not a security boundary (that is [`CodeExecutorBuilder::sandbox`]);
    /// docs/approvals.md lists the known ways around it. Default: off.
    pub fn require_shell_escape(mut self, require: bool) -> Self {
        self.require_shell_escape = require;
        self
    }

    /// Runs kernels on a Jupyter server (Jupyter Kernel Gateway, Enterprise Gateway or Jupyter
    /// Server) instead of as local processes: `http[s]://host:port[/base]`, optionally with
    /// `?token=…` (may be `${VAR}`, taken from the host environment; else `IPYBOX_GATEWAY_TOKEN`)
    /// and `&kernel=NAME` (the kernelspec; default `python3`). Tool calls travel over the kernel's
    /// Jupyter connection; see docs/remote-kernels.md. Not combinable with [`Self::sandbox`].
    pub fn kernel_gateway(mut self, url: impl Into<String>) -> Self {
        self.kernel_gateway = Some(GatewayUrl(url.into()));
        self
    }

    /// With [`Self::kernel_gateway`]: the first kernel is kernel `id`, which already runs on the
    /// server (another ipybox created it: replicas sharing a server's kernels), instead of a new
    /// one. It is connected to, checked for ipybox's runtime and used as it is, state included;
    /// `start()` fails with [`KernelError::Gone`] if the server no longer has it. Kernels made
    /// later (reset, replacement) are new ones.
    pub fn attach_kernel(mut self, id: impl Into<String>) -> Self {
        self.attach_kernel = Some(id.into());
        self
    }

    /// Forks new local kernels from a template process that has already imported IPython and
    /// ipykernel (the kernel factory), so a kernel is ready in tens of milliseconds and kernels
    /// share those pages; `false` launches each kernel as a fresh Python process, as ipybox did
    /// before (for debugging, or if the factory misbehaves). Default: on (Linux), unless the
    /// environment sets `IPYBOX_KERNEL_FACTORY=0` (or `off`, `false`, `no`). A factory that
    /// fails falls back to plain launches by itself, with a log line. See docs/kernel.md.
    pub fn kernel_factory(mut self, on: bool) -> Self {
        self.kernel_factory = Some(on);
        self
    }

    /// Forks this executor's kernels from one template process shared with every executor
    /// built with a clone of `factory` (the sessions of `ipybox serve --http`), instead of a
    /// template of its own: a session's kernel then costs little more than its own objects.
    /// With [`Self::confine`] the template runs in a bubblewrap that gives every kernel's common
    /// view, and each kernel it forks makes its own (namespaces, mounts, no capabilities) before
    /// any other code runs; without it each kernel only gets its executor's environment and
    /// working directory. Used when the kernel factory is (see [`Self::kernel_factory`]); ignored
    /// with [`Self::sandbox`] (srt's sandbox is per executor) and [`Self::kernel_gateway`]. A
    /// kernel whose fork fails is launched as without it (confined in a bubblewrap of its own,
    /// when confined), with a log line. See docs/kernel.md.
    pub fn shared_kernel_factory(mut self, factory: SharedKernelFactory) -> Self {
        self.shared_kernel_factory = Some(factory);
        self
    }

    /// The stdio MCP servers this executor's kernels call are shared with every executor built
    /// with a clone of `servers`: one process per registered server (and params) for all of them,
    /// started on the first call of any, instead of one per executor. Approvals stay per
    /// executor (they happen before a call reaches the server); this executor's `reset()` and
    /// `stop()` do not close a shared server ([`SharedMcpServers::close_all`] does). Servers over
    /// HTTP or SSE stay per executor.
    pub fn shared_mcp_servers(mut self, servers: SharedMcpServers) -> Self {
        self.shared_mcp_servers = Some(servers);
        self
    }

    /// Runs the kernel inside Anthropic's sandbox-runtime (`srt`); see [`crate::sandbox`].
    /// `start()` fails (it never silently runs unsandboxed) if srt or bubblewrap is missing.
    pub fn sandbox(mut self, options: SandboxOptions) -> Self {
        self.sandbox = Some(options);
        self
    }

    /// Runs each local kernel confined in a bubblewrap of its own ([`crate::confine`]): its own
    /// pid namespace and `/proc`, no view of other executors' runtime directories, of `$HOME`
    /// or ipybox's data directory, the workspace read-only, and its own writable working
    /// directory (`<runtime>/work`, removed when the executor stops). What `ipybox serve
    /// --http` does for every session. `start()` fails if bwrap is missing; not combinable
    /// with [`Self::sandbox`] (srt confines a kernel its own way) or [`Self::kernel_gateway`].
    pub fn confine(mut self, confinement: Confinement) -> Self {
        self.confinement = Some(confinement);
        self
    }

    /// How long connecting to an MCP server may take (default 30 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = Some(timeout);
        self
    }

    /// The host environment ipybox works from: `IPYBOX_PYTHON`, `IPYBOX_HOME`, `PATH` (uv,
    /// python3, srt), the variables passed through to the kernel and MCP servers (default: this
    /// process's environment, read once by [`CodeExecutorBuilder::build`]).
    pub fn host_env(mut self, env: HostEnv) -> Self {
        self.host_env = Some(env);
        self
    }

    /// Where provisioning the managed Python environment reports progress, one line per call
    /// (default: `tracing` info events; the CLI prints them).
    pub fn progress(mut self, progress: Progress) -> Self {
        self.progress = Some(ProgressSink(progress));
        self
    }

    /// Records every execution in a Jupyter notebook in `dir` (relative: to the workspace),
    /// rewritten after each cell so it can be watched in JupyterLab or VS Code: one file per
    /// executor, `<UTC start time>-<tag>.ipynb` (see [`crate::notebook`] and
    /// docs/notebook.md). Default: off.
    pub fn notebook(self, dir: impl Into<PathBuf>) -> Self {
        self.notebook_config(NotebookConfig::in_dir(dir))
    }

    /// [`Self::notebook`] with every option: the session's tag, private files, the size of a
    /// file, or a notebook kept in memory only ([`CodeExecutor::notebook`] reads it).
    pub fn notebook_config(mut self, config: NotebookConfig) -> Self {
        self.notebook = Some(config);
        self
    }

    pub fn build(mut self) -> CodeExecutor {
        let host = self.host_env.take().unwrap_or_else(HostEnv::from_process);
        let notebook = self.notebook.clone().map(|config| {
            let base = self.workspace.clone().unwrap_or_else(|| PathBuf::from("."));
            let base = std::path::absolute(&base).unwrap_or(base);
            Arc::new(Notebook::new(config.resolved(&base)))
        });
        CodeExecutor {
            inner: Arc::new(Inner {
                host,
                notebook,
                builder: self,
                state: Mutex::new(None),
                stopping: tokio::sync::watch::channel(false).0,
                registry: std::sync::OnceLock::new(),
                python: std::sync::OnceLock::new(),
                live: std::sync::Mutex::new(None),
                current: std::sync::Mutex::new(None),
            }),
        }
    }
}

struct Running {
    pool: KernelPool,
    tools: ToolServer,
    runtime: Arc<RuntimeDir>,
    /// No code has run in the current kernel since it started (or since a reset): a restore
    /// loads into it instead of replacing it first.
    pristine: bool,
    /// Snapshot transfers over the stdin channel (kernels on a Jupyter server).
    snapshot_channel: Option<Arc<crate::snapshot::remote::SnapshotChannel>>,
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

/// Armed while an `execute()` runs; if that future is dropped, settles the abandoned execution
/// (interrupt, or replace the kernel) as soon as the executor's lock is free.
struct SettleOnDrop(Option<Arc<Inner>>);

impl Drop for SettleOnDrop {
    fn drop(&mut self) {
        if let Some(inner) = self.0.take()
            && let Ok(handle) = tokio::runtime::Handle::try_current()
        {
            handle.spawn(async move {
                if let Some(running) = inner.state.lock().await.as_mut() {
                    running.pool.settle().await;
                }
            });
        }
    }
}

/// Registered while an execution holds the executor's lock: [`CodeExecutor::cancel`] reaches it.
/// Dropping it unregisters.
struct CurrentExecution<'a>(&'a Inner);

impl<'a> CurrentExecution<'a> {
    fn register(inner: &'a Inner, canceller: Canceller) -> Self {
        *inner.current.lock().unwrap_or_else(|p| p.into_inner()) = Some(canceller);
        Self(inner)
    }
}

impl Drop for CurrentExecution<'_> {
    fn drop(&mut self) {
        self.0
            .current
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
    }
}

impl Inner {
    /// The executor's lock, for an execution: `None` if a stop begins while it waits (a stop
    /// never waits behind queued executions, which would only fail once it is done).
    async fn lock_unless_stopping(&self) -> Option<tokio::sync::MutexGuard<'_, Option<Running>>> {
        let mut stopping = self.stopping.subscribe();
        tokio::select! {
            biased;
            guard = self.state.lock() => Some(guard),
            _ = stopping.wait_for(|s| *s) => None,
        }
    }

    /// Runs `execution` unless `stop()` is called meanwhile.
    async fn unless_stopping(
        &self,
        execution: impl std::future::Future<Output = Result<ExecutionOutput, KernelError>>,
    ) -> Result<ExecutionOutput, KernelError> {
        let mut stopping = self.stopping.subscribe();
        tokio::select! {
            result = execution => result,
            _ = stopping.wait_for(|s| *s) => Err(KernelError::Stopped),
        }
    }
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

    /// Finds (or provisions) the Python environment and starts the kernel. Starting a started
    /// executor does nothing.
    pub async fn start(&self) -> Result<(), ExecutorError> {
        let mut state = self.inner.state.lock().await;
        if state.is_some() {
            return Ok(());
        }
        let b = &self.inner.builder;
        let workspace = self.workspace()?;
        let gateway = match &b.kernel_gateway {
            Some(spec) => Some(self.gateway(&spec.0)?),
            None => None,
        };
        // Before anything runs on the host: nothing it will run may lie where a sandboxed
        // kernel can write.
        let sandbox_policy = match &b.sandbox {
            Some(options) => {
                let loaded = crate::sandbox::load_policy(options, &workspace).await?;
                let explicit = b
                    .python
                    .clone()
                    .or_else(|| self.host_env().get("IPYBOX_PYTHON").map(PathBuf::from));
                crate::sandbox::check_layout(
                    &loaded,
                    options,
                    self.host_env(),
                    &workspace,
                    explicit.as_deref(),
                )?;
                Some(loaded)
            }
            None => None,
        };
        let bwrap = match &b.confinement {
            Some(_) if gateway.is_some() || b.sandbox.is_some() => {
                return Err(ConfineError::Unavailable {
                    reason: format!(
                        "confinement applies to plain local kernels, not to {}",
                        if gateway.is_some() {
                            "kernels on a Jupyter server"
                        } else {
                            "sandboxed ones (srt confines them its own way)"
                        }
                    ),
                    help: "ask for one of the two".into(),
                }
                .into());
            }
            Some(c) => Some(crate::confine::find_bwrap(
                c.bwrap.as_deref(),
                self.host_env(),
            )?),
            None => None,
        };
        // Kernels on a Jupyter server use the server's Python: nothing to provision here.
        let python = match &gateway {
            Some(_) => PathBuf::new(),
            None => self.local_python().await?,
        };
        // One template for many executors: this executor's runtime directory lives in the
        // shared factory's directory (what the template's view shows).
        let shared = match &b.shared_kernel_factory {
            Some(handle) if gateway.is_none() && b.sandbox.is_none() && self.factory_wanted() => {
                Some(self.start_shared(handle, &python, &workspace, bwrap.as_deref())?)
            }
            _ => None,
        };
        let runtime = match &shared {
            Some(shared) => RuntimeDir::create_in(shared.dir()),
            None => RuntimeDir::create(self.host_env()),
        }
        .map_err(|source| ExecutorError::Io {
            path: RuntimeDir::base_dir(self.host_env()),
            source,
        })?;
        let runtime = Arc::new(runtime);
        if gateway.is_none() {
            let _ = self.inner.python.set(python.clone());
        }
        let mut config = KernelConfig::new(python, workspace.clone(), self.host_env().clone());
        config.images_dir = self.images_dir()?;
        config.output = b.output;
        let sessions = SessionCache::new(
            self.tool_env(),
            b.connect_timeout.unwrap_or(DEFAULT_CONNECT_TIMEOUT),
        );
        // No kernel is trusted with server params: it reaches the servers registered for the
        // directories this executor imports from, with their recorded params (tools::registry).
        let roots = self.import_roots(&workspace, sandbox_policy.as_ref(), gateway.is_some());
        let tool_state = ToolServerState::new(
            sessions,
            b.approval_timeout.unwrap_or(DEFAULT_APPROVAL_TIMEOUT),
            Reach::new(self.registry()?, roots),
        )
        .with_text_limit(b.approval_text_limit)
        .with_shared_servers(b.shared_mcp_servers.as_ref().map(|shared| {
            shared.cache(
                self.tool_env(),
                b.connect_timeout.unwrap_or(DEFAULT_CONNECT_TIMEOUT),
            )
        }));
        let socket = runtime.path().join("tools.sock");
        let tools = ToolServer::start(&socket, Arc::new(tool_state)).map_err(|source| {
            ExecutorError::Io {
                path: socket.clone(),
                source,
            }
        })?;
        config.env = b.kernel_env.clone();
        let mut snapshot_channel = None;
        match gateway {
            None => {
                // Remote kernels get the runtime in their bootstrap cell instead.
                let python_dir = runtime.path().join("python");
                extract(&crate::kernel::RUNTIME, &python_dir).map_err(|source| {
                    ExecutorError::Io {
                        path: python_dir.clone(),
                        source,
                    }
                })?;
                config.python_path = vec![python_dir];
                config
                    .env
                    .insert("IPYBOX_TOOL_SOCKET".into(), socket.display().to_string());
            }
            Some(gateway) => {
                // Tool calls come over the kernel's stdin channel (no route to the socket), and
                // so do snapshots.
                let state = tools.state().clone();
                let ws = workspace.clone();
                let channel = crate::snapshot::remote::SnapshotChannel::new();
                snapshot_channel = Some(channel.clone());
                config.input_handler = Some(Arc::new(move |payload: String| {
                    let state = state.clone();
                    let ws = ws.clone();
                    let channel = channel.clone();
                    Box::pin(async move {
                        if let Some(reply) = channel.answer(&payload) {
                            return reply;
                        }
                        crate::tools::stdin_channel::answer(&state, &ws, &payload).await
                    })
                }));
                config.ledger = self.host_env().data_dir().map(|d| Ledger::new(&d));
                if let Some(ledger) = config.ledger.clone() {
                    let gateway = gateway.clone();
                    tokio::spawn(async move { ledger.clean_up(&gateway).await });
                }
                config.backend = Backend::Gateway(gateway);
            }
        }
        config.restore_cwd = b.restore_working_dir;
        config.shell_approval = if b.approve_shell_cmds || b.require_shell_escape {
            ShellApproval::On {
                require_escape: b.require_shell_escape,
            }
        } else {
            ShellApproval::Off
        };
        if let Some(timeout) = b.kernel_start_timeout {
            config.start_timeout = timeout;
        }
        config.factory = config.factory && self.factory_wanted();
        if let (Some(options), Some(loaded)) = (&b.sandbox, sandbox_policy) {
            let python = config.python.clone();
            let writable = runtime
                .kernel_writable()
                .map_err(|source| ExecutorError::Io {
                    path: runtime.path().to_path_buf(),
                    source,
                })?;
            config.wrapper = Some(
                crate::sandbox::prepare(
                    options,
                    loaded,
                    self.host_env(),
                    &workspace,
                    runtime.path(),
                    &[
                        runtime.path().join("python"),
                        runtime.host_kernels(),
                        runtime.factory_dir().map_err(|source| ExecutorError::Io {
                            path: runtime.path().to_path_buf(),
                            source,
                        })?,
                        socket.clone(),
                    ],
                    writable.path(),
                    &python,
                    &config.env,
                )
                .await?,
            );
            if options.isolate_workspace {
                // Inside the kernel-writable part: the kernel writes there already, and the
                // host never reads back from it.
                let work = writable
                    .subdir(crate::confine::WORK_DIR, Some(0o700))
                    .map_err(|source| ExecutorError::Io {
                        path: writable.path().join(crate::confine::WORK_DIR),
                        source,
                    })?;
                config.cwd = Some(work.path().to_path_buf());
            }
        }
        if let (Some(confinement), Some(bwrap)) = (&b.confinement, &bwrap) {
            let io = |source| ExecutorError::Io {
                path: runtime.path().to_path_buf(),
                source,
            };
            let writable = runtime.kernel_writable().map_err(io)?;
            let work = runtime.path().join(crate::confine::WORK_DIR);
            crate::safe_fs::create_private_dir(&work).map_err(io)?;
            let layout = crate::confine::Layout::new(
                self.host_env(),
                runtime.path(),
                writable.path(),
                &workspace,
                &config.python,
                confinement,
            );
            if let Some(shared) = &shared {
                // A forked kernel binds ipybox's kernel-side Python back from the template's
                // copy: its preloaded modules came from there.
                let plan = layout
                    .clone()
                    .show_read_only(shared.dir().join("python"))
                    .fork_plan();
                config.shared = Some(SharedFork::new(shared, Some(plan)));
            }
            config.wrapper = Some(crate::confine::wrapper(bwrap, layout));
            config.cwd = Some(work);
        } else if let Some(shared) = &shared {
            config.shared = Some(SharedFork::new(shared, None));
        }
        let spares = b.spare_kernels.unwrap_or(DEFAULT_SPARE_KERNELS);
        let pool = KernelPool::start(
            Arc::new(config),
            runtime.clone(),
            spares,
            b.attach_kernel.as_deref(),
        )
        .await?;
        *self.inner.live.lock().unwrap_or_else(|p| p.into_inner()) = Some(Live {
            runtime: runtime.path().to_path_buf(),
            kernel_pid: pool.current_pid(),
            kernel_id: pool.current_id(),
            tools: tools.state().clone(),
        });
        *state = Some(Running {
            pool,
            tools,
            runtime,
            pristine: true,
            snapshot_channel,
        });
        // Started again after a stop: a new kernel for the cells that follow.
        if let Some(notebook) = &self.inner.notebook {
            notebook.section(Section::Restarted);
        }
        Ok(())
    }

    /// The shared kernel factory `handle`, started now by this executor if it is the first:
    /// its template gets this executor's interpreter, kernel environment and workspace, its
    /// own copy of ipybox's kernel-side Python, and, confined, the base bubblewrap.
    fn start_shared(
        &self,
        handle: &SharedKernelFactory,
        python: &Path,
        workspace: &Path,
        bwrap: Option<&Path>,
    ) -> Result<Arc<crate::kernel::StartedFactory>, ExecutorError> {
        let b = &self.inner.builder;
        let host = self.host_env();
        let template = |dir: &Path| {
            let python_dir = dir.join("python");
            extract(&crate::kernel::RUNTIME, &python_dir)?;
            let mut config =
                KernelConfig::new(python.to_path_buf(), workspace.to_path_buf(), host.clone());
            config.python_path = vec![python_dir];
            config.env = b.kernel_env.clone();
            config.cwd = Some(dir.to_path_buf());
            if let Some(timeout) = b.kernel_start_timeout {
                config.start_timeout = timeout;
            }
            if let (Some(confinement), Some(bwrap)) = (&b.confinement, bwrap) {
                let layout =
                    crate::confine::Layout::for_template(host, dir, workspace, python, confinement);
                config.wrapper = Some(crate::confine::template_wrapper(bwrap, layout));
            }
            Ok(config)
        };
        handle.get_or_start(host, template).map_err(|e| match e {
            SharedFactoryError::Io { path, source } => ExecutorError::Io { path, source },
            SharedFactoryError::Shut => KernelError::Start {
                reason: "the shared kernel factory was shut down".into(),
                help: "start executors before shutting down the factory they share".into(),
            }
            .into(),
        })
    }

    /// Whether kernels come from the kernel factory: the builder's choice, else
    /// `IPYBOX_KERNEL_FACTORY` (off for `0`, `off`, `false`, `no`), else on.
    fn factory_wanted(&self) -> bool {
        if let Some(on) = self.inner.builder.kernel_factory {
            return on;
        }
        match self.host_env().get("IPYBOX_KERNEL_FACTORY") {
            Some(v) => !matches!(
                v.trim().to_ascii_lowercase().as_str(),
                "0" | "off" | "false" | "no"
            ),
            None => true,
        }
    }

    /// The kernel's interpreter on this machine, provisioned on first use.
    async fn local_python(&self) -> Result<PathBuf, ExecutorError> {
        let b = &self.inner.builder;
        let explicit = b.python.clone();
        let host = self.host_env().clone();
        let progress = b
            .progress
            .as_ref()
            .map_or_else(pyenv::log_progress, |p| p.0.clone());
        let env = tokio::task::spawn_blocking(move || {
            pyenv::resolve(explicit.as_deref(), &host, &progress)
        })
        .await
        .map_err(|source| ExecutorError::Task {
            what: "finding the Python environment",
            source,
        })??;
        Ok(env.python)
    }

    /// The Jupyter server of `kernel_gateway(url)`.
    fn gateway(&self, spec: &str) -> Result<Gateway, ExecutorError> {
        let b = &self.inner.builder;
        if b.sandbox.is_some() {
            return Err(KernelError::Start {
                reason: "a sandbox wraps local kernel processes; it cannot apply to kernels on a Jupyter server".into(),
                help: "use either the sandbox or the kernel gateway (isolate remote kernels on the server side, e.g. one pod per kernel)".into(),
            }
            .into());
        }
        if b.python.is_some() {
            tracing::warn!(
                "the python path is ignored: kernels on a Jupyter server use the server's kernelspec (choose it with ?kernel=NAME in the gateway URL)"
            );
        }
        Ok(Gateway::parse(spec, self.host_env())?)
    }

    fn tool_env(&self) -> HashMap<String, String> {
        self.inner
            .builder
            .tool_env
            .clone()
            .unwrap_or_else(|| self.host_env().vars().clone())
    }

    /// The directories this executor's kernels import from, as configured here (never as the
    /// kernel says): the workspace and `kernel_env`'s `PYTHONPATH`. Links are not followed
    /// where such a kernel can write: the sandbox's writable directories, a remote kernel's
    /// workspace (see `ImportRoots::new`).
    fn import_roots(
        &self,
        workspace: &Path,
        sandbox: Option<&crate::sandbox::LoadedPolicy>,
        remote: bool,
    ) -> ImportRoots {
        let unfollowed = match sandbox {
            Some((policy, _)) => {
                let home = self.host_env().get("HOME").map(PathBuf::from);
                policy.writable_roots(workspace, home.as_deref())
            }
            None if remote => vec![workspace.to_path_buf()],
            None => Vec::new(),
        };
        let python_path = self.inner.builder.kernel_env.get("PYTHONPATH");
        ImportRoots::new(workspace, python_path.map(String::as_str), &unfollowed)
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

    /// Registers an MCP server: generates `<workspace>/mcptools/<server_name>/` from its tools
    /// (see [`crate::generate_mcp_sources`]) and records the params on the host for
    /// `<workspace>/mcptools`: kernel code may only call servers registered for a directory it
    /// imports from (here: its workspace), with the recorded params. `${VAR}`
    /// placeholders are resolved from the builder's `tool_env` (default: the process env).
    /// Does not wait for a running execution. Returns the module names.
    pub async fn register_mcp_server(
        &self,
        server_name: &str,
        server_params: &serde_json::Value,
    ) -> Result<Vec<String>, RegisterError> {
        let root = self
            .workspace()
            .map_err(|e| RegisterError::Workspace(e.into()))?
            .join("mcptools");
        let timeout = self
            .inner
            .builder
            .connect_timeout
            .unwrap_or(DEFAULT_CONNECT_TIMEOUT);
        if let Some(options) = &self.inner.builder.sandbox {
            // The host starts this server outside the sandbox: none of it may live where the
            // sandboxed kernel writes.
            let workspace = root.parent().unwrap_or(&root);
            let (policy, _) = crate::sandbox::load_policy(options, workspace)
                .await
                .map_err(|e| RegisterError::Workspace(e.into()))?;
            let home = self.host_env().get("HOME").map(PathBuf::from);
            let writable = policy.writable_roots(workspace, home.as_deref());
            crate::register::refuse_writable_paths(
                server_name,
                server_params,
                &self.tool_env(),
                &writable,
            )?;
        }
        let modules = crate::register::generate_only(
            server_name,
            server_params,
            &root,
            &self.tool_env(),
            timeout,
            ApiStyle::Sync,
        )
        .await?;
        let registry = self
            .registry()
            .map_err(|e| RegisterError::Workspace(e.into()))?;
        // `root` was written without following a link at `mcptools` (and the workspace is
        // canonical): it is the registration's directory as it stands.
        registry
            .record(server_name, &root, server_params)
            .map_err(RegisterError::Record)?;
        Ok(modules)
    }

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
            let _ = std::fs::remove_dir_all(&live.runtime);
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

    /// Runs `code` and returns its output; its tool calls are all accepted. `timeout` of `None`
    /// waits as long as it takes.
    pub async fn execute(
        &self,
        code: &str,
        timeout: Option<Duration>,
    ) -> Result<ExecutionResult, ExecutorError> {
        self.execute_inner(code, timeout, true).await
    }

    /// [`Self::execute`]; `record`: whether the session notebook gets the cell (ipybox's own
    /// housekeeping code is not the session's).
    async fn execute_inner(
        &self,
        code: &str,
        timeout: Option<Duration>,
        record: bool,
    ) -> Result<ExecutionResult, ExecutorError> {
        let mut state = self
            .inner
            .lock_unless_stopping()
            .await
            .ok_or(KernelError::Stopped)?;
        let running = state.as_mut().ok_or(KernelError::Stopped)?;
        running.pristine = false;
        let (cancel, mut cancelled) = tokio::sync::watch::channel(false);
        let _current = CurrentExecution::register(&self.inner, Canceller(Arc::new(cancel)));
        // Recorded when this future ends, also when its caller drops it (as cancelled).
        let options = RunOptions {
            timeout,
            ..RunOptions::default()
        };
        let mut recording = record
            .then(|| Recording::start(&self.inner, code, &options))
            .flatten()
            .map(|(recording, cell)| {
                let (tx, rx) = mpsc::unbounded_channel();
                RecordOnDrop(Some((recording, cell, rx)), tx)
            });
        // This execution's own clock: only its calls' approval waits pause it.
        let pause = TimeoutPause::default();
        let log = recording
            .as_ref()
            .and_then(|r| r.0.as_ref())
            .map(|(recording, ..)| recording.log.clone())
            .unwrap_or_default();
        running
            .tools
            .state()
            .set_policy(ApprovalPolicy::AcceptAll, pause.clone(), log);
        // If our caller drops this future mid-execution, interrupt the code right away instead
        // of letting it run on (the next execution would otherwise wait behind it).
        let mut settle = SettleOnDrop(Some(self.inner.clone()));
        let events = recording.as_ref().map(|r| &r.1);
        let run = running.pool.execute(code, timeout, events, &pause, None);
        let result = tokio::select! {
            result = self.inner.unless_stopping(run) => result.map_err(ExecutorError::from),
            true = async { cancelled.wait_for(|c| *c).await.is_ok() } => {
                running.pool.settle().await;
                Err(ExecutorError::Cancelled)
            }
        };
        settle.0 = None;
        if let Some(recording) = recording.as_mut() {
            recording.finish(&result);
        }
        result
    }

    /// Cancels the execution that is running now (from [`CodeExecutor::execute`] or
    /// [`CodeExecutor::stream`]), as [`Canceller::cancel`] does: the kernel is interrupted
    /// (state kept), tool calls waiting for approval are rejected (a later `accept()` runs
    /// nothing), and the execution ends with [`ExecutorError::Cancelled`]. Returns whether an
    /// execution was running. An execution still waiting for its turn is not affected.
    pub fn cancel(&self) -> bool {
        let current = self
            .inner
            .current
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        match current {
            Some(canceller) => {
                canceller.cancel();
                true
            }
            None => false,
        }
    }

    /// Runs `code`, yielding output chunks, images and approval requests as they arrive, then the
    /// result. Each tool call waits until its [`ApprovalRequest`] is accepted or rejected (or the
    /// approval timeout passes). The execution runs to completion even if the stream is dropped
    /// early; its pending and later tool calls are then rejected.
    pub fn stream(&self, code: &str, timeout: Option<Duration>) -> Execution {
        self.stream_with_options(
            code,
            RunOptions {
                timeout,
                ..RunOptions::default()
            },
        )
    }

    /// [`CodeExecutor::stream`] whose tool calls (and shell commands) are all accepted, as in
    /// [`CodeExecutor::execute`]: output chunks and images as they arrive, no
    /// [`ExecutionEvent::Approval`] items.
    pub fn stream_accepting(&self, code: &str, timeout: Option<Duration>) -> Execution {
        self.stream_with_options(
            code,
            RunOptions {
                timeout,
                accept_all: true,
                ..RunOptions::default()
            },
        )
    }

    /// [`CodeExecutor::stream`] (or, with [`RunOptions::accept_all`],
    /// [`CodeExecutor::stream_accepting`]) with every option of one execution: its timeout, a
    /// lower cap on the text it keeps, what the session notebook keeps.
    pub fn stream_with_options(&self, code: &str, options: RunOptions) -> Execution {
        let ask = !options.accept_all;
        let timeout = options.timeout;
        let max_output_bytes = options.max_output_bytes;
        let (tx, rx) = mpsc::unbounded_channel();
        let (cancel, mut cancelled) = tokio::sync::watch::channel(false);
        let canceller = Canceller(Arc::new(cancel));
        let inner = self.inner.clone();
        let code = code.to_string();
        let registered = canceller.clone();
        tokio::spawn(async move {
            let (recording, mut cell) = Recording::start(&inner, &code, &options).unzip();
            let log = recording
                .as_ref()
                .map(|r| r.log.clone())
                .unwrap_or_default();
            let (ev_tx, mut ev_rx) = mpsc::unbounded_channel::<ExecEvent>();
            let forward = {
                let tx = tx.clone();
                tokio::spawn(async move {
                    while let Some(ev) = ev_rx.recv().await {
                        if let Some(cell) = cell.as_mut() {
                            cell.observe(&ev);
                        }
                        let _ = tx.send(match ev {
                            ExecEvent::Output(_, s) => ExecutionEvent::Chunk(s),
                            ExecEvent::Image(_, p, _) => ExecutionEvent::Image(p),
                        });
                    }
                    cell
                })
            };
            // Cancelled when the execution ends: waiting tool calls are then rejected, and the
            // forwarder below stops (a call still waiting holds a sender, so the channel alone
            // would not close while the application holds an undecided request).
            let ended = CancellationToken::new();
            let (ap_tx, mut ap_rx) = mpsc::unbounded_channel::<ApprovalRequest>();
            let approvals = {
                let tx = tx.clone();
                let ended = ended.clone();
                tokio::spawn(async move {
                    loop {
                        let request = tokio::select! {
                            biased;
                            request = ap_rx.recv() => request,
                            () = ended.cancelled() => ap_rx.try_recv().ok(),
                        };
                        let Some(request) = request else { break };
                        // If the stream was dropped the request is dropped too: rejected.
                        let _ = tx.send(ExecutionEvent::Approval(request));
                    }
                })
            };
            // Held until the notebook has the cell: the next execution's cell comes after it.
            let mut state = inner.lock_unless_stopping().await;
            let result = {
                let _current = CurrentExecution::register(&inner, registered);
                match state.as_mut().and_then(|s| s.as_mut()) {
                    Some(running) => {
                        running.pristine = false;
                        // This execution's own clock: only its calls' approval waits pause it.
                        let pause = TimeoutPause::default();
                        // Waits end (rejected) when this execution is cancelled, not when it
                        // merely ends: a leftover thread's request stays the application's to
                        // decide.
                        let waits = CancellationToken::new();
                        let policy = if ask {
                            ApprovalPolicy::ask(ap_tx, waits.clone())
                        } else {
                            // No requests: the forwarder must see its channel close.
                            drop(ap_tx);
                            ApprovalPolicy::AcceptAll
                        };
                        running
                            .tools
                            .state()
                            .set_policy(policy.clone(), pause.clone(), log);
                        let run = running.pool.execute(
                            &code,
                            timeout,
                            Some(&ev_tx),
                            &pause,
                            max_output_bytes,
                        );
                        let result = tokio::select! {
                            result = inner.unless_stopping(run) => result.map_err(ExecutorError::from),
                            true = async { cancelled.wait_for(|c| *c).await.is_ok() } => {
                                // Reject what waits for a decision (the kernel's call then
                                // returns), interrupt the code, and wait until the kernel is
                                // idle (or replace it) before the next execution runs.
                                waits.cancel();
                                running.pool.settle().await;
                                Err(ExecutorError::Cancelled)
                            }
                        };
                        // Calls made after this execution (leftover threads) have no one to ask
                        // (accepting executions accept them, as execute() does).
                        if ask {
                            running.tools.state().set_policy(
                                ApprovalPolicy::ask(
                                    mpsc::unbounded_channel().0,
                                    CancellationToken::new(),
                                ),
                                TimeoutPause::default(),
                                CallLog::default(),
                            );
                        }
                        result
                    }
                    None => Err(KernelError::Stopped.into()),
                }
            };
            drop(ev_tx);
            ended.cancel();
            let (cell, _) = tokio::join!(forward, approvals);
            if let (Some(recording), Ok(Some(cell))) = (recording, cell) {
                recording.finish(cell, &result);
            }
            drop(state);
            let _ = tx.send(ExecutionEvent::Result(result));
        });
        Execution {
            rx,
            cancel: canceller,
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

    async fn reset_running(running: &mut Running) -> Result<(), KernelError> {
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
    /// reaches a kernel, and the current kernel keeps its state. Waits for a running execution.
    pub async fn restore(
        &self,
        store: &SnapshotStore,
        binding: &SnapshotBinding,
        timeout: Option<Duration>,
    ) -> Result<RestoreReport, SnapshotError> {
        let mut state = self.inner.state.lock().await;
        let running = state.as_mut().ok_or(KernelError::Stopped)?;
        let runtime = running.runtime.clone();
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
                    remote::prepare(&runtime, store, binding).await?,
                    channel.clone(),
                ),
                None => Prepared::Local(local::prepare(&runtime, store, binding).await?),
            };
            if !running.pristine {
                Self::reset_running(running).await?;
            }
            running.pristine = false;
            match prepared {
                Prepared::Local(p) => local::load(&mut running.pool, p, timeout).await,
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

    /// Installs `spec` (`numpy`, `numpy>=2`, `git+https://…`) into the kernel's Python environment
    /// on the host (uv when on PATH, else pip), also when the kernel is sandboxed, and refreshes
    /// the kernel's import caches so the package imports without a reset. Starts the executor if
    /// needed; does not wait for a running cell to install. Returns the installer's summary.
    ///
    /// With [`CodeExecutorBuilder::kernel_gateway`] there is no local kernel environment: this
    /// fails with a message that says to add the package to the server's kernel image.
    pub async fn install_package(&self, spec: &str) -> Result<String, ExecutorError> {
        if self.inner.builder.kernel_gateway.is_some() {
            return Err(KernelError::Start {
                reason: format!(
                    "cannot install `{spec}`: the kernels run on a Jupyter server, whose kernel image holds their packages"
                ),
                help: "add the package to the server's kernel image, or run `%pip install PACKAGE` in a cell if that image has pip".into(),
            }
            .into());
        }
        self.start().await?;
        let python = self.python().await.ok_or(KernelError::Stopped)?;
        let owned = spec.to_string();
        let host = self.host_env().clone();
        // A sandboxed kernel can write local paths (the workspace): building one would run its
        // code on the host.
        let sandboxed = self.inner.builder.sandbox.is_some();
        let summary = tokio::task::spawn_blocking(move || {
            if sandboxed {
                crate::pyenv::install_package_from_remote(&python, &owned, &host)
            } else {
                crate::pyenv::install_package(&python, &owned, &host)
            }
        })
        .await
        .map_err(|source| ExecutorError::Task {
            what: "installing a package",
            source,
        })??;
        // Kernels started from now on (spares, the factory's template) import afresh.
        if let Some(running) = self.inner.state.lock().await.as_mut() {
            running.pool.refresh_after_install();
        }
        // New distributions become importable once the import system's caches are fresh.
        let refresh = "import importlib as _i; _i.invalidate_caches(); del _i";
        if let Err(e) = self
            .execute_inner(refresh, Some(Duration::from_secs(30)), false)
            .await
        {
            tracing::warn!("could not refresh the kernel's import caches: {e}");
        }
        if let Some(notebook) = &self.inner.notebook {
            notebook.note_install(spec);
        }
        Ok(summary)
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

/// The options of one execution ([`CodeExecutor::stream_with_options`]).
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Interrupt the code after this long (`None`: wait as long as it takes).
    pub timeout: Option<Duration>,
    /// Accept every tool call and shell command, as [`CodeExecutor::stream_accepting`] does,
    /// instead of yielding approval requests.
    pub accept_all: bool,
    /// Keep at most this many bytes of text output (below the executor's own
    /// [`CodeExecutorBuilder::max_output_bytes`], if any), its first and last halves.
    pub max_output_bytes: Option<usize>,
    /// The session notebook keeps at most this many characters of the cell's text: a caller
    /// that passes on only so much (the MCP tool's `max_output_chars`) says so here, and the
    /// notebook holds what the caller got. Default: [`crate::notebook::MAX_CELL_TEXT_CHARS`].
    pub notebook_output_chars: Option<usize>,
}

/// One execution's place in the session notebook: where its approval decisions are recorded,
/// and the notebook that gets the cell when it ends.
struct Recording {
    notebook: Arc<Notebook>,
    log: CallLog,
}

impl Recording {
    /// `None` when the executor keeps no notebook.
    fn start(inner: &Inner, code: &str, options: &RunOptions) -> Option<(Self, CellRecord)> {
        let notebook = inner.notebook.clone()?;
        let cell = CellRecord::new(code, options.timeout, options.notebook_output_chars);
        Some((
            Self {
                notebook,
                log: CallLog::recording(),
            },
            cell,
        ))
    }

    /// Gives the notebook the cell (unless it never ran: the executor was stopped).
    fn finish(self, cell: CellRecord, result: &Result<ExecutionResult, ExecutorError>) {
        let ending = match result {
            Ok(_) => Ending::Ok,
            Err(ExecutorError::Kernel(KernelError::Stopped)) => return,
            Err(ExecutorError::Kernel(e)) => Ending::Kernel(e),
            Err(e @ ExecutorError::Cancelled) => Ending::Cancelled(e.to_string()),
            Err(e) => Ending::Other(e.to_string()),
        };
        self.notebook.finish(cell, &ending, self.log.take());
    }
}

/// An `execute()`'s recording: the execution's events arrive on the channel (its sender is the
/// second field); recorded when finished, or as cancelled when dropped before (its caller went
/// away).
struct RecordOnDrop(
    Option<(Recording, CellRecord, mpsc::UnboundedReceiver<ExecEvent>)>,
    mpsc::UnboundedSender<ExecEvent>,
);

impl RecordOnDrop {
    fn finish(&mut self, result: &Result<ExecutionResult, ExecutorError>) {
        if let Some((recording, mut cell, mut events)) = self.0.take() {
            while let Ok(event) = events.try_recv() {
                cell.observe(&event);
            }
            recording.finish(cell, result);
        }
    }
}

impl Drop for RecordOnDrop {
    fn drop(&mut self) {
        self.finish(&Err(ExecutorError::Cancelled));
    }
}

/// The items of one [`CodeExecutor::stream`] call. Use [`Execution::next`] or the `Stream` impl.
#[derive(Debug)]
pub struct Execution {
    rx: mpsc::UnboundedReceiver<ExecutionEvent>,
    cancel: Canceller,
}

/// Cancels one streamed execution from anywhere (another task, a signal handler's task).
#[derive(Debug, Clone)]
pub struct Canceller(Arc<tokio::sync::watch::Sender<bool>>);

impl Canceller {
    /// Interrupts the execution: its result becomes [`ExecutorError::Cancelled`] once the kernel
    /// is idle again (state kept). Does nothing after the execution has finished.
    pub fn cancel(&self) {
        self.0.send_replace(true);
    }
}

impl Execution {
    /// A handle that cancels this execution while its items are being awaited elsewhere.
    pub fn canceller(&self) -> Canceller {
        self.cancel.clone()
    }

    /// The next item; `None` after the result.
    pub async fn next(&mut self) -> Option<ExecutionEvent> {
        self.rx.recv().await
    }

    /// Drains the stream and returns the result.
    pub async fn result(mut self) -> Result<ExecutionResult, ExecutorError> {
        while let Some(ev) = self.rx.recv().await {
            if let ExecutionEvent::Result(r) = ev {
                return r;
            }
        }
        Err(KernelError::Stopped.into())
    }
}

impl futures::Stream for Execution {
    type Item = ExecutionEvent;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.rx.poll_recv(cx)
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

fn extract(dir: &Dir<'_>, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for file in dir.files() {
        let path = to.join(file.path());
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(path, file.contents())?;
    }
    for sub in dir.dirs() {
        extract(sub, to)?;
    }
    Ok(())
}
