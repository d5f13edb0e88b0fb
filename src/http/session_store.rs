//! [bin] What the HTTP service knows about sessions whose state is saved (hibernated, or
//! checkpointed while open), kept on disk so that a new process of the same replica finds them:
//! `$IPYBOX_HOME/sessions/<replica>/<session id hex>.json` (0600 in 0700 directories, host-only:
//! confined kernels see ipybox's data directory empty).
//!
//! A record holds the session's id, a digest of its owner's credential (never the token, see
//! [`owner_digest`]), when it was last used, how many bytes its snapshot holds and whether a
//! client was given its handle. The snapshot itself is in the `SnapshotStore`, sealed to the
//! same session and owner.
//!
//! One process at a time serves a replica's records: it holds an exclusive `flock` on
//! `sessions/<replica>/lock` for its life (the kernel releases it when the process dies, even by
//! SIGKILL). A second process of the same replica name on the same data directory does not get
//! the lock and keeps its records in memory only (its sessions still hibernate, but do not
//! outlive it), with a warning.
//!
//! Not here: when sessions hibernate or wake (`sessions::hibernate`), the snapshots.

use std::collections::HashMap;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::super::mcp_server::caller::Caller;

/// How often a replica on shared storage renews its lease (`--snapshot-dir`).
const HEARTBEAT: std::time::Duration = std::time::Duration::from_secs(2);
/// A replica whose lease is older than this (and whose lock is free) is dead: another replica
/// may take its saved sessions over.
pub(crate) const LEASE_STALE: std::time::Duration = std::time::Duration::from_secs(10);

/// The largest record file read (a record is ~200 bytes).
const MAX_RECORD: u64 = 4096;

