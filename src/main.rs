//! The `ipybox` binary: the MCP server (default, on stdio) and human-facing subcommands.
//!
//! stdout carries program output only (for the MCP server: the protocol); logs go to stderr.

use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

mod dotenv;
mod http;
mod logging;
mod mcp_server;
mod metrics;
mod own_secrets;
mod replay;
mod terminal_approval;
mod trust_command;

use anyhow::Context;
use clap::{Parser, Subcommand};
use ipybox::CodeExecutor;
use ipybox::apigen::ApiStyle;
use ipybox::executor::ExecutorError;
use ipybox::host_env::HostEnv;
use ipybox::pyenv::{Progress, PyEnvError};
use std::sync::Arc;

#[derive(Parser, Debug)]
#[command(
    name = "ipybox",
    version,
    about = "Code-execution sandbox for agents that act by writing Python"
)]
struct Cli {
    /// Log level for stderr logs (error, warn, info, debug, trace; default: info for the MCP
    /// server, warn for subcommands); IPYBOX_LOG (an env-filter directive) overrides.
    #[arg(long, global = true)]
    log_level: Option<String>,
    /// Let the log carry what clients and kernels send (MCP messages: code, output, session
    /// handles), from other crates' debug records (rmcp's). Off by default, whatever
    /// --log-level or IPYBOX_LOG say; for debugging a protocol exchange only.
    #[arg(long, global = true)]
    log_content: bool,
    /// The MCP server's flags. Given before a subcommand, a flag is that subcommand's
    /// (`ipybox --sandbox exec` is `ipybox exec --sandbox`), or an error when it has none.
    #[command(
        flatten,
        next_help_heading = "MCP server options (also `ipybox serve`'s; before another subcommand: that subcommand's)"
    )]
    serve: ServeArgs,
    #[command(subcommand)]
    command: Option<Command>,
}

/// Without a subcommand ipybox serves MCP on stdio (what Claude Code and other clients start).
#[derive(clap::Args, Debug)]
struct ServeArgs {
    /// Workspace: the kernel's working directory, where `mcptools/` is generated and `.env` is
    /// read (created if missing).
    #[arg(long, default_value = ".")]
    workspace: PathBuf,
    /// Run the kernel in a sandbox (Anthropic's sandbox-runtime `srt`).
    #[arg(long)]
    sandbox: bool,
    /// srt settings file for --sandbox (relative paths are taken from the workspace; a missing
    /// file means the default policy).
    #[arg(long, requires = "sandbox")]
    sandbox_config: Option<PathBuf>,
    /// Let install_package under --sandbox install from https:// and git+https:// URLs
    /// (`name @ URL`; default: from the package index only). Local paths and file: URLs stay
    /// refused.
    #[arg(long, requires = "sandbox")]
    allow_install_urls: bool,
    /// Python interpreter with ipykernel and pydantic (default: the managed environment).
    #[arg(long, env = "IPYBOX_PYTHON")]
    python: Option<PathBuf>,
    /// Ready kernels kept for `reset`: a reset swaps one in (~20 ms) and forks a replacement
    /// from the kernel factory (~30 ms; a fresh launch without the factory: ~0.4 s); 0 makes
    /// every reset wait for a new kernel. With the factory they are kept from the first reset on
    /// (that one forks its kernel): a session that never resets keeps no idle kernel. Default 1;
    /// with --http 0 (per session: new sessions take warm kernels instead, --warm-sessions).
    #[arg(long, value_name = "N")]
    spare_kernels: Option<usize>,
    /// Start every kernel as a fresh Python process instead of forking it from the kernel
    /// factory's template (for debugging; same as IPYBOX_KERNEL_FACTORY=0).
    #[arg(long)]
    no_kernel_factory: bool,
    /// Who approves the tool calls (and, with --approve-shell, shell commands) of executed code:
    /// `auto` accepts them all; `ask` asks the user through the MCP client (elicitation), once
    /// per call or for the rest of the session.
    #[arg(long, value_enum, default_value_t = mcp_server::ApproveMode::Auto)]
    approve: mcp_server::ApproveMode,
    /// With --approve ask: how long a call waits for the user's answer before it fails with
    /// ApprovalTimeout (seconds; 0 waits without limit).
    #[arg(long, value_name = "SECS", default_value_t = 120.0)]
    approval_timeout: f64,
    /// For MCP clients with the tasks extension: a cell still running after this long becomes a
    /// task the client polls (seconds; 0: every cell; "off": never).
    #[arg(long, value_name = "SECS", default_value = "5")]
    task_after: String,
    /// How long a task lives beyond its cell's timeout; a finished task's result is kept this
    /// long after its cell ended, and no longer, whatever timeout the client asked for
    /// (seconds).
    #[arg(long, value_name = "SECS", default_value_t = 300.0)]
    task_ttl: f64,
    /// A session is saved (host-only, and kept open) once it has been idle this long after
    /// being used (seconds, or `off`). Over stdio (default off: each result is exactly the
    /// cell's output, as the Python ipybox returns it): with SECS the first result also names
    /// the session's handle, and a resumed conversation that passes it as `session` gets its
    /// variables back (the codeact plugins pass `--checkpoint-after 3`). With --http (default
    /// 60): what a crash of ipybox loses is bounded by it.
    #[arg(long, value_name = "SECS|off")]
    checkpoint_after: Option<String>,
    /// The most of a cell's text output ipybox holds, whatever the client asks: the first and
    /// the last half are kept, the middle replaced by a line saying how much was cut; applied
    /// while the cell runs (bytes). A request holds no more than its max_output_chars needs.
    #[arg(long, value_name = "BYTES", default_value_t = 1024 * 1024)]
    max_output_bytes: usize,
    /// Images a cell may return (and save under images/); more are dropped, and the result
    /// says how many.
    #[arg(long, value_name = "N", default_value_t = ipybox::kernel::DEFAULT_MAX_IMAGES)]
    max_images: usize,
    /// Bytes of images (PNG) a cell may return, all together; an image that would go over is
    /// dropped, and the result says so.
    #[arg(long, value_name = "BYTES", default_value_t = ipybox::kernel::DEFAULT_MAX_IMAGE_BYTES)]
    max_image_bytes: usize,
    #[command(flatten)]
    shell: ShellArgs,
    #[command(flatten)]
    gateway: GatewayArgs,
    #[command(flatten)]
    notebook: NotebookArgs,
}

/// The session notebooks of the MCP server (docs/notebook.md).
#[derive(clap::Args, Debug, Clone)]
struct NotebookArgs {
    /// Where each session's notebook (every cell run, its outputs and approvals) is written,
    /// rewritten after each cell: default `notebooks/` of the workspace on stdio (relative
    /// paths are taken from the workspace); with --http a host directory, default
    /// `$IPYBOX_HOME/notebooks`, relative paths taken from `$IPYBOX_HOME` (files 0600 in a 0700
    /// directory, never the shared workspace).
    #[arg(long, value_name = "DIR", conflicts_with = "no_notebook")]
    notebook_dir: Option<PathBuf>,
    /// Record no session notebooks.
    #[arg(long)]
    no_notebook: bool,
    /// Do not put a `.gitignore` (holding `*`) into the workspace's notebook directory. By
    /// default one is made there where none is, so that notebooks (what cells printed) are not
    /// committed by accident.
    #[arg(long, conflicts_with = "no_notebook")]
    no_notebook_gitignore: bool,
}

/// Where kernels run, for the MCP server and `ipybox exec`.
#[derive(clap::Args, Debug, Clone)]
struct GatewayArgs {
    /// Run kernels on a Jupyter server (Kernel Gateway, Enterprise Gateway or Jupyter Server):
    /// http[s]://HOST:PORT[/BASE][?token=${VAR}&kernel=NAME]. The token defaults to
    /// $IPYBOX_GATEWAY_TOKEN. Tool calls travel over the kernel's Jupyter connection.
    #[arg(
        long,
        value_name = "URL",
        env = "IPYBOX_KERNEL_GATEWAY",
        hide_env_values = true
    )]
    kernel_gateway: Option<String>,
}

