//! A local kernel's snapshot on its way to the host: the kernel connects to a Unix socket the
//! host bound for this one save and sends frames, which the host writes straight into the store
//! ([`super::store::Staged`]). Nothing of a snapshot is written where the kernel writes (its
//! `box/` holds its sockets only and, confined, is a small tmpfs: docs/http.md "What a session may
//! use"), and the host stops reading at the store's limit, so a hostile kernel fills neither.
//!
//! A frame is a kind byte, a little-endian `u64` length and that many bytes:
//! - [`DATA`]: the next bytes of the data file (at most [`MAX_FRAME`]);
//! - [`RESTART`] (no bytes): the data so far is dropped (the kernel's pickling starts over
//!   without a name that failed: `python/ipybox_runtime/snapshot.py`);
//! - [`MANIFEST`]: the manifest (at most `MAX_MANIFEST_BYTES`), the last frame.
//!
//! Blocking reads, on a thread of their own: the caller shuts the socket down
//! ([`Abort`]) when it stops waiting, which ends them.

use std::io::{Read, Write};

use sha2::{Digest, Sha256};

use super::SnapshotError;
use super::manifest::MAX_MANIFEST_BYTES;
use super::store::Staged;

/// The kind of a frame of data.
pub(crate) const DATA: u8 = 0;
/// The kind of a frame that drops the data sent so far.
pub(crate) const RESTART: u8 = 1;
/// The kind of the last frame, the manifest.
pub(crate) const MANIFEST: u8 = 2;
/// The largest data frame the host takes (the kernel sends 1 MiB or one buffer at most this).
pub(crate) const MAX_FRAME: u64 = 256 << 20;

/// What a kernel sent: its data staged in the store, and its manifest.
pub(crate) struct Received {
    pub(crate) staged: Staged,
    pub(crate) manifest: Vec<u8>,
    pub(crate) data_len: u64,
    pub(crate) data_sha256: [u8; 32],
}

fn invalid(reason: impl Into<String>) -> SnapshotError {
    SnapshotError::Invalid {
        what: "the kernel's snapshot stream".into(),
        reason: reason.into(),
    }
}

/// Reads frames from `from` into `staged` until the manifest: at most `limit` bytes of data.
pub(crate) fn receive(
    from: &mut impl Read,
    mut staged: Staged,
    limit: u64,
) -> Result<Received, SnapshotError> {
    let mut hasher = Sha256::new();
    let mut len = 0u64;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let mut header = [0u8; 9];
        from.read_exact(&mut header)
            .map_err(|e| invalid(format!("it ended before its manifest ({e})")))?;
        let kind = header[0];
        let size = u64::from_le_bytes(header[1..].try_into().unwrap_or_default());
        match kind {
            DATA => {
                if size > MAX_FRAME {
                    return Err(invalid(format!(
                        "a frame of {size} bytes (at most {MAX_FRAME})"
                    )));
                }
                if len + size > limit {
                    return Err(SnapshotError::Invalid {
                        what: "the kernel's snapshot".into(),
                        reason: format!("it passed the limit of {limit} bytes a snapshot may have"),
                    });
                }
                let mut left = size;
                while left > 0 {
                    let want = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
                    from.read_exact(&mut buf[..want])
                        .map_err(|e| invalid(format!("a frame was cut short ({e})")))?;
                    hasher.update(&buf[..want]);
                    staged.out.write_all(&buf[..want]).map_err(store_io)?;
                    left -= want as u64;
                }
                len += size;
            }
            RESTART => {
                if size != 0 {
                    return Err(invalid("a restart frame with bytes"));
                }
                staged.restart().map_err(store_io)?;
                hasher = Sha256::new();
                len = 0;
            }
            MANIFEST => {
                if size > MAX_MANIFEST_BYTES {
                    return Err(invalid(format!(
                        "a manifest of {size} bytes (at most {MAX_MANIFEST_BYTES})"
                    )));
                }
                let mut manifest = vec![0u8; usize::try_from(size).unwrap_or(0)];
                from.read_exact(&mut manifest)
                    .map_err(|e| invalid(format!("its manifest was cut short ({e})")))?;
                return Ok(Received {
                    staged,
                    manifest,
                    data_len: len,
                    data_sha256: hasher.finalize().into(),
                });
            }
            other => return Err(invalid(format!("a frame of unknown kind {other}"))),
        }
    }
}

fn store_io(source: std::io::Error) -> SnapshotError {
    SnapshotError::Invalid {
        what: "the snapshot store".into(),
        reason: format!("cannot write the kernel's data: {source}"),
    }
}

/// Shuts a kernel's connection down when dropped, so the blocking thread reading it ends
/// whatever the kernel does (the save was abandoned, or failed).
pub(crate) struct Abort(pub(crate) Option<std::os::unix::net::UnixStream>);

impl Drop for Abort {
    fn drop(&mut self) {
        if let Some(s) = self.0.take() {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, bytes: &[u8]) -> Vec<u8> {
        let mut out = vec![kind];
        out.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
        out.extend_from_slice(bytes);
        out
    }

    fn store(t: &tempfile::TempDir) -> super::super::SnapshotStore {
        super::super::SnapshotStore::open(t.path().join("s"), &t.path().join("key")).unwrap()
    }

    #[test]
    fn frames_restarts_limits_and_garbage() {
        let t = tempfile::tempdir().unwrap();
        let store = store(&t);
        let mut stream = frame(DATA, b"dropped");
        stream.extend(frame(RESTART, b""));
        stream.extend(frame(DATA, b"hello "));
        stream.extend(frame(DATA, b"world"));
        stream.extend(frame(MANIFEST, b"{}"));
        let got = receive(&mut stream.as_slice(), store.stage().unwrap(), 100).unwrap();
        assert_eq!(got.data_len, 11);
        assert_eq!(got.manifest, b"{}");
        assert_eq!(got.data_sha256, super::super::seal::sha256(b"hello world"));
        drop(got);
        // Over the limit (counted after a restart from zero again), cut short, unknown kinds,
        // frames and manifests too large: refused, and the staged directory goes with them.
        let over = [frame(DATA, &[0; 60]), frame(DATA, &[0; 41])].concat();
        let cut = frame(DATA, b"abc")[..8].to_vec();
        let mut big = vec![DATA];
        big.extend_from_slice(&(MAX_FRAME + 1).to_le_bytes());
        let mut big_manifest = vec![MANIFEST];
        big_manifest.extend_from_slice(&(MAX_MANIFEST_BYTES + 1).to_le_bytes());
        for (bad, says) in [
            (over, "passed the limit of 100 bytes"),
            (cut, "ended before its manifest"),
            (frame(7, b""), "unknown kind 7"),
            (frame(DATA, b"no manifest"), "ended before its manifest"),
            (big, "at most 268435456"),
            (big_manifest, "at most 16777216"),
            (frame(RESTART, b"x"), "restart frame with bytes"),
        ] {
            let err = receive(&mut bad.as_slice(), store.stage().unwrap(), 100)
                .err()
                .unwrap()
                .to_string();
            assert!(err.contains(says), "{err}");
        }
        let left: Vec<_> = std::fs::read_dir(t.path().join("s")).unwrap().collect();
        assert!(left.is_empty(), "{left:?}");
    }
}
