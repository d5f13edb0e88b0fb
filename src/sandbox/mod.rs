//! Sandboxed kernels: the kernel runs under srt (Anthropic's sandbox-runtime; bubblewrap on
//! Linux, Seatbelt on macOS) with a policy in srt's settings format.
//!
//! `prepare` checks that the sandbox can run (`platform`), loads the caller's policy or the
//! default one and adds what ipybox needs under any policy ([`policy`]), writes the effective
//! settings into the runtime directory, and returns the `CommandWrapper` that runs the kernel
//! command under srt (`wrap`), with the kernel's variables kept away from srt (`env`).
//! [`check_layout`] refuses, before anything runs, a setup where the host would run code from a
//! place the kernel can write (its interpreter, srt, the home directory inside the workspace).
//!
//! Not here: launching, interrupting and killing the kernel (`kernel/`; interrupts go over the
//! control channel, which works inside the sandbox) and sandboxing MCP servers (they use `srt`
//! as their command, see `docs/sandbox.md`). It never falls back to running unsandboxed: when
//! something is missing, `prepare` fails and says what to install.

pub mod env;
pub(crate) mod install;
pub(crate) mod platform;
pub mod policy;
pub(crate) mod shell;
pub(crate) mod wrap;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::child_process::CommandWrapper;
use crate::host_env::HostEnv;

pub use platform::{SRT_ENV, SRT_VERSION};
pub use policy::{FilesystemPolicy, NetworkPolicy, SandboxPaths, SandboxPolicy};

/// Name of the effective settings file written into the runtime directory.
pub const SETTINGS_FILE: &str = "sandbox-settings.json";

/// How to sandbox the kernel. The policy is `policy` if set, else the srt settings file
/// `config_file`, else the default policy (read everything but `.env`, write the workspace, no
/// network).
#[derive(Debug, Clone, Default)]
pub struct SandboxOptions {
    /// srt settings file; relative paths are taken from the workspace. A missing file logs a
    /// warning and the default policy applies.
    pub config_file: Option<PathBuf>,
    /// A policy given directly (takes precedence over `config_file`); sections it leaves out
    /// come from the default policy.
    pub policy: Option<SandboxPolicy>,
    /// The srt executable. `None`: `$IPYBOX_SRT`, else `srt` on `PATH`.
    pub srt: Option<PathBuf>,
    /// Keep the workspace from being a channel between executors (what `ipybox serve --http`
    /// does for every session): the kernel cannot write the workspace (whatever the policy
    /// allows) nor read its `images/`, and works in a directory of its own,
    /// `<runtime>/box/work` (kept across resets, removed when the executor stops).
    pub isolate_workspace: bool,
    /// Directories where the host keeps records of the session (the executor adds its
    /// notebook's): created (never through a link) before srt starts, and not writable by the
    /// kernel whatever the policy says (`policy::SandboxPaths::record_dirs`).
    pub record_dirs: Vec<PathBuf>,
    /// Host paths the kernel must not read whatever the policy says (`serve --http --sandbox`:
    /// the operator's token files, session secret, notebook and snapshot directories): added
    /// to `filesystem.denyRead` (`policy::SandboxPaths::deny_read`).
    pub deny_read: Vec<PathBuf>,
}

/// Why the sandbox could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// A required program or kernel feature is missing.
    #[error("sandbox unavailable: {reason}\n  help: {help}")]
    Unavailable { reason: String, help: String },
    /// A probe program could not be run at all.
    #[error("sandbox unavailable: cannot run {}: {source}\n  help: {help}", program.display())]
    Run {
        program: PathBuf,
        help: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// The settings file is not valid JSON or not a valid srt policy.
    #[error(
        "invalid sandbox config {}: {reason}{}\n  help: {help}",
        path.display(),
        source.as_ref().map(|s| format!(": {s}")).unwrap_or_default()
    )]
    Config {
        path: PathBuf,
        reason: String,
        help: String,
        #[source]
        source: Option<serde_json::Error>,
    },
    /// The setup would let the sandboxed kernel steer the host (a loader variable in its
    /// environment, the host's interpreter or srt in a place it can write, ...).
    #[error("refusing to start a sandboxed kernel: {reason}\n  help: {help}")]
    Refused { reason: String, help: String },
    /// A file could not be read or written.
    #[error("cannot prepare the sandbox ({}): {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// A policy and the settings file it came from (absolute), if any.
pub(crate) type LoadedPolicy = (SandboxPolicy, Option<PathBuf>);

/// The policy `options` select (the caller's, the settings file, or the default) and the file
/// it came from, resolved against `workspace`.
pub(crate) async fn load_policy(
    options: &SandboxOptions,
    workspace: &Path,
) -> Result<LoadedPolicy, SandboxError> {
    let file = options.config_file.as_ref().map(|f| {
        if f.is_absolute() {
            f.clone()
        } else {
            workspace.join(f)
        }
    });
    let policy = match &options.policy {
        Some(policy) => policy.clone(),
        None => policy::load(file.as_deref(), workspace).await?,
    };
    Ok((policy, file))
}