impl GatewayArgs {
    /// Adds the gateway, else the local interpreter (`python`).
    fn apply(
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
struct ShellArgs {
    /// Shell commands need approval too: every `!cmd`, `!!cmd`, `%sx`, `%pip` and `%%bash` /
    /// `%%sh` / `%%script` cell is asked about like a tool call (server `ipybox`, tool `shell` or
    /// `shell_magic`) before it runs.
    #[arg(long)]
    approve_shell: bool,
    /// With --approve-shell: block direct process creation from Python (subprocess, os.system,
    /// os.exec*, ...), so commands can only run as approved `!cmd`. A guard against accidents,
    /// not a sandbox (that is --sandbox).
    #[arg(long, requires = "approve_shell")]
    require_shell_escape: bool,
}

impl ShellArgs {
    fn apply(
        self,
        builder: ipybox::executor::CodeExecutorBuilder,
    ) -> ipybox::executor::CodeExecutorBuilder {
        builder
            .approve_shell_cmds(self.approve_shell)
            .require_shell_escape(self.require_shell_escape)
    }
}

impl std::fmt::Debug for HttpArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpArgs")
            .field("http", &self.http)
            .field("token", &format_args!("<{} redacted>", self.token.len()))
            .field("token_file", &self.token_file)
            .finish_non_exhaustive()
    }
}

/// `ipybox serve --http`: MCP over Streamable HTTP, a kernel per agent session. (Its `Debug`
/// shows no token.)
#[derive(clap::Args)]
struct HttpArgs {
    /// Serve MCP over Streamable HTTP at http://HOST:PORT/mcp instead of stdio (e.g.
    /// 127.0.0.1:8000; binding anything but loopback needs a bearer token).
    #[arg(long, value_name = "HOST:PORT")]
    http: Option<String>,
    /// A bearer token clients must send (`Authorization: Bearer TOKEN`); repeatable. Prefer
    /// --token-file or IPYBOX_TOKEN: a command line is visible to other local users.
    #[arg(long, value_name = "TOKEN", requires = "http")]
    token: Vec<String>,
    /// A file of bearer tokens, one per line (`#` comments); repeatable. Each token is a
    /// credential of its own: sessions belong to the token that made them.
    #[arg(long, value_name = "FILE", requires = "http")]
    token_file: Vec<PathBuf>,
    /// A `Host` header value to accept (e.g. ipybox.example.com); repeatable. Default: the
    /// loopback names when bound to loopback, any host otherwise.
    #[arg(long, value_name = "HOST", requires = "http")]
    allowed_host: Vec<String>,
    /// A browser origin to accept (e.g. https://app.example.com:443); repeatable. A request
    /// with another `Origin` header is refused (403); requests without one are not affected.
    #[arg(long, value_name = "ORIGIN", requires = "http")]
    allowed_origin: Vec<String>,
    /// The largest request body accepted (bytes; larger: 413).
    #[arg(long, value_name = "BYTES", default_value_t = 4 * 1024 * 1024, requires = "http")]
    max_body_bytes: usize,
    /// A session with no call for this long is gone: its kernel stopped, or, hibernated, its
    /// saved state deleted (seconds). Default: 604800 (7 days) with hibernation, 1800 with
    /// --hibernate-after off.
    #[arg(long, value_name = "SECS", requires = "http")]
    idle_timeout: Option<f64>,
    /// A session with no call for this long is hibernated: its state saved to disk and its
    /// kernel stopped; its next call restores it (seconds, or `off`). Local kernels only.
    #[arg(
        long,
        value_name = "SECS|off",
        default_value = "600",
        requires = "http"
    )]
    hibernate_after: String,
    /// `--checkpoint-after` (a flag of the server, shared with stdio: set from it, default 60).
    #[arg(skip)]
    checkpoint_after: String,
    /// The disk a token's saved sessions may take (bytes, or `off`); past it, its least
    /// recently used hibernated sessions are deleted.
    #[arg(
        long,
        value_name = "BYTES|off",
        default_value = "4294967296",
        requires = "http"
    )]
    snapshot_quota: String,
    /// The disk a token's session notebooks may take, open and closed sessions' alike
    /// (bytes, `64M`-style with K/M/G, or `off`); past it, the token's least recently written
    /// notebooks are removed first, and a session whose notebook is removed, or alone does not
    /// fit, is no longer recorded (told once).
    #[arg(
        long,
        value_name = "BYTES|off",
        default_value = http::notebook_quota::DEFAULT_QUOTA,
        requires = "http"
    )]
    notebook_quota: String,
    /// Where saved sessions (snapshots, their records, the snapshot key) live instead of
    /// ipybox's data directory: storage the replicas share, so that a replica restores the
    /// hibernated sessions of a replica that died. Kernels never see it.
    #[arg(long, value_name = "DIR", requires = "http")]
    snapshot_dir: Option<PathBuf>,
    /// At most this many kernel sessions at once; one more is refused (nothing is evicted).
    #[arg(long, value_name = "N", default_value_t = 32, requires = "http")]
    max_sessions: usize,
    /// At most this many kernel sessions at once per token (tenant); `auto`: --max-sessions
    /// shared out evenly when there are several tokens (rounded up), no own limit with one;
    /// `off`: none.
    #[arg(
        long,
        value_name = "N|auto|off",
        default_value = "auto",
        requires = "http"
    )]
    max_sessions_per_token: String,
    /// Memory all confined sessions may use together: each session's --session-memory is
    /// reserved in full when it opens, and a session that would not fit is refused (no
    /// overcommit: docs/http.md); the service's cgroup is bounded by it too. Bytes or 16G;
    /// `auto`: 90% of this machine's memory; `off`: not bounded.
    #[arg(
        long,
        value_name = "BYTES|auto|off",
        default_value = "auto",
        requires = "http"
    )]
    service_memory: String,
    /// At most this many calls in progress per session; more are refused at once.
    #[arg(long, value_name = "N", default_value_t = 4, requires = "http")]
    max_concurrent_calls: usize,
    /// Kernels started ahead for new sessions (a new session's first cell does not wait for a
    /// kernel to start).
    #[arg(long, value_name = "N", default_value_t = 1, requires = "http")]
    warm_sessions: usize,
    /// This replica's name in session handles (a load balancer's routing key for local
    /// kernels); default: the host name.
    #[arg(long, value_name = "NAME", requires = "http")]
    replica_id: Option<String>,
    /// Declare the `session` argument as a header parameter (SEP-2243 `x-mcp-header`):
    /// 2026-07-28 clients then also send the handle as `Mcp-Param-Session`, which a load
    /// balancer can route on. Clients must list the tools before calling them (rmcp refuses a
    /// call whose header is missing).
    #[arg(long, requires = "http")]
    session_header: bool,
    /// A file with the key of session handles; replicas behind one load balancer share it
    /// (IPYBOX_SESSION_SECRET also works). Default: a key kept in
    /// $IPYBOX_HOME/keys/session.key, so handles outlive a restart.
    #[arg(long, value_name = "FILE", requires = "http")]
    session_secret_file: Option<PathBuf>,
    /// Let clients call install_package (it changes the kernel environment every session
    /// shares).
    #[arg(long, requires = "http")]
    allow_install: bool,
    /// Let clients call register_mcp_server: it makes this host start the MCP servers they
    /// name (commands run as ipybox's user, outside any sandbox). Without it, the operator
    /// registers the workspace's servers (`ipybox apigen NAME --params ... --root WS/mcptools`).
    #[arg(long, requires = "http")]
    allow_register: bool,
    /// Let several tokens (tenants) share local kernels that do not keep them apart
    /// (--unconfined-sessions, --sandbox, --session-uids none, --session-network host), and
    /// share MCP server processes between their sessions. Not needed with --kernel-gateway, nor
    /// with fully confined sessions (the default as root: a uid and a network per session).
    #[arg(long, requires = "http")]
    trust_tenants: bool,
    /// Run local kernels unconfined: every session's code runs as ipybox's user and can reach
    /// every other session (its kernel, files and tool socket), ipybox's own processes and
    /// files, and whatever that user can. Default: each session's kernel runs in a bubblewrap of
    /// its own (docs/http.md). Not needed with --kernel-gateway; --sandbox confines its own way.
    #[arg(long, requires = "http")]
    unconfined_sessions: bool,
    /// Processes and threads each confined session may have at once (its cgroup's pids.max; a
    /// kernel has about 10 threads); 0: no limit. A fork past it fails with EAGAIN and the
    /// cell's result says so. Not applied with --unconfined-sessions.
    #[arg(long, requires = "http", value_name = "N", default_value_t = ipybox::confine::limits::DEFAULT_MAX_PROCS)]
    session_max_procs: u64,
    /// Memory each confined session may use (its cgroup's memory limit, no swap; its work
    /// directory's files count): bytes or 512M, 2G; 0: no limit. Past it the kernel is killed
    /// and restarted and the cell's result says so. Not applied with --unconfined-sessions.
    #[arg(long, requires = "http", value_name = "BYTES", default_value = "2G", value_parser = parse_size)]
    session_memory: u64,
    /// CPU each confined session may use, in cores (its cgroup's CPU quota: 0.5, 1, 2); 0 or
    /// none: no limit. Not applied with --unconfined-sessions.
    #[arg(long, requires = "http", value_name = "CORES", default_value = "none", value_parser = parse_cpus)]
    session_cpus: f64,
    /// Size of each confined session's work directory (as root: a tmpfs of this size, in
    /// memory, counted in --session-memory): bytes or 512M, 1G; 0: no limit. A write past it
    /// fails with ENOSPC and the cell's result says so. Not root: not bounded.
    #[arg(long, requires = "http", value_name = "BYTES", default_value = "1G", value_parser = parse_size)]
    session_work_size: u64,
    /// Size of each confined session's kernel directory, `box/` (its sockets; as root: a tmpfs
    /// of this size, in memory, counted in --session-memory): bytes or 16M; 0: no limit. Snapshots
    /// do not pass through it. Not root: not bounded.
    #[arg(long, requires = "http", value_name = "BYTES", default_value = "16M", value_parser = parse_size)]
    session_box_size: u64,
    /// What a confined session's kernel reaches on the network: `none` (a network namespace of
    /// its own with only `lo`), `proxy` (its own namespace; egress only through ipybox's proxy,
    /// public addresses only, by --session-allow-domain/-net/-port) or `host` (the host's
    /// network, ipybox's port and the cloud metadata address included). Default: proxy.
    /// Refused with a mode it cannot apply: `none` or `proxy` with --unconfined-sessions, any
    /// mode with --sandbox (srt's policy decides) or --kernel-gateway (the server's network).
    #[arg(long, value_name = "MODE", requires = "http")]
    session_network: Option<ipybox::confine::network::SessionNetwork>,
    /// Let confined sessions reach this address range through the proxy although it is
    /// loopback, link-local, private, CGNAT, ... (any port in it), e.g. 10.1.2.0/24.
    /// Repeatable. Default: none.
    #[arg(long, value_name = "CIDR", requires = "http")]
    session_allow_net: Vec<ipybox::confine::network::Cidr>,
    /// With the proxy, the only domains confined sessions reach: `pypi.org`, or
    /// `*.example.com` for its subdomains. Repeatable. Default: every domain whose addresses
    /// are public.
    #[arg(long, value_name = "DOMAIN", requires = "http")]
    session_allow_domain: Vec<ipybox::confine::network::DomainPattern>,
    /// A port the proxy connects to besides 80 and 443 (the default). Repeatable.
    #[arg(long, value_name = "PORT", requires = "http")]
    session_allow_port: Vec<u16>,
    /// The uids confined sessions' kernels run as, one per session while it runs (its gid is the
    /// same number; no supplementary groups): FIRST-LAST, `auto` (as root 1879048192-1879113727,
    /// the first 65536 ids of the range systemd leaves unused; otherwise none) or `none` (every
    /// kernel keeps ipybox's uid, without capabilities). A uid is leased only if no process of
    /// the host has it and the host's /etc/passwd and /etc/group do not name it. A range needs
    /// root. Default: auto.
    #[arg(
        long,
        value_name = "FIRST-LAST",
        default_value = "auto",
        requires = "http"
    )]
    session_uids: ipybox::confine::uids::UidSetting,
    /// Show this host path read-only, at its own path, to every confined session's kernel, in
    /// addition to what the view shows by default (system directories, a minimal /etc, the
    /// kernel environment, the workspace: docs/http.md "What a session sees"). Repeatable.
    /// Default: none. A path holding ipybox's own files (token files, the session secret, the
    /// data, notebook or snapshot directory) is refused.
    #[arg(long, value_name = "PATH", requires = "http")]
    session_show: Vec<PathBuf>,
    /// Give every session stdio MCP server processes of its own (closed on its reset and
    /// close), instead of one process per registered server shared by every session of the
    /// service (a server's state, e.g. server-memory's graph, is then per session).
    #[arg(long, requires = "http")]
    per_session_mcp_servers: bool,
    /// On SIGTERM/SIGINT, how long running calls may take to finish before their cells are
    /// cancelled and every kernel stopped (seconds).
    #[arg(long, value_name = "SECS", default_value_t = 10.0, requires = "http")]
    shutdown_grace: f64,
    /// At most this many connections at once; at the cap a new connection replaces an idle
    /// one (one that has not authenticated first), and is refused only when all are busy.
    #[arg(long, value_name = "N", default_value_t = 4096, requires = "http")]
    max_connections: usize,
    /// At most this many connections per client address (IPv6: per /64) that have not
    /// authenticated yet; one more replaces that address's oldest idle one.
    #[arg(long, value_name = "N", default_value_t = 64, requires = "http")]
    max_connections_per_address: usize,
    /// A new connection must send a complete request head within this long, or it is closed
    /// (seconds).
    #[arg(long, value_name = "SECS", default_value_t = 5.0, requires = "http")]
    first_request_timeout: f64,
    /// A connection idle between requests is closed after this long; longer than clients keep
    /// idle connections themselves (seconds).
    #[arg(long, value_name = "SECS", default_value_t = 120.0, requires = "http")]
    keep_alive_timeout: f64,
}

