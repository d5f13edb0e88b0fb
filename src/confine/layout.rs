//! What a confined kernel sees of the host: a view built by allowlist (as Flatpak and nsjail
//! build theirs). bwrap starts from an empty root (a tmpfs, read-only once the view is made)
//! and shows only:
//! - the system directories ([`SYSTEM_DIRS`], read-only; a link on the host, as with usrmerge's
//!   `/bin -> usr/bin`, is the same link) and a minimal `/etc` ([`ETC_SHOWN`]: what Python, SSL
//!   and name resolution read; `passwd` and `group` are generated, with the kernel's user only);
//! - the interpreter's own directories (`sandbox::wrap::python_dirs`: a managed environment
//!   under `$IPYBOX_HOME`, a uv-managed Python under `~/.local/share/uv`, `/opt/...`);
//! - the paths the operator adds (`Confinement::shown`, `serve --http --session-show`);
//! - a private `/dev`, the pid namespace's `/proc`, private empty `/tmp`, `$HOME`, `$TMPDIR`,
//!   `/run` and ipybox's data directory (in memory, gone with the kernel);
//! - the workspace (read-only), the executor's runtime directory (read-only) with `box/` and
//!   `work/` writable; the caller's hidden paths inside what is shown emptied.
//!
//! Everything else of the host is absent: `/etc/shadow`, the rest of `/etc`, `/srv`, `/opt`,
//! `/home`, `/root`, `/var`, an operator's token and key files wherever they are.
//!
//! The kernel factory's template ([`Layout::for_template`]) gets this view; a kernel forked from
//! it inherits it and makes its per-kernel part itself ([`Layout::fork_plan`]: the same mounts
//! minus the system ones, which are the template's already).

use std::path::{Path, PathBuf};

use crate::host_env::HostEnv;

use super::{Confinement, WORK_DIR};

/// The host's system directories a confined kernel sees, read-only (as the same link when one
/// is a link on the host; absent when absent there).
pub const SYSTEM_DIRS: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32",
];

/// What a confined kernel sees of the host's `/etc`, read-only (entries absent on the host are
/// left out): the host name, name resolution (`hosts`, `resolv.conf`, `nsswitch.conf`, `host.conf`,
/// `gai.conf`, `protocols`, `services`), the time zone, the CA certificates and OpenSSL's
/// configuration (Debian's `ssl/certs`, Fedora's `pki/` trust store: never `ssl/private` nor
/// `pki/tls/private`), the dynamic linker's cache and configuration, `mime.types`,
/// `os-release`, Debian's `alternatives` (links the tools in `/usr/bin` go through).
/// `passwd` and `group` are not the host's: see [`generated_etc`].
pub const ETC_SHOWN: &[&str] = &[
    "/etc/hosts",
    "/etc/hostname",
    "/etc/resolv.conf",
    "/etc/nsswitch.conf",
    "/etc/host.conf",
    "/etc/gai.conf",
    "/etc/protocols",
    "/etc/services",
    "/etc/localtime",
    "/etc/timezone",
    "/etc/ssl/certs",
    "/etc/ssl/openssl.cnf",
    "/etc/ssl/cert.pem",
    "/etc/ca-certificates",
    "/etc/ca-certificates.conf",
    "/etc/pki/ca-trust",
    "/etc/pki/tls/certs",
    "/etc/pki/tls/cert.pem",
    "/etc/pki/tls/openssl.cnf",
    "/etc/crypto-policies",
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/mime.types",
    "/etc/os-release",
    "/etc/alternatives",
];

