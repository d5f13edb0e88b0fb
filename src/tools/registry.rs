//! The trust rule for tool calls, in one place: **server params never come from the kernel, and
//! a kernel reaches only the servers the host registered for a directory it imports from.**
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
//! **Which registrations a kernel reaches.** A registration is a server name, the directory the
//! package was generated into (`root_dir`, as an absolute path with its parents' links resolved)
//! and the params. A kernel reaches it when `root_dir` or its parent is one of the kernel's
//! [`ImportRoots`] — the directories its executor was told to import from: the workspace (the
//! kernel's working directory) and the entries of `kernel_env`'s `PYTHONPATH` — because those are
//! exactly the places from which the generated package imports (`import <name>` from `root_dir`,
//! `import mcptools.<name>` from its parent). The roots come from the host's configuration of the
//! executor, never from the kernel: editing `sys.path`, writing a `.pth` or planting a link
//! changes nothing here (links are not followed inside directories a kernel can write, see
//! [`ImportRoots::new`]). A registration whose directory no longer exists is not reached (and is
//! dropped at the next registration). Two reachable registrations of one name with the same
//! params are one server; with different params (one name generated into two directories the
//! kernel imports from, say one per agent), the call goes to the registration whose recorded
//! params are exactly those written in the calling package: the kernel's params are *compared*
//! to pick among servers the host registered for this kernel, never used to start or reach
//! anything; when none matches, the call fails with an error that says what to do.
//!
//! Registrations come from the host: the MCP tool `register_mcp_server` and
//! `CodeExecutor::register_mcp_server` (for `<workspace>/mcptools`), `generate_mcp_sources` /
//! `ipybox apigen` (for their `root_dir`). They are kept in ipybox's data directory (a kernel
//! cannot write there: it is outside the workspace and denied to the sandbox), in
//! `registrations/servers.json`, directory 0700, file 0600 (params may hold literal tokens),
//! changed under a file lock (`servers.lock`) so that processes registering at once lose
//! nothing. A registry re-reads its file when it changed, so a server registered by another
//! process (a `generate_mcp_sources` after the executor started) is callable at once.
//!
//! Not here: connecting ([`super::sessions`]) or code generation (`crate::register`).

use std::path::{Component, Path, PathBuf};
use std::sync::Mutex;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::params::ServerParams;

/// The registered servers of this host (all directories), kept in one file.
#[derive(Debug)]
pub(crate) struct Registry {
    file: Option<PathBuf>,
    /// What the file held when it was last read, or the in-memory records of a registry
    /// without a file.
    state: Mutex<Loaded>,
}

#[derive(Debug, Default)]
struct Loaded {
    /// Which version of the file `servers` came from (inode, length, modification time: the
    /// file is replaced, never written in place).
    version: Option<(u64, u64, Option<SystemTime>)>,
    servers: Vec<Entry>,
}

