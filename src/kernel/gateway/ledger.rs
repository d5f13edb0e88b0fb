//! A record of the kernels ipybox created on Jupyter servers and has not deleted yet, so that a
//! kernel outlives an ipybox that was killed only until the next ipybox starts.
//!
//! One file per kernel in `<data dir>/gateway-kernels/` (`<kernel id>.json`: the server's URL
//! without token, the kernel id, the pid of the ipybox that owns it). Written right after the
//! kernel is created, removed right after it is deleted. On start, an executor deletes the
//! kernels of its server whose owner is no longer running. No secrets are written. The directory
//! is private (0700), its files 0600, written without following links (`crate::safe_fs`).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::Gateway;

#[derive(Debug, Serialize, Deserialize)]
struct Entry {
    gateway: String,
    kernel_id: String,
    owner_pid: u32,
    /// The owner's host name: a pid means nothing on another machine (replicas may share the
    /// data directory). Missing in records of older versions: taken as this host.
    #[serde(default)]
    owner_host: Option<String>,
}

/// This machine's host name (what `owner_host` records).
fn host_name() -> Option<String> {
    let mut buf = [0u8; 256];
    // SAFETY: a writable buffer of the length passed.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    (rc == 0)
        .then(|| {
            let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
            String::from_utf8_lossy(&buf[..end]).trim().to_string()
        })
        .filter(|h| !h.is_empty())
}

/// Where kernel records live (`None`: no data directory, nothing is recorded).
#[derive(Debug, Clone)]
pub(crate) struct Ledger {
    dir: PathBuf,
}

impl Ledger {
    pub(crate) fn new(data_dir: &Path) -> Self {
        Self {
            dir: data_dir.join("gateway-kernels"),
        }
    }

    fn file(&self, kernel_id: &str) -> Option<PathBuf> {
        // Kernel ids are UUIDs; anything else is not used as a file name.
        let safe = !kernel_id.is_empty()
            && kernel_id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
        safe.then(|| self.dir.join(format!("{kernel_id}.json")))
    }

    /// Records that this process created `kernel_id` on `gateway`.
    pub(crate) fn record(&self, gateway: &Gateway, kernel_id: &str) {
        let Some(file) = self.file(kernel_id) else {
            return;
        };
        let entry = Entry {
            gateway: gateway.url().to_string(),
            kernel_id: kernel_id.to_string(),
            owner_pid: std::process::id(),
            owner_host: host_name(),
        };
        let data_dir = self.dir.parent().unwrap_or(&self.dir);
        let write = crate::safe_fs::create_private_dir(data_dir)
            .and_then(|()| crate::safe_fs::create_private_dir(&self.dir))
            .and_then(|()| {
                crate::safe_fs::write_private(
                    &file,
                    &serde_json::to_vec(&entry).unwrap_or_default(),
                )
            });
        if let Err(e) = write {
            tracing::warn!(
                "cannot record kernel {kernel_id} in {}: {e}",
                self.dir.display()
            );
        }
    }

    /// Forgets `kernel_id` (it was deleted).
    pub(crate) fn forget(&self, kernel_id: &str) {
        if let Some(file) = self.file(kernel_id) {
            let _ = std::fs::remove_file(file);
        }
    }

    /// Kernels of `gateway` whose owning process is gone.
    fn orphans(&self, gateway: &Gateway) -> Vec<String> {
        let Ok(dir) = std::fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        let here = host_name();
        dir.flatten()
            .filter_map(|e| std::fs::read(e.path()).ok())
            .filter_map(|bytes| serde_json::from_slice::<Entry>(&bytes).ok())
            .filter(|e| {
                e.gateway == gateway.url()
                    && (e.owner_host.is_none() || e.owner_host == here)
                    && crate::child_process::process_ended(e.owner_pid)
            })
            .map(|e| e.kernel_id)
            .collect()
    }

    /// Deletes the kernels a killed ipybox left on `gateway`; returns how many were deleted.
    /// A left kernel that has an open connection is in use by someone else (a replica that
    /// shares the server's kernels took the session over): it is forgotten, not deleted.
    pub(crate) async fn clean_up(&self, gateway: &Gateway) -> usize {
        let mut deleted = 0;
        for id in self.orphans(gateway) {
            if in_use(gateway, &id).await {
                tracing::info!(kernel = %id, gateway = gateway.url(), "a kernel left behind by an earlier ipybox is in use by another client: leaving it");
                self.forget(&id);
                continue;
            }
            match gateway.delete(&id).await {
                Ok(()) => {
                    tracing::info!(kernel = %id, gateway = gateway.url(), "deleted a kernel left behind by an earlier ipybox");
                    self.forget(&id);
                    deleted += 1;
                }
                Err(e) => tracing::debug!("could not delete left-behind kernel {id}: {e}"),
            }
        }
        deleted
    }
}

/// Whether kernel `id` has an open connection (someone else's: its owner is gone). A
/// connection of the owner that was just killed can take the server a moment to notice: asked
/// again for up to 3 s before it counts.
async fn in_use(gateway: &Gateway, id: &str) -> bool {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(3);
    loop {
        match gateway.kernel_status(id).await {
            Ok(Some(status)) if status.connections.is_some_and(|c| c > 0) => {}
            _ => return false,
        }
        if tokio::time::Instant::now() >= deadline {
            return true;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn records_are_private() {
        let t = tempfile::tempdir().unwrap();
        let data = t.path().join("ipybox");
        let gateway = Gateway::parse(
            "http://127.0.0.1:9",
            &crate::host_env::HostEnv::from_vars(Default::default()),
        )
        .unwrap();
        let ledger = Ledger::new(&data);
        ledger.record(&gateway, "0f1e-2d3c");
        let mode = |p: &Path| std::fs::metadata(p).unwrap().mode() & 0o777;
        assert_eq!(mode(&data), 0o700);
        assert_eq!(mode(&data.join("gateway-kernels")), 0o700);
        assert_eq!(mode(&data.join("gateway-kernels/0f1e-2d3c.json")), 0o600);
        ledger.forget("0f1e-2d3c");
        assert_eq!(
            std::fs::read_dir(data.join("gateway-kernels"))
                .unwrap()
                .count(),
            0
        );
    }
}