#[derive(Subcommand, Debug)]
enum Command {
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
    Exec {
        /// Kernel working directory (created if missing).
        #[arg(long, default_value = ".")]
        workspace: PathBuf,
        /// Python interpreter with ipykernel and pydantic (default: the managed environment).
        #[arg(long, env = "IPYBOX_PYTHON")]
        python: Option<PathBuf>,
        /// Give up (interrupt) after this many seconds.
        #[arg(long)]
        timeout: Option<f64>,
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
        /// Kernel working directory (created if missing).
        #[arg(long, default_value = ".")]
        workspace: PathBuf,
        /// Python interpreter with ipykernel and pydantic (default: the managed environment).
        #[arg(long, env = "IPYBOX_PYTHON")]
        python: Option<PathBuf>,
        /// Give each cell this many seconds (default: the timeout it was recorded with, else
        /// none).
        #[arg(long)]
        timeout: Option<f64>,
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
        /// Server params as JSON: `{"command", "args", "env", "cwd"}` or `{"url", "headers"}`.
        #[arg(long)]
        params: String,
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

/// Logs to stderr at `level` for ipybox (`IPYBOX_LOG`, an env-filter directive, overrides),
/// never code, output or handles (see [`logging`]); once per process, later calls do nothing.
/// The Python package's logging setup (`crates/ipybox-py` compiles this file in).
#[allow(dead_code)] // used by the wheel only
pub(crate) fn init_logging(level: &str) {
    logging::init(level, false);
}

const SUCCESS: u8 = 0;
const FAILURE: u8 = 1;
/// A command line clap or [`flags_before_subcommand`] refuses (clap's own status for it).
const USAGE: u8 = 2;

/// `ipybox [FLAGS] SUBCOMMAND ...`: the flags given before a subcommand (the MCP server's,
/// which `ipybox --help` lists at the top) are moved after it, where the subcommand parses them
/// as its own (`ipybox --sandbox exec -c CODE` is `ipybox exec --sandbox -c CODE`); one the
/// subcommand does not have is an error that says where it goes. None is dropped (issue 50).
/// `--log-level` and `--log-content` apply everywhere and stay. A command line this does not
/// follow (an unknown flag, `--help`) is left to clap as given.
fn flags_before_subcommand(
    args: Vec<std::ffi::OsString>,
) -> Result<Vec<std::ffi::OsString>, String> {
    use clap::CommandFactory;
    let mut cli = Cli::command();
    cli.build();
    let mut global = Vec::new();
    // Each flag given before the subcommand: its long name and its tokens.
    let mut leading: Vec<(String, Vec<std::ffi::OsString>)> = Vec::new();
    let mut at = 1;
    while let Some(token) = args.get(at).and_then(|t| t.to_str()) {
        let Some(long) = token.strip_prefix("--").filter(|l| !l.is_empty()) else {
            let Some(sub) = cli.find_subcommand(token) else {
                return Ok(args);
            };
            if leading.is_empty() || sub.get_name() == "help" {
                return Ok(args);
            }
            let missing: Vec<&str> = leading
                .iter()
                .map(|(name, _)| name.as_str())
                .filter(|name| !sub.get_arguments().any(|a| a.get_long() == Some(*name)))
                .collect();
            if let Some(name) = missing.first() {
                return Err(misplaced(&cli, name, sub.get_name()));
            }
            let mut placed = vec![args[0].clone()];
            placed.extend(global);
            placed.push(args[at].clone());
            placed.extend(leading.into_iter().flat_map(|(_, tokens)| tokens));
            placed.extend(args[at + 1..].iter().cloned());
            return Ok(placed);
        };
        let (name, inline) = match long.split_once('=') {
            Some((name, _)) => (name, true),
            None => (long, false),
        };
        let Some(arg) = cli.get_arguments().find(|a| a.get_long() == Some(name)) else {
            return Ok(args);
        };
        if matches!(
            arg.get_action(),
            clap::ArgAction::Help
                | clap::ArgAction::HelpShort
                | clap::ArgAction::HelpLong
                | clap::ArgAction::Version
        ) {
            return Ok(args);
        }
        let mut tokens = vec![args[at].clone()];
        if !inline && arg.get_action().takes_values() {
            tokens.extend(args.get(at + 1).cloned());
            at += 1;
        }
        at += 1;
        if arg.is_global_set() {
            global.extend(tokens);
        } else {
            leading.push((name.to_string(), tokens));
        }
    }
    Ok(args)
}

/// The error for `--NAME` given before `SUB`, which has no such flag: which commands have it.
fn misplaced(cli: &clap::Command, name: &str, sub: &str) -> String {
    let owners: Vec<&str> = cli
        .get_subcommands()
        .filter(|c| c.get_arguments().any(|a| a.get_long() == Some(name)))
        .map(|c| c.get_name())
        .collect();
    let listed: Vec<String> = owners.iter().map(|c| format!("`ipybox {c}`")).collect();
    let example = owners.first().copied().unwrap_or("serve");
    format!(
        "`--{name}` is given before `{sub}`, which has no such flag (a flag before a subcommand is the subcommand's)\n  help: `--{name}` is a flag of {} and of `ipybox` without a subcommand (the MCP server on stdio): put it after the subcommand it is for, e.g. `ipybox {example} --{name} …`",
        listed.join(", ")
    )
}

fn main() -> ExitCode {
    ExitCode::from(cli_main(std::env::args_os()))
}

/// The whole command line: `args` as `std::env::args_os()` gives them (program name first);
/// returns the exit status. Also the entry point of the Python package's `ipybox` command,
/// which compiles this module into its extension (see crates/ipybox-py).
pub(crate) fn cli_main<I, T>(args: I) -> u8
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let args: Vec<std::ffi::OsString> = args.into_iter().map(Into::into).collect();
    let args = match flags_before_subcommand(args) {
        Ok(args) => args,
        Err(message) => {
            eprintln!("error: {message}");
            return USAGE;
        }
    };
    let cli = Cli::parse_from(args);
    let default_level = match cli.command {
        None | Some(Command::Serve { .. }) => "info",
        Some(_) => "warn",
    };
    logging::init(
        cli.log_level.as_deref().unwrap_or(default_level),
        cli.log_content,
    );
    // Before any thread starts: ipybox's secrets leave its environment and command line, and no
    // other process of its user may read its memory (own_secrets.rs).
    let secrets = own_secrets::take();
    // Never in a notebook or a log line (redact.rs).
    if let Some(token) = &secrets.token {
        ipybox::redact::register("IPYBOX_TOKEN", token);
    }
    if let Some(key) = &secrets.session_secret {
        ipybox::redact::register("IPYBOX_SESSION_SECRET", key);
    }
    own_secrets::no_dumps();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return FAILURE;
        }
    };
    let stdio_server = match &cli.command {
        None => true,
        Some(Command::Serve { http, .. }) => http.http.is_none(),
        Some(_) => false,
    };
    // (A flag given before a subcommand was moved after it: `cli.serve` holds only defaults
    // then.)
    let result = match cli.command {
        Some(Command::Serve { serve: args, http }) => {
            runtime.block_on(serve(*args, Some(*http), secrets))
        }
        Some(command) => runtime.block_on(run(command, secrets)),
        None => runtime.block_on(serve(cli.serve, None, secrets)),
    };
    // Leftover blocking tasks (e.g. a terminal prompt) must not keep the process alive; the
    // wait lets the workers drop the tasks left (their children are killed on drop). A stdio
    // server whose checkpoint or restore was under way (mcp_server/resume.rs; it runs while the
    // session is idle) waits less: its store write on a blocking thread would hold the exit for
    // the whole wait, past the 100 ms budget, and is abandoned instead (the store keeps the
    // previous snapshot whole).
    let wait = if stdio_server && mcp_server::snapshot_in_flight() {
        Duration::from_millis(20)
    } else {
        Duration::from_millis(100)
    };
    runtime.shutdown_timeout(wait);
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            FAILURE
        }
    }
}

