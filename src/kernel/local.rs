//! A local kernel: an `ipykernel` process on this machine spoken to over ZMQ (IPC sockets in a
//! private directory), and the plain way of starting one.
//!
//! The plain launch runs `python -c <launcher> -f <connection file>` with a minimal environment,
//! the workspace as cwd, stdout discarded and stderr kept as a bounded tail for diagnostics. A
//! watcher task notices the process's exit at once. The kernel never outlives ipybox: it reads
//! its stdin (a pipe from us) in a thread and exits on EOF, and on Linux it also gets
//! `PR_SET_PDEATHSIG`. The kernel factory ([`super::factory`]) starts kernels another way (a fork
//! of a template process) and hands back the same [`Process`], so everything after the start —
//! connecting, the ZMQ link, killing — is shared.
//! (Readiness, the `kernel_info` handshake, is the same for every kernel: [`super::instance`].)

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use jupyter_protocol::connection_info::Transport;
use jupyter_protocol::{ConnectionInfo, JupyterMessage};
use jupyter_zmq_client::{ClientControlConnection, DealerSendConnection};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use super::runtime_dir::KernelDirs;
use super::status::{ExitInfo, describe_exit, start_err, start_err_help};
use super::{KernelConfig, KernelError, ShellApproval, proto};
use crate::child_process::{ChildCommand, StderrTail, host_command, own_group};
use crate::group_leader::GroupLeader;

/// Python run with `-c`: first the working directory goes from `sys.path` (see
/// [`CLEAN_PATH`]), then a stdin watchdog (exit when ipybox goes away), ipykernel's debugger left
/// out (`ipybox_runtime.debugger_off`: ~29 MB of debugpy), the output-flushing ipykernel patch
/// (`ipybox_runtime.output_flush`), then the kernel app. (What needs the kernel
/// running comes in through `exec_lines`, see `startup_line`.)
const LAUNCHER: &str = r#"import os, threading
def _ipybox_watch_parent():
    try:
        while os.read(0, 4096):
            pass
    except OSError:
        pass
    os._exit(0)
threading.Thread(target=_ipybox_watch_parent, name="ipybox-parent-watch", daemon=True).start()
__import__("ipybox_runtime.debugger_off", fromlist=["install"]).install()
__import__("ipybox_runtime.output_flush", fromlist=["install"]).install()
from ipykernel import kernelapp
kernelapp.launch_new_instance()
"#;

/// The kernel process and what watches it, however it was started (a child of ipybox, or forked
/// by the kernel factory's template, [`super::factory`]). Dropping it kills the process group
/// (while ipybox still owns the kernel's pid: see [`Owner`]), stops the watcher tasks, lets go
/// of what kept the kernel alive (the pipe or socket it watches for EOF) and removes the
/// kernel's directory (connection file and IPC socket files).
pub(super) struct Process {
    /// For diagnostics: once the process has ended it may name another one.
    pid: u32,
    owner: Owner,
    exit: watch::Receiver<Option<ExitInfo>>,
    stderr_tail: StderrTail,
    tasks: Vec<JoinHandle<()>>,
    /// Held open: the kernel exits when this closes (ipybox gone). For a child of ipybox, the
    /// pipe on its stdin; for a forked kernel, its socket to ipybox and its template.
    _lifeline: Box<dyn Send + Sync>,
    dir: KernelDirs,
}

/// Who may signal the kernel, and how: never by a pid that may have been reused.
pub(super) enum Owner {
    /// ipybox's child (a launched kernel, or the sandbox wrapper around it), leading its own
    /// process group: signalled as a group until ipybox reaps it, and when it is reaped what
    /// is left of its group is killed ([`GroupLeader`]).
    Child(Arc<GroupLeader>),
    /// A forked kernel, the template's child (ipybox cannot reap it, so cannot hold its pid):
    /// what kills it through its pidfd, never by pid, and has its group killed by whoever can
    /// still tell that group from another's (see `factory/template.rs`).
    Forked(Box<dyn Fn() + Send + Sync>),
}

