//! Taking and restoring snapshots of kernels on Jupyter servers (`--kernel-gateway`), which
//! share no filesystem with the host: the bytes travel over the kernel's stdin channel, the one
//! that already carries its tool calls (`python/ipybox_runtime/stdin_channel.py`).
//!
//! While a snapshot cell runs, the kernel sends `POST /snapshot/chunk` (`{"offset", "data"}`,
//! base64, 4 MiB at most) in order, then `POST /snapshot/manifest` (`{"manifest"}`); the host
//! writes the chunks to an unnamed file in its runtime directory, capped at the store's limit.
//! While a restore cell runs, the kernel asks `POST /snapshot/offer` (the sealed manifest), then
//! `POST /snapshot/read` (`{"offset", "length"}`) for the data, which the host verified while it
//! copied it to an unnamed file before the cell started, and sends `POST /snapshot/report`.
//! Outside a transfer every such request is refused. 4 MiB chunks stay under the WebSocket
//! message limits of Jupyter servers (tornado's 10 MiB) once base64-encoded.
//!
//! Not here: the request routing of tool calls (`tools::stdin_channel`), local kernels (`local`).

use std::io::{Seek, Write};
use std::os::unix::fs::FileExt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use serde::Deserialize;
use serde_json::{Value, json};

use super::manifest::{MAX_MANIFEST_BYTES, Manifest};
use super::report::{KernelReport, RestoreReport, SnapshotReport};
use super::seal::SnapshotBinding;
use super::store::{SnapshotStore, Verified, copy_verified, open_verified, store_from_kernel};
use super::{KernelConfinement, SnapshotError};
use crate::kernel::KernelPool;
use crate::kernel::runtime_dir::RuntimeDir;

/// The largest chunk either side sends (`CHUNK` in `snapshot.py`).
const CHUNK: u64 = 4 << 20;
const MAX_REPORT_BYTES: usize = 4 << 20;

enum Transfer {
    Idle,
    Receiving {
        file: std::fs::File,
        written: u64,
        limit: u64,
        manifest: Option<Vec<u8>>,
    },
    Sending {
        file: std::fs::File,
        len: u64,
        manifest: Value,
        report: Option<Vec<u8>>,
    },
}

/// The snapshot transfer of one executor's remote kernel: answers the kernel's `/snapshot/*`
/// requests on the stdin channel.
pub(crate) struct SnapshotChannel {
    state: Mutex<Transfer>,
}

#[derive(Deserialize)]
struct Request {
    path: String,
    #[serde(default)]
    body: Value,
}

#[derive(Deserialize)]
struct Chunk {
    offset: u64,
    data: String,
}

#[derive(Deserialize)]
struct Read {
    offset: u64,
    length: u64,
}

fn refuse(message: impl std::fmt::Display) -> Value {
    json!({ "error": message.to_string() })
}

