//! A cgroup per confined session: the session's processes, memory and CPU are bounded by its
//! limits ([`super::limits::SessionLimits`]), whatever uid its kernel runs as.
//!
//! Layout: under the cgroup ipybox itself runs in (per controller on cgroup v1), a directory of
//! this service, `ipybox-<pid>`, and in it one per session (`s-<random>`). Every kernel of the
//! session (the current one, its spares, a reset's new kernel) is placed in it before it runs
//! any code: a bubblewrap'd kernel joins it between fork and exec (its descendants inherit it),
//! a forked kernel is placed by the host as soon as it connects back, and waits for the host's
//! go-ahead before it forks its namespace's pid 1 (`factory.py`).
//!
//! After each cell the host reads the session's counters (`pids.events`' `max`, the memory
//! controller's `oom_kill`) and the cell's result says which limit the session met. When the
//! session ends its cgroup's processes are killed and the cgroup removed; the service's own
//! directory goes at shutdown, and a service that crashed leaves one that the next start removes
//! ([`CgroupRoot::detect`] sweeps directories of services that are gone).
//!
//! cgroup v2 (`/sys/fs/cgroup/cgroup.controllers` exists) and v1 (a hierarchy per controller)
//! are both handled; only v1 runs on the machine the tests run on (v2's file writes are unit
//! tested against a directory tree).

use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use super::session_limits::{LimitHit, SessionLimits};

/// The controllers ipybox uses.
const CONTROLLERS: [&str; 3] = ["pids", "memory", "cpu"];
/// `cpu.max`'s period (µs).
const CPU_PERIOD: u64 = 100_000;

/// Where session cgroups are made, for one service.
#[derive(Debug)]
pub struct CgroupRoot {
    v2: bool,
    /// The service's directory per controller (v1), or the one directory (v2).
    dirs: Vec<(&'static str, PathBuf)>,
}

/// Why cgroups cannot be used here.
#[derive(Debug, thiserror::Error)]
#[error("cannot use cgroups for session limits: {0}")]
pub struct CgroupError(pub String);

fn write_file(path: &Path, value: &str) -> std::io::Result<()> {
    let mut f = std::fs::OpenOptions::new().write(true).open(path)?;
    f.write_all(value.as_bytes())
}

fn io_err(path: &Path, what: &str, e: std::io::Error) -> CgroupError {
    CgroupError(format!("cannot {what} {}: {e}", path.display()))
}

/// One line of `/proc/self/mountinfo` that mounts a cgroup hierarchy: (root, mount point, fs
/// type, super options).
fn cgroup_mounts(mountinfo: &str) -> Vec<(String, PathBuf, String, String)> {
    mountinfo
        .lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let left: Vec<&str> = left.split(' ').collect();
            let right: Vec<&str> = right.split(' ').collect();
            let fstype = *right.first()?;
            if fstype != "cgroup" && fstype != "cgroup2" {
                return None;
            }
            Some((
                left.get(3)?.to_string(),
                PathBuf::from(left.get(4)?),
                fstype.to_string(),
                right.get(2).copied().unwrap_or("").to_string(),
            ))
        })
        .collect()
}

/// `/proc/self/cgroup`'s path for `controller` (v1), or for the unified hierarchy (`None`).
fn own_path(proc_cgroup: &str, controller: Option<&str>) -> Option<String> {
    proc_cgroup.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let (_, list, path) = (parts.next()?, parts.next()?, parts.next()?);
        let hit = match controller {
            None => list.is_empty(),
            Some(c) => list.split(',').any(|x| x == c),
        };
        hit.then(|| path.to_string())
    })
}

/// `mount` + (`path` less the mount's `root`).
fn join_under(mount: &Path, root: &str, path: &str) -> PathBuf {
    let rel = path.strip_prefix(root).unwrap_or(path);
    let rel = rel.trim_start_matches('/');
    if rel.is_empty() {
        mount.to_path_buf()
    } else {
        mount.join(rel)
    }
}