/// The owner bytes of a session's snapshot and record: SHA-256 over a domain string and the
/// caller's binding (itself a SHA-256 of the bearer token), so neither the token nor the digest
/// handles are bound to is on disk.
pub(crate) fn owner_digest(caller: &Caller) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(b"ipybox session owner v1\0");
    h.update(caller.binding());
    h.finalize().into()
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex<const N: usize>(s: &str) -> Option<[u8; N]> {
    if s.len() != 2 * N || !s.is_ascii() {
        return None;
    }
    let mut out = [0; N];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

/// Seconds since the Unix epoch, now.
pub(crate) fn now_secs() -> u64 {
    now_millis() / 1000
}

/// Milliseconds since the Unix epoch, now.
pub(crate) fn now_millis() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// A duration as a number of seconds for people, fractions kept (`1.6`, `0.25`, `30`): what
/// messages and the log say of a flag given in seconds.
pub(crate) fn secs_text(d: std::time::Duration) -> String {
    let text = format!("{:.3}", d.as_secs_f64());
    text.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// A session whose state is saved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Record {
    pub(crate) id: [u8; 16],
    pub(crate) owner: [u8; 32],
    /// When the session was last used (milliseconds since the Unix epoch, the host's clock).
    pub(crate) last_used: u64,
    /// The snapshot's data bytes (what counts against `--snapshot-quota`).
    pub(crate) bytes: u64,
    /// Whether a client was given the session's handle (it can come back after a restart).
    pub(crate) named: bool,
    /// The runtime directory of the kernel that was saved (its working directory `work/` is
    /// that kernel's own, gone with it).
    pub(crate) runtime: Option<String>,
    /// What the snapshot does not hold that the session's client was told had run (a shutdown
    /// could not save it again), for the model, told once with the restore report.
    pub(crate) lost: Option<String>,
}

#[derive(Serialize, Deserialize)]
struct RecordFile {
    format: u32,
    id: String,
    owner: String,
    /// Seconds since the Unix epoch (what older records hold).
    last_used: u64,
    /// Milliseconds since the Unix epoch (fractional idle timeouts); absent in older records.
    #[serde(default)]
    last_used_ms: Option<u64>,
    bytes: u64,
    named: bool,
    #[serde(default)]
    runtime: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    lost: Option<String>,
}

impl Record {
    fn to_file(&self) -> RecordFile {
        RecordFile {
            format: 1,
            id: hex(&self.id),
            owner: hex(&self.owner),
            last_used: self.last_used / 1000,
            last_used_ms: Some(self.last_used),
            bytes: self.bytes,
            named: self.named,
            runtime: self.runtime.clone(),
            lost: self.lost.clone(),
        }
    }

    fn from_file(file: RecordFile) -> Option<Self> {
        (file.format == 1).then_some(())?;
        Some(Self {
            id: unhex(&file.id)?,
            owner: unhex(&file.owner)?,
            last_used: file
                .last_used_ms
                .unwrap_or(file.last_used.saturating_mul(1000)),
            bytes: file.bytes,
            named: file.named,
            runtime: file.runtime,
            lost: file.lost,
        })
    }
}

/// The records of one replica: in memory, and on disk when this process holds the replica's
/// lock.
pub(crate) struct SessionStore {
    /// The replica's directory and its lock (held while this value lives); `None`: memory only.
    disk: Option<(PathBuf, std::fs::File)>,
    /// `<data dir>/sessions`: every replica's records (what the sweep of snapshots keeps).
    all_replicas: Option<PathBuf>,
    records: Mutex<HashMap<[u8; 16], Record>>,
}

impl SessionStore {
    /// Records kept in memory only (they die with the process).
    pub(crate) fn memory() -> Self {
        Self {
            disk: None,
            all_replicas: None,
            records: Mutex::default(),
        }
    }

    /// The records of `replica` under `data_dir`, loaded from disk; memory only (with a
    /// warning) when the directory cannot be made or another process holds its lock.
    pub(crate) fn open(data_dir: &Path, replica: &str) -> Self {
        match Self::try_open(data_dir, replica) {
            Ok(store) => store,
            Err(e) => {
                tracing::warn!(
                    "hibernated sessions will not outlive this process: {e}; help: give each ipybox serving this data directory its own --replica-id"
                );
                Self {
                    all_replicas: Some(data_dir.join("sessions")),
                    ..Self::memory()
                }
            }
        }
    }

    fn try_open(data_dir: &Path, replica: &str) -> std::io::Result<Self> {
        let dir = data_dir.join("sessions").join(replica);
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)?;
        for d in [data_dir.join("sessions"), dir.clone()] {
            let meta = std::fs::symlink_metadata(&d)?;
            if !meta.is_dir() {
                return Err(std::io::Error::other(format!(
                    "{} is not a directory",
                    d.display()
                )));
            }
            std::fs::set_permissions(&d, std::os::unix::fs::PermissionsExt::from_mode(0o700))?;
        }
        let lock = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(dir.join("lock"))?;
        rustix::fs::flock(&lock, rustix::fs::FlockOperation::NonBlockingLockExclusive).map_err(
            |_| {
                std::io::Error::other(format!(
                    "another ipybox serves replica `{replica}` from {} (it holds {})",
                    data_dir.display(),
                    dir.join("lock").display()
                ))
            },
        )?;
        let mut records = HashMap::new();
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            if name.starts_with('.') && name.contains(".tmp-") {
                let _ = std::fs::remove_file(entry.path());
                continue;
            }
            let Some(stem) = name.strip_suffix(".json") else {
                continue;
            };
            match read_record(&entry.path()) {
                Some(record) if hex(&record.id) == stem => {
                    records.insert(record.id, record);
                }
                _ => tracing::warn!("ignoring {}: not a session record", entry.path().display()),
            }
        }
        if !records.is_empty() {
            tracing::info!(
                "{} saved sessions found in {}",
                records.len(),
                dir.display()
            );
        }
        Ok(Self {
            disk: Some((dir, lock)),
            all_replicas: Some(data_dir.join("sessions")),
            records: Mutex::new(records),
        })
    }

    fn records(&self) -> std::sync::MutexGuard<'_, HashMap<[u8; 16], Record>> {
        self.records.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether records outlive this process.
    pub(crate) fn persistent(&self) -> bool {
        self.disk.is_some()
    }

    pub(crate) fn get(&self, id: &[u8; 16]) -> Option<Record> {
        self.records().get(id).cloned()
    }

    pub(crate) fn all(&self) -> Vec<Record> {
        self.records().values().cloned().collect()
    }

    /// The (id, owner) of every saved session any replica on this data directory has a record
    /// of (on disk, whatever replica's directory it is in, live or dead: a dead one's may be
    /// taken over), and of this process's records in memory.
    pub(crate) fn everyone(&self) -> Vec<([u8; 16], [u8; 32])> {
        let mut all: Vec<([u8; 16], [u8; 32])> =
            self.records().values().map(|r| (r.id, r.owner)).collect();
        let Some(base) = &self.all_replicas else {
            return all;
        };
        let Ok(replicas) = std::fs::read_dir(base) else {
            return all;
        };
        for replica in replicas.flatten() {
            if !replica.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            let Ok(files) = std::fs::read_dir(replica.path()) else {
                continue;
            };
            for file in files.flatten() {
                let name = file.file_name();
                let Some(stem) = name.to_str().and_then(|n| n.strip_suffix(".json")) else {
                    continue;
                };
                if let Some(record) = read_record(&file.path()).filter(|r| hex(&r.id) == stem) {
                    all.push((record.id, record.owner));
                }
            }
        }
        all
    }

    /// Renews this replica's lease (`sessions/<replica>/lease`, its modification time) every
    /// [`HEARTBEAT`] for the life of the process: on shared storage, what tells other replicas
    /// that this one is alive.
    pub(crate) fn heartbeat(&self) {
        let Some((dir, _)) = &self.disk else { return };
        let lease = dir.join("lease");
        tokio::spawn(async move {
            let mut interval = tokio::time::interval(HEARTBEAT);
            loop {
                interval.tick().await;
                let renewed = std::fs::OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .mode(0o600)
                    .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                    .open(&lease)
                    .and_then(|mut f| {
                        f.write_all(now_secs().to_string().as_bytes())?;
                        f.set_modified(std::time::SystemTime::now())
                    });
                if let Err(e) = renewed {
                    tracing::warn!("cannot renew this replica's lease {}: {e}", lease.display());
                }
            }
        });
    }

    /// Moves saved session `id` of replica `other` to this replica, if `other` is dead: its lock
    /// is free (nobody holds `sessions/<other>/lock`) and its lease was not renewed for
    /// [`LEASE_STALE`]. The move is one rename, so of two replicas trying at once one gets it;
    /// it happens while holding `other`'s lock, so `other` cannot start again meanwhile. Returns
    /// whether the session is this replica's now.
    pub(crate) fn take_over(&self, other: &str, id: &[u8; 16]) -> bool {
        let Some((dir, _)) = &self.disk else {
            return false;
        };
        let valid = (1..=32).contains(&other.len())
            && other
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        let Some(base) = dir.parent().filter(|_| valid) else {
            return false;
        };
        let theirs = base.join(other);
        let Ok(lock) = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(theirs.join("lock"))
        else {
            return false;
        };
        if rustix::fs::flock(&lock, rustix::fs::FlockOperation::NonBlockingLockExclusive).is_err() {
            return false; // alive: it holds its lock
        }
        let renewed = std::fs::symlink_metadata(theirs.join("lease"))
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok());
        if renewed.is_some_and(|age| age < LEASE_STALE) {
            return false; // its lease is fresh (a replica starting again, or another host)
        }
        let name = format!("{}.json", hex(id));
        let Some(record) = read_record(&theirs.join(&name)).filter(|r| r.id == *id) else {
            return false;
        };
        if std::fs::rename(theirs.join(&name), dir.join(&name)).is_err() {
            return false; // another replica took it first
        }
        self.records().insert(*id, record);
        drop(lock);
        true
    }

    /// Whether session `id`'s record is still this replica's on disk (another replica takes
    /// over the records of one it found dead: a replica that was only stalled must not restore
    /// them too). Forgets it in memory if not. Memory-only records are always this process's.
    pub(crate) fn still_mine(&self, id: &[u8; 16]) -> bool {
        let Some((dir, _)) = &self.disk else {
            return true;
        };
        if dir.join(format!("{}.json", hex(id))).is_file() {
            return true;
        }
        self.records().remove(id);
        false
    }

    /// Adds or replaces `record` (on disk first: a record in memory is one that is on disk).
    pub(crate) fn put(&self, record: Record) -> std::io::Result<()> {
        if let Some((dir, _)) = &self.disk {
            let bytes = serde_json::to_vec(&record.to_file()).map_err(std::io::Error::other)?;
            write_atomic(dir, &format!("{}.json", hex(&record.id)), &bytes)?;
        }
        self.records().insert(record.id, record);
        Ok(())
    }

    /// Forgets session `id`; returns its record if there was one.
    pub(crate) fn remove(&self, id: &[u8; 16]) -> Option<Record> {
        if let Some((dir, _)) = &self.disk {
            match std::fs::remove_file(dir.join(format!("{}.json", hex(id)))) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => tracing::warn!("cannot remove a session record: {e}"),
            }
        }
        self.records().remove(id)
    }
}

