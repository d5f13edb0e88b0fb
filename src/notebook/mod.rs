//! The session notebook: every cell an executor runs, recorded as a Jupyter notebook
//! (nbformat 4.5) that is rewritten after each cell (in the background), so a person can open it in JupyterLab or
//! VS Code while the agent works and watch it grow; `ipybox replay` runs it again.
//!
//! - [`Notebook`] (here): the recorder one executor owns. Cells are kept in memory, each
//!   serialized once when it ends; the file is their concatenation inside a fixed head and
//!   tail, written atomically (a new file renamed over the old) and never through a link
//!   ([`crate::safe_fs`]: the workspace is writable by sandboxed kernels). It is never read
//!   back: the MCP resource serves the notebook from memory. Past
//!   [`NotebookConfig::max_file_bytes`] the session goes on in a new file (`…-2.ipynb`), so a
//!   rewrite never costs more than that. Resets and kernel replacements start a new section (a
//!   markdown cell), not a new file.
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

use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::SystemTime;

use serde_json::{Value, json};

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
    /// be written with `bytes` bytes, replacing what it held: `Ok` to write it, `Err(why)` to
    /// leave the file as it is (recording goes on in memory; `why` is logged once).
    fn admit(&self, tag: &str, name: &str, bytes: u64) -> Result<(), String>;

    /// File `name` was written (renamed into place) after its admission.
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

    /// No file: the notebook is kept in memory only ([`Notebook::json`]).
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

/// The notebook of one executor's session (see the module docs). Every method is safe to call
/// from any task.
///
/// A cell ends in memory at once; the file is written by a background task (a blocking one of
/// the tokio runtime, else a thread), so the caller's result never waits for the disk (a rename
/// over a file costs milliseconds on a busy ext4). Cells that end while a write runs are written
/// together by the next one. [`Notebook::flush`] waits for the file to hold everything.
#[derive(Debug)]
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
}

/// A file's content as it was: its part number, its serialized cells and their size, and the
/// digests of its code cells' sources.
type Snapshot = (u32, Vec<Arc<[u8]>>, usize, ledger::FileDigests);

#[derive(Debug, Default)]
struct State {
    /// The current file's number (1, then 2, ... past the size limit).
    part: u32,
    /// The serialized cells of the current file, the header first.
    cells: Vec<Arc<[u8]>>,
    /// The digests of the current file's cells and code cells' sources (for the host record).
    digests: ledger::FileDigests,
    bytes: usize,
    /// Changes to the current file so far, and how many of them the file holds.
    version: u64,
    on_disk: u64,
    /// Whether a background write runs (it goes on until the files hold every change).
    writing: bool,
    /// Files finished (past the size limit) whose last version the background write still
    /// has to write: part, cells, size.
    finished: std::collections::VecDeque<Snapshot>,
    /// The last execution count of the current section.
    count: u32,
    next_id: u64,
    /// Code cells since the last section began.
    since_section: usize,
    /// The last write error logged (the same one is not logged again).
    failing: Option<String>,
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

