//! [bin] Hibernation: what saving an idle session and bringing it back mean for the registry.
//!
//! - **Hibernate**: a session idle for `--hibernate-after` is snapshotted (its namespace, sealed
//!   to its id and owner, in the `SnapshotStore`), recorded ([`SessionStore`]) and its kernel
//!   stopped; it leaves `open` (it costs no RAM and does not count against `--max-sessions`). A
//!   session whose snapshot fails stays open (the log says why; retried once it is used again).
//! - **Checkpoint**: a named session (its handle was given out) idle for `--checkpoint-after`
//!   is snapshotted and stays open, once per burst of use: what a crash of the process (SIGKILL)
//!   loses is bounded by it.
//! - **Wake**: the next call with the handle (or, for a handshake-era MCP session, its next
//!   cell) gets a new kernel from `ExecutorFactory`, the snapshot restored into it, and the
//!   restore report at the top of its result. A snapshot taken in a more confined kernel than
//!   this service's (confined, then restarted with `--unconfined-sessions`; sandboxed under
//!   another policy) is refused and kept (`SnapshotError::Confinement`).
//! - **Expire**: a saved session unused for `--idle-timeout` has its snapshot and record deleted;
//!   `--snapshot-quota` bytes per owner: the owner's least recently used hibernated sessions are
//!   deleted to stay within it.
//!
//! - **Abandon**: a save whose session closed meanwhile (expiry, an MCP session's DELETE)
//!   waits for its snapshot's write and deletes it and any record; a sweep (at start, then every
//!   [`SWEEP_EVERY`]) removes snapshot directories no replica's record names, once older than
//!   [`SWEEP_GRACE`]. Every snapshot on disk belongs to a record.
//!
//! Every transition of one session (hibernate, checkpoint, wake, expire) holds that session's
//! lock, and a call that names the session takes it too: concurrent calls restore once, and a
//! call that arrives while the session hibernates waits and then restores it (it never runs in
//! a kernel behind the snapshot's back: the kernel is stopped only if no call entered since the
//! snapshot started).
//!
//! Not here: the snapshot format and seal (`ipybox::snapshot`), the records' files
//! ([`super::super::session_store`]).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ipybox::snapshot::{SnapshotBinding, SnapshotError, SnapshotStore};

use super::super::super::mcp_server::caller::Caller;
use super::super::super::mcp_server::session::KernelSession;
use super::super::super::metrics;
use super::super::session_store::{Record, SessionStore, hex, now_millis, owner_digest, secs_text};
use super::Registry;

/// How long a kernel may take to write or load a snapshot.
const SNAPSHOT_TIMEOUT: Duration = Duration::from_secs(300);

/// A snapshot directory no record names is removed once it has not changed for this long (a
/// save in flight, here or in another replica on the same storage, writes its record right
/// after its directory).
pub(crate) const SWEEP_GRACE: Duration = Duration::from_secs(120);

/// At shutdown, how long a cell interrupted at the end of `--shutdown-grace` has to end (the
/// executor replaces a kernel whose cell does not stop within its interrupt grace, 3 s).
pub(super) const CUT_WAIT: Duration = Duration::from_secs(10);

/// How often the reaper sweeps the snapshot directory (besides at start).
const SWEEP_EVERY: Duration = Duration::from_secs(300);

