//! Host-side record of registered MCP servers (name -> params as written), for sandboxed kernels.
//!
//! Generated code sends its server params with each call. Unsandboxed, that is fine: the kernel
//! runs as the user and could start any process itself. A sandboxed kernel could use it to escape
//! (post `{"command": "sh", ...}` and have the host run it, or put `${SECRET}` in a URL); so with
//! `--sandbox` the tool server only calls servers recorded here, with the recorded params.
//! Registrations are kept in a file outside the workspace (the sandbox cannot write it), one per
//! workspace, under ipybox's data dir, so they survive restarts.
//!
//! Not here: connecting ([`super::sessions`]) or code generation (`crate::register`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde_json::Value;

/// Registered servers of one workspace.
#[derive(Debug)]
pub(crate) struct Registry {
    file: Option<PathBuf>,
    servers: Mutex<BTreeMap<String, Value>>,
}

impl Registry {
    /// A registry kept in memory only.
    pub(crate) fn in_memory() -> Self {
        Self {
            file: None,
            servers: Mutex::new(BTreeMap::new()),
        }
    }

    /// The registry of `workspace`, persisted under `data_dir/registrations/`.
    pub(crate) fn for_workspace(data_dir: &Path, workspace: &Path) -> Self {
        let file = data_dir.join("registrations").join(format!(
            "{:016x}.json",
            fnv1a(workspace.to_string_lossy().as_bytes())
        ));
        let servers = std::fs::read(&file)
            .ok()
            .and_then(|bytes| serde_json::from_slice::<BTreeMap<String, Value>>(&bytes).ok())
            .unwrap_or_default();
        Self {
            file: Some(file),
            servers: Mutex::new(servers),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Value>> {
        self.servers.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records (or replaces) a server's params and persists the registry.
    pub(crate) fn record(&self, name: &str, params: &Value) -> std::io::Result<()> {
        let snapshot = {
            let mut servers = self.lock();
            servers.insert(name.to_string(), params.clone());
            serde_json::to_vec_pretty(&*servers).map_err(std::io::Error::other)?
        };
        if let Some(file) = &self.file {
            if let Some(dir) = file.parent() {
                std::fs::create_dir_all(dir)?;
            }
            let tmp = file.with_extension("json.tmp");
            std::fs::write(&tmp, snapshot)?;
            std::fs::rename(&tmp, file)?;
        }
        Ok(())
    }

    /// The recorded params of `name`.
    pub(crate) fn get(&self, name: &str) -> Option<Value> {
        self.lock().get(name).cloned()
    }
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::Registry;
    use serde_json::json;

    #[test]
    fn persists_per_workspace() {
        let data = tempfile::tempdir().unwrap();
        let a = Registry::for_workspace(data.path(), "/ws/a".as_ref());
        a.record("fx", &json!({"command": "x"})).unwrap();
        assert_eq!(
            Registry::for_workspace(data.path(), "/ws/a".as_ref()).get("fx"),
            Some(json!({"command": "x"}))
        );
        assert_eq!(
            Registry::for_workspace(data.path(), "/ws/b".as_ref()).get("fx"),
            None
        );
    }
}