    /// Waits until the file holds every cell recorded so far (returns at once when nothing is
    /// being written, or the notebook has no file).
    pub fn flush(&self) {
        let mut state = self.lock();
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

    /// The notebook as it is now (the current file's content), from memory.
    pub fn json(&self) -> Vec<u8> {
        let state = self.lock();
        self.assemble(&state)
    }

    /// The last code cell recorded in the current file, if any.
    pub fn last_code_cell(&self) -> Option<Value> {
        let state = self.lock();
        state.cells.iter().rev().find_map(|bytes| {
            let cell: Value = serde_json::from_slice(bytes).ok()?;
            (cell["cell_type"] == "code").then_some(cell)
        })
    }

    fn next_id(state: &mut State) -> String {
        state.next_id += 1;
        format!("ipybox-{}", state.next_id)
    }

    /// Begins file `part + 1` with its header cell.
    fn start_part(&self, state: &mut State, previous: Option<String>) {
        state.part += 1;
        state.cells.clear();
        state.digests = ledger::FileDigests::default();
        state.bytes = 0;
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
        Self::push(state, &format::markdown_cell(&id, &text, meta));
    }

    fn push(state: &mut State, cell: &Value) {
        Self::note_code(state, cell);
        Self::push_bytes(state, serde_json::to_vec(cell).unwrap_or_default());
    }

    /// Keeps the digest of `cell`'s source when it is a code cell (for the host record).
    fn note_code(state: &mut State, cell: &Value) {
        if cell["cell_type"] == "code" {
            let source = cell["source"].as_str().unwrap_or_default();
            state.digests.code.push(ledger::source_digest(source));
        }
    }

    fn push_bytes(state: &mut State, bytes: Vec<u8>) {
        state.digests.cells.push(ledger::bytes_digest(&bytes));
        state.bytes += bytes.len() + 2;
        state.cells.push(bytes.into());
        state.version += 1;
    }

    /// Adds `cell`, going on in a new file first if it would not fit in this one (the full
    /// file is written first, in the caller's time: once per file).
    fn push_sized(&self, state: &mut State, cell: &Value) {
        let bytes = serde_json::to_vec(cell).unwrap_or_default();
        if state.cells.len() > 1 && state.bytes + bytes.len() > self.0.max_file_bytes {
            if state.on_disk < state.version {
                let done = (
                    state.part,
                    state.cells.clone(),
                    state.bytes,
                    state.digests.clone(),
                );
                state.finished.push_back(done);
            }
            state.on_disk = state.version;
            let previous = self.0.file_name(state.part);
            self.start_part(state, Some(previous));
        }
        Self::note_code(state, cell);
        Self::push_bytes(state, bytes);
    }

    /// Records a cell that ended (`ending`) after the approval decisions in `calls`, and
    /// writes the file.
    pub(crate) fn finish(&self, record: CellRecord, ending: &Ending<'_>, calls: Vec<CallRecord>) {
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

    fn assemble(&self, state: &State) -> Vec<u8> {
        self.0.assemble(state.part, &state.cells, state.bytes)
    }

    /// Has the files written in the background (see [`Notebook`]).
    fn write(&self, state: &mut State) {
        if self.0.dir.is_none()
            || state.writing
            || (state.on_disk == state.version && state.finished.is_empty())
        {
            return;
        }
        state.writing = true;
        let writer = Writer(self.0.clone(), false);
        let work = move || writer.run();
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn_blocking(work)),
            Err(_) => drop(std::thread::spawn(work)),
        }
    }
}

/// The background write of a notebook's files. Dropped without having run (a runtime shutting
/// down drops what it has not started), it writes in the dropper's time; unwinding from a
/// panic, it marks the write over: [`Notebook::flush`] never waits for a write that will not
/// come.
struct Writer(Arc<Shared>, bool);