async fn serve(
    args: ServeArgs,
    http: Option<HttpArgs>,
    secrets: own_secrets::OwnSecrets,
) -> anyhow::Result<u8> {
    use mcp_server::IpyboxServer;
    let http = http.filter(|h| h.http.is_some());
    let workspace = ipybox::executor::resolve_workspace(Some(&args.workspace))?;
    let host = HostEnv::from_process();
    let mut env = dotenv::WorkspaceEnv::load(&workspace, host.vars().clone())?;
    if http.is_some() {
        // Taken out of the process environment already; a workspace `.env` naming them is no
        // way around that either.
        for name in own_secrets::OWN_SECRETS {
            env.tool_env.remove(name);
        }
    }
    if args.shell.approve_shell && args.approve == mcp_server::ApproveMode::Auto {
        anyhow::bail!(
            "--approve-shell needs someone to ask: with --approve auto every command would be accepted unseen\n  help: add --approve ask (the MCP client asks the user)"
        );
    }
    if !(args.approval_timeout.is_finite() && args.approval_timeout >= 0.0) {
        anyhow::bail!(
            "invalid --approval-timeout {}\n  help: pass a number of seconds (0 waits without limit)",
            args.approval_timeout
        );
    }
    let approval_timeout = if args.approval_timeout == 0.0 {
        Duration::MAX
    } else {
        Duration::from_secs_f64(args.approval_timeout.min(86_400.0 * 365.0))
    };
    let mut builder = args.shell.apply(
        CodeExecutor::builder()
            .workspace(&workspace)
            .host_env(host)
            .kernel_env(env.kernel_env.clone())
            .tool_env(env.tool_env)
            .spare_kernels(args.spare_kernels.unwrap_or(if http.is_some() {
                0
            } else {
                ipybox::executor::DEFAULT_SPARE_KERNELS
            }))
            .approval_timeout(approval_timeout)
            // A person reads the prompts (--approve ask): nothing is cut, too long is refused.
            .approval_text_limit(ipybox::tools::shown::HUMAN_TEXT_LIMIT)
            .max_output_bytes(args.max_output_bytes)
            .max_images(args.max_images)
            .max_image_bytes(args.max_image_bytes),
    );
    if args.max_output_bytes < 1024 {
        anyhow::bail!(
            "invalid --max-output-bytes {}\n  help: pass at least 1024 (bytes of a cell's output ipybox keeps)",
            args.max_output_bytes
        );
    }
    if args.sandbox && args.gateway.kernel_gateway.is_some() {
        anyhow::bail!(
            "--sandbox wraps local kernel processes; it cannot apply to kernels on a Jupyter server (--kernel-gateway)\n  help: use one of the two (isolate remote kernels on the server side, e.g. one pod per kernel)"
        );
    }
    let gateway = args.gateway.kernel_gateway.is_some();
    builder = args.gateway.apply(builder, args.python);
    // Session notebooks: stdio's in the workspace, the HTTP service's in a host directory (a
    // relative --notebook-dir too: taken from the data directory, never the shared workspace).
    let http_notebooks = |dir: &std::path::Path| {
        ipybox::pyenv::data_dir(&HostEnv::from_process())
            .context(
                "cannot find where to keep the HTTP sessions' notebooks
  help: pass an absolute --notebook-dir DIR, or --no-notebook",
            )
            .map(|data| data.join(dir))
    };
    let notebooks = match (&args.notebook.notebook_dir, args.notebook.no_notebook) {
        (_, true) => None,
        (Some(dir), false) if http.is_some() && dir.is_relative() => Some(http_notebooks(dir)?),
        (Some(dir), false) => Some(workspace.join(dir)),
        (None, false) if http.is_some() => Some(http_notebooks("notebooks".as_ref())?),
        (None, false) => Some(workspace.join("notebooks")),
    };
    // Over HTTP every session is its own executor. Local kernels (the default) are forked from
    // one template shared by the service's sessions; with --sandbox each session has an srt
    // sandbox of its own, and a template per session would cost more memory (~15 MB PSS each)
    // than it saves: those sessions launch plain kernels unless IPYBOX_KERNEL_FACTORY says
    // otherwise (docs/http.md).
    let http_sandbox_plain =
        http.is_some() && args.sandbox && std::env::var_os("IPYBOX_KERNEL_FACTORY").is_none();
    if args.no_kernel_factory || http_sandbox_plain {
        builder = builder.kernel_factory(false);
    }
    if args.sandbox {
        #[allow(clippy::needless_update)] // SandboxOptions may grow fields
        let options = ipybox::sandbox::SandboxOptions {
            config_file: args.sandbox_config,
            // Over HTTP the workspace must not be a channel between sessions.
            isolate_workspace: http.is_some(),
            // The operator's files, wherever they are (issue 42: a token file in /etc).
            deny_read: http
                .as_ref()
                .map(|h| {
                    let mut files = h.token_file.clone();
                    files.extend(h.session_secret_file.clone());
                    files.extend(h.snapshot_dir.clone());
                    files.extend(notebooks.clone());
                    files
                })
                .unwrap_or_default(),
            ..Default::default()
        };
        builder = builder
            .sandbox(options)
            .allow_install_urls(args.allow_install_urls);
    }
    let task_after = match args.task_after.as_str() {
        "off" | "never" => None,
        secs => match secs.parse::<f64>() {
            Ok(s) if s.is_finite() && s >= 0.0 => Some(Duration::from_secs_f64(s.min(86_400.0))),
            _ => anyhow::bail!(
                "invalid --task-after {secs}\n  help: pass a number of seconds (0: every cell becomes a task) or `off`"
            ),
        },
    };
    if !(args.task_ttl.is_finite() && args.task_ttl > 0.0) {
        anyhow::bail!(
            "invalid --task-ttl {}\n  help: pass a positive number of seconds",
            args.task_ttl
        );
    }
    let checkpoint_spec = args
        .checkpoint_after
        .clone()
        .unwrap_or_else(|| if http.is_some() { "60" } else { "off" }.into());
    let checkpoint_after = match checkpoint_spec.as_str() {
        "off" | "never" => None,
        secs => match secs.parse::<f64>() {
            Ok(s) if s.is_finite() && s >= 0.0 => Some(Duration::from_secs_f64(s.min(86_400.0))),
            _ => anyhow::bail!(
                "invalid --checkpoint-after {secs}\n  help: pass a number of seconds or `off`"
            ),
        },
    };
    let config = mcp_server::ServerConfig {
        workspace,
        approve: args.approve,
        approval_timeout,
        task_after,
        task_ttl: Duration::from_secs_f64(args.task_ttl.min(86_400.0 * 365.0)),
        max_images: args.max_images,
        max_image_bytes: args.max_image_bytes,
        checkpoint_after,
    };
    match http {
        None => {
            if let Some(dir) = notebooks {
                builder = builder.notebook_config(
                    ipybox::notebook::NotebookConfig::in_dir(dir)
                        .gitignore(!args.notebook.no_notebook_gitignore),
                );
            }
            let executor = builder.build();
            // Said when the client connects (its server list shows the reason), not at the
            // first cell.
            if let Err(e) = executor.check_sandbox().await {
                let reason = format!(
                    "ipybox cannot run code: {e}; then restart this MCP server (Claude Code: /mcp, then Reconnect)"
                );
                tracing::error!("{reason}");
                mcp_server::refuse_stdio(&reason).await?;
                return Ok(FAILURE);
            }
            mcp_server::serve_stdio(IpyboxServer::new(executor, config)).await?
        }
        Some(http) => {
            check_session_network(&http, gateway, args.sandbox)?;
            let confined = !gateway && !args.sandbox && !http.unconfined_sessions;
            // What all confined sessions may use together (reserved in full at admission).
            let memory = if confined {
                http::admission::memory_budget(
                    &http.service_memory,
                    http.session_memory,
                    http.max_sessions,
                    http.warm_sessions,
                )
                .map_err(anyhow::Error::msg)?
            } else {
                None
            };
            // What tenants (tokens) sharing local kernels would still share, if anything
            // (several tokens are refused then, unless --trust-tenants).
            let mut tenant_gap = (!gateway).then(|| {
                if args.sandbox {
                    "each tenant's code can write the workspace (`mcptools/` that the others import) and its kernels all run as this user".to_string()
                } else {
                    "each tenant's code can reach the others' kernels and files, write `mcptools/` that the others import, and read `.env` and whatever ipybox's user can".to_string()
                }
            });
            if !gateway {
                // Made now, so that kernels hide it from the start (other sessions' images).
                let images = config.workspace.join("images");
                std::fs::create_dir_all(&images)
                    .with_context(|| format!("cannot create {}", images.display()))?;
            }
            if confined {
                let operator_files = OperatorFiles {
                    snapshot_dir: http.snapshot_dir.as_deref(),
                    notebook_dir: notebooks.as_deref(),
                    token_files: &http.token_file,
                    session_secret_file: http.session_secret_file.as_deref(),
                    network: ipybox::confine::network::NetworkPolicy {
                        mode: http.session_network.unwrap_or_default(),
                        allow_nets: http.session_allow_net.clone(),
                        allow_domains: http.session_allow_domain.clone(),
                        allow_ports: http.session_allow_port.clone(),
                    },
                    shown: &http.session_show,
                };
                let mut confine = confinement(&config.workspace, operator_files).await?;
                confine.limiter = Some(std::sync::Arc::new(ipybox::confine::limits::Limiter::new(
                    ipybox::confine::limits::SessionLimits {
                        max_procs: http.session_max_procs,
                        memory: http.session_memory,
                        cpus: Some(http.session_cpus).filter(|c| *c > 0.0),
                        work_size: http.session_work_size,
                        box_size: http.session_box_size,
                    },
                    memory.map(|b| b.total),
                )));
                // SAFETY: geteuid has no preconditions.
                let euid = unsafe { libc::geteuid() };
                match http
                    .session_uids
                    .resolve(euid)
                    .map_err(anyhow::Error::msg)?
                {
                    Some(range) => {
                        tracing::info!(
                            "sessions' uids: one per session from {range} (--session-uids)"
                        );
                        confine.uids = Some(ipybox::confine::uids::UidPool::new(range));
                        tenant_gap = (http.session_network
                            == Some(ipybox::confine::network::SessionNetwork::Host))
                            .then(|| "confined, but with --session-network host every session reaches the host's loopback (ipybox's port and other services) and the cloud metadata address".to_string());
                    }
                    None => {
                        tracing::info!(
                            "sessions' uids: every kernel keeps ipybox's uid {euid}, without capabilities (--session-uids none)"
                        );
                        tenant_gap = Some(format!(
                            "confined, each tenant's kernels still run as one uid (ipybox's, {euid}: --session-uids none, or ipybox is not root), so file permissions do not separate them"
                        ));
                    }
                }
                builder = builder.confine(confine);
            } else if !gateway && !args.sandbox {
                tracing::warn!(
                    "--unconfined-sessions: every session's code runs as this user and can reach every other session, ipybox's files and processes"
                );
            }
            if !gateway && (http.allow_register || http.allow_install) {
                // Whatever the confinement: a client that registers makes this host run a
                // command as ipybox's user; an install changes every session's environment.
                tenant_gap = Some("with --allow-register a client makes this host run commands as ipybox's user, and with --allow-install it changes the kernel environment every session imports".to_string());
            }
            let per_session_servers = http.per_session_mcp_servers;
            let trust_tenants = http.trust_tenants;
            let mut http = http;
            http.checkpoint_after = checkpoint_spec;
            let notebook_quota = match http.notebook_quota.trim() {
                "off" => None,
                v => Some(http::notebook_quota::parse_bytes(v).ok_or_else(|| {
                    anyhow::anyhow!(
                        "invalid --notebook-quota `{v}`\n  help: pass a number of bytes (`64M`, `1G`, `500000`), or `off`"
                    )
                })?),
            };
            let mut options = http_options(http, secrets, gateway, confined, memory).await?;
            options.tenant_gap = tenant_gap;
            // Tenants that do not trust each other share no MCP server process (a server's
            // state, e.g. server-memory's graph, would be every tenant's).
            let tenants_apart = options.tokens.count() > 1 && !trust_tenants;
            if tenants_apart && !per_session_servers {
                tracing::info!(
                    "{} tokens (tenants): every session gets MCP server processes of its own (as with --per-session-mcp-servers; --trust-tenants shares them)",
                    options.tokens.count()
                );
            }
            let shared_servers =
                (!per_session_servers && !tenants_apart).then(ipybox::tools::SharedMcpServers::new);
            if let Some(servers) = &shared_servers {
                builder = builder.shared_mcp_servers(servers.clone());
            }
            // Used (by the builder) only for local kernels with the kernel factory on.
            let shared_factory = (!gateway && !args.sandbox && !args.no_kernel_factory)
                .then(ipybox::kernel::SharedKernelFactory::new);
            if let Some(factory) = &shared_factory {
                builder = builder.shared_kernel_factory(factory.clone());
            }
            let factory = http::sessions::ExecutorFactory::new(builder, config.workspace.clone())
                .with_notebooks(notebooks)
                .with_notebook_quota(notebook_quota)
                .shared(shared_factory, shared_servers);
            http::serve_http(options, config, factory).await?;
        }
    }
    Ok(SUCCESS)
}

