//! Starting an executor: the interpreter (found or provisioned), the runtime directory, the
//! tool server and which registered servers its kernels reach, the sandbox, confinement or
//! Jupyter server the kernels run under, the shared kernel factory, and the kernel pool. The
//! one place a `KernelConfig` is composed from the builder. Not here: stopping and resetting
//! (`lifecycle`), running cells (`run`).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use include_dir::Dir;

use super::{CodeExecutor, DEFAULT_SPARE_KERNELS, ExecutorError, Live, Running};
use crate::confine::ConfineError;
use crate::kernel::gateway::Gateway;
use crate::kernel::gateway::ledger::Ledger;
use crate::kernel::runtime_dir::{CreateError, RuntimeDir, Sockets};
use crate::kernel::{
    Backend, KernelConfig, KernelError, KernelPool, SharedFactoryError, SharedFork,
    SharedKernelFactory, ShellApproval,
};
use crate::notebook::Section;
use crate::pyenv;
use crate::snapshot::KernelConfinement;
use crate::tools::registry::{ImportRoots, Reach};
use crate::tools::server::{ToolServer, ToolServerState};
use crate::tools::{DEFAULT_APPROVAL_TIMEOUT, DEFAULT_CONNECT_TIMEOUT, SessionCache};

/// What a runtime directory runs on its mount points before it is removed (its own, a dead
/// ipybox's): a confined session's mounts come off, never through a link. Handed over here,
/// where kernels and confinement meet, so `kernel` needs nothing of `confine` for it.
const UNMOUNT: crate::kernel::runtime_dir::MountCleanUp = crate::confine::limits::unmount_work;

