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
use crate::confine::plan::{PlanError, SessionPlace, SessionPlan};
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
        let sandbox_policy = self.sandbox_policy(&workspace).await?;
        self.record_confinement(sandbox_policy.as_ref(), gateway.is_some());
        let bwrap = self.confinement_bwrap(gateway.is_some())?;
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
        let runtime = self.new_runtime_dir(shared.as_ref())?;
        if gateway.is_none() {
            let _ = self.inner.python.set(python.clone());
        }
        let mut config = KernelConfig::new(python, workspace.clone(), self.host_env().clone());
        config.images_dir = self.images_dir()?;
        config.output = b.output;
        let (tools, socket) = self.tool_server(
            &runtime,
            &workspace,
            sandbox_policy.as_ref(),
            gateway.is_some(),
        )?;
        config.env = self.kernel_env_base();
        let confinement = kernel_confinement(
            gateway.as_ref(),
            sandbox_policy.as_ref(),
            bwrap.is_some(),
            b,
        );
        let trust_window = self.workspace_trust(
            &confinement,
            &workspace,
            sandbox_policy.as_ref().map(|(policy, _)| policy),
            &mut config.env,
        )?;
        let snapshot_channel =
            self.kernel_transport(&mut config, gateway, &runtime, &socket, &tools, &workspace)?;
        self.kernel_options(&mut config);
        if let (Some(options), Some(loaded)) = (&b.sandbox, sandbox_policy) {
            self.sandbox_kernel(&mut config, options, loaded, &runtime, &workspace, &socket)
                .await?;
        }
        let place = (&runtime, &*workspace, &*socket, shared.as_ref());
        let confined = self.confine_kernel(&mut config, bwrap.as_deref(), place)?;
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
        let (session, egress, uid) = confined.map_or((None, None, None), |c| c.into_parts());
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

    /// The sandbox's policy, loaded, and the host's layout checked against it: nothing the host
    /// will run may lie where a sandboxed kernel can write. `None` without a sandbox.
    async fn sandbox_policy(
        &self,
        workspace: &Path,
    ) -> Result<Option<crate::sandbox::LoadedPolicy>, ExecutorError> {
        let b = &self.inner.builder;
        let Some(options) = &b.sandbox else {
            return Ok(None);
        };
        let loaded = crate::sandbox::load_policy(options, workspace).await?;
        let explicit = b
            .python
            .clone()
            .or_else(|| self.host_env().get("IPYBOX_PYTHON").map(PathBuf::from));
        crate::sandbox::check_layout(
            &loaded,
            options,
            self.host_env(),
            workspace,
            explicit.as_deref(),
            b.kernel_env.get("PYTHONPATH").map(String::as_str),
        )?;
        Ok(Some(loaded))
    }

    /// bubblewrap, found, when the kernels are confined (plain local kernels only).
    fn confinement_bwrap(&self, remote: bool) -> Result<Option<PathBuf>, ExecutorError> {
        let b = &self.inner.builder;
        match &b.confinement {
            Some(_) if remote || b.sandbox.is_some() => Err(ConfineError::Unavailable {
                reason: format!(
                    "confinement applies to plain local kernels, not to {}",
                    if remote {
                        "kernels on a Jupyter server"
                    } else {
                        "sandboxed ones (srt confines them its own way)"
                    }
                ),
                help: "ask for one of the two".into(),
            }
            .into()),
            Some(c) => Ok(Some(crate::confine::find_bwrap(
                c.bwrap.as_deref(),
                self.host_env(),
            )?)),
            None => Ok(None),
        }
    }

    /// This executor's runtime directory: its own, or one inside the shared factory's.
    fn new_runtime_dir(
        &self,
        shared: Option<&Arc<crate::kernel::StartedFactory>>,
    ) -> Result<Arc<RuntimeDir>, ExecutorError> {
        let sockets = if self.inner.builder.sandbox.is_some() {
            Sockets::Sandboxed
        } else {
            Sockets::Own
        };
        let runtime = match shared {
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
        Ok(Arc::new(runtime))
    }

    /// The tool server on `<runtime>/tools.sock`, and its socket's path.
    fn tool_server(
        &self,
        runtime: &RuntimeDir,
        workspace: &Path,
        sandbox: Option<&crate::sandbox::LoadedPolicy>,
        remote: bool,
    ) -> Result<(ToolServer, PathBuf), ExecutorError> {
        let b = &self.inner.builder;
        let sessions = SessionCache::new(
            self.tool_env(),
            b.connect_timeout.unwrap_or(DEFAULT_CONNECT_TIMEOUT),
        );
        // No kernel is trusted with server params: it reaches the servers registered for the
        // directories this executor imports from, with their recorded params (tools::registry).
        let roots = self.import_roots(workspace, sandbox, remote);
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
        Ok((tools, socket))
    }

    /// How the kernels are reached: local ones get ipybox's kernel-side Python and the tool
    /// socket; a Jupyter server's get their tool calls and snapshots over the stdin channel
    /// (the channel returned).
    fn kernel_transport(
        &self,
        config: &mut KernelConfig,
        gateway: Option<Gateway>,
        runtime: &RuntimeDir,
        socket: &Path,
        tools: &ToolServer,
        workspace: &Path,
    ) -> Result<Option<Arc<crate::snapshot::remote::SnapshotChannel>>, ExecutorError> {
        let Some(gateway) = gateway else {
            // Remote kernels get the runtime in their bootstrap cell instead.
            let python_dir = runtime.path().join("python");
            extract(&crate::kernel::RUNTIME, &python_dir).map_err(|source| ExecutorError::Io {
                path: python_dir.clone(),
                source,
            })?;
            config.python_path = vec![python_dir];
            config
                .env
                .insert("IPYBOX_TOOL_SOCKET".into(), socket.display().to_string());
            return Ok(None);
        };
        // Tool calls come over the kernel's stdin channel (no route to the socket), and so do
        // snapshots.
        let state = tools.state().clone();
        let ws = workspace.to_path_buf();
        let channel = crate::snapshot::remote::SnapshotChannel::new();
        let answers = channel.clone();
        config.input_handler = Some(Arc::new(move |payload: String| {
            let state = state.clone();
            let ws = ws.clone();
            let channel = answers.clone();
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
        Ok(Some(channel))
    }

    /// The builder's kernel environment, less what only ipybox sets: the sandbox's site layer
    /// (no other kernel imports a sandboxed install) and the trust ledger (only a trusted
    /// kernel gets it, `workspace_trust`).
    fn kernel_env_base(&self) -> std::collections::BTreeMap<String, String> {
        let mut env = self.inner.builder.kernel_env.clone();
        env.remove(pyenv::install::SITE_LAYER_ENV);
        env.remove(crate::workspace_trust::LEDGER_ENV);
        env
    }

    /// The builder's kernel options: working directory restored, shell approval, start
    /// timeout, the kernel factory.
    fn kernel_options(&self, config: &mut KernelConfig) {
        let b = &self.inner.builder;
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
    }

    /// A sandboxed kernel: srt's wrapper, the workspace's site layer, and with an isolated
    /// workspace its working directory inside the kernel-writable part.
    async fn sandbox_kernel(
        &self,
        config: &mut KernelConfig,
        options: &crate::sandbox::SandboxOptions,
        loaded: crate::sandbox::LoadedPolicy,
        runtime: &RuntimeDir,
        workspace: &Path,
        socket: &Path,
    ) -> Result<(), ExecutorError> {
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
        let io = |source| ExecutorError::Io {
            path: runtime.path().to_path_buf(),
            source,
        };
        let writable = runtime.kernel_writable().map_err(io)?;
        config.wrapper = Some(
            crate::sandbox::prepare(
                options,
                loaded,
                self.host_env(),
                workspace,
                runtime.path(),
                &[
                    runtime.path().join("python"),
                    runtime.host_kernels(),
                    runtime.factory_dir().map_err(io)?,
                    socket.to_path_buf(),
                    layer.site.clone(),
                ],
                writable.path(),
                &python,
                &config.env,
            )
            .await?,
        );
        if options.isolate_workspace {
            // Inside the kernel-writable part: the kernel writes there already, and the host
            // never reads back from it.
            let work = writable
                .subdir(crate::confine::WORK_DIR, Some(0o700))
                .map_err(|source| ExecutorError::Io {
                    path: writable.path().join(crate::confine::WORK_DIR),
                    source,
                })?;
            config.cwd = Some(work.path().to_path_buf());
        }
        Ok(())
    }

    /// A confined kernel: the session's plan (`confine::plan`, composed there top to bottom)
    /// applied to the kernel's config, for a launched kernel (the wrapper) and a forked one
    /// (the fork plan); what the session holds while it runs is returned. Unconfined (no
    /// `bwrap`), a forked kernel is the template's child as it is.
    fn confine_kernel(
        &self,
        config: &mut KernelConfig,
        bwrap: Option<&Path>,
        (runtime, workspace, socket, shared): ConfinedPlace<'_>,
    ) -> Result<Option<Confined>, ExecutorError> {
        let (Some(confinement), Some(bwrap)) = (&self.inner.builder.confinement, bwrap) else {
            if let Some(shared) = shared {
                config.shared = Some(SharedFork::new(shared, None));
            }
            return Ok(None);
        };
        let io = |source| ExecutorError::Io {
            path: runtime.path().to_path_buf(),
            source,
        };
        let writable = runtime.kernel_writable().map_err(io)?;
        let tag = self.inner.builder.session_tag.clone().unwrap_or_else(|| {
            runtime
                .path()
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default()
        });
        let place = SessionPlace {
            host: self.host_env(),
            runtime: runtime.path(),
            writable: writable.path(),
            workspace,
            python: &config.python,
            tool_socket: socket,
            tag,
            shared_dir: shared.map(|s| s.dir()),
        };
        let plan = SessionPlan::build(confinement, bwrap, place).map_err(|e| match e {
            PlanError::Io { path, source } => ExecutorError::Io { path, source },
            PlanError::Start { reason, help } => KernelError::Start { reason, help }.into(),
        })?;
        // The session's kernels run as its uid: their directories, made from now on, are its.
        if let Some(lease) = &plan.uid {
            runtime.set_kernel_owner(lease.ids.uid, lease.ids.gid);
        }
        let session = plan.limits.map(|(limits, work, boxed)| {
            config.limits = Some(limits.clone());
            SessionUse {
                limits,
                work,
                boxed,
            }
        });
        if let Some(shared) = shared {
            config.shared = Some(SharedFork::new(shared, plan.fork_plan));
        }
        config.wrapper = Some(plan.wrapper);
        config.cwd = Some(plan.cwd);
        config.env.extend(plan.env);
        Ok(Some(Confined {
            session,
            egress: plan.egress,
            uid: plan.uid,
        }))
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
                config.wrapper = Some(SessionPlan::template_wrapper(
                    confinement,
                    bwrap,
                    host,
                    dir,
                    workspace,
                    python,
                )?);
            }
            Ok(config)
        };
        handle
            .get_or_start(host, UNMOUNT, template)
            .map_err(|e| match e {
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

/// How the kernels are confined, as a snapshot records it.
fn kernel_confinement(
    gateway: Option<&Gateway>,
    sandbox: Option<&crate::sandbox::LoadedPolicy>,
    confined: bool,
    b: &super::CodeExecutorBuilder,
) -> KernelConfinement {
    match (gateway, sandbox, &b.sandbox) {
        (Some(gateway), ..) => KernelConfinement::Remote {
            server: gateway.base().to_string(),
        },
        (None, Some((policy, _)), Some(options)) => {
            KernelConfinement::sandbox(policy, options.isolate_workspace)
        }
        _ if confined => KernelConfinement::Confined,
        _ => KernelConfinement::Unconfined,
    }
}

/// Where a confined session's kernels run: its runtime directory, workspace, tool socket and
/// shared factory.
type ConfinedPlace<'a> = (
    &'a Arc<RuntimeDir>,
    &'a Path,
    &'a Path,
    Option<&'a Arc<crate::kernel::StartedFactory>>,
);

/// What a confined session holds while its kernels run: its limits, egress proxy and uid.
struct Confined {
    session: Option<SessionUse>,
    egress: Option<crate::confine::egress_proxy::EgressProxy>,
    uid: Option<crate::confine::uids::UidLease>,
}

impl Confined {
    fn into_parts(
        self,
    ) -> (
        Option<SessionUse>,
        Option<crate::confine::egress_proxy::EgressProxy>,
        Option<crate::confine::uids::UidLease>,
    ) {
        (self.session, self.egress, self.uid)
    }
}

/// What a confined session uses of its limits: its cgroup (or resource limits) and its work
/// directory's tmpfs.
#[derive(Debug)]
pub(super) struct SessionUse {
    pub(super) limits: crate::confine::limits::KernelLimits,
    pub(super) work: Option<crate::confine::limits::WorkMount>,
    /// The tmpfs on the kernel's own directory (`box/`), as root with `--session-box-size`.
    pub(super) boxed: Option<crate::confine::limits::WorkMount>,
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
        hits.extend(self.boxed.as_ref().and_then(|b| b.full()));
        hits
    }
}
