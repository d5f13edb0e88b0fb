//! The names both a kernel's runtime directory (`kernel::runtime_dir`) and a confined session
//! (`confine`) use: where runtime directories live and the rooms in one that a kernel may write.
//! A leaf: it knows neither of them, so neither has to know the other to agree on a name.
//!
//! Not here: making, sweeping or removing runtime directories (`kernel::runtime_dir`), or what a
//! confined kernel sees of them (`confine::layout`).

use std::path::PathBuf;

use crate::host_env::HostEnv;

/// The subdirectory of the runtime directory a kernel may write (`box/`).
pub(crate) const KERNEL_WRITABLE: &str = "box";

/// The name of a confined kernel's working directory in its runtime directory.
pub(crate) const WORK_DIR: &str = "work";

/// Where runtime directories go: `$XDG_RUNTIME_DIR` when it is a directory, else `$TMPDIR`,
/// else `/tmp`.
pub(crate) fn base_dir(host: &HostEnv) -> PathBuf {
    host.get("XDG_RUNTIME_DIR")
        .map(PathBuf::from)
        .filter(|p| p.is_dir())
        .unwrap_or_else(|| temp_dir(host))
}

/// `$TMPDIR`, else `/tmp` (what `std::env::temp_dir` does, from the given environment).
pub(crate) fn temp_dir(host: &HostEnv) -> PathBuf {
    host.get("TMPDIR")
        .map_or_else(|| PathBuf::from("/tmp"), PathBuf::from)
}