/// One registration, as kept in the file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Entry {
    name: String,
    /// The directory the package was generated into (`<root_dir>/<name>/`).
    root_dir: PathBuf,
    /// The params as given (`${VAR}` unresolved).
    params: Value,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct File {
    servers: Vec<Entry>,
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

/// The directories one executor's kernels import from, as the host configured them: the
/// workspace, then the entries of `kernel_env`'s `PYTHONPATH`. What a kernel does to its own
/// `sys.path` plays no part.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct ImportRoots(Vec<PathBuf>);

/// The servers one executor's kernels can reach: the host's registry seen from their
/// [`ImportRoots`]. What the tool server resolves calls with.
#[derive(Debug)]
pub(crate) struct Reach {
    registry: std::sync::Arc<Registry>,
    roots: ImportRoots,
}

impl Reach {
    pub(crate) fn new(registry: std::sync::Arc<Registry>, roots: ImportRoots) -> Self {
        Self { registry, roots }
    }

    /// The trust rule: see [`Registry::resolve`].
    pub(crate) fn resolve(
        &self,
        server_name: &str,
        sent_params: &Value,
    ) -> Result<Registered, NotRegistered> {
        self.registry.resolve(server_name, sent_params, &self.roots)
    }
}

impl ImportRoots {
    /// The roots of a kernel whose working directory is `workspace` (absolute, canonical) and
    /// whose `kernel_env` sets `PYTHONPATH` to `python_path`. Entries are taken as Python takes
    /// them (relative ones from the working directory, `.` and `..` folded, empty ones dropped),
    /// then links are resolved, except below a directory of `unfollowed` (those a kernel can
    /// write: a link there may have been planted to point the root somewhere else), where the
    /// rest of the path is taken as written.
    pub(crate) fn new(workspace: &Path, python_path: Option<&str>, unfollowed: &[PathBuf]) -> Self {
        let mut roots = vec![workspace.to_path_buf()];
        for entry in python_path
            .unwrap_or("")
            .split(':')
            .filter(|e| !e.is_empty())
        {
            let root = resolve_links(&fold(&workspace.join(entry)), unfollowed);
            if !roots.contains(&root) {
                roots.push(root);
            }
        }
        Self(roots)
    }

    /// Whether a package generated into `root_dir` imports from one of these roots.
    fn reach(&self, root_dir: &Path) -> bool {
        self.0
            .iter()
            .any(|r| r == root_dir || root_dir.parent() == Some(r.as_path()))
    }

    /// The roots, for messages: `/ws, /tmp/x`.
    fn listed(&self) -> String {
        self.0
            .iter()
            .map(|r| r.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// `path` (absolute) with `.` dropped and `..` taking away the component before it, as Python
/// does with `sys.path` entries (`os.path.abspath`).
fn fold(path: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    for c in path.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::ParentDir => {
                out.pop();
            }
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    out
}

/// `path` (absolute, folded) with links resolved one component at a time, until the path so far
/// lies in one of `unfollowed`: from there on the components are taken as written. A component
/// that does not exist ends the resolving too.
fn resolve_links(path: &Path, unfollowed: &[PathBuf]) -> PathBuf {
    let mut done = PathBuf::from("/");
    let mut following = true;
    for c in path.components().skip(1) {
        if following && unfollowed.iter().any(|u| done.starts_with(u)) {
            following = false;
        }
        let next = done.join(c);
        done = if following {
            next.canonicalize().unwrap_or_else(|_| {
                following = false;
                next
            })
        } else {
            next
        };
    }
    done
}

/// The directory a registration is recorded for: `root_dir` as an absolute path (relative to
/// the current directory) whose parent's links are resolved; its last component is taken as it
/// is (the package was written there without following a link: `safe_fs::NoFollowDir`). The
/// parent must exist.
pub(crate) fn registration_root(root_dir: &Path) -> std::io::Result<PathBuf> {
    match (root_dir.parent(), root_dir.file_name()) {
        (Some(parent), Some(name)) => {
            let parent = if parent.as_os_str().is_empty() {
                Path::new(".")
            } else {
                parent
            };
            Ok(parent.canonicalize()?.join(name))
        }
        _ => root_dir.canonicalize(),
    }
}

impl Registry {
    /// A registry kept in memory only (no data directory).
    pub(crate) fn in_memory() -> Self {
        Self {
            file: None,
            state: Mutex::default(),
        }
    }

    /// The registry kept under `data_dir/registrations/`.
    pub(crate) fn open(data_dir: &Path) -> Self {
        Self {
            file: Some(data_dir.join("registrations").join("servers.json")),
            state: Mutex::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Loaded> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The records, re-read from the file if it changed since the last read.
    fn current(&self) -> std::sync::MutexGuard<'_, Loaded> {
        use std::os::unix::fs::MetadataExt;
        let mut loaded = self.lock();
        if let Some(file) = &self.file {
            let version = std::fs::metadata(file)
                .ok()
                .map(|m| (m.ino(), m.len(), m.modified().ok()));
            if version != loaded.version || version.is_none() {
                loaded.servers = std::fs::read(file)
                    .ok()
                    .and_then(|bytes| serde_json::from_slice::<File>(&bytes).ok())
                    .unwrap_or_default()
                    .servers;
                loaded.version = version;
            }
        }
        loaded
    }

    /// Records (or replaces) the registration of `name` for `root_dir` (see
    /// [`registration_root`]) and writes the registry (0600, atomically, under the file lock).
    /// Registrations of other names or directories stay, except those whose directory is gone.
    pub(crate) fn record(
        &self,
        name: &str,
        root_dir: &Path,
        params: &Value,
    ) -> std::io::Result<()> {
        let _file_lock = match &self.file {
            Some(file) => Some(FileLock::exclusive(&file.with_extension("lock"))?),
            None => None,
        };
        let mut loaded = self.current();
        loaded
            .servers
            .retain(|e| !(e.name == name && e.root_dir == root_dir) && e.root_dir.is_dir());
        loaded.servers.push(Entry {
            name: name.to_string(),
            root_dir: root_dir.to_path_buf(),
            params: params.clone(),
        });
        loaded
            .servers
            .sort_by(|a, b| (&a.root_dir, &a.name).cmp(&(&b.root_dir, &b.name)));
        if let Some(file) = &self.file {
            let snapshot = serde_json::to_vec_pretty(&File {
                servers: loaded.servers.clone(),
            })
            .map_err(std::io::Error::other)?;
            crate::safe_fs::write_private(file, &snapshot)?;
            // Read again on next use: our own write is a new version of the file.
            loaded.version = None;
            loaded.servers.clear();
        }
        Ok(())
    }

    /// The trust rule: the server a kernel with import roots `roots` reaches when its code calls
    /// `server_name` — the one registered for a directory it imports from, with its recorded
    /// params — or why there is none. The params the kernel sent (`sent_params`) are never used:
    /// only when several registrations of the name with different params are reachable, they
    /// are compared with the recorded ones to tell which package the call came from.
    pub(crate) fn resolve(
        &self,
        server_name: &str,
        sent_params: &Value,
        roots: &ImportRoots,
    ) -> Result<Registered, NotRegistered> {
        let mut found: Vec<Entry> = self
            .current()
            .servers
            .iter()
            .filter(|e| e.name == server_name && roots.reach(&e.root_dir))
            .cloned()
            .collect();
        found.retain(|e| e.root_dir.is_dir());
        let name = super::shown::name(server_name, super::shown::Syntax::Json);
        let example = if super::shown::is_plain_name(server_name) {
            server_name
        } else {
            "NAME"
        };
        let Some(first) = found.first() else {
            return Err(NotRegistered(format!(
                "MCP server `{name}` is not registered for any directory this kernel imports from: kernel code can only call servers the host registered, with the params recorded then\n  help: register it where the kernel imports its package from: generate_mcp_sources(\"{example}\", params, root_dir=DIR) (Python/Rust) or `ipybox apigen {example} --params ... --root DIR`, where DIR or its parent is one of {} (the workspace, then kernel_env's PYTHONPATH); over MCP: register_mcp_server",
                roots.listed()
            )));
        };
        let chosen = if found.iter().all(|e| e.params == first.params) {
            first
        } else if let Some(same) = found.iter().find(|e| &e.params == sent_params) {
            // The package the call came from: its params are this registration's.
            same
        } else {
            let dirs = found
                .iter()
                .map(|e| format!("    {}", e.root_dir.display()))
                .collect::<Vec<_>>()
                .join("\n");
            return Err(NotRegistered(format!(
                "MCP server `{name}` is registered for {} directories this kernel imports from, with different params, and the calling code's params are those of none of them, so ipybox cannot tell which one it means:\n{dirs}\n  help: call it through the package generated in one of these directories (not edited, not a ToolRunner of your own), register one of them under another name (generate_mcp_sources(\"{example}_2\", params, root_dir=DIR) or `ipybox apigen {example}_2 ... --root DIR`), or import from only one of them (working_dir, kernel_env's PYTHONPATH)",
                found.len()
            )));
        };
        let params = chosen.params.clone();
        let target = ServerParams::parse(&params)
            .map(|p| p.command_or_url())
            .map_err(|e| {
                NotRegistered(format!(
                    "the registration of MCP server `{name}` is unreadable ({e})\n  help: register it again"
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

/// An exclusive lock on a file of the data directory (created 0600, never through a link),
/// released when dropped.
struct FileLock(std::fs::File);

impl FileLock {
    fn exclusive(path: &Path) -> std::io::Result<Self> {
        if let Some(dir) = path.parent() {
            crate::safe_fs::create_private_dir(dir)?;
        }
        let file = crate::safe_fs::open_lock_file(path)?;
        fs4::fs_std::FileExt::lock_exclusive(&file)?;
        Ok(Self(file))
    }
}

impl Drop for FileLock {
    fn drop(&mut self) {
        let _ = fs4::fs_std::FileExt::unlock(&self.0);
    }
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

    fn roots(dirs: &[&Path]) -> ImportRoots {
        ImportRoots(dirs.iter().map(|d| d.to_path_buf()).collect())
    }

    #[test]
    fn persists_privately_and_sees_other_writers() {
        use std::os::unix::fs::PermissionsExt;
        let data = tempfile::tempdir().unwrap();
        let ws = tempfile::tempdir().unwrap();
        let tools = ws.path().join("mcptools");
        std::fs::create_dir(&tools).unwrap();
        let a = Registry::open(data.path());
        a.record("fx", &tools, &json!({"command": "x"})).unwrap();
        let other = Registry::open(data.path());
        let here = roots(&[ws.path()]);
        assert_eq!(
            other.resolve("fx", &json!({}), &here).unwrap().params,
            json!({"command": "x"})
        );
        // Another process re-registers: the first registry sees it.
        other
            .record("fx", &tools, &json!({"command": "y"}))
            .unwrap();
        assert_eq!(
            a.resolve("fx", &json!({}), &here).unwrap().params,
            json!({"command": "y"})
        );
        let dir = data.path().join("registrations");
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&dir.join("servers.json")), 0o600);
        assert_eq!(mode(&dir.join("servers.lock")), 0o600);
    }

    /// Processes registering at the same time lose nothing (the file lock).
    #[test]
    fn concurrent_registrations_are_all_kept() {
        let data = tempfile::tempdir().unwrap();
        let ws = tempfile::tempdir().unwrap();
        let dirs: Vec<PathBuf> = (0..8).map(|i| ws.path().join(format!("d{i}"))).collect();
        std::thread::scope(|s| {
            for dir in &dirs {
                let data = data.path();
                s.spawn(move || {
                    std::fs::create_dir(dir).unwrap();
                    let registry = Registry::open(data);
                    for n in 0..5 {
                        registry
                            .record(&format!("s{n}"), dir, &json!({"command": "x"}))
                            .unwrap();
                    }
                });
            }
        });
        let registry = Registry::open(data.path());
        for dir in &dirs {
            for n in 0..5 {
                registry
                    .resolve(&format!("s{n}"), &json!({}), &roots(&[dir]))
                    .unwrap_or_else(|e| panic!("{} s{n}: {e:?}", dir.display()));
            }
        }
    }

    /// The rule's table: which registrations a kernel with which roots reaches.
    #[test]
    fn kernels_reach_servers_registered_for_a_directory_they_import_from() {
        let tmp = tempfile::tempdir().unwrap();
        let t = tmp.path();
        for d in [
            "ws/mcptools",
            "ws/lib",
            "ws/deep/er/mcptools",
            "tools",
            "other/mcptools",
        ] {
            std::fs::create_dir_all(t.join(d)).unwrap();
        }
        let registry = Registry::in_memory();
        let p = |who: &str| json!({"command": "python3", "args": [format!("{who}.py")]});
        // <ws>/mcptools (import mcptools.fx from the workspace), a temp dir (import fx from
        // PYTHONPATH), a package two levels down (not an import root's package), another
        // workspace's.
        registry
            .record("fx", &t.join("ws/mcptools"), &p("ws"))
            .unwrap();
        registry
            .record("tx", &t.join("tools"), &p("tools"))
            .unwrap();
        registry
            .record("deep", &t.join("ws/deep/er/mcptools"), &p("deep"))
            .unwrap();
        registry
            .record("ox", &t.join("other/mcptools"), &p("other"))
            .unwrap();
        let ws = t.join("ws");
        let table: &[(&str, ImportRoots, Result<Value, &str>)] = &[
            ("fx", roots(&[&ws]), Ok(p("ws"))),
            ("fx", roots(&[&t.join("ws/mcptools")]), Ok(p("ws"))),
            ("tx", roots(&[&ws]), Err("is not registered")),
            ("tx", roots(&[&ws, &t.join("tools")]), Ok(p("tools"))),
            // The parent of a root_dir counts: `import tools.tx` from there.
            ("tx", roots(&[t]), Ok(p("tools"))),
            ("deep", roots(&[&ws]), Err("is not registered")),
            ("deep", roots(&[&t.join("ws/deep/er")]), Ok(p("deep"))),
            (
                "ox",
                roots(&[&ws, &t.join("tools")]),
                Err("is not registered"),
            ),
            ("sh", roots(&[&ws]), Err("is not registered")),
            (
                "",
                roots(&[&ws]),
                Err("MCP server `\"\"` is not registered"),
            ),
            (
                "FX",
                roots(&[&ws]),
                Err("MCP server `FX` is not registered"),
            ),
        ];
        for (name, r, expected) in table {
            match (
                registry.resolve(name, &json!({"command": "sh"}), r),
                expected,
            ) {
                (Ok(got), Ok(params)) => assert_eq!(&got.params, params, "{name} {r:?}"),
                (Err(NotRegistered(why)), Err(part)) => {
                    assert!(why.contains(part), "{name} {r:?}: {why}")
                }
                (got, want) => panic!("{name} {r:?}: got {got:?}, want {want:?}"),
            }
        }
        // The refusal names the roots it looked in.
        let Err(NotRegistered(why)) = registry.resolve("tx", &json!({}), &roots(&[&ws])) else {
            panic!()
        };
        assert!(
            why.starts_with("MCP server `tx` is not registered for any directory this kernel imports from: kernel code can only call servers the host registered, with the params recorded then\n  help: register it where the kernel imports its package from: generate_mcp_sources(\"tx\", params, root_dir=DIR)"),
            "{why}"
        );
        assert!(
            why.contains(&format!("is one of {} (the workspace", ws.display())),
            "{why}"
        );
        // Gone directories are not reached, and are dropped at the next registration.
        std::fs::remove_dir(t.join("tools")).unwrap();
        assert!(registry.resolve("tx", &json!({}), &roots(&[t])).is_err());
        registry
            .record("fx", &t.join("ws/mcptools"), &p("ws"))
            .unwrap();
        assert!(registry.lock().servers.iter().all(|e| e.name != "tx"));
    }

    /// Two reachable registrations of one name: one server if their params are equal; else the
    /// one whose params the calling package holds (compared, never used: a forged or edited
    /// value reaches neither), and without such a package an error that names the directories
    /// and what to do.
    #[test]
    fn two_reachable_registrations_of_one_name() {
        let tmp = tempfile::tempdir().unwrap();
        let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
        std::fs::create_dir_all(&a).unwrap();
        std::fs::create_dir_all(&b).unwrap();
        let registry = Registry::in_memory();
        let same = json!({"command": "python3", "args": ["s.py"]});
        let other = json!({"command": "python3", "args": ["other.py"]});
        registry.record("fx", &a, &same).unwrap();
        registry.record("fx", &b, &same).unwrap();
        let both = roots(&[&a, &b]);
        let forged = json!({"command": "sh", "args": ["-c", "x"]});
        assert_eq!(registry.resolve("fx", &forged, &both).unwrap().params, same);
        registry.record("fx", &b, &other).unwrap();
        assert_eq!(
            registry
                .resolve("fx", &forged, &roots(&[&a]))
                .unwrap()
                .params,
            same
        );
        assert_eq!(registry.resolve("fx", &same, &both).unwrap().params, same);
        assert_eq!(registry.resolve("fx", &other, &both).unwrap().params, other);
        for sent in [
            forged,
            json!({}),
            json!({"command": "python3", "args": ["s.py"], "cwd": "/"}),
        ] {
            let Err(NotRegistered(why)) = registry.resolve("fx", &sent, &both) else {
                panic!("{sent}: ambiguous names must be refused")
            };
            assert_eq!(
                why,
                format!(
                    "MCP server `fx` is registered for 2 directories this kernel imports from, with different params, and the calling code's params are those of none of them, so ipybox cannot tell which one it means:\n    {}\n    {}\n  help: call it through the package generated in one of these directories (not edited, not a ToolRunner of your own), register one of them under another name (generate_mcp_sources(\"fx_2\", params, root_dir=DIR) or `ipybox apigen fx_2 ... --root DIR`), or import from only one of them (working_dir, kernel_env's PYTHONPATH)",
                    a.display(),
                    b.display()
                )
            );
        }
    }

    #[test]
    fn import_roots_are_taken_as_python_takes_them() {
        let tmp = tempfile::tempdir().unwrap();
        let t = tmp.path().canonicalize().unwrap();
        let ws = t.join("ws");
        for d in ["ws/lib", "elsewhere/tools", "outside"] {
            std::fs::create_dir_all(t.join(d)).unwrap();
        }
        std::os::unix::fs::symlink(t.join("elsewhere"), t.join("link")).unwrap();
        // A link inside the workspace (a sandboxed kernel could have planted it).
        std::os::unix::fs::symlink(t.join("outside"), ws.join("planted")).unwrap();
        let pythonpath = format!(
            "lib::./lib/../lib:{l}/tools:{ws}/planted:{t}/missing/x",
            l = t.join("link").display(),
            ws = ws.display(),
            t = t.display()
        );
        let followed = ImportRoots::new(&ws, Some(&pythonpath), &[]);
        assert_eq!(
            followed.0,
            vec![
                ws.clone(),
                ws.join("lib"),
                t.join("elsewhere/tools"),
                t.join("outside"),
                t.join("missing/x"),
            ]
        );
        // Below a kernel-writable directory links are not followed; outside it they are.
        let guarded = ImportRoots::new(&ws, Some(&pythonpath), std::slice::from_ref(&ws));
        assert_eq!(
            guarded.0,
            vec![
                ws.clone(),
                ws.join("lib"),
                t.join("elsewhere/tools"),
                ws.join("planted"),
                t.join("missing/x"),
            ]
        );
        assert_eq!(ImportRoots::new(&ws, None, &[]).0, vec![ws.clone()]);
    }

    #[test]
    fn registration_roots_resolve_the_parent_only() {
        let tmp = tempfile::tempdir().unwrap();
        let t = tmp.path().canonicalize().unwrap();
        std::fs::create_dir_all(t.join("real/mcptools")).unwrap();
        std::os::unix::fs::symlink(t.join("real"), t.join("alias")).unwrap();
        assert_eq!(
            registration_root(&t.join("alias/mcptools")).unwrap(),
            t.join("real/mcptools")
        );
        assert_eq!(
            registration_root(&t.join("alias/mcptools/.")).unwrap(),
            t.join("real/mcptools")
        );
        assert_eq!(
            registration_root(&t.join("real/mcptools/..")).unwrap(),
            t.join("real")
        );
    }
}
