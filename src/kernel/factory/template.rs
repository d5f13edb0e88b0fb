//! One template process and the kernels it forks (the Python side is
//! `python/ipybox_runtime/factory.py`, whose docstring has the protocol and the safety argument).
//!
//! The template is started like a kernel ([`local::spawn_kernel_command`]: the kernel
//! environment, the sandbox wrapper, its own process group, `PR_SET_PDEATHSIG`), so it is
//! ipybox's child, held by a [`GroupLeader`]: its group is signalled only until it is reaped.
//! It connects to the factory socket once its imports are done: that connection carries fork
//! requests and the template's replies (`forked` with the child's pid, `refused` with a reason,
//! `exit` with a child's status once it has reaped it).
//!
//! A forked kernel is the template's child, not ours. It connects to the factory socket itself;
//! from that connection ipybox learns its pid (`SO_PEERCRED`, valid in ipybox's pid namespace
//! also for a sandboxed kernel) and keeps its write end as the kernel's lifeline (the kernel
//! exits on EOF) and its read end as the kernel's stderr. Its end is noticed with a pidfd
//! ([`PidFd::exited`]); its status is the one the template reports (or "unknown" if the
//! template is gone by then). ipybox never signals a forked kernel by pid or group id: it kills
//! the kernel through its pidfd, and the template, its parent, kills what is left of its group
//! when it reaps it, while the kernel is still a zombie (`factory.py`); only when the template
//! is gone does ipybox kill the group's members itself, one pidfd each
//! ([`kill_group_members`]). Each kernel holds its template (`Arc`): a template is killed when
//! it is neither the factory's current one nor the template of a running kernel, because under
//! `--sandbox` its kernels live in its sandbox and would die with it.
//!
//! Not here: when templates are built and replaced, and the fallback ([`super`]).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use jupyter_protocol::ConnectionInfo;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::OwnedWriteHalf;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

use super::listener::Listener;
use crate::child_process::{PidFd, StderrTail, kill_group_members, parent_of};
use crate::group_leader::GroupLeader;
use crate::kernel::local::{self, Process};
use crate::kernel::runtime_dir::KernelDirs;
use crate::kernel::status::{ExitInfo, describe_code, describe_exit, start_err_help};
use crate::kernel::{KernelConfig, KernelError};

/// Python run with `-c` by the template process.
/// (After [`local::CLEAN_PATH`]: nothing from the working directory, the workspace, is imported.)
const BOOT: &str = "from ipybox_runtime.factory import main; main()";

/// The data libraries a template imports once idle when `IPYBOX_KERNEL_PRELOAD` is not set
/// (each only if the kernel environment has it; ipybox's managed environment has neither).
pub(crate) const DEFAULT_PRELOAD: &str = "numpy,pandas";

/// The modules the template imports once idle (`factory.py`, "MODULES"), comma-separated:
/// `IPYBOX_KERNEL_PRELOAD` from ipybox's environment (empty, `0`, `off`, `none`: none), else
/// [`DEFAULT_PRELOAD`]. A name that is not a dotted module name is left out with a warning.
pub(crate) fn preload_modules(host: &crate::host_env::HostEnv) -> String {
    let Some(value) = host.vars().get("IPYBOX_KERNEL_PRELOAD") else {
        return DEFAULT_PRELOAD.to_string();
    };
    if matches!(
        value.trim().to_ascii_lowercase().as_str(),
        "" | "0" | "off" | "none" | "no" | "false"
    ) {
        return String::new();
    }
    let mut names = Vec::new();
    for name in value.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        let valid = name.split('.').all(|part| {
            let mut chars = part.chars();
            chars
                .next()
                .is_some_and(|c| c == '_' || c.is_ascii_alphabetic())
                && chars.all(|c| c == '_' || c.is_ascii_alphanumeric())
        });
        if valid {
            names.push(name);
        } else {
            tracing::warn!(
                "IPYBOX_KERNEL_PRELOAD: {} is not a module name (dotted identifiers, comma-separated); left out",
                printable(name)
            );
        }
    }
    names.join(",")
}

/// How long the template may take to answer a fork request (it answers right after `fork()`).
const REPLY_TIMEOUT: Duration = Duration::from_secs(10);

/// The longest line the template may send: a longer one means a broken (or hostile) template,
/// whose channel is then closed rather than buffered without end.
const MAX_LINE: usize = 64 * 1024;