/// When and where sessions are saved (`None` in the registry: never).
pub(crate) struct Hibernation {
    pub(super) store: SnapshotStore,
    pub(super) records: SessionStore,
    /// `--hibernate-after` (`None`: sessions are only checkpointed).
    pub(super) after: Option<Duration>,
    /// `--checkpoint-after` (`None`: no checkpoints).
    pub(super) checkpoint_after: Option<Duration>,
    /// `--snapshot-quota`, bytes per owner.
    quota: Option<u64>,
    locks: Mutex<HashMap<[u8; 16], Arc<tokio::sync::Mutex<()>>>>,
    /// Sessions with a save in progress (the reaper starts one at a time per session).
    saving: Mutex<HashSet<[u8; 16]>>,
    /// The last use a stored snapshot of an open session covers.
    covered: Mutex<HashMap<[u8; 16], Instant>>,
    /// The last use a failed save was for (not tried again until the session is used again).
    failed: Mutex<HashMap<[u8; 16], Instant>>,
    /// When the snapshot directory was last swept.
    swept: Mutex<Instant>,
    /// One quota enforcement at a time (two saves of one token must not each count the
    /// other's snapshot and both delete).
    enforcing: Mutex<()>,
    /// Tokens (owner digests) left over `--snapshot-quota` by an enforcement that had to skip
    /// a session in a transition: looked at again by the next reap.
    over_quota: Mutex<HashSet<[u8; 32]>>,
}

