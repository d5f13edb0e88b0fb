//! The kernel engine: stateful Python in an `ipykernel` process that ipybox launches and talks to
//! over the Jupyter messaging protocol (ZMQ over IPC sockets in a private runtime directory), or
//! in a kernel on a Jupyter server (Kernel Gateway, Enterprise Gateway, Jupyter Server) spoken to
//! over its WebSocket.
//!
//! - `launch`: starting a kernel up to ready, whichever way (forked, launched, remote);
//! - `instance`: one running kernel, whichever transport: readiness (`kernel_info`), death
//!   watch, shutdown;
//! - `local`: a local `ipykernel` process: its plain launch, environment, ZMQ sockets, kill;
//! - `factory`: local kernels forked from a warm template process (the default);
//! - `status`: how a kernel ended and how a start failed (shared by all of the above);
//! - `gateway`: the Jupyter-server transport (REST, WebSocket, bootstrap, ledger);
//! - `execute`: one execution: request, output assembly, completion, timeout and interrupt;
//! - `output`: turning Jupyter outputs into text and image files;
//! - `pool`: the current kernel plus a warm spare, so reset and restarts are near-instant;
//! - `runtime_dir`: the private (0700) directory holding connection files and sockets.
//!
//! The kernel knows nothing of MCP: tool calls reach the host through a socket whose path is just
//! another environment variable here.

mod completion;
pub(crate) mod execute;
mod factory;
pub use factory::SharedKernelFactory;
pub(crate) use factory::{SharedFactoryError, SharedFork, StartedFactory};
pub(crate) mod gateway;
pub use gateway::KernelStatus;
pub(crate) mod instance;
mod kernel_env;
mod launch;
mod local;
pub(crate) mod output;
pub(crate) mod pool;
pub(crate) mod runtime_dir;
pub use runtime_dir::{SOCKET_PATH_MAX, SocketPathTooLong};
pub(crate) mod status;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use include_dir::{Dir, include_dir};

use crate::child_process::CommandWrapper;
use crate::host_env::HostEnv;
use gateway::Gateway;
use gateway::connection::InputHandler;
use gateway::ledger::Ledger;

/// ipybox's kernel-side Python (`python/`): extracted to the runtime directory for local
/// kernels, sent in the bootstrap cell to kernels on Jupyter servers.
pub(crate) static RUNTIME: Dir<'_> = include_dir!("$CARGO_MANIFEST_DIR/python");

/// Where kernels run.
#[derive(Debug, Clone)]
pub(crate) enum Backend {
    /// Child processes of ipybox.
    Local,
    /// Kernels on a Jupyter server.
    Gateway(Gateway),
}

pub use execute::ExecutionOutput;
pub(crate) use execute::{ExecEvent, Source};
pub use output::{DEFAULT_MAX_IMAGE_BYTES, DEFAULT_MAX_IMAGES, OutputLimits};
pub(crate) use pool::KernelPool;

/// Whether shell commands in the kernel need approval (`approve_shell_cmds`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ShellApproval {
    /// `!cmd` and `%%bash` run unasked.
    Off,
    /// Each shell command is an approval request; with `require_escape`, direct process creation
    /// from Python is blocked outside approved commands (`require_shell_escape`).
    On { require_escape: bool },
}

/// How kernels are launched. One config serves the current kernel and its spares.
#[derive(Clone)]
pub(crate) struct KernelConfig {
    /// Interpreter with `ipykernel` (see [`crate::pyenv`]).
    pub python: PathBuf,
    /// The workspace: on `PYTHONPATH` so `import mcptools.x` works, and the kernel's working
    /// directory unless `cwd` names another.
    pub workspace: PathBuf,
    /// The kernel's working directory when it is not the workspace (a confined kernel's own
    /// writable directory, see [`crate::confine`]).
    pub cwd: Option<PathBuf>,
    /// Where `image/png` outputs are written.
    pub images_dir: PathBuf,
    /// How much of an execution's output (text, images) is kept.
    pub output: output::OutputLimits,
    /// The host environment the kernel's base environment is taken from (PATH, identity,
    /// locale, proxy and CA variables; see [`crate::host_env`]).
    pub host: HostEnv,
    /// Variables the caller adds to the kernel's minimal base environment (they win).
    pub env: BTreeMap<String, String>,
    /// Extra directories prepended to `PYTHONPATH` (ipybox's embedded kernel-side Python).
    pub python_path: Vec<PathBuf>,
    /// Wraps the kernel command (e.g. a sandbox): receives the full argv, returns the argv to run.
    pub wrapper: Option<CommandWrapper>,
    /// How long a kernel may take to answer `kernel_info` after launch.
    pub start_timeout: Duration,
    /// Change back to `workspace` after every execution that left it (and say so in the output).
    pub restore_cwd: bool,
    /// Ask the host before shell commands run (`python/ipybox_runtime/shell_guard.py`).
    pub shell_approval: ShellApproval,
    /// How long an interrupted execution may take to stop before the kernel is restarted.
    pub interrupt_grace: Duration,
    /// Local processes, or kernels on a Jupyter server.
    pub backend: Backend,
    /// Fork local kernels from a template process (the kernel factory) rather than launch each
    /// from scratch. Ignored for kernels on a Jupyter server, and off where there is no fork
    /// (not Linux).
    pub factory: bool,
    /// Fork local kernels from a template shared with other executors' pools (instead of one
    /// of this pool's own), each fork carrying this config's kernel environment and, for a
    /// confined executor, what the kernel does to confine itself. `wrapper` is then what a
    /// kernel is launched with when a fork fails.
    pub shared: Option<SharedFork>,
    /// Answers the kernel-side runtime's requests over the stdin channel (remote kernels).
    pub input_handler: Option<InputHandler>,
    /// Records remote kernels until they are deleted.
    pub ledger: Option<Ledger>,
    /// What the session's local kernels are limited by (its cgroup, or resource limits),
    /// applied before any user code runs ([`crate::confine::limits`]).
    pub(crate) limits: Option<crate::confine::limits::KernelLimits>,
}

