//! Starting one kernel and holding its connections: an `ipykernel` process ipybox launches, or a
//! kernel on a Jupyter server ([`super::gateway`]); [`Kernel`] hides which.
//!
//! The kernel runs `python -c <launcher> -f <connection file>` with a minimal environment, the
//! workspace as cwd, stdout discarded and stderr kept as a bounded tail for diagnostics. It is
//! ready when it answers `kernel_info` on shell AND the matching `status` arrived on iopub (so the
//! PUB/SUB subscription is live before the first execute). A watcher task notices the process's
//! exit at once. The kernel never outlives ipybox: it reads its stdin (a pipe from us) in a thread
//! and exits on EOF, and on Linux it also gets `PR_SET_PDEATHSIG`.
//!
//! What an execution does with these connections is in [`super::execute`].

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use jupyter_protocol::connection_info::Transport;
use jupyter_protocol::messaging::Channel;
use jupyter_protocol::{ConnectionInfo, JupyterMessage, KernelInfoRequest};
use jupyter_zmq_client::{ClientControlConnection, DealerSendConnection};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use super::completion::Completion;
use super::gateway::Gateway;
use super::gateway::connection::{Inbound, RemoteKernel};
use super::{Backend, KernelConfig, KernelError, ShellApproval};
use crate::child_process::{StderrTail, own_group, signal_group};

/// Python run with `-c`: a stdin watchdog (exit when ipybox goes away), the output-flushing
/// ipykernel patch (`ipybox_runtime.output_flush`), then the kernel app. (What needs the kernel
/// running comes in through `exec_lines`, see `startup_line`.)
const LAUNCHER: &str = r#"import os, sys, threading
def _ipybox_watch_parent():
    try:
        while os.read(0, 4096):
            pass
    except OSError:
        pass
    os._exit(0)
threading.Thread(target=_ipybox_watch_parent, name="ipybox-parent-watch", daemon=True).start()
__import__("ipybox_runtime.output_flush", fromlist=["install"]).install()
from ipykernel import kernelapp
kernelapp.launch_new_instance()
"#;

/// How a kernel process ended.
#[derive(Debug, Clone)]
pub(crate) struct ExitInfo(pub String);

/// The kernel process and what watches it. Dropping it kills the process group, stops the
/// watcher tasks and removes the kernel's directory (connection file and IPC socket files).
struct Process {
    pid: u32,
    exit: watch::Receiver<Option<ExitInfo>>,
    stderr_tail: StderrTail,
    tasks: Vec<JoinHandle<()>>,
    /// Held open: the kernel exits when this pipe closes (ipybox gone).
    _stdin: Option<tokio::process::ChildStdin>,
    dir: PathBuf,
}

impl Process {
    fn exited(&self) -> Option<String> {
        self.exit.borrow().as_ref().map(|e| e.0.clone())
    }

    fn stderr_tail(&self) -> String {
        self.stderr_tail.last_lines()
    }

    fn stderr_suffix(&self) -> String {
        let tail = self.stderr_tail();
        if tail.is_empty() {
            String::new()
        } else {
            format!("; kernel stderr:\n{tail}")
        }
    }

    fn exited_err(&self) -> KernelError {
        let status = self.exited().unwrap_or_else(|| "exited".into());
        start_err(format!(
            "the kernel process exited ({status}){}",
            self.stderr_suffix()
        ))
    }