impl Process {
    /// A running kernel process: `pid` leads its own process group, `owner` says how it is
    /// signalled; `exit` changes when it ends; `tasks` (its watchers) are aborted when it is
    /// dropped.
    pub(super) fn new(
        pid: u32,
        owner: Owner,
        dir: KernelDirs,
        exit: watch::Receiver<Option<ExitInfo>>,
        stderr_tail: StderrTail,
        tasks: Vec<JoinHandle<()>>,
        lifeline: Box<dyn Send + Sync>,
    ) -> Self {
        Self {
            pid,
            owner,
            exit,
            stderr_tail,
            tasks,
            _lifeline: lifeline,
            dir,
        }
    }

    pub(super) fn exited(&self) -> Option<String> {
        self.exit.borrow().as_ref().map(|e| e.0.clone())
    }

    pub(super) fn stderr_suffix(&self) -> String {
        let tail = self.stderr_tail.last_lines();
        if tail.is_empty() {
            String::new()
        } else {
            format!("; kernel stderr:\n{tail}")
        }
    }

    pub(super) fn exited_err(&self) -> KernelError {
        let status = self.exited().unwrap_or_else(|| "exited".into());
        start_err(format!(
            "the kernel process exited ({status}){}",
            self.stderr_suffix()
        ))
    }

    fn kill(&self) {
        match &self.owner {
            // Until ipybox reaps it, the group is the kernel's (under `--sandbox`, the sandbox
            // wrapper's, which holds the kernel); once reaped, its group was killed already and
            // nothing more is sent.
            Owner::Child(leader) => {
                leader.signal(libc::SIGKILL);
            }
            Owner::Forked(kill) => kill(),
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
        for t in &self.tasks {
            t.abort();
        }
        self.dir.remove();
    }
}

/// The ZMQ sockets to a local kernel, and its process. The sockets are declared before the
/// process: they close before the process is reaped.
pub(super) struct LocalLink {
    shell_tx: DealerSendConnection,
    control: ClientControlConnection,
    process: Process,
}

impl LocalLink {
    pub(super) fn pid(&self) -> u32 {
        self.process.pid
    }

    pub(super) fn dir(&self) -> &Path {
        &self.process.dir.host
    }

    pub(super) fn exited(&self) -> Option<String> {
        self.process.exited()
    }

    pub(super) fn exit_watch(&self) -> watch::Receiver<Option<ExitInfo>> {
        self.process.exit.clone()
    }

    pub(super) fn stderr_tail(&self) -> String {
        self.process.stderr_tail.last_lines()
    }

    pub(super) fn exited_err(&self) -> KernelError {
        self.process.exited_err()
    }

    pub(super) async fn send_shell(&mut self, msg: JupyterMessage) -> Result<(), KernelError> {
        self.shell_tx.send(msg).await.map_err(proto)
    }

    /// `interrupt_request` on the control channel (works inside a sandbox, where a host signal
    /// would reach the sandbox wrapper).
    pub(super) async fn interrupt(&mut self) -> Result<(), KernelError> {
        let msg: JupyterMessage = jupyter_protocol::InterruptRequest {}.into();
        self.control.send(msg).await.map_err(proto)
    }