/// Where a confined kernel's directories are on the host, and what it is shown of them.
#[derive(Debug, Clone)]
pub(crate) struct Layout {
    /// The system part of the view (system directories, `/etc`), made once by bwrap (the
    /// template's for forked kernels): never part of [`Self::fork_plan`].
    system: Vec<System>,
    /// Shown read-only: the shared workspace, the directories the interpreter needs, the
    /// resolver's configuration, the operator's shown paths, the executor's runtime directory
    /// (in this order).
    read_only: Vec<PathBuf>,
    /// Shown writable: the runtime directory's kernel-writable part (`box/`) and the working
    /// directory (`<runtime>/work`); for the shared template, the directory of runtime
    /// directories.
    writable: Vec<PathBuf>,
    /// Private empty directories: where runtime directories live, temp directories, `$HOME`,
    /// ipybox's data directory, `/run`.
    emptied: Vec<PathBuf>,
    /// The caller's hidden paths.
    hidden: Vec<PathBuf>,
    /// A network namespace of its own (`--session-network none` or `proxy`).
    pub(crate) unshare_net: bool,
    /// The directory holding this session's own `passwd` and `group` (its uid's: see
    /// [`Self::with_session_user`]), shown as `/etc/passwd` and `/etc/group` instead of the
    /// shared ones.
    users: Option<PathBuf>,
}

/// One entry of the system part of the view.
#[derive(Debug, Clone, PartialEq, Eq)]
enum System {
    /// `path` is a link to `target` (as on the host).
    Link { target: PathBuf, path: PathBuf },
    /// `source` on the host is shown read-only at `path`.
    Bind { source: PathBuf, path: PathBuf },
}

/// How one path of a [`Layout`] is mounted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Mount {
    Empty,
    /// An empty directory the kernel may write whatever its uid (`/tmp`, `$HOME`, ...: mode
    /// 1777, private to the kernel).
    Scratch,
    EmptyFile,
    ReadOnly,
    Writable,
}

impl Layout {
    /// The layout of an executor whose runtime directory is `runtime_dir`.
    pub(crate) fn new(
        host: &HostEnv,
        runtime_dir: &Path,
        kernel_writable: &Path,
        workspace: &Path,
        python: &Path,
        confinement: &Confinement,
    ) -> Self {
        let mut layout = Self::common(host, workspace, python, confinement);
        layout.read_only.push(runtime_dir.to_path_buf());
        layout.writable = vec![kernel_writable.to_path_buf(), runtime_dir.join(WORK_DIR)];
        layout
    }

    /// The view of the kernel factory's template shared by several executors
    /// ([`super::template_wrapper`]): what every kernel sees, and `shared_dir`, the directory
    /// that holds their runtime directories (and the factory's socket), writable.
    pub(crate) fn for_template(
        host: &HostEnv,
        shared_dir: &Path,
        workspace: &Path,
        python: &Path,
        confinement: &Confinement,
    ) -> Self {
        let mut layout = Self::common(host, workspace, python, confinement);
        layout.writable = vec![shared_dir.to_path_buf()];
        layout
    }

    fn common(host: &HostEnv, workspace: &Path, python: &Path, confinement: &Confinement) -> Self {
        let mut emptied = vec![
            crate::runtime_layout::base_dir(host),
            crate::runtime_layout::temp_dir(host),
            PathBuf::from("/tmp"),
            PathBuf::from("/run"),
        ];
        emptied.extend(host.get("HOME").map(PathBuf::from));
        emptied.extend(host.data_dir());
        emptied.retain(|p| p.is_absolute() && p.components().count() > 1);
        let mut read_only = vec![workspace.to_path_buf()];
        read_only.extend(crate::sandbox::wrap::python_dirs(python, host));
        // The resolver's configuration may be a link into /run (systemd-resolved): the
        // directory it is in is shown, and the link kept (it follows the resolver's updates).
        let resolver_dir = std::fs::canonicalize("/etc/resolv.conf")
            .ok()
            .filter(|p| p.starts_with("/run"))
            .and_then(|p| p.parent().map(Path::to_path_buf));
        read_only.extend(resolver_dir.clone());
        read_only.extend(confinement.shown.iter().cloned());
        let system = system_view(host, resolver_dir.as_deref());
        // A hidden path outside the view is absent already (and must not get a mount point).
        let hidden = confinement
            .hidden
            .iter()
            .filter(|p| {
                read_only.iter().any(|d| p.starts_with(d))
                    || system.iter().any(|s| match s {
                        System::Bind { path, .. } => p.starts_with(path),
                        System::Link { .. } => false,
                    })
            })
            .cloned()
            .collect();
        Self {
            system,
            read_only,
            writable: Vec::new(),
            emptied,
            hidden,
            unshare_net: confinement.network.mode.unshares(),
            users: None,
        }
    }