/// `--session-network` and the egress proxy's flags (`--session-allow-net`, `-domain`,
/// `-port`) apply only to sessions ipybox confines itself: given where they cannot apply, they
/// are an error at start-up rather than silently ignored (issue 51).
fn check_session_network(http: &HttpArgs, gateway: bool, sandbox: bool) -> anyhow::Result<()> {
    use ipybox::confine::network::SessionNetwork;
    let proxy_flag = [
        (!http.session_allow_net.is_empty()).then_some("--session-allow-net"),
        (!http.session_allow_domain.is_empty()).then_some("--session-allow-domain"),
        (!http.session_allow_port.is_empty()).then_some("--session-allow-port"),
    ]
    .into_iter()
    .flatten()
    .next();
    let given = match (http.session_network, proxy_flag) {
        (Some(mode), _) => format!("--session-network {}", mode.as_str()),
        (None, Some(flag)) => flag.to_string(),
        (None, None) => return Ok(()),
    };
    if gateway {
        anyhow::bail!(
            "{given} cannot apply to kernels on a Jupyter server (--kernel-gateway): they run with the network of the server's machine or pod, which ipybox does not confine
  help: restrict the kernels' network where they run (e.g. a NetworkPolicy for the kernel pods), and drop {given}"
        );
    }
    if sandbox {
        anyhow::bail!(
            "{given} cannot apply with --sandbox: srt confines each kernel and its policy says what it reaches (`network.allowedDomains`, `network.deniedDomains` in --sandbox-config)
  help: drop {given} and set the network in the sandbox policy, or drop --sandbox (sessions are then confined by ipybox, whose egress proxy these flags configure)"
        );
    }
    let mode = http.session_network.unwrap_or_default();
    if http.unconfined_sessions && !(mode == SessionNetwork::Host && proxy_flag.is_none()) {
        anyhow::bail!(
            "{given} cannot apply with --unconfined-sessions: unconfined kernels run in the host's network (its loopback, ipybox's port, the cloud metadata address), with no namespace or proxy of their own
  help: drop --unconfined-sessions (sessions are confined by default, and then {given} applies), or drop {given}"
        );
    }
    if let Some(flag) = proxy_flag
        && mode != SessionNetwork::Proxy
    {
        anyhow::bail!(
            "{flag} configures the egress proxy, and with --session-network {} sessions have none
  help: use --session-network proxy (the default), or drop {flag}",
            mode.as_str()
        );
    }
    Ok(())
}

