//! Sandboxed kernels: srt (Anthropic's sandbox-runtime) policy and command wrapping.
//! (Being implemented — see issue 5.)

use std::path::{Path, PathBuf};

use crate::kernel::CommandWrapper;

/// How to sandbox the kernel.
#[derive(Debug, Clone, Default)]
pub struct SandboxOptions {
    /// srt settings file; relative paths are taken from the workspace. Missing file: a warning
    /// and the default policy.
    pub config_file: Option<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("sandbox unavailable: {0}")]
    Unavailable(String),
}

/// Checks that the sandbox can run, builds the effective policy, writes it into `runtime_dir`
/// and returns the wrapper that runs the kernel command under srt.
pub fn prepare(
    _options: &SandboxOptions,
    _workspace: &Path,
    _runtime_dir: &Path,
) -> Result<CommandWrapper, SandboxError> {
    Err(SandboxError::Unavailable("not implemented yet".into()))
}