/// A session's transition lock, held (see the module docs).
pub(super) struct IdGuard<'a> {
    hibernation: &'a Hibernation,
    id: [u8; 16],
    lock: Arc<tokio::sync::Mutex<()>>,
    guard: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl Drop for IdGuard<'_> {
    fn drop(&mut self) {
        self.guard.take();
        let mut locks = self.hibernation.locks();
        // Nobody else holds or waits for it (the map's reference and ours): forget it.
        if Arc::strong_count(&self.lock) == 2 {
            locks.remove(&self.id);
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Hibernation {
    pub(crate) fn new(
        store: SnapshotStore,
        records: SessionStore,
        after: Option<Duration>,
        checkpoint_after: Option<Duration>,
        quota: Option<u64>,
    ) -> Self {
        let store = match quota {
            Some(q) if q < store.limit() => store.with_limit(q),
            _ => store,
        };
        Self {
            store,
            records,
            after,
            checkpoint_after,
            quota,
            locks: Mutex::default(),
            saving: Mutex::default(),
            covered: Mutex::default(),
            failed: Mutex::default(),
            swept: Mutex::new(Instant::now()),
            enforcing: Mutex::default(),
            over_quota: Mutex::default(),
        }
    }

    fn locks(&self) -> std::sync::MutexGuard<'_, HashMap<[u8; 16], Arc<tokio::sync::Mutex<()>>>> {
        lock(&self.locks)
    }

    /// Takes session `id`'s transition lock.
    pub(super) async fn lock(&self, id: [u8; 16]) -> IdGuard<'_> {
        let lock = self.locks().entry(id).or_default().clone();
        let guard = lock.clone().lock_owned().await;
        IdGuard {
            hibernation: self,
            id,
            lock,
            guard: Some(guard),
        }
    }

    /// Session `id`'s transition lock, if nobody holds it now.
    fn try_lock(&self, id: [u8; 16]) -> Option<IdGuard<'_>> {
        let lock = self.locks().entry(id).or_default().clone();
        let guard = lock.clone().try_lock_owned().ok();
        let guard = IdGuard {
            hibernation: self,
            id,
            lock,
            guard,
        };
        guard.guard.is_some().then_some(guard)
    }

    fn binding(id: &[u8; 16], owner: &[u8; 32]) -> SnapshotBinding {
        SnapshotBinding::new(hex(id), owner.to_vec())
    }

    /// Deletes session `id`'s snapshot and record; returns the record if there was one.
    pub(super) fn forget(&self, id: &[u8; 16]) -> Option<Record> {
        self.forget_of(id, None)
    }

    /// [`Self::forget`], and with `owner` (the session's) its snapshot even when there is no
    /// record (a save of a session that closed meanwhile wrote one).
    pub(super) fn forget_of(&self, id: &[u8; 16], owner: Option<&[u8; 32]>) -> Option<Record> {
        lock(&self.covered).remove(id);
        lock(&self.failed).remove(id);
        let record = self.records.remove(id);
        let owner = record.as_ref().map(|r| &r.owner).or(owner)?;
        if let Err(e) = self.store.delete(&Self::binding(id, owner)) {
            tracing::warn!("cannot delete a saved session's snapshot: {e}");
        }
        record
    }

    /// After a save of `session` was cut short (shutdown): waits for its write, if one is in
    /// flight, and deletes what it wrote unless a record names it (an earlier checkpoint's
    /// record names the newer snapshot as well: same session, same seal).
    pub(super) async fn drop_unrecorded(&self, session: &KernelSession) {
        if self.records.get(&session.id).is_some() {
            return;
        }
        let binding = Self::binding(&session.id, &owner_digest(&session.owner));
        self.store.writes_settled(&binding).await;
        if self.records.get(&session.id).is_none()
            && let Err(e) = self.store.delete(&binding)
        {
            tracing::warn!(session = %session.tag, "cannot delete an unfinished save's snapshot: {e}");
        }
    }

    /// Shutdown: `session` still runs a cell and could not be saved again: its record (if it
    /// has one, from a checkpoint) says that what ran after that snapshot is lost, so the next
    /// call is told instead of getting an older state silently. Returns whether it had one.
    pub(super) fn mark_lost(&self, session: &KernelSession) -> bool {
        let Some(record) = self.records.get(&session.id) else {
            return false;
        };
        let lost = "Lost: what this session ran after this snapshot was taken. ipybox was shut down while a cell of this session was still running, and the cell did not stop when interrupted (its kernel was replaced, or it still ran when ipybox exited), so the session could not be saved again. Every call made after the snapshot's time, and that cell, are not in the state that came back; run them again if you need what they did.".to_string();
        match self.records.put(Record {
            lost: Some(lost),
            ..record
        }) {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(session = %session.tag, "cannot record what the session's restore will lack: {e}");
                false
            }
        }
    }

    /// Removes the snapshot directories no saved session of any replica names (and unfinished
    /// writes), once older than [`SWEEP_GRACE`]; logs what it removed.
    pub(super) fn sweep(&self) {
        let keep: HashSet<String> = self
            .records
            .everyone()
            .iter()
            .map(|(id, owner)| self.store.dir_name(&Self::binding(id, owner)))
            .collect();
        match self.store.sweep(&keep, SWEEP_GRACE) {
            Ok(swept) if swept.removed.is_empty() => {}
            Ok(swept) => tracing::info!(
                "removed {} snapshot directories no saved session names ({} bytes) from {}",
                swept.removed.len(),
                swept.bytes,
                self.store.root().display()
            ),
            Err(e) => tracing::warn!("cannot sweep the snapshot directory: {e}"),
        }
    }

    /// Whether `session` is due for a save now: hibernation (`Some(false)`) or a checkpoint
    /// (`Some(true)`).
    fn due(&self, session: &KernelSession, idle_timeout: Duration) -> Option<bool> {
        let idle = session.idle_for()?;
        if idle >= idle_timeout || lock(&self.saving).contains(&session.id) {
            return None;
        }
        let used = session.last_used();
        // A failed save is not tried again until the session is used again.
        if lock(&self.failed).get(&session.id) == Some(&used) {
            return None;
        }
        if self.after.is_some_and(|after| idle >= after) {
            return Some(false);
        }
        let covered = lock(&self.covered).get(&session.id) == Some(&used);
        if session.named() && !covered && self.checkpoint_after.is_some_and(|c| idle >= c) {
            return Some(true);
        }
        None
    }
}

async fn session_runtime(executor: &ipybox::CodeExecutor) -> Option<std::path::PathBuf> {
    executor.runtime_dir().await
}

fn tag_of(id: &[u8; 16]) -> String {
    hex(&id[..4])
}

