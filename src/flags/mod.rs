//! [bin] The command line's types (clap): the top level, the subcommands, and the flag groups
//! of `--help`. Parsing only: what the flags configure is built in `serve` (the MCP server and
//! the HTTP service) and `commands` (the other subcommands).

mod http_args;
mod reorder;
mod serve_args;
pub(crate) mod units;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

pub(crate) use http_args::HttpArgs;
pub(crate) use reorder::flags_before_subcommand;
pub(crate) use serve_args::{GatewayArgs, ServeArgs, ShellArgs};
use units::Secs;

/// The groups of `ipybox serve --help` (docs/mcp-server.md lists the flags by group too).
pub(crate) mod headings {
    /// The MCP server's own flags: every session's, on stdio and over HTTP.
    pub(crate) const SERVER: &str = "Stdio server (and each --http session)";
    pub(crate) const HTTP: &str = "HTTP service (--http)";
    pub(crate) const CONFINEMENT: &str = "Confinement and limits (--http)";
    pub(crate) const HIBERNATION: &str = "Hibernation";
    pub(crate) const NOTEBOOKS: &str = "Notebooks";
}

#[derive(Parser, Debug)]
#[command(
    name = "ipybox",
    version,
    about = "Code-execution sandbox for agents that act by writing Python",
    after_help = "Without a subcommand ipybox is an MCP server on stdio: an MCP client (Claude Code, ...) starts it and talks to it over stdin/stdout. To try code by hand: `ipybox exec -c 'print(1)'`."
)]
pub(crate) struct Cli {
    /// Log level on stderr: error, warn, info, debug, trace [default: info for the server, warn
    /// for subcommands]; IPYBOX_LOG (an env-filter directive) overrides.
    #[arg(long, global = true, value_name = "LEVEL")]
    pub log_level: Option<String>,
    /// Let the log carry what clients and kernels send (rmcp's debug records of MCP messages);
    /// for debugging a protocol exchange only.
    #[arg(long, global = true)]
    pub log_content: bool,
    /// The MCP server's flags. Given before a subcommand, a flag is that subcommand's
    /// (`ipybox --sandbox exec` is `ipybox exec --sandbox`), or an error when it has none.
    #[command(flatten)]
    pub serve: ServeArgs,
    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Subcommand, Debug)]
