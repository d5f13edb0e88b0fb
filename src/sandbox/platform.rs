//! Can the sandbox run here? Finding srt, and checking once per process what it needs: Linux or
//! macOS, bubblewrap + socat + ripgrep (Linux) or ripgrep (macOS), working user namespaces, an
//! srt that runs. Every failure says what to install. Runs its probes with `tokio::process`.
//!
//! Not here: the policy ([`super::policy`]) and the kernel command ([`super::wrap`]).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use super::SandboxError;
use crate::child_process::{host_command, tail};
use crate::host_env::HostEnv;

/// The srt release ipybox is tested with (`scripts/sandbox-deps.sh` installs it).
pub const SRT_VERSION: &str = "0.0.78";

/// Environment variable naming the srt executable (default: `srt` on `PATH`).
pub const SRT_ENV: &str = "IPYBOX_SRT";

/// Finds srt: the explicit path, then `$IPYBOX_SRT`, then `srt` on `PATH`.
pub(crate) fn find_srt(explicit: Option<&Path>, host: &HostEnv) -> Result<PathBuf, SandboxError> {
    let from_env = host.get(SRT_ENV).map(PathBuf::from);
    let (path, source) = match (explicit, from_env) {
        (Some(p), _) => (p.to_path_buf(), "the sandbox options"),
        (None, Some(p)) => (p, SRT_ENV),
        (None, None) => match find_in_path(host, "srt") {
            Some(p) => (p, "PATH"),
            None => {
                return Err(SandboxError::Unavailable {
                    reason: "srt (Anthropic's sandbox-runtime) was not found on PATH".into(),
                    help: format!(
                        "install it with `npm install -g @anthropic-ai/sandbox-runtime@{SRT_VERSION}` \
                         (needs Node.js >= 20.11), or point {SRT_ENV} at an srt executable"
                    ),
                });
            }
        },
    };
    let path = if path.is_absolute() {
        path
    } else if path.components().count() == 1 {
        find_in_path(host, &path.display().to_string()).unwrap_or(path)
    } else {
        std::env::current_dir()
            .map(|d| d.join(&path))
            .unwrap_or(path)
    };
    if !is_executable(&path) {
        return Err(SandboxError::Unavailable {
            reason: format!(
                "srt {} (from {source}) does not exist or is not executable",
                path.display()
            ),
            help: format!(
                "install it with `npm install -g @anthropic-ai/sandbox-runtime@{SRT_VERSION}`, \
                 or fix {SRT_ENV}"
            ),
        });
    }
    Ok(path)
}

/// Checks the platform's sandbox prerequisites, once per srt path per process (the checks cost
/// ~0.3 s, mostly Node starting for `srt --version`). Concurrent first calls may both probe;
/// the probes have no side effects.
pub(crate) async fn check(srt: &Path, host: &HostEnv) -> Result<(), SandboxError> {
    static CHECKED: std::sync::Mutex<BTreeSet<PathBuf>> = std::sync::Mutex::new(BTreeSet::new());
    let checked = |srt: &Path| {
        CHECKED
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(srt)
    };
    if checked(srt) {
        return Ok(());
    }
    if !cfg!(any(target_os = "linux", target_os = "macos")) {
        return Err(SandboxError::Unavailable {
            reason: "the sandbox supports Linux and macOS only".into(),
            help: "run without the sandbox on this platform".into(),
        });
    }
    let programs: &[(&str, &str)] = if cfg!(target_os = "linux") {
        &[
            ("bwrap", "bubblewrap"),
            ("socat", "socat"),
            ("rg", "ripgrep"),
        ]
    } else {
        &[("rg", "ripgrep")]
    };
    let missing: Vec<&str> = programs
        .iter()
        .filter(|(program, _)| find_in_path(host, program).is_none())
        .map(|(_, package)| *package)
        .collect();
    if !missing.is_empty() {
        let install = if cfg!(target_os = "linux") {
            format!(
                "`sudo apt-get install {}` (Debian/Ubuntu; dnf/pacman have the same names)",
                missing.join(" ")
            )
        } else {
            format!("`brew install {}`", missing.join(" "))
        };
        return Err(SandboxError::Unavailable {
            reason: format!("missing {} (needed by srt)", missing.join(", ")),
            help: format!("install with {install}"),
        });
    }
    if cfg!(target_os = "linux") {
        check_user_namespaces(host).await?;
    }
    let out = host_command(srt)
        .arg("--version")
        .stdin(Stdio::null())
        .output()
        .await
        .map_err(|source| SandboxError::Run {
            program: srt.to_path_buf(),
            help: "srt is a Node.js script: check that `node` (>= 20.11) is on PATH",
            source,
        })?;
    if !out.status.success() {
        return Err(SandboxError::Unavailable {
            reason: format!(
                "`{} --version` failed ({}): {}",
                srt.display(),
                out.status,
                tail(&out.stderr)
            ),
            help: format!(
                "srt needs Node.js >= 20.11; reinstall with \
                 `npm install -g @anthropic-ai/sandbox-runtime@{SRT_VERSION}`"
            ),
        });
    }
    let version = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if version != SRT_VERSION {
        tracing::debug!(
            "srt {version} at {} (ipybox is tested with {SRT_VERSION})",
            srt.display()
        );
    }
    CHECKED
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(srt.to_path_buf());
    Ok(())
}

/// bubblewrap needs user namespaces (srt also unshares the network and pid namespaces).
async fn check_user_namespaces(host: &HostEnv) -> Result<(), SandboxError> {
    let bwrap = find_in_path(host, "bwrap").unwrap_or_else(|| PathBuf::from("bwrap"));
    let out = host_command(&bwrap)
        .args([
            "--unshare-user",
            "--unshare-net",
            "--unshare-pid",
            "--ro-bind",
            "/",
            "/",
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "true",
        ])
        .stdin(Stdio::null())
        .output()
        .await
        .map_err(|source| SandboxError::Run {
            program: bwrap.clone(),
            help: "install bubblewrap: `sudo apt-get install bubblewrap`",
            source,
        })?;
    if out.status.success() {
        return Ok(());
    }
    Err(SandboxError::Unavailable {
        reason: format!(
            "bubblewrap cannot create user namespaces here: {}",
            tail(&out.stderr)
        ),
        help: "enable unprivileged user namespaces (`sysctl kernel.unprivileged_userns_clone=1`; \
               on Ubuntu 24.04+ `sysctl kernel.apparmor_restrict_unprivileged_userns=0`); \
               in a container, allow them (e.g. Docker's default seccomp profile blocks them)"
            .into(),
    })
}

/// The first executable called `program` in the host's `PATH` (absolute entries only: a
/// relative one would be looked up from ipybox's working directory, often the workspace).
pub(crate) fn find_in_path(host: &HostEnv, program: &str) -> Option<PathBuf> {
    let path = host.get("PATH")?;
    std::env::split_paths(path)
        .filter(|d| d.is_absolute())
        .map(|d| d.join(program))
        .find(|p| is_executable(p))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}
