//! `CodeExecutorBuilder`: everything an executor is configured with, and `build()`. Setting an
//! option does nothing else; the options are read when the executor starts (`start`), runs
//! (`run`) or installs (`install`). Not here: checking that options go together (that happens
//! at `start()`, where the failure can say what to do).

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Mutex;

use super::{CodeExecutor, Inner};
use crate::confine::Confinement;
use crate::host_env::HostEnv;
use crate::kernel::SharedKernelFactory;
use crate::notebook::{Notebook, NotebookConfig};
use crate::pyenv::Progress;
use crate::sandbox::SandboxOptions;
use crate::tools::SharedMcpServers;
// Named in doc links only.
#[cfg(doc)]
use {
    super::{DEFAULT_SPARE_KERNELS, ExecutionResult},
    crate::kernel::KernelError,
    crate::tools::ApprovalRequest,
};

/// Configures a [`CodeExecutor`].
#[derive(Debug, Clone, Default)]
pub struct CodeExecutorBuilder {
    pub(super) workspace: Option<PathBuf>,
    pub(super) images_dir: Option<PathBuf>,
    pub(super) kernel_env: BTreeMap<String, String>,
    pub(super) python: Option<PathBuf>,
    pub(super) spare_kernels: Option<usize>,
    pub(super) tool_env: Option<HashMap<String, String>>,
    pub(super) approval_timeout: Option<Duration>,
    pub(super) approval_text_limit: Option<usize>,
    pub(super) connect_timeout: Option<Duration>,
    pub(super) kernel_start_timeout: Option<Duration>,
    pub(super) restore_working_dir: bool,
    pub(super) approve_shell_cmds: bool,
    pub(super) require_shell_escape: bool,
    pub(super) sandbox: Option<SandboxOptions>,
    pub(super) allow_install_urls: bool,
    pub(super) confinement: Option<Confinement>,
    pub(super) kernel_gateway: Option<GatewayUrl>,
    pub(super) attach_kernel: Option<String>,
    pub(super) kernel_factory: Option<bool>,
    pub(super) shared_kernel_factory: Option<SharedKernelFactory>,
    pub(super) shared_mcp_servers: Option<SharedMcpServers>,
    pub(super) host_env: Option<HostEnv>,
    pub(super) progress: Option<ProgressSink>,
    pub(super) output: crate::kernel::OutputLimits,
    pub(super) notebook: Option<NotebookConfig>,
    pub(super) session_tag: Option<String>,
}

/// A kernel gateway URL as given, with a `Debug` that leaves out its query (it may hold a token).
#[derive(Clone)]
pub(super) struct GatewayUrl(pub(super) String);

impl std::fmt::Debug for GatewayUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&crate::kernel::gateway::redact_query(&self.0))
    }
}

/// The provisioning progress callback, with a `Debug` that does not try to print a closure.
#[derive(Clone)]
pub(super) struct ProgressSink(pub(super) Progress);

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
    /// each idle spare costs ~15 MB (PSS). With the factory, spares start at the first reset or
    /// restart (which forks its kernel, ~0.1 s): an executor that never resets keeps none.
    /// Without the factory a replacement takes ~0.2–0.4 s and ~35 MB, spares start with the
    /// first kernel, and `n` spares cover `n` resets in a row.
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

    /// Lets a sandboxed kernel's `install_package` name a remote URL (`name @ https://…`,
    /// `name @ git+https://…`; its host becomes reachable for that install). Off by default: a
    /// sandboxed kernel installs from the package index only. Local paths and `file:` URLs stay
    /// refused whatever this says. Unsandboxed kernels install URLs without it.
    pub fn allow_install_urls(mut self, allow: bool) -> Self {
        self.allow_install_urls = allow;
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

    /// The name of this executor's session in logs (e.g. the egress proxy's refusals); default:
    /// its runtime directory's name.
    pub fn session_tag(mut self, tag: impl Into<String>) -> Self {
        self.session_tag = Some(tag.into());
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
