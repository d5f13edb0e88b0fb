//! The manifest of a session snapshot: what the kernel saved (names with types, sizes and where
//! their bytes are), what it did not save and why, its modules, imports and working directory.
//!
//! The kernel writes it (`python/ipybox_runtime/snapshot.py`) and a sandboxed kernel is hostile,
//! so the host parses it strictly ([`Manifest::parse`]): bounded size and counts, names that are
//! Python identifiers, module names that are dotted identifiers, short single-line texts, byte
//! ranges inside the data. What the host stores is its own serialization of the parsed manifest
//! (unknown fields dropped) plus the time it was taken by the host's clock.
//!
//! Not here: the data itself (never parsed by the host: only the kernel unpickles), sealing.

use serde::{Deserialize, Serialize};

/// The snapshot format this ipybox writes and reads (`FORMAT` in `snapshot.py`).
pub const FORMAT: u32 = 1;

/// The largest manifest the host reads from a kernel.
pub(crate) const MAX_MANIFEST_BYTES: u64 = 16 << 20;
const MAX_ENTRIES: usize = 100_000;
const MAX_NAME: usize = 256;
const MAX_TEXT: usize = 1_000;
const MAX_IMPORTS: usize = 1_000;

/// A name the snapshot holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavedName {
    /// The variable's name in the user namespace.
    pub name: String,
    /// Its type in words (`int`, `DataFrame`, `function`, `class`, `lambda`, a class name).
    #[serde(rename = "type")]
    pub type_name: String,
    /// Its size in the snapshot (pickle and out-of-band buffers), in bytes.
    pub bytes: u64,
    /// Offset and length of its pickle in the data.
    pub(crate) pickle: [u64; 2],
    /// Offsets and lengths of its out-of-band buffers in the data.
    pub(crate) buffers: Vec<[u64; 2]>,
    /// Its range of pickle memo indices (see `snapshot.py`).
    pub(crate) memo: [u64; 2],
    /// Whether it holds code compiled in the kernel (functions and classes defined in cells),
    /// which only loads under the same Python version.
    pub(crate) code: bool,
}

/// A name the kernel did not save.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NotSaved {
    pub name: String,
    #[serde(rename = "type")]
    pub type_name: String,
    /// Why, in words (`an open file ('/tmp/x'): a file handle belongs to this process`).
    pub reason: String,
}

/// A name bound to a module, saved as the module's name and imported again on restore.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModuleName {
    pub name: String,
    pub module: String,
}

/// What a snapshot holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: u32,
    /// The kernel's Python version (`3.11.7`).
    pub python: String,
    /// When the host took the snapshot (seconds since the Unix epoch, the host's clock).
    #[serde(default)]
    pub created: u64,
    /// The kernel's working directory.
    pub cwd: Option<String>,
    /// Modules the cells imported, imported again before the names load.
    pub imports: Vec<String>,
    pub modules: Vec<ModuleName>,
    pub saved: Vec<SavedName>,
    pub not_saved: Vec<NotSaved>,
    /// The length of the data file.
    pub data_bytes: u64,
}

/// Why a manifest was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidManifest(pub String);

fn bad(what: impl Into<String>) -> InvalidManifest {
    InvalidManifest(what.into())
}

fn identifier(s: &str) -> bool {
    let mut chars = s.chars();
    !s.is_empty()
        && s.len() <= MAX_NAME
        && chars.next().is_some_and(|c| c == '_' || c.is_alphabetic())
        && chars.all(|c| c == '_' || c.is_alphanumeric())
}

fn dotted(s: &str) -> bool {
    s.len() <= MAX_NAME && s.split('.').all(identifier)
}

fn text(s: &str) -> bool {
    s.chars().count() <= MAX_TEXT && !s.chars().any(char::is_control)
}

impl Manifest {
    /// Parses and checks a manifest the kernel wrote for data of `data_len` bytes.
    pub(crate) fn parse(bytes: &[u8], data_len: u64) -> Result<Self, InvalidManifest> {
        let m: Manifest =
            serde_json::from_slice(bytes).map_err(|e| bad(format!("not a manifest: {e}")))?;
        m.check(data_len)?;
        Ok(m)
    }

