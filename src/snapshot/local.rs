//! Taking and restoring snapshots of kernels that share the host's filesystem (local kernels,
//! sandboxed or not).
//!
//! Saving: the kernel sends its snapshot over a Unix socket the host bound for this one save in
//! its own part of the runtime directory (`kernels/x<5 hex>`; `stream`), and the host writes it
//! straight into the store. Nothing passes through `box/`, the directory the kernel writes, so
//! that directory can be small (a confined session's is a tmpfs of `--session-box-size`), and
//! the host stops at the store's limit. A namespace of a gigabyte goes from its objects' memory
//! (pickle protocol 5 buffers) to the socket with no copy in the kernel and no 32 MiB request cap.
//!
//! Restoring: the host checks the seal before any byte is written for the kernel, and the data's
//! digest while it copies it into a fresh directory of its own part of the runtime directory
//! (`kernels/r<16 hex>/`, readable by the session's kernels, never writable by them); only then
//! is the kernel told to load, and it writes its report into `box/`, where the host reads it as
//! it reads anything a hostile kernel wrote: never through a link, regular files only, capped.
//!
//! Not here: kernels on Jupyter servers (no shared filesystem: `remote`), the seal and the store
//! (`seal`, `store`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::manifest::Manifest;
use super::report::{KernelReport, RestoreReport, SnapshotReport};
use super::seal::SnapshotBinding;
use super::store::{SnapshotStore, Verified, copy_verified, open_verified, read_small};
use super::{KernelConfinement, SnapshotError};
use crate::kernel::KernelPool;
use crate::kernel::runtime_dir::RuntimeDir;
use crate::safe_fs::NoFollowDir;

const DATA: &str = "data";
const MANIFEST: &str = "manifest.json";
const MAX_REPORT_BYTES: u64 = 4 << 20;
/// How long the host waits for the rest of a snapshot once the kernel's save returned (what is
/// left is at most the socket's buffer).
const STREAM_END: Duration = Duration::from_secs(10);

/// A fresh host-owned directory the kernel reads a snapshot from, removed when dropped.
struct Exchange {
    /// `None` once dropped.
    parent: Option<NoFollowDir>,
    name: String,
    dir: NoFollowDir,
    /// The session's group (its kernels' own uid), which may read the files.
    group: Option<u32>,
}

impl Exchange {
    fn create(runtime: &RuntimeDir) -> Result<Self, SnapshotError> {
        let kernels = runtime.host_kernels();
        let io = |source| SnapshotError::Io {
            path: kernels.clone(),
            source,
        };
        let parent =
            NoFollowDir::open(&runtime.host_kernels_dir().map_err(io)?, None).map_err(io)?;
        let name = format!("r{:016x}", rand::random::<u64>());
        let group = runtime.kernel_owner().map(|(_, gid)| gid);
        let dir = parent
            .subdir(&name, Some(if group.is_some() { 0o750 } else { 0o700 }))
            .map_err(io)?;
        if let Some(gid) = group {
            dir.chown(".", 0, gid).map_err(io)?;
        }
        Ok(Self {
            parent: Some(parent),
            name,
            dir,
            group,
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
}

impl Drop for Exchange {
    /// Removes the directory, on a blocking thread when there is a runtime (removing a large
    /// file takes a while on a busy disk, which would hold up a stop).
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
    let (listener, socket) = bind_for_kernel(runtime)?;
    let _unlink = Unlink(socket.clone());
    let staged = store.stage()?;
    let limit = store.limit();
    // Registered before the blocking thread starts, released when it ends (even if this future
    // is dropped meanwhile): see `SnapshotStore::writes_settled`.
    let guard = store.begin_write(binding);
    let receiving = async {
        let (conn, _) = listener
            .accept()
            .await
            .map_err(|source| SnapshotError::Io {
                path: socket.clone(),
                source,
            })?;
        let conn = conn.into_std().and_then(|c| {
            c.set_nonblocking(false)?;
            Ok(c)
        });
        let mut conn = conn.map_err(|source| SnapshotError::Io {
            path: socket.clone(),
            source,
        })?;
        let abort = super::stream::Abort(conn.try_clone().ok());
        let got = tokio::task::spawn_blocking(move || {
            let got = super::stream::receive(&mut conn, staged, limit);
            drop(guard);
            got
        });
        let got = got.await.map_err(|e| SnapshotError::Task(e.to_string()))?;
        drop(abort);
        got
    };
    tokio::pin!(receiving);
    let code = format!(
        "__import__('ipybox_runtime.snapshot', fromlist=['save_to_socket']).save_to_socket({}, {})",
        py_str(&socket.to_string_lossy()),
        limit
    );
    let saving = pool.execute_hidden(&code, timeout);
    tokio::pin!(saving);
    let received = tokio::select! {
        got = &mut receiving => {
            // Everything came before the kernel's cell ended: it still has to end well.
            let got = got?;
            saving.await?;
            got
        }
        saved = &mut saving => {
            saved?;
            tokio::time::timeout(STREAM_END, &mut receiving).await.map_err(|_| {
                SnapshotError::Invalid {
                    what: "the kernel's snapshot stream".into(),
                    reason: format!("it did not end within {STREAM_END:?} of the kernel's save"),
                }
            })??
        }
    };
    let super::stream::Received {
        staged,
        manifest: manifest_bytes,
        data_len,
        data_sha256,
    } = received;
    let mut manifest =
        Manifest::parse(&manifest_bytes, data_len).map_err(|e| SnapshotError::Invalid {
            what: "the kernel's snapshot manifest".into(),
            reason: e.0,
        })?;
    manifest.created = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (binding, confinement, stored) = (binding.clone(), confinement.clone(), manifest.clone());
    let guard = store.begin_write(&binding);
    tokio::task::spawn_blocking(move || {
        let written = staged.commit(&binding, &confinement, &stored, data_sha256, data_len);
        drop(guard);
        written
    })
    .await
    .map_err(|e| SnapshotError::Task(e.to_string()))??;
    Ok(SnapshotReport { manifest })
}

/// A Unix socket for one save, bound in the host's part of `runtime` (`kernels/x<5 hex>`): the
/// kernel may connect (the session's group, when its kernels have a uid of their own), not
/// replace it.
fn bind_for_kernel(
    runtime: &RuntimeDir,
) -> Result<(tokio::net::UnixListener, PathBuf), SnapshotError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| SnapshotError::Io { path, source }
    };
    let dir = runtime
        .host_kernels_dir()
        .map_err(io(&runtime.host_kernels()))?;
    let path = dir.join(format!("x{:05x}", rand::random::<u32>() & 0xf_ffff));
    // Only the host writes here: a name left is a socket of an earlier save that was abandoned.
    let _ = std::fs::remove_file(&path);
    let listener = tokio::net::UnixListener::bind(&path).map_err(io(&path))?;
    let _unlink = Unlink(path.clone());
    use std::os::unix::fs::PermissionsExt;
    if let Some((_, gid)) = runtime.kernel_owner() {
        std::os::unix::fs::lchown(&path, Some(0), Some(gid)).map_err(io(&path))?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o660))
            .map_err(io(&path))?;
    } else {
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
            .map_err(io(&path))?;
    }
    std::mem::forget(_unlink);
    Ok((listener, path))
}

