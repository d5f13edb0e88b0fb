//! The kernel sessions of `ipybox serve --http`: one kernel per agent conversation, found by a
//! handle ([`super::handle`]) bound to the caller's credential.
//!
//! - **New sessions** come from [`ExecutorFactory::executor`], the one place a session's kernel
//!   is made (a warm executor when one is ready, see `--warm-sessions`); `--max-sessions` open
//!   sessions at most: one more is refused with an error, no other session is touched.
//! - **Idle sessions** (no call in progress, no cell running) are closed after
//!   `--idle-timeout`: the kernel stops; a later call with the handle is told the session
//!   expired and after how long. What a closed session's handle gets is kept for a while
//!   ([`CLOSED_KEPT`]).
//! - **Replicas with a kernel gateway**: a handle names the kernel on the gateway, so a replica
//!   that does not hold the session attaches to that kernel (state and all); and a replica that
//!   closes a session whose kernel another replica is connected to (the gateway counts more
//!   than one connection) only detaches from it, to attach again if a call comes back. With local kernels the
//!   handle names the replica that holds the kernel, and another replica says so.
//!
//! - **Hibernation** (local kernels, [`hibernate`]): a session idle for `--hibernate-after` is
//!   saved and its kernel stopped; the next call with its handle restores it. Saved sessions
//!   outlive restarts of the service (records in [`super::session_store`]).
//!
//! Not here: what a session holds ([`super::super::mcp_server::session`]), the HTTP side.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use ipybox::CodeExecutor;
use ipybox::executor::{CodeExecutorBuilder, ExecutorError};
use ipybox::kernel::SharedKernelFactory;
use ipybox::tools::SharedMcpServers;
use tokio::sync::mpsc;

use super::super::mcp_server::caller::Caller;
use super::super::mcp_server::session::{KernelSession, SessionSource};
use super::super::metrics::{self, Closed};
use super::handle::{Handle, Handles, Place};
use super::session_store::secs_text;

mod hibernate;
pub(crate) use hibernate::Hibernation;

/// How many closed sessions' reasons are kept (for "expired" answers).
const CLOSED_KEPT: usize = 100_000;

/// What the registry is told by the command line.
#[derive(Debug, Clone)]
pub(crate) struct SessionConfig {
    pub(crate) idle_timeout: Duration,
    pub(crate) max_sessions: usize,
    /// `--max-sessions-per-token` (`None`: no limit of its own).
    pub(crate) max_per_token: Option<usize>,
    /// `--service-memory` for confined sessions with a memory limit (`None`: not bounded).
    pub(crate) memory: Option<ipybox::confine::service::MemoryBudget>,
    pub(crate) max_concurrent_calls: Option<usize>,
    /// This replica's name in local-kernel handles.
    pub(crate) replica: String,
    /// Kernels run on a kernel gateway (`--kernel-gateway`): handles name the kernel.
    pub(crate) gateway: bool,
    /// Local kernels run confined, each in a bubblewrap of its own (not `--unconfined-sessions`).
    pub(crate) confined: bool,
    pub(crate) warm_sessions: usize,
    pub(crate) allow_install: bool,
    pub(crate) allow_register: bool,
    /// `--hibernate-after` (`None`: off).
    pub(crate) hibernate_after: Option<Duration>,
    /// `--checkpoint-after` (`None`: off).
    pub(crate) checkpoint_after: Option<Duration>,
    /// `--snapshot-quota`, bytes per token (`None`: no quota).
    pub(crate) snapshot_quota: Option<u64>,
    /// ipybox's data directory (snapshots, saved sessions' records); `None`: nothing is saved.
    pub(crate) data_dir: Option<std::path::PathBuf>,
    /// `--snapshot-dir`: saved sessions on storage the replicas share (else `data_dir`).
    pub(crate) snapshot_dir: Option<std::path::PathBuf>,
}

/// Makes the executor of a session: the one place a session's kernel comes from.
#[derive(Clone)]
pub(crate) struct ExecutorFactory {
    builder: CodeExecutorBuilder,
    workspace: std::path::PathBuf,
    /// Where sessions' notebooks go (host-side, private); `None`: not recorded.
    notebooks: Option<std::path::PathBuf>,
    /// `--notebook-quota` over those notebooks (`None`: off, or no notebooks).
    notebook_quota: Option<Arc<super::notebook_quota::NotebookQuota>>,
    /// The kernel template every session's kernels are forked from, if `builder` shares one.
    shared_factory: Option<SharedKernelFactory>,
    /// The stdio MCP servers every session calls, if `builder` shares them.
    shared_servers: Option<SharedMcpServers>,
}

