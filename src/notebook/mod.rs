//! The session notebook: every cell an executor runs, recorded as a Jupyter notebook
//! (nbformat 4.5) that grows after each cell (in the background), so a person can open it in
//! JupyterLab or VS Code while the agent works and watch it grow; `ipybox replay` runs it again.
//!
//! - [`Notebook`] (here): the recorder one executor owns. Each cell is serialized once when it
//!   ends and held until the background writer appends it to the file: the file is the cells,
//!   one per line, between a fixed head and a tail (the notebook's metadata), and an append
//!   writes the new cells over the old tail and a new tail after them, in one write through
//!   the descriptor that created the file (a part's first write is a new file renamed into
//!   place, never through a link: [`crate::safe_fs`]; the workspace is writable by sandboxed
//!   kernels). Written cells are not kept in memory: the MCP resource reads the current file
//!   back through that descriptor, checked against a digest of what was written
//!   ([`Notebook::read`]). Past [`NotebookConfig::max_file_bytes`] the session goes on in a
//!   new file (`…-2.ipynb`), which bounds a read. Resets and kernel replacements start a new
//!   section (a markdown cell), not a new file.
//! - [`record`]: one cell while it runs (outputs from the execution's events, after ipybox's
//!   caps and the caller's text limit), and its end (status, duration, approval decisions).
//! - [`format`]: the JSON of notebooks, cells and outputs; UTC times.
//! - [`read`]: reading a notebook back for `ipybox replay`, and comparing outputs.
//! - [`ledger`]: the confinement the session ran in (in the notebook's metadata) and the
//!   host's own record of each file it writes (in ipybox's data directory, out of every
//!   kernel's reach), which `ipybox replay` checks a notebook against. Under `--sandbox` the
//!   notebook's directory is not writable by the kernel either ([`crate::sandbox`]).
//!
//! Nothing here reads secrets: a cell holds its code, what it printed (as capped for the
//! caller) and the tool calls' arguments as the kernel sent them; the registered servers'
//! `${VAR}`-resolved params are never arguments. A finished cell is redacted
//! ([`crate::redact`]) before it is kept, so neither the file nor the resource holds a secret
//! ipybox knows. Not here: when cells begin and end (the
//! executor), where the MCP server serves notebooks from.

pub(crate) mod format;
pub mod ledger;
pub mod read;
pub(crate) mod record;
mod writer;

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::SystemTime;

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

pub(crate) use record::{CellRecord, Ending};
pub use record::{MAX_CELL_TEXT_CHARS, MAX_RECORDED_ARGUMENT_BYTES, MAX_RECORDED_CALLS, Status};

use crate::tools::CallRecord;

/// The `.gitignore` a notebook directory gets ([`NotebookConfig::gitignore`]).
pub const GITIGNORE: &[u8] = b"# Made by ipybox: session notebooks hold what cells printed; keep them out of git.\n# Remove this file, or run ipybox with --no-notebook-gitignore, to commit them.\n*\n";

/// Default [`NotebookConfig::max_file_bytes`]: 16 MiB.
pub const DEFAULT_MAX_FILE_BYTES: usize = 16 << 20;

/// A host's say over the bytes of a notebook's files (e.g. a quota per tenant), asked around
/// each write of a file: the boundary between the writer and whoever accounts for the disk.
pub trait NotebookBudget: Send + Sync + std::fmt::Debug {
    /// File `name` (in the notebook's directory) of the notebook of session `tag` is about to
    /// be written to `bytes` bytes in all (an append or a new file): `Ok` to write it,
    /// `Err(why)` to leave the file as it is (the cells are not recorded; `why` is logged once).
    fn admit(&self, tag: &str, name: &str, bytes: u64) -> Result<(), String>;

    /// File `name` was written (appended to, or renamed into place) after its admission.
    fn written(&self, tag: &str, name: &str) {
        let _ = (tag, name);
    }
}

/// Where and how an executor records its notebook.
#[derive(Debug, Clone)]
pub struct NotebookConfig {
    dir: Option<PathBuf>,
    tag: Option<String>,
    private: bool,
    max_file_bytes: usize,
    budget: Option<Arc<dyn NotebookBudget>>,
    gitignore: bool,
}

