//! The host's own record of each notebook file it writes, out of every kernel's reach, and the
//! confinement a session ran in.
//!
//! - [`Confinement`]: how the session's kernels were confined (sandboxed with which policy, a
//!   confined, plain local or remote kernel). It goes into the notebook's metadata
//!   (`metadata.ipybox.confinement`, for a person and for `ipybox replay` on another machine)
//!   and into the host record.
//! - The host record: per notebook file, `<data dir>/notebook-records/<key>.json` (0600 in a
//!   0700 directory; `key` is the SHA-256 of the file's canonical path): the file's path, the
//!   session, its confinement, the SHA-256 of each code cell's source and of each cell as
//!   written (outputs and metadata, tool-call arguments included), in order. Format 2 (JSON
//!   lines): a first line with the file, session and confinement, then a line per digest
//!   (`{"c": …}` a cell's, `{"s": …}` a code cell's source), appended as the notebook grows:
//!   a write costs what it adds, not the whole session so far (format 1, one JSON object
//!   rewritten with every cell, is still read). ipybox's data directory is hidden from sandboxed
//!   kernels (and from the confined kernels of the HTTP service), so what they leave behind
//!   cannot change it. Digests only: no outputs, no arguments, no secrets.
//! - [`compare`]: a notebook's code cells against the record: which differ from what ran, which
//!   never ran (inserted), which ran and are gone (removed). `ipybox replay` refuses to run a
//!   notebook that differs. [`check_cells`]: the file's cells, byte for byte, against what the
//!   host wrote (when the file still has the host's layout: one cell per line), naming cells
//!   whose outputs or metadata were edited.
//!
//! Not here: writing the notebook ([`super::Notebook`]), running it (the binary's `replay`).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

/// The directory of host records in ipybox's data directory.
pub const RECORDS_DIR: &str = "notebook-records";

/// Keys of a policy that may hold credentials; they are left out of what is recorded (and
/// named in [`Confinement::left_out`]).
const SECRET_KEYS: &[&[&str]] = &[&["credentials"], &["network", "parentProxy"]];

/// How a session's kernels were confined.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Confinement {
    /// Whether the kernels ran under srt ([`crate::sandbox`]).
    pub sandbox: bool,
    /// `local` (unconfined, on the host), `confined` (the HTTP service's bubblewrap view),
    /// `remote` (a Jupyter server), or `sandbox`.
    pub kernel: String,
    /// The sandbox policy (srt settings, missing sections filled from the default policy),
    /// without the keys named in `left_out`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<Value>,
    /// SHA-256 of the whole policy (`left_out` keys included) as JSON.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_sha256: Option<String>,
    /// The settings file the policy came from, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_file: Option<PathBuf>,
    /// Policy keys not recorded (they may hold credentials), as `network.parentProxy`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub left_out: Vec<String>,
}

impl Confinement {
    /// A kernel that is not sandboxed: `kernel` is `local`, `confined` or `remote`.
    pub fn unsandboxed(kernel: &str) -> Self {
        Self {
            sandbox: false,
            kernel: kernel.into(),
            policy: None,
            policy_sha256: None,
            config_file: None,
            left_out: Vec::new(),
        }
    }

    /// A sandboxed kernel under `policy` (from `config_file`, if any).
    pub fn sandboxed(policy: &crate::sandbox::SandboxPolicy, config_file: Option<&Path>) -> Self {
        let whole = serde_json::to_value(policy.clone().with_defaults()).unwrap_or_default();
        let digest = hex(&Sha256::digest(
            serde_json::to_vec(&whole).unwrap_or_default(),
        ));
        let mut shown = whole;
        let mut left_out = Vec::new();
        for path in SECRET_KEYS {
            let (last, parents) = path.split_last().expect("a key path");
            let mut at = Some(&mut shown);
            for key in parents {
                at = at.and_then(|v| v.get_mut(*key));
            }
            if let Some(Value::Object(map)) = at
                && map.remove(*last).is_some()
            {
                left_out.push(path.join("."));
            }
        }
        Self {
            sandbox: true,
            kernel: "sandbox".into(),
            policy: Some(shown),
            policy_sha256: Some(digest),
            config_file: config_file.map(Path::to_path_buf),
            left_out,
        }
    }

