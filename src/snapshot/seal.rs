//! Sealing a snapshot to its session and owner: an HMAC-SHA256, under a key only the host reads,
//! over the session id, the owner, the confinement of the kernel that wrote it
//! ([`KernelConfinement::record`]), and the digests and length of the data and the manifest.
//!
//! A seal that verifies means the host wrote these exact bytes for this session and owner, from
//! a kernel under that confinement (which cannot be edited without breaking the seal); a
//! snapshot of another session or owner, or one changed by a single byte, does not verify and is
//! never handed to a kernel (unpickling runs code). The key is 32 random bytes in a 0600 file of
//! ipybox's data directory, created once (the first of two racing processes wins, the other
//! reads its key) and kept across restarts, so stored snapshots outlive the process.
//!
//! Not here: where snapshots are stored (`store`), what they hold (`manifest`).

use std::path::{Path, PathBuf};

use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest, Sha256};

use super::KernelConfinement;
use crate::safe_fs::NoFollowDir;

/// v2: the confinement is sealed too (v1 seals, without it, are refused as an older ipybox's).
const DOMAIN: &[u8] = b"ipybox-snapshot-seal-v2\0";
const KEY_BYTES: usize = 32;

/// Who a snapshot belongs to: it is only ever restored for the same session and owner.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct SnapshotBinding {
    session: String,
    owner: Vec<u8>,
}

impl std::fmt::Debug for SnapshotBinding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The owner may be derived from a credential: never printed.
        f.debug_struct("SnapshotBinding")
            .field("session", &self.session)
            .field("owner", &"<redacted>")
            .finish()
    }
}

impl SnapshotBinding {
    /// `session`: the session's id (an HTTP session handle's id, a conversation's id);
    /// `owner`: who may restore it (e.g. a digest of the caller's token; empty for the local
    /// user).
    pub fn new(session: impl Into<String>, owner: impl Into<Vec<u8>>) -> Self {
        Self {
            session: session.into(),
            owner: owner.into(),
        }
    }

    pub fn session(&self) -> &str {
        &self.session
    }

    fn feed(&self, mac: &mut Hmac<Sha256>) {
        for part in [self.session.as_bytes(), &self.owner] {
            mac.update(&(part.len() as u64).to_be_bytes());
            mac.update(part);
        }
    }
}

/// The secret the host seals snapshots with.
#[derive(Clone)]
pub(crate) struct SealKey([u8; KEY_BYTES]);

impl std::fmt::Debug for SealKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SealKey(<redacted>)")
    }
}

/// What a seal covers besides the binding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Contents {
    pub(crate) data_sha256: [u8; 32],
    pub(crate) data_bytes: u64,
    pub(crate) manifest_sha256: [u8; 32],
}

pub(crate) fn sha256(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

impl SealKey {
    /// Reads the key at `path`, creating it (0600, its directory 0700) if there is none.
    pub(crate) fn load_or_create(path: &Path) -> std::io::Result<Self> {
        let (Some(dir), Some(name)) = (path.parent(), path.file_name().and_then(|n| n.to_str()))
        else {
            return Err(std::io::Error::other(format!(
                "{}: not a key file path",
                path.display()
            )));
        };
        crate::safe_fs::create_private_dir(dir)?;
        let dir = NoFollowDir::open(dir, None)?;
        for _ in 0..50 {
            match Self::read(&dir, name) {
                Ok(key) => return Ok(key),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
            let key: [u8; KEY_BYTES] = rand::random();
            let tmp = format!(".{name}.tmp-{:08x}", rand::random::<u32>());
            dir.create_new(&tmp, hex(&key).as_bytes(), 0o600)?;
            // The first writer wins; a racing process then reads the winner's key.
            match dir.rename_new(&tmp, name) {
                Ok(()) => {
                    dir.sync()?;
                    return Ok(Self(key));
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    dir.remove_tree(&tmp)?;
                }
                Err(e) => {
                    let _ = dir.remove_tree(&tmp);
                    return Err(e);
                }
            }
        }
        Err(std::io::Error::other(format!(
            "{}: cannot read or create the snapshot key",
            path.display()
        )))
    }

    fn read(dir: &NoFollowDir, name: &str) -> std::io::Result<Self> {
        use std::io::Read;
        let (mut file, _) = dir.open_regular(name, 1024)?;
        let mut text = String::new();
        file.read_to_string(&mut text)?;
        let bytes = unhex(text.trim()).filter(|b| b.len() == KEY_BYTES);
        match bytes {
            Some(b) => {
                let mut key = [0; KEY_BYTES];
                key.copy_from_slice(&b);
                Ok(Self(key))
            }
            None => Err(std::io::Error::other(format!(
                "{}: not a snapshot key (64 hex digits)\n  help: remove it; snapshots sealed with it can then no longer be restored",
                dir.path().join(name).display()
            ))),
        }
    }

    #[cfg(test)]
    pub(crate) fn from_bytes(key: [u8; KEY_BYTES]) -> Self {
        Self(key)
    }

    fn mac(&self) -> Hmac<Sha256> {
        <Hmac<Sha256> as KeyInit>::new_from_slice(&self.0).expect("HMAC accepts keys of any length")
    }

    fn sealing(
        &self,
        binding: &SnapshotBinding,
        confinement: &KernelConfinement,
        contents: &Contents,
    ) -> Hmac<Sha256> {
        let mut mac = self.mac();
        mac.update(DOMAIN);
        binding.feed(&mut mac);
        let record = confinement.record();
        mac.update(&(record.len() as u64).to_be_bytes());
        mac.update(record.as_bytes());
        mac.update(&contents.data_sha256);
        mac.update(&contents.data_bytes.to_be_bytes());
        mac.update(&contents.manifest_sha256);
        mac
    }

    /// The seal of `contents` for `binding`, written by a kernel under `confinement`.
    pub(crate) fn seal(
        &self,
        binding: &SnapshotBinding,
        confinement: &KernelConfinement,
        contents: &Contents,
    ) -> [u8; 32] {
        self.sealing(binding, confinement, contents)
            .finalize()
            .into_bytes()
            .into()
    }

    /// Whether `seal` is the seal of `contents` for `binding` and `confinement` (compared in
    /// constant time).
    pub(crate) fn verify(
        &self,
        binding: &SnapshotBinding,
        confinement: &KernelConfinement,
        contents: &Contents,
        seal: &[u8],
    ) -> bool {
        self.sealing(binding, confinement, contents)
            .verify_slice(seal)
            .is_ok()
    }

    /// The directory name of `binding`'s snapshot: derived under the key, so it says nothing
    /// about the session or owner and cannot be chosen by anyone without the key.
    pub(crate) fn dir_name(&self, binding: &SnapshotBinding) -> String {
        let mut mac = self.mac();
        mac.update(b"ipybox-snapshot-dir-v1\0");
        binding.feed(&mut mac);
        let full: [u8; 32] = mac.finalize().into_bytes().into();
        hex(&full[..16])
    }
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub(crate) fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).ok())
        .collect()
}