impl NotebookConfig {
    /// Files in `dir` (created if missing; relative: to the workspace), one per session, named
    /// `<UTC start time>-<session tag>.ipynb`.
    pub fn in_dir(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: Some(dir.into()),
            tag: None,
            private: false,
            max_file_bytes: DEFAULT_MAX_FILE_BYTES,
            budget: None,
            gitignore: true,
        }
    }

    /// No file: the notebook is kept in memory only ([`Notebook::read`]; one file part, at
    /// most [`NotebookConfig::max_file_bytes`]).
    pub fn in_memory() -> Self {
        Self {
            dir: None,
            ..Self::in_dir("")
        }
    }

    /// The session's tag in the file name and the notebook's metadata (letters, digits, `-`
    /// and `_`, at most 32; other characters become `_`). Default: 8 random hex digits.
    pub fn tag(mut self, tag: impl Into<String>) -> Self {
        self.tag = Some(tag.into());
        self
    }

    /// Private files (0600) in a private directory (0700, narrowed if it exists wider): a host
    /// directory of the HTTP service, readable by ipybox's user only. Default: 0644 files in a
    /// 0755 directory, as the workspace's other files.
    pub fn private(mut self, private: bool) -> Self {
        self.private = private;
        self
    }

    /// Whether the directory gets a `.gitignore` holding `*` (made once, where none is; default
    /// on; never for [`NotebookConfig::private`] host directories), so that notebooks in a
    /// workspace that is a git repository are not committed by accident.
    pub fn gitignore(mut self, gitignore: bool) -> Self {
        self.gitignore = gitignore;
        self
    }

    /// The largest file before the session goes on in a new one (`<name>-2.ipynb`, ...);
    /// default [`DEFAULT_MAX_FILE_BYTES`]. A single cell larger than this gets a file of its own.
    pub fn max_file_bytes(mut self, bytes: usize) -> Self {
        self.max_file_bytes = bytes.max(1);
        self
    }

    /// Every write of a file asks `budget` first ([`NotebookBudget`]). Default: none.
    pub fn budget(mut self, budget: Arc<dyn NotebookBudget>) -> Self {
        self.budget = Some(budget);
        self
    }

    /// The directory, if any, taken relative to `base` when relative.
    pub(crate) fn resolved(mut self, base: &Path) -> Self {
        if let Some(dir) = self.dir.take() {
            self.dir = Some(if dir.is_absolute() {
                dir
            } else {
                base.join(dir)
            });
        }
        self
    }
}

/// Why a new section starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Section {
    /// `reset()`: a fresh kernel.
    Reset,
    /// The kernel of the cell before was replaced (it died, or did not stop when interrupted).
    KernelReplaced(Status),
    /// The executor was stopped and started again.
    Restarted,
    /// A session snapshot was restored (`CodeExecutor::restore`): a fresh kernel, unless none
    /// had run code, with the snapshot's names loaded (recorded even before any cell: the names
    /// come from elsewhere; `ipybox replay` resets there, it cannot restore).
    Restored,
}

/// The most bytes of cells a notebook holds in memory waiting for their file (8 MiB): past it
/// (the file cannot be written, or the disk is far behind) the oldest waiting cells are dropped
/// and the drop is logged. Cells on disk are never held.
pub const MAX_PENDING_BYTES: usize = 8 << 20;

/// The notebook of one executor's session (see the module docs). Every method is safe to call
/// from any task; clones share the notebook.
///
/// A cell ends in memory at once; a background task (a blocking one of the tokio runtime, else
/// a thread) appends it to the file, so the caller's result never waits for the disk. Cells
/// that end while a write runs are appended together by the next one. A cell written is no
/// longer held: the memory of a notebook is the cells not yet written (at most
/// [`MAX_PENDING_BYTES`]), the last code cell, and 64 bytes of digests per cell of the current
/// file (for the host record). [`Notebook::flush`] waits for the file to hold everything;
/// [`Notebook::read`] reads the notebook back from the file.
#[derive(Debug, Clone)]
pub struct Notebook(Arc<Shared>);

#[derive(Debug)]
struct Shared {
    dir: Option<PathBuf>,
    private: bool,
    max_file_bytes: usize,
    budget: Option<Arc<dyn NotebookBudget>>,
    /// Whether the directory gets a `.gitignore`, and whether this notebook made sure it has.
    gitignore: bool,
    gitignore_done: std::sync::atomic::AtomicBool,
    tag: String,
    started: SystemTime,
    /// How the session's kernels are confined (set when the executor starts).
    confinement: OnceLock<ledger::Confinement>,
    /// Where the host records of the files go (`<data dir>/notebook-records`), if anywhere.
    records: OnceLock<PathBuf>,
    /// The directory's canonical path (the records' key), once known.
    canonical_dir: OnceLock<PathBuf>,
    state: Mutex<State>,
    /// Signalled when a write ends.
    written: Condvar,
    /// The file being written, held while it is written or read back. Taken before `state`
    /// when both are (the caller's path takes `state` only: it never waits for the disk).
    disk: Mutex<Option<OpenFile>>,
}

/// A cell not yet in its file.
#[derive(Debug)]
struct Pending {
    /// The file it goes to.
    part: u32,
    bytes: Arc<[u8]>,
    /// The digest of its source, when it is a code cell (for the host record).
    code: Option<[u8; 32]>,
}

#[derive(Debug, Default)]
struct State {
    /// The current file's number (1, then 2, ... past the size limit).
    part: u32,
    /// The size and number of the current file's cells, written or not.
    bytes: usize,
    cells: usize,
    /// Cells not yet written, oldest first, and their size.
    pending: VecDeque<Pending>,
    pending_bytes: usize,
    /// Cells dropped unwritten since the last drop was logged.
    lost: usize,
    /// The last code cell recorded.
    last_code: Option<Arc<[u8]>>,
    /// Whether a background write runs (it goes on until the file holds every cell).
    writing: bool,
    /// The last execution count of the current section.
    count: u32,
    next_id: u64,
    /// Code cells since the last section began.
    since_section: usize,
    /// The last write error logged (the same one is not logged again).
    failing: Option<String>,
    /// Cells whose result went to the caller before the notebook got them ([`Expected`]).
    expected: usize,
    /// When the last write ended (writes are at least [`WRITE_INTERVAL`] apart).
    last_write: Option<std::time::Instant>,
}