    /// The recorded confinement in `notebook`'s metadata, if any (`None` also when it is not
    /// one ipybox understands).
    pub fn from_metadata(notebook: &Value) -> Option<Self> {
        serde_json::from_value(notebook["metadata"]["ipybox"]["confinement"].clone()).ok()
    }

    /// The recorded policy, as a policy to run under.
    pub fn sandbox_policy(&self) -> Option<crate::sandbox::SandboxPolicy> {
        crate::sandbox::SandboxPolicy::from_value(self.policy.clone()?).ok()
    }

    /// One phrase for a person: `a sandbox (srt, policy from FILE)`, `no sandbox (a local
    /// kernel)`.
    pub fn describe(&self) -> String {
        if self.sandbox {
            let from = match &self.config_file {
                Some(f) => format!("the policy of {}", f.display()),
                None => "the default policy".into(),
            };
            format!("a sandbox (srt, {from})")
        } else {
            format!("no sandbox (a {} kernel)", self.kernel)
        }
    }
}

/// Why a host record could not be read.
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    #[error(
        "cannot read the host's record of {} ({}): {source}\n  help: check the permissions of ipybox's data directory",
        notebook.display(),
        record.display()
    )]
    Read {
        notebook: PathBuf,
        record: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "the host's record of {} ({}) is damaged: {source}\n  help: remove the record to replay the notebook unchecked, as one from another machine",
        notebook.display(),
        record.display()
    )]
    Damaged {
        notebook: PathBuf,
        record: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error(
        "the host's record of {} ({}) is in format {format}, newer than this ipybox reads ({FORMAT})\n  help: replay it with the ipybox that wrote it, or a newer one",
        notebook.display(),
        record.display()
    )]
    Newer {
        notebook: PathBuf,
        record: PathBuf,
        format: u32,
    },
}

/// The host's record of one notebook file (see the module docs).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostRecord {
    /// Format of the record.
    pub format: u32,
    /// The notebook file (canonical).
    pub notebook: PathBuf,
    pub session: String,
    pub started: String,
    pub part: u32,
    pub confinement: Option<Confinement>,
    /// SHA-256 of each code cell's source, in order (format 2: from its `s` lines).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub code_cells: Vec<String>,
    /// SHA-256 of each cell (markdown ones included) as the host serialized it, in order
    /// (format 2: from its `c` lines).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cells: Vec<String>,
}

/// The format [`create`] writes.
pub(crate) const FORMAT: u32 = 2;

/// A line of a format 2 record after the first: one digest, either kind (a line with both,
/// neither or another key is damage).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Line {
    /// A cell's ([`HostRecord::cells`]).
    #[serde(default)]
    c: Option<String>,
    /// A code cell's source ([`HostRecord::code_cells`]).
    #[serde(default)]
    s: Option<String>,
}

/// The digests a record keeps of one file's cells, raw (32 bytes each: what the writer keeps
/// per cell once the cell itself is on disk; hex in the record).
#[derive(Debug, Clone, Default)]
pub(crate) struct FileDigests {
    /// Of each code cell's source ([`source_digest`]).
    pub(crate) code: Vec<[u8; 32]>,
    /// Of each cell's serialized JSON ([`bytes_digest`]).
    pub(crate) cells: Vec<[u8; 32]>,
}