/// Checks `--http`'s flags and collects what the HTTP server needs.
async fn http_options(
    args: HttpArgs,
    secrets: own_secrets::OwnSecrets,
    gateway: bool,
    confined: bool,
    memory: Option<ipybox::confine::service::MemoryBudget>,
) -> anyhow::Result<http::HttpOptions> {
    let spec = args.http.unwrap_or_default();
    let addr = tokio::net::lookup_host(spec.as_str())
        .await
        .ok()
        .and_then(|mut addrs| addrs.next())
        .with_context(|| {
            format!("invalid --http `{spec}`\n  help: pass HOST:PORT, e.g. 127.0.0.1:8000 or 0.0.0.0:8000")
        })?;
    let tokens = http::auth::Tokens::load(&args.token, secrets.token.as_deref(), &args.token_file)?;
    let secs = |value: f64, flag: &str| -> anyhow::Result<Duration> {
        if value.is_finite() && value > 0.0 {
            Ok(Duration::from_secs_f64(value.min(86_400.0 * 365.0)))
        } else {
            anyhow::bail!("invalid {flag} {value}\n  help: pass a positive number of seconds")
        }
    };
    let optional_secs = |value: &str, flag: &str| -> anyhow::Result<Option<Duration>> {
        match value.trim() {
            "off" | "0" => Ok(None),
            v => match v.parse::<f64>() {
                Ok(n) => secs(n, flag).map(Some),
                Err(_) => anyhow::bail!(
                    "invalid {flag} `{value}`\n  help: pass a number of seconds, or `off`"
                ),
            },
        }
    };
    let hibernate_after = optional_secs(&args.hibernate_after, "--hibernate-after")?;
    let checkpoint_after = optional_secs(&args.checkpoint_after, "--checkpoint-after")?;
    let snapshot_quota = match args.snapshot_quota.trim() {
        "off" | "0" => None,
        v => Some(v.parse::<u64>().map_err(|_| {
            anyhow::anyhow!(
                "invalid --snapshot-quota `{v}`\n  help: pass a number of bytes, or `off`"
            )
        })?),
    };
    let default_idle = if hibernate_after.is_some() && !gateway {
        86_400.0 * 7.0
    } else {
        1800.0
    };
    let idle_timeout = secs(args.idle_timeout.unwrap_or(default_idle), "--idle-timeout")?;
    let shutdown_grace = secs(args.shutdown_grace, "--shutdown-grace")?;
    let first_request = secs(args.first_request_timeout, "--first-request-timeout")?;
    let keep_alive = secs(args.keep_alive_timeout, "--keep-alive-timeout")?;
    for (value, flag) in [
        (args.max_sessions, "--max-sessions"),
        (args.max_concurrent_calls, "--max-concurrent-calls"),
        (args.max_body_bytes, "--max-body-bytes"),
        (args.max_connections, "--max-connections"),
        (
            args.max_connections_per_address,
            "--max-connections-per-address",
        ),
    ] {
        if value == 0 {
            anyhow::bail!("invalid {flag} 0\n  help: pass a positive number");
        }
    }
    let data_dir = HostEnv::from_process().data_dir();
    let replica = match args.replica_id {
        Some(name) if http::handle::valid_replica(&name) => name,
        Some(name) => anyhow::bail!(
            "invalid --replica-id `{name}`\n  help: use 1-32 letters, digits, `-` or `_` (not `gw`)"
        ),
        None => default_replica(),
    };
    let session_key = match (&args.session_secret_file, secrets.session_secret) {
        (Some(file), _) => {
            let key = std::fs::read(file)
                .with_context(|| format!("cannot read --session-secret-file {}", file.display()))?;
            let key = key.trim_ascii().to_vec();
            if key.len() < 16 {
                anyhow::bail!(
                    "the session secret in {} is shorter than 16 bytes\n  help: write a long random value, e.g. `openssl rand -hex 32 > FILE`",
                    file.display()
                );
            }
            key
        }
        (None, Some(secret)) if secret.len() >= 16 => secret.into_bytes(),
        (None, Some(_)) => anyhow::bail!(
            "IPYBOX_SESSION_SECRET is shorter than 16 bytes\n  help: use a long random value, e.g. `openssl rand -hex 32`"
        ),
        // Kept in the data directory, so handles outlive a restart (the key of replicas
        // that share sessions is --session-secret-file).
        (None, None) => match &data_dir {
            Some(dir) => {
                let path = ipybox::snapshot::session_key_path(dir);
                ipybox::snapshot::host_key(&path)
                    .with_context(|| {
                        format!(
                            "cannot read or create the session key {}\n  help: check that ipybox's data directory is writable, or pass --session-secret-file",
                            path.display()
                        )
                    })?
                    .to_vec()
            }
            None => {
                tracing::warn!(
                    "no data directory (set IPYBOX_HOME): session handles will not outlive this process"
                );
                rand::random::<[u8; 32]>().to_vec()
            }
        },
    };
    let per_token = http::admission::per_token(
        &args.max_sessions_per_token,
        args.max_sessions,
        tokens.count(),
    )
    .map_err(anyhow::Error::msg)?;
    Ok(http::HttpOptions {
        addr,
        tokens,
        allowed_hosts: args.allowed_host,
        allowed_origins: args.allowed_origin,
        max_body_bytes: args.max_body_bytes,
        shutdown_grace,
        session_header: args.session_header,
        trust_tenants: args.trust_tenants,
        tenant_gap: None,
        sessions: http::sessions::SessionConfig {
            idle_timeout,
            max_sessions: args.max_sessions,
            max_per_token: per_token,
            memory,
            max_concurrent_calls: Some(args.max_concurrent_calls),
            replica,
            gateway,
            confined,
            warm_sessions: args.warm_sessions,
            allow_install: args.allow_install,
            allow_register: args.allow_register,
            hibernate_after,
            checkpoint_after,
            snapshot_quota,
            data_dir: data_dir.clone(),
            snapshot_dir: args.snapshot_dir.clone(),
        },
        session_key,
        connections: http::connections::Limits {
            max_connections: args.max_connections,
            max_per_address: args.max_connections_per_address,
            first_request,
            keep_alive,
        },
    })
}