    /// The checks of [`Manifest::parse`] (also run on a stored manifest before it is used).
    pub(crate) fn check(&self, data_len: u64) -> Result<(), InvalidManifest> {
        if self.format != FORMAT {
            return Err(bad(format!(
                "snapshot format {} (this ipybox reads format {FORMAT})",
                self.format
            )));
        }
        if self.python.len() > 32
            || !self
                .python
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '+')
        {
            return Err(bad("the Python version is not a version"));
        }
        if self.data_bytes != data_len {
            return Err(bad(format!(
                "it describes {} bytes of data, and the data has {data_len}",
                self.data_bytes
            )));
        }
        if let Some(cwd) = &self.cwd
            && (!text(cwd) || !cwd.starts_with('/'))
        {
            return Err(bad("the working directory is not an absolute path"));
        }
        if self.saved.len() + self.not_saved.len() + self.modules.len() > MAX_ENTRIES
            || self.imports.len() > MAX_IMPORTS
        {
            return Err(bad("too many entries"));
        }
        if let Some(m) = self.imports.iter().find(|m| !dotted(m)) {
            return Err(bad(format!("import {m:?} is not a module name")));
        }
        for m in &self.modules {
            if !identifier(&m.name) || !dotted(&m.module) {
                return Err(bad(format!("module entry {:?} = {:?}", m.name, m.module)));
            }
        }
        for n in &self.not_saved {
            if !text(&n.name) || n.name.len() > MAX_NAME || !text(&n.type_name) || !text(&n.reason)
            {
                return Err(bad("an entry of the names not saved is not plain text"));
            }
        }
        let within = |[off, len]: [u64; 2]| off.checked_add(len).is_some_and(|e| e <= data_len);
        let mut memo_end = 0;
        for s in &self.saved {
            if !identifier(&s.name) || !text(&s.type_name) {
                return Err(bad(format!("saved name {:?} is not an identifier", s.name)));
            }
            if !within(s.pickle) || !s.buffers.iter().all(|b| within(*b)) {
                return Err(bad(format!("the data of {} lies outside the data", s.name)));
            }
            let [start, end] = s.memo;
            if start != memo_end || end < start {
                return Err(bad(format!("the memo range of {} is out of order", s.name)));
            }
            memo_end = end;
            let size = s.buffers.iter().map(|b| b[1]).sum::<u64>() + s.pickle[1];
            if s.bytes != size {
                return Err(bad(format!("the size of {} does not add up", s.name)));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> serde_json::Value {
        serde_json::json!({
            "format": 1, "python": "3.11.7", "cwd": "/ws", "imports": ["numpy", "xml.etree.ElementTree"],
            "modules": [{"name": "np", "module": "numpy"}],
            "saved": [
                {"name": "x", "type": "int", "bytes": 17, "pickle": [18, 17], "buffers": [], "memo": [0, 1], "code": false},
                {"name": "a", "type": "ndarray", "bytes": 201, "pickle": [35, 121], "buffers": [[156, 80]], "memo": [1, 17], "code": false}
            ],
            "not_saved": [{"name": "fh", "type": "TextIOWrapper", "reason": "an open file"}],
            "data_bytes": 236, "extra": "dropped"
        })
    }

    #[test]
    fn a_good_manifest_parses_and_drops_unknown_fields() {
        let m = Manifest::parse(sample().to_string().as_bytes(), 236).unwrap();
        assert_eq!(m.saved[1].buffers, vec![[156, 80]]);
        assert!(!serde_json::to_string(&m).unwrap().contains("extra"));
    }

    #[test]
    fn hostile_manifests_are_refused() {
        let cases: Vec<(&str, serde_json::Value)> = vec![
            ("/data_bytes", 999.into()),
            ("/format", 2.into()),
            ("/saved/0/name", "x; import os".into()),
            ("/saved/0/pickle", serde_json::json!([18, 9999])),
            ("/saved/1/buffers", serde_json::json!([[u64::MAX, 2]])),
            ("/saved/1/memo", serde_json::json!([5, 17])),
            ("/saved/0/bytes", 1.into()),
            ("/modules/0/module", "../etc".into()),
            ("/imports/0", "os; rm".into()),
            ("/cwd", "relative".into()),
            ("/not_saved/0/reason", "line\nbreak\u{1b}[31m".into()),
            ("/python", "3.11\n".into()),
        ];
        for (pointer, value) in cases {
            let mut v = sample();
            *v.pointer_mut(pointer).unwrap() = value;
            assert!(
                Manifest::parse(v.to_string().as_bytes(), 236).is_err(),
                "{pointer} accepted"
            );
        }
        assert!(Manifest::parse(b"not json", 0).is_err());
    }
}
