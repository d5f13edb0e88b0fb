//! Confinement: a local kernel in a bubblewrap (`bwrap`) of its own, so that code in one
//! executor's kernel cannot reach another executor's kernels, sockets or files, nor ipybox
//! itself. The HTTP service confines every session this way by default (docs/http.md).
//!
//! What a confined kernel gets ([`wrapper`]):
//! - its own pid namespace and `/proc` (no host pid: nothing to signal, ptrace or read in
//!   `/proc/<pid>`), its own IPC and UTS namespaces, a new terminal session, and it dies with
//!   ipybox (`--die-with-parent`; the host kills it by killing bwrap, whose death takes the
//!   namespace's pid 1 and so every process in it); no capabilities (as root too);
//! - a view of the host built by allowlist (`layout.rs`): the system directories and a minimal
//!   `/etc` read-only, nothing else of `/`; every runtime directory (the base directory they
//!   live in, `/tmp`, `$TMPDIR`, `/run`), `$HOME` and ipybox's data directory are empty, except:
//!   the kernel's interpreter and its environment (read-only), its own runtime directory
//!   (read-only: connection files, the tool socket, ipybox's kernel-side Python) with the
//!   kernel-writable `box/` (its IPC sockets), the workspace (read-only), and its working
//!   directory (writable: `<runtime>/work`, removed when the executor stops);
//! - a private, empty `/tmp` and `$HOME` (in memory, gone with the kernel process);
//! - paths the caller hides (`Confinement::hidden`: the workspace's `.env`, other sessions'
//!   images) replaced by an empty directory or file.
//!
//! bwrap is started with exactly the kernel's environment (its pid 1, which the kernel can read
//! in `/proc/1/environ`, keeps what it was started with).
//!
//! Not here: the srt sandbox (`sandbox/`, a policy of its own per kernel, which this does not
//! stack on), which directories an executor has (`kernel::runtime_dir`), when a service
//! confines (`http/`).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

pub mod cgroup;
pub mod limits;
pub(crate) mod plan;
mod session_limits;

use crate::child_process::{ChildCommand, CommandWrapper};
use crate::host_env::HostEnv;

pub mod egress_proxy;
pub(crate) mod identity;
mod layout;
pub mod network;
#[cfg(target_os = "linux")]
pub(crate) mod seccomp;
pub mod service;
/// No seccomp off Linux, and no confinement either ([`find_bwrap`] says so before a kernel is
/// confined): the filter's file cannot be written.
#[cfg(not(target_os = "linux"))]
pub(crate) mod seccomp {
    pub(crate) fn write(_runtime_dir: &std::path::Path) -> std::io::Result<std::path::PathBuf> {
        Err(std::io::Error::new(
            std::io::ErrorKind::Unsupported,
            "seccomp filters are Linux only: confined kernels are not on this platform",
        ))
    }
}
pub mod uids;
pub(crate) use layout::Layout;
pub use layout::{ETC_SHOWN, SYSTEM_DIRS};

/// The name of a confined kernel's working directory in its runtime directory.
pub(crate) use crate::runtime_layout::WORK_DIR;

/// What to confine a local kernel with (see the module comment).
#[derive(Debug, Clone, Default)]
pub struct Confinement {
    /// Paths the kernel must not see, in addition to what is always hidden: a directory
    /// becomes an empty one, a file an empty file. Paths that do not exist when a kernel starts
    /// are left out.
    pub hidden: Vec<PathBuf>,
    /// The bubblewrap executable (default: `bwrap` on `PATH`).
    pub bwrap: Option<PathBuf>,
    /// What each session may use, and how it is enforced (`None`: no limits).
    pub limiter: Option<Arc<limits::Limiter>>,
    /// What the kernel reaches on the network (default: its own network namespace, egress
    /// through ipybox's proxy by policy; see [`network`]).
    pub network: network::NetworkPolicy,
    /// Host paths shown read-only in addition to the view's allowlist (`layout.rs`), at their
    /// own path (`serve --http --session-show`).
    pub shown: Vec<PathBuf>,
    /// Where each session's own uid comes from (`None`: kernels keep ipybox's uid; see
    /// [`uids`]).
    pub uids: Option<Arc<uids::UidPool>>,
}