/// The least time between two writes of a notebook: cells that end within it are appended
/// together (one write, one host record), so a burst of small cells costs the disk and the
/// other core a write per 20 ms, not one per cell. The file follows the cells by at most this
/// (plus the write); [`Notebook::read`] serves the cells not yet written from memory.
pub const WRITE_INTERVAL: std::time::Duration = std::time::Duration::from_millis(20);

/// A cell the notebook is about to get, its result sent first ([`Notebook::expect`]): until
/// this is dropped, [`Notebook::read`] waits (a caller that got the result and reads the
/// notebook finds the cell).
pub(crate) struct Expected(Notebook);

impl Drop for Expected {
    fn drop(&mut self) {
        self.0.lock().expected -= 1;
        self.0.0.written.notify_all();
    }
}

/// The longest [`Notebook::read`] waits for an [`Expected`] cell.
const EXPECTED_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// The file being written, through the descriptor that created it: appended to in place (its
/// cells never move; the tail after them is written again with each append), read back for
/// the resource, and checked against what was written.
struct OpenFile {
    part: u32,
    file: std::fs::File,
    /// Where the tail begins: the end of the last cell.
    body_end: u64,
    /// The file's length.
    len: u64,
    /// The digests of its cells, for the host record.
    digests: ledger::FileDigests,
    /// The host record as written so far, when it is (see [`Shared::write_record`]).
    record: Option<RecordFile>,
    /// SHA-256 over bytes `0..body_end` as written.
    body: Sha256,
}

/// A host record ([`ledger::create`]) open for appending, and what it holds.
struct RecordFile {
    record: ledger::OpenRecord,
    /// How many of the file's cell and code digests it holds.
    cells: usize,
    code: usize,
}

impl std::fmt::Debug for OpenFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenFile")
            .field("part", &self.part)
            .field("body_end", &self.body_end)
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

impl OpenFile {
    /// The file's cells as written (its bytes up to the tail), read through the descriptor:
    /// an error if they are no longer what ipybox wrote.
    fn body(&self, path: &Path) -> std::io::Result<Vec<u8>> {
        use std::os::unix::fs::FileExt;
        let len = usize::try_from(self.body_end).map_err(std::io::Error::other)?;
        let mut bytes = vec![0; len];
        self.file.read_exact_at(&mut bytes, 0).map_err(|e| {
            std::io::Error::new(e.kind(), format!("reading {} back: {e}", path.display()))
        })?;
        if Sha256::digest(&bytes) != self.body.clone().finalize() {
            return Err(std::io::Error::other(format!(
                "{} was changed behind ipybox: its cells are no longer those recorded, so it is not served\n  help: the session goes on recording into it; its next part (past the file size limit) is served again, and `ipybox replay` names the cells that differ from the host's record",
                path.display()
            )));
        }
        Ok(bytes)
    }
}

/// Why a write did not happen.
enum WriteError {
    /// The budget refused it: the cells are not recorded.
    Refused(String),
    Io(std::io::Error),
}

impl From<std::io::Error> for WriteError {
    fn from(e: std::io::Error) -> Self {
        Self::Io(e)
    }
}

impl Notebook {
    pub(crate) fn new(config: NotebookConfig) -> Self {
        let tag = match config.tag {
            Some(tag) => sanitize(&tag),
            None => format!("{:08x}", rand::random::<u32>()),
        };
        let notebook = Self(Arc::new(Shared {
            dir: config.dir,
            private: config.private,
            max_file_bytes: config.max_file_bytes,
            budget: config.budget,
            gitignore: config.gitignore,
            gitignore_done: std::sync::atomic::AtomicBool::new(false),
            tag,
            started: SystemTime::now(),
            confinement: OnceLock::new(),
            records: OnceLock::new(),
            canonical_dir: OnceLock::new(),
            state: Mutex::default(),
            written: Condvar::new(),
            disk: Mutex::default(),
        }));
        {
            let mut state = notebook.lock();
            notebook.start_part(&mut state, None);
        }
        notebook
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.0.lock()
    }