impl ExecutorFactory {
    /// `builder` configures every session's executor (workspace, environment, gateway, sandbox,
    /// approvals); `workspace` is the shared workspace.
    pub(crate) fn new(builder: CodeExecutorBuilder, workspace: std::path::PathBuf) -> Self {
        Self {
            builder,
            workspace,
            notebooks: None,
            notebook_quota: None,
            shared_factory: None,
            shared_servers: None,
        }
    }

    /// Every session records its notebook in `dir` (a host directory, not the shared
    /// workspace: files 0600 in a 0700 directory, named after the session's tag).
    pub(crate) fn with_notebooks(mut self, dir: Option<std::path::PathBuf>) -> Self {
        self.notebooks = dir;
        self
    }

    /// `--notebook-quota`: `quota` bytes of notebooks per token (`None`: off). After
    /// [`Self::with_notebooks`].
    pub(crate) fn with_notebook_quota(mut self, quota: Option<u64>) -> Self {
        self.notebook_quota = match (&self.notebooks, quota) {
            (Some(dir), Some(quota)) => Some(super::notebook_quota::NotebookQuota::new(
                dir.clone(),
                quota,
            )),
            _ => None,
        };
        self
    }

    /// Session `id` of `owner`: what becomes of its notebook under `--notebook-quota` (called
    /// before its kernel runs anything).
    pub(crate) fn notebook_fate(
        &self,
        id: &[u8; 16],
        owner: &Caller,
    ) -> Option<Arc<super::super::mcp_server::notebook_fate::NotebookFate>> {
        let quota = self.notebook_quota.as_ref()?;
        let tag: String = id[..4].iter().map(|b| format!("{b:02x}")).collect();
        Some(quota.open(&tag, super::session_store::owner_digest(owner)))
    }

    /// What `builder` shares between sessions (given to it already): stopped when the service
    /// stops, after every session.
    pub(crate) fn shared(
        mut self,
        factory: Option<SharedKernelFactory>,
        servers: Option<SharedMcpServers>,
    ) -> Self {
        self.shared_factory = factory;
        self.shared_servers = servers;
        self
    }

    /// Stops what sessions share: the kernel template and the stdio MCP servers.
    async fn shutdown_shared(&self) {
        let factory = async {
            if let Some(factory) = &self.shared_factory {
                factory.shutdown().await;
            }
        };
        let servers = async {
            if let Some(servers) = &self.shared_servers {
                servers.close_all().await;
            }
        };
        tokio::join!(factory, servers);
    }

    /// The executor of session `id` (not started): a new kernel, or with `attach`, kernel
    /// `attach` on the gateway. Its images go to `images/<session tag>/` of the workspace.
    pub(crate) fn executor(&self, id: &[u8; 16], attach: Option<&str>) -> CodeExecutor {
        let tag: String = id[..4].iter().map(|b| format!("{b:02x}")).collect();
        let mut builder = self
            .builder
            .clone()
            .images_dir(self.workspace.join("images").join(&tag))
            .session_tag(tag.clone());
        if let Some(dir) = &self.notebooks {
            let mut config = ipybox::notebook::NotebookConfig::in_dir(dir)
                .tag(tag)
                .private(true);
            if let Some(quota) = &self.notebook_quota {
                config = config.budget(quota.clone());
            }
            builder = builder.notebook_config(config);
        }
        match attach {
            Some(kernel) => builder.attach_kernel(kernel),
            None => builder,
        }
        .build()
    }

    /// Removes what closed session `session` left in the workspace: its images
    /// (`images/<session tag>/`, see [`Self::executor`]). The one place a session's files are
    /// cleaned up; called once its kernel is stopped (a kernel still running elsewhere, on a
    /// gateway, keeps them).
    pub(crate) fn remove_session_files(session: &KernelSession) {
        if let Err(e) = session.executor.remove_images_dir() {
            tracing::warn!(session = %session.tag, "cannot remove the closed session's images: {e}");
        }
    }

    /// Removes the files session `id` left in the workspace (its images) when it has no
    /// executor any more (it expired while hibernated).
    pub(crate) fn remove_images(&self, id: &[u8; 16]) {
        if let Err(e) = self.executor(id, None).remove_images_dir() {
            let tag: String = id[..4].iter().map(|b| format!("{b:02x}")).collect();
            tracing::warn!(session = %tag, "cannot remove the closed session's images: {e}");
        }
    }

    /// The shared workspace's executor, never started (registrations).
    pub(crate) fn workspace_executor(&self) -> CodeExecutor {
        self.builder.clone().build()
    }
}

