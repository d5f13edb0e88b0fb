//! A uid of its own for each confined session (docs/http.md "Who a session's kernel is"): leased
//! from a range the operator gives (`serve --http --session-uids FIRST-LAST`; by default, as root,
//! [`DEFAULT_RANGE`]), held while the session's kernels run, and handed back when they stop.
//!
//! A uid is leased only if no process of the host has it (real, effective, saved or filesystem
//! uid or gid: `/proc/<pid>/status`), no session of this service nor of another ipybox on the
//! host holds it (a lock on `/run/ipybox-uids/<uid>`, [`LOCK_DIR`], held while leased), and the
//! host's `/etc/passwd` and `/etc/group` do not name it (as a uid, a group or a user's primary
//! group). Leases go round the range (a uid just handed back is the last to be leased again).
//! The gid is the uid's number.
//!
//! A uid is handed out again only once its previous session's processes are gone: the scan of
//! `/proc` runs under the pool's lock (after every release before it), the chosen uid is looked
//! for once more just before it is handed out, a lease given back while a process still has its
//! uid keeps it out of the pool ("draining") until a scan finds none, and a `/proc` that cannot
//! be read refuses the lease rather than trusting an empty list.
//!
//! What the session's uid must reach of its runtime directory is handed to it here
//! ([`hand_over`]); its kernels switch to it before any code but ipybox's runs
//! (`confine_identity.py`).

use std::collections::BTreeSet;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::{Arc, Mutex};

use super::identity::Ids;

/// The default range as root: the first 65 536 ids of the range systemd leaves unused
/// (1879048192–2147483647, its "UIDS-GIDS" document): above login users (1000–60000), dynamic
/// users (61184–65519) and container ranges (524288–1879048191, and the usual subuid ranges
/// from 100000).
pub const DEFAULT_RANGE: UidRange = UidRange {
    first: 1_879_048_192,
    last: 1_879_113_727,
};

/// Where every ipybox of the host locks the uids its sessions hold (one file per uid, locked
/// with `flock` while leased).
pub const LOCK_DIR: &str = "/run/ipybox-uids";

/// Inclusive range of uids (and gids of the same numbers) sessions get theirs from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UidRange {
    pub first: u32,
    pub last: u32,
}

impl std::fmt::Display for UidRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.first, self.last)
    }
}

/// Why a range or a lease is refused.
#[derive(Debug, thiserror::Error)]
pub enum UidError {
    #[error(
        "bad --session-uids {0:?}: expected FIRST-LAST (e.g. 1879048192-1879113727), `auto` or `none`"
    )]
    Syntax(String),
    #[error(
        "bad --session-uids {0}: uids below 1000 are the system's and 65534 is nobody's, and the range must stay below 2147483648\n  help: give a range of unused ids, e.g. 1879048192-1879113727"
    )]
    Reserved(UidRange),
    #[error(
        "every uid of --session-uids {0} is in use (by sessions of this service or by processes of the host)\n  help: give a larger range, or close sessions"
    )]
    Exhausted(UidRange),
    #[error(
        "cannot check that no process has the uid a session would get: reading /proc failed: {0}\n  help: ipybox needs the host's /proc (not mounted with hidepid=) to give sessions uids of their own; or pass --session-uids none"
    )]
    Proc(String),
}

/// What `--session-uids` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UidSetting {
    /// As root the [`DEFAULT_RANGE`], else none.
    Auto,
    /// Sessions keep ipybox's uid (without capabilities).
    None,
    Range(UidRange),
}

impl std::str::FromStr for UidSetting {
    type Err = UidError;

    fn from_str(text: &str) -> Result<Self, UidError> {
        match text.trim() {
            "auto" => return Ok(UidSetting::Auto),
            "none" => return Ok(UidSetting::None),
            _ => {}
        }
        let syntax = || UidError::Syntax(text.to_string());
        let (a, b) = text.trim().split_once('-').ok_or_else(syntax)?;
        let first: u32 = a.trim().parse().map_err(|_| syntax())?;
        let last: u32 = b.trim().parse().map_err(|_| syntax())?;
        if first > last {
            return Err(syntax());
        }
        let range = UidRange { first, last };
        if first < 1000 || last >= 1 << 31 || (first..=last).contains(&65534) {
            return Err(UidError::Reserved(range));
        }
        Ok(UidSetting::Range(range))
    }
}