/// SHA-256 of `bytes`, raw.
pub(crate) fn raw_digest(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

/// SHA-256 of `bytes`, hex.
pub(crate) fn bytes_digest(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// How a file's cells compare with what the host wrote ([`check_cells`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CellsCheck {
    /// Byte for byte what the host wrote.
    Same,
    /// These cells (positions in the file's `cells`, from 1) differ from what the host wrote.
    Differ(Vec<usize>),
    /// The file has another number of cells than the host wrote.
    Count { recorded: usize, file: usize },
    /// The file is not in the host's layout (saved by another program), or the record holds no
    /// cell digests: only the code can be checked.
    Unknown,
}

/// The file `file` (a notebook's bytes) against the digests `recorded` of the cells the host
/// wrote. The host writes one cell per line between a fixed head and tail, and a cell's JSON
/// holds no raw newline, so each line is one cell's exact bytes.
pub fn check_cells(recorded: &[String], file: &[u8]) -> CellsCheck {
    if recorded.is_empty() {
        return CellsCheck::Unknown;
    }
    let Some(body) = file.strip_prefix(super::format::HEAD) else {
        return CellsCheck::Unknown;
    };
    let end = b"\n ],\n \"metadata\": ";
    let Some(at) = body.windows(end.len()).position(|w| w == end) else {
        return CellsCheck::Unknown;
    };
    let lines: Vec<&[u8]> = body[..at]
        .split(|b| *b == b'\n')
        .map(|line| line.strip_suffix(b",").unwrap_or(line))
        .collect();
    if !lines
        .iter()
        .all(|l| l.starts_with(b"{") && l.ends_with(b"}"))
    {
        return CellsCheck::Unknown;
    }
    if lines.len() != recorded.len() {
        return CellsCheck::Count {
            recorded: recorded.len(),
            file: lines.len(),
        };
    }
    let differ: Vec<usize> = lines
        .iter()
        .zip(recorded)
        .enumerate()
        .filter(|(_, (line, digest))| bytes_digest(line) != **digest)
        .map(|(i, _)| i + 1)
        .collect();
    if differ.is_empty() {
        CellsCheck::Same
    } else {
        CellsCheck::Differ(differ)
    }
}

/// The record file of notebook file `notebook` (canonical) in `records`.
pub fn record_path(records: &Path, notebook: &Path) -> PathBuf {
    let key = hex(&Sha256::digest(notebook.as_os_str().as_encoded_bytes()));
    records.join(format!("{}.json", &key[..32]))
}

/// The SHA-256 of a code cell's source, as the record holds it.
pub fn source_digest(source: &str) -> String {
    hex(&Sha256::digest(source.as_bytes()))
}

/// A record [`create`] wrote, open for appending: the file, its name, and the records
/// directory it was created in (held open, looked into without following a link).
pub(crate) struct OpenRecord {
    dir: crate::safe_fs::NoFollowDir,
    name: String,
    file: std::fs::File,
}

impl OpenRecord {
    /// Whether the record's name is still this file: not removed, replaced or moved away since.
    pub(crate) fn holds(&self) -> bool {
        self.dir.holds(&self.name, &self.file).unwrap_or(false)
    }

    /// Makes every later append fail, as a full disk or a failing device would: the record is
    /// held open read-only from now on (the same file, so it still [`holds`](Self::holds)).
    #[cfg(test)]
    pub(crate) fn fail_appends(&mut self) {
        use std::os::fd::AsRawFd;
        self.file =
            std::fs::File::open(format!("/proc/self/fd/{}", self.file.as_raw_fd())).unwrap();
    }

    /// Appends a line per digest of `cells` and `code`.
    pub(crate) fn append(&mut self, cells: &[[u8; 32]], code: &[[u8; 32]]) -> std::io::Result<()> {
        use std::io::Write;
        self.file.write_all(&lines(cells, code))
    }
}

/// Writes the record of `header`'s file into `records` (a private directory, created; never
/// through a link), in format 2: `header`'s line (its own lists are not written) and a line per
/// digest of `digests`, replacing any record of that file atomically. Returns it open for
/// [`OpenRecord::append`].
pub(crate) fn create(
    records: &Path,
    header: &HostRecord,
    digests: &FileDigests,
) -> std::io::Result<OpenRecord> {
    let dir = crate::safe_fs::open_private_dir(records)?;
    let path = record_path(records, &header.notebook);
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default()
        .to_string();
    let first = HostRecord {
        format: FORMAT,
        code_cells: Vec::new(),
        cells: Vec::new(),
        ..header.clone()
    };
    let mut bytes = serde_json::to_vec(&first).map_err(std::io::Error::other)?;
    bytes.push(b'\n');
    bytes.extend(lines(&digests.cells, &digests.code));
    let file = dir.rewrite_open(&name, &bytes, 0o600)?;
    Ok(OpenRecord { dir, name, file })
}

/// The lines of `cells`' and `code`'s digests: `{"c":"<hex>"}` and `{"s":"<hex>"}`.
fn lines(cells: &[[u8; 32]], code: &[[u8; 32]]) -> Vec<u8> {
    let mut out = Vec::with_capacity((cells.len() + code.len()) * LINE_BYTES);
    for (key, list) in [(b'c', cells), (b's', code)] {
        for d in list {
            out.extend_from_slice(&[b'{', b'"', key, b'"', b':', b'"']);
            push_hex(&mut out, d);
            out.extend_from_slice(b"\"}\n");
        }
    }
    out
}

/// The length of a digest's line in a format 2 record.
const LINE_BYTES: usize = 73;

/// The host's record of the notebook file at `notebook`, if there is one in `records`.
pub fn lookup(records: &Path, notebook: &Path) -> Result<Option<HostRecord>, LedgerError> {
    let Ok(canonical) = notebook.canonicalize() else {
        return Ok(None);
    };
    let path = record_path(records, &canonical);
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(LedgerError::Read {
                notebook: notebook.to_path_buf(),
                record: path,
                source,
            });
        }
    };
    let record = parse(&bytes).map_err(|source| LedgerError::Damaged {
        notebook: notebook.to_path_buf(),
        record: path.clone(),
        source,
    })?;
    if record.format > FORMAT {
        return Err(LedgerError::Newer {
            notebook: notebook.to_path_buf(),
            record: path,
            format: record.format,
        });
    }
    // A record of another file under the same key prefix: not this file's.
    Ok((record.notebook == canonical).then_some(record))
}