/// The open sessions and what is known about closed ones.
pub(crate) struct Registry {
    config: SessionConfig,
    handles: Handles,
    factory: ExecutorFactory,
    workspace: CodeExecutor,
    open: Mutex<HashMap<[u8; 16], Arc<KernelSession>>>,
    closed: Mutex<ClosedLog>,
    /// Started executors for new sessions (with their ids), refilled in the background.
    warm: tokio::sync::Mutex<mpsc::Receiver<([u8; 16], CodeExecutor)>>,
    warm_tx: mpsc::Sender<([u8; 16], CodeExecutor)>,
    /// The tasks starting warm executors (waited for, then aborted, at shutdown).
    refills: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// The stops of sessions closed while the service runs (a client's DELETE, expiry): waited
    /// for at shutdown, so that their runtime directories (and the shared factory's, which they
    /// hold) are gone before ipybox exits.
    stops: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// Set at shutdown: no new sessions.
    closing: std::sync::atomic::AtomicBool,
    /// Saving idle sessions ([`hibernate`]); `None`: off (also on a kernel gateway).
    sleep: Option<Hibernation>,
}

/// Why recently closed sessions were closed, oldest first out.
#[derive(Default)]
struct ClosedLog {
    why: HashMap<[u8; 16], String>,
    order: VecDeque<[u8; 16]>,
}

impl ClosedLog {
    fn insert(&mut self, id: [u8; 16], why: String) {
        if self.why.insert(id, why).is_none() {
            self.order.push_back(id);
        }
        while self.order.len() > CLOSED_KEPT {
            if let Some(old) = self.order.pop_front() {
                self.why.remove(&old);
            }
        }
    }
}

impl Registry {
    pub(crate) fn new(config: SessionConfig, key: Vec<u8>, factory: ExecutorFactory) -> Arc<Self> {
        let (warm_tx, warm_rx) = mpsc::channel(config.warm_sessions.max(1));
        let sleep = Self::hibernation(&config);
        let registry = Arc::new(Self {
            handles: Handles::new(key),
            workspace: factory.workspace_executor(),
            factory,
            open: Mutex::default(),
            closed: Mutex::default(),
            warm: tokio::sync::Mutex::new(warm_rx),
            warm_tx,
            refills: Mutex::default(),
            stops: Mutex::default(),
            closing: Default::default(),
            sleep,
            config,
        });
        if let Some(sleep) = &registry.sleep {
            // Sessions nobody can name again (a handshake-era MCP session's own, from a
            // process that is gone): their state is deleted.
            for record in sleep.records.all() {
                if !record.named {
                    sleep.forget(&record.id);
                }
            }
            // Snapshots no record names (a save cut short by a crash, or from before saves
            // of closed sessions were abandoned): removed once older than the grace.
            sleep.sweep();
        }
        for _ in 0..registry.config.warm_sessions {
            registry.refill_warm();
        }
        registry
    }

    /// Where idle sessions are saved, if they are: local kernels, a data directory, and
    /// `--hibernate-after` or `--checkpoint-after` on.
    fn hibernation(config: &SessionConfig) -> Option<Hibernation> {
        if config.gateway || (config.hibernate_after.is_none() && config.checkpoint_after.is_none())
        {
            return None;
        }
        let Some(data) = config.snapshot_dir.as_ref().or(config.data_dir.as_ref()) else {
            tracing::warn!("no data directory (set IPYBOX_HOME): idle sessions are not hibernated");
            return None;
        };
        let store = match ipybox::snapshot::SnapshotStore::open(
            data.join("snapshots"),
            &data.join("keys").join("snapshot.key"),
        ) {
            Ok(store) => store,
            Err(e) => {
                tracing::warn!("idle sessions are not hibernated: {e}");
                return None;
            }
        };
        let records = super::session_store::SessionStore::open(data, &config.replica);
        if config.snapshot_dir.is_some() && records.persistent() {
            records.heartbeat();
        }
        Some(Hibernation::new(
            store,
            records,
            config.hibernate_after,
            config.checkpoint_after,
            config.snapshot_quota,
        ))
    }