impl CgroupRoot {
    /// This process's cgroup directories, from `/proc/self/mountinfo` and `/proc/self/cgroup`,
    /// and the service's directory made in each (named after `pid`); directories of services
    /// that are gone are removed first.
    pub fn detect() -> Result<CgroupRoot, CgroupError> {
        let read =
            |p: &str| std::fs::read_to_string(p).map_err(|e| io_err(Path::new(p), "read", e));
        let v2 = Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
        Self::setup(
            v2,
            &read("/proc/self/mountinfo")?,
            &read("/proc/self/cgroup")?,
            std::process::id(),
        )
    }

    /// [`Self::detect`] from the given texts (tests use a directory tree of their own).
    pub(crate) fn setup(
        v2: bool,
        mountinfo: &str,
        proc_cgroup: &str,
        pid: u32,
    ) -> Result<CgroupRoot, CgroupError> {
        let mounts = cgroup_mounts(mountinfo);
        let name = format!("ipybox-{pid}");
        let mut dirs = Vec::new();
        if v2 {
            let (root, mount, ..) = mounts
                .iter()
                .find(|m| m.2 == "cgroup2")
                .ok_or_else(|| CgroupError("no cgroup2 mount in /proc/self/mountinfo".into()))?;
            let own = own_path(proc_cgroup, None)
                .ok_or_else(|| CgroupError("no 0:: line in /proc/self/cgroup".into()))?;
            let parent = join_under(mount, root, &own);
            let enable = parent.join("cgroup.subtree_control");
            let controllers = CONTROLLERS.map(|c| format!("+{c}")).join(" ");
            if write_file(&enable, &controllers).is_err() {
                // "No internal processes": ipybox's own cgroup can hand controllers to children
                // only once ipybox has left it for a leaf of its own.
                let leaf = parent.join("ipybox-service");
                mkdir(&leaf)?;
                write_file(&leaf.join("cgroup.procs"), &pid.to_string())
                    .map_err(|e| io_err(&leaf, "move ipybox into", e))?;
                write_file(&enable, &controllers).map_err(|e| {
                    io_err(&enable, "enable the pids, memory and cpu controllers in", e)
                })?;
            }
            sweep(&parent);
            let dir = parent.join(&name);
            mkdir(&dir)?;
            write_file(&dir.join("cgroup.subtree_control"), &controllers)
                .map_err(|e| io_err(&dir, "enable the pids, memory and cpu controllers in", e))?;
            dirs.push(("", dir));
        } else {
            for controller in CONTROLLERS {
                let Some((root, mount, ..)) = mounts
                    .iter()
                    .find(|m| m.2 == "cgroup" && m.3.split(',').any(|o| o == controller))
                else {
                    tracing::warn!(
                        "cgroup v1: no {controller} hierarchy is mounted: its session limit is not applied"
                    );
                    continue;
                };
                let own = own_path(proc_cgroup, Some(controller)).unwrap_or_else(|| "/".into());
                let parent = join_under(mount, root, &own);
                sweep(&parent);
                let dir = parent.join(&name);
                mkdir(&dir)?;
                dirs.push((controller, dir));
            }
            if dirs.is_empty() {
                return Err(CgroupError(
                    "no pids, memory or cpu hierarchy is mounted (cgroup v1)".into(),
                ));
            }
        }
        Ok(CgroupRoot { v2, dirs })
    }

    /// Which cgroup version and where, for the start-up log.
    pub fn describe(&self) -> String {
        let dirs: Vec<String> = self
            .dirs
            .iter()
            .map(|(_, d)| d.display().to_string())
            .collect();
        format!(
            "cgroup {} ({})",
            if self.v2 { "v2" } else { "v1" },
            dirs.join(", ")
        )
    }

    /// Bounds the memory of the service's cgroup as a whole (all its sessions): the backstop
    /// of the budget admission reserves sessions from ([`super::service`]).
    pub fn limit_memory(&self, bytes: u64) -> Result<(), CgroupError> {
        let (controller, file) = if self.v2 {
            ("", "memory.max")
        } else {
            ("memory", "memory.limit_in_bytes")
        };
        let Some((_, dir)) = self.dirs.iter().find(|(c, _)| *c == controller) else {
            return Err(CgroupError(
                "no memory controller for the service's cgroup".into(),
            ));
        };
        let path = dir.join(file);
        write_file(&path, &bytes.to_string()).map_err(|e| io_err(&path, "write", e))
    }

