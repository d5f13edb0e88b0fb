//! Where sealed snapshots live on the host: `$IPYBOX_HOME/snapshots/<id>/` (0700) holding `data`,
//! `manifest.json` and `seal.json` (0600), `<id>` derived from the session and owner under the
//! seal key (see `seal`). `seal.json` records the confinement of the kernel that wrote the
//! snapshot; the seal covers it, and a restore into a less confined kernel is refused
//! (`confinement`).
//!
//! A snapshot is written into a fresh `.tmp-*` directory and swapped in whole (an atomic rename
//! exchange on Linux), so a reader sees the old snapshot or the new one, never a mix; files and
//! directory entries are flushed to disk before the swap. Reading verifies the seal and the
//! manifest's digest before anything else; the data's digest is checked by whoever streams it
//! ([`Verified::data`]) before a kernel is told to load it.
//!
//! Every snapshot directory should belong to someone who will delete it: [`SnapshotStore::sweep`]
//! removes those nobody names (after a grace for writes in flight), and
//! [`SnapshotStore::writes_settled`] waits until no write for a binding is in flight (a write
//! runs on a blocking thread and completes even if the save that started it is abandoned).
//!
//! Not here: talking to kernels (`local`), what a manifest may say (`manifest`).

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::manifest::{MAX_MANIFEST_BYTES, Manifest};
use super::seal::{self, Contents, SealKey, SnapshotBinding, hex, unhex};
use super::{KernelConfinement, SnapshotError};
use crate::host_env::HostEnv;
use crate::safe_fs::NoFollowDir;

/// The largest snapshot (data) a store takes unless [`SnapshotStore::with_limit`] says otherwise.
pub const DEFAULT_SNAPSHOT_LIMIT: u64 = 2 << 30;

const DATA: &str = "data";
const MANIFEST: &str = "manifest.json";
const SEAL: &str = "seal.json";

#[derive(Serialize, Deserialize)]
struct SealFile {
    format: u32,
    data_sha256: String,
    data_bytes: u64,
    manifest_sha256: String,
    /// [`KernelConfinement::record`] of the kernel that wrote it; absent in snapshots of an
    /// ipybox before it was sealed (they are refused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    confinement: Option<String>,
    seal: String,
}

/// Sealed snapshots under a host-only directory.
#[derive(Debug, Clone)]
pub struct SnapshotStore {
    root: PathBuf,
    key: SealKey,
    limit: u64,
    /// Writes in flight, by snapshot directory name (shared by the store's clones).
    writes: std::sync::Arc<WritesInFlight>,
}

/// Writes in flight by directory name, and a signal when one ends.
#[derive(Debug, Default)]
struct WritesInFlight {
    by_dir: std::sync::Mutex<std::collections::HashMap<String, usize>>,
    ended: tokio::sync::Notify,
}

impl WritesInFlight {
    fn map(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, usize>> {
        self.by_dir.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// One write in flight (registered until dropped, on whatever thread ends it).
pub(crate) struct WriteGuard {
    writes: std::sync::Arc<WritesInFlight>,
    dir: String,
}

impl Drop for WriteGuard {
    fn drop(&mut self) {
        let mut map = self.writes.map();
        if let Some(n) = map.get_mut(&self.dir) {
            *n -= 1;
            if *n == 0 {
                map.remove(&self.dir);
            }
        }
        drop(map);
        self.writes.ended.notify_waiters();
    }
}

/// What [`SnapshotStore::sweep`] did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Swept {
    /// Directories removed: snapshots nobody names, and unfinished writes, older than the grace.
    pub removed: Vec<String>,
    /// Their bytes on disk.
    pub bytes: u64,
}

/// A stored snapshot whose seal and manifest verified; its data is verified while it is read.
pub(crate) struct Verified {
    pub(crate) manifest: Manifest,
    pub(crate) manifest_bytes: Vec<u8>,
    pub(crate) data: std::fs::File,
    pub(crate) contents: Contents,
    /// The confinement of the kernel that wrote it.
    pub(crate) confinement: KernelConfinement,
}

fn io_at(path: &Path) -> impl FnOnce(std::io::Error) -> SnapshotError + '_ {
    move |source| SnapshotError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Copies exactly `len` bytes from `from` to `to` and returns their SHA-256.
pub(crate) fn copy_hashing(
    from: &mut impl Read,
    to: &mut impl Write,
    len: u64,
) -> std::io::Result<[u8; 32]> {
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut left = len;
    while left > 0 {
        let want = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        let n = from.read(&mut buf[..want])?;
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!("{} of {len} bytes were there", len - left),
            ));
        }
        hasher.update(&buf[..n]);
        to.write_all(&buf[..n])?;
        left -= n as u64;
    }
    Ok(hasher.finalize().into())
}

