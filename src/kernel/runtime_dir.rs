//! The private runtime directory: connection files, IPC sockets and the tool socket live here.
//!
//! Created with mode 0700 under `$XDG_RUNTIME_DIR` (or the temp dir) as `ipybox-<pid>-<random>`,
//! removed when dropped. Directories left by an ipybox that was killed (its pid is gone) are swept
//! when the next one starts. Paths are kept short: Unix socket paths are limited to ~107 bytes.
//!
//! Layout: only the host writes the directory itself (`tools.sock`, `python/`, the sandbox
//! settings, `srt/`, [`FACTORY`]`/sock`, and [`HOST_KERNELS`]`/k<N>/` per kernel with its
//! connection file, `t<N>/` per kernel factory template); a kernel
//! writes only below [`KERNEL_WRITABLE`] (`box/`: its IPC sockets in `box/k<N>/`, and for a
//! sandboxed kernel its TMPDIR and IPython/Jupyter directories, and with an isolated workspace
//! its working directory `box/work`), and a confined kernel ([`crate::confine`]) also its
//! working directory `work/` (the host makes it and never reads from it). The sandbox policy lets a
//! sandboxed kernel write `box/` and read only the host's parts it needs, so nothing the host
//! writes or reads back, the settings of the next kernel included, can be prepared by the
//! kernel.

use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::host_env::HostEnv;

const PREFIX: &str = "ipybox-";

/// The subdirectory of the runtime directory a kernel may write (see the module comment).
pub(crate) const KERNEL_WRITABLE: &str = "box";

/// The subdirectory holding the kernel factory's socket.
pub(crate) const FACTORY: &str = "factory";

/// The subdirectory holding each kernel's host-only directory (`k<N>/`).
pub(crate) const HOST_KERNELS: &str = "kernels";

/// A kernel's directories: `host` (`<runtime>/kernels/k<N>`: its connection file and anything else the
/// host hands it; only the host writes here) and `ipc` (`<runtime>/box/k<N>`: where the kernel
/// binds its IPC sockets).
#[derive(Debug, Clone)]
pub(crate) struct KernelDirs {
    pub(crate) host: PathBuf,
    pub(crate) ipc: PathBuf,
    /// The session's own uid and gid its kernels run as ([`RuntimeDir::set_kernel_owner`]):
    /// `host` is then readable by the gid (`root:GID`, 0750, and so is the connection file) and
    /// `ipc` is the uid's.
    pub(crate) owner: Option<(u32, u32)>,
}

impl KernelDirs {
    /// Creates `host` (0700) and, inside the kernel-writable directory `writable`, a fresh
    /// `ipc` directory named `name`: whatever a kernel left at that name (a directory, a link)
    /// is removed first, without following it. Whatever `host` held is removed too.
    fn create(
        host: PathBuf,
        writable: &crate::safe_fs::NoFollowDir,
        name: &str,
        owner: Option<(u32, u32)>,
    ) -> std::io::Result<Self> {
        let _ = crate::safe_fs::remove_path_tree(&host);
        std::fs::DirBuilder::new()
            .mode(0o700)
            .recursive(true)
            .create(&host)?;
        writable.remove_tree(name)?;
        let ipc = writable.subdir(name, Some(0o700))?;
        if let Some((uid, gid)) = owner {
            std::os::unix::fs::lchown(&host, Some(0), Some(gid))?;
            std::fs::set_permissions(&host, std::fs::Permissions::from_mode(0o750))?;
            // Through the descriptor of the directory just made (the kernel writes `box/`).
            ipc.chown(".", uid, gid)?;
        }
        Ok(KernelDirs {
            host,
            ipc: ipc.path().to_path_buf(),
            owner,
        })
    }

    /// Both directories, empty again (after a start that failed and may have left files or
    /// removed them): a second way of starting the same kernel begins from scratch.
    pub(crate) fn recreate(&self) -> std::io::Result<()> {
        let (Some(parent), Some(name)) = (self.ipc.parent(), self.ipc.file_name()) else {
            return Err(std::io::Error::other(
                "a kernel's IPC directory has no parent",
            ));
        };
        let writable = crate::safe_fs::NoFollowDir::open(parent, None)?;
        Self::create(
            self.host.clone(),
            &writable,
            &name.to_string_lossy(),
            self.owner,
        )
        .map(|_| ())
    }

    /// Removes both directories (a link planted at `ipc` is removed, not followed).
    pub(crate) fn remove(&self) {
        let _ = crate::safe_fs::remove_path_tree(&self.host);
        let _ = crate::safe_fs::remove_path_tree(&self.ipc);
    }
}

