//! [bin] `ipybox serve` (and `ipybox` without a subcommand): the flags turned into an executor
//! builder and a server configuration, then the MCP server on stdio or the HTTP service, in
//! steps: the `--http` address, the workspace and its `.env`, the server's settings, the
//! executor, the notebooks, the start-up line, and the transport.
//!
//! Not here: the flags' types (`flags`), the servers themselves (`mcp_server`, `http`).

mod confinement;
mod http_options;

use std::io::IsTerminal;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use ipybox::CodeExecutor;
use ipybox::executor::CodeExecutorBuilder;
use ipybox::host_env::HostEnv;

use super::flags::units::{OrOff, Secs, nonzero_secs, nonzero_size};
use super::flags::{HttpArgs, ServeArgs};
use super::{FAILURE, SUCCESS, dotenv, http, mcp_server, own_secrets};

/// Runs the MCP server: on stdio, or with `http` (and its `--http`) as the HTTP service.
pub(crate) async fn serve(
    args: ServeArgs,
    http: Option<HttpArgs>,
    secrets: own_secrets::OwnSecrets,
) -> anyhow::Result<u8> {
    let http = http.filter(|h| h.http.is_some());
    // A typo in --http is said before anything is set up.
    let addr = match &http {
        Some(h) => Some(http_options::bind_address(h.http.as_deref().unwrap_or_default()).await?),
        None => None,
    };
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
    let config = server_config(&args, workspace, http.is_some())?;
    let notebooks = notebook_dir(&args, &config.workspace, http.is_some())?;
    let mut builder = executor_builder(
        &args,
        &config.workspace,
        config.approval_timeout,
        env,
        host,
        http.as_ref(),
        notebooks.as_deref(),
    )?;
    let transport = match addr {
        Some(addr) => format!("MCP over HTTP at http://{addr}/mcp"),
        None => "MCP on stdio".to_string(),
    };
    tracing::info!(
        "ipybox {}: workspace {}, {transport}, notebooks {}",
        env!("CARGO_PKG_VERSION"),
        config.workspace.display(),
        notebooks
            .as_ref()
            .map_or("not recorded (--no-notebook)".to_string(), |d| d
                .display()
                .to_string())
    );
    let (Some(http), Some(addr)) = (http, addr) else {
        if let Some(dir) = notebooks {
            builder = builder.notebook_config(
                ipybox::notebook::NotebookConfig::in_dir(dir)
                    .gitignore(!args.notebook.no_notebook_gitignore),
            );
        }
        return serve_stdio(builder, config).await;
    };
    let service = HttpService {
        args: http,
        addr,
        gateway: args.gateway.kernel_gateway.is_some(),
        sandbox: args.sandbox,
        kernel_factory: !args.no_kernel_factory,
        checkpoint_after: config.checkpoint_after,
    };
    service.serve(builder, config, notebooks, secrets).await?;
    Ok(SUCCESS)
}

/// The server's settings from its flags (`http`: the defaults of the HTTP service).
fn server_config(
    args: &ServeArgs,
    workspace: PathBuf,
    http: bool,
) -> anyhow::Result<mcp_server::ServerConfig> {
    if args.shell.approve_shell && args.approve == mcp_server::ApproveMode::Auto {
        anyhow::bail!(
            "--approve-shell needs someone to ask: with --approve auto every command would be accepted unseen\n  help: add --approve ask (the MCP client asks the user)"
        );
    }
    let approval_timeout = args
        .approval_timeout
        .0
        .map(|t| t.positive("--approval-timeout", ", or `off` to wait without limit"))
        .transpose()
        .map_err(anyhow::Error::msg)?
        .unwrap_or(Duration::MAX);
    let task_ttl = args
        .task_ttl
        .positive("--task-ttl", "")
        .map_err(anyhow::Error::msg)?;
    let checkpoint = args.checkpoint_after.unwrap_or(if http {
        OrOff(Some(Secs(Duration::from_secs(60))))
    } else {
        OrOff(None)
    });
    Ok(mcp_server::ServerConfig {
        workspace,
        approve: args.approve,
        approval_timeout,
        // 0: every cell becomes a task at once.
        task_after: args
            .task_after
            .0
            .map(|t| t.0.min(Duration::from_secs(86_400))),
        task_ttl,
        max_images: args.max_images,
        max_image_bytes: args.max_image_bytes.bytes(),
        checkpoint_after: nonzero_secs(checkpoint, "--checkpoint-after")
            .map_err(anyhow::Error::msg)?,
    })
}