/// Refuses a setup in which the host would run or load code from a place the sandboxed kernel
/// can write (the workspace and the policy's other writable directories): the home directory
/// (dotfiles host programs run), the kernel's interpreter and its environment (the host runs it
/// to check it and to install packages), ipybox's data directory, srt, and the caller's
/// `PYTHONPATH` entries outside the workspace (every kernel imports `sitecustomize` and the
/// modules it starts with from them as it starts; entries inside the workspace are only appended
/// to `sys.path` once the kernel is up, see `kernel::kernel_env`). Runs before any of them is
/// started. `python` is the interpreter named by the caller, if any.
pub(crate) fn check_layout(
    (policy, _): &LoadedPolicy,
    options: &SandboxOptions,
    host: &HostEnv,
    workspace: &Path,
    python: Option<&Path>,
    python_path: Option<&str>,
) -> Result<(), SandboxError> {
    let home = host.get("HOME").map(PathBuf::from);
    let roots = policy.writable_roots(workspace, home.as_deref());
    let canonical = |p: &Path| p.canonicalize().unwrap_or_else(|_| p.to_path_buf());
    let writable = |p: &Path| {
        let p = canonical(p);
        roots.iter().find(|r| p.starts_with(r)).cloned()
    };
    let mut checks: Vec<(String, PathBuf, &str)> = Vec::new();
    if let Some(home) = &home {
        checks.push((
            format!("your home directory {}", home.display()),
            home.clone(),
            "the kernel could write files that host programs run (~/.bashrc, ~/.config, ~/.local/bin, ~/.ipython); use a project directory as the workspace (--workspace DIR) and keep the policy's allowWrite out of your home directory",
        ));
    }
    if let Some(python) = python {
        // The environment's root (`<venv>/bin/python` -> `<venv>`) holds the site-packages
        // (and their `.pth` files) the host imports when it runs the interpreter.
        let abs = if python.is_absolute() {
            python.to_path_buf()
        } else {
            workspace.join(python)
        };
        let root = abs
            .parent()
            .and_then(Path::parent)
            .map_or_else(|| abs.clone(), Path::to_path_buf);
        checks.push((
            format!("the kernel's Python environment {}", root.display()),
            root,
            "the host runs this interpreter (to check it, to install packages) and would run what the kernel put in its site-packages; use an environment outside the workspace (or none: ipybox manages one)",
        ));
    }
    if let Some(data) = host.data_dir() {
        checks.push((
            format!("ipybox's data directory {}", data.display()),
            data,
            "set IPYBOX_HOME to a directory outside the workspace",
        ));
    }
    if let Ok(srt) = platform::find_srt(options.srt.as_deref(), host) {
        checks.push((
            format!("srt {}", canonical(&srt).display()),
            srt,
            "install srt outside the workspace (npm install -g, or point IPYBOX_SRT elsewhere)",
        ));
    }
    for entry in python_path
        .unwrap_or("")
        .split(':')
        .filter(|e| !e.is_empty())
    {
        let path = workspace.join(entry);
        if !canonical(&path).starts_with(canonical(workspace)) {
            checks.push((
                format!("the PYTHONPATH entry {entry} of the kernel's environment"),
                path,
                "every kernel imports from it as it starts (sitecustomize.py, modules named like the ones it loads), so what the sandboxed kernel wrote there would run in later kernels; move it out of the policy's allowWrite, or into the workspace (whose modules are imported only once the kernel is up)",
            ));
        }
    }
    for (what, path, help) in checks {
        if let Some(root) = writable(&path) {
            return Err(SandboxError::Refused {
                reason: format!(
                    "{what} is inside {}, which the sandboxed kernel can write",
                    root.display()
                ),
                help: help.to_string(),
            });
        }
    }
    Ok(())
}

/// Whether the sandbox can run here: srt found and runnable, the platform's prerequisites
/// present. Nothing is written or started; [`prepare`] checks the same first.
pub(crate) async fn preflight(
    options: &SandboxOptions,
    host: &HostEnv,
) -> Result<(), SandboxError> {
    let srt = platform::find_srt(options.srt.as_deref(), host)?;
    platform::check(&srt, host).await
}

