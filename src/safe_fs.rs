//! Host-side file operations for places a kernel may have prepared: they never follow a symbolic
//! link where the kernel could have put one, and private state is created private.
//!
//! - [`NoFollowDir`]: a directory opened without following a link at its last component, and
//!   everything done inside it relative to that open descriptor (`openat`, `mkdirat`,
//!   `renameat`, `unlinkat` with `O_NOFOLLOW` / `AT_SYMLINK_NOFOLLOW`). Swapping the directory
//!   for a link after it was opened changes nothing: the host keeps working in the directory it
//!   opened. Used for generated code (`mcptools/`), images (`images/`) and session notebooks
//!   (`notebooks/`, rewritten atomically with [`NoFollowDir::replace`]) in the workspace, which
//!   a sandboxed kernel can write.
//! - [`write_private`], [`create_private_dir`]: ipybox's own state under its data directory
//!   (`$IPYBOX_HOME`): files 0600, directories 0700, files replaced atomically and never through
//!   a link.
//!
//! - [`NoFollowDir::open_regular`]: reading back a file a kernel wrote (a session snapshot in the
//!   kernel-writable runtime directory): never through a link, only a regular file (not a FIFO
//!   that would block the host, not a device), no larger than the caller's limit.
//!
//! The parents of the path handed in are trusted as given (the caller chose them: the canonical
//! workspace, the data directory); only what lies below can have been planted.
//!
//! Not here: deciding which directories are trusted (the callers).

use std::ffi::OsStr;
use std::io::Write;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, CWD, Dir, FileType, Mode, OFlags};

/// What a name in a directory is, without following it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Dir,
    File,
    Symlink,
    Other,
}

/// A directory opened without following a symbolic link at its last component; every operation
/// on it works relative to the open descriptor and never follows a link at the names it is
/// given.
#[derive(Debug)]
pub(crate) struct NoFollowDir {
    fd: OwnedFd,
    path: PathBuf,
}

fn io(e: rustix::io::Errno) -> std::io::Error {
    std::io::Error::from(e)
}

/// The error for a link (or non-directory) found where a directory was expected.
fn not_a_plain_dir(path: &Path, kind: Option<Kind>) -> std::io::Error {
    let what = match kind {
        Some(Kind::Symlink) => {
            "it is a symbolic link, which ipybox does not follow here (code in a sandboxed kernel can plant links in the workspace)"
        }
        _ => "it is not a directory",
    };
    std::io::Error::other(format!(
        "{}: {what}; remove it (ipybox creates the directory itself)",
        path.display()
    ))
}

const DIR_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

