//! The private runtime directory: connection files, IPC sockets and the tool socket live here.
//!
//! Created with mode 0700 under `$XDG_RUNTIME_DIR` (or the temp dir) as `ipybox-<pid>-<random>`,
//! removed when dropped; the runtime directories of a shared kernel factory's executors, inside
//! the factory's own, are `s-<random>`. Directories left by an ipybox that was killed (its pid is
//! gone) are swept when the next one starts.
//!
//! Sockets are bound in here, and a Unix socket path has at most [`SOCKET_PATH_MAX`] bytes: a
//! directory is made only if the longest socket path it will hold ([`Sockets`]) fits, with this
//! process's id as it is (pids reach seven digits where `pid_max` is 4194304); else the error
//! ([`SocketPathTooLong`]) names the limit, that path and the variable that shortens the base.
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

/// The name of a runtime directory inside a shared kernel factory's (`s-<6 hex>`): short, as
/// that directory's own name already holds the pid.
const SESSION_PREFIX: &str = "s-";

/// The longest path a Unix socket may be bound at, in bytes: `sun_path` holds 108 on Linux (104
/// on macOS and the BSDs), the terminating NUL included.
#[cfg(target_os = "linux")]
pub const SOCKET_PATH_MAX: usize = 107;
/// The longest path a Unix socket may be bound at, in bytes: `sun_path` holds 108 on Linux (104
/// on macOS and the BSDs), the terminating NUL included.
#[cfg(not(target_os = "linux"))]
pub const SOCKET_PATH_MAX: usize = 103;

/// The highest kernel number (`k<N>`) whose IPC sockets [`Sockets::Own`] makes room for; a
/// pool that launches more kernels than this gets an error naming the limit instead.
const KERNEL_NUMBER_ROOM: &str = "999999";

/// Which sockets a runtime directory will hold, and so how long its own path may be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Sockets {
    /// ipybox's own: `tools.sock`, `factory/sock`, `egress.sock`, and each kernel's IPC
    /// sockets `box/k<N>/k-<port>` (the longest).
    Own,
    /// A shared kernel factory's directory: its socket, and the runtime directories of its
    /// executors (`s-<6 hex>/`, each holding [`Sockets::Own`]).
    Shared,
    /// A sandboxed executor's: also srt's proxy bridges (`srt/claude-socks-<16 hex>.sock`), and
    /// those of a sandboxed install in its scratch directory (`i<6>/srt/…`, the longest).
    Sandboxed,
}

impl Sockets {
    /// The longest socket path below the directory, relative to it (with the leading `/`).
    pub(crate) fn longest(self) -> String {
        const SRT_BRIDGE: &str = "srt/claude-socks-0123456789abcdef.sock";
        let own = format!("/{KERNEL_WRITABLE}/k{KERNEL_NUMBER_ROOM}/k-5");
        match self {
            Sockets::Own => own,
            Sockets::Shared => format!("/{SESSION_PREFIX}000000{own}"),
            Sockets::Sandboxed => format!("/{INSTALL_SCRATCH_PREFIX}000000/{SRT_BRIDGE}"),
        }
    }
}

/// The prefix of a sandboxed install's scratch directory in the runtime directory (then six
/// random characters): one letter, as srt's socket names in it are long. The same as
/// `sandbox::install::SCRATCH_PREFIX` (the executor's tests keep them equal: neither module
/// uses the other).
pub(crate) const INSTALL_SCRATCH_PREFIX: &str = "i";