pub(crate) enum Command {
    /// Serve MCP: on stdio (the default, also without a subcommand), or with --http over
    /// Streamable HTTP with a kernel per agent session (see docs/http.md).
    Serve {
        #[command(flatten)]
        serve: Box<ServeArgs>,
        #[command(flatten)]
        http: Box<HttpArgs>,
    },
    /// Run Python code in a fresh kernel and print its output.
    ///
    /// Exits 1 with the traceback on stderr when the code fails.
    #[command(override_usage = "ipybox exec [OPTIONS] <-c CODE | FILE | ->")]
    Exec {
        /// Kernel working directory: must exist; its `.env` is read as the server reads it.
        #[arg(long, default_value = ".")]
        workspace: PathBuf,
        /// Python with ipykernel and pydantic [default: the managed environment].
        #[arg(long, value_name = "PATH", env = "IPYBOX_PYTHON")]
        python: Option<PathBuf>,
        /// Interrupt the code after this long (duration: 500ms, 30s, 10m).
        #[arg(long, value_name = "DURATION")]
        timeout: Option<Secs>,
        /// Approve every MCP tool call without asking (otherwise each call is asked on the
        /// terminal; without a terminal calls are rejected).
        #[arg(long, short = 'y')]
        yes: bool,
        /// Run the kernel in a sandbox (Anthropic's sandbox-runtime `srt`), as `ipybox serve
        /// --sandbox` does: it writes only the workspace, reaches no network (docs/sandbox.md).
        #[arg(long)]
        sandbox: bool,
        /// srt settings file for --sandbox (relative paths are taken from the workspace; a
        /// missing file means the default policy).
        #[arg(long, requires = "sandbox")]
        sandbox_config: Option<PathBuf>,
        #[command(flatten)]
        shell: ShellArgs,
        #[command(flatten)]
        gateway: GatewayArgs,
        /// Code to run.
        #[arg(short = 'c', long = "code", conflicts_with = "file")]
        code: Option<String>,
        /// File with code to run, or `-` for stdin.
        file: Option<PathBuf>,
    },
    /// Run a recorded session notebook's code cells again in a fresh kernel and say which
    /// outputs differ from the recording.
    ///
    /// Cells run in order with their recorded timeouts, outputs printed as `ipybox exec` prints
    /// them; the kernel is reset where the recording was (a reset, a replaced kernel). Tool calls
    /// and shell commands are asked about on the terminal (--yes accepts all). Run it in the
    /// session's workspace: cells import its `mcptools/` and call its registered servers.
    ///
    /// A session recorded in a sandbox replays in the sandbox, under the recorded policy
    /// (--unsandboxed runs it on the host). A notebook whose code cells differ from the host's
    /// record of what ran is refused before anything runs; one without a host record replays in
    /// the sandbox under the default policy (or --sandbox-config), whatever its metadata says
    /// (docs/notebook.md).
    Replay {
        /// Notebooks to replay, in order (a long session goes on in `NAME-2.ipynb`, ...).
        #[arg(required = true, value_name = "NOTEBOOK")]
        notebooks: Vec<PathBuf>,
        /// Kernel working directory: must exist; its `.env` is read as the server reads it.
        #[arg(long, default_value = ".")]
        workspace: PathBuf,
        /// Python with ipykernel and pydantic [default: the managed environment].
        #[arg(long, value_name = "PATH", env = "IPYBOX_PYTHON")]
        python: Option<PathBuf>,
        /// Give each cell this long (duration) [default: the timeout it was recorded with, else
        /// none].
        #[arg(long, value_name = "DURATION")]
        timeout: Option<Secs>,
        /// Approve every MCP tool call (and shell command) without asking.
        #[arg(long, short = 'y')]
        yes: bool,
        /// Exit with status 1 when a cell's output differs from the recording.
        #[arg(long)]
        check: bool,
        /// Replay in the sandbox even when the session was recorded without one (under the
        /// recorded policy, else the default one).
        #[arg(long, conflicts_with = "unsandboxed")]
        sandbox: bool,
        /// Replay in the sandbox under this srt settings file instead of the recorded policy
        /// (relative paths are taken from the workspace).
        #[arg(long, conflicts_with = "unsandboxed")]
        sandbox_config: Option<PathBuf>,
        /// Replay a session recorded in a sandbox (or in the HTTP service's confinement, or on a
        /// Jupyter server), or a notebook without a host record, on this host, unconfined: its
        /// cells run as you. Only for a notebook whose every cell you trust.
        #[arg(long)]
        unsandboxed: bool,
        #[command(flatten)]
        shell: ShellArgs,
        #[command(flatten)]
        gateway: GatewayArgs,
    },
    /// Generate the typed Python package for an MCP server's tools (`<root>/<name>/`).
    ///
    /// Each tool becomes a module with `Params`, `Result` (given an output schema) and
    /// `run(params)`; with --async, `run` is an `async def` to await in the kernel (several at
    /// once with `asyncio.gather`).
    Apigen {
        /// Server name: a Python identifier, becomes the package `mcptools.<name>`.
        name: String,
        /// Server params as JSON: `{"command", "args", "env", "cwd"}` or `{"url", "headers"}`;
        /// `${VAR}` is taken from the environment or `.env` of --workspace.
        #[arg(long)]
        params: String,
        /// Where `${VAR}` in --params is looked up besides the environment: this directory's
        /// `.env`.
        #[arg(long, default_value = ".")]
        workspace: PathBuf,
        /// Directory of the generated packages.
        #[arg(long, default_value = "mcptools")]
        root: PathBuf,
        /// Generate `async def run(params)` (call with `await run(...)`; many calls can be in
        /// flight at once, e.g. `await asyncio.gather(...)`) instead of a blocking `def run`.
        #[arg(long = "async")]
        async_api: bool,
    },
    /// Create (or check) the kernel's Python environment and print where it is.
    Setup {
        /// Check this interpreter instead of the managed environment.
        #[arg(long, env = "IPYBOX_PYTHON")]
        python: Option<PathBuf>,
    },
    /// Accept code a sandboxed kernel wrote in the workspace (saved code actions in gentools/,
    /// output parsers in mcpparse/, any module), so that unsandboxed kernels import it.
    ///
    /// Shows each file under the paths that unsandboxed kernels refuse (written while a
    /// sandboxed kernel could write there) whole, then asks. Accepted is the content as shown:
    /// a later change is refused again (docs/sandbox.md).
    Trust {
        /// Files or directories (searched whole) in the workspace.
        #[arg(required = true, value_name = "PATH")]
        paths: Vec<PathBuf>,
        /// Accept without asking.
        #[arg(long, short = 'y', conflicts_with = "list")]
        yes: bool,
        /// Only list what unsandboxed kernels refuse; accept nothing.
        #[arg(long)]
        list: bool,
    },
}