    fn kill(&self) {
        if self.pid == 0 {
            return;
        }
        // The group is killed even after the kernel itself died (segfault, OOM): what its code
        // started lives on in the group. (A sandboxed kernel's group is led by the sandbox
        // wrapper, which is our child; the kernel is in it.)
        signal_group(self.pid, libc::SIGKILL);
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
        for t in &self.tasks {
            t.abort();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A running, ready kernel: a local process or a kernel on a Jupyter server. Executions see
/// the same receivers and methods either way.
pub(crate) struct Kernel {
    pub(crate) shell_rx: mpsc::UnboundedReceiver<JupyterMessage>,
    pub(crate) iopub_rx: mpsc::UnboundedReceiver<JupyterMessage>,
    /// msg_id of an execution whose caller went away before it completed (see
    /// `execute::settle_abandoned`); shared with that execution's drop guard.
    pub(crate) abandoned: Arc<Mutex<Option<String>>>,
    link: Link,
}

/// How messages reach the kernel. (One per kernel, moved only when a kernel is swapped in: the
/// size difference between the variants does not matter.)
#[allow(clippy::large_enum_variant)]
enum Link {
    /// ZMQ over IPC sockets to a child process. The sockets are declared before the process:
    /// they close before the process is reaped.
    Local {
        shell_tx: DealerSendConnection,
        control: ClientControlConnection,
        process: Process,
    },
    /// A WebSocket to a Jupyter server (see [`super::gateway`]).
    Remote(RemoteKernel),
}

impl std::fmt::Debug for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.link {
            Link::Local { process, .. } => f
                .debug_struct("Kernel")
                .field("pid", &process.pid)
                .field("dir", &process.dir)
                .finish(),
            Link::Remote(remote) => f
                .debug_struct("Kernel")
                .field("remote", &remote.describe())
                .finish(),
        }
    }
}

impl Kernel {
    /// Starts a kernel as `config` says (a local process in `dir`, or a kernel on a Jupyter
    /// server) and waits until it answers. `pid` receives a local process's id as soon as the
    /// process exists, so whoever abandons a launch can wait for the process to end.
    pub(crate) async fn launch(
        config: &KernelConfig,
        dir: PathBuf,
        pid: &AtomicU32,
    ) -> Result<Kernel, KernelError> {
        match &config.backend {
            Backend::Local => Self::launch_local(config, dir, pid).await,
            Backend::Gateway(gateway) => {
                let _ = std::fs::remove_dir_all(&dir);
                Self::launch_remote(config, gateway).await
            }
        }
    }

    async fn launch_local(
        config: &KernelConfig,
        dir: PathBuf,
        pid: &AtomicU32,
    ) -> Result<Kernel, KernelError> {
        let started = Instant::now();
        std::fs::create_dir_all(&dir)
            .map_err(|e| start_err(format!("cannot create {}: {e}", dir.display())))?;
        let info = ConnectionInfo {
            transport: Transport::IPC,
            ip: dir.join("k").display().to_string(),
            stdin_port: 1,
            control_port: 2,
            hb_port: 3,
            shell_port: 4,
            iopub_port: 5,
            signature_scheme: "hmac-sha256".to_string(),
            key: uuid::Uuid::new_v4().to_string(),
            kernel_name: Some("python3".to_string()),
        };
        let conn_file = dir.join("connection.json");
        write_private(&conn_file, &serde_json::to_vec(&info).map_err(proto)?)
            .map_err(|e| start_err(format!("cannot write {}: {e}", conn_file.display())))?;

        let mut child = spawn(config, &conn_file)?;
        pid.store(child.id().unwrap_or(0), Ordering::SeqCst);
        let mut process = Process {
            pid: child.id().unwrap_or(0),
            exit: watch::channel(None).1,
            stderr_tail: StderrTail::default(),
            tasks: Vec::new(),
            _stdin: child.stdin.take(),
            dir,
        };
        if let Some(stderr) = child.stderr.take() {
            let (tail, reader) = StderrTail::capture(stderr);
            process.stderr_tail = tail;
            process.tasks.push(reader);
        }
        let (exit_tx, exit_rx) = watch::channel(None);
        process.exit = exit_rx;
        process.tasks.push(tokio::spawn(async move {
            let desc = match child.wait().await {
                Ok(s) => describe_exit(s),
                Err(e) => format!("unknown exit: {e}"),
            };
            let _ = exit_tx.send(Some(ExitInfo(desc)));
        }));

        let deadline = tokio::time::Instant::from(started + config.start_timeout);
        let ready = async {
            let mut kernel = connect(&info, process).await?;
            handshake(&mut kernel).await?;
            Ok::<_, KernelError>(kernel)
        };
        match tokio::time::timeout_at(deadline, ready).await {
            Ok(result) => {
                let kernel = result?;
                tracing::debug!(
                    pid = kernel.pid(),
                    elapsed_ms = started.elapsed().as_millis() as u64,
                    "kernel ready"
                );
                Ok(kernel)
            }
            // The process guard was moved into the cancelled future and dropped: kernel killed.
            Err(_) => Err(start_err(format!(
                "no kernel_info reply within {} s",
                config.start_timeout.as_secs()
            ))),
        }
    }

