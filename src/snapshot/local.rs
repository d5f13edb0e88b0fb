//! Taking and restoring snapshots of kernels that share the host's filesystem (local kernels,
//! sandboxed or not): the bytes travel as files in a fresh directory below the runtime
//! directory's kernel-writable part (`box/snapshot-<random>/`).
//!
//! Files, not the tool socket: a namespace of a gigabyte is written by the kernel straight from
//! its objects' memory (pickle protocol 5 buffers) and read by the host once, with no framing
//! and no 32 MiB request cap. The kernel is hostile under `--sandbox`, so the host holds the
//! directory it created open and reads only through that descriptor: never through a link,
//! regular files only, the manifest capped, the data exactly as long as the manifest says and no
//! longer than the store's limit. For a restore the host checks the seal before any byte is
//! written for the kernel, and the data's digest while it copies it; only then is the kernel
//! told to load.
//!
//! Not here: kernels on Jupyter servers (no shared filesystem: `remote`), the seal and the store
//! (`seal`, `store`).

use std::path::PathBuf;
use std::time::Duration;

use super::manifest::{MAX_MANIFEST_BYTES, Manifest};
use super::report::{KernelReport, RestoreReport, SnapshotReport};
use super::seal::SnapshotBinding;
use super::store::{
    SnapshotStore, Verified, copy_verified, open_verified, read_small, store_from_kernel,
};
use super::{KernelConfinement, SnapshotError};
use crate::kernel::KernelPool;
use crate::kernel::runtime_dir::RuntimeDir;
use crate::safe_fs::NoFollowDir;

const DATA: &str = "data";
const MANIFEST: &str = "manifest.json";
const REPORT: &str = "report.json";
const MAX_REPORT_BYTES: u64 = 4 << 20;

/// A fresh directory the kernel writes (or reads) a snapshot in, removed when dropped.
struct Exchange {
    /// `None` once dropped.
    parent: Option<NoFollowDir>,
    name: String,
    dir: NoFollowDir,
}

impl Exchange {
    fn create(runtime: &RuntimeDir) -> Result<Self, SnapshotError> {
        let io = |source| SnapshotError::Io {
            path: runtime
                .path()
                .join(crate::kernel::runtime_dir::KERNEL_WRITABLE),
            source,
        };
        let parent = runtime.kernel_writable().map_err(io)?;
        let name = format!("snapshot-{:016x}", rand::random::<u64>());
        // Whatever a kernel left at that name (a link, a directory) goes first.
        parent.remove_tree(&name).map_err(io)?;
        let dir = parent.subdir(&name, Some(0o700)).map_err(io)?;
        if let Some((uid, gid)) = runtime.kernel_owner() {
            // The session's kernel (a uid of its own) writes its snapshot here.
            dir.chown(".", uid, gid).map_err(io)?;
        }
        Ok(Self {
            parent: Some(parent),
            name,
            dir,
        })
    }

    /// The directory's path as the kernel sees it (the same path inside the sandbox).
    fn path(&self) -> PathBuf {
        self.dir.path().to_path_buf()
    }

    fn io(&self) -> impl FnOnce(std::io::Error) -> SnapshotError + '_ {
        move |source| SnapshotError::Io {
            path: self.path(),
            source,
        }
    }

    /// A small file the kernel wrote here, read as the host reads what a hostile kernel wrote.
    fn read_from_kernel(&self, name: &str, limit: u64) -> Result<Vec<u8>, SnapshotError> {
        read_small(&self.dir, name, limit).map_err(|e| SnapshotError::Invalid {
            what: format!("the kernel's {name}"),
            reason: e.to_string(),
        })
    }
}