impl SnapshotChannel {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(Transfer::Idle),
        })
    }

    fn set(&self, transfer: Transfer) -> Transfer {
        std::mem::replace(
            &mut self.state.lock().unwrap_or_else(|p| p.into_inner()),
            transfer,
        )
    }

    /// The reply to a stdin-channel request if it is one of a snapshot transfer's (its path
    /// starts with `/snapshot/`); `None` for every other request.
    pub(crate) fn answer(&self, payload: &str) -> Option<String> {
        // The kernel sends `{"method": …, "path": …, "body": …}`: the path is near the start.
        let head = &payload.as_bytes()[..payload.len().min(128)];
        if !head.windows(11).any(|w| w == b"\"/snapshot/") {
            return None;
        }
        let request: Request = serde_json::from_str(payload).ok()?;
        let path = request.path.strip_prefix("/snapshot/")?;
        Some(self.handle(path, request.body).to_string())
    }

    fn handle(&self, path: &str, body: Value) -> Value {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        match (path, &mut *state) {
            (
                "chunk",
                Transfer::Receiving {
                    file,
                    written,
                    limit,
                    ..
                },
            ) => {
                let Ok(chunk) = serde_json::from_value::<Chunk>(body) else {
                    return refuse("a chunk needs `offset` and `data`");
                };
                if chunk.offset != *written {
                    return refuse(format!("expected offset {written}, got {}", chunk.offset));
                }
                let Ok(bytes) = base64::engine::general_purpose::STANDARD.decode(&chunk.data)
                else {
                    return refuse("the chunk is not base64");
                };
                if bytes.len() as u64 > CHUNK || *written + bytes.len() as u64 > *limit {
                    return refuse(format!("the snapshot passes its limit of {limit} bytes"));
                }
                if let Err(e) = file.write_all(&bytes) {
                    return refuse(format!("the host cannot store it: {e}"));
                }
                *written += bytes.len() as u64;
                json!({"ok": true})
            }
            ("manifest", Transfer::Receiving { manifest, .. }) => {
                match serde_json::to_vec(&body["manifest"]) {
                    Ok(bytes) if bytes.len() as u64 <= MAX_MANIFEST_BYTES => {
                        *manifest = Some(bytes);
                        json!({"ok": true})
                    }
                    _ => refuse("the manifest is missing or too large"),
                }
            }
            ("offer", Transfer::Sending { manifest, .. }) => json!({ "manifest": manifest }),
            ("read", Transfer::Sending { file, len, .. }) => {
                let Ok(read) = serde_json::from_value::<Read>(body) else {
                    return refuse("a read needs `offset` and `length`");
                };
                if read.length > CHUNK
                    || read
                        .offset
                        .checked_add(read.length)
                        .is_none_or(|e| e > *len)
                {
                    return refuse("the read lies outside the snapshot");
                }
                let mut bytes = vec![0; read.length as usize];
                match file.read_exact_at(&mut bytes, read.offset) {
                    Ok(()) => json!({
                        "data": base64::engine::general_purpose::STANDARD.encode(&bytes)
                    }),
                    Err(e) => refuse(format!("the host cannot read it: {e}")),
                }
            }
            ("report", Transfer::Sending { report, .. }) => {
                match serde_json::to_vec(&body["report"]) {
                    Ok(bytes) if bytes.len() <= MAX_REPORT_BYTES => {
                        *report = Some(bytes);
                        json!({"ok": true})
                    }
                    _ => refuse("the report is missing or too large"),
                }
            }
            _ => refuse(format!("no snapshot transfer accepts /snapshot/{path} now")),
        }
    }
}

/// An unnamed file in the host-only part of the runtime directory.
fn scratch(runtime: &RuntimeDir) -> Result<std::fs::File, SnapshotError> {
    tempfile::tempfile_in(runtime.path()).map_err(|source| SnapshotError::Io {
        path: runtime.path().to_path_buf(),
        source,
    })
}

/// Snapshots the current (remote) kernel of `pool` into `store` for `binding`.
pub(crate) async fn snapshot(
    pool: &mut KernelPool,
    channel: &SnapshotChannel,
    runtime: &RuntimeDir,
    store: &SnapshotStore,
    binding: &SnapshotBinding,
    confinement: &KernelConfinement,
    timeout: Option<Duration>,
) -> Result<SnapshotReport, SnapshotError> {
    channel.set(Transfer::Receiving {
        file: scratch(runtime)?,
        written: 0,
        limit: store.limit(),
        manifest: None,
    });
    let code = format!(
        "__import__('ipybox_runtime.snapshot', fromlist=['save_to_channel']).save_to_channel({})",
        store.limit()
    );
    let ran = pool.execute_hidden(&code, timeout).await;
    let transfer = channel.set(Transfer::Idle);
    ran?;
    let Transfer::Receiving {
        mut file,
        written,
        manifest: Some(manifest),
        ..
    } = transfer
    else {
        return Err(SnapshotError::Invalid {
            what: "the kernel's snapshot".into(),
            reason: "it sent no manifest".into(),
        });
    };
    file.rewind().map_err(|source| SnapshotError::Io {
        path: runtime.path().to_path_buf(),
        source,
    })?;
    store_from_kernel(store, binding, confinement, &manifest, file, written).await
}

/// A verified snapshot copied to a host-only file, ready to be offered to the kernel.
pub(crate) struct Prepared {
    file: std::fs::File,
    len: u64,
    manifest: Manifest,
    manifest_json: Value,
}