impl Registry {
    /// Starts the saves that are due (called by [`Registry::reap`]) and expires saved sessions
    /// unused for the idle timeout.
    pub(super) fn reap_saved(self: &Arc<Self>) {
        let Some(sleep) = &self.sleep else { return };
        let open: Vec<Arc<KernelSession>> = self.open().values().cloned().collect();
        for session in open {
            let Some(keep_open) = sleep.due(&session, self.config.idle_timeout) else {
                continue;
            };
            lock(&sleep.saving).insert(session.id);
            let registry = self.clone();
            tokio::spawn(async move {
                let idle = if keep_open {
                    registry.sleep_ref().checkpoint_after
                } else {
                    registry.sleep_ref().after
                };
                registry
                    .save(&session, idle.unwrap_or_default(), keep_open)
                    .await;
                lock(&registry.sleep_ref().saving).remove(&session.id);
            });
        }
        {
            let mut swept = lock(&sleep.swept);
            if swept.elapsed() >= SWEEP_EVERY {
                *swept = Instant::now();
                let registry = self.clone();
                tokio::task::spawn_blocking(move || registry.sleep_ref().sweep());
            }
        }
        let over: Vec<[u8; 32]> = lock(&sleep.over_quota).drain().collect();
        for owner in over {
            self.enforce_quota(&owner, &[0; 16]);
        }
        let now = now_millis();
        let timeout = u64::try_from(self.config.idle_timeout.as_millis()).unwrap_or(u64::MAX);
        self.refresh_saved_gauge();
        for record in sleep.records.all() {
            if now.saturating_sub(record.last_used) < timeout
                || self.open().contains_key(&record.id)
            {
                continue;
            }
            let registry = self.clone();
            tokio::spawn(async move {
                let sleep = registry.sleep_ref();
                let _guard = sleep.lock(record.id).await;
                if registry.open().contains_key(&record.id) {
                    return;
                }
                if sleep.forget(&record.id).is_some() {
                    registry.expired(&record.id, "its saved state was deleted");
                    metrics::saved_session_expired();
                    registry.refresh_saved_gauge();
                }
            });
        }
    }

    /// Sets `ipybox_sessions_hibernated` to the sessions saved and not open now (after every
    /// reap and every change of the records, so the gauge never lags behind the counters).
    pub(super) fn refresh_saved_gauge(&self) {
        let records = self.sleep_ref().records.all();
        let open = self.open();
        let hibernated = records.iter().filter(|r| !open.contains_key(&r.id)).count();
        drop(open);
        metrics::set_sessions_saved(hibernated as u64);
    }

    fn sleep_ref(&self) -> &Hibernation {
        self.sleep
            .as_ref()
            .expect("only called with hibernation on")
    }

    /// Records that saved session `id` expired (`what`: what became of its state) and removes
    /// the files it left in the workspace.
    fn expired(&self, id: &[u8; 16], what: &str) {
        let tag = tag_of(id);
        tracing::info!(session = %tag, "saved session expired: {what}");
        self.closed().insert(
            *id,
            format!(
                "session {tag} expired: it was idle for more than {} s (--idle-timeout), so {what}\n  help: call without `session` to start a new session",
                secs_text(self.config.idle_timeout)
            ),
        );
        self.factory.remove_images(id);
    }

