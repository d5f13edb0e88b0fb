//! A kernel session: one kernel (its [`CodeExecutor`]) and the MCP state that belongs to it —
//! the calls the user allowed for the rest of the session (`--approve ask`) and the task whose
//! cell holds the kernel — plus what its owner needs to know about it: whose it is
//! ([`Caller`]), whether it is in use, since when it has been idle, and why it was closed.
//!
//! Over stdio the server has exactly one. Over HTTP every agent conversation has its own,
//! found through a [`SessionSource`] (the HTTP service's registry: handles, limits, expiry).
//!
//! Not here: handles, limits and expiry (`crate::http::sessions`), the tools ([`super`]).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use ipybox::CodeExecutor;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::caller::Caller;
use super::cell::CellGuard;
use super::elicit::SessionAllowances;
use super::tasks::Busy;

/// One kernel and the MCP state that belongs to it.
pub(crate) struct KernelSession {
    pub(crate) executor: CodeExecutor,
    /// What the user allowed for the rest of this session.
    pub(crate) allowances: SessionAllowances,
    /// The task whose cell holds this kernel.
    pub(crate) busy: Busy,
    /// The credential that created it; nobody else may use it.
    pub(crate) owner: Caller,
    /// The session's identity (random); handles are made from it.
    pub(crate) id: [u8; 16],
    /// For logs and metrics: a short name that is not the handle.
    pub(crate) tag: String,
    activity: Mutex<Activity>,
    /// Cells still running (a parked round or a task outlives its request).
    cells: Arc<AtomicUsize>,
    /// At most this many calls at once (`None`: no limit).
    limiter: Option<(Arc<Semaphore>, usize)>,
    closed: Mutex<Option<String>>,
    /// The kernel (on a gateway: its id) a handle last named, and which of the session's
    /// kernels that is (see [`KernelSession::generation_of`]).
    generation: Mutex<(String, u32)>,
    /// What the next result tells the model about a restore of this session's state (the
    /// restore report, see `ipybox::snapshot::RestoreReport::text`), until a result takes it.
    restored: Mutex<Option<String>>,
    /// Whether a result gave its handle to a client (over HTTP: a client that can name it
    /// again, after a restart too; a handshake-era MCP session's own kernel session is not).
    named: std::sync::atomic::AtomicBool,
    /// What became of its notebook's file (a quota stopped it), see [`NotebookFate`].
    pub(crate) notebook_fate: Arc<super::notebook_fate::NotebookFate>,
}

struct Activity {
    /// Calls in progress.
    active: usize,
    last_used: Instant,
}

impl KernelSession {
    pub(crate) fn new(
        executor: CodeExecutor,
        owner: Caller,
        id: [u8; 16],
        max_concurrent_calls: Option<usize>,
    ) -> Self {
        let tag = id[..4].iter().map(|b| format!("{b:02x}")).collect();
        Self {
            executor,
            allowances: SessionAllowances::default(),
            busy: Busy::default(),
            owner,
            id,
            tag,
            activity: Mutex::new(Activity {
                active: 0,
                last_used: Instant::now(),
            }),
            cells: Arc::default(),
            limiter: max_concurrent_calls.map(|n| (Arc::new(Semaphore::new(n)), n)),
            closed: Mutex::default(),
            generation: Mutex::default(),
            restored: Mutex::default(),
            named: Default::default(),
            notebook_fate: Arc::default(),
        }
    }

    /// Its notebook's fate is `fate` (shared with the budget that writes it).
    pub(crate) fn with_notebook_fate(
        mut self,
        fate: Arc<super::notebook_fate::NotebookFate>,
    ) -> Self {
        self.notebook_fate = fate;
        self
    }

    /// Records that a client was given this session's handle.
    pub(crate) fn set_named(&self) {
        self.named.store(true, Ordering::SeqCst);
    }

    /// Whether a client was given this session's handle (see [`KernelSession::set_named`]).
    pub(crate) fn named(&self) -> bool {
        self.named.load(Ordering::SeqCst)
    }

    /// Counts as use now (a call found the session and is about to enter it): closing it as
    /// idle must wait for its idle time again.
    pub(crate) fn touch(&self) {
        self.activity().last_used = Instant::now();
    }

    /// When the last call ended (or the session was made, or touched).
    pub(crate) fn last_used(&self) -> Instant {
        self.activity().last_used
    }

    /// The next result of this session starts with `report` (what came back from a snapshot
    /// and what did not), once.
    pub(crate) fn set_restored(&self, report: String) {
        *self.restored.lock().unwrap_or_else(|p| p.into_inner()) = Some(report);
    }

    /// The restore report not yet told, taken (so only the first result after a restore has it).
    pub(crate) fn take_restored(&self) -> Option<String> {
        self.restored
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    }

    /// A session continued from a handle that names kernel `kernel_id` as the session's
    /// `generation`-th.
    pub(crate) fn continued(self, kernel_id: &str, generation: u32) -> Self {
        *self.generation.lock().unwrap_or_else(|p| p.into_inner()) =
            (kernel_id.to_string(), generation);
        self
    }

    /// Which of the session's kernels `kernel_id` is: 0 for the first, one more each time the
    /// kernel changed (a reset, a replacement) since a handle last named one. Handles carry it,
    /// so a replica can tell a newer handle (another replica replaced the kernel) from an
    /// outdated one (a handle from before a reset).
    pub(crate) fn generation_of(&self, kernel_id: &str) -> u32 {
        let mut seen = self.generation.lock().unwrap_or_else(|p| p.into_inner());
        if seen.0 != kernel_id {
            if !seen.0.is_empty() {
                seen.1 = seen.1.saturating_add(1);
            }
            seen.0 = kernel_id.to_string();
        }
        seen.1
    }

