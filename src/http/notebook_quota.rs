//! [bin] `--notebook-quota`: the bytes a token's session notebooks may take on disk.
//!
//! Every session notebook of the HTTP service is written through this budget
//! ([`ipybox::notebook::NotebookBudget`]): before a file is (re)written, its new size is counted
//! with every other notebook file of the same token that this process wrote and that is still
//! on disk (open and closed sessions' alike: files stay after their session closes). Past the
//! quota, the token's least recently written files are removed first, never the file being
//! written; a session whose file was removed is no longer recorded (its next write would bring
//! the file back), nor is a session whose own file alone does not fit (the file keeps what it
//! held). Either session's next result tells the model once, and its resource
//! (`ipybox://notebook/<tag>`) answers with the same reason ([`NotebookFate`]).
//!
//! The bound: once writes settle, the files counted for a token take at most the quota. Cells
//! are appended to a file in place; a file's first write (and its rewrite after it was removed
//! behind ipybox) is a new file renamed into place. Files of an earlier process of the service
//! are not counted (nothing on disk says whose they are).
//!
//! Not here: the notebook's writer (`ipybox::notebook`), the resource (`mcp_server::notebook`).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use super::super::mcp_server::notebook_fate::NotebookFate;

/// The notebook bytes of every token (see the module docs).
pub(crate) struct NotebookQuota {
    dir: PathBuf,
    quota: u64,
    inner: Mutex<Inner>,
}

impl std::fmt::Debug for NotebookQuota {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NotebookQuota")
            .field("dir", &self.dir)
            .field("quota", &self.quota)
            .finish_non_exhaustive()
    }
}

#[derive(Default)]
struct Inner {
    /// Sessions by tag: whose they are and what became of their notebook.
    sessions: HashMap<String, Account>,
    /// The files counted, by name.
    files: HashMap<String, File>,
    /// A counter of writes (orders files by their last write).
    writes: u64,
}

struct Account {
    owner: [u8; 32],
    fate: Arc<NotebookFate>,
}

struct File {
    tag: String,
    owner: [u8; 32],
    bytes: u64,
    written: u64,
}

impl NotebookQuota {
    /// A budget of `quota` bytes per token over the notebooks in `dir`.
    pub(crate) fn new(dir: PathBuf, quota: u64) -> Arc<Self> {
        Arc::new(Self {
            dir,
            quota,
            inner: Mutex::default(),
        })
    }

    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Session `tag` belongs to `owner` (called before its kernel starts or is restored): its
    /// files count against `owner`'s quota; returns what becomes of its notebook (the same
    /// for the session woken again under the same tag).
    pub(crate) fn open(&self, tag: &str, owner: [u8; 32]) -> Arc<NotebookFate> {
        let mut inner = self.inner();
        match inner.sessions.get(tag) {
            Some(account) if account.owner == owner => account.fate.clone(),
            _ => {
                let fate = Arc::new(NotebookFate::default());
                inner.sessions.insert(
                    tag.to_string(),
                    Account {
                        owner,
                        fate: fate.clone(),
                    },
                );
                fate
            }
        }
    }

    fn removed_text(&self, tag: &str) -> String {
        format!(
            "the notebook of session {tag} was removed and this session is no longer recorded: this token's session notebooks passed {} bytes (--notebook-quota), and the least recently written are removed first\n  help: ask the operator for a larger --notebook-quota; the session itself goes on",
            self.quota
        )
    }

    fn stopped_text(&self, tag: &str, bytes: u64) -> String {
        format!(
            "the notebook of session {tag} is no longer recorded: its next version ({bytes} bytes) would not fit in this token's {} bytes of session notebooks (--notebook-quota) even with every older notebook of the token removed; its file keeps what was recorded until now\n  help: ask the operator for a larger --notebook-quota; the session itself goes on",
            self.quota
        )
    }
}

