//! The host's trust ledger: one append-only file of JSON lines under ipybox's data directory
//! (`$IPYBOX_HOME/trust/ledger.jsonl`, 0600 in a 0700 directory: hidden from every sandboxed
//! kernel, as the whole data directory is). Lines, each written with one `write`:
//!
//! ```text
//! {"v":1,"window":ID,"start_ns":T,"roots":[DIR,…],"who":TEXT,"pid":P,"pid_start":S}
//! {"v":1,"close":ID,"end_ns":T}
//! {"v":1,"generated":PATH,"sha256":HEX}
//! {"v":1,"accepted":PATH,"sha256":HEX,"at_ns":T}
//! ```
//!
//! A line that does not parse (a write cut short by a crash) is skipped; the kernel side
//! (`ipybox_runtime.workspace_trust`) reads the same lines by the same rules.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// One line of the ledger.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(untagged)]
pub(crate) enum Line {
    Window {
        v: u32,
        window: String,
        start_ns: i64,
        roots: Vec<PathBuf>,
        who: String,
        pid: i32,
        pid_start: u64,
    },
    Close {
        v: u32,
        close: String,
        end_ns: i64,
    },
    Generated {
        v: u32,
        generated: PathBuf,
        sha256: String,
    },
    Accepted {
        v: u32,
        accepted: PathBuf,
        sha256: String,
        at_ns: i64,
    },
}

/// A time during which a less trusted kernel could write under `roots`.
#[derive(Debug, Clone, PartialEq)]
pub struct WindowRecord {
    pub id: String,
    pub start_ns: i64,
    /// `None` while the window is open (its host still runs, or died and no later ipybox has
    /// closed it yet).
    pub end_ns: Option<i64>,
    pub roots: Vec<PathBuf>,
    /// Who could write: "a sandboxed kernel (srt, policy 1a2b3c4d)".
    pub who: String,
    pub(crate) pid: i32,
    pub(crate) pid_start: u64,
}

impl WindowRecord {
    /// Whether `t` (nanoseconds since the epoch) falls within this window.
    pub fn covers_time(&self, t: i64) -> bool {
        t >= self.start_ns && self.end_ns.is_none_or(|end| t <= end)
    }

    /// Whether `path` lies under one of this window's roots.
    pub fn covers_path(&self, path: &Path) -> bool {
        self.roots.iter().any(|r| path.starts_with(r))
    }
}

/// What the ledger says, read whole.
#[derive(Debug, Default, Clone)]
pub struct LedgerState {
    pub windows: Vec<WindowRecord>,
    pub(crate) generated: Vec<(PathBuf, String)>,
    pub(crate) accepted: Vec<(PathBuf, String)>,
}

impl LedgerState {
    /// Whether the host generated `path` with this content, or a person accepted it.
    pub fn vouched(&self, path: &Path, sha256: &str) -> bool {
        self.generated
            .iter()
            .chain(&self.accepted)
            .any(|(p, d)| p == path && d == sha256)
    }
}

/// The ledger file of a data directory.
#[derive(Debug, Clone)]
pub struct Ledger {
    path: PathBuf,
}

impl Ledger {
    /// The ledger of ipybox's data directory `data_dir`.
    pub fn in_data_dir(data_dir: &Path) -> Self {
        Ledger {
            path: data_dir.join("trust").join("ledger.jsonl"),
        }
    }

    /// The ledger file (which trusted kernels read: `IPYBOX_TRUST_LEDGER`).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends `line` (one `write` of the whole line, `O_APPEND`).
    pub(crate) fn append(&self, line: &Line) -> std::io::Result<()> {
        self.append_all(std::slice::from_ref(line))
    }

    /// Appends `lines`, each with its own `write`.
    pub(crate) fn append_all(&self, lines: &[Line]) -> std::io::Result<()> {
        if lines.is_empty() {
            return Ok(());
        }
        if let Some(dir) = self.path.parent() {
            crate::safe_fs::create_private_dir(dir)?;
        }
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&self.path)?;
        for line in lines {
            let mut text = serde_json::to_vec(line).map_err(std::io::Error::other)?;
            text.push(b'\n');
            file.write_all(&text)?;
        }
        Ok(())
    }

    /// Reads the whole ledger; a missing file is an empty ledger.
    pub fn read(&self) -> std::io::Result<LedgerState> {
        let text = match std::fs::read_to_string(&self.path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(LedgerState::default()),
            Err(e) => return Err(e),
        };
        Ok(parse(&text))
    }
}

/// The state a ledger's text describes (lines that do not parse are skipped).
pub(crate) fn parse(text: &str) -> LedgerState {
    let mut state = LedgerState::default();
    for line in text.lines() {
        let Ok(line) = serde_json::from_str::<Line>(line) else {
            continue;
        };
        match line {
            Line::Window {
                window,
                start_ns,
                roots,
                who,
                pid,
                pid_start,
                ..
            } => state.windows.push(WindowRecord {
                id: window,
                start_ns,
                end_ns: None,
                roots,
                who,
                pid,
                pid_start,
            }),
            Line::Close { close, end_ns, .. } => {
                for w in state.windows.iter_mut().filter(|w| w.id == close) {
                    w.end_ns = Some(w.end_ns.map_or(end_ns, |e| e.min(end_ns)));
                }
            }
            Line::Generated {
                generated, sha256, ..
            } => state.generated.push((generated, sha256)),
            Line::Accepted {
                accepted, sha256, ..
            } => state.accepted.push((accepted, sha256)),
        }
    }
    state
}

/// Now, in nanoseconds since the epoch (the unit of `st_ctime`).
pub(crate) fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_round_trip_and_a_torn_line_is_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = Ledger::in_data_dir(dir.path());
        ledger
            .append_all(&[
                Line::Window {
                    v: 1,
                    window: "w1".into(),
                    start_ns: 10,
                    roots: vec!["/ws".into()],
                    who: "a sandboxed kernel".into(),
                    pid: 1,
                    pid_start: 2,
                },
                Line::Generated {
                    v: 1,
                    generated: "/ws/mcptools/__init__.py".into(),
                    sha256: "ab".into(),
                },
            ])
            .unwrap();
        // A line cut short by a crash, then more lines.
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(ledger.path())
            .unwrap();
        f.write_all(b"{\"v\":1,\"close\":\"w1\",\"end").unwrap();
        f.write_all(b"\n").unwrap();
        ledger
            .append(&Line::Close {
                v: 1,
                close: "w1".into(),
                end_ns: 20,
            })
            .unwrap();
        let state = ledger.read().unwrap();
        assert_eq!(state.windows.len(), 1);
        assert_eq!(state.windows[0].end_ns, Some(20));
        assert!(state.windows[0].covers_time(15));
        assert!(!state.windows[0].covers_time(21));
        assert!(state.windows[0].covers_path(Path::new("/ws/gentools/a.py")));
        assert!(!state.windows[0].covers_path(Path::new("/wsx/a.py")));
        assert!(state.vouched(Path::new("/ws/mcptools/__init__.py"), "ab"));
        assert!(!state.vouched(Path::new("/ws/mcptools/__init__.py"), "cd"));
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(ledger.path())
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
}