    fn activity(&self) -> std::sync::MutexGuard<'_, Activity> {
        self.activity.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts a call: counts it as activity until the returned guard is dropped. Fails at once
    /// (nothing waits) when the session already has its maximum of calls in progress.
    pub(crate) fn enter(self: &Arc<Self>) -> Result<Entered, String> {
        let permit = match &self.limiter {
            None => None,
            Some((semaphore, max)) => Some(semaphore.clone().try_acquire_owned().map_err(|_| {
                format!(
                    "too many calls at once in this session: it already has {max} in progress (--max-concurrent-calls)\n  help: wait for a call to finish; calls of one session run one after another in its kernel anyway"
                )
            })?),
        };
        // Checked under the activity lock, which closing takes too: a call either enters before
        // the session is closed (and closing an idle session then finds it busy) or is refused.
        let mut activity = self.activity();
        if let Some(why) = self.closed() {
            return Err(why);
        }
        activity.active += 1;
        drop(activity);
        Ok(Entered {
            session: self.clone(),
            _permit: permit,
        })
    }

    /// Counts a running cell as activity until the returned guard is dropped (when the cell's
    /// driver ends).
    pub(crate) fn cell_running(&self) -> CellGuard {
        CellGuard::new(self.cells.clone())
    }

    /// How long the session has been idle: `None` while a call is in progress or a cell runs.
    pub(crate) fn idle_for(&self) -> Option<Duration> {
        let activity = self.activity();
        (activity.active == 0 && self.cells.load(Ordering::SeqCst) == 0)
            .then(|| activity.last_used.elapsed())
    }

    /// Marks the session closed, saying why (what a later call with its handle is told).
    pub(crate) fn mark_closed(&self, why: String) {
        let _activity = self.activity();
        *self.closed.lock().unwrap_or_else(|p| p.into_inner()) = Some(why);
    }

    /// Marks the session closed if it has been idle for at least `idle` (no call in progress,
    /// no running cell), atomically with respect to [`KernelSession::enter`]; returns whether
    /// it did.
    pub(crate) fn close_if_idle(&self, idle: Duration, why: String) -> bool {
        let activity = self.activity();
        let is_idle = activity.active == 0
            && self.cells.load(Ordering::SeqCst) == 0
            && activity.last_used.elapsed() >= idle;
        if is_idle {
            *self.closed.lock().unwrap_or_else(|p| p.into_inner()) = Some(why);
        }
        is_idle
    }

    /// Why the session was closed, if it was.
    pub(crate) fn closed(&self) -> Option<String> {
        self.closed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// A call in progress in a session (see [`KernelSession::enter`]).
pub(crate) struct Entered {
    pub(crate) session: Arc<KernelSession>,
    _permit: Option<OwnedSemaphorePermit>,
}

impl Drop for Entered {
    fn drop(&mut self) {
        let mut activity = self.session.activity();
        activity.active = activity.active.saturating_sub(1);
        activity.last_used = Instant::now();
    }
}

/// Where the kernel sessions of a server with many come from (the HTTP service's registry).
pub(crate) trait SessionSource: Send + Sync + 'static {
    /// The session `handle` names, if `caller` may use it; without a handle, a new session of
    /// `caller`. The error is the text for the model (what went wrong, what to do).
    fn resolve<'a>(
        &'a self,
        caller: &'a Caller,
        handle: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Arc<KernelSession>, String>>;

    /// The session's current handle (it changes when a kernel on a gateway is replaced);
    /// `None` while there is nothing to name (a gateway kernel that has not started).
    fn handle(&self, session: &KernelSession) -> Option<String>;

    /// Closes `session` (its MCP session ended): its kernel stops.
    fn close(&self, session: &Arc<KernelSession>, why: &str);

    /// What became of `closed`, a session this server held that is closed now: `Ok(Some)` if it
    /// was hibernated (it is restored now, or was already), `Ok(None)` if it is gone for good.
    /// The error is the text for the model (it could not be brought back).
    fn reopen<'a>(
        &'a self,
        caller: &'a Caller,
        closed: &'a Arc<KernelSession>,
    ) -> BoxFuture<'a, Result<Option<Arc<KernelSession>>, String>>;

    /// An executor of the shared workspace for what needs no kernel session
    /// (`register_mcp_server`).
    fn workspace_executor(&self) -> &CodeExecutor;

    /// The open sessions `caller` owns (their notebooks are `caller`'s to read).
    fn sessions_of(&self, caller: &Caller) -> Vec<Arc<KernelSession>>;

    /// Whether `install_package` may change the kernel environment every session shares.
    fn install_allowed(&self) -> bool;

    /// Whether clients may register MCP servers (the host starts what they name).
    fn register_allowed(&self) -> bool;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generations_count_kernel_changes() {
        let ex = CodeExecutor::builder().build();
        let s = KernelSession::new(ex, Caller::Local, [0; 16], None);
        assert_eq!(s.generation_of("k0"), 0);
        assert_eq!(s.generation_of("k0"), 0);
        assert_eq!(s.generation_of("k1"), 1);
        assert_eq!(s.generation_of("k2"), 2);
        let ex = CodeExecutor::builder().build();
        let s = KernelSession::new(ex, Caller::Local, [0; 16], None).continued("k5", 5);
        assert_eq!(s.generation_of("k5"), 5);
        assert_eq!(s.generation_of("k6"), 6);
    }
}