    /// The session's kernels run as `uid`/`gid` (`super::uids`): they see `/etc/passwd` and
    /// `/etc/group` naming that uid (`ipybox`, `$HOME`), written to `<runtime_dir>/etc/`.
    pub(crate) fn with_session_user(
        mut self,
        host: &HostEnv,
        runtime_dir: &Path,
        uid: u32,
        gid: u32,
    ) -> std::io::Result<Self> {
        let path = runtime_dir.join("etc");
        let dir = crate::safe_fs::NoFollowDir::open(&path, Some(0o755))?;
        let (passwd, group) = etc_users(uid, gid, host.get("HOME").unwrap_or("/"), None);
        for (name, text) in [("passwd", passwd), ("group", group)] {
            dir.rewrite(name, text.as_bytes(), 0o644)?;
            std::fs::set_permissions(
                path.join(name),
                std::os::unix::fs::PermissionsExt::from_mode(0o644),
            )?;
        }
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
        self.users = Some(path);
        Ok(self)
    }

    /// Shows `dir` read-only too (for a forked kernel: the template's copy of ipybox's
    /// kernel-side Python, which its preloaded modules come from).
    pub(crate) fn show_read_only(mut self, dir: PathBuf) -> Self {
        self.read_only.push(dir);
        self
    }

    /// Every mount, shallower paths first (so a deeper one is mounted inside: the workspace
    /// inside an emptied `/tmp`, `box/` inside the read-only runtime directory), and at one
    /// depth in this order: emptied, hidden, read-only, writable. Each (path, kind) once.
    fn mounts(&self) -> Vec<(PathBuf, Mount)> {
        let mut mounts: Vec<(PathBuf, Mount)> = Vec::new();
        for dir in &self.emptied {
            mounts.push((dir.clone(), Mount::Scratch));
        }
        for path in &self.hidden {
            match std::fs::symlink_metadata(path) {
                Ok(m) if m.is_dir() => mounts.push((path.clone(), Mount::Empty)),
                Ok(_) => mounts.push((path.clone(), Mount::EmptyFile)),
                Err(_) => {}
            }
        }
        for dir in &self.read_only {
            mounts.push((dir.clone(), Mount::ReadOnly));
        }
        for dir in &self.writable {
            mounts.push((dir.clone(), Mount::Writable));
        }
        // Stable: at one depth the order above holds.
        mounts.sort_by_key(|(path, _)| path.components().count());
        let mut seen = std::collections::HashSet::new();
        mounts.retain(|(path, mount)| seen.insert((path.clone(), *mount)));
        mounts
    }

