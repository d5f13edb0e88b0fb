//! The trust rule for tool calls, in one place: **server params never come from the kernel.**
//!
//! Generated code sends its server's params with each call, but a kernel is not trusted with
//! them: a sandboxed or remote kernel is hostile code (it could post `{"command": "sh", ...}`
//! and have the host run it, or put `${SECRET}` in a URL and have the host send it out), and
//! even the user's own kernel should not be able to make the host start a process the user
//! never registered behind an approval that names only `server.tool`. So every kernel — local,
//! sandboxed, on a Jupyter server — may only call servers the host registered, and the call uses
//! the params recorded at registration ([`Registry::resolve`]); `${VAR}` is resolved in those
//! only. What the kernel sent is ignored.
//!
//! Registrations come from the host: the MCP tool `register_mcp_server` and
//! `CodeExecutor::register_mcp_server`, and `generate_mcp_sources` / `ipybox apigen` (the SDK
//! flow: generate, then execute). They are kept per workspace in ipybox's data directory (a
//! kernel cannot write there: it is outside the workspace and denied to the sandbox), in
//! `registrations/<hash of the workspace path>.json`, directory 0700, file 0600 (params may hold
//! literal tokens). A registry re-reads its file when it changed, so a server registered by
//! another process (a `generate_mcp_sources` after the executor started) is callable at once.
//!
//! Not here: connecting ([`super::sessions`]) or code generation (`crate::register`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::SystemTime;

use serde_json::Value;

use super::params::ServerParams;

/// Registered servers of one workspace.
#[derive(Debug)]
pub(crate) struct Registry {
    file: Option<PathBuf>,
    /// What the file held when it was last read (its modification time), or the in-memory
    /// records of a registry without a file.
    state: Mutex<Loaded>,
}

#[derive(Debug, Default)]
struct Loaded {
    modified: Option<SystemTime>,
    servers: BTreeMap<String, Value>,
}

/// A server the host registered: what a kernel's call reaches.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Registered {
    /// The params recorded at registration (`${VAR}` unresolved).
    pub(crate) params: Value,
    /// The server's command line or URL, for approval questions (placeholders unresolved).
    pub(crate) target: String,
    /// A fingerprint of the whole recorded params: what "allow for the session" is keyed by.
    pub(crate) identity: String,
}

/// Why a kernel's call was refused (the text is for the kernel's error).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NotRegistered(pub(crate) String);

impl Registry {
    /// A registry kept in memory only (no data directory).
    pub(crate) fn in_memory() -> Self {
        Self {
            file: None,
            state: Mutex::default(),
        }
    }