    fn open(&self) -> std::sync::MutexGuard<'_, HashMap<[u8; 16], Arc<KernelSession>>> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn closed(&self) -> std::sync::MutexGuard<'_, ClosedLog> {
        self.closed.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts one warm executor in the background.
    fn refill_warm(self: &Arc<Self>) {
        if self.config.warm_sessions == 0 || self.closing() {
            return;
        }
        let registry = Arc::downgrade(self);
        let task = tokio::spawn(async move {
            let Some(this) = registry.upgrade() else {
                return;
            };
            let id: [u8; 16] = rand::random();
            let executor = this.factory.executor(&id, None);
            let tx = this.warm_tx.clone();
            drop(this);
            match executor.start().await {
                Ok(()) => {
                    if let Err(mpsc::error::SendError((_, executor))) =
                        tx.send((id, executor)).await
                    {
                        executor.stop().await;
                    }
                }
                Err(e) => tracing::warn!(
                    "a warm kernel for new sessions failed to start: {}",
                    ipybox::log_text::escaped(&e.to_string())
                ),
            }
        });
        let mut refills = self.refills.lock().unwrap_or_else(|p| p.into_inner());
        refills.retain(|t| !t.is_finished());
        refills.push(task);
    }

    fn closing(&self) -> bool {
        self.closing.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn refuse_more(&self, caller: &Caller) -> Result<(), String> {
        self.refuse_with(&self.open(), caller)
    }

    /// Whether one more session of `caller` may open while `open` are open (the error counts
    /// as a refusal): shutdown, then the service's, the memory budget's and the token's limits
    /// ([`super::admission`]).
    fn refuse_with(
        &self,
        open: &HashMap<[u8; 16], Arc<KernelSession>>,
        caller: &Caller,
    ) -> Result<(), String> {
        if self.closing() {
            return Err("ipybox is shutting down: no new sessions\n  help: retry in a moment (against another replica, if there is one)".into());
        }
        let freed = match self.sleep.as_ref().and_then(|s| s.after) {
            Some(after) => format!("sessions idle for {} s are hibernated", secs_text(after)),
            None => format!(
                "sessions idle for {} s are closed",
                secs_text(self.config.idle_timeout)
            ),
        };
        let admission = super::admission::Admission {
            max_sessions: self.config.max_sessions,
            max_per_token: self.config.max_per_token,
            memory: self.config.memory,
            warm: self.config.warm_sessions,
        };
        match super::admission::refusal(admission, open, caller, &freed) {
            Some(why) => Err(why),
            None => Ok(()),
        }
    }

    /// A new session of `caller`.
    async fn mint(self: &Arc<Self>, caller: &Caller) -> Result<Arc<KernelSession>, String> {
        self.refuse_more(caller)?;
        let warm = if self.config.warm_sessions > 0 {
            self.warm.lock().await.try_recv().ok()
        } else {
            None
        };
        let (id, executor) = match warm {
            Some(ready) => {
                self.refill_warm();
                ready
            }
            None => {
                let id: [u8; 16] = rand::random();
                (id, self.factory.executor(&id, None))
            }
        };
        let mut session = KernelSession::new(
            executor,
            caller.clone(),
            id,
            self.config.max_concurrent_calls,
        );
        if let Some(fate) = self.factory.notebook_fate(&id, caller) {
            session = session.with_notebook_fate(fate);
        }
        let session = Arc::new(session);
        {
            // Checked again under the lock: other sessions may have opened meanwhile.
            let mut open = self.open();
            if let Err(why) = self.refuse_with(&open, caller) {
                drop(open);
                let executor = session.executor.clone();
                tokio::spawn(async move { executor.stop().await });
                return Err(why);
            }
            open.insert(id, session.clone());
        }
        metrics::session_opened(false);
        tracing::info!(session = %session.tag, "new kernel session");
        Ok(session)
    }

    /// The session of `handle` on a kernel gateway that this replica does not hold (or holds
    /// with another kernel): attach to the kernel the handle names.
    async fn attach(
        self: &Arc<Self>,
        caller: &Caller,
        handle: &Handle,
        kernel_id: &str,
        generation: u32,
        replacing: Option<Arc<KernelSession>>,
    ) -> Result<Arc<KernelSession>, String> {
        if kernel_id.is_empty() {
            return Err("this session never got a kernel (its first start failed), so there is nothing to continue\n  help: call without `session` to start a new session".into());
        }
        if replacing.is_none() {
            self.refuse_more(caller)?;
        }
        let executor = self.factory.executor(&handle.id, Some(kernel_id));
        let mut session = KernelSession::new(
            executor,
            caller.clone(),
            handle.id,
            self.config.max_concurrent_calls,
        )
        .continued(kernel_id, generation);
        if let Some(fate) = self.factory.notebook_fate(&handle.id, caller) {
            session = session.with_notebook_fate(fate);
        }
        let session = Arc::new(session);
        {
            let mut open = self.open();
            match (open.get(&handle.id), &replacing) {
                // Another call attached meanwhile.
                (Some(current), None) => return Ok(current.clone()),
                (Some(current), Some(old)) if !Arc::ptr_eq(current, old) => {
                    return Ok(current.clone());
                }
                // A session more: the limit and shutdown are checked again under the lock.
                (None, None) => self.refuse_with(&open, caller)?,
                _ => {}
            }
            open.insert(handle.id, session.clone());
        }
        if let Some(old) = replacing {
            // This replica's view of the session is older than the handle (another replica
            // replaced the kernel): let go of the old kernel without deleting it.
            let executor = old.executor.clone();
            tokio::spawn(async move { executor.stop_detaching().await });
        } else {
            metrics::session_opened(true);
        }
        tracing::info!(session = %session.tag, "attaching to the session's kernel on the gateway");
        match session.executor.start().await {
            Ok(()) => Ok(session),
            Err(e) => {
                let gone = matches!(
                    &e,
                    ExecutorError::Kernel(ipybox::kernel::KernelError::Gone { .. })
                );
                if self.remove_if_current(&session) {
                    metrics::session_closed(Closed::Gone);
                }
                if gone {
                    let why = format!(
                        "session {} is gone: {e}: it was reset (a reset names the new handle), closed after being idle for more than {} s, or its kernel died\n  help: call without `session` to start a new session",
                        session.tag,
                        secs_text(self.config.idle_timeout)
                    );
                    session.mark_closed(why.clone());
                    Err(why)
                } else {
                    Err(format!(
                        "cannot reach this session's kernel on the kernel gateway: {e}\n  help: retry; if the gateway is up and this persists, start a new session"
                    ))
                }
            }
        }
    }

    /// Closes `session` for `why`: it leaves the registry, later calls with its handle get
    /// `message`, and its kernel stops (or, on a gateway, is detached from when another
    /// Removes `session` from the open sessions if it is the one open under its id (not a
    /// newer session of the same id); returns whether it was.
    pub(super) fn remove_if_current(&self, session: &Arc<KernelSession>) -> bool {
        let mut open = self.open();
        match open.get(&session.id) {
            Some(current) if Arc::ptr_eq(current, session) => open.remove(&session.id).is_some(),
            _ => false,
        }
    }

    /// replica still uses it).
    pub(crate) fn close_with(
        self: &Arc<Self>,
        session: &Arc<KernelSession>,
        why: Closed,
        message: String,
    ) {
        if !self.remove_if_current(session) {
            return;
        }
        session.mark_closed(message.clone());
        metrics::session_closed(why);
        tracing::info!(session = %session.tag, reason = ?why, "kernel session closed");
        if let Some(sleep) = &self.sleep {
            // Its snapshot too when no record names it yet (a save in flight abandons its own
            // once it sees the session closed, see `hibernate`).
            sleep.forget_of(
                &session.id,
                Some(&super::session_store::owner_digest(&session.owner)),
            );
        }
        if !self.config.gateway {
            self.closed().insert(session.id, message);
            let session = session.clone();
            self.track_stop(tokio::spawn(async move {
                session.executor.stop().await;
                ExecutorFactory::remove_session_files(&session);
            }));
            return;
        }
        // On a gateway the kernel may live on (another replica uses it): then a later call
        // here attaches to it again, so the session is not recorded as closed.
        let (registry, session) = (self.clone(), session.clone());
        self.track_stop(tokio::spawn(async move {
            if !stop_kernel(&session).await {
                ExecutorFactory::remove_session_files(&session);
                registry.closed().insert(session.id, message);
            }
        }));
    }

    /// Keeps `task` (a closed session's stop) for [`Self::close_all`], dropping those done.
    fn track_stop(&self, task: tokio::task::JoinHandle<()>) {
        let mut stops = self.stops.lock().unwrap_or_else(|p| p.into_inner());
        stops.retain(|t| !t.is_finished());
        stops.push(task);
    }

    /// The sessions idle for longer than the idle timeout are closed; run every `tick`.
    pub(crate) fn reap(self: &Arc<Self>) {
        let idle: Vec<Arc<KernelSession>> = self
            .open()
            .values()
            .filter(|s| s.idle_for().is_some_and(|d| d >= self.config.idle_timeout))
            .cloned()
            .collect();
        for session in idle {
            let message = format!(
                "session {} expired: it was idle for more than {} s (--idle-timeout), so its kernel was stopped and its state is gone\n  help: call without `session` to start a new session",
                session.tag,
                secs_text(self.config.idle_timeout)
            );
            // A call may have entered since the snapshot: then the session stays.
            if session.close_if_idle(self.config.idle_timeout, message.clone()) {
                self.close_with(&session, Closed::Idle, message);
            }
        }
        self.reap_saved();
    }

    /// Shutdown: no new sessions; waits up to `grace` for calls in progress and running cells
    /// to end; interrupts the cells still running in sessions a client holds a handle of and
    /// hibernates those sessions with the idle ones (see [`Self::interrupt_for_restart`]); then
    /// closes every session (running cells are cancelled), kernels deleted (or detached from,
    /// on a gateway, when another replica uses them).
    pub(crate) async fn close_all(self: &Arc<Self>, grace: Duration) {
        self.closing
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let deadline = tokio::time::Instant::now() + grace;
        while tokio::time::Instant::now() < deadline
            && self.open().values().any(|s| s.idle_for().is_none())
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let (cut, lost) = self.interrupt_for_restart(grace).await;
        let deadline = match cut {
            0 => deadline,
            // The interrupted sessions (and the idle ones) get their own time to be saved.
            _ => deadline.max(tokio::time::Instant::now() + CUT_SAVE_BOUND),
        };
        self.hibernate_for_restart(deadline, &lost).await;
        if let Some(sleep) = self.sleep.as_ref().filter(|s| s.records.persistent()) {
            // Still running a cell, or its kernel replaced (the cell ignored the interruption):
            // not saved again, so its next call is told what its last checkpoint lacks.
            for session in self.open().values() {
                if session.named()
                    && (session.idle_for().is_none() || lost.contains(&session.id))
                    && sleep.mark_lost(session)
                {
                    tracing::warn!(session = %session.tag, "shutdown: a cell did not stop when interrupted, so the session was not saved again; its last checkpoint stays, and its next call is told what it lacks");
                }
            }
        }
        let sessions: Vec<Arc<KernelSession>> = self.open().drain().map(|(_, s)| s).collect();
        let gateway = self.config.gateway;
        let stops = sessions.into_iter().map(|session| async move {
            session.mark_closed("ipybox is shutting down; this session's kernel was stopped\n  help: start a new session when the service is back".into());
            metrics::session_closed(Closed::Shutdown);
            let detached = if gateway {
                stop_kernel(&session).await
            } else {
                session.executor.stop().await;
                false
            };
            if !detached {
                ExecutorFactory::remove_session_files(&session);
            }
        });
        futures::future::join_all(stops).await;
        // Sessions closed before the shutdown whose stops are still under way.
        let closed = std::mem::take(&mut *self.stops.lock().unwrap_or_else(|p| p.into_inner()));
        for task in closed {
            let _ = task.await;
        }
        // Warm executors: started, never used. One still starting finds the channel closed
        // and stops its kernel; one that takes too long is aborted (its kernel is stopped as
        // the executor is dropped).
        let mut warm = self.warm.lock().await;
        warm.close();
        let refills = std::mem::take(&mut *self.refills.lock().unwrap_or_else(|p| p.into_inner()));
        for mut task in refills {
            if tokio::time::timeout(Duration::from_secs(10), &mut task)
                .await
                .is_err()
            {
                task.abort();
                let _ = task.await;
            }
        }
        while let Some((_, executor)) = warm.recv().await {
            executor.stop().await;
        }
        drop(warm);
        self.factory.shutdown_shared().await;
    }
}

use hibernate::CUT_WAIT;
/// At shutdown, how long the saves after such an interruption may take.
const CUT_SAVE_BOUND: Duration = Duration::from_secs(10);

impl Registry {
    /// Shutdown, once `grace` is over: the sessions whose handle a client holds and that still
    /// run a cell have that cell interrupted (as a cancel does: KeyboardInterrupt, the state
    /// kept), so that they can be saved with every cell their client was told had run; the cut
    /// call's result says so. Waits up to [`CUT_WAIT`] for them to be idle; returns how many
    /// were interrupted.
    async fn interrupt_for_restart(
        self: &Arc<Self>,
        grace: Duration,
    ) -> (usize, std::collections::HashSet<[u8; 16]>) {
        let mut lost = std::collections::HashSet::new();
        let Some(sleep) = &self.sleep else {
            return (0, lost);
        };
        if !sleep.records.persistent() {
            return (0, lost);
        }
        let busy: Vec<Arc<KernelSession>> = self
            .open()
            .values()
            .filter(|s| s.named() && s.idle_for().is_none())
            .cloned()
            .collect();
        let mut cut = Vec::new();
        for session in &busy {
            let pid = session.executor.kernel_pid().await;
            // A restore report the cut call has not shown yet stays first.
            let pending = session.take_restored();
            let notice = format!(
                "[ipybox] ipybox is shutting down: this cell was still running when --shutdown-grace ({} s) ended, so it was interrupted (KeyboardInterrupt) and did not finish. The session is saved with what its cells did until then; if this cell did not stop when interrupted, its kernel was replaced and the session comes back as its last checkpoint, and the first call after the restart says what that lacks.\n  help: after the restart, call again with the same `session`; run what this cell did not do again if you need it",
                secs_text(grace)
            );
            session.set_restored(match &pending {
                Some(report) => format!("{report}\n{notice}"),
                None => notice,
            });
            if session.executor.cancel() {
                cut.push((session.clone(), pid));
                tracing::info!(session = %session.tag, "shutdown: a cell still running at the end of --shutdown-grace is interrupted, so that the session can be saved");
            } else {
                // Not running a cell (a call waiting for its turn, or for a kernel): nothing
                // to interrupt, nothing to say.
                session.take_restored();
                if let Some(report) = pending {
                    session.set_restored(report);
                }
            }
        }
        if cut.is_empty() {
            return (0, lost);
        }
        let until = tokio::time::Instant::now() + CUT_WAIT;
        while tokio::time::Instant::now() < until && cut.iter().any(|(s, _)| s.idle_for().is_none())
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // A cell that did not stop when interrupted has its kernel replaced (state gone): such
        // a session must not be saved (it would overwrite its checkpoint with an empty one).
        for (session, pid) in &cut {
            if session.idle_for().is_none() || session.executor.kernel_pid().await != *pid {
                lost.insert(session.id);
            }
        }
        (cut.len(), lost)
    }

    /// Shutdown: hibernates the idle sessions whose handle a client holds, so that they come
    /// back after a restart; until `deadline` (what is left of `--shutdown-grace`). Those not
    /// saved by then are closed as the others are (a checkpoint taken earlier stays).
    async fn hibernate_for_restart(
        self: &Arc<Self>,
        deadline: tokio::time::Instant,
        skip: &std::collections::HashSet<[u8; 16]>,
    ) {
        let Some(sleep) = &self.sleep else { return };
        if !sleep.records.persistent() {
            return;
        }
        let idle: Vec<Arc<KernelSession>> = self
            .open()
            .values()
            .filter(|s| s.named() && s.idle_for().is_some() && !skip.contains(&s.id))
            .cloned()
            .collect();
        if idle.is_empty() {
            return;
        }
        let count = idle.len();
        let saves = futures::future::join_all(
            idle.iter()
                .map(|session| self.save(session, Duration::ZERO, false)),
        );
        match tokio::time::timeout_at(deadline, saves).await {
            Ok(saved) => {
                tracing::info!(
                    "shutdown: {} of {count} idle sessions hibernated",
                    saved.iter().filter(|s| **s).count()
                );
                // Their kernels stop in the background after a hibernation: waited for here,
                // before the process exits.
                let stops = idle
                    .iter()
                    .zip(saved)
                    .filter(|(_, saved)| *saved)
                    .map(|(session, _)| session.executor.stop());
                futures::future::join_all(stops).await;
            }
            Err(_) => {
                tracing::warn!(
                    "shutdown: --shutdown-grace ran out while hibernating {count} idle sessions; those not saved yet are closed"
                );
                // A snapshot write handed to a blocking thread completes anyway: nobody's.
                for session in &idle {
                    sleep.drop_unrecorded(session).await;
                }
            }
        }
    }
}

/// Stops a closed session's kernel on a gateway; returns whether it was only detached from.
/// A kernel another replica is connected to (more connections than this one) is left
/// running: that replica uses it, and closes it in turn when the session is idle there too.
async fn stop_kernel(session: &KernelSession) -> bool {
    match session.executor.remote_kernel_status().await {
        Ok(Some(status)) if status.connections.is_some_and(|c| c > 1) => {
            tracing::info!(session = %session.tag, "another replica uses this session's kernel: detaching, not deleting");
            session.executor.stop_detaching().await;
            true
        }
        Ok(_) => {
            session.executor.stop().await;
            false
        }
        Err(e) => {
            tracing::debug!(session = %session.tag, "cannot ask the gateway about the kernel: {e}");
            session.executor.stop().await;
            false
        }
    }
}

impl SessionSource for Arc<Registry> {
    fn resolve<'a>(
        &'a self,
        caller: &'a Caller,
        handle: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Arc<KernelSession>, String>> {
        Box::pin(async move {
            let Some(text) = handle else {
                return self.mint(caller).await;
            };
            let handle = self.handles.decode(text, caller).map_err(|e| e.message())?;
            if let (Some(sleep), Place::Local { replica }) = (&self.sleep, &handle.place)
                && *replica == self.config.replica
            {
                // One transition at a time: a call waits for a hibernation in progress, and
                // concurrent calls restore once.
                let _guard = sleep.lock(handle.id).await;
                if let Some(session) = self.open().get(&handle.id).cloned()
                    && session.owner == *caller
                {
                    session.touch();
                    return Ok(session);
                }
                if let Some(session) = self.wake(caller, handle.id).await? {
                    return Ok(session);
                }
            }
            if let (Some(sleep), Place::Local { replica }) = (&self.sleep, &handle.place)
                && *replica != self.config.replica
                && self.config.snapshot_dir.is_some()
            {
                // Another replica's session, on shared storage: taken over only if that
                // replica is dead (see `session_store::SessionStore::take_over`).
                let _guard = sleep.lock(handle.id).await;
                if let Some(session) = self.open().get(&handle.id).cloned()
                    && session.owner == *caller
                {
                    session.touch();
                    return Ok(session);
                }
                if sleep.records.take_over(replica, &handle.id)
                    && let Some(session) = self.wake(caller, handle.id).await?
                {
                    tracing::info!(session = %session.tag, "took over a session of dead replica `{replica}`");
                    return Ok(session);
                }
            }
            let found = self.open().get(&handle.id).cloned();
            // The handle's tag binds it to its owner's token; checked again here, so that a
            // handle forged with a leaked key still names nobody else's session.
            if found.as_ref().is_some_and(|s| s.owner != *caller) {
                return Err(super::handle::Invalid::NotYours.message());
            }
            match (&handle.place, found) {
                (
                    Place::Gateway {
                        kernel_id,
                        generation,
                    },
                    Some(session),
                ) => {
                    match session.executor.remote_kernel_id() {
                        // The handle names a newer kernel than the one this replica holds
                        // (another replica reset or replaced it): follow the handle. A handle
                        // from before this replica's own reset names an older one: the call
                        // goes to the session's current kernel, and its result names the
                        // current handle.
                        Some(current)
                            if current != *kernel_id
                                && *generation > session.generation_of(&current) =>
                        {
                            self.attach(caller, &handle, kernel_id, *generation, Some(session))
                                .await
                        }
                        _ => Ok(session),
                    }
                }
                (_, Some(session)) => Ok(session),
                (place, None) => {
                    if let Some(why) = self.closed().why.get(&handle.id) {
                        return Err(why.clone());
                    }
                    match place {
                        Place::Gateway {
                            kernel_id,
                            generation,
                        } => {
                            self.attach(caller, &handle, kernel_id, *generation, None)
                                .await
                        }
                        Place::Local { replica } if *replica != self.config.replica => Err(format!(
                            "this session's kernel runs on replica `{replica}`, and this is `{}`: kernels of local sessions live in one replica's memory\n  help: route requests by the handle's replica (the `Mcp-Param-Session` header, or the `{replica}` part of the handle) to that replica, or start a new session",
                            self.config.replica
                        )),
                        Place::Local { .. } => Err(
                            "this session is unknown here: ipybox was restarted since it was made and its state was not saved (hibernation is off, or it was busy at the restart), or it closed long ago\n  help: call without `session` to start a new session".into(),
                        ),
                    }
                }
            }
        })
    }

    fn handle(&self, session: &KernelSession) -> Option<String> {
        let place = if self.config.gateway {
            // No kernel yet (its start failed, or a replacement is on its way): a handle would
            // name nothing.
            let kernel_id = session.executor.remote_kernel_id()?;
            Place::Gateway {
                generation: session.generation_of(&kernel_id),
                kernel_id,
            }
        } else {
            Place::Local {
                replica: self.config.replica.clone(),
            }
        };
        session.set_named();
        Some(self.handles.encode(
            &Handle {
                id: session.id,
                place,
            },
            &session.owner,
        ))
    }

    fn close(&self, session: &Arc<KernelSession>, why: &str) {
        // A hibernated session nobody can name (a handshake-era MCP session's own) ends with
        // its MCP session.
        if let Some(sleep) = &self.sleep
            && !session.named()
            && !self.open().contains_key(&session.id)
        {
            sleep.forget(&session.id);
        }
        let message = format!(
            "session {} was closed: {why}; its kernel was stopped\n  help: call without `session` to start a new session",
            session.tag
        );
        self.close_with(session, Closed::McpSession, message);
    }

    fn reopen<'a>(
        &'a self,
        caller: &'a Caller,
        closed: &'a Arc<KernelSession>,
    ) -> BoxFuture<'a, Result<Option<Arc<KernelSession>>, String>> {
        Box::pin(async move {
            let Some(sleep) = &self.sleep else {
                return Ok(None);
            };
            let _guard = sleep.lock(closed.id).await;
            if let Some(session) = self.open().get(&closed.id).cloned() {
                if Arc::ptr_eq(&session, closed) || session.owner != *caller {
                    return Ok(None);
                }
                session.touch();
                return Ok(Some(session));
            }
            self.wake(caller, closed.id).await
        })
    }

    fn workspace_executor(&self) -> &CodeExecutor {
        &self.workspace
    }

    fn sessions_of(&self, caller: &Caller) -> Vec<Arc<KernelSession>> {
        self.open()
            .values()
            .filter(|s| s.owner == *caller)
            .cloned()
            .collect()
    }

    fn install_allowed(&self) -> bool {
        self.config.allow_install
    }

    fn register_allowed(&self) -> bool {
        self.config.allow_register
    }
}