    /// Kills the process group (there is no state worth a graceful shutdown, and ipykernel's
    /// own shutdown sometimes takes ~10 s) and waits up to 2 s for the exit.
    pub(super) async fn shutdown(self) {
        self.process.kill();
        let mut exit = self.process.exit.clone();
        let _ = tokio::time::timeout(Duration::from_secs(2), exit.wait_for(|e| e.is_some())).await;
    }
}

/// What a connected local kernel hands to [`super::instance::Kernel`].
pub(super) struct Connected {
    pub(super) link: LocalLink,
    pub(super) shell_rx: mpsc::UnboundedReceiver<JupyterMessage>,
    pub(super) iopub_rx: mpsc::UnboundedReceiver<JupyterMessage>,
}

/// Writes the connection file (0600, in `dir.host`, where only the host writes) for a kernel:
/// IPC transport, sockets `k-1` … `k-5` in `dir.ipc`, a fresh HMAC key. Returns the connection
/// info and the file's path.
pub(super) fn write_connection(dir: &KernelDirs) -> Result<(ConnectionInfo, PathBuf), KernelError> {
    let info = ConnectionInfo {
        transport: Transport::IPC,
        ip: dir.ipc.join("k").display().to_string(),
        stdin_port: 1,
        control_port: 2,
        hb_port: 3,
        shell_port: 4,
        iopub_port: 5,
        signature_scheme: "hmac-sha256".to_string(),
        key: uuid::Uuid::new_v4().to_string(),
        kernel_name: Some("python3".to_string()),
    };
    let conn_file = dir.host.join("connection.json");
    crate::safe_fs::NoFollowDir::open(&dir.host, None)
        .and_then(|d| {
            d.create_new(
                "connection.json",
                &serde_json::to_vec(&info).map_err(std::io::Error::other)?,
                if dir.owner.is_some() { 0o640 } else { 0o600 },
            )?;
            if let Some((_, gid)) = dir.owner {
                // The kernel (the session's uid) reads it; only its group may.
                std::os::unix::fs::lchown(&conn_file, Some(0), Some(gid))?;
                std::fs::set_permissions(
                    &conn_file,
                    std::os::unix::fs::PermissionsExt::from_mode(0o640),
                )?;
            }
            Ok(())
        })
        .map_err(|e| start_err(format!("cannot write {}: {e}", conn_file.display())))?;
    Ok((info, conn_file))
}

/// Writes the connection file in `dir.host` and starts the kernel process (its IPC sockets go
/// in `dir.ipc`); `pid` receives its id at once, so whoever abandons a launch can wait for the
/// process to end. The returned process guard kills the kernel when dropped.
pub(super) fn spawn(
    config: &KernelConfig,
    dir: KernelDirs,
    pid: &AtomicU32,
) -> Result<(ConnectionInfo, Process), KernelError> {
    let (info, conn_file) = write_connection(&dir)?;
    let mut child = spawn_process(config, &conn_file, &dir.host)?;
    let mut tasks = Vec::new();
    let mut stderr_tail = StderrTail::default();
    if let Some(stderr) = child.stderr.take() {
        let (tail, reader) = StderrTail::capture(stderr);
        stderr_tail = tail;
        tasks.push(reader);
    }
    let stdin = child.stdin.take();
    let leader = GroupLeader::adopt(child);
    let child_pid = leader.pid();
    pid.store(child_pid, Ordering::SeqCst);
    let (exit_tx, exit_rx) = watch::channel(None);
    let watched = leader.clone();
    tasks.push(tokio::spawn(async move {
        let desc = match watched.wait().await {
            Some(s) => describe_exit(s),
            None => "unknown exit status".to_string(),
        };
        let _ = exit_tx.send(Some(ExitInfo(desc)));
    }));
    let process = Process::new(
        child_pid,
        Owner::Child(leader),
        dir,
        exit_rx,
        stderr_tail,
        tasks,
        Box::new(stdin),
    );
    Ok((info, process))
}

/// Waits for the socket files and connects shell/iopub/control.
pub(super) async fn connect(
    info: &ConnectionInfo,
    mut process: Process,
) -> Result<Connected, KernelError> {
    let ports = [info.shell_port, info.iopub_port, info.control_port];
    // Sockets, not links to somewhere else (the kernel can write its IPC directory).
    let is_socket = |p: &u16| {
        use std::os::unix::fs::FileTypeExt;
        std::fs::symlink_metadata(format!("{}-{p}", info.ip))
            .is_ok_and(|m| m.file_type().is_socket())
    };
    while !ports.iter().all(is_socket) {
        if process.exited().is_some() {
            return Err(process.exited_err());
        }
        // A forked kernel binds its sockets ~20 ms after it starts: poll finely.
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let session_id = uuid::Uuid::new_v4().to_string();
    let identity = jupyter_zmq_client::peer_identity_for_session(&session_id).map_err(proto)?;
    let (shell, mut iopub, control) = tokio::try_join!(
        async {
            jupyter_zmq_client::create_client_shell_connection_with_identity(
                info,
                &session_id,
                identity,
            )
            .await
            .map_err(proto)
        },
        async {
            jupyter_zmq_client::create_client_iopub_connection(info, "", &session_id)
                .await
                .map_err(proto)
        },
        async {
            jupyter_zmq_client::create_client_control_connection(info, &session_id)
                .await
                .map_err(proto)
        },
    )?;
    let (shell_tx, mut shell_read) = shell.split();

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
                // The error quotes what the kernel sent: escaped.
                Err(e) => {
                    tracing::warn!(error = ?e.to_string(), "dropping an unreadable iopub message")
                }
            }
        }
    }));
    Ok(Connected {
        link: LocalLink {
            shell_tx,
            control,
            process,
        },
        shell_rx,
        iopub_rx,
    })
}