    /// The registry of `workspace` (an absolute, canonical path), kept under
    /// `data_dir/registrations/`.
    pub(crate) fn for_workspace(data_dir: &Path, workspace: &Path) -> Self {
        let file = data_dir.join("registrations").join(format!(
            "{:016x}.json",
            fnv1a(workspace.to_string_lossy().as_bytes())
        ));
        Self {
            file: Some(file),
            state: Mutex::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Loaded> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The records, re-read from the file if it changed since the last read.
    fn current(&self) -> std::sync::MutexGuard<'_, Loaded> {
        let mut loaded = self.lock();
        if let Some(file) = &self.file {
            let modified = std::fs::metadata(file).and_then(|m| m.modified()).ok();
            if modified != loaded.modified || modified.is_none() {
                loaded.servers = std::fs::read(file)
                    .ok()
                    .and_then(|bytes| serde_json::from_slice(&bytes).ok())
                    .unwrap_or_default();
                loaded.modified = modified;
            }
        }
        loaded
    }

    /// Records (or replaces) a server's params and writes the registry (0600, atomically).
    pub(crate) fn record(&self, name: &str, params: &Value) -> std::io::Result<()> {
        let mut loaded = self.current();
        loaded.servers.insert(name.to_string(), params.clone());
        if let Some(file) = &self.file {
            let snapshot =
                serde_json::to_vec_pretty(&loaded.servers).map_err(std::io::Error::other)?;
            write_private(file, &snapshot)?;
            loaded.modified = std::fs::metadata(file).and_then(|m| m.modified()).ok();
        }
        Ok(())
    }

    /// The trust rule: the server a kernel's call to `server_name` reaches — the registered one,
    /// with its recorded params — or why there is none. The params the kernel sent play no part.
    pub(crate) fn resolve(&self, server_name: &str) -> Result<Registered, NotRegistered> {
        let recorded = self.current().servers.get(server_name).cloned();
        let Some(params) = recorded else {
            let name = super::shown::name(server_name, super::shown::Syntax::Json);
            return Err(NotRegistered(format!(
                "MCP server `{name}` is not registered with this ipybox for this workspace: kernel code can only call servers the host registered, with the params recorded then\n  help: register it first: register_mcp_server (MCP tool), generate_mcp_sources(\"{name}\", params, root_dir=<workspace>/mcptools) (Python/Rust) or `ipybox apigen {name} --params ...`"
            )));
        };
        let target = ServerParams::parse(&params)
            .map(|p| p.command_or_url())
            .map_err(|e| {
                NotRegistered(format!(
                    "the registration of MCP server `{server_name}` is unreadable ({e})\n  help: register it again"
                ))
            })?;
        let identity = format!("{:016x}", fnv1a(params.to_string().as_bytes()));
        Ok(Registered {
            params,
            target,
            identity,
        })
    }
}

/// Writes `bytes` to `file` readable by the owner only (0600, directories 0700), replacing it
/// atomically.
fn write_private(file: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
    if let Some(dir) = file.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
        // Directories made by an older ipybox were 0755.
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    }
    let tmp = file.with_extension(format!("json.{}.tmp", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let mut out = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)?;
    out.write_all(bytes)?;
    out.sync_all()?;
    std::fs::rename(&tmp, file)
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn persists_per_workspace_privately_and_sees_other_writers() {
        use std::os::unix::fs::PermissionsExt;
        let data = tempfile::tempdir().unwrap();
        let a = Registry::for_workspace(data.path(), "/ws/a".as_ref());
        a.record("fx", &json!({"command": "x"})).unwrap();
        let other = Registry::for_workspace(data.path(), "/ws/a".as_ref());
        assert_eq!(other.resolve("fx").unwrap().params, json!({"command": "x"}));
        assert!(
            Registry::for_workspace(data.path(), "/ws/b".as_ref())
                .resolve("fx")
                .is_err()
        );
        // Another process re-registers: the first registry sees it.
        std::thread::sleep(std::time::Duration::from_millis(20));
        other.record("fx", &json!({"command": "y"})).unwrap();
        assert_eq!(a.resolve("fx").unwrap().params, json!({"command": "y"}));
        let dir = data.path().join("registrations");
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&dir), 0o700);
        let file = std::fs::read_dir(&dir)
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .path();
        assert_eq!(mode(&file), 0o600);
    }

    /// The rule's table: what a kernel asks for, what it reaches.
    #[test]
    fn kernels_reach_registered_servers_with_recorded_params_only() {
        let registry = Registry::in_memory();
        let fixture =
            json!({"command": "python3", "args": ["fx.py", "stdio"], "env": {"T": "${TOKEN}"}});
        let remote = json!({"url": "https://mcp.example/mcp", "headers": {"Authorization": "Bearer ${KEY}"}});
        registry.record("fx", &fixture).unwrap();
        registry.record("remote", &remote).unwrap();
        type Expected<'a> = Result<(&'a Value, &'a str), &'a str>;
        let table: &[(&str, Expected)] = &[
            // A registered server: its recorded params, whatever the kernel sent.
            ("fx", Ok((&fixture, "python3 fx.py stdio"))),
            ("remote", Ok((&remote, "https://mcp.example/mcp"))),
            // Not registered: refused (the kernel's own params are never used).
            ("sh", Err("MCP server `sh` is not registered")),
            ("", Err("MCP server `\"\"` is not registered")),
            ("FX", Err("MCP server `FX` is not registered")),
        ];
        for (name, expected) in table {
            match (registry.resolve(name), expected) {
                (Ok(got), Ok((params, target))) => {
                    assert_eq!(&got.params, *params, "{name}");
                    assert_eq!(got.target, *target, "{name}");
                }
                (Err(NotRegistered(why)), Err(start)) => {
                    assert!(why.starts_with(start), "{name}: {why}")
                }
                (got, want) => panic!("{name}: got {got:?}, want {want:?}"),
            }
        }
        // The identity changes with any part of the params (remember is keyed by it).
        let before = registry.resolve("fx").unwrap().identity;
        registry
            .record(
                "fx",
                &json!({"command": "python3", "args": ["fx.py", "stdio"]}),
            )
            .unwrap();
        assert_ne!(registry.resolve("fx").unwrap().identity, before);
    }
}