/// Where the key lives by default: `<data dir>/keys/snapshot.key`.
pub(crate) fn default_key_path(data_dir: &Path) -> PathBuf {
    data_dir.join("keys").join("snapshot.key")
}

/// Where the key of session handles lives when the operator gives none: `<data dir>/keys/session.key`.
/// It is kept across restarts, so handles made before a restart still name their sessions.
pub fn session_key_path(data_dir: &Path) -> PathBuf {
    data_dir.join("keys").join("session.key")
}

/// The 32 random bytes of the host-only key file at `path` (0600 in a 0700 directory), created
/// once if missing, never through a link; the same rules as the snapshot seal key.
pub fn host_key(path: &Path) -> std::io::Result<[u8; KEY_BYTES]> {
    SealKey::load_or_create(path).map(|key| key.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn a_seal_binds_session_owner_confinement_and_contents() {
        let key = SealKey::from_bytes([7; 32]);
        let u = &KernelConfinement::Unconfined;
        let a = SnapshotBinding::new("s1", b"owner-a".to_vec());
        let c = Contents {
            data_sha256: [1; 32],
            data_bytes: 10,
            manifest_sha256: [2; 32],
        };
        let seal = key.seal(&a, u, &c);
        assert!(key.verify(&a, u, &c, &seal));
        assert!(!key.verify(
            &SnapshotBinding::new("s2", b"owner-a".to_vec()),
            u,
            &c,
            &seal
        ));
        assert!(!key.verify(
            &SnapshotBinding::new("s1", b"owner-b".to_vec()),
            u,
            &c,
            &seal
        ));
        // Length prefixes: moving a byte from the session to the owner changes the seal.
        assert!(!key.verify(
            &SnapshotBinding::new("s", b"1owner-a".to_vec()),
            u,
            &c,
            &seal
        ));
        for changed in [
            Contents {
                data_bytes: 11,
                ..c
            },
            Contents {
                data_sha256: [3; 32],
                ..c
            },
            Contents {
                manifest_sha256: [3; 32],
                ..c
            },
        ] {
            assert!(!key.verify(&a, u, &changed, &seal));
        }
        // Another confinement: the same bytes from a sandboxed or confined kernel.
        for other in [
            KernelConfinement::Confined,
            KernelConfinement::Sandbox { policy: [0; 32] },
        ] {
            assert!(!key.verify(&a, &other, &c, &seal));
        }
        assert!(!SealKey::from_bytes([8; 32]).verify(&a, u, &c, &seal));
        assert_ne!(
            key.dir_name(&a),
            key.dir_name(&SnapshotBinding::new("s2", b"owner-a".to_vec()))
        );
        assert!(!format!("{a:?}").contains("owner-a"));
    }

    #[test]
    fn the_key_is_created_once_private_and_kept() {
        let t = tempfile::tempdir().unwrap();
        let path = default_key_path(t.path());
        let k1 = SealKey::load_or_create(&path).unwrap();
        let k2 = SealKey::load_or_create(&path).unwrap();
        assert_eq!(k1.0, k2.0);
        assert_eq!(std::fs::metadata(&path).unwrap().mode() & 0o777, 0o600);
        assert_eq!(
            std::fs::metadata(path.parent().unwrap()).unwrap().mode() & 0o777,
            0o700
        );
        // A link planted at the key's name is not followed.
        let other = t.path().join("k2/snapshot.key");
        std::fs::create_dir_all(other.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(&path, &other).unwrap();
        assert!(SealKey::load_or_create(&other).is_err());
    }
}