/// How long a request may take to write: a template that stops reading is broken.
const SEND_TIMEOUT: Duration = Duration::from_secs(5);

/// How much of what the template said goes into a log line or an error message.
const MAX_SHOWN: usize = 300;

/// How long after a forked kernel ended its status may take to arrive from the template.
const STATUS_GRACE: Duration = Duration::from_millis(500);

/// What ipybox says when it gives up on the factory for one kernel.
const HELP: &str = "ipybox starts the kernel without the factory when this happens; set IPYBOX_KERNEL_FACTORY=0 to always do so";

#[derive(Serialize)]
#[serde(tag = "op", rename_all = "lowercase")]
enum Request<'a> {
    /// Fork a kernel that runs the kernel app with `argv` in `cwd`; a template shared by
    /// several executors also gets the kernel's environment (`env`, else the template's own)
    /// and, for a confined executor, what the kernel confines itself with (`confine`).
    Fork {
        id: &'a str,
        argv: Vec<String>,
        cwd: &'a std::path::Path,
        #[serde(skip_serializing_if = "Option::is_none")]
        env: Option<std::collections::BTreeMap<String, String>>,
        #[serde(skip_serializing_if = "Option::is_none")]
        confine: Option<&'a serde_json::Value>,
        /// The forked process waits, once connected, for one byte from ipybox before it goes
        /// on: ipybox places it in the session's cgroup first (`confine::cgroup`).
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        hold: bool,
        /// Resource limits the forked process sets on itself (no cgroups here).
        #[serde(skip_serializing_if = "Option::is_none")]
        rlimits: Option<crate::confine::limits::Rlimits>,
    },
    /// Kill the kernel forked for request `id` (one ipybox gave up on before it connected),
    /// with its process group, if the template has not reaped it.
    Kill { id: &'a str },
}

#[derive(Deserialize)]
#[serde(tag = "op", rename_all = "lowercase")]
enum Message {
    Forked {
        id: String,
    },
    Refused {
        id: String,
        reason: String,
    },
    Exit {
        id: String,
        code: i32,
    },
    /// The template is importing one of its preloaded data libraries (`IPYBOX_KERNEL_PRELOAD`):
    /// a fork request waits until that import ends.
    Preloading,
    /// It is done with that import.
    Preloaded,
}

/// The template's answer to one fork request.
enum Reply {
    Forked,
    Refused(String),
}

/// What the channel reader shares with fork requests.
#[derive(Default)]
struct Routes {
    replies: HashMap<String, oneshot::Sender<Reply>>,
    /// The reported exit status of each forked kernel (by request id) that has not been reported
    /// yet. Dropped (receivers see the sender gone) when the template's channel ends.
    exits: HashMap<String, watch::Sender<Option<i32>>>,
}

/// A running template. Dropping it kills its process group (unless ipybox has reaped it, when
/// what was left of the group was killed already).
pub(crate) struct Template {
    /// The process ipybox started (the template, or under `--sandbox` srt around it).
    leader: Arc<GroupLeader>,
    /// The template's Python process, the one that connected (`SO_PEERCRED`): the parent of
    /// every kernel it forks. (Under `--sandbox`, a descendant of `pid`, the sandbox wrapper.)
    python: PidFd,
    exit: watch::Receiver<Option<ExitInfo>>,
    stderr: StderrTail,
    writer: tokio::sync::Mutex<Option<OwnedWriteHalf>>,
    routes: Arc<Mutex<Routes>>,
    /// True once the channel to the template has ended.
    closed: watch::Receiver<bool>,
    /// True once a request could not be written within [`SEND_TIMEOUT`].
    stalled: std::sync::atomic::AtomicBool,
    /// True while the template imports a preloaded data library (it answers no request then).
    preloading: Arc<std::sync::atomic::AtomicBool>,
    listener: Arc<Listener>,
    tasks: Vec<JoinHandle<()>>,
    _stdin: Option<tokio::process::ChildStdin>,
    _dir: TemplateDir,
}

/// The template's host-only directory (under `<runtime>/kernels/`), removed with it.
struct TemplateDir(PathBuf);

impl TemplateDir {
    fn create(dir: PathBuf) -> Result<Self, KernelError> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .mode(0o700)
            .recursive(true)
            .create(&dir)
            .map_err(|e| start_err_help(format!("cannot create {}: {e}", dir.display()), HELP))?;
        Ok(Self(dir))
    }
}

impl Drop for TemplateDir {
    fn drop(&mut self) {
        let _ = crate::safe_fs::remove_path_tree(&self.0);
    }
}