/// A private directory removed (with everything in it) on drop.
#[derive(Debug)]
pub(crate) struct RuntimeDir {
    path: PathBuf,
    /// The uid and gid of the session's kernels when they are not ipybox's
    /// ([`Self::set_kernel_owner`]).
    kernel_owner: std::sync::OnceLock<(u32, u32)>,
}

impl RuntimeDir {
    /// Where runtime directories go: `$XDG_RUNTIME_DIR` when it is a directory, else `$TMPDIR`,
    /// else `/tmp`.
    pub(crate) fn base_dir(host: &HostEnv) -> PathBuf {
        host.get("XDG_RUNTIME_DIR")
            .map(PathBuf::from)
            .filter(|p| p.is_dir())
            .unwrap_or_else(|| temp_dir(host))
    }

    /// Creates a fresh private directory under [`RuntimeDir::base_dir`], sweeping stale ones
    /// first.
    pub(crate) fn create(host: &HostEnv) -> std::io::Result<Self> {
        let base = Self::base_dir(host);
        sweep_stale(&base);
        Self::create_in(&base)
    }

    /// Creates a fresh private directory in `parent` (a shared kernel factory's directory,
    /// which its executors' runtime directories live in: removed with it when ipybox dies).
    pub(crate) fn create_in(parent: &Path) -> std::io::Result<Self> {
        let base = parent;
        loop {
            let path = base.join(format!(
                "{PREFIX}{}-{:06x}",
                std::process::id(),
                rand::random::<u32>() & 0xff_ffff
            ));
            match std::fs::DirBuilder::new().mode(0o700).create(&path) {
                Ok(()) => {
                    // The umask may have narrowed the mode; make sure it is exactly 0700.
                    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o700))?;
                    return Ok(Self {
                        path,
                        kernel_owner: std::sync::OnceLock::new(),
                    });
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e),
            }
        }
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// `<runtime>/kernels`: the kernels' host-only directories.
    pub(crate) fn host_kernels(&self) -> PathBuf {
        self.path.join(HOST_KERNELS)
    }

    /// `<runtime>/factory` (created 0700 if needed): the kernel factory's socket, which the
    /// template and its kernels connect to (readable inside the sandbox, not writable).
    pub(crate) fn factory_dir(&self) -> std::io::Result<PathBuf> {
        let dir = self.path.join(FACTORY);
        std::fs::DirBuilder::new()
            .mode(0o700)
            .recursive(true)
            .create(&dir)?;
        Ok(dir)
    }

    /// `<runtime>/box`: what a kernel may write (created on first use).
    pub(crate) fn kernel_writable(&self) -> std::io::Result<crate::safe_fs::NoFollowDir> {
        crate::safe_fs::NoFollowDir::open(&self.path.join(KERNEL_WRITABLE), Some(0o700))
    }

    /// Fresh directories for kernel `name` (`k<N>`). Whatever a kernel left at the IPC
    /// directory's name (a directory, a link) is removed first, without following it.
    pub(crate) fn kernel_dirs(&self, name: &str) -> std::io::Result<KernelDirs> {
        let owner = self.kernel_owner();
        if let Some((_, gid)) = owner {
            // `kernels/` itself: traversable by the session's group (its kernels' directories
            // are in it).
            let dir = self.host_kernels();
            std::fs::DirBuilder::new()
                .mode(0o750)
                .recursive(true)
                .create(&dir)?;
            std::os::unix::fs::lchown(&dir, Some(0), Some(gid))?;
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o750))?;
        }
        KernelDirs::create(
            self.host_kernels().join(name),
            &self.kernel_writable()?,
            name,
            owner,
        )
    }

    /// The session's kernels run as `uid`/`gid` (`confine::uids`): each kernel's directories
    /// made from now on are handed to them (see [`KernelDirs`]). Set once.
    pub(crate) fn set_kernel_owner(&self, uid: u32, gid: u32) {
        let _ = self.kernel_owner.set((uid, gid));
    }

    /// The uid and gid of the session's kernels, when they have their own.
    pub(crate) fn kernel_owner(&self) -> Option<(u32, u32)> {
        self.kernel_owner.get().copied()
    }
}

impl Drop for RuntimeDir {
    fn drop(&mut self) {
        unmount_in(&self.path);
        // A kernel made what is in `box/` (and `work/`): any depth, any links.
        let _ = crate::safe_fs::remove_path_tree(&self.path);
    }
}

/// `$TMPDIR`, else `/tmp` (what `std::env::temp_dir` does, from the given environment).
pub(crate) fn temp_dir(host: &HostEnv) -> PathBuf {
    host.get("TMPDIR")
        .map_or_else(|| PathBuf::from("/tmp"), PathBuf::from)
}