impl UidSetting {
    /// The range sessions get their uids from, for a service whose effective uid is `euid`:
    /// `None` when sessions keep ipybox's uid. A range needs root (switching uids needs
    /// `CAP_SETUID` in the host's user namespace).
    pub fn resolve(self, euid: u32) -> Result<Option<UidRange>, String> {
        match (self, euid) {
            (UidSetting::None, _) => Ok(None),
            (UidSetting::Auto, 0) => Ok(Some(DEFAULT_RANGE)),
            (UidSetting::Auto, _) => Ok(None),
            (UidSetting::Range(r), 0) => Ok(Some(r)),
            (UidSetting::Range(r), _) => Err(format!(
                "--session-uids {r} needs ipybox to run as root (only root can give a kernel another uid)\n  help: run the service as root, or pass --session-uids none (sessions then keep this user's uid, in bubblewrap's user namespace)"
            )),
        }
    }
}

/// The service's uids: which are leased.
#[derive(Debug)]
pub struct UidPool {
    range: UidRange,
    /// Ids the host's `/etc/passwd` or `/etc/group` name (read once, at start).
    named: BTreeSet<u32>,
    /// [`LOCK_DIR`], if it could be made (else leases are this service's alone, and a warning
    /// says so).
    locks: Option<std::path::PathBuf>,
    state: Mutex<PoolState>,
}

#[derive(Debug)]
struct PoolState {
    leased: BTreeSet<u32>,
    /// Uids given back while a process still had them: leased again only once a scan of `/proc`
    /// finds none.
    draining: BTreeSet<u32>,
    /// Where the next search starts.
    next: u32,
}

impl UidPool {
    pub fn new(range: UidRange) -> Arc<UidPool> {
        let mut named = BTreeSet::new();
        for file in ["/etc/passwd", "/etc/group"] {
            if let Ok(text) = std::fs::read_to_string(file) {
                named.extend(named_ids(&text).filter(|id| (range.first..=range.last).contains(id)));
            }
        }
        if !named.is_empty() {
            tracing::warn!(
                "--session-uids {range}: {} id(s) of the range are named in /etc/passwd or /etc/group and are never leased",
                named.len()
            );
        }
        let locks = match crate::safe_fs::create_private_dir(Path::new(LOCK_DIR)) {
            Ok(()) => Some(std::path::PathBuf::from(LOCK_DIR)),
            Err(e) => {
                tracing::warn!(
                    "cannot make {LOCK_DIR} ({e}): another ipybox on this host could lease the uid a session of this one holds before its kernel runs"
                );
                None
            }
        };
        Arc::new(UidPool {
            range,
            named,
            locks,
            state: Mutex::new(PoolState {
                leased: BTreeSet::new(),
                draining: BTreeSet::new(),
                next: range.first,
            }),
        })
    }

    pub fn range(&self) -> UidRange {
        self.range
    }

    /// Leases a uid no session and no process of the host has.
    pub(crate) fn lease(self: &Arc<Self>) -> Result<UidLease, UidError> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        // Read under the lock: every lease given back before it, and the kill of its session's
        // processes before that, is seen.
        let busy = ids_of_host_processes().map_err(|e| UidError::Proc(e.to_string()))?;
        let drained: Vec<u32> = state
            .draining
            .iter()
            .copied()
            .filter(|id| !busy.contains(id))
            .collect();
        for id in drained {
            tracing::info!("uid {id}: its previous session's processes are gone; leased again");
            state.draining.remove(&id);
        }
        let size = u64::from(self.range.last - self.range.first) + 1;
        let mut candidate = state.next;
        for _ in 0..size {
            let id = candidate;
            candidate = if id >= self.range.last {
                self.range.first
            } else {
                id + 1
            };
            if state.leased.contains(&id)
                || state.draining.contains(&id)
                || self.named.contains(&id)
                || busy.contains(&id)
            {
                continue;
            }
            let lock = match &self.locks {
                Some(dir) => match lock_uid(dir, id) {
                    Some(file) => Some(file),
                    // Another ipybox's session holds it.
                    None => continue,
                },
                None => None,
            };
            // Once more for this uid alone, now that it is locked: a process that took it
            // since the scan (none should) keeps it from being handed out.
            match uid_in_use(id) {
                Ok(false) => {}
                Ok(true) => continue,
                Err(e) => return Err(UidError::Proc(e.to_string())),
            }
            state.leased.insert(id);
            state.next = candidate;
            return Ok(UidLease {
                pool: self.clone(),
                ids: Ids { uid: id, gid: id },
                _lock: lock,
            });
        }
        Err(UidError::Exhausted(self.range))
    }

    /// How many uids are leased now.
    pub fn leased(&self) -> usize {
        self.state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .leased
            .len()
    }
}