impl std::fmt::Debug for Template {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Template")
            .field("pid", &self.leader.pid())
            .finish()
    }
}

fn lock(routes: &Mutex<Routes>) -> std::sync::MutexGuard<'_, Routes> {
    routes.lock().unwrap_or_else(|p| p.into_inner())
}

/// Kills a template's process group if its start is abandoned or fails (unless it was reaped).
struct GroupGuard(Option<Arc<GroupLeader>>);

impl Drop for GroupGuard {
    fn drop(&mut self) {
        if let Some(leader) = &self.0 {
            leader.signal(libc::SIGKILL);
        }
    }
}

impl Template {
    /// Starts a template for `config` and waits until it has done its imports and connected
    /// (within `config.start_timeout`).
    /// `dir` is a fresh host-only directory of the template's own (the sandbox wrapper leaves
    /// its environment file there), removed with the template.
    pub(super) async fn start(
        config: &KernelConfig,
        listener: Arc<Listener>,
        dir: PathBuf,
    ) -> Result<Template, KernelError> {
        let mut expected = listener.expect();
        let argv = vec![
            config.python.display().to_string(),
            "-c".to_string(),
            format!("{}; {BOOT}", local::CLEAN_PATH),
            listener.path().display().to_string(),
            expected.token.clone(),
            preload_modules(&config.host),
        ];
        let dir = TemplateDir::create(dir)?;
        let mut child = local::spawn_kernel_command(config, argv, &dir.0)?;
        let mut tasks = Vec::new();
        let mut stderr = StderrTail::default();
        if let Some(err) = child.stderr.take() {
            let (tail, reader) = StderrTail::capture(err);
            stderr = tail;
            tasks.push(reader);
        }
        let stdin = child.stdin.take();
        let leader = GroupLeader::adopt(child);
        let pid = leader.pid();
        let mut guard = GroupGuard(Some(leader.clone()));
        let (exit_tx, mut exit) = watch::channel(None);
        let watched = leader.clone();
        tasks.push(tokio::spawn(async move {
            let desc = match watched.wait().await {
                Some(s) => describe_exit(s),
                None => "unknown exit status".to_string(),
            };
            let _ = exit_tx.send(Some(ExitInfo(desc)));
        }));
        let abort = |tasks: &[JoinHandle<()>]| tasks.iter().for_each(JoinHandle::abort);
        let hello = tokio::select! {
            hello = expected.hello() => hello,
            _ = exit.wait_for(|e| e.is_some()) => None,
            _ = tokio::time::sleep(config.start_timeout) => {
                abort(&tasks);
                return Err(start_err_help(
                    format!("the kernel factory's template did not start within {} s{}", config.start_timeout.as_secs(), suffix(&stderr)),
                    HELP,
                ));
            }
        };
        let Some(hello) = hello else {
            // Let the exit status and the last stderr lines arrive.
            let _ =
                tokio::time::timeout(Duration::from_secs(1), exit.wait_for(|e| e.is_some())).await;
            tokio::time::sleep(Duration::from_millis(20)).await;
            let status = exit.borrow().as_ref().map_or("?".into(), |e| e.0.clone());
            abort(&tasks);
            return Err(start_err_help(
                format!(
                    "the kernel factory's template exited ({status}){}",
                    suffix(&stderr)
                ),
                HELP,
            ));
        };
        let python = match verify_template(hello.pid, pid) {
            Ok(python) => python,
            Err(why) => {
                abort(&tasks);
                return Err(start_err_help(why, HELP));
            }
        };
        guard.0 = None;
        let routes: Arc<Mutex<Routes>> = Arc::default();
        let (closed_tx, closed) = watch::channel(false);
        let reader_routes = routes.clone();
        let preloading = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let reader_preloading = preloading.clone();
        let mut reader = hello.reader;
        tasks.push(tokio::spawn(async move {
            let mut line = Vec::new();
            loop {
                match read_line(&mut reader, &mut line).await {
                    Line::Read => {}
                    Line::End => break,
                    Line::TooLong => {
                        tracing::warn!(
                            "kernel factory: the template sent a line longer than {MAX_LINE} bytes; closing its channel (a new template is built for the next kernel)"
                        );
                        break;
                    }
                }
                let msg = match serde_json::from_slice::<Message>(&line) {
                    Ok(msg) => msg,
                    Err(e) => {
                        tracing::warn!(
                            "kernel factory: unreadable message from the template ({e}): {}",
                            printable(&String::from_utf8_lossy(&line))
                        );
                        continue;
                    }
                };
                let mut routes = lock(&reader_routes);
                match msg {
                    Message::Preloading => reader_preloading.store(true, Ordering::SeqCst),
                    Message::Preloaded => reader_preloading.store(false, Ordering::SeqCst),
                    Message::Forked { id } => {
                        if let Some(tx) = routes.replies.remove(&id) {
                            let _ = tx.send(Reply::Forked);
                        }
                    }
                    Message::Refused { id, reason } => {
                        if let Some(tx) = routes.replies.remove(&id) {
                            let _ = tx.send(Reply::Refused(printable(&reason)));
                        }
                    }
                    Message::Exit { id, code } => {
                        if let Some(tx) = routes.exits.remove(&id) {
                            tx.send_replace(Some(code));
                        }
                    }
                }
            }
            // The template is gone (or closed its channel): nothing more will be reported.
            let mut routes = lock(&reader_routes);
            routes.replies.clear();
            routes.exits.clear();
            let _ = closed_tx.send(true);
        }));
        Ok(Template {
            leader,
            python,
            exit,
            stderr,
            writer: tokio::sync::Mutex::new(Some(hello.writer)),
            routes,
            closed,
            stalled: std::sync::atomic::AtomicBool::new(false),
            preloading,
            listener,
            tasks,
            _stdin: stdin,
            _dir: dir,
        })
    }