fn read_record(path: &Path) -> Option<Record> {
    use std::io::Read;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(path)
        .ok()?;
    if !file.metadata().ok()?.is_file() {
        return None;
    }
    let mut bytes = Vec::new();
    file.take(MAX_RECORD).read_to_end(&mut bytes).ok()?;
    Record::from_file(serde_json::from_slice(&bytes).ok()?)
}

/// Writes `name` in `dir` as a new 0600 file, flushed, renamed over the old one.
fn write_atomic(dir: &Path, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = dir.join(format!(".{name}.tmp-{:08x}", rand::random::<u32>()));
    let result = (|| {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        std::fs::rename(&tmp, dir.join(name))
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn records_outlive_the_store_and_one_process_holds_a_replica() {
        let t = tempfile::tempdir().unwrap();
        let r = Record {
            id: [3; 16],
            owner: owner_digest(&Caller::Token([9; 32])),
            last_used: 1_700_000_000_123,
            bytes: 42,
            named: true,
            runtime: Some("/tmp/ipybox-1-a/ipybox-1-b".into()),
            lost: Some("cells 3-4".into()),
        };
        {
            let store = SessionStore::open(t.path(), "web-0");
            assert!(store.persistent());
            store.put(r.clone()).unwrap();
            // The same replica cannot be opened twice at once: the second is memory only.
            let second = SessionStore::open(t.path(), "web-0");
            assert!(!second.persistent());
            assert!(second.get(&r.id).is_none());
            let file = t
                .path()
                .join("sessions/web-0")
                .join(format!("{}.json", hex(&r.id)));
            assert_eq!(std::fs::metadata(&file).unwrap().mode() & 0o777, 0o600);
            assert_eq!(
                std::fs::metadata(t.path().join("sessions/web-0"))
                    .unwrap()
                    .mode()
                    & 0o777,
                0o700
            );
            let text = std::fs::read_to_string(&file).unwrap();
            // Not the credential's digest handles are bound to.
            assert!(!text.contains(&hex(&[9; 32])), "{text}");
        }
        let again = SessionStore::open(t.path(), "web-0");
        assert_eq!(again.get(&r.id), Some(r.clone()));
        assert_eq!(again.remove(&r.id), Some(r.clone()));
        drop(again);
        assert!(SessionStore::open(t.path(), "web-0").all().is_empty());
        // Another replica's directory is its own.
        assert!(SessionStore::open(t.path(), "web-1").all().is_empty());
    }

    #[test]
    fn a_dead_replicas_sessions_are_taken_over_a_live_ones_never() {
        let t = tempfile::tempdir().unwrap();
        let r = Record {
            id: [5; 16],
            owner: owner_digest(&Caller::Local),
            last_used: 1_700_000_000_123,
            bytes: 1,
            named: true,
            runtime: None,
            lost: None,
        };
        let b = SessionStore::open(t.path(), "b");
        let lease = t.path().join("sessions/a/lease");
        {
            let a = SessionStore::open(t.path(), "a");
            a.put(r.clone()).unwrap();
            std::fs::write(&lease, "0").unwrap();
            // Alive: it holds its lock (whatever its lease says).
            let old = std::time::SystemTime::now() - LEASE_STALE * 2;
            std::fs::File::options()
                .write(true)
                .open(&lease)
                .unwrap()
                .set_modified(old)
                .unwrap();
            assert!(!b.take_over("a", &r.id));
        }
        // Its lock is free, but its lease is fresh: not yet.
        std::fs::File::options()
            .write(true)
            .open(&lease)
            .unwrap()
            .set_modified(std::time::SystemTime::now())
            .unwrap();
        assert!(!b.take_over("a", &r.id));
        // Dead: lock free, lease stale. Once only; the record moved.
        let old = std::time::SystemTime::now() - LEASE_STALE * 2;
        std::fs::File::options()
            .write(true)
            .open(&lease)
            .unwrap()
            .set_modified(old)
            .unwrap();
        assert!(!b.take_over("../a", &r.id));
        assert!(b.take_over("a", &r.id));
        assert_eq!(b.get(&r.id), Some(r.clone()));
        assert!(!b.take_over("a", &r.id));
        assert!(b.still_mine(&r.id));
        let a = SessionStore::open(t.path(), "a");
        assert!(a.all().is_empty());
    }

    #[test]
    fn durations_keep_their_fractions() {
        use std::time::Duration;
        assert_eq!(secs_text(Duration::from_millis(1600)), "1.6");
        assert_eq!(secs_text(Duration::from_millis(250)), "0.25");
        assert_eq!(secs_text(Duration::from_secs(30)), "30");
        assert_eq!(secs_text(Duration::from_secs(604_800)), "604800");
    }

    #[test]
    fn owners_differ_by_credential() {
        assert_ne!(
            owner_digest(&Caller::Token([1; 32])),
            owner_digest(&Caller::Token([2; 32]))
        );
        assert_ne!(
            owner_digest(&Caller::Local),
            owner_digest(&Caller::Token([0; 32]))
        );
    }
}