/// Where the session notebooks go: stdio's in the workspace, the HTTP service's in a host
/// directory (a relative --notebook-dir too: taken from the data directory, never the shared
/// workspace); `None`: --no-notebook.
fn notebook_dir(args: &ServeArgs, workspace: &Path, http: bool) -> anyhow::Result<Option<PathBuf>> {
    let in_data_dir = |dir: &Path| {
        ipybox::pyenv::data_dir(&HostEnv::from_process())
            .context(
                "cannot find where to keep the HTTP sessions' notebooks
  help: pass an absolute --notebook-dir DIR, or --no-notebook",
            )
            .map(|data| data.join(dir))
    };
    Ok(
        match (&args.notebook.notebook_dir, args.notebook.no_notebook) {
            (_, true) => None,
            (Some(dir), false) if http && dir.is_relative() => Some(in_data_dir(dir)?),
            (Some(dir), false) => Some(workspace.join(dir)),
            (None, false) if http => Some(in_data_dir("notebooks".as_ref())?),
            (None, false) => Some(workspace.join("notebooks")),
        },
    )
}

/// The executor every session is built from (without notebooks: stdio and the HTTP service
/// add them each its way).
fn executor_builder(
    args: &ServeArgs,
    workspace: &Path,
    approval_timeout: Duration,
    env: dotenv::WorkspaceEnv,
    host: HostEnv,
    http_service: Option<&HttpArgs>,
    notebooks: Option<&Path>,
) -> anyhow::Result<CodeExecutorBuilder> {
    let http = http_service.is_some();
    if args.max_output_bytes.0 < 1024 {
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
    let builder = args.shell.apply(
        CodeExecutor::builder()
            .workspace(workspace)
            .host_env(host)
            .kernel_env(env.kernel_env)
            .tool_env(env.tool_env)
            .spare_kernels(args.spare_kernels.unwrap_or(if http {
                0
            } else {
                ipybox::executor::DEFAULT_SPARE_KERNELS
            }))
            .approval_timeout(approval_timeout)
            // A person reads the prompts (--approve ask): nothing is cut, too long is refused.
            .approval_text_limit(ipybox::tools::shown::HUMAN_TEXT_LIMIT)
            .max_output_bytes(args.max_output_bytes.bytes())
            .max_images(args.max_images)
            .max_image_bytes(args.max_image_bytes.bytes()),
    );
    let mut builder = args.gateway.clone().apply(builder, args.python.clone());
    // Over HTTP every session is its own executor. Local kernels (the default) are forked from
    // one template shared by the service's sessions; with --sandbox each session has an srt
    // sandbox of its own, and a template per session would cost more memory (~15 MB PSS each)
    // than it saves: those sessions launch plain kernels unless IPYBOX_KERNEL_FACTORY says
    // otherwise (docs/http.md).
    let http_sandbox_plain =
        http && args.sandbox && std::env::var_os("IPYBOX_KERNEL_FACTORY").is_none();
    if args.no_kernel_factory || http_sandbox_plain {
        builder = builder.kernel_factory(false);
    }
    if args.sandbox {
        #[allow(clippy::needless_update)] // SandboxOptions may grow fields
        let options = ipybox::sandbox::SandboxOptions {
            config_file: args.sandbox_config.clone(),
            // Over HTTP the workspace must not be a channel between sessions.
            isolate_workspace: http,
            // The operator's files, wherever they are (issue 42: a token file in /etc).
            deny_read: http_service
                .map(|h| {
                    let mut files = h.token_file.clone();
                    files.extend(h.session_secret_file.clone());
                    files.extend(h.snapshot_dir.clone());
                    files.extend(notebooks.map(Path::to_path_buf));
                    files
                })
                .unwrap_or_default(),
            ..Default::default()
        };
        builder = builder
            .sandbox(options)
            .allow_install_urls(args.allow_install_urls);
    }
    Ok(builder)
}

/// The MCP server on stdio. A bare `ipybox` typed in a terminal is told what it is; a sandbox
/// that cannot work here is said when the client connects (its server list shows the reason),
/// not at the first cell.
async fn serve_stdio(
    builder: CodeExecutorBuilder,
    config: mcp_server::ServerConfig,
) -> anyhow::Result<u8> {
    if std::io::stdin().is_terminal() {
        eprintln!(
            "ipybox is an MCP server: it waits for an MCP client's messages on stdin (Ctrl-C ends it).\n  help: register it with a client (e.g. `claude mcp add ipybox -- ipybox`), or try code by hand: `ipybox exec -c 'print(1)'` (ipybox --help lists the commands)"
        );
    }
    let executor = builder.build();
    if let Err(e) = executor.check_sandbox().await {
        let reason = format!(
            "ipybox cannot run code: {e}; then restart this MCP server (Claude Code: /mcp, then Reconnect)"
        );
        // One line in the log (a record shows a line break as `\n`).
        tracing::error!("{}", reason.replace("\n  help: ", "; help: "));
        mcp_server::refuse_stdio(&reason).await?;
        return Ok(FAILURE);
    }
    mcp_server::serve_stdio(mcp_server::IpyboxServer::new(executor, config)).await?;
    Ok(SUCCESS)
}

/// The HTTP service, a kernel per agent session (docs/http.md).
struct HttpService {
    args: HttpArgs,
    addr: SocketAddr,
    gateway: bool,
    sandbox: bool,
    kernel_factory: bool,
    checkpoint_after: Option<Duration>,
}

impl HttpService {
    async fn serve(
        self,
        mut builder: CodeExecutorBuilder,
        config: mcp_server::ServerConfig,
        notebooks: Option<PathBuf>,
        secrets: own_secrets::OwnSecrets,
    ) -> anyhow::Result<()> {
        let http = self.args;
        let (gateway, sandbox) = (self.gateway, self.sandbox);
        http_options::check_session_network(&http, gateway, sandbox)?;
        let confined = !gateway && !sandbox && !http.unconfined_sessions;
        let memory = if confined {
            session_memory_budget(&http)?
        } else {
            None
        };
        let memory_total = memory.as_ref().map(|b| b.total);
        let notebook_quota =
            nonzero_size(http.notebook_quota, "--notebook-quota").map_err(anyhow::Error::msg)?;
        // Every flag is checked before anything is set up (the confinement probes bwrap).
        let service = http_options::Service {
            addr: self.addr,
            gateway,
            confined,
            memory,
            checkpoint_after: self.checkpoint_after,
        };
        let mut options = http_options::http_options(&http, secrets, service)?;
        let mut tenant_gap = confinement::unconfined_gap(gateway, sandbox);
        if !gateway {
            // Made now, so that kernels hide it from the start (other sessions' images).
            let images = config.workspace.join("images");
            std::fs::create_dir_all(&images)
                .with_context(|| format!("cannot create {}", images.display()))?;
        }
        if confined {
            let (confine, gap) = confinement::sessions_confinement(
                &http,
                &config.workspace,
                notebooks.as_deref(),
                memory_total,
            )
            .await?;
            tenant_gap = gap;
            builder = builder.confine(confine);
        } else if !gateway && !sandbox {
            tracing::warn!(
                "--unconfined-sessions: every session's code runs as this user and can reach every other session, ipybox's files and processes"
            );
        }
        if !gateway && (http.allow_register || http.allow_install) {
            // Whatever the confinement: a client that registers makes this host run a command
            // as ipybox's user; an install changes every session's environment.
            tenant_gap = Some("with --allow-register a client makes this host run commands as ipybox's user, and with --allow-install it changes the kernel environment every session imports".to_string());
        }
        let per_session_servers = http.per_session_mcp_servers;
        let trust_tenants = http.trust_tenants;
        options.tenant_gap = tenant_gap;
        // Tenants that do not trust each other share no MCP server process (a server's state,
        // e.g. server-memory's graph, would be every tenant's).
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
        let shared_factory = (!gateway && !sandbox && self.kernel_factory)
            .then(ipybox::kernel::SharedKernelFactory::new);
        if let Some(factory) = &shared_factory {
            builder = builder.shared_kernel_factory(factory.clone());
        }
        let factory = http::sessions::ExecutorFactory::new(builder, config.workspace.clone())
            .with_notebooks(notebooks)
            .with_notebook_quota(notebook_quota)
            .shared(shared_factory, shared_servers);
        Ok(http::serve_http(options, config, factory).await?)
    }
}

/// What all confined sessions may use together (reserved in full at admission).
fn session_memory_budget(
    http: &HttpArgs,
) -> anyhow::Result<Option<ipybox::confine::service::MemoryBudget>> {
    http::admission::memory_budget(
        &http.service_memory,
        http.session_memory.0.map_or(0, |s| s.0),
        http.max_sessions,
        http.warm_sessions,
    )
    .map_err(anyhow::Error::msg)
}