/// Removes a socket's name when dropped.
struct Unlink(PathBuf);

impl Drop for Unlink {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
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
    let mode = if exchange.group.is_some() {
        0o640
    } else {
        0o600
    };
    tokio::task::spawn_blocking(move || {
        write_for_kernel(&dir, &path, &mut data, &contents, &manifest_bytes, mode)
    })
    .await
    .map_err(|e| SnapshotError::Task(e.to_string()))??;
    if let Some(gid) = exchange.group {
        // The session's kernels (a uid of their own, in this group) read them.
        for name in [DATA, MANIFEST] {
            exchange.dir.chown(name, 0, gid).map_err(exchange.io())?;
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
    mode: u32,
) -> Result<(), SnapshotError> {
    let io = |source| SnapshotError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut file = dir.create_file(DATA, mode).map_err(io)?;
    if let Err(e) = copy_verified(data, contents, &mut file, path) {
        let _ = dir.remove_tree(DATA);
        return Err(e);
    }
    dir.create_new(MANIFEST, manifest_bytes, mode).map_err(io)
}

/// Loads a prepared snapshot into the current kernel of `pool` (which the caller has made a
/// fresh one) and reports what came back: the kernel writes its report into `box/` of
/// `runtime`, a new file at a name the host chose.
pub(crate) async fn load(
    pool: &mut KernelPool,
    runtime: &RuntimeDir,
    prepared: Prepared,
    timeout: Option<Duration>,
) -> Result<RestoreReport, SnapshotError> {
    let Prepared { exchange, manifest } = prepared;
    let writable = runtime
        .kernel_writable()
        .map_err(|source| SnapshotError::Io {
            path: runtime
                .path()
                .join(crate::kernel::runtime_dir::KERNEL_WRITABLE),
            source,
        })?;
    let name = format!("report-{:016x}.json", rand::random::<u64>());
    // Whatever a kernel left at that name goes first.
    let _ = writable.remove_tree(&name);
    let code = format!(
        "__import__('ipybox_runtime.snapshot', fromlist=['restore_from_dir']).restore_from_dir({}, {})",
        py_str(&exchange.path().to_string_lossy()),
        py_str(&writable.path().join(&name).to_string_lossy()),
    );
    let loaded = pool.execute_hidden(&code, timeout).await;
    drop(exchange);
    let report = loaded.map_err(SnapshotError::from).and_then(|_| {
        read_small(&writable, &name, MAX_REPORT_BYTES).map_err(|e| SnapshotError::Invalid {
            what: "the kernel's restore report".into(),
            reason: e.to_string(),
        })
    });
    let _ = writable.remove_tree(&name);
    let kernel: KernelReport =
        serde_json::from_slice(&report?).map_err(|e| SnapshotError::Invalid {
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
        let err = write_for_kernel(
            &ex.dir,
            &ex.path(),
            &mut source(&payload),
            &contents,
            b"{}",
            0o600,
        );
        assert!(err.is_err());
        assert_eq!(std::fs::read_to_string(&outside).unwrap(), "host data");

        let ex = Exchange::create(&runtime).unwrap();
        let decoy = t.path().join("decoy");
        std::fs::create_dir(&decoy).unwrap();
        let moved = ex.path().with_extension("moved");
        std::fs::rename(ex.path(), &moved).unwrap();
        std::os::unix::fs::symlink(&decoy, ex.path()).unwrap();
        write_for_kernel(
            &ex.dir,
            &ex.path(),
            &mut source(&payload),
            &contents,
            b"{}",
            0o600,
        )
        .unwrap();
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
            0o600,
        );
        assert!(matches!(err, Err(SnapshotError::Refused { .. })));
        assert!(!ex.path().join(DATA).exists());
        // Dropping the exchange removes it (a link left at its name included).
        let path = ex.path();
        drop(ex);
        assert!(!path.exists());
    }
}