impl ipybox::notebook::NotebookBudget for NotebookQuota {
    fn admit(&self, tag: &str, name: &str, bytes: u64) -> Result<(), String> {
        let mut inner = self.inner();
        let Some(account) = inner.sessions.get(tag) else {
            // Not a session of a caller (never happens: a session is opened before it runs).
            return Ok(());
        };
        if let Some(why) = account.fate.gone() {
            return Err(why);
        }
        let owner = account.owner;
        let fate = account.fate.clone();
        let total: u64 = inner
            .files
            .iter()
            .filter(|(n, f)| f.owner == owner && n.as_str() != name)
            .map(|(_, f)| f.bytes)
            .sum();
        let mut total = total.saturating_add(bytes);
        if total > self.quota {
            let mut older: Vec<(String, u64, String, u64)> = inner
                .files
                .iter()
                .filter(|(n, f)| f.owner == owner && n.as_str() != name)
                .map(|(n, f)| (n.clone(), f.written, f.tag.clone(), f.bytes))
                .collect();
            older.sort_by_key(|(_, written, _, _)| *written);
            for (old, _, old_tag, old_bytes) in older {
                if total <= self.quota {
                    break;
                }
                match std::fs::remove_file(self.dir.join(&old)) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => {
                        tracing::warn!(
                            "cannot remove session notebook {} (--notebook-quota): {e}",
                            self.dir.join(&old).display()
                        );
                        continue;
                    }
                }
                inner.files.remove(&old);
                total = total.saturating_sub(old_bytes);
                tracing::info!(
                    session = %old_tag,
                    "session notebook {old} removed ({old_bytes} bytes): its token's notebooks passed --notebook-quota ({} bytes)",
                    self.quota
                );
                // Another session's file: that session is recorded no more (a write would
                // bring its file back). The session's own older part: it goes on.
                if old_tag != tag
                    && let Some(other) = inner.sessions.get(&old_tag)
                {
                    other.fate.set(self.removed_text(&old_tag));
                }
            }
        }
        if total > self.quota {
            let why = self.stopped_text(tag, bytes);
            tracing::info!(session = %tag, "session notebook no longer recorded: alone it would pass --notebook-quota ({} bytes)", self.quota);
            fate.set(why.clone());
            return Err(why);
        }
        inner.writes += 1;
        let written = inner.writes;
        inner.files.insert(
            name.to_string(),
            File {
                tag: tag.to_string(),
                owner,
                bytes,
                written,
            },
        );
        Ok(())
    }

    fn written(&self, _tag: &str, name: &str) {
        // Removed between its admission and its rename (another session's write needed the
        // room): what the rename brought back goes too.
        if !self.inner().files.contains_key(name)
            && let Err(e) = std::fs::remove_file(self.dir.join(name))
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(
                "cannot remove session notebook {} (--notebook-quota): {e}",
                self.dir.join(name).display()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ipybox::notebook::NotebookBudget;

    #[test]
    fn oldest_first_never_the_one_written_and_tokens_apart() {
        let t = tempfile::tempdir().unwrap();
        let quota = NotebookQuota::new(t.path().to_path_buf(), 1000);
        let write = |tag: &str, name: &str, bytes: u64| {
            let r = quota.admit(tag, name, bytes);
            if r.is_ok() {
                std::fs::write(t.path().join(name), vec![b'x'; bytes as usize]).unwrap();
            }
            r
        };
        let a1 = quota.open("a1", [1; 32]);
        let a2 = quota.open("a2", [1; 32]);
        let b = quota.open("b", [2; 32]);
        write("a1", "a1.ipynb", 400).unwrap();
        write("b", "b.ipynb", 900).unwrap();
        write("a2", "a2.ipynb", 500).unwrap();
        // a2 grows: a1 (older) goes, b (another token) stays.
        write("a2", "a2.ipynb", 700).unwrap();
        assert!(!t.path().join("a1.ipynb").exists());
        assert!(t.path().join("b.ipynb").exists());
        assert!(a1.gone().unwrap().contains("was removed"));
        assert!(a2.gone().is_none() && b.gone().is_none());
        assert!(write("a1", "a1.ipynb", 10).is_err());
        // a2 alone past the quota: not written, its file keeps what it held.
        let why = write("a2", "a2.ipynb", 1001).unwrap_err();
        assert!(why.contains("no longer recorded"), "{why}");
        assert_eq!(
            std::fs::metadata(t.path().join("a2.ipynb")).unwrap().len(),
            700
        );
        assert_eq!(a2.take_untold().as_deref(), Some(why.as_str()));
        assert_eq!(a2.take_untold(), None);
    }
}
