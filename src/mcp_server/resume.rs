//! A resumed stdio conversation gets its kernel state back (issue 30, "over stdio").
//!
//! The stdio server's one kernel session gets a handle, `ipybox-s1.stdio.<payload>`: a random
//! 128-bit id per server start and a 128-bit tag, HMAC-SHA256 under the kept session key
//! (`$IPYBOX_HOME/keys/session.key`, see [`ipybox::snapshot::host_key`]) of the workspace's
//! digest and the id. So a handle cannot be forged or altered, and a handle made in another
//! workspace does not verify here. The first result of a conversation names the handle; the
//! model passes it as `session` in later calls.
//!
//! Checkpoints: when the session has been idle for `--checkpoint-after` (default 3 s) after a
//! cell or a reset, its kernel is snapshotted into the host's store
//! ([`SnapshotStore::for_host`]), bound to (session id, workspace digest) and sealed with the
//! kernel's confinement (`--sandbox` and its policy, or none): a server without the sandbox, or
//! with another policy, refuses to resume a sandboxed session (the model is told why and how to
//! resume it; the snapshot is kept, and the live kernel is untouched). A running cell is never
//! waited for or interrupted (the checkpoint waits for the session to be idle), and nothing is
//! saved at exit: the server still leaves within 100 ms of stdin's end (a checkpoint in
//! progress is abandoned; the previous one stays whole, the store swaps snapshots in atomically).
//!
//! A call whose `session` names a saved session that is not the live one (a conversation resumed
//! with `claude --resume`, a reconnected server) has that snapshot restored into the kernel, and
//! the live session becomes that one; the state the kernel had is checkpointed first, under its
//! own handle, if it changed since its last checkpoint. The restore report is the start of the
//! call's result ([`KernelSession::set_restored`]). A new conversation (no `session`) gets the
//! fresh kernel of this server start and is told of no other session.
//!
//! Stdio sessions' snapshots expire [`EXPIRE_AFTER`] after their last checkpoint; the server
//! deletes expired ones (of every workspace) when it starts. `$IPYBOX_HOME/stdio-sessions/`
//! (0700) lists them, one empty 0600 file `<workspace digest>-<id>` each, whose mtime is the
//! last checkpoint: snapshot directories are named under the seal key and cannot be listed by
//! session.
//!
//! Not here: HTTP sessions and their handles (`crate::http`), taking and loading snapshots
//! (`ipybox::snapshot`, [`ipybox::CodeExecutor::snapshot`]/`restore`).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest, Sha256};

use ipybox::kernel::KernelError;
use ipybox::snapshot::{SnapshotBinding, SnapshotError, SnapshotStore};

use super::session::KernelSession;

/// The prefix of stdio session handles.
const PREFIX: &str = "ipybox-s1.stdio.";
const TAG_LEN: usize = 16;
/// A stdio session's snapshot is deleted this long after its last checkpoint.
pub(crate) const EXPIRE_AFTER: Duration = Duration::from_secs(14 * 24 * 3600);
/// A store's temporary directory this old is left over from a write that never finished.
const STALE_TMP: Duration = Duration::from_secs(3600);
/// What the kernel's part of a checkpoint or a restore may take.
const KERNEL_TIMEOUT: Option<Duration> = Some(Duration::from_secs(300));
/// The directory (under the data directory) that lists stdio sessions' snapshots.
const INDEX_DIR: &str = "stdio-sessions";

/// Whether a checkpoint or a restore is under way: its store write or copy runs on a blocking
/// thread that the process's exit should not wait for (see [`snapshot_in_flight`]).
static IN_FLIGHT: AtomicBool = AtomicBool::new(false);

/// Whether a checkpoint or restore is under way (the binary then waits less for blocking
/// threads at exit: the store keeps the previous snapshot whole).
pub(crate) fn snapshot_in_flight() -> bool {
    IN_FLIGHT.load(Ordering::SeqCst)
}

/// Marks a checkpoint or restore under way until [`InFlight::done`]. A future dropped before
/// (the executor stopped at exit) leaves the mark: its blocking thread may still be writing.
struct InFlight;

impl InFlight {
    fn start() -> Self {
        IN_FLIGHT.store(true, Ordering::SeqCst);
        Self
    }