    /// Waits until the file holds every cell recorded so far, those whose result went out
    /// before the notebook got them included (returns at once when nothing is being written,
    /// or the notebook has no file).
    pub fn flush(&self) {
        let mut state = self.settled();
        while state.writing {
            state = self
                .0
                .written
                .wait(state)
                .unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Records how the session's kernels are confined (in the metadata of the files written
    /// from now on) and that the host keeps its own record of each file in `records` (see
    /// [`ledger`]). The first call counts.
    pub(crate) fn set_confinement(
        &self,
        confinement: ledger::Confinement,
        records: Option<PathBuf>,
    ) {
        let _ = self.0.confinement.set(confinement);
        if let Some(records) = records {
            let _ = self.0.records.set(records);
        }
    }

    /// The directory of the files, if the notebook has files.
    pub(crate) fn dir(&self) -> Option<&Path> {
        self.0.dir.as_deref()
    }

    /// The session's tag (in the file name, the metadata, and the MCP resource's URI).
    pub fn tag(&self) -> &str {
        &self.0.tag
    }

    /// The file being written now (`None` when the notebook is kept in memory only). It exists
    /// once the first cell has ended.
    pub fn path(&self) -> Option<PathBuf> {
        let part = self.lock().part;
        Some(self.0.dir.as_ref()?.join(self.0.file_name(part)))
    }

    /// The notebook as it is now (the current file's content): the cells waiting for the
    /// writer are appended first, then the file's cells are read back through the descriptor
    /// that wrote them (never through the name) and checked against what was written; cells
    /// that could not be written follow from memory, then the tail. At most the file's size
    /// limit, or one cell more. Blocking: call it off the async runtime's workers.
    pub fn read(&self) -> std::io::Result<Vec<u8>> {
        drop(self.settled());
        let mut disk = self.0.disk();
        // The cells waiting for the writer go to the file first (the file is what is served:
        // a reader sees the same bytes there).
        if self.0.dir.is_some() {
            self.0.write_pending(&mut disk, false);
        }
        let (part, pending) = {
            let state = self.lock();
            let pending: Vec<Arc<[u8]>> = state
                .pending
                .iter()
                .filter(|p| p.part == state.part)
                .map(|p| p.bytes.clone())
                .collect();
            (state.part, pending)
        };
        let mut bytes = match disk.as_ref().filter(|f| f.part == part) {
            Some(open) => {
                let path = self
                    .0
                    .dir
                    .as_deref()
                    .unwrap_or(Path::new(""))
                    .join(self.0.file_name(part));
                open.body(&path)?
            }
            None => format::HEAD.to_vec(),
        };
        drop(disk);
        for cell in pending {
            if bytes.len() > format::HEAD.len() {
                bytes.extend_from_slice(b",\n");
            }
            bytes.extend_from_slice(&cell);
        }
        bytes.extend_from_slice(&self.0.tail(part));
        Ok(bytes)
    }

    /// The state once no [`Expected`] cell is outstanding (waiting at most [`EXPECTED_WAIT`]).
    fn settled(&self) -> MutexGuard<'_, State> {
        let until = std::time::Instant::now() + EXPECTED_WAIT;
        let mut state = self.lock();
        while state.expected > 0 {
            let left = until.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                break;
            }
            state = self
                .0
                .written
                .wait_timeout(state, left)
                .map_or_else(|p| p.into_inner().0, |(s, _)| s);
        }
        state
    }

    /// A cell is about to be recorded after its result goes to the caller: reads wait for it
    /// until the returned guard is dropped.
    pub(crate) fn expect(&self) -> Expected {
        self.lock().expected += 1;
        Expected(self.clone())
    }

    /// The last code cell recorded, if any.
    pub fn last_code_cell(&self) -> Option<Value> {
        let last = self.settled().last_code.clone()?;
        serde_json::from_slice(&last).ok()
    }

    /// The bytes of cells held in memory waiting for the file (for tests and benchmarks).
    pub fn pending_bytes(&self) -> usize {
        self.lock().pending_bytes
    }

    fn next_id(state: &mut State) -> String {
        state.next_id += 1;
        format!("ipybox-{}", state.next_id)
    }

    /// Begins file `part + 1` with its header cell.
    fn start_part(&self, state: &mut State, previous: Option<String>) {
        state.part += 1;
        state.bytes = 0;
        state.cells = 0;
        if self.0.dir.is_none() {
            // In memory only: nothing will write the earlier file's cells.
            state.pending.clear();
            state.pending_bytes = 0;
        }
        let started = format::utc(self.0.started)
            .replace('T', " ")
            .replace('Z', " UTC");
        let mut text = format!(
            "**ipybox session `{}`**, started {started}. Each code cell below is one execution, recorded when it ended; its `ipybox` metadata holds its status, duration, timeout and the tool calls and shell commands it made, with the approval asked and the answer.",
            self.0.tag
        );
        let mut meta = json!({"section": "start"});
        if let Some(previous) = previous {
            text.push_str(&format!(
                "\n\nContinued from `{previous}`, which reached its size limit."
            ));
            meta["continued_from"] = previous.into();
        }
        let id = Self::next_id(state);
        let cell = format::markdown_cell(&id, &text, meta);
        self.push_bytes(state, serde_json::to_vec(&cell).unwrap_or_default(), None);
    }

    /// Adds a cell's bytes to the current file's, waiting for the writer (the oldest waiting
    /// are dropped past [`MAX_PENDING_BYTES`]).
    fn push_bytes(&self, state: &mut State, bytes: Vec<u8>, code: Option<[u8; 32]>) {
        state.bytes += bytes.len() + 2;
        state.cells += 1;
        state.pending_bytes += bytes.len();
        let bytes: Arc<[u8]> = bytes.into();
        if code.is_some() {
            state.last_code = Some(bytes.clone());
        }
        state.pending.push_back(Pending {
            part: state.part,
            bytes,
            code,
        });
        if self.0.dir.is_some() {
            self.0.bound_pending(state);
        }
    }

    /// Adds `cell`, going on in a new file first if it would not fit in this one.
    fn push_sized(&self, state: &mut State, cell: &Value) {
        let bytes = serde_json::to_vec(cell).unwrap_or_default();
        if state.cells > 1 && state.bytes + bytes.len() > self.0.max_file_bytes {
            let previous = self.0.file_name(state.part);
            self.start_part(state, Some(previous));
        }
        let code = (cell["cell_type"] == "code")
            .then(|| ledger::raw_digest(cell["source"].as_str().unwrap_or_default().as_bytes()));
        self.push_bytes(state, bytes, code);
    }