    /// A new session's cgroup with `limits` set.
    pub fn create_session(&self, limits: &SessionLimits) -> Result<SessionCgroup, CgroupError> {
        let name = format!("s-{}", uuid::Uuid::new_v4().simple());
        let mut cg = SessionCgroup {
            v2: self.v2,
            dirs: Vec::new(),
            limits: limits.clone(),
            seen: std::sync::Mutex::new(Counters::default()),
        };
        for (controller, parent) in &self.dirs {
            let dir = parent.join(&name);
            mkdir(&dir)?;
            // Pushed at once: dropped on an error below, it is removed.
            cg.dirs.push((controller, dir));
        }
        cg.apply()?;
        Ok(cg)
    }
}

impl Drop for CgroupRoot {
    fn drop(&mut self) {
        for (_, dir) in &self.dirs {
            remove_tree(dir);
        }
    }
}

fn mkdir(dir: &Path) -> Result<(), CgroupError> {
    match std::fs::create_dir(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(io_err(dir, "create", e)),
    }
}

/// Removes `ipybox-<pid>` directories under `parent` whose service is gone.
fn sweep(parent: &Path) {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix("ipybox-"))
            .and_then(|p| p.parse::<i32>().ok())
        else {
            continue;
        };
        if !crate::child_process::process_alive(pid) {
            tracing::info!(
                "removing the cgroup {} of an ipybox that is gone",
                entry.path().display()
            );
            remove_tree(&entry.path());
        }
    }
}

/// Kills every process in `dir` and its subdirectories and removes them (a cgroup's directory
/// can be removed once it has no processes: a killed process leaves it within milliseconds).
fn remove_tree(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                remove_tree(&entry.path());
            }
        }
    }
    if !on_cgroupfs(dir) {
        // Not a cgroup (a test's tree): an ordinary directory.
        let _ = std::fs::remove_dir_all(dir);
        return;
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        kill_members(dir);
        match std::fs::remove_dir(dir) {
            Ok(()) => return,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
            Err(e) if std::time::Instant::now() > deadline => {
                tracing::warn!("cannot remove the cgroup {}: {e}", dir.display());
                return;
            }
            Err(_) => std::thread::sleep(std::time::Duration::from_millis(10)),
        }
    }
}

/// Whether `dir` is on a cgroup file system (v1 or v2): only there are processes killed.
fn on_cgroupfs(dir: &Path) -> bool {
    const CGROUP_SUPER_MAGIC: i64 = 0x0027_e0eb;
    const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;
    let Ok(path) = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    // SAFETY: a valid path and a zeroed statfs the call fills.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::statfs(path.as_ptr(), &mut st) } != 0 {
        return false;
    }
    #[allow(clippy::unnecessary_cast)]
    let magic = st.f_type as i64;
    magic == CGROUP_SUPER_MAGIC || magic == CGROUP2_SUPER_MAGIC
}

