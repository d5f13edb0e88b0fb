//! The background write of a session notebook's files: the waiting cells appended to their
//! files (a new part past the size limit), the host's record beside them, a failed write's
//! cells kept for the next, a refused one's dropped; one write at a time, never under the
//! state's lock. [`super::Notebook`] keeps the cells and starts a `Writer`; this is what it runs.

use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use sha2::{Digest, Sha256};

use super::*;

/// The background write of a notebook's files. Dropped without having run (a runtime shutting
/// down drops what it has not started), it writes in the dropper's time; unwinding from a
/// panic, it marks the write over: [`Notebook::flush`] never waits for a write that will not
/// come.
pub(super) struct Writer(pub(super) Arc<Shared>, pub(super) bool);

impl Writer {
    pub(super) fn run(mut self) {
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
    /// The background write: appends the waiting cells to their files, again while cells
    /// end. One runs at a time, and the disk is never written under `state`. A failed write
    /// puts its cells back (the next cell tries again); a refused one drops them.
    fn write_until_current(&self) {
        loop {
            let since = self.lock().last_write.map(|t| t.elapsed());
            if let Some(since) = since
                && since < WRITE_INTERVAL
            {
                std::thread::sleep(WRITE_INTERVAL - since);
            }
            let mut disk = self.disk();
            if !self.write_pending(&mut disk, true) {
                return;
            }
        }
    }

    /// Appends the waiting cells to their files; whether there were any and they were
    /// written. For the background `writer`, nothing left to write or a failure ends its run
    /// (marked in the state, under the same lock as the look at what waits).
    pub(super) fn write_pending(&self, disk: &mut Option<OpenFile>, writer: bool) -> bool {
        let batch = {
            let mut state = self.lock();
            if state.pending.is_empty() {
                if writer {
                    state.writing = false;
                    self.written.notify_all();
                }
                return false;
            }
            if state.lost > 0 {
                tracing::warn!(session = %self.tag, "session notebook: {} cells were dropped unwritten", state.lost);
                state.lost = 0;
            }
            state.pending_bytes = 0;
            std::mem::take(&mut state.pending)
        };
        let failed = self.write_batch(disk, batch);
        let mut state = self.lock();
        state.last_write = Some(std::time::Instant::now());
        let Some((mut rest, name, e)) = failed else {
            state.failing = None;
            return true;
        };
        let text = match e {
            WriteError::Refused(why) => {
                // Not recorded: the budget said why (and tells the session).
                rest.clear();
                format!("{why} (these cells are not recorded)")
            }
            WriteError::Io(e) => format!(
                "{e} (the cells wait in memory, at most {MAX_PENDING_BYTES} bytes of them, and the next cell tries again)"
            ),
        };
        while let Some(cell) = rest.pop_back() {
            state.pending_bytes += cell.bytes.len();
            state.pending.push_front(cell);
        }
        self.bound_pending(&mut state);
        self.log_failure(&mut state, &name, text);
        if writer {
            state.writing = false;
            self.written.notify_all();
        }
        false
    }

    /// Writes `batch` file by file; on failure, the cells not written, the file's name and
    /// why.
    fn write_batch(
        &self,
        disk: &mut Option<OpenFile>,
        mut batch: VecDeque<Pending>,
    ) -> Option<(VecDeque<Pending>, String, WriteError)> {
        while let Some(part) = batch.front().map(|p| p.part) {
            let n = batch.iter().take_while(|p| p.part == part).count();
            let group: Vec<Pending> = batch.drain(..n).collect();
            let name = self.file_name(part);
            if let Err(e) = self.write_group(disk, part, &name, &group) {
                for cell in group.into_iter().rev() {
                    batch.push_front(cell);
                }
                return Some((batch, name, e));
            }
        }
        None
    }

    /// Appends `cells` to file `name` (part `part`): in place, after the cells it holds (the
    /// tail written again after them), in one write; or, for the part's first write and when
    /// the file in the directory is no longer the one written (replaced or removed behind
    /// ipybox), as a new file renamed into place, holding what was written of the part before
    /// (copied through the open descriptor). Never through a link.
    fn write_group(
        &self,
        disk: &mut Option<OpenFile>,
        part: u32,
        name: &str,
        cells: &[Pending],
    ) -> Result<(), WriteError> {
        use std::os::unix::fs::FileExt;
        let Some(dir) = self.open_dir()? else {
            return Ok(());
        };
        let tail = self.tail(part);
        // Looked at before the file is taken out of `disk`: an error leaves it there.
        let in_place = match disk.as_ref().filter(|f| f.part == part) {
            Some(f) => dir.holds(name, &f.file)?,
            None => false,
        };
        // From here, every error puts it back: a later write must not start the file anew.
        let before = disk.take_if(|f| f.part == part);
        let body_end = before
            .as_ref()
            .map_or(format::HEAD.len() as u64, |f| f.body_end);
        let mut bytes =
            Vec::with_capacity(cells.iter().map(|c| c.bytes.len() + 2).sum::<usize>() + tail.len());
        for (i, cell) in cells.iter().enumerate() {
            if i > 0 || before.is_some() {
                bytes.extend_from_slice(b",\n");
            }
            bytes.extend_from_slice(&cell.bytes);
        }
        let added = bytes.len() as u64;
        bytes.extend_from_slice(&tail);
        let len = body_end + bytes.len() as u64;
        if let Some(budget) = &self.budget
            && let Err(why) = budget.admit(&self.tag, name, len)
        {
            *disk = before;
            return Err(WriteError::Refused(why));
        }
        let mode = if self.private { 0o600 } else { 0o644 };
        let mut open = match before {
            Some(mut f) if in_place => {
                let written = f.file.write_all_at(&bytes, f.body_end).and_then(|()| {
                    if len < f.len {
                        f.file.set_len(len)
                    } else {
                        Ok(())
                    }
                });
                if let Err(e) = written {
                    // The cells before `body_end` are intact; the next write goes there again.
                    f.len = f.len.max(len);
                    *disk = Some(f);
                    return Err(e.into());
                }
                f
            }
            before => {
                let (tmp, mut file) = loop {
                    let tmp = format!(".{name}.tmp-{:08x}", rand::random::<u32>());
                    match dir.create_file_rw(&tmp, mode) {
                        Ok(file) => break (tmp, file),
                        // Something (a link, planted or left over) holds the name: another one.
                        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                        Err(e) => {
                            *disk = before;
                            return Err(e.into());
                        }
                    }
                };
                let copied = match &before {
                    Some(f) => {
                        let mut from = std::io::Read::take(&f.file, f.body_end);
                        std::io::Seek::rewind(&mut &f.file).and_then(|()| {
                            std::io::copy(&mut from, &mut file).and_then(|n| {
                                if n == f.body_end {
                                    Ok(())
                                } else {
                                    Err(std::io::Error::other(format!(
                                        "the notebook being written shrank to {n} bytes"
                                    )))
                                }
                            })
                        })
                    }
                    None => file.write_all(format::HEAD),
                };
                let done = copied
                    .and_then(|()| file.write_all(&bytes))
                    .and_then(|()| dir.rename(&tmp, name));
                if let Err(e) = done {
                    let _ = dir.remove_tree(&tmp);
                    *disk = before;
                    return Err(e.into());
                }
                match before {
                    Some(mut f) => {
                        f.file = file;
                        f
                    }
                    None => {
                        let mut body = Sha256::new();
                        body.update(format::HEAD);
                        OpenFile {
                            part,
                            file,
                            body_end: format::HEAD.len() as u64,
                            len: 0,
                            digests: ledger::FileDigests::default(),
                            record: None,
                            body,
                        }
                    }
                }
            }
        };
        open.body.update(&bytes[..added as usize]);
        open.body_end += added;
        open.len = len;
        for cell in cells {
            open.digests.cells.push(ledger::raw_digest(&cell.bytes));
            if let Some(code) = cell.code {
                open.digests.code.push(code);
            }
        }
        if let Some(budget) = &self.budget {
            budget.written(&self.tag, name);
        }
        // The cells are in the file: a record that cannot be written is logged, not retried
        // with them.
        let record = self.write_record(part, name, &mut open);
        *disk = Some(open);
        if let Err(e) = record {
            let mut state = self.lock();
            self.log_failure(&mut state, name, e.to_string());
        }
        Ok(())
    }

    /// Logs a failed write (once per kind).
    fn log_failure(&self, state: &mut State, name: &str, text: String) {
        if state.failing.as_deref() != Some(text.as_str()) {
            tracing::warn!(
                "cannot write the session notebook {}: {text}",
                self.dir
                    .as_deref()
                    .unwrap_or(Path::new(""))
                    .join(name)
                    .display()
            );
            state.failing = Some(text);
        }
    }

    /// Brings the host's record of file `name` (part `part`, open as `open`) up to `open`'s
    /// digests, when the host keeps records ([`ledger`]; the session's confinement is set
    /// with them, so the record's first line always has it): the new digests appended to the
    /// record written before, or the whole record written anew (the file's first write, after
    /// a record write failed, or when the record was removed or replaced meanwhile).
    fn write_record(&self, part: u32, name: &str, open: &mut OpenFile) -> std::io::Result<()> {
        let (Some(records), Some(dir)) = (self.records.get(), &self.dir) else {
            return Ok(());
        };
        let digests = &open.digests;
        // A record removed, replaced or moved since (its name no longer the file held) is
        // written anew.
        if let Some(r) = open.record.as_mut().filter(|r| r.record.holds()) {
            let appended = r
                .record
                .append(&digests.cells[r.cells..], &digests.code[r.code..]);
            if appended.is_ok() {
                (r.cells, r.code) = (digests.cells.len(), digests.code.len());
                return Ok(());
            }
            // Written again whole by the next write: nothing is appended after a line that
            // may be cut short.
            open.record = None;
            return appended.map_err(|e| record_error(records, e));
        }
        open.record = None;
        let canonical = match self.canonical_dir.get() {
            Some(c) => c.clone(),
            None => {
                let c = dir.canonicalize()?;
                self.canonical_dir.get_or_init(|| c).clone()
            }
        };
        let header = ledger::HostRecord {
            format: ledger::FORMAT,
            notebook: canonical.join(name),
            session: self.tag.clone(),
            started: format::utc(self.started),
            part,
            confinement: self.confinement.get().cloned(),
            code_cells: Vec::new(),
            cells: Vec::new(),
        };
        let record =
            ledger::create(records, &header, digests).map_err(|e| record_error(records, e))?;
        open.record = Some(RecordFile {
            record,
            cells: digests.cells.len(),
            code: digests.code.len(),
        });
        Ok(())
    }

    /// The notebook directory, opened never through a link (created, private or not), with
    /// its `.gitignore` made once; `None` when the notebook has no files.
    fn open_dir(&self) -> std::io::Result<Option<crate::safe_fs::NoFollowDir>> {
        let Some(dir) = &self.dir else {
            return Ok(None);
        };
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
            match dir.create_new(".gitignore", GITIGNORE, 0o644) {
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
        Ok(Some(dir))
    }
}

/// An error writing the host record in `records`, saying so.
fn record_error(records: &Path, e: std::io::Error) -> std::io::Error {
    std::io::Error::new(
        e.kind(),
        format!("its host record in {}: {e}", records.display()),
    )
}