/// A runtime directory whose socket paths would not fit the [`SOCKET_PATH_MAX`] bytes a Unix
/// socket path may have: its base (`$XDG_RUNTIME_DIR`, else `$TMPDIR`, else `/tmp`) is too long
/// for this process's id and the names below it.
#[derive(Debug, Clone, thiserror::Error)]
#[error(
    "cannot make a runtime directory in {base}: its Unix sockets would not fit, as {path} would be {len} bytes and a socket path has at most {max}\n  help: set {var} to a directory of at most {base_max} bytes (the runtime base is $XDG_RUNTIME_DIR, else $TMPDIR, else /tmp; this one is {base_len} bytes)",
    base = base.display(),
    path = path.display(),
    len = path.as_os_str().len(),
    base_len = base.as_os_str().len(),
)]
pub struct SocketPathTooLong {
    /// The longest socket path the directory would hold.
    pub path: PathBuf,
    /// The limit, [`SOCKET_PATH_MAX`].
    pub max: usize,
    /// Where runtime directories are made.
    pub base: PathBuf,
    /// The longest base that would fit, with this process's id.
    pub base_max: usize,
    /// The variable that sets the base: `XDG_RUNTIME_DIR`, or `TMPDIR` when that one chose it.
    pub var: &'static str,
}

/// Why a runtime directory could not be made.
#[derive(Debug)]
pub(crate) enum CreateError {
    /// Its sockets would not fit.
    TooLong(SocketPathTooLong),
    /// It could not be created.
    Io(std::io::Error),
}

impl From<std::io::Error> for CreateError {
    fn from(e: std::io::Error) -> Self {
        CreateError::Io(e)
    }
}

impl std::fmt::Display for CreateError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CreateError::TooLong(e) => e.fmt(f),
            CreateError::Io(e) => e.fmt(f),
        }
    }
}

/// `Ok` when every socket below `path` (a runtime directory about to be made in `base`, which
/// `host` chose) fits, else the error naming the longest one.
fn check_fits(path: &Path, sockets: Sockets, host: &HostEnv) -> Result<(), SocketPathTooLong> {
    let longest = format!("{}{}", path.display(), sockets.longest());
    if longest.len() <= SOCKET_PATH_MAX {
        return Ok(());
    }
    let base = RuntimeDir::base_dir(host);
    let overhead = longest.len().saturating_sub(base.as_os_str().len());
    let var = if host
        .get("XDG_RUNTIME_DIR")
        .is_some_and(|d| Path::new(d).is_dir())
    {
        "XDG_RUNTIME_DIR"
    } else if host.get("TMPDIR").is_some() {
        "TMPDIR"
    } else {
        "XDG_RUNTIME_DIR"
    };
    Err(SocketPathTooLong {
        path: PathBuf::from(longest),
        max: SOCKET_PATH_MAX,
        base,
        base_max: SOCKET_PATH_MAX.saturating_sub(overhead),
        var,
    })
}

/// The subdirectory of the runtime directory a kernel may write (see the module comment).
pub(crate) use crate::runtime_layout::{KERNEL_WRITABLE, temp_dir};

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

/// Unmounts what a session's confinement may have mounted at a path (its work directory's
/// tmpfs, a shared factory directory's bind of itself), never through a link, and does nothing
/// where nothing is mounted: called before a runtime directory is removed, its own on drop and a
/// dead ipybox's in the sweep. Whoever composes kernels and confinement hands it over
/// (`executor::start`: `confine::limits::unmount_work`), so this module needs nothing of
/// `confine`.
pub(crate) type MountCleanUp = fn(&Path);

/// A private directory removed (with everything in it) on drop.
#[derive(Debug)]
pub(crate) struct RuntimeDir {
    path: PathBuf,
    /// Run on the mount points before the directory is removed.
    clean_up: MountCleanUp,
    /// The uid and gid of the session's kernels when they are not ipybox's
    /// ([`Self::set_kernel_owner`]).
    kernel_owner: std::sync::OnceLock<(u32, u32)>,
}

impl RuntimeDir {
    /// Where runtime directories go: `$XDG_RUNTIME_DIR` when it is a directory, else `$TMPDIR`,
    /// else `/tmp`.
    pub(crate) fn base_dir(host: &HostEnv) -> PathBuf {
        crate::runtime_layout::base_dir(host)
    }