impl SnapshotStore {
    /// The store at `root`, sealing with the key in `key_file` (created if missing). Both are
    /// host-only: directories 0700, files 0600.
    pub fn open(root: impl Into<PathBuf>, key_file: &Path) -> Result<Self, SnapshotError> {
        let root = root.into();
        crate::safe_fs::create_private_dir(&root).map_err(io_at(&root))?;
        let key = SealKey::load_or_create(key_file).map_err(io_at(key_file))?;
        Ok(Self {
            root,
            key,
            limit: DEFAULT_SNAPSHOT_LIMIT,
            writes: Default::default(),
        })
    }

    /// The name of `binding`'s directory under [`Self::root`].
    pub fn dir_name(&self, binding: &SnapshotBinding) -> String {
        self.key.dir_name(binding)
    }

    /// Registers a write of `binding`'s snapshot as in flight until the guard drops.
    pub(crate) fn begin_write(&self, binding: &SnapshotBinding) -> WriteGuard {
        let dir = self.key.dir_name(binding);
        *self.writes.map().entry(dir.clone()).or_default() += 1;
        WriteGuard {
            writes: self.writes.clone(),
            dir,
        }
    }

    /// Waits until no write of `binding`'s snapshot started by this process (through any clone
    /// of this store) is in flight: after it, [`Self::delete`] deletes what such a write left.
    pub async fn writes_settled(&self, binding: &SnapshotBinding) {
        let dir = self.key.dir_name(binding);
        loop {
            let ended = self.writes.ended.notified();
            tokio::pin!(ended);
            ended.as_mut().enable();
            if !self.writes.map().contains_key(&dir) {
                return;
            }
            ended.await;
        }
    }

    /// The bytes `binding`'s snapshot takes on disk (its files), 0 if there is none.
    pub fn disk_bytes(&self, binding: &SnapshotBinding) -> u64 {
        tree_bytes(&self.path(binding)).0
    }

    /// Removes the snapshot directories whose name is not in `keep` (and unfinished `.tmp-*`
    /// writes) last changed more than `grace` ago (a write in flight, of this process or of
    /// another replica on the same storage, changes its directory until its record exists),
    /// and none that a write of this process has in flight. Other entries are left alone.
    pub fn sweep(
        &self,
        keep: &std::collections::HashSet<String>,
        grace: std::time::Duration,
    ) -> Result<Swept, SnapshotError> {
        let root = self.root_dir()?;
        let mut swept = Swept::default();
        for entry in std::fs::read_dir(&self.root).map_err(io_at(&self.root))? {
            let Ok(entry) = entry else { continue };
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            let ours = (name.len() == 32 && name.bytes().all(|b| b.is_ascii_hexdigit()))
                || name.starts_with(".tmp-");
            if !ours || keep.contains(name) || self.writes.map().contains_key(name) {
                continue;
            }
            if !entry.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            let (bytes, newest) = tree_bytes(&entry.path());
            let fresh = newest
                .and_then(|t| t.elapsed().ok())
                .is_none_or(|age| age < grace);
            if fresh {
                continue;
            }
            match root.remove_tree(name) {
                Ok(()) => {
                    swept.removed.push(name.to_string());
                    swept.bytes += bytes;
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_at(&entry.path())(e)),
            }
        }
        Ok(swept)
    }