    /// Saves `session` if it is still open and idle for `idle`; unless `keep_open`, then stops
    /// its kernel (if no call entered meanwhile). Returns whether it hibernated.
    pub(super) async fn save(
        self: &Arc<Self>,
        session: &Arc<KernelSession>,
        idle: Duration,
        keep_open: bool,
    ) -> bool {
        let Some(sleep) = &self.sleep else {
            return false;
        };
        let _guard = sleep.lock(session.id).await;
        let current = self.open().get(&session.id).cloned();
        if !current.is_some_and(|c| Arc::ptr_eq(&c, session))
            || session.idle_for().is_none_or(|d| d < idle)
        {
            return false;
        }
        let used = session.last_used();
        let owner = owner_digest(&session.owner);
        let binding = Hibernation::binding(&session.id, &owner);
        let what = if keep_open {
            "checkpoint"
        } else {
            "hibernation"
        };
        let started = Instant::now();
        // A checkpoint taken since the last use already holds this state.
        let current = lock(&sleep.covered).get(&session.id) == Some(&used)
            && sleep.records.get(&session.id).is_some();
        if !current {
            let snapshot = session
                .executor
                .snapshot(&sleep.store, &binding, Some(SNAPSHOT_TIMEOUT))
                .await;
            // Closed meanwhile (expired, its MCP session ended): what was written is nobody's.
            if session.closed().is_some() {
                self.abandon(session, &owner, what).await;
                return false;
            }
            let report = match snapshot {
                Ok(report) => report,
                Err(e) => {
                    lock(&sleep.failed).insert(session.id, used);
                    tracing::warn!(
                        session = %session.tag,
                        "{what} failed, the session stays open: {}",
                        ipybox::log_text::escaped(&e.to_string())
                    );
                    return false;
                }
            };
            let record = Record {
                id: session.id,
                owner,
                last_used: now_millis()
                    .saturating_sub(u64::try_from(used.elapsed().as_millis()).unwrap_or(u64::MAX)),
                bytes: report.manifest.data_bytes,
                named: session.named(),
                runtime: session
                    .executor
                    .runtime_dir()
                    .await
                    .map(|d| d.display().to_string()),
                lost: None,
            };
            if let Err(e) = sleep.records.put(record) {
                lock(&sleep.failed).insert(session.id, used);
                tracing::warn!(session = %session.tag, "{what} failed, the session stays open: cannot write its record: {e}");
                return false;
            }
            // A close marks the session before it forgets its saved state: closed after the
            // check above, either this sees it or the close's forget sees the record.
            if session.closed().is_some() {
                self.abandon(session, &owner, what).await;
                return false;
            }
            lock(&sleep.covered).insert(session.id, used);
            self.enforce_quota(&owner, &session.id);
            tracing::info!(
                session = %session.tag,
                "{what}: {} names, {} bytes saved in {} ms",
                report.manifest.saved.len() + report.manifest.modules.len(),
                report.manifest.data_bytes,
                started.elapsed().as_millis()
            );
        } else {
            // A hibernation that reuses the checkpoint keeps it: the token's snapshots are
            // counted here too.
            self.enforce_quota(&owner, &session.id);
        }
        if keep_open {
            metrics::session_checkpointed();
            return false;
        }
        let message = format!(
            "session {} was being hibernated as this call arrived\n  help: call again with the same `session`: its state is restored",
            session.tag
        );
        // A call that entered since the snapshot began keeps the session open (the snapshot
        // stays as a checkpoint).
        if !session.close_if_idle(idle, message) {
            return false;
        }
        if self.remove_if_current(session) {
            metrics::session_hibernated();
            self.refresh_saved_gauge();
            tracing::info!(session = %session.tag, "session hibernated: its kernel is stopped until its next call");
            let executor = session.executor.clone();
            tokio::spawn(async move { executor.stop().await });
        }
        true
    }

    /// A save of `session` that closed while it was being saved: waits for the snapshot's write
    /// (it may still be in flight on a blocking thread), then deletes it and any record.
    async fn abandon(&self, session: &KernelSession, owner: &[u8; 32], what: &str) {
        let sleep = self.sleep_ref();
        sleep
            .store
            .writes_settled(&Hibernation::binding(&session.id, owner))
            .await;
        sleep.forget_of(&session.id, Some(owner));
        self.refresh_saved_gauge();
        tracing::info!(
            session = %session.tag,
            "{what} abandoned: the session was closed while it was being saved; its snapshot was deleted"
        );
    }