/// One session's uid, handed back when dropped (after its kernels: see `executor::Running`).
#[derive(Debug)]
pub(crate) struct UidLease {
    pool: Arc<UidPool>,
    pub(crate) ids: Ids,
    /// The host-wide lock on the uid (released when closed).
    _lock: Option<std::fs::File>,
}

impl Drop for UidLease {
    fn drop(&mut self) {
        let uid = self.ids.uid;
        let mut state = self.pool.state.lock().unwrap_or_else(|p| p.into_inner());
        state.leased.remove(&uid);
        // The session's kernels were stopped and its cgroup emptied before this (fields drop
        // in order); a process left with its uid (or /proc unreadable) keeps it out of the pool.
        if !matches!(uid_in_use(uid), Ok(false)) {
            tracing::warn!(
                "uid {uid}: a process still has it after its session ended; it is leased again only once none does"
            );
            state.draining.insert(uid);
        }
    }
}

/// Whether a process of the host has `uid` as a uid or gid (real, effective, saved or
/// filesystem).
fn uid_in_use(uid: u32) -> std::io::Result<bool> {
    Ok(ids_of_host_processes()?.contains(&uid))
}

/// The lock on `uid` in `dir`, if no one else holds it (an error opening the file counts as
/// held: that uid is skipped).
fn lock_uid(dir: &Path, uid: u32) -> Option<std::fs::File> {
    let file = crate::safe_fs::open_lock_file(&dir.join(uid.to_string())).ok()?;
    fs4::fs_std::FileExt::try_lock_exclusive(&file)
        .ok()
        .filter(|locked| *locked)
        .map(|_| file)
}

/// The numeric ids of `passwd` or `group` text (the third field, and the fourth: a user's
/// primary group).
fn named_ids(text: &str) -> impl Iterator<Item = u32> + '_ {
    text.lines().flat_map(|line| {
        let fields: Vec<&str> = line.split(':').collect();
        [2, 3]
            .into_iter()
            .filter_map(move |i| fields.get(i)?.trim().parse().ok())
    })
}

/// Every uid and gid (real, effective, saved, filesystem) of the host's processes; an error when
/// `/proc` cannot be listed (never an empty answer that would make every uid look free).
fn ids_of_host_processes() -> std::io::Result<BTreeSet<u32>> {
    let mut ids = BTreeSet::new();
    let entries = std::fs::read_dir("/proc")?;
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name();
        if !name.to_string_lossy().bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Ok(status) = std::fs::read_to_string(entry.path().join("status")) else {
            continue;
        };
        for line in status.lines() {
            if let Some(rest) = line
                .strip_prefix("Uid:")
                .or_else(|| line.strip_prefix("Gid:"))
            {
                ids.extend(
                    rest.split_whitespace()
                        .filter_map(|v| v.parse::<u32>().ok()),
                );
            }
        }
    }
    Ok(ids)
}