impl Writer {
    fn run(mut self) {
        self.0.write_until_current();
        self.1 = true;
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        if self.1 {
            return;
        }
        if std::thread::panicking() {
            self.0.lock().writing = false;
            self.0.written.notify_all();
        } else {
            self.0.write_until_current();
        }
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn file_name(&self, part: u32) -> String {
        let stem = format!("{}-{}", format::utc_for_file(self.started), self.tag);
        match part {
            1 => format!("{stem}.ipynb"),
            n => format!("{stem}-{n}.ipynb"),
        }
    }

    fn assemble(&self, part: u32, cells: &[Arc<[u8]>], size: usize) -> Vec<u8> {
        let tail = format::tail(&format::notebook_metadata(
            &self.tag,
            &format::utc(self.started),
            part,
            self.confinement.get(),
        ));
        let mut bytes = Vec::with_capacity(format::HEAD.len() + size + tail.len());
        bytes.extend_from_slice(format::HEAD);
        for (i, cell) in cells.iter().enumerate() {
            if i > 0 {
                bytes.extend_from_slice(b",\n");
            }
            bytes.extend_from_slice(cell);
        }
        bytes.extend_from_slice(&tail);
        bytes
    }

    /// The background write: the files finished meanwhile, then the current file as it is,
    /// again while cells end. One runs at a time, so a later version is never overwritten by
    /// an earlier one; the disk is never written under the lock.
    fn write_until_current(&self) {
        loop {
            let (part, cells, size, digests, version) = {
                let mut state = self.lock();
                if let Some((part, cells, size, digests)) = state.finished.pop_front() {
                    (part, cells, size, digests, None)
                } else if state.on_disk == state.version {
                    state.writing = false;
                    self.written.notify_all();
                    return;
                } else {
                    let current = (state.part, state.cells.clone(), state.bytes);
                    let digests = state.digests.clone();
                    (
                        current.0,
                        current.1,
                        current.2,
                        digests,
                        Some(state.version),
                    )
                }
            };
            let name = self.file_name(part);
            let written = self
                .write_bytes(&name, &self.assemble(part, &cells, size))
                .and_then(|()| self.write_record(part, &name, digests));
            let mut state = self.lock();
            if let Some(version) = version
                && state.part == part
            {
                state.on_disk = version;
            }
            self.record(&mut state, &name, written);
        }
    }

    /// Logs a failed write (once per kind: recording goes on in memory, the next cell tries
    /// again).
    fn record(&self, state: &mut State, name: &str, written: std::io::Result<()>) {
        match written {
            Ok(()) => state.failing = None,
            Err(e) => {
                let text = e.to_string();
                if state.failing.as_deref() != Some(text.as_str()) {
                    tracing::warn!(
                        "cannot write the session notebook {}: {text} (recording goes on in memory)",
                        self.dir
                            .as_deref()
                            .unwrap_or(Path::new(""))
                            .join(name)
                            .display()
                    );
                    state.failing = Some(text);
                }
            }
        }
    }

    /// Rewrites the host's record of file `name` (part `part`, whose code cells' sources have
    /// `digests`), when the host keeps records ([`ledger`]).
    fn write_record(
        &self,
        part: u32,
        name: &str,
        digests: ledger::FileDigests,
    ) -> std::io::Result<()> {
        let (Some(records), Some(dir)) = (self.records.get(), &self.dir) else {
            return Ok(());
        };
        let canonical = match self.canonical_dir.get() {
            Some(c) => c.clone(),
            None => {
                let c = dir.canonicalize()?;
                self.canonical_dir.get_or_init(|| c).clone()
            }
        };
        let notebook = canonical.join(name);
        let record = ledger::HostRecord {
            format: 1,
            notebook,
            session: self.tag.clone(),
            started: format::utc(self.started),
            part,
            confinement: self.confinement.get().cloned(),
            code_cells: digests.code,
            cells: digests.cells,
        };
        ledger::write(records, &record).map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!("its host record in {}: {e}", records.display()),
            )
        })
    }

    /// Replaces file `name` of the notebook directory with `bytes`, never through a link.
    fn write_bytes(&self, name: &str, bytes: &[u8]) -> std::io::Result<()> {
        let Some(dir) = &self.dir else { return Ok(()) };
        if let Some(budget) = &self.budget {
            let size = u64::try_from(bytes.len()).unwrap_or(u64::MAX);
            budget
                .admit(&self.tag, name, size)
                .map_err(std::io::Error::other)?;
        }
        let dir = if self.private {
            crate::safe_fs::open_private_dir(dir)
        } else {
            crate::safe_fs::NoFollowDir::open(dir, Some(0o755))
        }?;
        if self.gitignore
            && !self.private
            && !self
                .gitignore_done
                .swap(true, std::sync::atomic::Ordering::SeqCst)
        {
            match dir.create_new(
                ".gitignore",
                GITIGNORE,
                if self.private { 0o600 } else { 0o644 },
            ) {
                Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
                    self.gitignore_done
                        .store(false, std::sync::atomic::Ordering::SeqCst);
                    return Err(std::io::Error::new(
                        e.kind(),
                        format!("its .gitignore: {e}"),
                    ));
                }
                _ => {}
            }
        }
        dir.rewrite(name, bytes, if self.private { 0o600 } else { 0o644 })?;
        if let Some(budget) = &self.budget {
            budget.written(&self.tag, name);
        }
        Ok(())
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
        assert_eq!(on_disk, notebook.json());
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
        let notebook = Notebook::new(
            NotebookConfig::in_dir(t.path())
                .tag("big")
                .max_file_bytes(2500),
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

    #[test]
    fn the_host_keeps_a_record_of_each_file() {
        let t = tempfile::tempdir().unwrap();
        let records = t.path().join("records");
        let notebook = Notebook::new(NotebookConfig::in_dir(t.path().join("nb")).tag("rec"));
        notebook.set_confinement(
            ledger::Confinement::unsandboxed("local"),
            Some(records.clone()),
        );
        run(&notebook, "print(1)", "1\n");
        run(&notebook, "print(2)", "2\n");
        let path = notebook.path().unwrap();
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