impl Drop for Exchange {
    /// Removes the directory, on a blocking thread when there is a runtime: a snapshot abandoned
    /// because the executor stops leaves a kernel still writing its data here, and removing a
    /// file while another process writes it waits for that write (~0.4 s for 200 MB on tmpfs),
    /// which would hold up the stop that kills the kernel (stdio's exit within 100 ms).
    fn drop(&mut self) {
        let Some(parent) = self.parent.take() else {
            return;
        };
        let name = std::mem::take(&mut self.name);
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn_blocking(move || {
                    let _ = parent.remove_tree(&name);
                });
            }
            Err(_) => {
                let _ = parent.remove_tree(&name);
            }
        }
    }
}

/// A Python string literal for `s` (JSON's escapes are Python's).
pub(crate) fn py_str(s: &str) -> String {
    serde_json::Value::String(s.to_string()).to_string()
}

/// Snapshots the current kernel of `pool` into `store` for `binding`.
pub(crate) async fn snapshot(
    pool: &mut KernelPool,
    runtime: &RuntimeDir,
    store: &SnapshotStore,
    binding: &SnapshotBinding,
    confinement: &KernelConfinement,
    timeout: Option<Duration>,
) -> Result<SnapshotReport, SnapshotError> {
    let exchange = Exchange::create(runtime)?;
    let code = format!(
        "__import__('ipybox_runtime.snapshot', fromlist=['save_to_dir']).save_to_dir({}, {})",
        py_str(&exchange.path().to_string_lossy()),
        store.limit()
    );
    pool.execute_hidden(&code, timeout).await?;
    let (data, data_len) = exchange
        .dir
        .open_regular(DATA, store.limit())
        .map_err(|e| SnapshotError::Invalid {
            what: "the kernel's snapshot data".into(),
            reason: e.to_string(),
        })?;
    let manifest_bytes = exchange.read_from_kernel(MANIFEST, MAX_MANIFEST_BYTES)?;
    let report =
        store_from_kernel(store, binding, confinement, &manifest_bytes, data, data_len).await?;
    drop(exchange);
    Ok(report)
}

/// A verified snapshot copied where the kernel will read it; nothing of it was loaded yet.
pub(crate) struct Prepared {
    exchange: Exchange,
    manifest: Manifest,
}

/// Verifies `binding`'s snapshot in `store` (its seal first, then its data's digest while it is
/// copied into a fresh directory of `runtime`'s kernel-writable part). Touches no kernel: a
/// refused snapshot leaves the session as it was.
pub(crate) async fn prepare(
    runtime: &RuntimeDir,
    store: &SnapshotStore,
    binding: &SnapshotBinding,
    here: &KernelConfinement,
) -> Result<Prepared, SnapshotError> {
    let verified = open_verified(store, binding, here).await?;
    let exchange = Exchange::create(runtime)?;
    let manifest = verified.manifest.clone();
    let dir = exchange.dir.subdir(".", None).map_err(exchange.io())?;
    let path = exchange.path();
    let Verified {
        manifest_bytes,
        mut data,
        contents,
        ..
    } = verified;
    tokio::task::spawn_blocking(move || {
        write_for_kernel(&dir, &path, &mut data, &contents, &manifest_bytes)
    })
    .await
    .map_err(|e| SnapshotError::Task(e.to_string()))??;
    if let Some((uid, gid)) = runtime.kernel_owner() {
        // The session's kernel (a uid of its own) reads them.
        for name in [DATA, MANIFEST] {
            exchange.dir.chown(name, uid, gid).map_err(exchange.io())?;
        }
    }
    Ok(Prepared { exchange, manifest })
}

/// Writes a verified snapshot's data (checking its digest) and manifest into `dir`, the
/// exchange directory the host opened: new files only, never through a link a kernel planted
/// there; data whose digest differs is removed again.
fn write_for_kernel(
    dir: &NoFollowDir,
    path: &std::path::Path,
    data: &mut std::fs::File,
    contents: &super::seal::Contents,
    manifest_bytes: &[u8],
) -> Result<(), SnapshotError> {
    let io = |source| SnapshotError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut file = dir.create_file(DATA, 0o600).map_err(io)?;
    if let Err(e) = copy_verified(data, contents, &mut file, path) {
        let _ = dir.remove_tree(DATA);
        return Err(e);
    }
    dir.create_new(MANIFEST, manifest_bytes, 0o600).map_err(io)
}