    /// bwrap's mount arguments: no `/` (bwrap's root is then an empty tmpfs), the system part,
    /// a `/dev` and a `/proc`, then [`Self::mounts`], and the root made read-only.
    pub(crate) fn mount_args(&self) -> Vec<String> {
        let mut args: Vec<String> = Vec::new();
        // bwrap makes the missing parents of what it mounts with mode 0700 (root's): readable
        // by root only, so a kernel with a uid of its own could not reach `/etc/hosts` or its
        // interpreter. Each parent not mounted already is made first, 0755.
        // Inside a scratch directory (`$HOME` holding the interpreter's directories) they are
        // 1777: the kernel writes there (`~/.local`).
        let mut made = std::collections::HashSet::new();
        let mounts = self.mounts();
        let scratch: Vec<PathBuf> = mounts
            .iter()
            .filter(|(_, m)| *m == Mount::Scratch)
            .map(|(p, _)| p.clone())
            .collect();
        for entry in &self.system {
            match entry {
                System::Link { path, .. } | System::Bind { path, .. } => {
                    make_parents(&mut args, &mut made, &scratch, path)
                }
            }
            match entry {
                System::Link { target, path } => args.extend([
                    "--symlink".into(),
                    target.display().to_string(),
                    path.display().to_string(),
                ]),
                System::Bind { source, path } => {
                    let source = self.users_file(path).unwrap_or_else(|| source.clone());
                    args.extend([
                        "--ro-bind".into(),
                        source.display().to_string(),
                        path.display().to_string(),
                    ])
                }
            }
        }
        args.extend(["--dev", "/dev", "--proc", "/proc"].map(String::from));
        for (path, mount) in mounts {
            make_parents(&mut args, &mut made, &scratch, &path);
            let p = path.display().to_string();
            match mount {
                Mount::Empty => args.extend(["--tmpfs".into(), p]),
                Mount::Scratch => {
                    args.extend(["--perms".into(), "1777".into(), "--tmpfs".into(), p])
                }
                Mount::EmptyFile => args.extend(["--ro-bind".into(), "/dev/null".into(), p]),
                Mount::ReadOnly => args.extend(["--ro-bind".into(), p.clone(), p]),
                Mount::Writable => args.extend(["--bind".into(), p.clone(), p]),
            }
        }
        args.extend(["--remount-ro", "/"].map(String::from));
        args
    }

    /// What a kernel forked from the shared template does to see this layout, starting from the
    /// template's view (`python/ipybox_runtime/confine_child.py` reads it): [`Self::mounts`] as
    /// `[kind, path]` pairs, kinds `tmpfs`, `file`, `ro`, `rw`. Every path it binds back is in
    /// the template's view, where it is the same path; the system part is the template's.
    pub(crate) fn fork_plan(&self) -> serde_json::Value {
        let mounts: Vec<serde_json::Value> = self
            .mounts()
            .into_iter()
            .map(|(path, mount)| {
                let kind = match mount {
                    Mount::Empty => "tmpfs",
                    Mount::Scratch => "scratch",
                    Mount::EmptyFile => "file",
                    Mount::ReadOnly => "ro",
                    Mount::Writable => "rw",
                };
                serde_json::json!([kind, path.display().to_string()])
            })
            .collect();
        let users = self.users.as_ref().map(|d| {
            serde_json::json!({
                "/etc/passwd": d.join("passwd").display().to_string(),
                "/etc/group": d.join("group").display().to_string(),
            })
        });
        serde_json::json!({ "mounts": mounts, "net": self.unshare_net, "users": users })
    }

    /// This session's own `/etc/passwd` or `/etc/group` (`path`), if it has them.
    fn users_file(&self, path: &Path) -> Option<PathBuf> {
        let name = path.strip_prefix("/etc").ok()?.to_str()?;
        matches!(name, "passwd" | "group")
            .then(|| self.users.as_ref().map(|d| d.join(name)))
            .flatten()
    }
}

/// bwrap's arguments that make each parent of `path` (below `/`) not in `made` as a directory,
/// mode 0755, or 1777 below a `scratch` directory ([`Layout::mount_args`]); `path` itself is
/// then in `made`.
fn make_parents(
    args: &mut Vec<String>,
    made: &mut std::collections::HashSet<PathBuf>,
    scratch: &[PathBuf],
    path: &Path,
) {
    let mut ancestors: Vec<&Path> = path
        .ancestors()
        .skip(1)
        .filter(|a| a.parent().is_some())
        .collect();
    ancestors.reverse();
    for a in ancestors {
        if made.insert(a.to_path_buf()) {
            let shared = scratch.iter().any(|s| a.starts_with(s) && a != s);
            args.extend([
                "--perms".into(),
                if shared { "1777" } else { "0755" }.into(),
                "--dir".into(),
                a.display().to_string(),
            ]);
        }
    }
    made.insert(path.to_path_buf());
}