    /// The template's process id (its sandbox wrapper's under `--sandbox`), for logs: once the
    /// template has ended it may name another process.
    pub(crate) fn pid(&self) -> u32 {
        self.leader.pid()
    }

    /// A receiver that changes when the template's process (the one ipybox started) has ended
    /// and been reaped.
    pub(super) fn exit_watch(&self) -> watch::Receiver<Option<ExitInfo>> {
        self.exit.clone()
    }

    /// Why the template can no longer fork, if it cannot.
    pub(super) fn broken(&self) -> Option<String> {
        if let Some(e) = self.exit.borrow().as_ref() {
            return Some(format!(
                "the template process exited ({}){}",
                e.0,
                suffix(&self.stderr)
            ));
        }
        if *self.closed.borrow() {
            return Some("the template closed its connection to ipybox".into());
        }
        if self.stalled.load(Ordering::SeqCst) {
            return Some(format!(
                "the template stopped reading its requests (one took over {} s to send)",
                SEND_TIMEOUT.as_secs()
            ));
        }
        None
    }

    /// Forks a kernel for `config` in `dir` and waits until it connected back; `pid` receives
    /// its process id then. The kernel is not yet ready: connect and handshake as for any
    /// local kernel.
    pub(crate) async fn fork(
        self: &Arc<Self>,
        config: &KernelConfig,
        dir: KernelDirs,
        pid: &AtomicU32,
    ) -> Result<(ConnectionInfo, Process), KernelError> {
        let fail = |reason: String| start_err_help(reason, HELP);
        if let Some(why) = self.broken() {
            return Err(fail(format!("cannot fork: {why}")));
        }
        let (info, conn_file) = local::write_connection(&dir)?;
        let mut expected = self.listener.expect();
        let id = expected.token.clone();
        let (reply_tx, reply_rx) = oneshot::channel();
        let (status_tx, mut status) = watch::channel(None);
        {
            let mut routes = lock(&self.routes);
            routes.replies.insert(id.clone(), reply_tx);
            routes.exits.insert(id.clone(), status_tx);
        }
        // Forgets this request's routes however the fork ends (the exit route stays while the
        // kernel runs: the status receiver keeps it wanted).
        struct Forget<'a>(&'a Mutex<Routes>, &'a str, bool);
        impl Drop for Forget<'_> {
            fn drop(&mut self) {
                let mut routes = lock(self.0);
                routes.replies.remove(self.1);
                if self.2 {
                    routes.exits.remove(self.1);
                }
            }
        }
        let mut forget = Forget(&self.routes, &id, true);
        // Only a confined kernel applies limits (it alone knows to wait for the go-ahead).
        let limits = config
            .limits
            .as_ref()
            .filter(|_| config.shared.as_ref().is_some_and(|s| s.confine.is_some()));
        let cgroup = limits.and_then(|l| l.cgroup.clone());