/// The line the kernel runs once it is up (ipykernel's `exec_lines`), if any: the
/// working-directory guard (`restore_cwd`) and shell-command approval. `__import__` binds no name
/// in the user's namespace.
fn startup_line(config: &KernelConfig) -> String {
    // A JSON list of strings is a valid Python list literal.
    let dirs = serde_json::to_string(&super::kernel_env::import_path_after_start(config))
        .unwrap_or_else(|_| "[]".into());
    let mut parts = vec![format!(
        "__import__('ipybox_runtime.import_path', fromlist=['install']).install({dirs})"
    )];
    if config.restore_cwd {
        // A JSON string is a valid Python string literal.
        let dir = serde_json::to_string(&config.cwd().display().to_string())
            .unwrap_or_else(|_| "'.'".into());
        parts.push(format!(
            "__import__('ipybox_runtime.working_dir', fromlist=['install']).install({dir})"
        ));
    }
    if let Some(socket) = config.env.get(crate::confine::network::EGRESS_SOCKET_ENV) {
        // `--session-network proxy`: the bridge to ipybox's egress proxy, before any cell.
        let socket = serde_json::to_string(socket).unwrap_or_else(|_| "''".into());
        parts.push(format!(
            "__import__('ipybox_runtime.net_bridge', fromlist=['install']).install({}, {socket})",
            crate::confine::network::BRIDGE_PORT
        ));
    }
    if let ShellApproval::On { require_escape } = config.shell_approval {
        let flag = if require_escape { "True" } else { "False" };
        parts.push(format!(
            "__import__('ipybox_runtime.shell_guard', fromlist=['install']).install({flag})"
        ));
    }
    parts.join("; ")
}

/// The first statement of every `python -c` ipybox runs as a kernel or template: `-c` puts the
/// working directory (`''`) first on `sys.path`, and the working directory is the workspace,
/// which a sandboxed kernel can write; a module there (`threading.py`, `ipykernel/`,
/// `ipybox_runtime/`) would shadow what the launcher imports next. `sys` is built in: importing
/// it looks nothing up.
pub(crate) const CLEAN_PATH: &str = "import sys; sys.path[:] = [p for p in sys.path if p]";

/// The kernel app's arguments (what follows `python -c CODE`), for a launched or a forked kernel
/// alike.
pub(super) fn kernel_args(config: &KernelConfig, conn_file: &Path) -> Vec<String> {
    vec![
        "-f".to_string(),
        conn_file.display().to_string(),
        "--IPKernelApp.quiet=True".to_string(),
        "--HistoryManager.enabled=False".to_string(),
        // ipykernel sleeps 0.5 ms before every execute_reply so that clients which stop at the
        // reply see trailing output; ipybox waits for the idle status instead, so it need not.
        "--IPythonKernel._execute_sleep=0".to_string(),
        "--InteractiveShell.colors=nocolor".to_string(),
        "--InteractiveShell.xmode=Context".to_string(),
        // The working directory is not put back on `sys.path`: the workspace goes at its end,
        // after start (`startup_line`).
        "--IPKernelApp.ignore_cwd=True".to_string(),
        format!("--IPKernelApp.exec_lines={}", startup_line(config)),
    ]
}