    /// The default store of this host: `<data dir>/snapshots`, key `<data dir>/keys/snapshot.key`
    /// (the data directory is `$IPYBOX_HOME`, else `~/.local/share/ipybox`).
    pub fn for_host(host: &HostEnv) -> Result<Self, SnapshotError> {
        let data = host.data_dir().ok_or(SnapshotError::NoHome)?;
        Self::open(data.join("snapshots"), &seal::default_key_path(&data))
    }

    /// The largest snapshot data this store takes (default [`DEFAULT_SNAPSHOT_LIMIT`]); a kernel
    /// leaves out the names that do not fit, saying so.
    pub fn with_limit(mut self, bytes: u64) -> Self {
        self.limit = bytes;
        self
    }

    pub fn limit(&self) -> u64 {
        self.limit
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The directory holding `binding`'s snapshot (whether or not there is one).
    pub fn path(&self, binding: &SnapshotBinding) -> PathBuf {
        self.root.join(self.key.dir_name(binding))
    }

    fn root_dir(&self) -> Result<NoFollowDir, SnapshotError> {
        NoFollowDir::open(&self.root, Some(0o700)).map_err(io_at(&self.root))
    }

    /// Whether a snapshot is stored for `binding` (not whether it verifies).
    pub fn contains(&self, binding: &SnapshotBinding) -> bool {
        self.path(binding).join(SEAL).is_file()
    }

    /// Removes `binding`'s snapshot; none is not an error.
    pub fn delete(&self, binding: &SnapshotBinding) -> Result<(), SnapshotError> {
        self.root_dir()?
            .remove_tree(&self.key.dir_name(binding))
            .map_err(io_at(&self.path(binding)))
    }

    /// The manifest of `binding`'s snapshot, once its seal verifies (what it holds, without
    /// loading it).
    pub fn manifest(&self, binding: &SnapshotBinding) -> Result<Manifest, SnapshotError> {
        Ok(self.open_verified(binding, None)?.manifest)
    }

    /// The confinement of the kernel that took `binding`'s snapshot, once its seal verifies.
    pub fn confinement(
        &self,
        binding: &SnapshotBinding,
    ) -> Result<KernelConfinement, SnapshotError> {
        Ok(self.open_verified(binding, None)?.confinement)
    }

    /// Stores a snapshot for `binding`, written by a kernel under `confinement`: `data_len`
    /// bytes read from `data`, described by `manifest`; replaces the one stored before. Returns
    /// the data's length.
    pub(crate) fn write(
        &self,
        binding: &SnapshotBinding,
        confinement: &KernelConfinement,
        manifest: &Manifest,
        data: &mut impl Read,
        data_len: u64,
    ) -> Result<u64, SnapshotError> {
        let mut staged = self.stage()?;
        let data_sha256 = copy_hashing(data, &mut staged.out, data_len).map_err(|source| {
            SnapshotError::Invalid {
                what: "the snapshot data".into(),
                reason: format!("cannot copy it: {source}"),
            }
        })?;
        staged.commit(binding, confinement, manifest, data_sha256, data_len)
    }

    /// A new snapshot's data file, in a fresh `.tmp-*` directory of the store (removed again
    /// unless [`Staged::commit`] swaps it in): what a kernel sends is written here as it comes.
    pub(crate) fn stage(&self) -> Result<Staged, SnapshotError> {
        let root = self.root_dir()?;
        let tmp = format!(".tmp-{:016x}", rand::random::<u64>());
        let path = self.root.join(&tmp);
        let dir = root.subdir(&tmp, Some(0o700)).map_err(io_at(&path))?;
        let file = match dir.create_file(DATA, 0o600) {
            Ok(file) => file,
            Err(e) => {
                let _ = root.remove_tree(&tmp);
                return Err(io_at(&path)(e));
            }
        };
        Ok(Staged {
            store: self.clone(),
            root,
            tmp,
            path,
            dir,
            out: std::io::BufWriter::with_capacity(1 << 20, file),
        })
    }

    /// Opens `binding`'s snapshot: its seal must verify for `binding` and the confinement it
    /// records, that confinement must restore into `here` (when given: the kernel it is for), and
    /// its manifest must match the seal, else nothing of it is used.
    pub(crate) fn open_verified(
        &self,
        binding: &SnapshotBinding,
        here: Option<&KernelConfinement>,
    ) -> Result<Verified, SnapshotError> {
        let path = self.path(binding);
        let dir = match self.root_dir()?.subdir(&self.key.dir_name(binding), None) {
            Ok(dir) => dir,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(SnapshotError::NotFound {
                    session: binding.session().to_string(),
                });
            }
            Err(e) => return Err(io_at(&path)(e)),
        };
        let refused = |reason: &str| SnapshotError::Refused {
            reason: reason.to_string(),
        };
        let seal_bytes = read_small(&dir, SEAL, 4096).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => SnapshotError::NotFound {
                session: binding.session().to_string(),
            },
            _ => refused(&format!("its seal cannot be read ({e})")),
        })?;
        let seal: SealFile =
            serde_json::from_slice(&seal_bytes).map_err(|_| refused("its seal is not a seal"))?;
        let digest = |s: &str| {
            unhex(s)
                .and_then(|b| <[u8; 32]>::try_from(b).ok())
                .ok_or_else(|| refused("its seal is not a seal"))
        };
        let contents = Contents {
            data_sha256: digest(&seal.data_sha256)?,
            data_bytes: seal.data_bytes,
            manifest_sha256: digest(&seal.manifest_sha256)?,
        };
        let mac = unhex(&seal.seal).ok_or_else(|| refused("its seal is not a seal"))?;
        let Some(recorded) = &seal.confinement else {
            return Err(SnapshotError::Confinement {
                reason: "it was saved by an older ipybox, which did not record the confinement (sandbox or not) of the kernel that took it".into(),
                help: "start the session afresh and run the cells that built what you need again (the ipybox version that saved it can still restore it)".into(),
            });
        };
        let confinement = KernelConfinement::parse_record(recorded)
            .ok_or_else(|| refused("its seal is not a seal"))?;
        if !self.key.verify(binding, &confinement, &contents, &mac) {
            return Err(refused(
                "its seal does not verify for this session and owner: it was made for another session or owner, or changed since",
            ));
        }
        if let Some(here) = here
            && !confinement.restores_into(here)
        {
            return Err(confinement.refusal(here));
        }
        let manifest_bytes = read_small(&dir, MANIFEST, MAX_MANIFEST_BYTES)
            .map_err(|e| refused(&format!("its manifest cannot be read ({e})")))?;
        if seal::sha256(&manifest_bytes) != contents.manifest_sha256 {
            return Err(refused("its manifest changed since it was sealed"));
        }
        let manifest = Manifest::parse(&manifest_bytes, contents.data_bytes)
            .map_err(|e| refused(&format!("its manifest is invalid ({e})")))?;
        let (data, len) = dir
            .open_regular(DATA, u64::MAX)
            .map_err(|e| refused(&format!("its data cannot be read ({e})")))?;
        if len != contents.data_bytes {
            return Err(refused("its data changed since it was sealed"));
        }
        Ok(Verified {
            manifest,
            manifest_bytes,
            data,
            contents,
            confinement,
        })
    }
}