/// A record's bytes: one object (format 1) or its first line and a line per digest (format 2;
/// a last line cut short, by a write that did not finish, is left out).
fn parse(bytes: &[u8]) -> Result<HostRecord, serde_json::Error> {
    let mut values = serde_json::Deserializer::from_slice(bytes).into_iter::<HostRecord>();
    let mut record = match values.next() {
        Some(first) => first?,
        None => return serde_json::from_slice(bytes),
    };
    if record.format < FORMAT {
        return match values.next() {
            None => Ok(record),
            Some(Err(e)) => Err(e),
            Some(Ok(_)) => serde_json::from_slice(bytes),
        };
    }
    let start = values.byte_offset();
    for line in serde_json::Deserializer::from_slice(&bytes[start..]).into_iter::<Line>() {
        match line {
            Ok(Line {
                c: Some(c),
                s: None,
            }) => record.cells.push(c),
            Ok(Line {
                c: None,
                s: Some(s),
            }) => record.code_cells.push(s),
            Ok(_) => {
                return Err(serde::de::Error::custom(
                    "a line with neither or both of `c` and `s`",
                ));
            }
            Err(e) if e.is_eof() => break,
            Err(e) => return Err(e),
        }
    }
    Ok(record)
}

/// How the code cells `sources` (a notebook's, in order) differ from the record's, one line
/// per difference naming the cell (empty: they are the cells that ran).
pub fn compare(recorded: &[String], sources: &[&str]) -> Vec<String> {
    let now: Vec<String> = sources.iter().map(|s| source_digest(s)).collect();
    let ops = align(recorded, &now);
    let mut lines = Vec::new();
    let mut removed: Vec<usize> = Vec::new();
    let mut inserted: Vec<usize> = Vec::new();
    let mut last_match: Option<usize> = None;
    let flush = |removed: &mut Vec<usize>,
                 inserted: &mut Vec<usize>,
                 last: Option<usize>,
                 lines: &mut Vec<String>| {
        let paired = removed.len().min(inserted.len());
        for (r, n) in removed.iter().zip(inserted.iter()).take(paired) {
            lines.push(if r == n {
                format!("cell {} differs from what ran", n + 1)
            } else {
                format!(
                    "cell {} differs from what ran (cell {} of the recording)",
                    n + 1,
                    r + 1
                )
            });
        }
        for n in &inserted[paired..] {
            lines.push(format!("cell {} never ran (inserted)", n + 1));
        }
        for r in &removed[paired..] {
            lines.push(match last {
                Some(n) => format!(
                    "cell {} of the recording ran after cell {} and is gone (removed)",
                    r + 1,
                    n + 1
                ),
                None => format!(
                    "cell {} of the recording ran first and is gone (removed)",
                    r + 1
                ),
            });
        }
        removed.clear();
        inserted.clear();
    };
    for op in ops {
        match op {
            Op::Same(_, n) => {
                flush(&mut removed, &mut inserted, last_match, &mut lines);
                last_match = Some(n);
            }
            Op::Removed(r) => removed.push(r),
            Op::Inserted(n) => inserted.push(n),
        }
    }
    flush(&mut removed, &mut inserted, last_match, &mut lines);
    lines
}