        let request = Request::Fork {
            id: &id,
            argv: local::kernel_args(config, &conn_file),
            cwd: config.cwd(),
            env: config.shared.as_ref().map(|_| {
                crate::kernel::kernel_env::local(config)
                    .into_iter()
                    .collect()
            }),
            confine: config.shared.as_ref().and_then(|s| s.confine.as_deref()),
            hold: cgroup.is_some(),
            rlimits: limits.and_then(|l| l.rlimits),
        };
        self.send(&request)
            .await
            .map_err(|e| fail(format!("cannot reach the template: {e}")))?;
        // Until the kernel has connected, giving up on it (an error below, or this future
        // dropped) has the template kill it: ipybox does not know its pid yet.
        let mut unclaimed = Unclaimed {
            template: self.clone(),
            id: id.clone(),
            armed: false,
        };
        self.fork_reply(reply_rx, config).await.map_err(fail)?;
        unclaimed.armed = true;
        let hello = tokio::select! {
            hello = expected.hello() => hello,
            _ = status.changed() => None,
            _ = tokio::time::sleep(config.start_timeout) => None,
        };
        let Some(hello) = hello else {
            return Err(fail(self.not_connected(*status.borrow(), config)));
        };
        let Some(kernel_pid) = hello.pid.filter(|p| *p > 1) else {
            return Err(fail(
                "cannot tell the forked kernel's process id (SO_PEERCRED)".into(),
            ));
        };
        // Under --sandbox the template is hostile code: the connection may come from any
        // process of the sandbox, which may exit at once so that its pid goes to a host process.
        // Only a live child of the template is taken, held by a pidfd from now on.
        let pidfd = Arc::new(verify_forked(kernel_pid, &self.python).map_err(fail)?);
        let mut writer = hello.writer;
        if let Some(cgroup) = &cgroup {
            // Into the session's cgroup before it forks its namespace's pid 1 and the kernel
            // (they inherit it), then the go-ahead.
            cgroup.place(kernel_pid).map_err(|e| fail(e.to_string()))?;
            writer
                .write_all(&[1])
                .await
                .map_err(|e| fail(format!("cannot tell the forked kernel to go on: {e}")))?;
        }
        unclaimed.armed = false;
        forget.2 = false;
        drop(forget);
        pid.store(kernel_pid, Ordering::SeqCst);

