//! What one confined session may use: processes, memory, CPU and its work directory's size
//! (`ipybox serve --http`'s `--session-max-procs`, `--session-memory`, `--session-cpus`,
//! `--session-work-size`; docs/http.md "What a session may use"), and the note a cell's result
//! gets when the session met one of them (the values: `session_limits`, re-exported here).
//!
//! How the limits are applied: [`super::cgroup`] (processes, memory, CPU: a cgroup per session)
//! and the work directory's size-limited tmpfs ([`WorkMount`]).

use std::sync::Arc;

pub use super::session_limits::{
    DEFAULT_BOX_SIZE, DEFAULT_MAX_PROCS, DEFAULT_MEMORY, DEFAULT_WORK_SIZE, LimitHit,
    SessionLimits, SizeError, format_bytes, parse_bytes, parse_cpus,
};

/// The service's limits and how they are enforced: a cgroup per session where ipybox may create
/// cgroups, else resource limits set in each kernel before user code (`RLIMIT_AS` for memory,
/// `RLIMIT_NPROC` for processes: see docs/http.md for what then binds).
#[derive(Debug)]
pub struct Limiter {
    /// The limits of every session.
    pub limits: SessionLimits,
    cgroups: Option<super::cgroup::CgroupRoot>,
}

impl Limiter {
    /// Finds how to enforce `limits` here, and logs it; with a `service_memory` budget, the
    /// service's cgroup as a whole is bounded by it too.
    pub fn new(limits: SessionLimits, service_memory: Option<u64>) -> Limiter {
        let cgroups = match super::cgroup::CgroupRoot::detect() {
            Ok(root) => {
                if let Some(total) = service_memory {
                    match root.limit_memory(total) {
                        Ok(()) => tracing::info!(
                            "all sessions together: at most {} of memory (--service-memory; the service's cgroup)",
                            format_bytes(total)
                        ),
                        Err(e) => tracing::warn!(
                            "{e}: the service's memory is bounded by admission only (--service-memory)"
                        ),
                    }
                }
                tracing::info!(
                    "session limits: a cgroup per session, {}: at most {} processes and threads (--session-max-procs), {} of memory (--session-memory), CPU {} (--session-cpus); work directory {} (--session-work-size), kernel directory {} (--session-box-size)",
                    root.describe(),
                    limits.max_procs,
                    format_bytes(limits.memory),
                    limits
                        .cpus
                        .map_or("unlimited".to_string(), |c| format!("{c} core(s)")),
                    format_bytes(limits.work_size),
                    format_bytes(limits.box_size),
                );
                Some(root)
            }
            Err(e) => {
                tracing::warn!(
                    "{e}; session limits fall back to resource limits in each kernel: RLIMIT_AS {} (--session-memory, per process), RLIMIT_NPROC {} (--session-max-procs, per uid: does not bind uid 0); no CPU limit; help: run ipybox as root or give it a delegated cgroup v2 subtree (systemd: Delegate=yes)",
                    format_bytes(limits.memory),
                    limits.max_procs
                );
                None
            }
        };
        Limiter { limits, cgroups }
    }

    /// What a new session's kernels are started with: its own cgroup, or the resource limits.
    pub(crate) fn for_session(&self) -> Result<KernelLimits, super::cgroup::CgroupError> {
        match &self.cgroups {
            Some(root) => Ok(KernelLimits {
                cgroup: Some(Arc::new(root.create_session(&self.limits)?)),
                rlimits: None,
            }),
            None => Ok(KernelLimits {
                cgroup: None,
                rlimits: Some(Rlimits {
                    address_space: self.limits.memory,
                    nproc: self.limits.max_procs,
                }),
            }),
        }
    }
}

/// Resource limits a kernel sets on itself before user code when there are no cgroups (0: not
/// set).
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub(crate) struct Rlimits {
    pub(crate) address_space: u64,
    pub(crate) nproc: u64,
}