    /// Clears the mark, unless `result` says the executor stopped (it returns at once then,
    /// while the blocking thread may still be writing).
    fn done<T>(self, result: Result<T, SnapshotError>) -> Result<T, SnapshotError> {
        if !matches!(result, Err(SnapshotError::Kernel(KernelError::Stopped))) {
            IN_FLIGHT.store(false, Ordering::SeqCst);
        }
        result
    }
}

/// The stdio server's resumable session: its handle, checkpoints and restores.
pub(crate) struct Resume {
    store: SnapshotStore,
    /// The handle key of this workspace (derived from the kept session key).
    key: [u8; 32],
    /// The workspace's digest: the snapshots' owner.
    owner: [u8; 32],
    index: PathBuf,
    checkpoint_after: Duration,
    live: Mutex<Live>,
    /// Held by a checkpoint and by a switch to another session, so they never interleave.
    switching: tokio::sync::Mutex<()>,
    /// The kernel's state changed since the last checkpoint.
    dirty: AtomicBool,
    changed: tokio::sync::Notify,
}

struct Live {
    /// The live session's id.
    id: [u8; 16],
    /// The id the model was last given or passed (a result names the handle when it differs).
    announced: Option<[u8; 16]>,
}

impl Resume {
    /// Resuming in `workspace` with the data directory `data_dir`: the store, the key and the
    /// index are made if missing; expired stdio sessions are deleted in the background.
    pub(crate) fn open(
        data_dir: &Path,
        workspace: &Path,
        checkpoint_after: Duration,
    ) -> Result<Self, String> {
        let store = SnapshotStore::open(
            data_dir.join("snapshots"),
            &data_dir.join("keys").join("snapshot.key"),
        )
        .map_err(|e| e.to_string())?;
        let session_key = ipybox::snapshot::host_key(&ipybox::snapshot::session_key_path(data_dir))
            .map_err(|e| format!("the session key: {e}"))?;
        let owner = workspace_digest(workspace);
        let mut mac = hmac(&session_key);
        mac.update(b"ipybox stdio handle key v1\0");
        mac.update(&owner);
        let key: [u8; 32] = mac.finalize().into_bytes().into();
        let index = data_dir.join(INDEX_DIR);
        private_dir(&index).map_err(|e| format!("{}: {e}", index.display()))?;
        let resume = Self {
            store,
            key,
            owner,
            index,
            checkpoint_after,
            live: Mutex::new(Live {
                id: rand::random(),
                announced: None,
            }),
            switching: tokio::sync::Mutex::new(()),
            dirty: AtomicBool::new(false),
            changed: tokio::sync::Notify::new(),
        };
        let (store, index) = (resume.store.clone(), resume.index.clone());
        tokio::task::spawn_blocking(move || expire(&store, &index, SystemTime::now()));
        Ok(resume)
    }

    fn live(&self) -> std::sync::MutexGuard<'_, Live> {
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn binding(&self, id: &[u8; 16]) -> SnapshotBinding {
        SnapshotBinding::new(hex(id), self.owner.to_vec())
    }

    fn tag(&self, id: &[u8; 16]) -> [u8; TAG_LEN] {
        let mut mac = hmac(&self.key);
        mac.update(b"ipybox stdio session handle v1\0");
        mac.update(id);
        let full = mac.finalize().into_bytes();
        let mut tag = [0; TAG_LEN];
        tag.copy_from_slice(&full[..TAG_LEN]);
        tag
    }

    /// The handle of session `id`.
    pub(crate) fn handle(&self, id: &[u8; 16]) -> String {
        let mut body = id.to_vec();
        body.extend_from_slice(&self.tag(id));
        format!("{PREFIX}{}", URL_SAFE_NO_PAD.encode(body))
    }