    /// Records a cell that ended (`ending`) after the approval decisions in `calls`, and
    /// writes the file.
    pub(crate) fn finish(&self, record: CellRecord, ending: &Ending, calls: Vec<CallRecord>) {
        let mut state = self.lock();
        state.count += 1;
        let id = Self::next_id(&mut state);
        let mut done = record.finish(&id, state.count, ending, calls);
        // Before the cell is kept anywhere: no secret in the file, the resource or a copy.
        crate::redact::redact_json(&mut done.cell);
        self.push_sized(&mut state, &done.cell);
        state.since_section += 1;
        if done.kernel_replaced {
            self.push_section(&mut state, Section::KernelReplaced(done.status));
        }
        self.write(&mut state);
    }

    /// Starts a new section (a markdown cell) when cells were recorded since the last one.
    pub(crate) fn section(&self, why: Section) {
        let mut state = self.lock();
        if self.push_section(&mut state, why) {
            self.write(&mut state);
        }
    }

    fn push_section(&self, state: &mut State, why: Section) -> bool {
        if state.since_section == 0 && why != Section::Restored {
            return false;
        }
        let at = format::utc_clock(SystemTime::now());
        let (kind, text) = match why {
            Section::Reset => (
                "reset",
                format!(
                    "---\n**Kernel reset** ({at}): a fresh kernel runs the cells below; variables, imports and definitions from above are gone."
                ),
            ),
            Section::KernelReplaced(status) => (
                "kernel replaced",
                format!(
                    "---\n**New kernel** ({at}): the kernel of the cell above was replaced ({}); variables, imports and definitions from above are gone.",
                    match status {
                        Status::TimedOut => "it did not stop when interrupted",
                        _ => "it died",
                    }
                ),
            ),
            Section::Restarted => (
                "restarted",
                format!(
                    "---\n**Kernel started again** ({at}): the executor was stopped and started; variables, imports and definitions from above are gone."
                ),
            ),
            Section::Restored => (
                "restored",
                format!(
                    "---\n**Snapshot restored** ({at}): the cells below run in a kernel that got the names of a session snapshot, not the state built above (`ipybox replay` starts a fresh kernel here)."
                ),
            ),
        };
        let id = Self::next_id(state);
        self.push_sized(
            state,
            &format::markdown_cell(&id, &text, json!({"section": kind})),
        );
        state.since_section = 0;
        state.count = 0;
        true
    }

    /// Notes that `spec` was installed into the kernel's environment (between cells).
    pub(crate) fn note_install(&self, spec: &str) {
        let mut state = self.lock();
        let id = Self::next_id(&mut state);
        let text = format!(
            "`install_package({})`: installed into the kernel's environment.",
            serde_json::to_string(spec).unwrap_or_default()
        );
        self.push_sized(
            &mut state,
            &format::markdown_cell(&id, &text, json!({"installed": spec})),
        );
        self.write(&mut state);
    }

    /// Has the cells written in the background (see [`Notebook`]).
    fn write(&self, state: &mut State) {
        if self.0.dir.is_none() || state.writing || state.pending.is_empty() {
            return;
        }
        state.writing = true;
        let writer = writer::Writer(self.0.clone(), false);
        let work = move || writer.run();
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn_blocking(work)),
            Err(_) => drop(std::thread::spawn(work)),
        }
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn disk(&self) -> MutexGuard<'_, Option<OpenFile>> {
        self.disk.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn file_name(&self, part: u32) -> String {
        let stem = format!("{}-{}", format::utc_for_file(self.started), self.tag);
        match part {
            1 => format!("{stem}.ipynb"),
            n => format!("{stem}-{n}.ipynb"),
        }
    }

    /// The tail of file `part`: its metadata, as known now.
    fn tail(&self, part: u32) -> Vec<u8> {
        format::tail(&format::notebook_metadata(
            &self.tag,
            &format::utc(self.started),
            part,
            self.confinement.get(),
        ))
    }

    /// Drops the oldest waiting cells past [`MAX_PENDING_BYTES`] (one cell always stays), and
    /// logs it once per burst.
    fn bound_pending(&self, state: &mut State) {
        let mut dropped = 0;
        while state.pending_bytes > MAX_PENDING_BYTES && state.pending.len() > 1 {
            if let Some(old) = state.pending.pop_front() {
                state.pending_bytes -= old.bytes.len();
                dropped += 1;
            }
        }
        if dropped > 0 {
            if state.lost == 0 {
                tracing::warn!(
                    session = %self.tag,
                    "session notebook: cells are dropped unwritten: {} bytes of them wait for the file, the most a notebook holds in memory (last write error: {})",
                    MAX_PENDING_BYTES,
                    state.failing.as_deref().unwrap_or("none: the disk is behind")
                );
            }
            state.lost += dropped;
        }
    }
}