    /// Creates a kernel on the Jupyter server, waits until it answers, and runs the bootstrap
    /// cell. A kernel that fails any step is deleted again.
    async fn launch_remote(
        config: &KernelConfig,
        gateway: &Gateway,
    ) -> Result<Kernel, KernelError> {
        let started = Instant::now();
        let (shell, shell_rx) = mpsc::unbounded_channel();
        let (iopub, iopub_rx) = mpsc::unbounded_channel();
        let ready = async {
            let remote = RemoteKernel::create(
                gateway,
                config.ledger.as_ref(),
                &config.env,
                Inbound { shell, iopub },
                config.input_handler.clone(),
            )
            .await?;
            let mut kernel = Kernel {
                shell_rx,
                iopub_rx,
                abandoned: Arc::new(Mutex::new(None)),
                link: Link::Remote(remote),
            };
            handshake(&mut kernel).await?;
            let code = super::gateway::bootstrap::cell(config, &super::RUNTIME);
            super::execute::bootstrap(&mut kernel, config, &code).await?;
            Ok::<_, KernelError>(kernel)
        };
        match tokio::time::timeout(config.start_timeout, ready).await {
            Ok(result) => {
                let kernel = result?;
                tracing::debug!(
                    kernel = ?kernel,
                    elapsed_ms = started.elapsed().as_millis() as u64,
                    "remote kernel ready"
                );
                Ok(kernel)
            }
            Err(_) => Err(KernelError::Start {
                reason: format!(
                    "the kernel on {} did not answer within {} s",
                    gateway.url(),
                    config.start_timeout.as_secs()
                ),
                help: "check the Jupyter server's log; a cluster may need longer to schedule a kernel (kernel_start_timeout)".into(),
            }),
        }
    }

    /// The local process id (0 for a kernel on a Jupyter server).
    pub(crate) fn pid(&self) -> u32 {
        match &self.link {
            Link::Local { process, .. } => process.pid,
            Link::Remote(_) => 0,
        }
    }

    /// How the kernel ended, if it has (a local process's exit status, or what the Jupyter
    /// server said).
    pub(crate) fn exited(&self) -> Option<String> {
        match &self.link {
            Link::Local { process, .. } => process.exited(),
            Link::Remote(remote) => remote.exited(),
        }
    }

    /// A receiver that changes when the kernel ends.
    pub(crate) fn exit_watch(&self) -> watch::Receiver<Option<ExitInfo>> {
        match &self.link {
            Link::Local { process, .. } => process.exit.clone(),
            Link::Remote(remote) => remote.exit_watch(),
        }
    }

    /// The kernel's recent stderr (local kernels), for diagnostics.
    pub(crate) fn stderr_tail(&self) -> String {
        match &self.link {
            Link::Local { process, .. } => process.stderr_tail(),
            Link::Remote(remote) => remote.describe(),
        }
    }

    fn exited_err(&self) -> KernelError {
        match &self.link {
            Link::Local { process, .. } => process.exited_err(),
            Link::Remote(remote) => KernelError::Start {
                reason: format!(
                    "{} ended while starting: {}",
                    remote.describe(),
                    remote.exited().unwrap_or_default()
                ),
                help: "check the Jupyter server's log for the kernel's output".into(),
            },
        }
    }

    /// Sends a request on the shell channel.
    pub(crate) async fn send_shell(&mut self, msg: JupyterMessage) -> Result<(), KernelError> {
        match &mut self.link {
            Link::Local { shell_tx, .. } => shell_tx.send(msg).await.map_err(proto),
            Link::Remote(remote) => remote.send(Channel::Shell, msg),
        }
    }

    /// Interrupts the running code: `interrupt_request` on the control channel for a local
    /// kernel (works inside a sandbox, where a host signal would reach the sandbox wrapper), the
    /// server's interrupt endpoint for a remote one.
    pub(crate) async fn interrupt(&mut self) -> Result<(), KernelError> {
        match &mut self.link {
            Link::Local { control, .. } => {
                let msg: JupyterMessage = jupyter_protocol::InterruptRequest {}.into();
                control.send(msg).await.map_err(proto)
            }
            Link::Remote(remote) => remote.interrupt().await,
        }
    }