#[derive(Debug, PartialEq)]
enum Op {
    Same(usize, usize),
    Removed(usize),
    Inserted(usize),
}

/// A longest-common-subsequence alignment of `a` and `b` (position by position when both are
/// too long for the table).
fn align(a: &[String], b: &[String]) -> Vec<Op> {
    let (m, n) = (a.len(), b.len());
    if (m + 1).saturating_mul(n + 1) > 16_000_000 {
        let mut ops = Vec::new();
        for i in 0..m.max(n) {
            match (a.get(i), b.get(i)) {
                (Some(x), Some(y)) if x == y => ops.push(Op::Same(i, i)),
                (Some(_), Some(_)) => {
                    ops.push(Op::Removed(i));
                    ops.push(Op::Inserted(i));
                }
                (Some(_), None) => ops.push(Op::Removed(i)),
                (None, Some(_)) => ops.push(Op::Inserted(i)),
                (None, None) => {}
            }
        }
        return ops;
    }
    // lcs[i][j]: the longest common subsequence of a[i..] and b[j..].
    let mut lcs = vec![0u32; (m + 1) * (n + 1)];
    let at = |i: usize, j: usize| i * (n + 1) + j;
    for i in (0..m).rev() {
        for j in (0..n).rev() {
            lcs[at(i, j)] = if a[i] == b[j] {
                lcs[at(i + 1, j + 1)] + 1
            } else {
                lcs[at(i + 1, j)].max(lcs[at(i, j + 1)])
            };
        }
    }
    let (mut i, mut j) = (0, 0);
    let mut ops = Vec::new();
    while i < m || j < n {
        if i < m && j < n && a[i] == b[j] {
            ops.push(Op::Same(i, j));
            i += 1;
            j += 1;
        } else if j < n && (i == m || lcs[at(i, j + 1)] >= lcs[at(i + 1, j)]) {
            ops.push(Op::Inserted(j));
            j += 1;
        } else {
            ops.push(Op::Removed(i));
            i += 1;
        }
    }
    // Within a run of changes, removals first: pairs read "cell N differs".
    ops
}

fn hex(bytes: &[u8]) -> String {
    let mut text = Vec::with_capacity(bytes.len() * 2);
    push_hex(&mut text, bytes);
    String::from_utf8(text).unwrap_or_default()
}