/// Copies a verified snapshot's data to `to` while hashing it; a digest that differs from the
/// seal's is [`SnapshotError::Refused`] (the caller must then discard what was written).
pub(crate) fn copy_verified(
    data: &mut std::fs::File,
    contents: &Contents,
    to: &mut impl Write,
    path: &Path,
) -> Result<(), SnapshotError> {
    let mut out = std::io::BufWriter::with_capacity(1 << 20, to);
    let digest = copy_hashing(data, &mut out, contents.data_bytes).map_err(io_at(path))?;
    out.flush().map_err(io_at(path))?;
    if digest != contents.data_sha256 {
        return Err(SnapshotError::Refused {
            reason: "its data changed since it was sealed".into(),
        });
    }
    Ok(())
}

/// A snapshot being written into the store ([`SnapshotStore::stage`]): its data file, which the
/// caller fills (`out`; [`Staged::restart`] empties it), then [`Staged::commit`] seals and swaps
/// it in. Dropped uncommitted, its directory is removed.
pub(crate) struct Staged {
    store: SnapshotStore,
    root: NoFollowDir,
    tmp: String,
    path: PathBuf,
    dir: NoFollowDir,
    /// The data file.
    pub(crate) out: std::io::BufWriter<std::fs::File>,
}

impl Staged {
    /// Empties the data file (a kernel that starts its snapshot over).
    pub(crate) fn restart(&mut self) -> std::io::Result<()> {
        self.out.flush()?;
        let file = self.out.get_mut();
        file.set_len(0)?;
        std::io::Seek::rewind(file)?;
        Ok(())
    }