impl CodeExecutor {
    /// Tells the notebook, if any, how this executor's kernels are confined, and where the host
    /// keeps its own record of the notebook's files (ipybox's data directory).
    fn record_confinement(&self, sandbox: Option<&crate::sandbox::LoadedPolicy>, remote: bool) {
        let Some(notebook) = &self.inner.notebook else {
            return;
        };
        use crate::notebook::ledger::{Confinement, RECORDS_DIR};
        let confinement = match sandbox {
            Some((policy, file)) => Confinement::sandboxed(policy, file.as_deref()),
            None if remote => Confinement::unsandboxed("remote"),
            None if self.inner.builder.confinement.is_some() => {
                Confinement::unsandboxed("confined")
            }
            None => Confinement::unsandboxed("local"),
        };
        let records = self.host_env().data_dir().map(|d| d.join(RECORDS_DIR));
        notebook.set_confinement(confinement, records);
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
                    self.inner
                        .builder
                        .kernel_env
                        .get("PYTHONPATH")
                        .map(String::as_str),
                )?;
                Some(loaded)
            }
            None => None,
        };
        self.record_confinement(sandbox_policy.as_ref(), gateway.is_some());
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
        let sockets = if b.sandbox.is_some() {
            Sockets::Sandboxed
        } else {
            Sockets::Own
        };
        let runtime = match &shared {
            Some(shared) => RuntimeDir::create_in(shared.dir(), self.host_env(), UNMOUNT),
            None => RuntimeDir::create(self.host_env(), sockets, UNMOUNT),
        }
        .map_err(|e| match e {
            CreateError::TooLong(e) => ExecutorError::SocketPath(e),
            CreateError::Io(source) => ExecutorError::Io {
                path: RuntimeDir::base_dir(self.host_env()),
                source,
            },
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
        // Only the sandbox sets it (below): no other kernel imports a sandboxed install.
        config.env.remove(pyenv::install::SITE_LAYER_ENV);
        // Only ipybox gives a trusted kernel the trust ledger (`workspace_trust` below).
        config.env.remove(crate::workspace_trust::LEDGER_ENV);
        let mut snapshot_channel = None;
        let confinement = match (&gateway, &sandbox_policy, &b.sandbox, &bwrap) {
            (Some(gateway), ..) => KernelConfinement::Remote {
                server: gateway.base().to_string(),
            },
            (None, Some((policy, _)), Some(options), _) => {
                KernelConfinement::sandbox(policy, options.isolate_workspace)
            }
            (None, _, _, Some(_)) => KernelConfinement::Confined,
            _ => KernelConfinement::Unconfined,
        };
        let trust_window = self.workspace_trust(
            &confinement,
            &workspace,
            sandbox_policy.as_ref().map(|(policy, _)| policy),
            &mut config.env,
        )?;
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
            // The notebook's directory is the host's record: not the kernel's to write.
            let mut options = options.clone();
            if let Some(dir) = self.inner.notebook.as_ref().and_then(|n| n.dir()) {
                options.record_dirs.push(dir.to_path_buf());
            }
            // The generated API is the host's too: a trusted kernel imports it later.
            if !options.isolate_workspace {
                options
                    .record_dirs
                    .push(workspace.join(crate::workspace_trust::GENERATED_DIR));
            }
            let options = &options;
            let python = config.python.clone();
            // What this workspace's sandboxed installs added: readable (not writable) for the
            // kernel, imported from only by sandboxed kernels.
            let layer = self.site_layer(runtime.path())?;
            layer.create()?;
            config.env.insert(
                pyenv::install::SITE_LAYER_ENV.into(),
                layer.site.display().to_string(),
            );
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
                        layer.site.clone(),
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
        let mut session = None;
        let mut egress = None;
        let mut uid = None;
        if let (Some(confinement), Some(bwrap)) = (&b.confinement, &bwrap) {
            let io = |source| ExecutorError::Io {
                path: runtime.path().to_path_buf(),
                source,
            };
            let writable = runtime.kernel_writable().map_err(io)?;
            let work = runtime.path().join(crate::confine::WORK_DIR);
            crate::safe_fs::create_private_dir(&work).map_err(io)?;
            // The session's own uid (leased until its kernels stop: `Running::uid`), handed
            // what it needs of the runtime directory before anything is mounted on `work/`.
            if let Some(pool) = &confinement.uids {
                let lease = pool.lease().map_err(|e| KernelError::Start {
                    reason: e.to_string(),
                    help: "close sessions, or give a larger --session-uids range".into(),
                })?;
                let ids = lease.ids;
                crate::confine::uids::hand_over(runtime.path(), ids, &[&socket]).map_err(io)?;
                runtime.set_kernel_owner(ids.uid, ids.gid);
                uid = Some(lease);
            }
            if let Some(limiter) = &confinement.limiter {
                let (limits, mount) = session_limits(limiter, &work)?;
                config.limits = Some(limits.clone());
                session = Some(SessionUse {
                    limits,
                    work: mount,
                });
            }
            let mut layout = crate::confine::Layout::new(
                self.host_env(),
                runtime.path(),
                writable.path(),
                &workspace,
                &config.python,
                confinement,
            );
            if let Some(lease) = &uid {
                layout = layout
                    .with_session_user(
                        self.host_env(),
                        runtime.path(),
                        lease.ids.uid,
                        lease.ids.gid,
                    )
                    .map_err(io)?;
            }
            let identity = crate::confine::identity::KernelIdentity {
                ids: uid.as_ref().map(|lease| lease.ids),
                seccomp: crate::confine::seccomp::write(runtime.path()).map_err(io)?,
            };
            if let Some(shared) = &shared {
                // A forked kernel binds ipybox's kernel-side Python back from the template's
                // copy: its preloaded modules came from there.
                let mut plan = layout
                    .clone()
                    .show_read_only(shared.dir().join("python"))
                    .fork_plan();
                identity.add_to_plan(&mut plan);
                config.shared = Some(SharedFork::new(shared, Some(plan)));
            }
            config.wrapper = Some(crate::confine::wrapper(bwrap, layout, &identity));
            config.cwd = Some(work);
            if confinement.network.mode == crate::confine::network::SessionNetwork::Proxy {
                let socket = runtime.path().join(crate::confine::network::EGRESS_SOCKET);
                let tag = b.session_tag.clone().unwrap_or_else(|| {
                    runtime
                        .path()
                        .file_name()
                        .map(|n| n.to_string_lossy().into_owned())
                        .unwrap_or_default()
                });
                egress = Some(
                    crate::confine::egress_proxy::EgressProxy::start(
                        &socket,
                        Arc::new(confinement.network.clone()),
                        tag,
                    )
                    .map_err(|source| ExecutorError::Io {
                        path: socket.clone(),
                        source,
                    })?,
                );
                if let Some(lease) = &uid {
                    crate::confine::uids::hand_over(runtime.path(), lease.ids, &[&socket])
                        .map_err(|source| ExecutorError::Io {
                            path: socket.clone(),
                            source,
                        })?;
                }
                config
                    .env
                    .extend(crate::confine::network::proxy_env(&socket));
            }
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
            confinement,
            session,
            _egress: egress,
            _uid: uid,
            _trust_window: trust_window,
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
                if confinement
                    .limiter
                    .as_ref()
                    .is_some_and(|l| l.limits.work_size > 0)
                {
                    // Work directories' tmpfs mounts, made later on the host, must reach the
                    // template's view (and so its forks).
                    crate::confine::limits::share_mounts_below(dir)?;
                }
                let layout =
                    crate::confine::Layout::for_template(host, dir, workspace, python, confinement);
                config.wrapper = Some(crate::confine::template_wrapper(bwrap, layout));
            }
            Ok(config)
        };
        handle.get_or_start(host, UNMOUNT, template).map_err(|e| match e {
            SharedFactoryError::Io { path, source } => ExecutorError::Io { path, source },
            SharedFactoryError::SocketPath(e) => ExecutorError::SocketPath(e),
            SharedFactoryError::Shut => KernelError::Start {
                reason: "the shared kernel factory was shut down".into(),
                help: "start executors before shutting down the factory they share".into(),
            }
            .into(),
        })
    }

    /// Whether kernels come from the kernel factory: the builder's choice, else
    /// `IPYBOX_KERNEL_FACTORY` (off for `0`, `off`, `false`, `no`), else on Linux (elsewhere
    /// off: the factory holds its kernels by pidfd, which only Linux has).
    fn factory_wanted(&self) -> bool {
        if let Some(on) = self.inner.builder.kernel_factory {
            return on;
        }
        match self.host_env().get("IPYBOX_KERNEL_FACTORY") {
            Some(v) => !matches!(
                v.trim().to_ascii_lowercase().as_str(),
                "0" | "off" | "false" | "no"
            ),
            None => cfg!(target_os = "linux"),
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
    pub(super) fn gateway(&self, spec: &str) -> Result<Gateway, ExecutorError> {
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
}

fn extract(dir: &Dir<'_>, to: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(to)?;
    std::fs::set_permissions(to, std::fs::Permissions::from_mode(0o755))?;
    for file in dir.files() {
        let path = to.join(file.path());
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
            std::fs::set_permissions(parent, std::fs::Permissions::from_mode(0o755))?;
        }
        // Readable by every uid (ipybox's own code, no secret): a session with a uid of its own
        // reads it whatever the umask.
        std::fs::write(&path, file.contents())?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644))?;
    }
    for sub in dir.dirs() {
        extract(sub, to)?;
    }
    Ok(())
}