        let (stderr_tail, reader) = StderrTail::capture(hello.reader);
        let (exit_rx, watcher) = self.watch_exit(pidfd.clone(), status, id);
        let lifeline: Box<dyn Send + Sync> = Box::new((writer, self.clone()));
        Ok((
            info,
            Process::new(
                kernel_pid,
                local::Owner::Forked(self.kill_forked(pidfd)),
                dir,
                exit_rx,
                stderr_tail,
                vec![reader, watcher],
                lifeline,
            ),
        ))
    }

    /// The template's answer to a fork request: forked, or why not (refused, lost, silent).
    async fn fork_reply(
        &self,
        mut reply_rx: oneshot::Receiver<Reply>,
        config: &KernelConfig,
    ) -> Result<(), String> {
        let mut reply = tokio::time::timeout(REPLY_TIMEOUT, &mut reply_rx).await;
        if reply.is_err() && self.preloading.load(Ordering::SeqCst) {
            // Busy importing a preloaded library (seconds on a loaded machine): it forks when
            // that import ends. Bounded like a kernel's start.
            reply = tokio::time::timeout(config.start_timeout, &mut reply_rx).await;
        }
        match reply {
            Ok(Ok(Reply::Forked)) => Ok(()),
            Ok(Ok(Reply::Refused(reason))) => {
                Err(format!("the template refused to fork: {reason}"))
            }
            Ok(Err(_)) => Err(format!(
                "the template was lost while forking: {}",
                self.broken()
                    .unwrap_or_else(|| "the connection closed".into())
            )),
            Err(_) => Err(format!(
                "the template did not answer a fork request within {} s",
                if self.preloading.load(Ordering::SeqCst) {
                    REPLY_TIMEOUT + config.start_timeout
                } else {
                    REPLY_TIMEOUT
                }
                .as_secs()
            )),
        }
    }

    /// Why a forked kernel did not connect: it exited (`status`, as the template reported it),
    /// the template broke, or time ran out.
    fn not_connected(&self, status: Option<i32>, config: &KernelConfig) -> String {
        match status {
            Some(code) => format!(
                "the forked kernel exited before it connected ({}){}",
                describe_code(code),
                suffix(&self.stderr)
            ),
            None => self.broken().unwrap_or_else(|| {
                format!(
                    "the forked kernel did not connect within {} s",
                    config.start_timeout.as_secs()
                )
            }),
        }
    }

    /// Watches a forked kernel's end (its pidfd) and words it from what the template reports
    /// (`status`, waited for a grace period); its exit route `id` is forgotten then.
    fn watch_exit(
        &self,
        watched: Arc<PidFd>,
        mut status: watch::Receiver<Option<i32>>,
        id: String,
    ) -> (
        watch::Receiver<Option<ExitInfo>>,
        tokio::task::JoinHandle<()>,
    ) {
        let (exit_tx, exit_rx) = watch::channel(None);
        let routes = self.routes.clone();
        let watcher = tokio::spawn(async move {
            watched.exited().await;
            let reported = tokio::time::timeout(STATUS_GRACE, status.wait_for(Option::is_some))
                .await
                .ok()
                .and_then(Result::ok)
                .and_then(|code| *code);
            lock(&routes).exits.remove(&id);
            let desc = match reported {
                Some(code) => describe_code(code),
                None => "exit status unknown: the kernel factory's template did not report it"
                    .to_string(),
            };
            let _ = exit_tx.send(Some(ExitInfo(desc)));
        });
        (exit_rx, watcher)
    }

    /// What kills a kernel this template forked (`kernel`, its pidfd) with its process group,
    /// never by a pid that may have been reused. The kernel is not ipybox's child, so ipybox
    /// cannot hold it as a zombie: once it has exited, its parent may reap it at any moment and
    /// its pid (its group id) may go to any process. So:
    /// - the kernel itself is killed through its pidfd (`pidfd_send_signal`: that process or
    ///   none);
    /// - its group is killed by the template, its parent, when it reaps the kernel, while the
    ///   kernel is still a zombie (`factory.py`): the group id is certainly the kernel's then;
    /// - if the template's process is gone (an unsandboxed template killed while its kernels run:
    ///   they now belong to init, which reaps without killing groups), ipybox kills the group's
    ///   other members itself, each through a pidfd and only while the kernel runs
    ///   ([`kill_group_members`]), before the kernel. (Under `--sandbox` the kernel and its
    ///   group died with the template: the sandbox's pid namespace ended.)
    fn kill_forked(self: &Arc<Self>, kernel: Arc<PidFd>) -> Box<dyn Fn() + Send + Sync> {
        let template = Arc::downgrade(self);
        Box::new(move || {
            let template_gone = template.upgrade().is_none_or(|t| !t.python.alive());
            if template_gone {
                kill_group_members(&kernel);
            }
            kernel.send_signal(libc::SIGKILL);
        })
    }

    /// Writes one request to the template, within [`SEND_TIMEOUT`] (lock included): a template
    /// that stops reading is broken, and its channel is closed.
    async fn send(&self, request: &Request<'_>) -> std::io::Result<()> {
        let mut line = serde_json::to_vec(request).map_err(std::io::Error::other)?;
        line.push(b'\n');
        let write = async {
            let mut writer = self.writer.lock().await;
            let result = match writer.as_mut() {
                Some(w) => tokio::time::timeout(SEND_TIMEOUT, w.write_all(&line)).await,
                None => return Err(std::io::Error::other("the template is shut down")),
            };
            result.unwrap_or_else(|_| {
                // Part of the line may have been written: the channel is of no more use.
                self.stalled.store(true, Ordering::SeqCst);
                writer.take();
                Err(std::io::Error::other(format!(
                    "the template did not read a request within {} s",
                    SEND_TIMEOUT.as_secs()
                )))
            })
        };
        match tokio::time::timeout(SEND_TIMEOUT * 2, write).await {
            Ok(result) => result,
            Err(_) => Err(std::io::Error::other(
                "another request to the template is stuck",
            )),
        }
    }

    /// Closes the channel (the template kills the kernels it forked that still run, and exits),
    /// then waits up to `within` for the template to end; kills its group if it has not. Waits
    /// for a request being written no longer than `within` either.
    pub(super) async fn close(&self, within: Duration) {
        if let Ok(mut writer) = tokio::time::timeout(within, self.writer.lock()).await {
            writer.take();
        }
        let mut exit = self.exit.clone();
        let _ = tokio::time::timeout(within, exit.wait_for(|e| e.is_some())).await;
        self.leader.signal(libc::SIGKILL);
    }
}