    /// Seals the data written (`data_len` bytes, SHA-256 `data_sha256`) with `manifest` for
    /// `binding` and replaces the snapshot stored before with it. Returns the data's length.
    pub(crate) fn commit(
        mut self,
        binding: &SnapshotBinding,
        confinement: &KernelConfinement,
        manifest: &Manifest,
        data_sha256: [u8; 32],
        data_len: u64,
    ) -> Result<u64, SnapshotError> {
        let path = self.path.clone();
        self.out.flush().map_err(io_at(&path))?;
        let file = self.out.get_ref();
        if file.metadata().map_err(io_at(&path))?.len() != data_len {
            return Err(SnapshotError::Invalid {
                what: "the snapshot data".into(),
                reason: format!("{data_len} bytes were expected in {}", path.display()),
            });
        }
        file.sync_all().map_err(io_at(&path))?;
        let manifest_bytes = serde_json::to_vec(manifest).map_err(|e| SnapshotError::Invalid {
            what: "the snapshot manifest".into(),
            reason: e.to_string(),
        })?;
        let store = &self.store;
        let contents = Contents {
            data_sha256,
            data_bytes: data_len,
            manifest_sha256: seal::sha256(&manifest_bytes),
        };
        let seal = SealFile {
            format: super::manifest::FORMAT,
            data_sha256: hex(&contents.data_sha256),
            data_bytes: data_len,
            manifest_sha256: hex(&contents.manifest_sha256),
            confinement: Some(confinement.record()),
            seal: hex(&store.key.seal(binding, confinement, &contents)),
        };
        for (name, bytes) in [
            (MANIFEST, manifest_bytes),
            (SEAL, serde_json::to_vec(&seal).unwrap_or_default()),
        ] {
            let mut f = self.dir.create_file(name, 0o600).map_err(io_at(&path))?;
            f.write_all(&bytes).map_err(io_at(&path))?;
            f.sync_all().map_err(io_at(&path))?;
        }
        self.dir.sync().map_err(io_at(&path))?;
        self.root
            .replace(&self.tmp, &store.key.dir_name(binding))
            .map_err(io_at(&store.path(binding)))?;
        self.root.sync().map_err(io_at(&store.root))?;
        Ok(data_len)
    }
}

impl Drop for Staged {
    /// Uncommitted, the directory goes (after a commit nothing is left at its name).
    fn drop(&mut self) {
        let _ = self.root.remove_tree(&self.tmp);
    }
}