/// Why confinement cannot be set up.
#[derive(Debug, thiserror::Error)]
pub enum ConfineError {
    /// bwrap is missing or does not work here.
    #[error("cannot confine kernels: {reason}\n  help: {help}")]
    Unavailable { reason: String, help: String },
}

/// The install hint for bubblewrap.
pub const INSTALL_HINT: &str =
    "install bubblewrap (`apt-get install bubblewrap`, `dnf install bubblewrap`)";

/// The bwrap executable: `explicit`, else `bwrap` on `PATH`. Linux only: elsewhere an error
/// that says so (bubblewrap is made of Linux namespaces).
pub fn find_bwrap(explicit: Option<&Path>, host: &HostEnv) -> Result<PathBuf, ConfineError> {
    if !cfg!(target_os = "linux") {
        return Err(ConfineError::Unavailable {
            reason: "confinement uses bubblewrap (Linux namespaces), which is not on this platform"
                .into(),
            help: "run `ipybox serve --http --unconfined-sessions` (sessions then share the host's view)"
                .into(),
        });
    }
    match explicit {
        Some(path) if path.is_file() => Ok(path.to_path_buf()),
        Some(path) => Err(ConfineError::Unavailable {
            reason: format!("{} does not exist", path.display()),
            help: INSTALL_HINT.into(),
        }),
        None => host
            .find_on_path("bwrap")
            .ok_or_else(|| ConfineError::Unavailable {
                reason: "bubblewrap (`bwrap`) is not on PATH".into(),
                help: INSTALL_HINT.into(),
            }),
    }
}

/// The namespace and process flags of every confined kernel and of the shared template.
fn namespace_flags() -> Vec<String> {
    [
        "--die-with-parent",
        "--new-session",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
    ]
    .map(String::from)
    .into()
}

/// [`namespace_flags`], and no capabilities: every confined kernel's.
fn base_flags() -> Vec<String> {
    let mut flags = namespace_flags();
    // As root bwrap keeps every capability unless told (the kernel could remount `/`
    // read-write or unmount what hides other sessions); as another user it runs in a user
    // namespace of its own and drops them itself.
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        flags.extend(["--cap-drop", "ALL"].map(String::from));
    }
    flags
}

/// Checks that `bwrap` runs here with the namespaces a confined kernel needs (it may be
/// installed but refused: no user namespaces in a container, an AppArmor rule).
pub async fn probe(bwrap: &Path) -> Result<(), ConfineError> {
    // Only the system directories, not `/`: a recursive bind of `/` fails (EINVAL) when a mount
    // under it goes away meanwhile, as sessions' work directories (tmpfs) do on a busy host.
    let mut system = Vec::new();
    for dir in SYSTEM_DIRS {
        let path = Path::new(dir);
        match std::fs::symlink_metadata(path) {
            Ok(m) if m.is_symlink() => {
                if let Ok(target) = std::fs::read_link(path) {
                    system.extend([
                        "--symlink".into(),
                        target.display().to_string(),
                        (*dir).into(),
                    ]);
                }
            }
            Ok(m) if m.is_dir() => {
                system.extend(["--ro-bind".into(), (*dir).into(), (*dir).into()])
            }
            _ => {}
        }
    }
    let mut cmd = crate::child_process::host_command(bwrap);
    cmd.args(base_flags())
        .args(system)
        .args(["--dev", "/dev", "--proc", "/proc"])
        .args(["--", "true"])
        .env_clear()
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let output = match tokio::time::timeout(Duration::from_secs(10), cmd.output()).await {
        Ok(Ok(output)) => output,
        Ok(Err(e)) => {
            return Err(ConfineError::Unavailable {
                reason: format!("cannot run {}: {e}", bwrap.display()),
                help: INSTALL_HINT.into(),
            });
        }
        Err(_) => {
            return Err(ConfineError::Unavailable {
                reason: format!("{} did not finish a test run within 10 s", bwrap.display()),
                help: "check that bubblewrap works here: `bwrap --ro-bind / / --unshare-pid true`"
                    .into(),
            });
        }
    };
    if output.status.success() {
        return Ok(());
    }
    Err(ConfineError::Unavailable {
        reason: format!(
            "bubblewrap cannot create the namespaces a confined kernel needs ({}): {}",
            crate::child_process::describe_exit(output.status),
            crate::child_process::tail(&output.stderr)
        ),
        help: "bubblewrap needs user namespaces when ipybox does not run as root (sysctl kernel.unprivileged_userns_clone=1; in a container: a seccomp profile that allows unshare/clone, e.g. `--security-opt seccomp=unconfined`, or run ipybox as root in it)".into(),
    })
}