impl std::fmt::Debug for KernelConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KernelConfig")
            .field("python", &self.python)
            .field("workspace", &self.workspace)
            .field("backend", &self.backend)
            .finish_non_exhaustive()
    }
}

impl KernelConfig {
    /// The kernel's working directory: `cwd`, else the workspace.
    pub(crate) fn cwd(&self) -> &std::path::Path {
        self.cwd.as_deref().unwrap_or(&self.workspace)
    }

    pub(crate) fn new(python: PathBuf, workspace: PathBuf, host: HostEnv) -> Self {
        let images_dir = workspace.join("images");
        Self {
            python,
            workspace,
            images_dir,
            cwd: None,
            output: output::OutputLimits::default(),
            host,
            env: BTreeMap::new(),
            python_path: Vec::new(),
            wrapper: None,
            start_timeout: Duration::from_secs(60),
            restore_cwd: false,
            shell_approval: ShellApproval::Off,
            interrupt_grace: Duration::from_secs(3),
            backend: Backend::Local,
            factory: cfg!(target_os = "linux"),
            shared: None,
            input_handler: None,
            ledger: None,
            limits: None,
        }
    }
}

/// Why an execution did not produce a result.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    /// The code raised an exception.
    #[error("{traceback}")]
    Failed {
        /// Exception type, e.g. `ValueError`.
        ename: String,
        /// Exception message.
        evalue: String,
        /// Traceback text without colour codes.
        traceback: String,
        /// What the code printed before the exception.
        output: String,
    },
    /// The execution ran out of time and was interrupted (or, if it ignored the interrupt, the
    /// kernel was restarted).
    #[error("{}", timeout_message(*.seconds, *.state_kept))]
    Timeout {
        seconds: f64,
        state_kept: bool,
        output: String,
    },
    /// The kernel process exited during (or before) the execution; a fresh kernel replaces it.
    #[error("kernel died ({status}) — restarted, state lost{}", if *.ran { "" } else { "; the code was not run" })]
    Died {
        status: String,
        output: String,
        ran: bool,
    },
    /// A kernel could not be started.
    #[error("kernel failed to start: {reason}\n  help: {help}")]
    Start { reason: String, help: String },
    /// Talking to the kernel failed (a ZMQ or protocol error).
    #[error("kernel communication failed: {0}")]
    Protocol(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The executor was stopped.
    #[error("the code executor is stopped\n  help: call start() before executing code")]
    Stopped,
    /// The kernel an executor was to attach to no longer exists on its Jupyter server (or lost
    /// ipybox's runtime when the server restarted it).
    #[error("{what}")]
    Gone { what: String },
}

fn timeout_message(seconds: f64, state_kept: bool) -> String {
    if state_kept {
        format!("execution timed out after {seconds} s and was interrupted; kernel state was kept")
    } else {
        format!(
            "execution timed out after {seconds} s and did not stop when interrupted — kernel restarted, state lost"
        )
    }
}

/// A protocol error (ZMQ, WebSocket, serialization).
pub(crate) fn proto(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> KernelError {
    KernelError::Protocol(e.into())
}

/// The variables every kernel gets, local or remote (remote kernels set them in their bootstrap
/// cell): unbuffered UTF-8 output, inline matplotlib images, no colours.
pub(crate) fn fixed_env() -> [(&'static str, &'static str); 7] {
    [
        ("PYTHONUNBUFFERED", "1"),
        ("PYTHONIOENCODING", "utf-8"),
        ("JUPYTER_PLATFORM_DIRS", "1"),
        ("PYDEVD_DISABLE_FILE_VALIDATION", "1"),
        ("MPLBACKEND", "module://matplotlib_inline.backend_inline"),
        ("NO_COLOR", "1"),
        ("TERM", "dumb"),
    ]
}

impl KernelError {
    /// What the code printed before it failed (empty for start/protocol errors).
    pub fn output(&self) -> &str {
        match self {
            KernelError::Failed { output, .. }
            | KernelError::Timeout { output, .. }
            | KernelError::Died { output, .. } => output,
            _ => "",
        }
    }
}