/// The operator's files a confined session must not see, wherever they are (an operator's
/// `/etc` or `/srv`, or the workspace every kernel reads).
struct OperatorFiles<'a> {
    snapshot_dir: Option<&'a std::path::Path>,
    notebook_dir: Option<&'a std::path::Path>,
    token_files: &'a [PathBuf],
    session_secret_file: Option<&'a std::path::Path>,
    network: ipybox::confine::network::NetworkPolicy,
    /// `--session-show`: shown read-only (checked against the files above).
    shown: &'a [PathBuf],
}

/// How `serve --http` confines local sessions: bubblewrap must work here (else a refusal that
/// names the install command and `--unconfined-sessions`); the workspace's `.env`, the
/// sessions' images and notebooks, the saved sessions (`--snapshot-dir`), the token files and
/// the session-secret file are hidden from every kernel.
async fn confinement(
    workspace: &std::path::Path,
    files: OperatorFiles<'_>,
) -> anyhow::Result<ipybox::confine::Confinement> {
    let shown = session_show(&files)?;
    let refuse = |e: ipybox::confine::ConfineError| {
        anyhow::anyhow!(
            "{e}\n  help: or, to run every session's code unconfined (as this user, able to reach every other session), pass --unconfined-sessions"
        )
    };
    let host = HostEnv::from_process();
    let bwrap = ipybox::confine::find_bwrap(None, &host).map_err(refuse)?;
    ipybox::confine::probe(&bwrap).await.map_err(refuse)?;
    tracing::info!(
        "sessions are confined: each kernel runs in a bubblewrap of its own ({}), the workspace read-only",
        bwrap.display()
    );
    let mut hidden = vec![workspace.join(".env"), workspace.join("images")];
    // Directories are made now: a path that does not exist when a kernel starts is not hidden.
    if let Some(dir) = files.snapshot_dir {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot create --snapshot-dir {}", dir.display()))?;
        hidden.push(dir.to_path_buf());
    }
    if let Some(dir) = files.notebook_dir {
        use std::os::unix::fs::DirBuilderExt;
        if !dir.is_dir() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .with_context(|| {
                    format!(
                        "cannot create the notebook directory {}\n  help: pass a writable --notebook-dir, or --no-notebook",
                        dir.display()
                    )
                })?;
        }
        hidden.push(dir.to_path_buf());
    }
    hidden.extend(files.token_files.iter().cloned());
    hidden.extend(files.session_secret_file.map(std::path::Path::to_path_buf));
    // (A link, as a Kubernetes secret's file is, hides what it points to: mounts follow it.)
    tracing::info!(
        "sessions' network: {} (--session-network)",
        files.network.mode.as_str()
    );
    Ok(ipybox::confine::Confinement {
        hidden,
        bwrap: Some(bwrap),
        limiter: None,
        network: files.network,
        shown,
        uids: None,
    })
}

/// Reads `--session-cpus` (0: no limit).
fn parse_cpus(text: &str) -> Result<f64, String> {
    ipybox::confine::limits::parse_cpus(text).map(|c| c.unwrap_or(0.0))
}

/// Reads a size flag (`512M`, `2G`, bytes).
fn parse_size(text: &str) -> Result<u64, String> {
    ipybox::confine::limits::parse_bytes(text).map_err(|e| e.to_string())
}

/// The `--session-show` paths, absolute and canonical; refused: a path that does not exist, and
/// one that holds or is inside one of ipybox's own files (token files, the session secret,
/// the data, notebook or snapshot directory).
fn session_show(files: &OperatorFiles<'_>) -> anyhow::Result<Vec<PathBuf>> {
    let mut own: Vec<(&str, PathBuf)> = Vec::new();
    own.extend(files.token_files.iter().map(|p| ("token file", p.clone())));
    own.extend(
        files
            .session_secret_file
            .map(|p| ("session-secret file", p.to_path_buf())),
    );
    own.extend(
        files
            .notebook_dir
            .map(|p| ("notebook directory", p.to_path_buf())),
    );
    own.extend(
        files
            .snapshot_dir
            .map(|p| ("snapshot directory", p.to_path_buf())),
    );
    own.extend(
        HostEnv::from_process()
            .data_dir()
            .map(|p| ("data directory ($IPYBOX_HOME)", p)),
    );
    let mut shown = Vec::new();
    for path in files.shown {
        let real = std::fs::canonicalize(path).with_context(|| {
            format!(
                "invalid --session-show {}
  help: pass an existing host path (it is shown read-only at its own path to every session's kernel)",
                path.display()
            )
        })?;
        for (what, file) in &own {
            // Compared as given and as resolved (a link in either).
            let resolved = std::fs::canonicalize(file).unwrap_or_else(|_| file.clone());
            let clash = [file, &resolved]
                .iter()
                .any(|f| f.starts_with(&real) || real.starts_with(f) || f.starts_with(path));
            if clash {
                anyhow::bail!(
                    "--session-show {} would show ipybox's {what} {} to every session
  help: show a directory that does not contain it (or move the {what} out of it)",
                    path.display(),
                    file.display()
                );
            }
        }
        shown.push(real);
    }
    Ok(shown)
}

/// This replica's default name in handles: the host name, made valid (a pod's name on
/// Kubernetes), else a random one.
fn default_replica() -> String {
    let host = std::fs::read_to_string("/etc/hostname").unwrap_or_default();
    let name: String = host
        .trim()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '-'
            }
        })
        .take(32)
        .collect();
    if http::handle::valid_replica(&name) {
        name
    } else {
        format!("r{:08x}", rand::random::<u32>())
    }
}