/// The wrapper that runs a kernel command (or the kernel factory's template) inside bwrap with
/// `layout`, in the command's working directory (`layout.work`) inside, and with the command's
/// own environment as bwrap's. bwrap itself starts in `/`.
///
/// The kernel becomes `identity` first (a Python statement put before the launcher's code,
/// `python -c CODE`): as root bubblewrap keeps `CAP_SETUID`, `CAP_SETGID` and `CAP_SETPCAP` for
/// that when the kernel has a uid of its own, and the kernel drops them (with the switch) before
/// any other code runs.
pub(crate) fn wrapper(
    bwrap: &Path,
    layout: Layout,
    identity: &identity::KernelIdentity,
) -> CommandWrapper {
    let mut prefix = vec![bwrap.display().to_string()];
    prefix.extend(base_flags());
    if identity.ids.is_some() {
        prefix.extend(
            [
                "--cap-add",
                "CAP_SETUID",
                "--cap-add",
                "CAP_SETGID",
                "--cap-add",
                "CAP_SETPCAP",
            ]
            .map(String::from),
        );
    }
    if layout.unshare_net {
        // bubblewrap brings `lo` up in it.
        prefix.push("--unshare-net".into());
    }
    let inner = wrap_with(prefix, layout);
    let prelude = identity.launcher_prelude();
    CommandWrapper(Arc::new(move |mut cmd: ChildCommand| {
        if cmd.argv.get(1).is_some_and(|a| a == "-c")
            && let Some(code) = cmd.argv.get_mut(2)
        {
            // First the working directory (the workspace) goes from `sys.path`, as the
            // launcher's own first statement does (`kernel::local::CLEAN_PATH`).
            *code =
                format!("import sys; sys.path[:] = [p for p in sys.path if p]\n{prelude}\n{code}");
        }
        (inner.0)(cmd)
    }))
}

/// The wrapper of the kernel factory's template shared by several confined executors
/// ([`Layout::for_template`]): the namespaces and view of every confined kernel, but with
/// `CAP_SYS_ADMIN` (to make each forked kernel's namespaces and mounts) and `CAP_SETPCAP` (to
/// empty its capability bounding set) kept: as root only those two, otherwise in bubblewrap's
/// user namespace. The template runs no code but ipybox's; each kernel drops both before any
/// other code runs (`python/ipybox_runtime/confine_child.py`).
pub(crate) fn template_wrapper(bwrap: &Path, layout: Layout) -> CommandWrapper {
    let mut prefix = vec![bwrap.display().to_string()];
    prefix.extend(namespace_flags());
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        prefix.extend(["--cap-drop", "ALL"].map(String::from));
    }
    prefix.extend(["--cap-add", "CAP_SYS_ADMIN", "--cap-add", "CAP_SETPCAP"].map(String::from));
    // Each kernel's init switches to the session's uid and gid (`confine_identity.py`).
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        prefix.extend(["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"].map(String::from));
    }
    if layout.unshare_net {
        // The template needs no network: its own namespace (only `lo`), so that the
        // `CAP_NET_ADMIN` each fork needs to bring up `lo` in its own new namespace is over
        // nothing of the host's. Each kernel drops it with the rest (confine_child.py).
        prefix.extend(["--unshare-net", "--cap-add", "CAP_NET_ADMIN"].map(String::from));
    }
    wrap_with(prefix, layout)
}

fn wrap_with(prefix: Vec<String>, layout: Layout) -> CommandWrapper {
    let layout = Arc::new(layout);
    CommandWrapper(Arc::new(move |cmd: ChildCommand| {
        let mut argv = prefix.clone();
        argv.extend(layout.mount_args());
        argv.extend(["--chdir".into(), cmd.cwd.display().to_string(), "--".into()]);
        argv.extend(cmd.argv);
        Ok(ChildCommand {
            argv,
            env: cmd.env,
            cwd: crate::child_process::SAFE_CWD.into(),
            private_dir: cmd.private_dir,
        })
    }))
}