impl NoFollowDir {
    /// Opens the directory `path`; its last component must be a directory, not a link to one.
    /// With `create`, a missing directory is made with that mode (the umask applies).
    pub(crate) fn open(path: &Path, create: Option<u32>) -> std::io::Result<Self> {
        let (parent, name) = match (path.parent(), path.file_name()) {
            (Some(parent), Some(name)) => {
                let parent = if parent.as_os_str().is_empty() {
                    Path::new(".")
                } else {
                    parent
                };
                (parent, name)
            }
            // `/` or a path ending in `..`: nothing below the caller's choice to guard.
            _ => {
                let fd =
                    rustix::fs::open(path, DIR_FLAGS.difference(OFlags::NOFOLLOW), Mode::empty())
                        .map_err(io)?;
                return Ok(Self {
                    fd,
                    path: path.to_path_buf(),
                });
            }
        };
        if let Some(mode) = create {
            std::fs::create_dir_all(parent)?;
            match rustix::fs::mkdirat(CWD, path, Mode::from_raw_mode(mode as _)) {
                Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                Err(e) => return Err(io(e)),
            }
        }
        let parent = rustix::fs::open(
            parent,
            DIR_FLAGS.difference(OFlags::NOFOLLOW),
            Mode::empty(),
        )
        .map_err(io)?;
        open_at(&parent, name, path)
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// What `name` is (`None`: nothing there), without following a link.
    pub(crate) fn kind(&self, name: &str) -> std::io::Result<Option<Kind>> {
        kind_at(&self.fd, name)
    }

    /// The subdirectory `name`, created with `create`'s mode if missing; a link there is an
    /// error.
    pub(crate) fn subdir(&self, name: &str, create: Option<u32>) -> std::io::Result<Self> {
        if let Some(mode) = create {
            match rustix::fs::mkdirat(&self.fd, name, Mode::from_raw_mode(mode as _)) {
                Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                Err(e) => return Err(io(e)),
            }
        }
        open_at(&self.fd, OsStr::new(name), &self.path.join(name))
    }

    /// Creates the new file `name` holding `bytes` (mode `mode`, narrowed by the umask). Fails
    /// if anything, a link included, is already there.
    pub(crate) fn create_new(&self, name: &str, bytes: &[u8], mode: u32) -> std::io::Result<()> {
        let fd = rustix::fs::openat(
            &self.fd,
            name,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(mode as _),
        )
        .map_err(io)?;
        std::fs::File::from(fd).write_all(bytes)
    }

    /// Replaces `name` with a file holding `bytes` (mode `mode`, narrowed by the umask),
    /// atomically: a new file is written beside it and renamed over it, so a reader sees the
    /// old or the new content, and a link at `name` is replaced, never followed.
    pub(crate) fn rewrite(&self, name: &str, bytes: &[u8], mode: u32) -> std::io::Result<()> {
        self.rewrite_open(name, bytes, mode).map(drop)
    }

    /// [`Self::rewrite`], and the new file, open for writing at its end.
    pub(crate) fn rewrite_open(
        &self,
        name: &str,
        bytes: &[u8],
        mode: u32,
    ) -> std::io::Result<std::fs::File> {
        let (tmp, file) = loop {
            let tmp = format!(".{name}.tmp-{:08x}", rand::random::<u32>());
            let written = self
                .create_file(&tmp, mode)
                .and_then(|mut f| f.write_all(bytes).map(|()| f));
            match written {
                Ok(file) => break (tmp, file),
                // Something (a link, planted or left over) holds the name: another one.
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => {
                    let _ = self.remove_tree(&tmp);
                    return Err(e);
                }
            }
        };
        self.rename(&tmp, name).map(|()| file).inspect_err(|_| {
            let _ = self.remove_tree(&tmp);
        })
    }

    /// Creates the new file `name` (mode `mode`, narrowed by the umask) for writing; fails if
    /// anything, a link included, is already there.
    pub(crate) fn create_file(&self, name: &str, mode: u32) -> std::io::Result<std::fs::File> {
        let fd = rustix::fs::openat(
            &self.fd,
            name,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(mode as _),
        )
        .map_err(io)?;
        Ok(std::fs::File::from(fd))
    }

    /// Creates the new file `name` (mode `mode`, narrowed by the umask) for reading and writing;
    /// fails if anything, a link included, is already there.
    pub(crate) fn create_file_rw(&self, name: &str, mode: u32) -> std::io::Result<std::fs::File> {
        let fd = rustix::fs::openat(
            &self.fd,
            name,
            OFlags::RDWR | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(mode as _),
        )
        .map_err(io)?;
        Ok(std::fs::File::from(fd))
    }

    /// Whether `name` (not followed if it is a link) is the file `file` has open.
    pub(crate) fn holds(&self, name: &str, file: &std::fs::File) -> std::io::Result<bool> {
        let open = rustix::fs::fstat(file).map_err(io)?;
        match rustix::fs::statat(&self.fd, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => Ok(st.st_dev == open.st_dev && st.st_ino == open.st_ino),
            Err(rustix::io::Errno::NOENT) => Ok(false),
            Err(e) => Err(io(e)),
        }
    }

    /// Opens `name` for reading if it is a regular file of at most `limit` bytes, and returns it
    /// with its length. A link, a directory, a FIFO or a device is an error (opened without
    /// following a link, and without blocking on a FIFO), and so is a larger file. The length is
    /// the one at open time: a reader that must not read past it reads exactly that many bytes.
    pub(crate) fn open_regular(
        &self,
        name: &str,
        limit: u64,
    ) -> std::io::Result<(std::fs::File, u64)> {
        let fd = rustix::fs::openat(
            &self.fd,
            name,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| match e {
            rustix::io::Errno::LOOP => std::io::Error::other(format!(
                "{}: it is a symbolic link, which ipybox does not follow here",
                self.path.join(name).display()
            )),
            e => io(e),
        })?;
        let st = rustix::fs::fstat(&fd).map_err(io)?;
        if FileType::from_raw_mode(st.st_mode as _) != FileType::RegularFile {
            return Err(std::io::Error::other(format!(
                "{}: not a regular file",
                self.path.join(name).display()
            )));
        }
        let len = st.st_size as u64;
        if len > limit {
            return Err(std::io::Error::other(format!(
                "{}: {len} bytes, over the limit of {limit}",
                self.path.join(name).display()
            )));
        }
        // Reads block as usual (O_NONBLOCK only kept the open from waiting on a FIFO).
        rustix::fs::fcntl_setfl(&fd, OFlags::empty()).map_err(io)?;
        Ok((std::fs::File::from(fd), len))
    }

    /// Renames `from` to `to` inside this directory, or, when `to` exists, swaps the two
    /// atomically (Linux; elsewhere `to` is removed first): whoever looks sees the old or the new,
    /// never neither.
    pub(crate) fn replace(&self, from: &str, to: &str) -> std::io::Result<()> {
        if self.kind(to)?.is_none() {
            return self.rename(from, to);
        }
        #[cfg(target_os = "linux")]
        {
            rustix::fs::renameat_with(
                &self.fd,
                from,
                &self.fd,
                to,
                rustix::fs::RenameFlags::EXCHANGE,
            )
            .map_err(io)?;
            self.remove_tree(from)
        }
        #[cfg(not(target_os = "linux"))]
        {
            self.remove_tree(to)?;
            self.rename(from, to)
        }
    }

    /// Renames `from` to `to` unless `to` exists (then `AlreadyExists`, and `from` stays).
    pub(crate) fn rename_new(&self, from: &str, to: &str) -> std::io::Result<()> {
        #[cfg(target_os = "linux")]
        {
            rustix::fs::renameat_with(
                &self.fd,
                from,
                &self.fd,
                to,
                rustix::fs::RenameFlags::NOREPLACE,
            )
            .map_err(io)
        }
        #[cfg(not(target_os = "linux"))]
        {
            if self.kind(to)?.is_some() {
                return Err(std::io::ErrorKind::AlreadyExists.into());
            }
            self.rename(from, to)
        }
    }

    /// Flushes the directory's entries to disk (after renames that must survive a crash).
    /// Gives `name` (itself, never what a link there points to; `"."`: this directory) to
    /// `uid`/`gid`.
    pub(crate) fn chown(&self, name: &str, uid: u32, gid: u32) -> std::io::Result<()> {
        rustix::fs::chownat(
            &self.fd,
            name,
            Some(rustix::fs::Uid::from_raw(uid)),
            Some(rustix::fs::Gid::from_raw(gid)),
            if name == "." {
                rustix::fs::AtFlags::empty()
            } else {
                rustix::fs::AtFlags::SYMLINK_NOFOLLOW
            },
        )
        .map_err(io)
    }

    pub(crate) fn sync(&self) -> std::io::Result<()> {
        rustix::fs::fsync(&self.fd).map_err(io)
    }

    /// Renames `from` to `to` inside this directory (neither is followed if it is a link).
    pub(crate) fn rename(&self, from: &str, to: &str) -> std::io::Result<()> {
        rustix::fs::renameat(&self.fd, from, &self.fd, to).map_err(io)
    }

    /// Removes `name` and, if it is a directory, everything in it; links are removed, never
    /// followed. Nothing there is not an error.
    pub(crate) fn remove_tree(&self, name: &str) -> std::io::Result<()> {
        remove_tree_at(&self.fd, OsStr::new(name))
    }
}

fn open_at(parent: &OwnedFd, name: &OsStr, path: &Path) -> std::io::Result<NoFollowDir> {
    match rustix::fs::openat(parent, name, DIR_FLAGS, Mode::empty()) {
        Ok(fd) => Ok(NoFollowDir {
            fd,
            path: path.to_path_buf(),
        }),
        Err(rustix::io::Errno::LOOP | rustix::io::Errno::NOTDIR) => {
            Err(not_a_plain_dir(path, kind_at(parent, name).ok().flatten()))
        }
        Err(e) => Err(io(e)),
    }
}

fn kind_at(dir: &OwnedFd, name: impl rustix::path::Arg) -> std::io::Result<Option<Kind>> {
    match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => Ok(Some(match FileType::from_raw_mode(st.st_mode as _) {
            FileType::Directory => Kind::Dir,
            FileType::RegularFile => Kind::File,
            FileType::Symlink => Kind::Symlink,
            _ => Kind::Other,
        })),
        Err(rustix::io::Errno::NOENT) => Ok(None),
        Err(e) => Err(io(e)),
    }
}