/// What a confined session uses of its limits: its cgroup (or resource limits) and its work
/// directory's tmpfs.
#[derive(Debug)]
pub(super) struct SessionUse {
    pub(super) limits: crate::confine::limits::KernelLimits,
    pub(super) work: Option<crate::confine::limits::WorkMount>,
}

impl SessionUse {
    /// The limits the session met since the last look.
    pub(super) fn hits(&self) -> Vec<crate::confine::limits::LimitHit> {
        let mut hits = self
            .limits
            .cgroup
            .as_ref()
            .map(|c| c.hits())
            .unwrap_or_default();
        hits.extend(self.work.as_ref().and_then(|w| w.full()));
        hits
    }
}

/// A new session's cgroup (or resource limits) and its work directory's tmpfs on `work`.
fn session_limits(
    limiter: &crate::confine::limits::Limiter,
    work: &Path,
) -> Result<
    (
        crate::confine::limits::KernelLimits,
        Option<crate::confine::limits::WorkMount>,
    ),
    ExecutorError,
> {
    let limits = limiter.for_session().map_err(|e| KernelError::Start {
        reason: e.to_string(),
        help:
            "check that ipybox may create cgroups (the `session limits` line of its log at start)"
                .into(),
    })?;
    let mount = crate::confine::limits::WorkMount::mount(work, limiter.limits.work_size).map_err(
        |e| KernelError::Start {
            reason: format!(
                "cannot mount the session's work directory ({} of tmpfs, --session-work-size) on {}: {e}",
                crate::confine::limits::format_bytes(limiter.limits.work_size),
                work.display()
            ),
            help: "pass --session-work-size 0 for no limit on the work directory".into(),
        },
    )?;
    Ok((limits, mount))
}