/// Checks the sandbox, builds the effective policy for a kernel run by `python` with the
/// caller's `kernel_env`, writes it into `runtime_dir` and returns the wrapper that runs kernel
/// commands under srt. `kernel_writable` is the part of the runtime directory the kernel may
/// write, `runtime_readable` what else in it the kernel reads.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn prepare(
    options: &SandboxOptions,
    (policy, config_file): LoadedPolicy,
    host: &HostEnv,
    workspace: &Path,
    runtime_dir: &Path,
    runtime_readable: &[PathBuf],
    kernel_writable: &Path,
    python: &Path,
    kernel_env: &BTreeMap<String, String>,
) -> Result<CommandWrapper, SandboxError> {
    env::check_kernel_env(kernel_env)?;
    let srt = platform::find_srt(options.srt.as_deref(), host)?;
    platform::check(&srt, host).await?;
    let mkdir = |p: &Path| {
        std::fs::DirBuilder::new()
            .recursive(true)
            .create(p)
            .map_err(|source| SandboxError::Io {
                path: p.to_path_buf(),
                source,
            })
    };
    // srt's own temp files (its proxy bridge sockets) in a directory only the host writes; the
    // kernel's temp, IPython and Jupyter directories in the part it may write.
    let srt_tmp = runtime_dir.join("srt");
    let kernel_tmp = kernel_writable.join("tmp");
    let ipython = kernel_writable.join("ipython");
    let jupyter = kernel_writable.join("jupyter");
    for dir in [&srt_tmp, &kernel_tmp, &ipython, &jupyter] {
        mkdir(dir)?;
    }
    // The record directories exist before srt starts, so that bubblewrap binds them read-only
    // (a mount point the kernel cannot rename, replace or write into); a link in their place
    // is an error, not followed.
    for dir in &options.record_dirs {
        crate::safe_fs::NoFollowDir::open(dir, Some(0o755)).map_err(|source| SandboxError::Io {
            path: dir.clone(),
            source,
        })?;
    }
    let mut readable = runtime_readable.to_vec();
    readable.push(srt_tmp.clone());
    let paths = SandboxPaths {
        workspace: workspace.to_path_buf(),
        runtime_dir: runtime_dir.to_path_buf(),
        runtime_readable: readable,
        kernel_writable: kernel_writable.to_path_buf(),
        python_dirs: wrap::python_dirs(python, host),
        data_dir: host.data_dir(),
        config_file,
        isolate_workspace: options.isolate_workspace,
        settings_file: Some(runtime_dir.join(SETTINGS_FILE)),
        record_dirs: options.record_dirs.clone(),
        deny_read: options.deny_read.clone(),
    };
    let mut effective = policy.effective(&paths);
    if let Some(proxy) = env::parent_proxy(host) {
        let net = effective
            .network
            .get_or_insert_with(policy::NetworkPolicy::default);
        // A policy's own `parentProxy` wins.
        net.parent_proxy.get_or_insert(proxy);
    }
    let settings =
        serde_json::to_string_pretty(&effective).map_err(|source| SandboxError::Config {
            path: runtime_dir.join(SETTINGS_FILE),
            reason: "cannot serialize the effective settings".into(),
            help: "report this as a bug".into(),
            source: Some(source),
        })?;
    let settings_path = runtime_dir.join(SETTINGS_FILE);
    crate::safe_fs::write_private(&settings_path, settings.as_bytes()).map_err(|source| {
        SandboxError::Io {
            path: settings_path.clone(),
            source,
        }
    })?;
    let disp = |p: &Path| p.display().to_string();
    let inner_extra = vec![
        ("IPYTHONDIR".to_string(), disp(&ipython)),
        (
            "JUPYTER_CONFIG_DIR".to_string(),
            disp(&jupyter.join("config")),
        ),
        ("JUPYTER_DATA_DIR".to_string(), disp(&jupyter.join("data"))),
        (
            "JUPYTER_RUNTIME_DIR".to_string(),
            disp(&jupyter.join("runtime")),
        ),
    ];
    let sweeper = wrap::ArtifactSweeper::new(workspace, paths.config_file.as_slice());
    Ok(wrap::wrapper(
        &srt,
        workspace,
        &settings_path,
        env::outer(host, &srt_tmp, &kernel_tmp),
        inner_extra,
        sweeper,
    ))
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    /// A `PYTHONPATH` entry the sandboxed kernel can write is refused unless it is inside the
    /// workspace (imported only once the kernel is up); one it cannot write is kept.
    #[test]
    fn writable_pythonpath_entries_outside_the_workspace_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().join("ws");
        let extra = dir.path().join("extra");
        let other = dir.path().join("other");
        for d in [&ws, &extra, &other] {
            std::fs::create_dir_all(d).unwrap();
        }
        let policy = SandboxPolicy::from_value(serde_json::json!({
            "filesystem": {"allowWrite": [".", extra.display().to_string()]}
        }))
        .unwrap();
        let host = HostEnv::from_vars(HashMap::new());
        let options = SandboxOptions {
            srt: Some(PathBuf::from("/nonexistent/srt")),
            ..Default::default()
        };
        let check = |path: &str| {
            check_layout(
                &(policy.clone(), None),
                &options,
                &host,
                &ws,
                None,
                Some(path),
            )
        };
        let inside = format!("{}:lib", ws.join("lib").display());
        assert!(check(&inside).is_ok());
        assert!(check(&other.display().to_string()).is_ok());
        let err = check(&format!("{}:{}", other.display(), extra.display()))
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with(&format!(
                "refusing to start a sandboxed kernel: the PYTHONPATH entry {} of the kernel's environment is inside {}, which the sandboxed kernel can write",
                extra.display(),
                extra.display()
            )),
            "{err}"
        );
    }
}