/// Checks the manifest a kernel under `confinement` sent for `data_len` bytes of data, stamps it
/// with the host's time and stores both for `binding` (off the async runtime: the data may be
/// large).
pub(crate) async fn store_from_kernel(
    store: &SnapshotStore,
    binding: &SnapshotBinding,
    confinement: &KernelConfinement,
    manifest_bytes: &[u8],
    mut data: std::fs::File,
    data_len: u64,
) -> Result<super::SnapshotReport, SnapshotError> {
    let mut manifest =
        Manifest::parse(manifest_bytes, data_len).map_err(|e| SnapshotError::Invalid {
            what: "the kernel's snapshot manifest".into(),
            reason: e.0,
        })?;
    manifest.created = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (store, binding, confinement, stored) = (
        store.clone(),
        binding.clone(),
        confinement.clone(),
        manifest.clone(),
    );
    // Registered before the blocking thread starts, released when it ends (even if this
    // future is dropped meanwhile): see `writes_settled`.
    let guard = store.begin_write(&binding);
    tokio::task::spawn_blocking(move || {
        let written = store.write(&binding, &confinement, &stored, &mut data, data_len);
        drop(guard);
        written
    })
    .await
    .map_err(|e| SnapshotError::Task(e.to_string()))??;
    Ok(super::SnapshotReport { manifest })
}

/// [`SnapshotStore::open_verified`] for a kernel under `here`, off the async runtime.
pub(crate) async fn open_verified(
    store: &SnapshotStore,
    binding: &SnapshotBinding,
    here: &KernelConfinement,
) -> Result<Verified, SnapshotError> {
    let (store, binding, here) = (store.clone(), binding.clone(), here.clone());
    tokio::task::spawn_blocking(move || store.open_verified(&binding, Some(&here)))
        .await
        .map_err(|e| SnapshotError::Task(e.to_string()))?
}

/// The whole of a small regular file (at most `limit` bytes) in `dir`, never through a link.
/// The bytes of the regular files directly in `dir` (a snapshot directory is flat) and the
/// newest modification time of `dir` and those files (`None` if none can be read).
fn tree_bytes(dir: &Path) -> (u64, Option<std::time::SystemTime>) {
    let Ok(meta) = std::fs::symlink_metadata(dir) else {
        return (0, None);
    };
    let mut newest = meta.modified().ok();
    let mut bytes = 0;
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            let Ok(meta) = entry.metadata() else { continue };
            if meta.is_file() {
                bytes += meta.len();
            }
            if let Ok(t) = meta.modified() {
                newest = Some(newest.map_or(t, |n| n.max(t)));
            }
        }
    }
    (bytes, newest)
}