/// The system part of the view: [`SYSTEM_DIRS`], [`ETC_SHOWN`] and the generated `passwd` and
/// `group`. A link on the host whose target is in the view stays a link (usrmerge's `/bin`,
/// `/etc/localtime`, a `resolv.conf` into `resolver_dir`); any other link is shown as what it
/// points to.
fn system_view(host: &HostEnv, resolver_dir: Option<&Path>) -> Vec<System> {
    let mut shown_dirs: Vec<PathBuf> = SYSTEM_DIRS
        .iter()
        .map(PathBuf::from)
        .filter(|p| std::fs::symlink_metadata(p).is_ok_and(|m| m.is_dir()))
        .collect();
    shown_dirs.extend(resolver_dir.map(Path::to_path_buf));
    let mut system = Vec::new();
    for path in SYSTEM_DIRS.iter().chain(ETC_SHOWN).map(PathBuf::from) {
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if meta.is_symlink() {
            let in_view = std::fs::canonicalize(&path)
                .is_ok_and(|real| shown_dirs.iter().any(|d| real.starts_with(d)));
            match std::fs::read_link(&path) {
                Ok(target) if in_view => {
                    system.push(System::Link { target, path });
                    continue;
                }
                _ => {}
            }
            // A link out of the view (a dangling one is left out).
            if !path.exists() {
                continue;
            }
        }
        system.push(System::Bind {
            source: path.clone(),
            path,
        });
    }
    match generated_etc(host) {
        Ok(dir) => {
            for name in ["passwd", "group"] {
                system.push(System::Bind {
                    source: dir.join(name),
                    path: Path::new("/etc").join(name),
                });
            }
        }
        Err(e) => tracing::warn!(
            "confined kernels get no /etc/passwd nor /etc/group (user names do not resolve): {e}"
        ),
    }
    system
}

/// The `/etc/passwd` and `/etc/group` a confined kernel sees, in `<data dir>/confine-etc/`:
/// `root`, the kernel's user (its uid and gid, `$HOME`) and `nobody`, not the host's users.
fn generated_etc(host: &HostEnv) -> std::io::Result<PathBuf> {
    let data = host
        .data_dir()
        .ok_or_else(|| std::io::Error::other("no data directory ($IPYBOX_HOME, $HOME unset)"))?;
    let path = data.join("confine-etc");
    let dir = crate::safe_fs::open_private_dir(&path)?;
    // SAFETY: getuid and getgid have no preconditions.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let home = host.get("HOME").unwrap_or("/");
    let (passwd, group) = etc_users(uid, gid, home, host.get("USER"));
    for (name, text) in [("passwd", passwd), ("group", group)] {
        if std::fs::read_to_string(path.join(name)).ok().as_deref() != Some(text.as_str()) {
            dir.rewrite(name, text.as_bytes(), 0o644)?;
        }
    }
    Ok(path)
}