    /// The session `text` names, if it is a handle of this workspace (else the error for the
    /// model).
    fn decode(&self, text: &str) -> Result<[u8; 16], String> {
        const CONTINUE: &str = "leave `session` out to continue with the current kernel (its state is what this conversation built since the server started)";
        let text = text.trim();
        let Some(payload) = text.strip_prefix(PREFIX) else {
            if text.starts_with("ipybox-s1.") {
                return Err(format!(
                    "this is a session handle of an ipybox HTTP service, not of this stdio server\n  help: {CONTINUE}"
                ));
            }
            return Err(format!(
                "this is not an ipybox session handle (they look like `{PREFIX}<...>`)\n  help: pass the handle exactly as a result named it, or {CONTINUE}"
            ));
        };
        let bytes = URL_SAFE_NO_PAD
            .decode(payload)
            .ok()
            .filter(|b| b.len() == 16 + TAG_LEN)
            .ok_or_else(|| {
                format!(
                    "this is not an ipybox session handle: it was cut or altered\n  help: pass the handle exactly as a result named it, or {CONTINUE}"
                )
            })?;
        let mut id = [0; 16];
        id.copy_from_slice(&bytes[..16]);
        if !bool::from(subtle::ConstantTimeEq::ct_eq(
            &self.tag(&id)[..],
            &bytes[16..],
        )) {
            return Err(format!(
                "this session handle is not valid here: it was made for another workspace, altered, or made with another ipybox data directory (IPYBOX_HOME)\n  help: {CONTINUE}"
            ));
        }
        Ok(id)
    }

    /// The kernel's state changed (a cell started, a reset): a checkpoint follows once the
    /// session has been idle for `--checkpoint-after`.
    pub(crate) fn changed(&self) {
        self.dirty.store(true, Ordering::SeqCst);
        self.changed.notify_one();
    }

    /// Resolves a call's `given` handle for `session` and returns the note its result ends
    /// with, if any. Without a handle: the live session, named in the result when the model
    /// was not told it yet. With the live session's handle: nothing to do. With another saved
    /// session's: the live state is checkpointed (if it changed), then that session's snapshot
    /// is restored (`restore`; a reset only switches) and it becomes the live one; the restore
    /// report starts the result. An invalid handle, or one that names nothing saved: the error
    /// for the model, and nothing changes.
    pub(crate) async fn resolve(
        &self,
        session: &KernelSession,
        given: Option<&str>,
        restore: bool,
    ) -> Result<Option<String>, String> {
        let Some(given) = given else {
            let mut live = self.live();
            if live.announced == Some(live.id) {
                return Ok(None);
            }
            live.announced = Some(live.id);
            let handle = self.handle(&live.id);
            return Ok(Some(format!(
                "[ipybox session {handle}: pass session=\"{handle}\" in later calls; a resumed conversation passes it to get its state back]"
            )));
        };
        let id = self.decode(given)?;
        let _switching = self.switching.lock().await;
        let previous = {
            let mut live = self.live();
            if live.id == id {
                live.announced = Some(id);
                return Ok(None);
            }
            live.id
        };
        let binding = self.binding(&id);
        if !self.store.contains(&binding) {
            return Err(format!(
                "session {} has no saved state: it ended before its first checkpoint (ipybox saves a session {} s after its last cell), expired ({} days after its last checkpoint), or its snapshot was deleted\n  help: leave `session` out to continue with the current kernel, and run the cells that built what you need again",
                given.trim(),
                self.checkpoint_after.as_secs_f64(),
                EXPIRE_AFTER.as_secs() / 86_400
            ));
        }
        // Before anything changes: a snapshot this kernel may not load (taken in a more confined
        // kernel: a sandboxed session resumed without the sandbox) is refused, for a reset too
        // (which would otherwise switch to the session and overwrite its snapshot at the next
        // checkpoint). It stays in the store, and the live session keeps its kernel.
        if let Err(e) = session.executor.start().await {
            return Err(format!("the kernel could not be started: {e}"));
        }
        if let Err(e) = session.executor.check_restore(&self.store, &binding).await {
            return Err(format!(
                "session {} cannot be resumed here: {e}\n  help: leave `session` out to continue with the current kernel (its state is unchanged)",
                given.trim()
            ));
        }
        // What the kernel holds now stays reachable under its own handle.
        let mut kept = None;
        if self.dirty.swap(false, Ordering::SeqCst) {
            match self.checkpoint(session, &previous).await {
                Ok(()) => kept = Some(self.handle(&previous)),
                Err(e) => tracing::warn!(
                    "the live session could not be saved before switching: {}",
                    ipybox::log_text::escaped(&e.to_string())
                ),
            }
        }
        let mut text = String::new();
        if restore {
            let in_flight = InFlight::start();
            let restored = session
                .executor
                .restore(&self.store, &binding, KERNEL_TIMEOUT)
                .await;
            match in_flight.done(restored) {
                Ok(report) => text = report.text(),
                Err(e) => {
                    return Err(format!(
                        "session {} could not be restored: {e}\n  help: leave `session` out to continue with the current kernel",
                        given.trim()
                    ));
                }
            }
        }
        {
            let mut live = self.live();
            live.id = id;
            live.announced = Some(id);
        }
        self.touch(&id);
        if let Some(kept) = kept {
            if !text.is_empty() {
                text.push('\n');
            }
            text.push_str(&format!(
                "[ipybox: the kernel's previous state was saved as session {kept}; pass it as `session` to switch back]"
            ));
        }
        if !text.is_empty() {
            session.set_restored(text);
        }
        Ok(None)
    }