fn remove_tree_at(dir: &OwnedFd, name: &OsStr) -> std::io::Result<()> {
    match kind_at(dir, name)? {
        None => Ok(()),
        Some(Kind::Dir) => {
            let sub = match rustix::fs::openat(dir, name, DIR_FLAGS, Mode::empty()) {
                Ok(fd) => fd,
                // Swapped for something else since the look: remove whatever is there now.
                Err(rustix::io::Errno::LOOP | rustix::io::Errno::NOTDIR) => {
                    return rustix::fs::unlinkat(dir, name, AtFlags::empty()).map_err(io);
                }
                Err(e) => return Err(io(e)),
            };
            empty_dir(&sub, &sub, 0)?;
            rustix::fs::unlinkat(dir, name, AtFlags::REMOVEDIR).map_err(io)
        }
        Some(_) => rustix::fs::unlinkat(dir, name, AtFlags::empty()).map_err(io),
    }
}

/// How deep [`empty_dir`] descends before it moves a directory up instead.
const REMOVE_DEPTH: usize = 16;

/// Empties `dir`, `depth` levels below `top` (the directory being removed). A directory found
/// [`REMOVE_DEPTH`] levels down is first renamed into `top` (emptied from there later), so the
/// stack and the open descriptors stay bounded however deep a tree is: a kernel can make a tree
/// of any depth in what it may write, and a recursive removal of it would overflow the stack or
/// run out of descriptors. Entries are read in batches and read again until none is left.
fn empty_dir(top: &OwnedFd, dir: &OwnedFd, depth: usize) -> std::io::Result<()> {
    loop {
        let mut names = Vec::new();
        let mut entries = Dir::read_from(dir).map_err(io)?;
        while let Some(entry) = entries.read() {
            let entry = entry.map_err(io)?;
            let n = entry.file_name().to_bytes();
            if n != b"." && n != b".." {
                names.push(std::ffi::OsString::from(
                    <OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(n),
                ));
                if names.len() >= 4096 {
                    break;
                }
            }
        }
        if names.is_empty() {
            return Ok(());
        }
        for n in names {
            match kind_at(dir, n.as_os_str())? {
                None => {}
                Some(Kind::Dir) if depth + 1 >= REMOVE_DEPTH => {
                    let up = format!(".ipybox-rm-{:016x}", rand::random::<u64>());
                    rustix::fs::renameat(dir, n.as_os_str(), top, up.as_str()).map_err(io)?;
                }
                Some(Kind::Dir) => {
                    let sub = match rustix::fs::openat(dir, n.as_os_str(), DIR_FLAGS, Mode::empty())
                    {
                        Ok(fd) => fd,
                        Err(rustix::io::Errno::LOOP | rustix::io::Errno::NOTDIR) => {
                            rustix::fs::unlinkat(dir, n.as_os_str(), AtFlags::empty())
                                .map_err(io)?;
                            continue;
                        }
                        Err(e) => return Err(io(e)),
                    };
                    empty_dir(top, &sub, depth + 1)?;
                    rustix::fs::unlinkat(dir, n.as_os_str(), AtFlags::REMOVEDIR).map_err(io)?;
                }
                Some(_) => {
                    rustix::fs::unlinkat(dir, n.as_os_str(), AtFlags::empty()).map_err(io)?
                }
            }
        }
    }
}