    /// Keeps `owner`'s snapshots within `--snapshot-quota`: counted on disk (the files of each
    /// snapshot, not what the records say), over every snapshot of the token that any replica
    /// on this snapshot directory has a record of; past it, deletes this replica's least
    /// recently used snapshots of the token first, never `keep`'s (the one just kept). A
    /// hibernated session's deletion ends it (its handle is told why); an open session's
    /// checkpoint is only deleted (the session stays open; a crash would now lose it). Called
    /// on every path that keeps a snapshot: a save (fresh, or a hibernation that reuses a
    /// checkpoint), a checkpoint, a restore (which keeps the snapshot it came from).
    ///
    /// A session in a transition of its own (its lock is held: being saved or restored) is
    /// not touched; the token is then looked at again at the next reap until it fits.
    pub(super) fn enforce_quota(&self, owner: &[u8; 32], keep: &[u8; 16]) {
        let sleep = self.sleep_ref();
        let Some(quota) = sleep.quota else { return };
        let _serial = lock(&sleep.enforcing);
        let mut seen = HashSet::new();
        let mut total: u64 = sleep
            .records
            .everyone()
            .into_iter()
            .filter(|(id, o)| o == owner && seen.insert(*id))
            .map(|(id, o)| sleep.store.disk_bytes(&Hibernation::binding(&id, &o)))
            .sum();
        let mut mine: Vec<Record> = sleep
            .records
            .all()
            .into_iter()
            .filter(|r| r.owner == *owner && r.id != *keep)
            .collect();
        mine.sort_by_key(|r| r.last_used);
        for record in mine {
            if total <= quota {
                break;
            }
            // Its own transition (a save, a restore) holds its lock: not now.
            let Some(_guard) = sleep.try_lock(record.id) else {
                continue;
            };
            let bytes = sleep
                .store
                .disk_bytes(&Hibernation::binding(&record.id, &record.owner));
            let open = self.open().get(&record.id).cloned();
            if sleep.forget(&record.id).is_none() {
                continue;
            }
            total = total.saturating_sub(bytes);
            let tag = tag_of(&record.id);
            if let Some(session) = open {
                // Not saved again until it is used again (its next save is a fresh one).
                lock(&sleep.covered).insert(record.id, session.last_used());
                tracing::info!(session = %tag, "an open session's checkpoint deleted ({bytes} bytes): its token's snapshots passed --snapshot-quota; the session stays open");
                continue;
            }
            tracing::info!(session = %tag, "hibernated session deleted: its token's snapshots passed --snapshot-quota");
            self.closed().insert(
                record.id,
                format!(
                    "session {tag} expired: its saved state was deleted to keep this token's hibernated sessions within {} bytes (--snapshot-quota), least recently used first\n  help: call without `session` to start a new session",
                    quota
                ),
            );
            self.factory.remove_images(&record.id);
            metrics::saved_session_expired();
        }
        self.refresh_saved_gauge();
        let mut over = lock(&sleep.over_quota);
        if total > quota {
            over.insert(*owner);
            tracing::warn!(
                "a token's snapshots take {total} bytes, over --snapshot-quota {quota}: the rest are in a save or restore now, or another replica's; looked at again at the next reap"
            );
        } else {
            over.remove(owner);
        }
    }