/// Verifies `binding`'s snapshot in `store` (seal, manifest, then the data's digest while it is
/// copied); touches no kernel.
pub(crate) async fn prepare(
    runtime: &RuntimeDir,
    store: &SnapshotStore,
    binding: &SnapshotBinding,
    here: &KernelConfinement,
) -> Result<Prepared, SnapshotError> {
    let Verified {
        manifest,
        manifest_bytes,
        mut data,
        contents,
        ..
    } = open_verified(store, binding, here).await?;
    let mut file = scratch(runtime)?;
    let path = runtime.path().to_path_buf();
    let file = tokio::task::spawn_blocking(move || {
        copy_verified(&mut data, &contents, &mut file, &path).map(|()| file)
    })
    .await
    .map_err(|e| SnapshotError::Task(e.to_string()))??;
    let manifest_json =
        serde_json::from_slice(&manifest_bytes).map_err(|e| SnapshotError::Invalid {
            what: "the stored manifest".into(),
            reason: e.to_string(),
        })?;
    Ok(Prepared {
        file,
        len: contents.data_bytes,
        manifest,
        manifest_json,
    })
}

/// Loads a prepared snapshot into the current (fresh, remote) kernel of `pool`.
pub(crate) async fn load(
    pool: &mut KernelPool,
    channel: &SnapshotChannel,
    prepared: Prepared,
    timeout: Option<Duration>,
) -> Result<RestoreReport, SnapshotError> {
    let Prepared {
        file,
        len,
        manifest,
        manifest_json,
    } = prepared;
    channel.set(Transfer::Sending {
        file,
        len,
        manifest: manifest_json,
        report: None,
    });
    let code = "__import__('ipybox_runtime.snapshot', fromlist=['restore_from_channel']).restore_from_channel()";
    let ran = pool.execute_hidden(code, timeout).await;
    let transfer = channel.set(Transfer::Idle);
    ran?;
    let Transfer::Sending {
        report: Some(report),
        ..
    } = transfer
    else {
        return Err(SnapshotError::Invalid {
            what: "the kernel's restore".into(),
            reason: "it sent no report".into(),
        });
    };
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

    fn request(path: &str, body: Value) -> String {
        json!({"method": "POST", "path": path, "body": body}).to_string()
    }

    #[test]
    fn transfers_are_refused_outside_their_cell_and_bounded_inside() {
        let ch = SnapshotChannel::new();
        assert_eq!(ch.answer(&request("/run", json!({}))), None);
        let idle = ch.answer(&request(
            "/snapshot/read",
            json!({"offset": 0, "length": 1}),
        ));
        assert!(idle.unwrap().contains("no snapshot transfer accepts"));

        ch.set(Transfer::Receiving {
            file: tempfile::tempfile().unwrap(),
            written: 0,
            limit: 6,
            manifest: None,
        });
        let chunk = |offset: u64, data: &[u8]| {
            let data = base64::engine::general_purpose::STANDARD.encode(data);
            ch.answer(&request(
                "/snapshot/chunk",
                json!({"offset": offset, "data": data}),
            ))
            .unwrap()
        };
        assert_eq!(chunk(0, b"abcd"), r#"{"ok":true}"#);
        assert!(chunk(0, b"ab").contains("expected offset 4"));
        assert!(chunk(4, b"abc").contains("passes its limit of 6"));
        assert_eq!(chunk(4, b"ef"), r#"{"ok":true}"#);
        match ch.set(Transfer::Idle) {
            Transfer::Receiving { written, .. } => assert_eq!(written, 6),
            _ => panic!(),
        }

        let mut file = tempfile::tempfile().unwrap();
        file.write_all(b"sealed").unwrap();
        ch.set(Transfer::Sending {
            file,
            len: 6,
            manifest: json!({"format": 1}),
            report: None,
        });
        let read = |offset: u64, length: u64| {
            ch.answer(&request(
                "/snapshot/read",
                json!({"offset": offset, "length": length}),
            ))
            .unwrap()
        };
        assert_eq!(read(2, 4), r#"{"data":"YWxlZA=="}"#);
        assert!(read(2, 5).contains("outside the snapshot"));
        assert!(read(u64::MAX, 2).contains("outside the snapshot"));
        assert_eq!(
            ch.answer(&request("/snapshot/offer", json!({}))).unwrap(),
            r#"{"manifest":{"format":1}}"#
        );
        assert!(chunk(0, b"x").contains("no snapshot transfer accepts"));
    }
}