/// The text of the generated `passwd` and `group` (see [`generated_etc`]).
fn etc_users(uid: u32, gid: u32, home: &str, user: Option<&str>) -> (String, String) {
    let clean = |s: &str| s.replace([':', '\n'], "_");
    let home = clean(home);
    let mut passwd = String::new();
    let mut group = String::from("root:x:0:\n");
    if uid == 0 {
        passwd.push_str(&format!("root:x:0:0:root:{home}:/bin/sh\n"));
    } else {
        passwd.push_str("root:x:0:0:root:/root:/bin/sh\n");
        let name = user
            .filter(|u| !u.is_empty() && *u != "root" && *u != "nobody")
            .map(clean)
            .unwrap_or_else(|| "ipybox".into());
        passwd.push_str(&format!("{name}:x:{uid}:{gid}:{name}:{home}:/bin/sh\n"));
        if gid != 0 && gid != 65534 {
            group.push_str(&format!("{name}:x:{gid}:\n"));
        }
    }
    passwd.push_str("nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n");
    group.push_str("nogroup:x:65534:\n");
    (passwd, group)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(emptied: &[&str], workspace: &str, runtime: &str) -> Layout {
        Layout {
            system: vec![
                System::Bind {
                    source: "/usr".into(),
                    path: "/usr".into(),
                },
                System::Link {
                    target: "usr/bin".into(),
                    path: "/bin".into(),
                },
            ],
            read_only: vec![
                workspace.into(),
                "/home/u/.local/share/ipybox/kernel-env".into(),
                runtime.into(),
            ],
            writable: vec![
                Path::new(runtime).join("box"),
                Path::new(runtime).join("work"),
            ],
            emptied: emptied.iter().map(PathBuf::from).collect(),
            hidden: vec![],
            unshare_net: true,
            users: None,
        }
    }

    #[test]
    fn deeper_mounts_come_after_the_directories_they_are_in() {
        let l = layout(
            &["/tmp", "/home/u", "/home/u/.local/share/ipybox"],
            "/tmp/ws",
            "/tmp/ipybox-1-abcdef",
        );
        let args = l.mount_args().join(" ");
        assert_eq!(
            args,
            "--ro-bind /usr /usr --symlink usr/bin /bin --dev /dev --proc /proc \
             --perms 1777 --tmpfs /tmp --perms 0755 --dir /home --perms 1777 --tmpfs /home/u \
             --ro-bind /tmp/ws /tmp/ws --ro-bind /tmp/ipybox-1-abcdef /tmp/ipybox-1-abcdef \
             --bind /tmp/ipybox-1-abcdef/box /tmp/ipybox-1-abcdef/box \
             --bind /tmp/ipybox-1-abcdef/work /tmp/ipybox-1-abcdef/work \
             --perms 1777 --dir /home/u/.local --perms 1777 --dir /home/u/.local/share \
             --perms 1777 --tmpfs /home/u/.local/share/ipybox \
             --ro-bind /home/u/.local/share/ipybox/kernel-env /home/u/.local/share/ipybox/kernel-env \
             --remount-ro /"
        );
    }

    #[test]
    fn the_fork_plan_leaves_the_system_part_to_the_template() {
        let l = layout(&["/tmp"], "/tmp/ws", "/tmp/ipybox-1-abcdef");
        let plan = l.fork_plan().to_string();
        assert!(!plan.contains("/usr"), "{plan}");
        assert!(plan.contains(r#"["ro","/tmp/ws"]"#), "{plan}");
    }

    #[test]
    fn a_workspace_that_is_an_emptied_directory_stays_visible() {
        let l = layout(&["/tmp", "/srv/ws"], "/srv/ws", "/tmp/ipybox-1-abcdef");
        let args = l.mount_args().join(" ");
        assert!(
            args.contains("--tmpfs /srv/ws --ro-bind /srv/ws /srv/ws"),
            "{args}"
        );
    }

    #[test]
    fn the_host_view_has_no_root_bind_and_no_shadow() {
        let host = HostEnv::from_process();
        let system = system_view(&host, None);
        let paths: Vec<&Path> = system
            .iter()
            .map(|s| match s {
                System::Link { path, .. } | System::Bind { path, .. } => path.as_path(),
            })
            .collect();
        assert!(!paths.contains(&Path::new("/")), "{paths:?}");
        assert!(!paths.contains(&Path::new("/etc")), "{paths:?}");
        assert!(!paths.contains(&Path::new("/etc/shadow")), "{paths:?}");
        assert!(paths.contains(&Path::new("/usr")), "{paths:?}");
    }

    #[test]
    fn generated_users_hold_only_the_kernels_user() {
        let (passwd, group) = etc_users(1000, 1000, "/home/a:b", Some("alice"));
        assert_eq!(
            passwd,
            "root:x:0:0:root:/root:/bin/sh\nalice:x:1000:1000:alice:/home/a_b:/bin/sh\n\
             nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
        );
        assert_eq!(group, "root:x:0:\nalice:x:1000:\nnogroup:x:65534:\n");
        let (passwd, _) = etc_users(0, 0, "/root", None);
        assert!(
            passwd.starts_with("root:x:0:0:root:/root:/bin/sh\n"),
            "{passwd}"
        );
    }
}