/// Removes the tree at `path` without following links in it (`path` itself included; its
/// parent is the caller's), however deep it is ([`empty_dir`]). Nothing there: Ok.
pub(crate) fn remove_path_tree(path: &Path) -> std::io::Result<()> {
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(std::io::Error::other(format!(
            "cannot remove {}: not a path below a directory",
            path.display()
        )));
    };
    let parent = if parent.as_os_str().is_empty() {
        Path::new(".")
    } else {
        parent
    };
    match rustix::fs::open(
        parent,
        DIR_FLAGS.difference(OFlags::NOFOLLOW),
        Mode::empty(),
    ) {
        Ok(fd) => remove_tree_at(&fd, name),
        Err(rustix::io::Errno::NOENT) => Ok(()),
        Err(e) => Err(io(e)),
    }
}

/// Writes `bytes` to `path` as a private file (0600), replacing what is there atomically: a new
/// file is written beside it and renamed over it, so a link at `path` is replaced, never
/// followed. The directory must exist.
pub(crate) fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty());
    let dir = NoFollowDir::open(dir.unwrap_or(Path::new(".")), None)?;
    let name = path
        .file_name()
        .and_then(OsStr::to_str)
        .ok_or_else(|| std::io::Error::other(format!("{}: not a file name", path.display())))?;
    dir.rewrite(name, bytes, 0o600)
}

