//! [bin] The MCP server's flags (stdio, and each session of `serve --http`), and the flag
//! groups `exec` and `replay` share with it. Sizes and durations: [`super::units`].

use std::path::PathBuf;

use super::super::mcp_server;
use super::headings::{HIBERNATION, NOTEBOOKS, SERVER};
use super::units::{OrOff, Secs, Size};

/// Without a subcommand ipybox serves MCP on stdio (what Claude Code and other clients start).
#[derive(clap::Args, Debug)]
pub(crate) struct ServeArgs {
    /// The kernel's working directory: `mcptools/` is generated there, `.env` read from there
    /// (created if missing).
    #[arg(long, default_value = ".", help_heading = SERVER)]
    pub workspace: PathBuf,
    /// Run each kernel in Anthropic's sandbox-runtime `srt` (docs/sandbox.md).
    #[arg(long, help_heading = SERVER)]
    pub sandbox: bool,
    /// srt settings file for --sandbox (relative to the workspace; missing: the default
    /// policy).
    #[arg(long, value_name = "FILE", requires = "sandbox", help_heading = SERVER)]
    pub sandbox_config: Option<PathBuf>,
    /// Under --sandbox, let install_package take https:// and git+https:// URLs (`name @ URL`),
    /// not only index names.
    #[arg(long, requires = "sandbox", help_heading = SERVER)]
    pub allow_install_urls: bool,
    /// Python with ipykernel and pydantic [default: the managed environment].
    #[arg(long, value_name = "PATH", env = "IPYBOX_PYTHON", help_heading = SERVER)]
    pub python: Option<PathBuf>,
    /// Ready kernels kept for `reset` (0: each reset waits for a new kernel) [default: 1; 0
    /// with --http, see --warm-sessions].
    #[arg(long, value_name = "N", help_heading = SERVER)]
    pub spare_kernels: Option<usize>,
    /// Start each kernel as a fresh process, not forked from the kernel factory (same as
    /// IPYBOX_KERNEL_FACTORY=0).
    #[arg(long, help_heading = SERVER)]
    pub no_kernel_factory: bool,
    /// Who approves the tool calls (and, with --approve-shell, shell commands) of executed
    /// code: `auto` accepts all; `ask` asks the user through the MCP client.
    #[arg(long, value_enum, default_value_t = mcp_server::ApproveMode::Auto, hide_possible_values = true, help_heading = SERVER)]
    pub approve: mcp_server::ApproveMode,
    /// With --approve ask: how long a call waits for the answer before ApprovalTimeout
    /// (duration, or `off`: no limit).
    #[arg(long, value_name = "DURATION|off", default_value = "2m", help_heading = SERVER)]
    pub approval_timeout: OrOff<Secs>,
    /// For clients with MCP tasks: a cell still running after this long becomes a task the
    /// client polls (duration: 0 makes every cell a task; `off`: none).
    #[arg(long, value_name = "DURATION|off", default_value = "5s", help_heading = SERVER)]
    pub task_after: OrOff<Secs>,
    /// How long a task lives past its cell's timeout (a finished task's result is kept this
    /// long).
    #[arg(long, value_name = "DURATION", default_value = "5m", help_heading = SERVER)]
    pub task_ttl: Secs,
    /// Save an idle session this long after its last call (duration, or `off`) [default: off
    /// on stdio, 1m with --http]. On stdio the first result then names the session's handle.
    #[arg(long, value_name = "DURATION|off", help_heading = HIBERNATION)]
    pub checkpoint_after: Option<OrOff<Secs>>,
    /// The most of a cell's text output ipybox holds: the first and last half are kept, the
    /// middle cut (size, at least 1K).
    #[arg(long, value_name = "SIZE", default_value = "1M", help_heading = SERVER)]
    pub max_output_bytes: Size,
    /// Images a cell may return (and save under images/); more are dropped, and said.
    #[arg(long, value_name = "N", default_value_t = ipybox::kernel::DEFAULT_MAX_IMAGES, help_heading = SERVER)]
    pub max_images: usize,
    /// The images (PNG) a cell may return, all together (size); one that would go over is
    /// dropped, and said.
    #[arg(long, value_name = "SIZE", default_value_t = Size(ipybox::kernel::DEFAULT_MAX_IMAGE_BYTES as u64), help_heading = SERVER)]
    pub max_image_bytes: Size,
    #[command(flatten)]
    pub shell: ShellArgs,
    #[command(flatten)]
    pub gateway: GatewayArgs,
    #[command(flatten)]
    pub notebook: NotebookArgs,
}

/// The session notebooks of the MCP server (docs/notebook.md).
#[derive(clap::Args, Debug, Clone)]
pub(crate) struct NotebookArgs {
    /// Where each session's notebook (cells, outputs, approvals) is written [default: the
    /// workspace's `notebooks/` on stdio; `$IPYBOX_HOME/notebooks` with --http, where relative
    /// paths are taken from $IPYBOX_HOME].
    #[arg(long, value_name = "DIR", conflicts_with = "no_notebook", help_heading = NOTEBOOKS)]
    pub notebook_dir: Option<PathBuf>,
    /// Record no session notebooks.
    #[arg(long, help_heading = NOTEBOOKS)]
    pub no_notebook: bool,
    /// Put no `.gitignore` (`*`) into the workspace's notebook directory (one keeps notebooks
    /// out of commits).
    #[arg(long, conflicts_with = "no_notebook", help_heading = NOTEBOOKS)]
    pub no_notebook_gitignore: bool,
}

/// Where kernels run, for the MCP server and `ipybox exec`.
#[derive(clap::Args, Debug, Clone)]
pub(crate) struct GatewayArgs {
    /// Run kernels on a Jupyter server:
    /// http[s]://HOST:PORT[/BASE][?token=${VAR}&kernel=NAME] (token default:
    /// $IPYBOX_GATEWAY_TOKEN).
    #[arg(
        long,
        value_name = "URL",
        env = "IPYBOX_KERNEL_GATEWAY",
        hide_env_values = true,
        help_heading = SERVER
    )]
    pub kernel_gateway: Option<String>,
}

impl GatewayArgs {
    /// Adds the gateway, else the local interpreter (`python`).
    pub(crate) fn apply(
        self,
        builder: ipybox::executor::CodeExecutorBuilder,
        python: Option<PathBuf>,
    ) -> ipybox::executor::CodeExecutorBuilder {
        match (self.kernel_gateway, python) {
            (Some(url), _) => builder.kernel_gateway(url),
            (None, Some(python)) => builder.python(python),
            (None, None) => builder,
        }
    }
}

/// Shell-command approval, for the MCP server and `ipybox exec`.
#[derive(clap::Args, Debug, Clone, Copy)]
pub(crate) struct ShellArgs {
    /// Shell commands (`!cmd`, `%sx`, `%pip`, `%%bash`, ...) are asked about like tool calls
    /// before they run.
    #[arg(long, help_heading = SERVER)]
    pub approve_shell: bool,
    /// With --approve-shell: block subprocess, os.system, os.exec* (a guard against accidents,
    /// not a sandbox).
    #[arg(long, requires = "approve_shell", help_heading = SERVER)]
    pub require_shell_escape: bool,
}

impl ShellArgs {
    pub(crate) fn apply(
        self,
        builder: ipybox::executor::CodeExecutorBuilder,
    ) -> ipybox::executor::CodeExecutorBuilder {
        builder
            .approve_shell_cmds(self.approve_shell)
            .require_shell_escape(self.require_shell_escape)
    }
}