/// Starts `argv` (a kernel, or the kernel factory's template) the way every kernel process
/// starts: wrapped by `config.wrapper` (the sandbox), the kernel environment and nothing else
/// of the host, the workspace as cwd, stdin a pipe from ipybox (held by the caller: the process
/// exits on its EOF), stdout discarded, stderr piped, leader of its own process group, and on
/// Linux `PR_SET_PDEATHSIG`. The caller takes its stdio and hands it to a [`GroupLeader`] at
/// once (the one place it is reaped). `private_dir` is a host-only directory of this process's own,
/// where the sandbox wrapper leaves the environment file it hands the sandbox.
pub(super) fn spawn_kernel_command(
    config: &KernelConfig,
    argv: Vec<String>,
    private_dir: &Path,
) -> Result<tokio::process::Child, KernelError> {
    let mut command = ChildCommand {
        argv,
        env: super::kernel_env::local(config),
        cwd: config.cwd().to_path_buf(),
        private_dir: private_dir.to_path_buf(),
    };
    if let Some(wrap) = &config.wrapper {
        command = (wrap.0)(command).map_err(|e| {
            start_err_help(
                format!("cannot prepare the sandboxed kernel's command: {e}"),
                "check that the runtime directory (XDG_RUNTIME_DIR or TMPDIR) is writable",
            )
        })?;
    }
    let argv = std::mem::take(&mut command.argv);
    let mut cmd = host_command(&argv[0]);
    // The kernel's working directory is the workspace (or a confined kernel's own directory):
    // its code runs there (unsandboxed, it is the user's own process; sandboxed, this starts
    // srt, which anchors its policy on its working directory and reads no code from it, see
    // docs/sandbox.md; confined, bwrap changes to it inside).
    cmd.args(&argv[1..])
        .env_clear()
        .envs(std::mem::take(&mut command.env))
        .current_dir(&command.cwd)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    own_group(&mut cmd);
    // The session's cgroup (or resource limits) before the kernel runs anything: its
    // `cgroup.procs` files opened now, written (`0`: the child itself) between fork and exec,
    // so that bwrap and every process it starts are in the cgroup.
    let (cgroup_procs, rlimits) = match &config.limits {
        Some(limits) => (
            match &limits.cgroup {
                Some(cg) => cg.open_procs().map_err(|e| {
                    start_err_help(
                        format!("cannot open the session's cgroup: {e}"),
                        "check that ipybox may write its cgroups (see the log line `session limits` at start)",
                    )
                })?,
                None => Vec::new(),
            },
            limits.rlimits,
        ),
        None => (Vec::new(), None),
    };
    // SAFETY: prctl, write and setrlimit are async-signal-safe; runs in the child between fork
    // and exec.
    unsafe {
        cmd.pre_exec(move || {
            // Linux only: the kernel dies with ipybox (elsewhere it exits when its stdin closes).
            #[cfg(target_os = "linux")]
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            crate::confine::cgroup::join_in_child(&cgroup_procs)?;
            if let Some(r) = &rlimits {
                r.apply_in_child()?;
            }
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

fn spawn_process(
    config: &KernelConfig,
    conn_file: &Path,
    private_dir: &Path,
) -> Result<tokio::process::Child, KernelError> {
    let mut argv = vec![
        config.python.display().to_string(),
        "-c".to_string(),
        format!("{CLEAN_PATH}\n{LAUNCHER}"),
    ];
    argv.extend(kernel_args(config, conn_file));
    spawn_kernel_command(config, argv, private_dir)
}