    /// Creates a fresh private directory (`ipybox-<pid>-<6 hex>`) under
    /// [`RuntimeDir::base_dir`] for `sockets`, sweeping stale ones first.
    pub(crate) fn create(
        host: &HostEnv,
        sockets: Sockets,
        clean_up: MountCleanUp,
    ) -> Result<Self, CreateError> {
        let base = Self::base_dir(host);
        let prefix = format!("{PREFIX}{}-", std::process::id());
        check_fits(&base.join(format!("{prefix}000000")), sockets, host)
            .map_err(CreateError::TooLong)?;
        sweep_stale(&base, clean_up);
        Ok(Self::make(&base, &prefix, clean_up)?)
    }

    /// Creates a fresh private directory (`s-<6 hex>`) in `parent`, a shared kernel factory's
    /// directory (made by [`Self::create`] from `host` with [`Sockets::Shared`]), which its
    /// executors' runtime directories live in: removed with it when ipybox dies.
    pub(crate) fn create_in(
        parent: &Path,
        host: &HostEnv,
        clean_up: MountCleanUp,
    ) -> Result<Self, CreateError> {
        check_fits(
            &parent.join(format!("{SESSION_PREFIX}000000")),
            Sockets::Own,
            host,
        )
        .map_err(CreateError::TooLong)?;
        Ok(Self::make(parent, SESSION_PREFIX, clean_up)?)
    }