/// Loads a prepared snapshot into the current kernel of `pool` (which the caller has made a
/// fresh one) and reports what came back.
pub(crate) async fn load(
    pool: &mut KernelPool,
    prepared: Prepared,
    timeout: Option<Duration>,
) -> Result<RestoreReport, SnapshotError> {
    let Prepared { exchange, manifest } = prepared;
    let code = format!(
        "__import__('ipybox_runtime.snapshot', fromlist=['restore_from_dir']).restore_from_dir({})",
        py_str(&exchange.path().to_string_lossy())
    );
    pool.execute_hidden(&code, timeout).await?;
    let report = exchange.read_from_kernel(REPORT, MAX_REPORT_BYTES)?;
    let kernel: KernelReport =
        serde_json::from_slice(&report).map_err(|e| SnapshotError::Invalid {
            what: "the kernel's restore report".into(),
            reason: e.to_string(),
        })?;
    Ok(RestoreReport::from_kernel(&manifest, kernel))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::seal::{Contents, sha256};

    /// What a kernel may have planted in the exchange directory before the host writes the
    /// snapshot it is to load: a link at `data` (the host must not write through it), or the
    /// directory itself swapped for a link (the host keeps writing where it opened).
    #[test]
    fn the_host_never_writes_through_what_a_kernel_planted() {
        let t = tempfile::tempdir().unwrap();
        let host = crate::host_env::HostEnv::from_vars(
            [("TMPDIR".to_string(), t.path().display().to_string())].into(),
        );
        let runtime = RuntimeDir::create(
            &host,
            crate::kernel::runtime_dir::Sockets::Own,
            crate::confine::limits::unmount_work,
        )
        .unwrap();
        let outside = t.path().join("host-file");
        std::fs::write(&outside, "host data").unwrap();
        let payload = b"snapshot bytes".to_vec();
        let contents = Contents {
            data_sha256: sha256(&payload),
            data_bytes: payload.len() as u64,
            manifest_sha256: [0; 32],
        };
        let source = |bytes: &[u8]| {
            let mut f = tempfile::tempfile().unwrap();
            std::io::Write::write_all(&mut f, bytes).unwrap();
            std::io::Seek::rewind(&mut f).unwrap();
            f
        };

        let ex = Exchange::create(&runtime).unwrap();
        std::os::unix::fs::symlink(&outside, ex.path().join(DATA)).unwrap();
        let err = write_for_kernel(&ex.dir, &ex.path(), &mut source(&payload), &contents, b"{}");
        assert!(err.is_err());
        assert_eq!(std::fs::read_to_string(&outside).unwrap(), "host data");

        let ex = Exchange::create(&runtime).unwrap();
        let decoy = t.path().join("decoy");
        std::fs::create_dir(&decoy).unwrap();
        let moved = ex.path().with_extension("moved");
        std::fs::rename(ex.path(), &moved).unwrap();
        std::os::unix::fs::symlink(&decoy, ex.path()).unwrap();
        write_for_kernel(&ex.dir, &ex.path(), &mut source(&payload), &contents, b"{}").unwrap();
        assert_eq!(std::fs::read(moved.join(DATA)).unwrap(), payload);
        assert_eq!(std::fs::read_dir(&decoy).unwrap().count(), 0);

        // Data that does not match its digest is not left for the kernel.
        let ex = Exchange::create(&runtime).unwrap();
        let err = write_for_kernel(
            &ex.dir,
            &ex.path(),
            &mut source(b"snapshot bytez"),
            &contents,
            b"{}",
        );
        assert!(matches!(err, Err(SnapshotError::Refused { .. })));
        assert!(!ex.path().join(DATA).exists());
        // Dropping the exchange removes it (a link left at its name included).
        let path = ex.path();
        drop(ex);
        assert!(!path.exists());
    }
}