    /// Brings saved session `id` back for `caller` (who holds its transition lock): `Ok(None)`
    /// if nothing is saved for it.
    pub(super) async fn wake(
        self: &Arc<Self>,
        caller: &Caller,
        id: [u8; 16],
    ) -> Result<Option<Arc<KernelSession>>, String> {
        let Some(sleep) = &self.sleep else {
            return Ok(None);
        };
        if let Some(session) = self.open().get(&id).cloned() {
            if session.owner != *caller {
                return Err(super::super::handle::Invalid::NotYours.message());
            }
            if session.closed().is_none() {
                session.touch();
                return Ok(Some(session));
            }
        }
        let Some(record) = sleep.records.get(&id) else {
            return Ok(None);
        };
        if !sleep.records.still_mine(&id) {
            tracing::warn!(session = %tag_of(&id), "another replica took this session over (this one seemed dead to it)");
            return Ok(None);
        }
        let tag = tag_of(&id);
        if record.owner != owner_digest(caller) {
            return Err(super::super::handle::Invalid::NotYours.message());
        }
        self.refuse_more(caller)?;
        let started = Instant::now();
        // Its notebook counts against its owner's quota from the restore's first write on.
        let fate = self.factory.notebook_fate(&id, caller);
        let executor = self.factory.executor(&id, None);
        if let Err(e) = executor.start().await {
            executor.stop().await;
            return Err(format!(
                "cannot start a kernel to restore session {tag}: {e}\n  help: retry in a moment; its saved state is kept"
            ));
        }
        let binding = Hibernation::binding(&id, &record.owner);
        let mut report = match executor
            .restore(&sleep.store, &binding, Some(SNAPSHOT_TIMEOUT))
            .await
        {
            Ok(report) => report,
            Err(e) => {
                executor.stop().await;
                let permanent = matches!(
                    e,
                    SnapshotError::Refused { .. }
                        | SnapshotError::Invalid { .. }
                        | SnapshotError::NotFound { .. }
                );
                tracing::warn!(session = %tag, "restoring the session failed: {}", ipybox::log_text::escaped(&e.to_string()));
                // Saved by a more confined kernel than this service's (a restart with other
                // flags, e.g. --unconfined-sessions): kept for a service that may restore it.
                if matches!(e, SnapshotError::Confinement { .. }) {
                    return Err(format!(
                        "session {tag} cannot be restored by this service: {e}\n  help: or call without `session` to start a new session here"
                    ));
                }
                if !permanent {
                    return Err(format!(
                        "cannot restore session {tag}: {e}\n  help: retry in a moment; its saved state is kept"
                    ));
                }
                sleep.forget(&id);
                self.refresh_saved_gauge();
                let why = format!(
                    "session {tag} cannot be restored: {}; its saved state was deleted\n  help: call without `session` to start a new session",
                    e.to_string().lines().next().unwrap_or_default()
                );
                self.closed().insert(id, why.clone());
                self.factory.remove_images(&id);
                return Err(why);
            }
        };
        let mut session = KernelSession::new(
            executor,
            caller.clone(),
            id,
            self.config.max_concurrent_calls,
        );
        if let Some(fate) = fate {
            session = session.with_notebook_fate(fate);
        }
        let session = Arc::new(session);
        // A confined kernel works in a directory of its own (`<runtime>/work`), gone with the
        // kernel that was saved: the new kernel is in its own, and the model is told that the
        // files of the old one did not come back.
        let mut files_gone = false;
        if let (Some(cwd), Some(old)) = (&mut report.cwd, &record.runtime)
            && !cwd.restored
            && std::path::Path::new(&cwd.path).starts_with(old)
            && let Some(new) = session_runtime(&session.executor).await
        {
            cwd.path = new.join("work").display().to_string();
            cwd.restored = true;
            cwd.reason = None;
            files_gone = true;
        }
        let mut text = report.text();
        if files_gone {
            text.push_str("\nThe working directory is a new one: files written in the old one did not come back (only the kernel's state is saved).");
        }
        if let Some(lost) = &record.lost {
            text.push('\n');
            text.push_str(lost);
            // Told once: the record goes on without it.
            let told = Record {
                lost: None,
                ..record.clone()
            };
            if let Err(e) = sleep.records.put(told) {
                tracing::warn!(session = %tag, "cannot update the session's record: {e}");
            }
        }
        session.set_restored(text);
        if record.named {
            session.set_named();
        }
        {
            let mut open = self.open();
            if let Err(why) = self.refuse_with(&open, caller) {
                drop(open);
                let executor = session.executor.clone();
                tokio::spawn(async move { executor.stop().await });
                return Err(why);
            }
            open.insert(id, session.clone());
        }
        // The snapshot holds exactly this state: no checkpoint until it is used.
        lock(&sleep.covered).insert(id, session.last_used());
        // The snapshot stays (as the open session's checkpoint): it counts against the quota
        // (one taken under a larger one, before a restart, too).
        self.enforce_quota(&record.owner, &id);
        metrics::session_restored();
        self.refresh_saved_gauge();
        tracing::info!(
            session = %tag,
            "session restored in {} ms ({} names back, {} not)",
            started.elapsed().as_millis(),
            report.restored.len() + report.modules.len(),
            report.failed.len() + report.not_saved.len()
        );
        Ok(Some(session))
    }
}