    /// Stops the kernel. A local one is killed with its process group (there is no state worth
    /// a graceful shutdown, and ipykernel's own shutdown sometimes takes ~10 s) and waited for;
    /// a remote one is deleted on the server.
    pub(crate) async fn shutdown(self) {
        match self.link {
            Link::Local { process, .. } => {
                process.kill();
                let mut exit = process.exit.clone();
                let _ =
                    tokio::time::timeout(Duration::from_secs(2), exit.wait_for(|e| e.is_some()))
                        .await;
            }
            Link::Remote(remote) => remote.shutdown().await,
        }
    }
}

/// Waits for the socket files and connects shell/iopub/control.
async fn connect(info: &ConnectionInfo, process: Process) -> Result<Kernel, KernelError> {
    let ports = [info.shell_port, info.iopub_port, info.control_port];
    while !ports
        .iter()
        .all(|p| Path::new(&format!("{}-{p}", info.ip)).exists())
    {
        if process.exited().is_some() {
            return Err(process.exited_err());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let session_id = uuid::Uuid::new_v4().to_string();
    let identity = jupyter_zmq_client::peer_identity_for_session(&session_id).map_err(proto)?;
    let shell = jupyter_zmq_client::create_client_shell_connection_with_identity(
        info,
        &session_id,
        identity,
    )
    .await
    .map_err(proto)?;
    let mut iopub = jupyter_zmq_client::create_client_iopub_connection(info, "", &session_id)
        .await
        .map_err(proto)?;
    let control = jupyter_zmq_client::create_client_control_connection(info, &session_id)
        .await
        .map_err(proto)?;
    let (shell_tx, mut shell_read) = shell.split();
    let mut process = process;

    let (to_shell_rx, shell_rx) = mpsc::unbounded_channel();
    process.tasks.push(tokio::spawn(async move {
        while let Ok(msg) = shell_read.read().await {
            if to_shell_rx.send(msg).is_err() {
                break;
            }
        }
    }));
    let (to_iopub_rx, iopub_rx) = mpsc::unbounded_channel();
    process.tasks.push(tokio::spawn(async move {
        loop {
            match iopub.read().await {
                Ok(msg) => {
                    if to_iopub_rx.send(msg).is_err() {
                        break;
                    }
                }
                Err(e) => tracing::warn!("dropping an unreadable iopub message: {e}"),
            }
        }
    }));
    Ok(Kernel {
        shell_rx,
        iopub_rx,
        abandoned: Arc::new(Mutex::new(None)),
        link: Link::Local {
            shell_tx,
            control,
            process,
        },
    })
}

/// `kernel_info`, resent every 200 ms until its reply AND its idle status arrived: iopub is a
/// PUB/SUB socket, so messages published before the subscription took hold are lost (the slow
/// joiner); an idle status seen means iopub is connected. (A Jupyter server's WebSocket has the
/// same property: it subscribes when the socket opens.)
async fn handshake(kernel: &mut Kernel) -> Result<(), KernelError> {
    let mut exit = kernel.exit_watch();
    let mut ready: Option<Completion> = None;
    while !ready.as_ref().is_some_and(Completion::is_complete) {
        let req: JupyterMessage = KernelInfoRequest {}.into();
        match ready.as_mut() {
            Some(r) => r.also(req.header.msg_id.clone()),
            None => ready = Some(Completion::new(req.header.msg_id.clone())),
        }
        let Some(done) = ready.as_mut() else { break };
        kernel.send_shell(req).await?;
        let round = tokio::time::sleep(Duration::from_millis(200));
        tokio::pin!(round);
        while !done.is_complete() {
            tokio::select! {
                Some(msg) = kernel.shell_rx.recv() => done.on_shell(msg),
                Some(msg) = kernel.iopub_rx.recv() => {
                    done.on_iopub(&msg);
                }
                _ = exit.changed() => return Err(kernel.exited_err()),
                _ = &mut round => break,
            }
        }
    }
    Ok(())
}

/// The line the kernel runs once it is up (ipykernel's `exec_lines`), if any: the
/// working-directory guard (`restore_cwd`) and shell-command approval. `__import__` binds no name
/// in the user's namespace.
fn startup_line(config: &KernelConfig) -> Option<String> {
    let mut parts = Vec::new();
    if config.restore_cwd {
        // A JSON string is a valid Python string literal.
        let dir = serde_json::to_string(&config.workspace.display().to_string())
            .unwrap_or_else(|_| "'.'".into());
        parts.push(format!(
            "__import__('ipybox_runtime.working_dir', fromlist=['install']).install({dir})"
        ));
    }
    if let ShellApproval::On { require_escape } = config.shell_approval {
        let flag = if require_escape { "True" } else { "False" };
        parts.push(format!(
            "__import__('ipybox_runtime.shell_guard', fromlist=['install']).install({flag})"
        ));
    }
    (!parts.is_empty()).then(|| parts.join("; "))
}

fn spawn(config: &KernelConfig, conn_file: &Path) -> Result<tokio::process::Child, KernelError> {
    let mut argv = vec![
        config.python.display().to_string(),
        "-c".to_string(),
        LAUNCHER.to_string(),
        "-f".to_string(),
        conn_file.display().to_string(),
        "--IPKernelApp.quiet=True".to_string(),
        "--HistoryManager.enabled=False".to_string(),
        // ipykernel sleeps 0.5 ms before every execute_reply so that clients which stop at the
        // reply see trailing output; ipybox waits for the idle status instead, so it need not.
        "--IPythonKernel._execute_sleep=0".to_string(),
        "--InteractiveShell.colors=nocolor".to_string(),
        "--InteractiveShell.xmode=Context".to_string(),
    ];
    if let Some(line) = startup_line(config) {
        argv.push(format!("--IPKernelApp.exec_lines={line}"));
    }
    if let Some(wrap) = &config.wrapper {
        argv = (wrap.0)(argv);
    }
    let mut cmd = tokio::process::Command::new(&argv[0]);
    cmd.args(&argv[1..])
        .env_clear()
        .envs(base_env(config))
        .current_dir(&config.workspace)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    own_group(&mut cmd);
    #[cfg(target_os = "linux")]
    // SAFETY: prctl is async-signal-safe; runs in the child between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    cmd.spawn().map_err(|e| {
        start_err_help(
            format!("cannot run {}: {e}", argv[0]),
            "check the interpreter path (--python / IPYBOX_PYTHON) or run `ipybox setup`",
        )
    })
}

/// The kernel's environment: a minimal base, then the caller's variables (which win).
pub(crate) fn base_env(config: &KernelConfig) -> Vec<(String, String)> {
    let mut env: std::collections::BTreeMap<String, String> = Default::default();
    let host = |k: &str| config.host.get(k).map(str::to_string);
    let venv_bin = config.python.parent().map(|p| p.display().to_string());
    let path = match (venv_bin, host("PATH")) {
        (Some(bin), Some(p)) => format!("{bin}:{p}"),
        (Some(bin), None) => format!("{bin}:/usr/local/bin:/usr/bin:/bin"),
        (None, Some(p)) => p,
        (None, None) => "/usr/local/bin:/usr/bin:/bin".to_string(),
    };
    env.insert("PATH".into(), path);
    for k in crate::host_env::IDENTITY
        .iter()
        .chain(crate::host_env::NETWORK)
    {
        if let Some(v) = host(k) {
            env.insert(k.to_string(), v);
        }
    }
    env.entry("LANG".into()).or_insert_with(|| "C.UTF-8".into());
    env.insert(
        "TMPDIR".into(),
        super::runtime_dir::temp_dir(&config.host)
            .display()
            .to_string(),
    );
    let mut py_path: Vec<String> = config
        .python_path
        .iter()
        .map(|p| p.display().to_string())
        .collect();
    py_path.push(config.workspace.display().to_string());
    env.insert("PYTHONPATH".into(), py_path.join(":"));
    for (k, v) in fixed_env() {
        env.insert(k.into(), v.into());
    }
    for (k, v) in &config.env {
        env.insert(k.clone(), v.clone());
    }
    env.into_iter().collect()
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

fn describe_exit(status: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit code {code}"),
        (None, Some(sig)) => format!("killed by signal {sig}{}", signal_name(sig)),
        _ => "unknown exit status".to_string(),
    }
}

fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGKILL => " (SIGKILL)",
        libc::SIGSEGV => " (SIGSEGV)",
        libc::SIGABRT => " (SIGABRT)",
        libc::SIGTERM => " (SIGTERM)",
        libc::SIGBUS => " (SIGBUS)",
        _ => "",
    }
}

fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(bytes)
}

pub(crate) fn proto(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> KernelError {
    KernelError::Protocol(e.into())
}

fn start_err(reason: String) -> KernelError {
    start_err_help(
        reason,
        "run `ipybox setup` to check the kernel environment, or pass --python PATH",
    )
}

fn start_err_help(reason: String, help: &str) -> KernelError {
    KernelError::Start {
        reason,
        help: help.to_string(),
    }
}