    /// Snapshots the kernel for session `id` and records it in the index.
    async fn checkpoint(
        &self,
        session: &KernelSession,
        id: &[u8; 16],
    ) -> Result<(), SnapshotError> {
        let in_flight = InFlight::start();
        let saved = session
            .executor
            .snapshot(&self.store, &self.binding(id), KERNEL_TIMEOUT)
            .await;
        in_flight.done(saved)?;
        self.touch(id);
        Ok(())
    }

    /// Records (or refreshes) session `id` in the index: its expiry counts from now.
    fn touch(&self, id: &[u8; 16]) {
        let path = self.index.join(format!("{}-{}", hex(&self.owner), hex(id)));
        if let Err(e) = write_private(&path) {
            tracing::warn!(
                "cannot record the session's checkpoint in {}: {e}",
                self.index.display()
            );
        }
    }

    /// Checkpoints `session` whenever it has been idle for `--checkpoint-after` after a change,
    /// until the executor stops.
    pub(crate) async fn checkpoints(self: Arc<Self>, session: Arc<KernelSession>) {
        loop {
            if !self.dirty.load(Ordering::SeqCst) {
                self.changed.notified().await;
                continue;
            }
            // Idle (no call, no running cell) for the whole wait.
            loop {
                match session.idle_for() {
                    Some(idle) if idle >= self.checkpoint_after => break,
                    Some(idle) => tokio::time::sleep(self.checkpoint_after - idle).await,
                    None => tokio::time::sleep(self.checkpoint_after).await,
                }
            }
            let _switching = self.switching.lock().await;
            if session
                .idle_for()
                .is_none_or(|idle| idle < self.checkpoint_after)
            {
                continue;
            }
            if !self.dirty.swap(false, Ordering::SeqCst) {
                continue;
            }
            let id = self.live().id;
            let started = std::time::Instant::now();
            match self.checkpoint(&session, &id).await {
                Ok(()) => tracing::debug!(
                    "session checkpointed in {} ms",
                    started.elapsed().as_millis()
                ),
                Err(SnapshotError::Kernel(KernelError::Stopped)) => return,
                // The next change tries again.
                Err(e) => tracing::warn!(
                    "the session could not be checkpointed: {}",
                    ipybox::log_text::escaped(&e.to_string())
                ),
            }
        }
    }
}

fn hmac(key: &[u8]) -> Hmac<Sha256> {
    <Hmac<Sha256> as KeyInit>::new_from_slice(key).expect("HMAC accepts keys of any length")
}