    /// A fresh directory `<prefix><6 hex>` in `base`.
    fn make(base: &Path, prefix: &str, clean_up: MountCleanUp) -> std::io::Result<Self> {
        loop {
            let path = base.join(format!("{prefix}{:06x}", rand::random::<u32>() & 0xff_ffff));
            match std::fs::DirBuilder::new().mode(0o700).create(&path) {
                Ok(()) => {
                    // The umask may have narrowed the mode; make sure it is exactly 0700.
                    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o700))?;
                    return Ok(Self {
                        path,
                        kernel_owner: std::sync::OnceLock::new(),
                        clean_up,
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

    /// `<runtime>/kernels`, created if needed: 0700, or, when the session's kernels have a uid of
    /// their own, `root:GID` 0750 (traversable by them: their directories, a snapshot to load and
    /// the socket a snapshot is sent over are in it).
    pub(crate) fn host_kernels_dir(&self) -> std::io::Result<PathBuf> {
        let dir = self.host_kernels();
        std::fs::DirBuilder::new()
            .mode(0o700)
            .recursive(true)
            .create(&dir)?;
        if let Some((_, gid)) = self.kernel_owner() {
            std::os::unix::fs::lchown(&dir, Some(0), Some(gid))?;
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o750))?;
        }
        Ok(dir)
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
        // Room was made for `k` and six digits ([`Sockets::Own`]); a longer name may not fit.
        let longest = self.path.join(KERNEL_WRITABLE).join(name).join("k-5");
        if longest.as_os_str().len() > SOCKET_PATH_MAX {
            return Err(std::io::Error::other(format!(
                "the kernel's IPC socket {} would be {} bytes, over the {SOCKET_PATH_MAX} a Unix \
                 socket path may have (this executor launched more than {KERNEL_NUMBER_ROOM} \
                 kernels: start a new one)",
                longest.display(),
                longest.as_os_str().len()
            )));
        }
        let owner = self.kernel_owner();
        if owner.is_some() {
            self.host_kernels_dir()?;
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
        unmount_in(&self.path, self.clean_up);
        // A kernel made what is in `box/` (and `work/`): any depth, any links.
        let _ = crate::safe_fs::remove_path_tree(&self.path);
    }
}

/// Removes `ipybox-<pid>-*` directories whose process no longer exists.
/// Removes the mounts a runtime directory may hold before it is removed (never leave mounts
/// behind): a confined session's work directory and kernel directory tmpfs (`<dir>/work`,
/// `<dir>/box`), those of the sessions in a shared factory's directory (`<dir>/*/work`,
/// `<dir>/*/box`), and the factory directory's bind of itself
/// (`confine::limits::share_mounts_below`), each through `unmount`.
///
/// Only those paths: never anything inside what a kernel writes (`box/`, where a kernel could
/// make `box/work` a link to any mount point of the host; `box` itself is the host's name in a
/// directory only the host writes), and never through a link (`unmount` must not follow one).
fn unmount_in(dir: &Path, unmount: MountCleanUp) {
    use crate::runtime_layout::WORK_DIR;
    unmount(&dir.join(WORK_DIR));
    unmount(&dir.join(KERNEL_WRITABLE));
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            // The runtime directories of a shared factory's sessions (made by ipybox: `s-…`,
            // or `ipybox-…` as an older ipybox named them).
            let ours = entry
                .file_name()
                .to_str()
                .is_some_and(|n| n.starts_with(SESSION_PREFIX) || n.starts_with(PREFIX));
            if ours && entry.file_type().is_ok_and(|t| t.is_dir()) {
                unmount(&entry.path().join(WORK_DIR));
                unmount(&entry.path().join(KERNEL_WRITABLE));
            }
        }
    }
    unmount(dir);
}

fn sweep_stale(base: &Path, clean_up: MountCleanUp) {
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
        if ours && pid > 0 && !crate::child_process::process_alive(pid) {
            kill_stragglers(&entry.path());
            unmount_in(&entry.path(), clean_up);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// What `executor::start` hands over.
    const UNMOUNT: MountCleanUp = crate::confine::limits::unmount_work;

    /// A runtime directory's name with the highest pid Linux gives (`pid_max` at most 4194304).
    const SEVEN_DIGIT_NAME: &str = "ipybox-4194304-abcdef";

    fn host_with_runtime_base(base: &Path) -> HostEnv {
        HostEnv::from_vars([("XDG_RUNTIME_DIR".to_string(), base.display().to_string())].into())
    }

    /// `parent/bbb…` of exactly `len` bytes, created.
    fn base_of_len(parent: &Path, len: usize) -> PathBuf {
        let pad = len - parent.as_os_str().len() - 1;
        let base = parent.join("b".repeat(pad));
        std::fs::create_dir_all(&base).unwrap();
        assert_eq!(base.as_os_str().len(), len);
        base
    }

    /// For each kind of runtime directory, a base as long as it may be with a seven-digit pid:
    /// the longest socket path it will hold (built for real, directories and all) is exactly
    /// the limit and binds. One byte more of base is refused before anything is made, with the
    /// limit, that path and the variable named. Control: the kernel really refuses a socket
    /// path one byte longer (the check guards a real limit).
    #[test]
    fn the_longest_socket_path_fits_with_a_seven_digit_pid() {
        let t = tempfile::tempdir().unwrap();
        for sockets in [Sockets::Own, Sockets::Shared, Sockets::Sandboxed] {
            let room = 1 + SEVEN_DIGIT_NAME.len() + sockets.longest().len();
            let base_max = SOCKET_PATH_MAX - room;
            let kind = t.path().join(format!("{sockets:?}"));
            let base = base_of_len(&kind, base_max);
            let dir = base.join(SEVEN_DIGIT_NAME);
            check_fits(&dir, sockets, &host_with_runtime_base(&base)).unwrap();
            let socket = PathBuf::from(format!("{}{}", dir.display(), sockets.longest()));
            assert_eq!(socket.as_os_str().len(), SOCKET_PATH_MAX, "{sockets:?}");
            std::fs::create_dir_all(socket.parent().unwrap()).unwrap();
            std::os::unix::net::UnixListener::bind(&socket)
                .unwrap_or_else(|e| panic!("{sockets:?}: {} binds: {e}", socket.display()));

            let longer = base_of_len(&kind.join("l"), base_max + 1);
            let too_long = check_fits(
                &longer.join(SEVEN_DIGIT_NAME),
                sockets,
                &host_with_runtime_base(&longer),
            )
            .unwrap_err();
            let path = format!(
                "{}/{SEVEN_DIGIT_NAME}{}",
                longer.display(),
                sockets.longest()
            );
            assert_eq!(
                too_long.to_string(),
                format!(
                    "cannot make a runtime directory in {}: its Unix sockets would not fit, as \
                     {path} would be {} bytes and a socket path has at most {SOCKET_PATH_MAX}\n  \
                     help: set XDG_RUNTIME_DIR to a directory of at most {base_max} bytes (the \
                     runtime base is $XDG_RUNTIME_DIR, else $TMPDIR, else /tmp; this one is {} \
                     bytes)",
                    longer.display(),
                    SOCKET_PATH_MAX + 1,
                    base_max + 1,
                )
            );
            // Control: the limit is the kernel's.
            let over = PathBuf::from(&path);
            std::fs::create_dir_all(over.parent().unwrap()).unwrap();
            let refused = std::os::unix::net::UnixListener::bind(&over).unwrap_err();
            assert_eq!(
                refused.kind(),
                std::io::ErrorKind::InvalidInput,
                "{refused}"
            );
        }
    }

    /// `create` and `create_in` check with this process's own pid, before making anything: a
    /// shared factory's directory refuses a base its executors' directories would not fit in,
    /// and an executor's directory in a shared one is short (`s-<6 hex>`), so its sockets fit
    /// where `ipybox-<pid>-<random>` twice did not (issue 49: a 59-byte base, 110 bytes).
    #[test]
    fn create_checks_with_its_own_pid_and_nests_short_names() {
        let t = tempfile::tempdir().unwrap();
        let name = format!("{PREFIX}{}-000000", std::process::id());
        let own_max = SOCKET_PATH_MAX - 1 - name.len() - Sockets::Own.longest().len();
        let shared_max = SOCKET_PATH_MAX - 1 - name.len() - Sockets::Shared.longest().len();
        let base = base_of_len(&t.path().join("a"), shared_max + 1);
        let host = host_with_runtime_base(&base);
        // Too long for a shared factory's directory, long enough for an executor's own.
        assert!(shared_max < own_max);
        match RuntimeDir::create(&host, Sockets::Shared, UNMOUNT) {
            Err(CreateError::TooLong(e)) => assert_eq!(e.base_max, shared_max),
            other => panic!("{other:?}"),
        }
        assert_eq!(std::fs::read_dir(&base).unwrap().count(), 0, "nothing made");
        let own = RuntimeDir::create(&host, Sockets::Own, UNMOUNT).unwrap();
        assert!(
            own.path()
                .file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .starts_with(&name[..name.len() - 6])
        );

        let base = base_of_len(&t.path().join("b"), shared_max);
        let host = host_with_runtime_base(&base);
        let shared = RuntimeDir::create(&host, Sockets::Shared, UNMOUNT).unwrap();
        let session = RuntimeDir::create_in(shared.path(), &host, UNMOUNT).unwrap();
        let session_name = session.path().file_name().unwrap().to_str().unwrap();
        assert!(
            session_name.starts_with(SESSION_PREFIX) && session_name.len() == 8,
            "{session_name}"
        );
        let dirs = session.kernel_dirs("k999999").unwrap();
        let ipc = dirs.ipc.join("k-5");
        assert!(
            ipc.as_os_str().len() <= SOCKET_PATH_MAX,
            "{}",
            ipc.display()
        );
        std::os::unix::net::UnixListener::bind(&ipc).unwrap();
        // One kernel past the room made: a clear error, not an unbindable socket.
        let past = session.kernel_dirs("k1000000").unwrap_err().to_string();
        assert!(
            past.contains(&format!(
                "over the {SOCKET_PATH_MAX} a Unix socket path may have"
            )),
            "{past}"
        );
    }

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
        sweep_stale(base.path(), crate::confine::limits::unmount_work);
        assert!(!stale.exists());
        let status = straggler.wait().unwrap();
        assert!(!status.success(), "killed: {status:?}");
        assert!(bystander.try_wait().unwrap().is_none(), "left alone");
        bystander.kill().unwrap();
        let _ = bystander.wait();
    }
}