impl Drop for Template {
    fn drop(&mut self) {
        // Its kernels are gone (each held it); what is left is the template and, under
        // --sandbox, the sandbox wrapper around it (unless it ended and was reaped: then its
        // group was killed when it was, and nothing is sent now).
        self.leader.signal(libc::SIGKILL);
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// A forked kernel that has not connected yet: if ipybox gives up on it, the template kills it.
struct Unclaimed {
    template: Arc<Template>,
    id: String,
    armed: bool,
}

impl Drop for Unclaimed {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let template = self.template.clone();
        let id = std::mem::take(&mut self.id);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = template.send(&Request::Kill { id: &id }).await;
            });
        }
    }
}

/// How many parents up from the process that connected as the template ipybox's child (the
/// template, or its sandbox wrapper) may be (srt, bubblewrap and a shell sit in between).
const MAX_WRAPPER_DEPTH: usize = 16;

/// The process that connected as the template (`peer`, from `SO_PEERCRED`), held by a pidfd,
/// if it is alive and descends from `child`, the process ipybox started.
fn verify_template(peer: Option<u32>, child: u32) -> Result<PidFd, String> {
    let peer = peer.filter(|p| *p > 1).ok_or_else(|| {
        "cannot tell the kernel factory's template's process id (SO_PEERCRED)".to_string()
    })?;
    let python = PidFd::open(peer)
        .ok_or_else(|| format!("the kernel factory's template (pid {peer}) exited at once"))?;
    let mut p = peer;
    let mut descends = false;
    for _ in 0..=MAX_WRAPPER_DEPTH {
        if p == child {
            descends = true;
            break;
        }
        match parent_of(p) {
            Some(parent) if parent > 1 => p = parent,
            _ => break,
        }
    }
    // Checked after reading /proc: what was read was about this very process.
    if !python.alive() {
        return Err(format!(
            "the kernel factory's template (pid {peer}) exited at once"
        ));
    }
    if !descends {
        return Err(format!(
            "the process that connected as the kernel factory's template (pid {peer}) is not one ipybox started (pid {child})"
        ));
    }
    Ok(python)
}

/// A pidfd for `pid`, the process that connected as a forked kernel, if it is a live child of
/// the template's Python process (`template`). Refused otherwise: its pid could name another
/// process by the time ipybox signals its group.
fn verify_forked(pid: u32, template: &PidFd) -> Result<PidFd, String> {
    let fd = PidFd::open(pid).ok_or_else(|| {
        format!("the forked kernel (pid {pid}) exited as it connected (or this Linux lacks pidfd_open, 5.3+)")
    })?;
    let parent = parent_of(pid);
    // Checked after reading /proc: both pids still named the same processes when it was read.
    if !fd.alive() {
        return Err(format!(
            "the forked kernel (pid {pid}) exited as it connected"
        ));
    }
    if !template.alive() {
        return Err("the template exited while forking".into());
    }
    if parent != Some(template.pid()) {
        return Err(format!(
            "the process that connected as the forked kernel (pid {pid}, parent {}) is not a child of the template (pid {})",
            parent.map_or("unknown".into(), |p| p.to_string()),
            template.pid()
        ));
    }
    Ok(fd)
}

/// What [`read_line`] got.
enum Line {
    /// A whole line (without its newline) is in the buffer.
    Read,
    /// End of the channel (or a read error, or a last line without its newline).
    End,
    /// A line longer than [`MAX_LINE`].
    TooLong,
}

/// Reads one line of at most [`MAX_LINE`] bytes into `line` (cleared first).
async fn read_line<R: AsyncBufRead + Unpin>(reader: &mut R, line: &mut Vec<u8>) -> Line {
    line.clear();
    let limit = MAX_LINE as u64 + 1;
    match reader.take(limit).read_until(b'\n', line).await {
        Ok(0) | Err(_) => Line::End,
        Ok(_) if line.last() == Some(&b'\n') => {
            line.pop();
            Line::Read
        }
        Ok(_) if line.len() > MAX_LINE => Line::TooLong,
        Ok(_) => Line::End,
    }
}

/// Text from the template (hostile under `--sandbox`) as it may appear in a log line or an
/// error: control characters escaped, at most [`MAX_SHOWN`] characters.
fn printable(text: &str) -> String {
    escaped(text, MAX_SHOWN, false)
}