/// Opens (creating it 0600, never through a link, never truncating) the lock file at `path`:
/// what an exclusive `flock` is taken on.
pub(crate) fn open_lock_file(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
}

/// Makes `path` a private directory (0700): its parents are created as usual, `path` itself
/// with mode 0700, and an existing directory of ours that is wider is narrowed to 0700. A link
/// at `path` is an error.
pub(crate) fn create_private_dir(path: &Path) -> std::io::Result<()> {
    open_private_dir(path).map(drop)
}

/// [`create_private_dir`], returning the directory opened.
pub(crate) fn open_private_dir(path: &Path) -> std::io::Result<NoFollowDir> {
    let dir = NoFollowDir::open(path, Some(0o700))?;
    let st = rustix::fs::fstat(&dir.fd).map_err(io)?;
    let ours = st.st_uid == rustix::process::getuid().as_raw();
    if ours && st.st_mode as u32 & 0o077 != 0 {
        rustix::fs::fchmod(&dir.fd, Mode::from_raw_mode(0o700 as _)).map_err(io)?;
    }
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, symlink};

    #[test]
    fn a_link_is_never_followed() {
        let t = tempfile::tempdir().unwrap();
        let outside = t.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("keep"), "precious").unwrap();
        let ws = t.path().join("ws");
        std::fs::create_dir(&ws).unwrap();
        symlink(&outside, ws.join("images")).unwrap();
        let err = NoFollowDir::open(&ws.join("images"), Some(0o755)).unwrap_err();
        assert!(err.to_string().contains("symbolic link"), "{err}");

        let dir = NoFollowDir::open(&ws.join("real"), Some(0o755)).unwrap();
        symlink(outside.join("keep"), ws.join("real/a.png")).unwrap();
        assert_eq!(dir.kind("a.png").unwrap(), Some(Kind::Symlink));
        assert!(dir.create_new("a.png", b"x", 0o644).is_err());
        symlink(&outside, ws.join("real/sub")).unwrap();
        assert!(dir.subdir("sub", Some(0o755)).is_err());
        // Removal takes the links, never what they point at.
        dir.remove_tree("sub").unwrap();
        dir.remove_tree("a.png").unwrap();
        std::fs::create_dir(ws.join("real/tree")).unwrap();
        symlink(&outside, ws.join("real/tree/link")).unwrap();
        dir.remove_tree("tree").unwrap();
        assert_eq!(
            std::fs::read_to_string(outside.join("keep")).unwrap(),
            "precious"
        );
        assert_eq!(dir.kind("tree").unwrap(), None);

        // Swapping the opened directory for a link changes nothing: writes land in the
        // directory that was opened.
        std::fs::rename(ws.join("real"), ws.join("moved")).unwrap();
        symlink(&outside, ws.join("real")).unwrap();
        dir.create_new("b.png", b"img", 0o644).unwrap();
        assert!(ws.join("moved/b.png").exists());
        assert!(!outside.join("b.png").exists());
    }

    #[test]
    fn private_files_and_dirs() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("a/b");
        create_private_dir(&d).unwrap();
        assert_eq!(std::fs::metadata(&d).unwrap().mode() & 0o777, 0o700);
        std::fs::set_permissions(&d, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        create_private_dir(&d).unwrap();
        assert_eq!(std::fs::metadata(&d).unwrap().mode() & 0o777, 0o700);

        let target = t.path().join("target");
        std::fs::write(&target, "untouched").unwrap();
        symlink(&target, d.join("f.json")).unwrap();
        write_private(&d.join("f.json"), b"{}").unwrap();
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "untouched");
        let m = std::fs::symlink_metadata(d.join("f.json")).unwrap();
        assert!(m.is_file());
        assert_eq!(m.mode() & 0o777, 0o600);
        assert_eq!(std::fs::read_to_string(d.join("f.json")).unwrap(), "{}");
        assert_eq!(
            std::fs::read_dir(&d).unwrap().count(),
            1,
            "no temp file left"
        );
    }

    #[test]
    fn a_tree_of_any_depth_is_removed_with_a_small_stack() {
        let t = tempfile::tempdir().unwrap();
        let outside = t.path().join("outside.txt");
        std::fs::write(&outside, "kept").unwrap();
        let top = t.path().join("box");
        std::fs::create_dir(&top).unwrap();
        // 20 000 levels (a recursive removal needs a frame and a descriptor per level), a file
        // and a link out of the tree every 1 000.
        let mut fd = rustix::fs::open(&top, DIR_FLAGS, Mode::empty()).unwrap();
        for level in 0..20_000 {
            if level % 1000 == 0 {
                rustix::fs::symlinkat(&outside, &fd, "link").unwrap();
                drop(std::fs::File::from(
                    rustix::fs::openat(
                        &fd,
                        "f",
                        OFlags::CREATE | OFlags::WRONLY,
                        Mode::from_raw_mode(0o600),
                    )
                    .unwrap(),
                ));
            }
            rustix::fs::mkdirat(&fd, "d", Mode::from_raw_mode(0o700)).unwrap();
            fd = rustix::fs::openat(&fd, "d", DIR_FLAGS, Mode::empty()).unwrap();
        }
        drop(fd);
        let path = top.clone();
        std::thread::Builder::new()
            .stack_size(128 << 10)
            .spawn(move || remove_path_tree(&path))
            .unwrap()
            .join()
            .unwrap()
            .unwrap();
        assert!(!top.exists());
        assert_eq!(std::fs::read_to_string(&outside).unwrap(), "kept");
        assert_eq!(std::fs::read_dir(t.path()).unwrap().count(), 1);
        remove_path_tree(&top).unwrap();
    }
}