async fn run(command: Command, secrets: own_secrets::OwnSecrets) -> anyhow::Result<u8> {
    match command {
        Command::Serve { serve: args, http } => serve(*args, Some(*http), secrets).await,
        Command::Replay {
            notebooks,
            workspace,
            python,
            timeout,
            yes,
            check,
            sandbox,
            sandbox_config,
            unsandboxed,
            shell,
            gateway,
        } => {
            if let Some(t) = timeout.filter(|t| !(t.is_finite() && *t > 0.0)) {
                anyhow::bail!("invalid --timeout {t}\n  help: pass a positive number of seconds");
            }
            let confinement = match (sandbox_config, sandbox, unsandboxed) {
                (_, _, true) => replay::Confine::Unsandboxed,
                (Some(file), _, _) => replay::Confine::Sandbox(Some(file)),
                (None, true, _) => replay::Confine::Sandbox(None),
                (None, false, false) => replay::Confine::Recorded,
            };
            let remote = gateway.kernel_gateway.is_some();
            let builder = gateway.apply(
                shell.apply(
                    CodeExecutor::builder()
                        .workspace(workspace)
                        .progress(print_progress())
                        .approval_text_limit(ipybox::tools::shown::HUMAN_TEXT_LIMIT),
                ),
                python,
            );
            let replay = replay::Replay {
                notebooks,
                timeout: timeout.map(|t| Duration::from_secs_f64(t.min(86_400.0 * 365.0))),
                yes,
                check,
                confinement,
                remote,
                records: HostEnv::from_process()
                    .data_dir()
                    .map(|d| d.join(ipybox::notebook::ledger::RECORDS_DIR)),
            };
            replay::run(replay, builder).await
        }
        Command::Trust { paths, yes, list } => {
            let mode = match (yes, list) {
                (true, _) => trust_command::Mode::Yes,
                (_, true) => trust_command::Mode::List,
                _ => trust_command::Mode::Ask,
            };
            trust_command::run(&paths, mode)
        }
        Command::Setup { python } => {
            let host = HostEnv::from_process();
            let env = tokio::task::spawn_blocking(move || {
                ipybox::pyenv::resolve(python.as_deref(), &host, &print_progress())
            })
            .await?
            .map_err(with_cli_help)?;
            match &env.managed_dir {
                Some(dir) => println!(
                    "kernel environment: {}\npython: {}",
                    dir.display(),
                    env.python.display()
                ),
                None => println!(
                    "python: {} (has ipykernel and pydantic)",
                    env.python.display()
                ),
            }
            Ok(SUCCESS)
        }
        Command::Apigen {
            name,
            params,
            root,
            async_api,
        } => {
            let params: serde_json::Value = serde_json::from_str(&params)
                .context("--params is not valid JSON\n  help: pass e.g. --params '{\"command\": \"npx\", \"args\": [\"-y\", \"@modelcontextprotocol/server-memory\"]}'")?;
            let style = if async_api {
                ApiStyle::Async
            } else {
                ApiStyle::Sync
            };
            let host = HostEnv::from_process();
            let modules = ipybox::generate_mcp_sources_with(
                &name,
                &params,
                &root,
                host.vars(),
                ipybox::tools::DEFAULT_CONNECT_TIMEOUT,
                style,
            )
            .await?;
            eprintln!(
                "generated {} modules in {}",
                modules.len(),
                root.join(&name).display()
            );
            for m in modules {
                println!("{m}");
            }
            Ok(SUCCESS)
        }
        Command::Exec {
            workspace,
            python,
            timeout,
            yes,
            sandbox,
            sandbox_config,
            shell,
            gateway,
            code,
            file,
        } => {
            let code = read_code(code, file)?;
            if let Some(t) = timeout.filter(|t| !(t.is_finite() && *t > 0.0)) {
                anyhow::bail!("invalid --timeout {t}\n  help: pass a positive number of seconds");
            }
            if sandbox && gateway.kernel_gateway.is_some() {
                anyhow::bail!(
                    "--sandbox wraps local kernel processes; it cannot apply to kernels on a Jupyter server (--kernel-gateway)\n  help: use one of the two (isolate remote kernels on the server side, e.g. one pod per kernel)"
                );
            }
            let mut builder = shell.apply(
                CodeExecutor::builder()
                    .workspace(workspace)
                    .progress(print_progress())
                    .without_spare_kernel()
                    .approval_text_limit(ipybox::tools::shown::HUMAN_TEXT_LIMIT),
            );
            builder = gateway.apply(builder, python);
            if sandbox {
                builder = builder.sandbox(ipybox::sandbox::SandboxOptions {
                    config_file: sandbox_config,
                    ..Default::default()
                });
            }
            let executor = builder.build();
            // Before anything runs: no sandbox here is a refusal, never a kernel on the host.
            if let Err(e) = executor.check_sandbox().await {
                anyhow::bail!(
                    "cannot run the code in the sandbox: {e}\n  help: make the sandbox available here (docs/sandbox.md, Requirements), or leave out --sandbox to run the code on this host, unsandboxed"
                );
            }
            executor.start().await.map_err(|e| match e {
                ExecutorError::PythonEnv(e) => with_cli_help(e),
                other => anyhow::Error::new(other),
            })?;
            let timeout = timeout.map(Duration::from_secs_f64);
            let execution = executor.stream(&code, timeout);
            let mut approver = terminal_approval::TerminalApprover::new(yes);
            let result = terminal_approval::print_execution(execution, &mut approver).await;
            executor.stop().await;
            match result?.context("the execution ended without a result")? {
                Ok(_) => Ok(SUCCESS),
                Err(e) => {
                    eprintln!("{e}");
                    Ok(FAILURE)
                }
            }
        }
    }
}

/// Provisioning progress on stderr, as `ipybox: <line>`.
fn print_progress() -> Progress {
    Arc::new(|line: &str| eprintln!("ipybox: {line}"))
}

/// Adds where the interpreter comes from on the command line to errors about it.
fn with_cli_help(e: PyEnvError) -> anyhow::Error {
    let hint = matches!(
        e,
        PyEnvError::NotRunnable { .. } | PyEnvError::MissingPackages { .. }
    )
    .then_some("\n  help: the interpreter comes from --python PATH or IPYBOX_PYTHON");
    anyhow::anyhow!("{e}{}", hint.unwrap_or(""))
}

fn read_code(code: Option<String>, file: Option<PathBuf>) -> anyhow::Result<String> {
    match (code, file) {
        (Some(code), _) => Ok(code),
        (None, Some(f)) if f.as_os_str() == "-" => {
            let mut s = String::new();
            std::io::stdin()
                .read_to_string(&mut s)
                .context("reading code from stdin")?;
            Ok(s)
        }
        (None, Some(f)) => {
            std::fs::read_to_string(&f).with_context(|| format!("reading {}", f.display()))
        }
        (None, None) => {
            anyhow::bail!("no code given\n  help: pass -c CODE, a FILE, or - to read stdin")
        }
    }
}