/// The owner of a workspace's stdio sessions: a digest of its path.
fn workspace_digest(workspace: &Path) -> [u8; 32] {
    use std::os::unix::ffi::OsStrExt;
    let mut digest = Sha256::new();
    digest.update(b"ipybox stdio workspace v1\0");
    digest.update(workspace.as_os_str().as_bytes());
    digest.finalize().into()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex<const N: usize>(s: &str) -> Option<[u8; N]> {
    if s.len() != 2 * N || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let mut out = [0; N];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

/// Creates `dir` (0700) if missing; refuses a link or a directory others may write.
fn private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    match std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
    {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let meta = std::fs::symlink_metadata(dir)?;
    if !meta.is_dir() || meta.mode() & 0o022 != 0 {
        return Err(std::io::Error::other(
            "not a private directory (a link, or writable by others)",
        ));
    }
    Ok(())
}

/// Creates or truncates the empty 0600 file at `path` (never through a link): its mtime is now.
fn write_private(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map(drop)
}

/// Deletes the stdio sessions (every workspace's) whose last checkpoint is older than
/// [`EXPIRE_AFTER`] at `now`, with their snapshots; and index entries whose snapshot is gone.
fn expire(store: &SnapshotStore, index: &Path, now: SystemTime) {
    // A checkpoint abandoned at exit leaves its temporary directory (a write takes seconds at
    // most; an hour old is nobody's).
    if let Ok(entries) = std::fs::read_dir(store.root()) {
        for entry in entries.flatten() {
            let stale = entry
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| now.duration_since(t).ok())
                .is_some_and(|age| age >= STALE_TMP);
            if stale && entry.file_name().to_string_lossy().starts_with(".tmp-") {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }
    let Ok(entries) = std::fs::read_dir(index) else {
        return;
    };
    let mut deleted = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some((owner, id)) = name.to_str().and_then(|n| n.split_once('-')) else {
            continue;
        };
        let (Some(owner), Some(id)) = (unhex::<32>(owner), unhex::<16>(id)) else {
            continue;
        };
        let binding = SnapshotBinding::new(hex(&id), owner.to_vec());
        let old = entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| now.duration_since(t).ok())
            .is_some_and(|age| age >= EXPIRE_AFTER);
        if old || !store.contains(&binding) {
            if old && let Err(e) = store.delete(&binding) {
                tracing::warn!("cannot delete an expired session snapshot: {e}");
                continue;
            }
            let _ = std::fs::remove_file(entry.path());
            deleted += usize::from(old);
        }
    }
    if deleted > 0 {
        tracing::info!(
            "deleted {deleted} stdio session snapshot(s) older than {} days",
            EXPIRE_AFTER.as_secs() / 86_400
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resume(data: &Path, workspace: &Path) -> Resume {
        Resume::open(data, workspace, Duration::from_secs(3)).unwrap()
    }

    #[tokio::test]
    async fn handles_verify_in_their_workspace_only() {
        let t = tempfile::tempdir().unwrap();
        let a = resume(t.path(), Path::new("/work/a"));
        let again = resume(t.path(), Path::new("/work/a"));
        let b = resume(t.path(), Path::new("/work/b"));
        let id = [7; 16];
        let h = a.handle(&id);
        assert!(h.starts_with("ipybox-s1.stdio."), "{h}");
        // Kept key: the next server start of the same workspace verifies it.
        assert_eq!(again.decode(&h), Ok(id));
        let err = b.decode(&h).unwrap_err();
        assert!(err.contains("made for another workspace"), "{err}");
        // One character changed.
        let mut altered = h.clone().into_bytes();
        let last = altered.len() - 1;
        altered[last] = if altered[last] == b'A' { b'B' } else { b'A' };
        let err = a
            .decode(std::str::from_utf8(&altered).unwrap())
            .unwrap_err();
        assert!(
            err.contains("not valid here") || err.contains("cut or altered"),
            "{err}"
        );
        let err = a.decode("ipybox-s1.r1.abc").unwrap_err();
        assert!(err.contains("HTTP service"), "{err}");
        assert!(a.decode("x").unwrap_err().contains("help: "));
        // Another data directory: another key.
        let t2 = tempfile::tempdir().unwrap();
        assert!(resume(t2.path(), Path::new("/work/a")).decode(&h).is_err());
    }

    #[tokio::test]
    async fn expiry_deletes_old_sessions_only() {
        let t = tempfile::tempdir().unwrap();
        let r = resume(t.path(), Path::new("/work/a"));
        r.touch(&[1; 16]);
        let entry = r
            .index
            .join(format!("{}-{}", hex(&r.owner), hex(&[1u8; 16])));
        assert!(entry.is_file());
        // No snapshot behind it: the entry goes.
        expire(&r.store, &r.index, SystemTime::now());
        assert!(!entry.exists());
        assert_eq!(unhex::<2>("0aff"), Some([10, 255]));
        assert_eq!(unhex::<2>("0af"), None);
    }
}