/// `tag` made safe for a file name: letters, digits, `-`, `_`; at most 32 characters.
fn sanitize(tag: &str) -> String {
    let clean: String = tag
        .chars()
        .take(32)
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if clean.is_empty() {
        "session".into()
    } else {
        clean
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::{ExecEvent, Source};

    fn run(notebook: &Notebook, code: &str, text: &str) {
        let mut cell = CellRecord::new(code, None, None);
        cell.observe(&ExecEvent::Output(Source::Stdout, text.into()));
        notebook.finish(cell, &Ending::Ok, vec![]);
        notebook.flush();
    }

    fn parse(bytes: &[u8]) -> Value {
        serde_json::from_slice(bytes).expect("the notebook is JSON")
    }

    #[test]
    fn cells_sections_and_counts() {
        let t = tempfile::tempdir().unwrap();
        let notebook = Notebook::new(NotebookConfig::in_dir(t.path().join("nb")).tag("s/1"));
        assert_eq!(notebook.tag(), "s_1");
        // Nothing ran yet: a reset starts no section.
        notebook.section(Section::Reset);
        run(&notebook, "print(1)", "1\n");
        run(&notebook, "print(2)", "2\n");
        notebook.section(Section::Reset);
        notebook.section(Section::Reset);
        run(&notebook, "print(3)", "3\n");
        let path = notebook.path().unwrap();
        assert!(
            path.file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .ends_with("-s_1.ipynb")
        );
        let on_disk = std::fs::read(&path).unwrap();
        assert_eq!(on_disk, notebook.read().unwrap());
        assert_eq!(notebook.pending_bytes(), 0, "a written cell is not held");
        let nb = parse(&on_disk);
        let cells = nb["cells"].as_array().unwrap();
        let kinds: Vec<(&str, Value)> = cells
            .iter()
            .map(|c| {
                (
                    c["cell_type"].as_str().unwrap(),
                    c.get("execution_count").cloned().unwrap_or_default(),
                )
            })
            .collect();
        assert_eq!(
            kinds,
            [
                ("markdown", Value::Null),
                ("code", 1.into()),
                ("code", 2.into()),
                ("markdown", Value::Null),
                ("code", 1.into()),
            ]
        );
        assert_eq!(cells[3]["metadata"]["ipybox"]["section"], "reset");
        assert_eq!(notebook.last_code_cell().unwrap()["source"], "print(3)");
        let ids: std::collections::HashSet<&str> =
            cells.iter().map(|c| c["id"].as_str().unwrap()).collect();
        assert_eq!(ids.len(), cells.len(), "cell ids are unique");
    }

    #[test]
    fn past_the_size_limit_the_session_goes_on_in_a_new_file() {
        let t = tempfile::tempdir().unwrap();
        let records = t.path().join("records");
        let notebook = Notebook::new(
            NotebookConfig::in_dir(t.path().join("nb"))
                .tag("big")
                .max_file_bytes(2500),
        );
        notebook.set_confinement(
            ledger::Confinement::unsandboxed("local"),
            Some(records.clone()),
        );
        let first = notebook.path().unwrap();
        for i in 0..4 {
            run(&notebook, &format!("print({i})"), &"x".repeat(700));
        }
        let now = notebook.path().unwrap();
        assert_ne!(first, now);
        assert!(
            now.to_str().unwrap().ends_with("-big-2.ipynb"),
            "{}",
            now.display()
        );
        let old = parse(&std::fs::read(&first).unwrap());
        let new = parse(&std::fs::read(&now).unwrap());
        assert_eq!(
            old["cells"].as_array().unwrap().len(),
            3,
            "header + 2 cells"
        );
        assert_eq!(new["metadata"]["ipybox"]["part"], 2);
        assert_eq!(
            new["cells"][0]["metadata"]["ipybox"]["continued_from"],
            first.file_name().unwrap().to_str().unwrap()
        );
        assert_eq!(new["cells"][1]["execution_count"], 3, "counts go on");
        // Each file has its own host record, of its own cells.
        for (path, part, code) in [(&first, 1, [0, 1]), (&now, 2, [2, 3])] {
            let record = ledger::lookup(&records, path).unwrap().expect("a record");
            assert_eq!(record.part, part);
            let want: Vec<String> = code
                .iter()
                .map(|i| ledger::source_digest(&format!("print({i})")))
                .collect();
            assert_eq!(record.code_cells, want);
            assert_eq!(
                ledger::check_cells(&record.cells, &std::fs::read(path).unwrap()),
                ledger::CellsCheck::Same
            );
        }
    }

    #[test]
    fn a_link_in_place_of_the_file_is_replaced_not_followed() {
        let t = tempfile::tempdir().unwrap();
        let outside = t.path().join("outside");
        std::fs::write(&outside, "precious").unwrap();
        let dir = t.path().join("nb");
        let notebook = Notebook::new(NotebookConfig::in_dir(&dir));
        std::fs::create_dir(&dir).unwrap();
        let path = notebook.path().unwrap();
        std::os::unix::fs::symlink(&outside, &path).unwrap();
        run(&notebook, "print(1)", "1\n");
        assert_eq!(std::fs::read_to_string(&outside).unwrap(), "precious");
        assert!(std::fs::symlink_metadata(&path).unwrap().is_file());
        // A link in place of the directory: nothing is written (through it or anywhere).
        let moved = t.path().join("moved");
        std::fs::rename(&dir, &moved).unwrap();
        let target = t.path().join("target");
        std::fs::create_dir(&target).unwrap();
        std::os::unix::fs::symlink(&target, &dir).unwrap();
        run(&notebook, "print(2)", "2\n");
        assert_eq!(std::fs::read_dir(&target).unwrap().count(), 0);
        assert_eq!(notebook.last_code_cell().unwrap()["source"], "print(2)");
    }

    /// A notebook in `dir` whose host keeps records (in `dir/records`), after a first cell
    /// `print(1)`: the notebook, the records directory, the file, and its record.
    fn recorded(dir: &Path, tag: &str) -> (Notebook, PathBuf, PathBuf, PathBuf) {
        let records = dir.join("records");
        let notebook = Notebook::new(NotebookConfig::in_dir(dir.join("nb")).tag(tag));
        notebook.set_confinement(
            ledger::Confinement::unsandboxed("local"),
            Some(records.clone()),
        );
        run(&notebook, "print(1)", "1\n");
        let path = notebook.path().unwrap();
        let record_file = ledger::record_path(&records, &path.canonicalize().unwrap());
        (notebook, records, path, record_file)
    }

    fn inode(path: &Path) -> u64 {
        std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(path).unwrap())
    }

    #[test]
    fn the_host_keeps_a_record_of_each_file() {
        let t = tempfile::tempdir().unwrap();
        let (notebook, records, path, record_file) = recorded(t.path(), "rec");
        let first = inode(&record_file);
        run(&notebook, "print(2)", "2\n");
        // The second cell's digests were appended to the record, not the record written anew.
        assert_eq!(inode(&record_file), first);
        let record = ledger::lookup(&records, &path).unwrap().expect("a record");
        assert_eq!(
            record.code_cells,
            [
                ledger::source_digest("print(1)"),
                ledger::source_digest("print(2)")
            ]
        );
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(
            ledger::check_cells(&record.cells, &bytes),
            ledger::CellsCheck::Same
        );
        // An output changed in place: that cell is named; a file saved by another program
        // (another layout) cannot be checked beyond its code.
        let edited = String::from_utf8(bytes.clone())
            .unwrap()
            .replace("2\\n", "3\\n");
        assert_eq!(
            ledger::check_cells(&record.cells, edited.as_bytes()),
            ledger::CellsCheck::Differ(vec![3])
        );
        let nb: Value = serde_json::from_slice(&bytes).unwrap();
        let resaved = serde_json::to_vec_pretty(&nb).unwrap();
        assert_eq!(
            ledger::check_cells(&record.cells, &resaved),
            ledger::CellsCheck::Unknown
        );
        assert_eq!(
            record.confinement,
            Some(ledger::Confinement::unsandboxed("local"))
        );
        assert_eq!(record.session, "rec");
        let nb = parse(&std::fs::read(&path).unwrap());
        assert_eq!(nb["metadata"]["ipybox"]["confinement"]["kernel"], "local");
        // A record removed meanwhile (a retention sweep) is written anew, whole, by the next
        // cell.
        std::fs::remove_file(&record_file).unwrap();
        run(&notebook, "1 + 1", "2");
        let again = ledger::lookup(&records, &path).unwrap().expect("a record");
        assert_eq!(again.code_cells[..2], record.code_cells[..]);
        assert_eq!(again.code_cells[2], ledger::source_digest("1 + 1"));
        assert_eq!(
            ledger::check_cells(&again.cells, &std::fs::read(&path).unwrap()),
            ledger::CellsCheck::Same
        );
    }

    #[test]
    fn a_record_whose_append_failed_is_written_anew_by_the_next_cell() {
        let t = tempfile::tempdir().unwrap();
        let (notebook, records, path, record_file) = recorded(t.path(), "full");
        let first = inode(&record_file);
        let digests = |n: usize| -> Vec<String> {
            (1..=n)
                .map(|i| ledger::source_digest(&format!("print({i})")))
                .collect()
        };
        let fail_appends = || {
            let mut disk = notebook.0.disk();
            let open = disk.as_mut().expect("the file is open");
            open.record
                .as_mut()
                .expect("a record")
                .record
                .fail_appends();
        };
        // The append of cell 2 fails (logged): the cell is in the notebook, the record still
        // holds one cell, nothing half-written.
        fail_appends();
        run(&notebook, "print(2)", "2\n");
        let record = ledger::lookup(&records, &path).unwrap().expect("a record");
        assert_eq!(record.code_cells, digests(1));
        assert_eq!(inode(&record_file), first);
        // The next cell's write does not append again after a failure: the record is written
        // anew, whole, and matches the file.
        run(&notebook, "print(3)", "3\n");
        let record = ledger::lookup(&records, &path).unwrap().expect("a record");
        assert_eq!(record.code_cells, digests(3));
        assert_ne!(inode(&record_file), first);
        assert_eq!(
            ledger::check_cells(&record.cells, &std::fs::read(&path).unwrap()),
            ledger::CellsCheck::Same
        );
        // And appends again from there.
        let rewritten = inode(&record_file);
        run(&notebook, "print(4)", "4\n");
        assert_eq!(inode(&record_file), rewritten);
        let record = ledger::lookup(&records, &path).unwrap().expect("a record");
        assert_eq!(record.code_cells, digests(4));
    }

    #[test]
    fn a_written_cell_is_not_held_in_memory() {
        let t = tempfile::tempdir().unwrap();
        let big = "x".repeat(64 << 10);
        let on_disk = Notebook::new(NotebookConfig::in_dir(t.path()).tag("disk"));
        // The control: the same cells with no file to go to stay in memory.
        let in_memory = Notebook::new(NotebookConfig::in_memory().tag("mem"));
        for i in 0..40 {
            run(&on_disk, &format!("print({i})"), &big);
            run(&in_memory, &format!("print({i})"), &big);
        }
        assert_eq!(on_disk.pending_bytes(), 0);
        assert!(
            in_memory.pending_bytes() > 40 * big.len(),
            "{}",
            in_memory.pending_bytes()
        );
        // Both read the same cells: one from the file, one from memory.
        let file = std::fs::read(on_disk.path().unwrap()).unwrap();
        assert_eq!(file, on_disk.read().unwrap());
        for bytes in [file, in_memory.read().unwrap()] {
            let nb = parse(&bytes);
            let cells = nb["cells"].as_array().unwrap();
            assert_eq!(cells.len(), 41);
            assert_eq!(cells[40]["source"], "print(39)");
            assert_eq!(
                cells[40]["outputs"][0]["text"].as_str().unwrap().len(),
                big.len()
            );
        }
        assert_eq!(on_disk.last_code_cell().unwrap()["source"], "print(39)");
    }

    #[test]
    fn cells_are_appended_in_place_and_read_back_as_written() {
        use std::os::unix::fs::MetadataExt;
        let t = tempfile::tempdir().unwrap();
        let notebook = Notebook::new(NotebookConfig::in_dir(t.path()).tag("app"));
        run(&notebook, "print(1)", "1\n");
        let path = notebook.path().unwrap();
        let inode = std::fs::metadata(&path).unwrap().ino();
        run(&notebook, "print(2)", "2\n");
        assert_eq!(
            std::fs::metadata(&path).unwrap().ino(),
            inode,
            "appended in place"
        );
        assert_eq!(
            parse(&notebook.read().unwrap())["cells"]
                .as_array()
                .unwrap()
                .len(),
            3
        );
        // The file removed behind ipybox: the next cell brings back a whole file (what was
        // written, copied through the open descriptor, and the new cell).
        std::fs::remove_file(&path).unwrap();
        run(&notebook, "print(3)", "3\n");
        let nb = parse(&std::fs::read(&path).unwrap());
        let sources: Vec<&str> = nb["cells"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["cell_type"] == "code")
            .map(|c| c["source"].as_str().unwrap())
            .collect();
        assert_eq!(sources, ["print(1)", "print(2)", "print(3)"]);
        // A cell changed on disk behind ipybox: not served; the control (unchanged) is.
        let bytes = notebook.read().unwrap();
        let edited = String::from_utf8(bytes).unwrap().replace("2\\n", "9\\n");
        std::os::unix::fs::FileExt::write_all_at(
            &std::fs::OpenOptions::new().write(true).open(&path).unwrap(),
            edited.as_bytes(),
            0,
        )
        .unwrap();
        let e = notebook.read().unwrap_err().to_string();
        assert!(e.contains("was changed behind ipybox"), "{e}");
    }

    #[test]
    fn cells_wait_in_memory_while_the_file_cannot_be_written_within_a_bound() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("nb");
        // A file where the directory should be: no write can happen.
        std::fs::write(&dir, "not a directory").unwrap();
        let notebook = Notebook::new(NotebookConfig::in_dir(&dir).tag("full"));
        let cell = "y".repeat(256 << 10);
        for i in 0..8 {
            run(&notebook, &format!("print({i})"), &cell);
        }
        // The control: under the bound, every cell waits.
        let waiting = notebook.pending_bytes();
        assert!(waiting > 8 * cell.len(), "{waiting}");
        for i in 8..48 {
            run(&notebook, &format!("print({i})"), &cell);
        }
        let waiting = notebook.pending_bytes();
        assert!(
            waiting <= MAX_PENDING_BYTES && waiting > MAX_PENDING_BYTES - 2 * cell.len(),
            "{waiting}"
        );
        // The directory back: the waiting cells are written, the dropped ones are not.
        std::fs::remove_file(&dir).unwrap();
        run(&notebook, "print(48)", "");
        assert_eq!(notebook.pending_bytes(), 0);
        let nb = parse(&std::fs::read(notebook.path().unwrap()).unwrap());
        let cells = nb["cells"].as_array().unwrap();
        assert_eq!(cells.last().unwrap()["source"], "print(48)");
        assert!(cells.len() < 40 && cells.len() > 20, "{}", cells.len());
    }

    #[test]
    fn private_notebooks_are_private() {
        use std::os::unix::fs::MetadataExt;
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("host");
        let notebook = Notebook::new(NotebookConfig::in_dir(&dir).private(true));
        run(&notebook, "1", "");
        assert_eq!(std::fs::metadata(&dir).unwrap().mode() & 0o777, 0o700);
        let file = std::fs::metadata(notebook.path().unwrap()).unwrap();
        assert_eq!(file.mode() & 0o777, 0o600);
    }
}