/// `text` with control characters escaped (but newlines, with `lines`), cut at `max` characters.
fn escaped(text: &str, max: usize, lines: bool) -> String {
    let mut out = String::new();
    for (i, c) in text.chars().enumerate() {
        if i == max {
            out.push('…');
            break;
        }
        if c.is_control() && !(lines && c == '\n') {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// The template's last stderr lines (already bounded, see [`StderrTail`]), for an error message;
/// escaped, as it may be hostile code.
fn suffix(stderr: &StderrTail) -> String {
    let tail = escaped(
        &stderr.last_lines(),
        crate::child_process::STDERR_TAIL_BYTES,
        true,
    );
    if tail.is_empty() {
        String::new()
    } else {
        format!("; template stderr:\n{tail}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_template_says_when_it_preloads() {
        for (line, preloading) in [
            (r#"{"op": "preloading", "module": "pandas"}"#, true),
            (r#"{"op": "preloaded", "module": "pandas"}"#, false),
        ] {
            let msg: Message = serde_json::from_str(line).unwrap();
            assert_eq!(matches!(msg, Message::Preloading), preloading, "{line}");
            assert!(matches!(msg, Message::Preloading | Message::Preloaded));
        }
    }

    #[test]
    fn the_preload_list_comes_from_ipybox_kernel_preload() {
        let with = |v: Option<&str>| {
            let vars = v
                .map(|v| [("IPYBOX_KERNEL_PRELOAD".to_string(), v.to_string())].into())
                .unwrap_or_default();
            preload_modules(&crate::host_env::HostEnv::from_vars(vars))
        };
        assert_eq!(with(None), "numpy,pandas");
        for off in ["", " ", "0", "off", "None", "no", "false"] {
            assert_eq!(with(Some(off)), "", "{off:?}");
        }
        assert_eq!(
            with(Some(" polars, scipy.sparse ,,sklearn")),
            "polars,scipy.sparse,sklearn"
        );
        // Only dotted identifiers reach the template's command line.
        assert_eq!(
            with(Some("numpy,os; rm -rf /,-c,a..b,1x,_ok.x2")),
            "numpy,_ok.x2"
        );
    }

    #[tokio::test]
    async fn a_line_without_end_from_the_template_is_cut_off() {
        let mut line = Vec::new();
        let mut ok: &[u8] = b"{\"op\":\"exit\"}\nrest";
        assert!(matches!(read_line(&mut ok, &mut line).await, Line::Read));
        assert_eq!(line, b"{\"op\":\"exit\"}");
        assert!(matches!(read_line(&mut ok, &mut line).await, Line::End));
        // Bytes without a newline: read no further than the limit.
        let endless = tokio::io::repeat(b'x');
        let mut endless = tokio::io::BufReader::new(endless);
        assert!(matches!(
            read_line(&mut endless, &mut line).await,
            Line::TooLong
        ));
        assert_eq!(line.len(), MAX_LINE + 1);
        let mut exact = vec![b'x'; MAX_LINE];
        exact.push(b'\n');
        let mut exact: &[u8] = &exact;
        assert!(matches!(read_line(&mut exact, &mut line).await, Line::Read));
    }

    #[test]
    fn what_the_template_says_is_shown_tamed() {
        assert_eq!(
            printable("fork failed\x1b[2J\r\n"),
            "fork failed\\u{1b}[2J\\r\\n"
        );
        assert_eq!(escaped("a\x1b\nb\t", 100, true), "a\\u{1b}\nb\\t");
        let long = printable(&"y".repeat(10_000));
        assert_eq!(long.chars().count(), MAX_SHOWN + 1);
    }

    #[test]
    fn only_a_live_child_of_the_template_counts_as_its_kernel() {
        // This test process plays the template; `sleep` is its child.
        let mut child = crate::child_process::host_command_blocking("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let us = PidFd::open(std::process::id()).unwrap();
        assert!(verify_forked(child.id(), &us).is_ok());
        // A process that is not the template's child: with `sleep` as the template, this one.
        let sleep = PidFd::open(child.id()).unwrap();
        let err = verify_forked(std::process::id(), &sleep).unwrap_err();
        assert!(err.contains("not a child of the template"), "{err}");
        // The template must descend from the process ipybox started.
        assert!(verify_template(Some(child.id()), std::process::id()).is_ok());
        let err = verify_template(Some(std::process::id()), child.id()).unwrap_err();
        assert!(err.contains("not one ipybox started"), "{err}");
        // A process that has exited is refused.
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(verify_forked(child.id(), &us).is_err());
    }
}