pub(crate) fn read_small(dir: &NoFollowDir, name: &str, limit: u64) -> std::io::Result<Vec<u8>> {
    let (file, len) = dir.open_regular(name, limit)?;
    let mut bytes = Vec::with_capacity(len as usize);
    // At most the length seen at open time (the file may grow meanwhile).
    file.take(len).read_to_end(&mut bytes)?;
    if bytes.len() as u64 != len {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            format!("{name} shrank while it was read"),
        ));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest(data_len: u64) -> Manifest {
        Manifest::parse(
            serde_json::json!({
                "format": 1, "python": "3.11.7", "cwd": "/ws", "imports": [], "modules": [],
                "saved": [{"name": "x", "type": "int", "bytes": data_len, "pickle": [0, data_len], "buffers": [], "memo": [0, 1], "code": false}],
                "not_saved": [], "data_bytes": data_len
            })
            .to_string()
            .as_bytes(),
            data_len,
        )
        .unwrap()
    }

    const U: &KernelConfinement = &KernelConfinement::Unconfined;

    fn store(t: &Path) -> SnapshotStore {
        SnapshotStore::open(t.join("snapshots"), &t.join("keys/snapshot.key")).unwrap()
    }

    #[test]
    fn written_snapshots_verify_for_their_binding_only() {
        use std::os::unix::fs::MetadataExt;
        let t = tempfile::tempdir().unwrap();
        let s = store(t.path());
        let a = SnapshotBinding::new("session-a", b"owner".to_vec());
        let b = SnapshotBinding::new("session-b", b"owner".to_vec());
        assert!(matches!(
            s.open_verified(&a, Some(U)),
            Err(SnapshotError::NotFound { .. })
        ));
        s.write(&a, U, &manifest(5), &mut &b"hello"[..], 5).unwrap();
        let v = s.open_verified(&a, Some(U)).unwrap();
        assert_eq!(v.manifest.saved[0].name, "x");
        let dir = s.path(&a);
        assert_eq!(std::fs::metadata(&dir).unwrap().mode() & 0o777, 0o700);
        for f in [DATA, MANIFEST, SEAL] {
            assert_eq!(
                std::fs::metadata(dir.join(f)).unwrap().mode() & 0o777,
                0o600,
                "{f}"
            );
        }
        // Replaced whole; no temporary directory stays.
        s.write(&a, U, &manifest(3), &mut &b"abc"[..], 3).unwrap();
        assert_eq!(s.open_verified(&a, Some(U)).unwrap().contents.data_bytes, 3);
        assert_eq!(std::fs::read_dir(s.root()).unwrap().count(), 1);

        // Another session's snapshot copied over this one's is refused.
        s.write(&b, U, &manifest(5), &mut &b"HELLO"[..], 5).unwrap();
        std::fs::remove_dir_all(s.path(&a)).unwrap();
        std::fs::create_dir(s.path(&a)).unwrap();
        for f in [DATA, MANIFEST, SEAL] {
            std::fs::copy(s.path(&b).join(f), s.path(&a).join(f)).unwrap();
        }
        let err = s.open_verified(&a, Some(U)).err().unwrap();
        assert!(err.to_string().contains("does not verify"), "{err}");

        // A manifest changed by one byte is refused.
        s.write(&a, U, &manifest(5), &mut &b"hello"[..], 5).unwrap();
        let m = s.path(&a).join(MANIFEST);
        let mut bytes = std::fs::read(&m).unwrap();
        let i = bytes.iter().position(|&c| c == b'x').unwrap();
        bytes[i] = b'y';
        std::fs::write(&m, bytes).unwrap();
        let err = s.open_verified(&a, Some(U)).err().unwrap();
        assert!(err.to_string().contains("manifest changed"), "{err}");

        s.delete(&a).unwrap();
        assert!(!s.contains(&a));
        s.delete(&a).unwrap();
    }

    /// Makes `dir` and its files look last changed 10 minutes ago.
    fn make_old(dir: &Path) {
        let old = std::time::SystemTime::now() - std::time::Duration::from_secs(600);
        for entry in std::fs::read_dir(dir).unwrap().flatten() {
            std::fs::File::open(entry.path())
                .unwrap()
                .set_modified(old)
                .unwrap();
        }
        std::fs::File::open(dir).unwrap().set_modified(old).unwrap();
    }

    #[tokio::test]
    async fn the_sweep_removes_only_old_snapshots_nobody_names_nor_writes() {
        let t = tempfile::tempdir().unwrap();
        let s = store(t.path());
        let grace = std::time::Duration::from_secs(60);
        let binding = |n: &str| SnapshotBinding::new(n, b"owner".to_vec());
        let (named, orphan, fresh, writing) = (
            binding("named"),
            binding("orphan"),
            binding("fresh"),
            binding("writing"),
        );
        for b in [&named, &orphan, &fresh] {
            s.write(b, U, &manifest(5), &mut &b"hello"[..], 5).unwrap();
        }
        make_old(&s.path(&named));
        make_old(&s.path(&orphan));
        // An old unfinished write, and an old directory a write of this process has in flight.
        let tmp = s.root().join(".tmp-0123456789abcdef");
        std::fs::create_dir(&tmp).unwrap();
        std::fs::write(tmp.join(DATA), b"half").unwrap();
        make_old(&tmp);
        let guard = s.begin_write(&writing);
        std::fs::create_dir(s.path(&writing)).unwrap();
        make_old(&s.path(&writing));
        // Not ours: left alone.
        std::fs::write(s.root().join("README"), b"x").unwrap();

        let keep = std::collections::HashSet::from([s.dir_name(&named)]);
        let swept = s.sweep(&keep, grace).unwrap();
        let mut removed = swept.removed.clone();
        removed.sort();
        let mut want = vec![s.dir_name(&orphan), ".tmp-0123456789abcdef".to_string()];
        want.sort();
        assert_eq!(removed, want);
        assert!(swept.bytes > 4, "{swept:?}");
        assert!(s.contains(&named) && s.contains(&fresh) && !s.contains(&orphan));
        assert!(s.path(&writing).is_dir() && s.root().join("README").is_file());

        // A write in flight is waited for; once it ended, the sweep takes its directory.
        let waiting = {
            let (s, writing) = (s.clone(), writing.clone());
            tokio::spawn(async move { s.writes_settled(&writing).await })
        };
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        drop(guard);
        waiting.await.unwrap();
        s.writes_settled(&named).await; // none in flight: at once
        assert_eq!(
            s.sweep(&keep, grace).unwrap().removed,
            vec![s.dir_name(&writing)]
        );
    }

    #[test]
    fn short_data_is_not_stored() {
        let t = tempfile::tempdir().unwrap();
        let s = store(t.path());
        let a = SnapshotBinding::new("a", Vec::new());
        let err = s
            .write(&a, U, &manifest(10), &mut &b"short"[..], 10)
            .unwrap_err();
        assert!(err.to_string().contains("5 of 10 bytes"), "{err}");
        assert!(!s.contains(&a));
        assert_eq!(std::fs::read_dir(s.root()).unwrap().count(), 0);
    }

    #[test]
    fn a_snapshot_restores_only_where_it_is_as_confined_and_is_kept() {
        let t = tempfile::tempdir().unwrap();
        let s = store(t.path());
        let a = SnapshotBinding::new("a", b"owner".to_vec());
        let sandbox = KernelConfinement::Sandbox { policy: [5; 32] };
        s.write(&a, &sandbox, &manifest(5), &mut &b"hello"[..], 5)
            .unwrap();
        let seal_path = s.path(&a).join(SEAL);
        let text = std::fs::read_to_string(&seal_path).unwrap();
        assert!(
            text.contains("\"confinement\":\"sandbox sha256:0505"),
            "{text}"
        );
        assert_eq!(s.confinement(&a).unwrap(), sandbox);
        // Into the same sandbox: yes. Into an unconfined kernel, a confined one or another
        // policy's sandbox: refused, naming both, and the snapshot stays.
        assert!(s.open_verified(&a, Some(&sandbox)).is_ok());
        for here in [
            KernelConfinement::Unconfined,
            KernelConfinement::Confined,
            KernelConfinement::Sandbox { policy: [6; 32] },
        ] {
            let err = s.open_verified(&a, Some(&here)).err().unwrap();
            assert!(matches!(err, SnapshotError::Confinement { .. }), "{err}");
            let text = err.to_string();
            assert!(text.contains("policy sha256:050505050505"), "{text}");
            assert!(text.contains("--sandbox"), "{text}");
            assert!(s.contains(&a));
        }
        // An unconfined snapshot restores into a sandbox too.
        s.write(&a, U, &manifest(5), &mut &b"hello"[..], 5).unwrap();
        assert!(s.open_verified(&a, Some(&sandbox)).is_ok());

        // The recorded confinement cannot be edited: rewritten to `unconfined`, the seal no
        // longer verifies.
        s.write(&a, &sandbox, &manifest(5), &mut &b"hello"[..], 5)
            .unwrap();
        let text = std::fs::read_to_string(&seal_path).unwrap();
        let mut seal: serde_json::Value = serde_json::from_str(&text).unwrap();
        seal["confinement"] = "unconfined".into();
        std::fs::write(&seal_path, seal.to_string()).unwrap();
        let err = s.open_verified(&a, Some(U)).err().unwrap();
        assert!(err.to_string().contains("does not verify"), "{err}");

        // A seal without the field (an older ipybox's): refused as such, kept.
        seal.as_object_mut().unwrap().remove("confinement");
        std::fs::write(&seal_path, seal.to_string()).unwrap();
        let err = s.open_verified(&a, Some(U)).err().unwrap();
        assert!(matches!(err, SnapshotError::Confinement { .. }), "{err}");
        assert!(err.to_string().contains("older ipybox"), "{err}");
        assert!(s.contains(&a));
    }
}