/// Gives a session's uid what its kernels need of the runtime directory `runtime` (ipybox is
/// root here): the directory itself readable by the session's group (`root:GID`, 0750; its
/// parent stays ipybox's alone), `box/` and `work/` its own (0700; `work/` 0711), and the sockets it connects
/// to (`tools.sock`, the egress proxy's) writable by its group (0660). What is created later for
/// each kernel (its connection file, its IPC directory) is handed over as it is made
/// (`RuntimeDir::set_kernel_owner`).
pub(crate) fn hand_over(runtime: &Path, ids: Ids, sockets: &[&Path]) -> std::io::Result<()> {
    let chown = |path: &Path, uid: u32, gid: u32, mode: u32| -> std::io::Result<()> {
        std::os::unix::fs::lchown(path, Some(uid), Some(gid))?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
    };
    chown(runtime, 0, ids.gid, 0o750)?;
    for dir in [crate::runtime_layout::KERNEL_WRITABLE, super::WORK_DIR] {
        let path = runtime.join(dir);
        if std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir()) {
            // `work/` is also searchable by others (0711, not listable): bubblewrap, as root
            // without capabilities, changes into it before the kernel becomes its uid.
            let mode = if dir == super::WORK_DIR { 0o711 } else { 0o700 };
            chown(&path, ids.uid, ids.gid, mode)?;
        }
    }
    for socket in sockets {
        if std::fs::symlink_metadata(socket).is_ok() {
            chown(socket, 0, ids.gid, 0o660)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_parse_and_refuse_reserved_ids() {
        assert_eq!("auto".parse::<UidSetting>().unwrap(), UidSetting::Auto);
        assert_eq!("none".parse::<UidSetting>().unwrap(), UidSetting::None);
        assert_eq!(
            "200000-200009".parse::<UidSetting>().unwrap(),
            UidSetting::Range(UidRange {
                first: 200000,
                last: 200009
            })
        );
        for bad in [
            "",
            "5",
            "9-1",
            "a-b",
            "0-100000",
            "60000-70000",
            "1-2147483648",
        ] {
            assert!(bad.parse::<UidSetting>().is_err(), "{bad}");
        }
        assert_eq!(UidSetting::Auto.resolve(0), Ok(Some(DEFAULT_RANGE)));
        assert_eq!(UidSetting::Auto.resolve(1000), Ok(None));
        assert!(
            UidSetting::Range(DEFAULT_RANGE)
                .resolve(1000)
                .unwrap_err()
                .contains("needs ipybox to run as root")
        );
    }

    #[test]
    fn leases_are_distinct_go_round_and_come_back() {
        let pool = UidPool::new(UidRange {
            first: 1_879_200_000,
            last: 1_879_200_002,
        });
        let a = pool.lease().unwrap();
        let b = pool.lease().unwrap();
        let c = pool.lease().unwrap();
        assert_eq!(
            [a.ids.uid, b.ids.uid, c.ids.uid],
            [1_879_200_000, 1_879_200_001, 1_879_200_002]
        );
        assert_eq!(a.ids.gid, a.ids.uid);
        assert!(matches!(pool.lease(), Err(UidError::Exhausted(_))));
        drop(b);
        assert_eq!(pool.leased(), 2);
        let d = pool.lease().unwrap();
        assert_eq!(d.ids.uid, 1_879_200_001);
    }

    #[test]
    fn named_ids_are_read_from_passwd_text() {
        let ids: Vec<u32> =
            named_ids("root:x:0:0::/root:/bin/sh\nbad line\nu:x:1879048193:5::/:/bin/sh\ng:x:7:\n")
                .collect();
        assert_eq!(ids, [0, 0, 1_879_048_193, 5, 7]);
    }

    /// Two services of one host (two pools) never lease the same uid; the control: without the
    /// host-wide lock (a pool whose lock directory could not be made) they do.
    #[test]
    fn two_services_never_share_a_uid() {
        let t = tempfile::tempdir().unwrap();
        let range = UidRange {
            first: 1_879_300_000,
            last: 1_879_300_009,
        };
        let pool = |locks: Option<&Path>| {
            Arc::new(UidPool {
                range,
                named: BTreeSet::new(),
                locks: locks.map(Path::to_path_buf),
                state: Mutex::new(PoolState {
                    leased: BTreeSet::new(),
                    draining: BTreeSet::new(),
                    next: range.first,
                }),
            })
        };
        let (a, b) = (pool(Some(t.path())), pool(Some(t.path())));
        let (la, lb) = (a.lease().unwrap(), b.lease().unwrap());
        assert_ne!(la.ids.uid, lb.ids.uid);
        drop(la);
        let (c, d) = (pool(None), pool(None));
        assert_eq!(c.lease().unwrap().ids.uid, d.lease().unwrap().ids.uid);
    }

    #[test]
    fn our_own_uid_is_busy_on_the_host() {
        // SAFETY: getuid has no preconditions.
        let uid = unsafe { libc::getuid() };
        assert!(ids_of_host_processes().unwrap().contains(&uid));
    }

    /// A uid given back while a process still has it is not leased again until that process
    /// is gone; the control: the same pool with the process gone leases it.
    #[test]
    fn a_uid_is_leased_again_only_once_its_processes_are_gone() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: a process of another uid needs root");
            return;
        }
        let range = UidRange {
            first: 1_879_400_000,
            last: 1_879_400_000,
        };
        let pool = UidPool::new(range);
        let lease = pool.lease().unwrap();
        let uid = lease.ids.uid;
        // A process of the session's that outlived it.
        let mut left = {
            use std::os::unix::process::CommandExt;
            crate::child_process::host_command_blocking("sleep")
                .arg("30")
                .uid(uid)
                .gid(uid)
                .spawn()
                .unwrap()
        };
        std::thread::sleep(std::time::Duration::from_millis(50));
        drop(lease);
        assert!(matches!(pool.lease(), Err(UidError::Exhausted(_))));
        let _ = left.kill();
        let _ = left.wait();
        assert_eq!(pool.lease().unwrap().ids.uid, uid);
    }
}