impl Rlimits {
    /// Sets them on the calling process (between fork and exec: async-signal-safe).
    pub(crate) fn apply_in_child(&self) -> std::io::Result<()> {
        for (resource, value) in [
            (libc::RLIMIT_AS, self.address_space),
            (libc::RLIMIT_NPROC, self.nproc),
        ] {
            if value == 0 {
                continue;
            }
            let lim = libc::rlimit {
                rlim_cur: value,
                rlim_max: value,
            };
            // SAFETY: setrlimit with a valid struct; async-signal-safe.
            if unsafe { libc::setrlimit(resource, &lim) } != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        Ok(())
    }
}

/// What one session's kernels are limited by (on its `KernelConfig`).
#[derive(Debug, Clone)]
pub(crate) struct KernelLimits {
    /// The session's cgroup, which every kernel of the session joins before user code.
    pub(crate) cgroup: Option<Arc<super::cgroup::SessionCgroup>>,
    /// Without cgroups: resource limits every kernel sets on itself.
    pub(crate) rlimits: Option<Rlimits>,
}

/// A size-limited tmpfs on a session's work directory (ipybox as root), with the directory's
/// owner and mode. Unmounted when the runtime directory is removed
/// ([`unmount_work`]).
#[derive(Debug)]
pub(crate) struct WorkMount {
    path: std::path::PathBuf,
    size: u64,
    /// What [`Self::full`] reports.
    hit: fn(u64) -> LimitHit,
}

impl WorkMount {
    /// Mounts it on `path` (an existing directory) if ipybox is root and `size` is not 0.
    pub(crate) fn mount(path: &std::path::Path, size: u64) -> std::io::Result<Option<WorkMount>> {
        Self::mount_as(path, size, "ipybox-work", LimitHit::WorkSize)
    }

    /// The same for the kernel's own directory (`box/`), whose filling reports `BoxSize`.
    pub(crate) fn mount_box(
        path: &std::path::Path,
        size: u64,
    ) -> std::io::Result<Option<WorkMount>> {
        Self::mount_as(path, size, "ipybox-box", LimitHit::BoxSize)
    }

    #[cfg(target_os = "linux")]
    fn mount_as(
        path: &std::path::Path,
        size: u64,
        source: &str,
        hit: fn(u64) -> LimitHit,
    ) -> std::io::Result<Option<WorkMount>> {
        // SAFETY: geteuid has no preconditions.
        if size == 0 || unsafe { libc::geteuid() } != 0 {
            return Ok(None);
        }
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(path)?;
        let data = format!(
            "size={size},mode={:o},uid={},gid={}",
            meta.mode() & 0o7777,
            meta.uid(),
            meta.gid()
        );
        let cstr = |s: &str| std::ffi::CString::new(s).map_err(std::io::Error::other);
        let target = cstr(&path.to_string_lossy())?;
        let (source, fstype, data) = (cstr(source)?, cstr("tmpfs")?, cstr(&data)?);
        // SAFETY: valid NUL-terminated strings that outlive the call.
        let rc = unsafe {
            libc::mount(
                source.as_ptr(),
                target.as_ptr(),
                fstype.as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV,
                data.as_ptr().cast(),
            )
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Some(WorkMount {
            path: path.to_path_buf(),
            size,
            hit,
        }))
    }

    /// Off Linux nothing is mounted (as for a non-root ipybox; confined sessions, whose work
    /// directories these are, are Linux only).
    #[cfg(not(target_os = "linux"))]
    fn mount_as(
        _path: &std::path::Path,
        _size: u64,
        _source: &str,
        _hit: fn(u64) -> LimitHit,
    ) -> std::io::Result<Option<WorkMount>> {
        Ok(None)
    }

    /// Whether the work directory is (nearly) full: less than 64 KiB free.
    pub(crate) fn full(&self) -> Option<LimitHit> {
        let st = rustix::fs::statvfs(&self.path).ok()?;
        let free = st.f_bavail.saturating_mul(st.f_frsize);
        (free < 64 << 10).then_some((self.hit)(self.size))
    }
}

/// Makes `dir` a shared mount (a bind mount of itself), so that mounts made below it later
/// (work directories' tmpfs) propagate into the mount namespaces copied from it: the shared
/// template's bubblewrap, and so the kernels it forks. As root only (else nothing is mounted).
#[cfg(target_os = "linux")]
pub(crate) fn share_mounts_below(dir: &std::path::Path) -> std::io::Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(());
    }
    let target = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes())
        .map_err(std::io::Error::other)?;
    // SAFETY: valid NUL-terminated strings (or null where mount(2) allows it).
    unsafe {
        if libc::mount(
            target.as_ptr(),
            target.as_ptr(),
            std::ptr::null(),
            libc::MS_BIND,
            std::ptr::null(),
        ) != 0
            || libc::mount(
                std::ptr::null(),
                target.as_ptr(),
                std::ptr::null(),
                libc::MS_SHARED,
                std::ptr::null(),
            ) != 0
        {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Off Linux nothing is mounted.
#[cfg(not(target_os = "linux"))]
pub(crate) fn share_mounts_below(_dir: &std::path::Path) -> std::io::Result<()> {
    Ok(())
}

/// Unmounts a work directory's tmpfs, if there is one on `path` (before its runtime directory
/// is removed: at a session's end, at shutdown, and when a stale runtime directory is swept).
#[cfg(target_os = "linux")]
pub(crate) fn unmount_work(path: &std::path::Path) {
    // EINVAL (not a mount point) and ENOENT are the usual answers: nothing to do.
    if let Ok(target) = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()) {
        // SAFETY: a valid NUL-terminated string.
        // Never through a link (a kernel could point one at any mount point of the host).
        unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH | libc::UMOUNT_NOFOLLOW) };
    }
}