fn push_hex(out: &mut Vec<u8>, bytes: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for b in bytes {
        out.push(DIGITS[usize::from(b >> 4)]);
        out.push(DIGITS[usize::from(b & 0xf)]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn digests(sources: &[&str]) -> Vec<String> {
        sources.iter().map(|s| source_digest(s)).collect()
    }

    #[test]
    fn the_same_cells_compare_equal() {
        assert!(compare(&digests(&["a", "b"]), &["a", "b"]).is_empty());
        assert!(compare(&[], &[]).is_empty());
    }

    #[test]
    fn changed_inserted_and_removed_cells_are_named() {
        let ran = digests(&["a", "b", "c", "d"]);
        assert_eq!(
            compare(&ran, &["a", "B", "c", "d"]),
            ["cell 2 differs from what ran"]
        );
        assert_eq!(
            compare(&ran, &["a", "b", "x", "c", "d"]),
            ["cell 3 never ran (inserted)"]
        );
        assert_eq!(
            compare(&ran, &["a", "c", "d"]),
            ["cell 2 of the recording ran after cell 1 and is gone (removed)"]
        );
        assert_eq!(
            compare(&ran, &["b", "c", "d"]),
            ["cell 1 of the recording ran first and is gone (removed)"]
        );
        // The attack of issue 36: the attack cell removed, a cell that never ran added.
        assert_eq!(
            compare(&ran, &["a", "c", "d", "evil"]),
            [
                "cell 2 of the recording ran after cell 1 and is gone (removed)",
                "cell 4 never ran (inserted)"
            ]
        );
    }

    #[test]
    fn secrets_of_a_policy_are_left_out_and_the_rest_kept() {
        let policy = crate::sandbox::SandboxPolicy::from_value(serde_json::json!({
            "network": {"allowedDomains": ["pypi.org"], "parentProxy": {"url": "http://u:p@proxy:3128"}},
        }))
        .unwrap();
        let c = Confinement::sandboxed(&policy, Some(Path::new("/w/policy.json")));
        assert_eq!(c.left_out, ["network.parentProxy"]);
        let shown = serde_json::to_string(&c).unwrap();
        assert!(!shown.contains("u:p@proxy"), "{shown}");
        assert!(shown.contains("pypi.org"), "{shown}");
        let back = c.sandbox_policy().unwrap();
        assert_eq!(
            back.network.unwrap().allowed_domains,
            ["pypi.org".to_string()]
        );
        assert_eq!(back.filesystem, policy.with_defaults().filesystem);
        let notebook = serde_json::json!({"metadata": {"ipybox": {"confinement": c}}});
        assert_eq!(Confinement::from_metadata(&notebook), Some(c));
    }

    #[test]
    fn records_are_private_and_found_by_the_files_path() {
        use std::os::unix::fs::MetadataExt;
        let t = tempfile::tempdir().unwrap();
        let nb = t.path().join("a.ipynb");
        std::fs::write(&nb, "{}").unwrap();
        let records = t.path().join("records");
        let mut record = HostRecord {
            format: FORMAT,
            notebook: nb.canonicalize().unwrap(),
            session: "s".into(),
            started: "t".into(),
            part: 1,
            confinement: Some(Confinement::unsandboxed("local")),
            code_cells: vec![],
            cells: vec![],
        };
        let code = raw_digest(b"1");
        create(
            &records,
            &record,
            &FileDigests {
                code: vec![code],
                cells: vec![],
            },
        )
        .unwrap();
        record.code_cells = vec![hex(&code)];
        assert_eq!(record.code_cells, digests(&["1"]));
        assert_eq!(std::fs::metadata(&records).unwrap().mode() & 0o777, 0o700);
        let file = record_path(&records, &record.notebook);
        assert_eq!(std::fs::metadata(&file).unwrap().mode() & 0o777, 0o600);
        assert_eq!(lookup(&records, &nb).unwrap(), Some(record));
        // A copy elsewhere has no record.
        let copy = t.path().join("b.ipynb");
        std::fs::copy(&nb, &copy).unwrap();
        assert_eq!(lookup(&records, &copy).unwrap(), None);
        std::fs::write(&file, "{").unwrap();
        let e = lookup(&records, &nb).unwrap_err().to_string();
        assert!(e.contains("is damaged"), "{e}");
    }

    #[test]
    fn a_record_grows_by_appending_and_old_ones_still_read() {
        use std::os::unix::fs::MetadataExt;
        let t = tempfile::tempdir().unwrap();
        let nb = t.path().join("a.ipynb");
        std::fs::write(&nb, "{}").unwrap();
        let records = t.path().join("records");
        let header = HostRecord {
            format: FORMAT,
            notebook: nb.canonicalize().unwrap(),
            session: "s".into(),
            started: "t".into(),
            part: 1,
            confinement: None,
            code_cells: vec![],
            cells: vec![],
        };
        let d = |i: u32| raw_digest(&i.to_le_bytes());
        let mut record = create(
            &records,
            &header,
            &FileDigests {
                code: vec![d(0)],
                cells: vec![d(100)],
            },
        )
        .unwrap();
        let path = record_path(&records, &header.notebook);
        assert!(record.holds());
        let inode = std::fs::metadata(&path).unwrap().ino();
        let len = std::fs::metadata(&path).unwrap().len();
        // A cell more: its two lines appended to the same file, nothing written again.
        record.append(&[d(101)], &[d(1)]).unwrap();
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(meta.ino(), inode);
        assert_eq!(meta.len(), len + 2 * LINE_BYTES as u64);
        for i in 2..50 {
            record.append(&[d(100 + i)], &[d(i)]).unwrap();
        }
        let want = HostRecord {
            code_cells: (0..50).map(|i| hex(&d(i))).collect(),
            cells: (100..150).map(|i| hex(&d(i))).collect(),
            ..header.clone()
        };
        assert_eq!(lookup(&records, &nb).unwrap().as_ref(), Some(&want));
        // A last line cut short (a write that did not finish) is left out; a bad line in the
        // middle is damage.
        let whole = std::fs::read(&path).unwrap();
        std::fs::write(&path, [&whole[..], b"{\"c\":\"ab"].concat()).unwrap();
        assert_eq!(lookup(&records, &nb).unwrap().as_ref(), Some(&want));
        std::fs::write(
            &path,
            [&whole[..], b"{\"c\":\"ab\n{\"c\":\"cd\"}\n"].concat(),
        )
        .unwrap();
        let e = lookup(&records, &nb).unwrap_err().to_string();
        assert!(e.contains("is damaged"), "{e}");
        for bad in [
            &b"{}\n"[..],
            b"{\"x\":\"ab\"}\n",
            b"{\"c\":\"ab\",\"s\":\"cd\"}\n",
        ] {
            std::fs::write(&path, [&whole[..], bad].concat()).unwrap();
            let e = lookup(&records, &nb).unwrap_err().to_string();
            assert!(e.contains("is damaged"), "{e}");
        }
        // A newer format is not read as this one.
        let newer =
            String::from_utf8(whole.clone())
                .unwrap()
                .replacen("\"format\":2", "\"format\":3", 1);
        std::fs::write(&path, newer).unwrap();
        let e = lookup(&records, &nb).unwrap_err().to_string();
        assert!(e.contains("in format 3, newer"), "{e}");
        // The file `create` returned is the record, until it is removed or replaced.
        std::fs::write(&path, &whole).unwrap();
        assert!(record.holds());
        std::fs::remove_file(&path).unwrap();
        std::fs::write(&path, &whole).unwrap();
        assert!(!record.holds());
        // Format 1 (one object, as ipybox wrote before format 2).
        let old = serde_json::json!({
            "format": 1,
            "notebook": header.notebook,
            "session": "s",
            "started": "t",
            "part": 1,
            "confinement": null,
            "code_cells": want.code_cells,
            "cells": want.cells,
        });
        std::fs::write(&path, serde_json::to_vec(&old).unwrap()).unwrap();
        let read = lookup(&records, &nb).unwrap().unwrap();
        assert_eq!(
            (read.format, &read.code_cells, &read.cells),
            (1, &want.code_cells, &want.cells)
        );
    }
}