/// SIGKILL to every process of the cgroup `dir` (`cgroup.kill` where there is one, v2).
fn kill_members(dir: &Path) {
    if write_file(&dir.join("cgroup.kill"), "1").is_ok() {
        return;
    }
    let Ok(procs) = std::fs::read_to_string(dir.join("cgroup.procs")) else {
        return;
    };
    for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
        if pid > 1 {
            // SAFETY: kill has no memory-safety preconditions; the pid is a member of the
            // session's cgroup as read just now.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

/// The counters of a session's cgroup that say which limit it met.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Counters {
    /// Forks refused at `pids.max`.
    pub(crate) pids_max: u64,
    /// Processes killed by the OOM killer.
    pub(crate) oom_kill: u64,
}

/// One session's cgroup: made with its limits, removed (its processes killed) when dropped.
#[derive(Debug)]
pub struct SessionCgroup {
    v2: bool,
    dirs: Vec<(&'static str, PathBuf)>,
    limits: SessionLimits,
    seen: std::sync::Mutex<Counters>,
}

impl SessionCgroup {
    fn dir(&self, controller: &str) -> Option<&Path> {
        self.dirs
            .iter()
            .find(|(c, _)| c.is_empty() || *c == controller)
            .map(|(_, d)| d.as_path())
    }

    fn set(&self, controller: &str, file: &str, value: &str) -> Result<(), CgroupError> {
        match self.dir(controller) {
            Some(dir) => {
                let path = dir.join(file);
                write_file(&path, value).map_err(|e| io_err(&path, &format!("write {value} to"), e))
            }
            None => Ok(()),
        }
    }

    /// Writes the limits.
    fn apply(&self) -> Result<(), CgroupError> {
        let l = &self.limits;
        let max = |n: u64| {
            if n == 0 {
                "max".to_string()
            } else {
                n.to_string()
            }
        };
        self.set("pids", "pids.max", &max(l.max_procs))?;
        if self.v2 {
            self.set("memory", "memory.max", &max(l.memory))?;
            if l.memory > 0 {
                // No swap: the limit is the memory the session has (where swap is accounted).
                let _ = self.set("memory", "memory.swap.max", "0");
            }
            let cpu = match l.cpus {
                Some(c) => format!("{} {CPU_PERIOD}", (c * CPU_PERIOD as f64) as u64),
                None => format!("max {CPU_PERIOD}"),
            };
            self.set("cpu", "cpu.max", &cpu)?;
        } else {
            let mem = if l.memory == 0 {
                "-1".to_string()
            } else {
                l.memory.to_string()
            };
            self.set("memory", "memory.limit_in_bytes", &mem)?;
            if l.memory > 0 {
                // Memory and swap together at the same bound: no swap (only where the kernel
                // accounts swap; must follow limit_in_bytes).
                let _ = self.set("memory", "memory.memsw.limit_in_bytes", &mem);
            }
            self.set("cpu", "cpu.cfs_period_us", &CPU_PERIOD.to_string())?;
            let quota = match l.cpus {
                Some(c) => ((c * CPU_PERIOD as f64) as u64).to_string(),
                None => "-1".to_string(),
            };
            self.set("cpu", "cpu.cfs_quota_us", &quota)?;
        }
        Ok(())
    }

    /// The `cgroup.procs` files a process writes itself into, opened for writing now: a child
    /// writes `0` (itself) into each between fork and exec ([`join_in_child`]).
    pub(crate) fn open_procs(&self) -> std::io::Result<Vec<OwnedFd>> {
        self.dirs
            .iter()
            .map(|(_, d)| {
                std::fs::OpenOptions::new()
                    .write(true)
                    .open(d.join("cgroup.procs"))
                    .map(OwnedFd::from)
            })
            .collect()
    }

    /// Places process `pid` (and the processes it starts from now on) in this cgroup.
    pub(crate) fn place(&self, pid: u32) -> Result<(), CgroupError> {
        for (_, dir) in &self.dirs {
            let path = dir.join("cgroup.procs");
            write_file(&path, &pid.to_string())
                .map_err(|e| io_err(&path, &format!("place process {pid} in"), e))?;
        }
        Ok(())
    }

    /// The counters now.
    pub(crate) fn counters(&self) -> Counters {
        let read = |controller: &str, file: &str, key: &str| -> u64 {
            self.dir(controller)
                .and_then(|d| std::fs::read_to_string(d.join(file)).ok())
                .and_then(|text| {
                    text.lines().find_map(|l| {
                        let (k, v) = l.split_once(' ')?;
                        (k == key).then(|| v.trim().parse().ok()).flatten()
                    })
                })
                .unwrap_or(0)
        };
        Counters {
            pids_max: read("pids", "pids.events", "max"),
            oom_kill: if self.v2 {
                read("memory", "memory.events", "oom_kill")
            } else {
                read("memory", "memory.oom_control", "oom_kill")
            },
        }
    }

    /// The limits met since the last call (or since the cgroup was made).
    pub fn hits(&self) -> Vec<LimitHit> {
        let now = self.counters();
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        let mut hits = Vec::new();
        if now.pids_max > seen.pids_max {
            hits.push(LimitHit::Procs(self.limits.max_procs));
        }
        if now.oom_kill > seen.oom_kill {
            hits.push(LimitHit::Memory(self.limits.memory));
        }
        *seen = now;
        hits
    }

    /// The session's directories (for tests and logs).
    pub fn paths(&self) -> Vec<PathBuf> {
        self.dirs.iter().map(|(_, d)| d.clone()).collect()
    }
}

impl Drop for SessionCgroup {
    fn drop(&mut self) {
        for (_, dir) in &self.dirs {
            remove_tree(dir);
        }
    }
}

/// In a child between fork and exec: writes `0` (the calling process) to each of `fds` (see
/// [`SessionCgroup::open_procs`]). Async-signal-safe.
pub(crate) fn join_in_child(fds: &[OwnedFd]) -> std::io::Result<()> {
    for fd in fds {
        // SAFETY: write(2) on an open descriptor from a static buffer; async-signal-safe.
        let n = unsafe { libc::write(fd.as_raw_fd(), b"0".as_ptr().cast(), 1) };
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn touch(dir: &Path, files: &[&str]) {
        for f in files {
            std::fs::write(dir.join(f), "").unwrap();
        }
    }

    fn read(path: PathBuf) -> String {
        std::fs::read_to_string(path).unwrap_or_default()
    }

    #[test]
    fn parses_mountinfo_and_proc_cgroup() {
        let mi = "30 25 0:26 / /sys/fs/cgroup/memory rw,relatime shared:9 - cgroup cgroup rw,memory\n\
                  31 25 0:27 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n\
                  32 25 0:28 /sub /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n\
                  33 25 0:29 / /proc rw - proc proc rw";
        let m = cgroup_mounts(mi);
        assert_eq!(m.len(), 3);
        assert_eq!(m[1].1, PathBuf::from("/sys/fs/cgroup/cpu,cpuacct"));
        assert_eq!(m[1].3, "rw,cpu,cpuacct");
        let pc = "4:memory:/a/b\n2:cpu,cpuacct:/\n0::/sub/svc";
        assert_eq!(own_path(pc, Some("memory")).as_deref(), Some("/a/b"));
        assert_eq!(own_path(pc, Some("cpu")).as_deref(), Some("/"));
        assert_eq!(own_path(pc, None).as_deref(), Some("/sub/svc"));
        assert_eq!(
            join_under(Path::new("/m"), "/sub", "/sub/svc"),
            PathBuf::from("/m/svc")
        );
        assert_eq!(join_under(Path::new("/m"), "/", "/"), PathBuf::from("/m"));
    }

    /// cgroup v2's writes, into a directory tree standing for cgroupfs (files exist up front
    /// as in cgroupfs; a new directory gets its interface files from the test).
    #[test]
    fn v2_writes_limits_and_reads_events() {
        let fs = tempfile::tempdir().unwrap();
        let own = fs.path().join("svc.service");
        std::fs::create_dir_all(&own).unwrap();
        touch(&own, &["cgroup.subtree_control", "cgroup.procs"]);
        // (This process's pid: a directory of a live service is not swept.)
        let pid = std::process::id();
        let service = own.join(format!("ipybox-{pid}"));
        std::fs::create_dir(&service).unwrap();
        touch(&service, &["cgroup.subtree_control"]);
        let mi = format!(
            "32 25 0:28 / {} rw - cgroup2 cgroup2 rw",
            fs.path().display()
        );
        let root = CgroupRoot::setup(true, &mi, "0::/svc.service", pid).unwrap();
        assert_eq!(
            read(own.join("cgroup.subtree_control")),
            "+pids +memory +cpu"
        );
        assert_eq!(
            read(service.join("cgroup.subtree_control")),
            "+pids +memory +cpu"
        );
        // A new session directory has no interface files here (cgroupfs makes them): the
        // error names the file; the same writes then go to a directory that has them.
        let limits = SessionLimits {
            max_procs: 50,
            memory: 200 << 20,
            cpus: Some(1.5),
            work_size: 0,
            box_size: 0,
        };
        let err = root
            .create_session(&limits)
            .map(|_| ())
            .err()
            .map(|e| e.to_string());
        assert!(err.is_some_and(|e| e.contains("pids.max")));
        // Same writes on a directory that has the files.
        let dir = service.join("s-test");
        std::fs::create_dir(&dir).unwrap();
        touch(
            &dir,
            &[
                "pids.max",
                "memory.max",
                "memory.swap.max",
                "cpu.max",
                "cgroup.procs",
            ],
        );
        let cg = SessionCgroup {
            v2: true,
            dirs: vec![("", dir.clone())],
            limits,
            seen: Default::default(),
        };
        cg.apply().unwrap();
        assert_eq!(read(dir.join("pids.max")), "50");
        assert_eq!(read(dir.join("memory.max")), "209715200");
        assert_eq!(read(dir.join("memory.swap.max")), "0");
        assert_eq!(read(dir.join("cpu.max")), "150000 100000");
        cg.place(77).unwrap();
        assert_eq!(read(dir.join("cgroup.procs")), "77");
        assert!(cg.hits().is_empty());
        std::fs::write(dir.join("pids.events"), "max 3\n").unwrap();
        std::fs::write(
            dir.join("memory.events"),
            "low 0\nhigh 0\nmax 9\noom 1\noom_kill 1\n",
        )
        .unwrap();
        assert_eq!(
            cg.hits(),
            vec![LimitHit::Procs(50), LimitHit::Memory(200 << 20)]
        );
        assert!(cg.hits().is_empty(), "only what is new since the last look");
        drop(cg);
        assert!(!dir.exists());
        drop(root);
        assert!(!service.exists());
    }

    #[test]
    fn v1_writes_limits_per_controller() {
        let fs = tempfile::tempdir().unwrap();
        let mut mi = String::new();
        for c in CONTROLLERS {
            std::fs::create_dir_all(fs.path().join(c).join("parent")).unwrap();
            mi.push_str(&format!(
                "30 25 0:26 / {} rw - cgroup cgroup rw,{c}\n",
                fs.path().join(c).display()
            ));
        }
        let pc = "8:pids:/parent\n4:memory:/parent\n1:cpu:/parent\n";
        // A stale service's directory is swept (no such pid).
        let stale = fs.path().join("pids/parent/ipybox-999999999");
        std::fs::create_dir(&stale).unwrap();
        let pid = std::process::id();
        let root = CgroupRoot::setup(false, &mi, pc, pid).unwrap();
        assert!(!stale.exists());
        let dir = |c: &str| fs.path().join(c).join(format!("parent/ipybox-{pid}/s-t"));
        for c in CONTROLLERS {
            std::fs::create_dir(dir(c)).unwrap();
        }
        touch(&dir("pids"), &["pids.max"]);
        touch(
            &dir("memory"),
            &["memory.limit_in_bytes", "memory.memsw.limit_in_bytes"],
        );
        touch(&dir("cpu"), &["cpu.cfs_period_us", "cpu.cfs_quota_us"]);
        let cg = SessionCgroup {
            v2: false,
            dirs: CONTROLLERS.iter().map(|c| (*c, dir(c))).collect(),
            limits: SessionLimits {
                max_procs: 50,
                memory: 1 << 30,
                cpus: None,
                work_size: 0,
                box_size: 0,
            },
            seen: Default::default(),
        };
        cg.apply().unwrap();
        assert_eq!(read(dir("pids").join("pids.max")), "50");
        assert_eq!(
            read(dir("memory").join("memory.limit_in_bytes")),
            "1073741824"
        );
        assert_eq!(
            read(dir("memory").join("memory.memsw.limit_in_bytes")),
            "1073741824"
        );
        assert_eq!(read(dir("cpu").join("cpu.cfs_quota_us")), "-1");
        std::fs::write(
            dir("memory").join("memory.oom_control"),
            "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n",
        )
        .unwrap();
        assert_eq!(cg.hits(), vec![LimitHit::Memory(1 << 30)]);
        drop(cg);
        drop(root);
        for c in CONTROLLERS {
            assert!(
                !fs.path()
                    .join(c)
                    .join(format!("parent/ipybox-{pid}"))
                    .exists()
            );
        }
    }
}