/// Removes `ipybox-<pid>-*` directories whose process no longer exists.
/// Removes the mounts a runtime directory may hold before it is removed (never leave mounts
/// behind): a confined session's work directory tmpfs (`<dir>/work`), those of the sessions in
/// a shared factory's directory (`<dir>/*/work`), and the factory directory's bind of itself
/// (`confine::limits::share_mounts_below`).
///
/// Only those paths: never anything inside what a kernel writes (`box/`, where a kernel could
/// make `box/work` a link to any mount point of the host), and never through a link
/// (`unmount_work` does not follow one).
fn unmount_in(dir: &Path) {
    use crate::confine::limits::unmount_work;
    unmount_work(&dir.join(crate::confine::WORK_DIR));
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            // The runtime directories of a shared factory's sessions (made by ipybox, named
            // like this one).
            let ours = entry
                .file_name()
                .to_str()
                .is_some_and(|n| n.starts_with(PREFIX));
            if ours && entry.file_type().is_ok_and(|t| t.is_dir()) {
                unmount_work(&entry.path().join(crate::confine::WORK_DIR));
            }
        }
    }
    unmount_work(dir);
}

fn sweep_stale(base: &Path) {
    let Ok(entries) = std::fs::read_dir(base) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(PREFIX)) else {
            continue;
        };
        // Exactly `ipybox-<pid>-<6 hex>`, a directory of ours: nothing else is touched.
        let Some((pid, suffix)) = rest.split_once('-') else {
            continue;
        };
        let Ok(pid) = pid.parse::<i32>() else {
            continue;
        };
        if suffix.len() != 6 || !suffix.chars().all(|c| c.is_ascii_hexdigit()) {
            continue;
        }
        let ours = std::fs::symlink_metadata(entry.path()).is_ok_and(|m| {
            use std::os::unix::fs::MetadataExt;
            // SAFETY: getuid has no preconditions.
            m.is_dir() && m.uid() == unsafe { libc::getuid() }
        });
        if ours && pid > 0 && !process_alive(pid) {
            kill_stragglers(&entry.path());
            unmount_in(&entry.path());
            let _ = crate::safe_fs::remove_path_tree(&entry.path());
        }
    }
}

/// Kills this user's processes whose command line names something inside `dir`, a runtime
/// directory whose ipybox is gone: what an ipybox killed with SIGKILL could not stop. (srt, the
/// sandbox, dies with ipybox, PDEATHSIG, but the `socat` bridges it started, which listen on
/// sockets in `<dir>/srt/`, would live on.) The directory's name is ipybox's pid and 24 random
/// bits, so nothing else names it.
fn kill_stragglers(dir: &Path) {
    use std::os::unix::fs::MetadataExt;
    let needle = format!("{}/", dir.display());
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return;
    };
    // SAFETY: getuid and getpid have no preconditions.
    let (uid, me) = unsafe { (libc::getuid(), libc::getpid()) };
    for entry in procs.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        if pid == me || !entry.metadata().is_ok_and(|m| m.uid() == uid) {
            continue;
        }
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if cmdline.contains(&needle) {
            tracing::debug!(pid, cmdline = ?cmdline, "killing a process left by a killed ipybox");
            // SAFETY: kill has no memory preconditions; the pid was just read from /proc.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

pub(crate) fn process_alive(pid: i32) -> bool {
    // SAFETY: kill with signal 0 only checks for existence/permission.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stale_directory_takes_its_stragglers_with_it() {
        let base = tempfile::tempdir().unwrap();
        // A pid that is gone: a process that has already ended.
        let mut ended = crate::child_process::host_command_blocking("true")
            .spawn()
            .unwrap();
        let dead = ended.id();
        ended.wait().unwrap();
        let stale = base.path().join(format!("{PREFIX}{dead}-abc123"));
        std::fs::create_dir_all(stale.join("srt")).unwrap();
        let bridge = stale.join("srt/bridge.sock").display().to_string();
        // What srt's socat looks like to /proc: the socket path on its command line.
        let mut straggler = crate::child_process::host_command_blocking("sh")
            .args(["-c", "sleep 30", &bridge])
            .spawn()
            .unwrap();
        let mut bystander = crate::child_process::host_command_blocking("sh")
            .args(["-c", "sleep 30", "elsewhere"])
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(100));
        sweep_stale(base.path());
        assert!(!stale.exists());
        let status = straggler.wait().unwrap();
        assert!(!status.success(), "killed: {status:?}");
        assert!(bystander.try_wait().unwrap().is_none(), "left alone");
        bystander.kill().unwrap();
        let _ = bystander.wait();
    }
}
