//! Sandboxed kernels: the kernel runs under srt (Anthropic's sandbox-runtime; bubblewrap on
//! Linux, Seatbelt on macOS) with a policy in srt's settings format.
//!
//! `prepare` checks that the sandbox can run (`platform`), loads the caller's policy or the
//! default one and adds what ipybox needs under any policy ([`policy`]), writes the effective
//! settings into the runtime directory, and returns the `CommandWrapper` that runs the kernel
//! command under srt (`wrap`).
//!
//! Not here: launching, interrupting and killing the kernel (`kernel/`; interrupts go over the
//! control channel, which works inside the sandbox) and sandboxing MCP servers (they use `srt`
//! as their command, see `docs/sandbox.md`). It never falls back to running unsandboxed: when
//! something is missing, `prepare` fails and says what to install.

pub(crate) mod platform;
pub mod policy;
pub(crate) mod wrap;

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
    /// A file could not be read or written.
    #[error("cannot prepare the sandbox ({}): {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Checks the sandbox, builds the effective policy for a kernel run by `python`, writes it into
/// `runtime_dir` and returns the wrapper that runs kernel commands under srt.
pub(crate) async fn prepare(
    options: &SandboxOptions,
    host: &HostEnv,
    workspace: &Path,
    runtime_dir: &Path,
    python: &Path,
) -> Result<CommandWrapper, SandboxError> {
    let srt = platform::find_srt(options.srt.as_deref(), host)?;
    platform::check(&srt, host).await?;
    let policy = match &options.policy {
        Some(policy) => policy.clone(),
        None => policy::load(options.config_file.as_deref(), workspace).await?,
    };
    let tmp = runtime_dir.join("tmp");
    tokio::fs::create_dir_all(&tmp)
        .await
        .map_err(|source| SandboxError::Io {
            path: tmp.clone(),
            source,
        })?;
    let paths = SandboxPaths {
        workspace: workspace.to_path_buf(),
        runtime_dir: runtime_dir.to_path_buf(),
        python_dirs: wrap::python_dirs(python, host),
    };
    let settings = serde_json::to_string_pretty(&policy.effective(&paths)).map_err(|source| {
        SandboxError::Config {
            path: runtime_dir.join(SETTINGS_FILE),
            reason: "cannot serialize the effective settings".into(),
            help: "report this as a bug".into(),
            source: Some(source),
        }
    })?;
    let settings_path = runtime_dir.join(SETTINGS_FILE);
    tokio::fs::write(&settings_path, settings)
        .await
        .map_err(|source| SandboxError::Io {
            path: settings_path.clone(),
            source,
        })?;
    let sweeper = wrap::ArtifactSweeper::new(workspace);
    Ok(wrap::wrapper(&srt, &settings_path, &tmp, host, sweeper))
}