/// Off Linux no work directory is mounted: nothing to unmount.
#[cfg(not(target_os = "linux"))]
pub(crate) fn unmount_work(_path: &std::path::Path) {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_bytes("1024").ok(), Some(1024));
        assert_eq!(parse_bytes("512M").ok(), Some(512 << 20));
        assert_eq!(parse_bytes("2G").ok(), Some(2 << 30));
        assert_eq!(parse_bytes("2GiB").ok(), Some(2 << 30));
        assert_eq!(parse_bytes("2gb").ok(), Some(2 << 30));
        assert_eq!(parse_bytes("64k").ok(), Some(64 << 10));
        assert_eq!(parse_bytes("1.5G").ok(), Some(3 << 29));
        assert_eq!(parse_bytes("0").ok(), Some(0));
        for bad in ["", "G", "2X", "-1", "1..5M", "99999999999T"] {
            let e = parse_bytes(bad).map(|_| ()).err().map(|e| e.to_string());
            assert!(e.is_some_and(|e| e.contains("512M")), "{bad}");
        }
        assert_eq!(format_bytes(200 << 20), "200 MiB");
        assert_eq!(format_bytes(3 << 29), "1.5 GiB");
        assert_eq!(format_bytes(100), "100 bytes");
    }

    #[test]
    fn cpus() {
        assert_eq!(parse_cpus("1").ok(), Some(Some(1.0)));
        assert_eq!(parse_cpus("0.5").ok(), Some(Some(0.5)));
        assert_eq!(parse_cpus("none").ok(), Some(None));
        assert_eq!(parse_cpus("0").ok(), Some(None));
        assert!(parse_cpus("-1").is_err());
        assert!(parse_cpus("x").is_err());
    }

    #[test]
    fn notes_name_limit_and_flag() {
        assert!(
            LimitHit::Procs(50)
                .note()
                .contains("(50 processes and threads, --session-max-procs)")
        );
        assert!(
            LimitHit::Memory(200 << 20)
                .note()
                .contains("(200 MiB, --session-memory)")
        );
        assert!(
            LimitHit::WorkSize(20 << 20)
                .note()
                .contains("(20 MiB, --session-work-size)")
        );
    }

    /// A kernel may make a link where ipybox unmounts (`box/work`): the unmount does not
    /// follow it. The control: the same call without `UMOUNT_NOFOLLOW` unmounts what the link
    /// points to.
    #[cfg(target_os = "linux")]
    #[test]
    fn unmounting_never_follows_a_link() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: mounting needs root");
            return;
        }
        let t = tempfile::tempdir().unwrap();
        let target = t.path().join("mounted");
        std::fs::create_dir(&target).unwrap();
        let mount = WorkMount::mount(&target, 1 << 20).unwrap().unwrap();
        let link = t.path().join("work");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let mounted = |p: &std::path::Path| {
            std::fs::read_to_string("/proc/self/mountinfo")
                .unwrap()
                .lines()
                .any(|l| l.split(' ').nth(4) == Some(p.to_str().unwrap()))
        };
        assert!(mounted(&target));
        unmount_work(&link);
        assert!(mounted(&target), "unmounted through the link");
        let c = std::ffi::CString::new(link.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated string.
        assert_eq!(unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) }, 0);
        assert!(!mounted(&target), "the control: a following unmount");
        drop(mount);
    }
}
