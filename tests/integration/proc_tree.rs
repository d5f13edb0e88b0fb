//! Process trees from /proc (Linux), for tests and benchmarks that must find what a process
//! started.

/// (pid, parent pid) of every live (not zombie) process, from /proc.
fn live_parents() -> Vec<(u32, u32)> {
    let mut parent_of = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(p) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) else {
            continue;
        };
        // "pid (comm) state ppid ..." — comm may hold spaces, so split after the last ')'.
        let rest = &stat[stat.rfind(')').unwrap() + 2..];
        let mut fields = rest.split(' ');
        let state = fields.next().unwrap_or("");
        let ppid: u32 = fields.next().and_then(|f| f.parse().ok()).unwrap_or(0);
        if state != "Z" {
            parent_of.push((p, ppid));
        }
    }
    parent_of
}

/// The live children of `pid`.
#[allow(dead_code)] // the benchmark includes this file and needs only `descendants`
pub(crate) fn children(pid: u32) -> Vec<u32> {
    live_parents()
        .into_iter()
        .filter(|(_, pp)| *pp == pid)
        .map(|(p, _)| p)
        .collect()
}

/// Every live descendant of `pid` (children of children, ...), from /proc.
pub(crate) fn descendants(pid: u32) -> Vec<u32> {
    let parent_of = live_parents();
    let mut found = vec![pid];
    let mut i = 0;
    while i < found.len() {
        let parent = found[i];
        found.extend(
            parent_of
                .iter()
                .filter(|(_, pp)| *pp == parent)
                .map(|(p, _)| *p),
        );
        i += 1;
    }
    found.remove(0);
    found
}

/// The command line of `pid` (NULs as spaces; empty once it is gone).
fn cmdline(pid: u32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
        .unwrap_or_default()
}

/// The number of threads of `pid` (0 once it is gone).
fn threads(pid: u32) -> usize {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Threads:"))
                .and_then(|n| n.trim().parse().ok())
        })
        .unwrap_or(0)
}

/// The kernels among every live descendant of `pid`, wherever they hang: a kernel forked by the
/// kernel factory is the template's child (a confined one below an outer process and an init of
/// its own), not ipybox's, so counting ipybox's children counts nothing. A kernel is a process
/// running one (a launched kernel's program imports `kernelapp`; a forked one carries its
/// template's command line, and so does its parent) that has started its threads (ipykernel's;
/// the template, an outer process, an init and a kernel still being forked have one).
#[allow(dead_code)] // the benchmark includes this file and needs only `descendants`
pub(crate) fn kernels(pid: u32) -> Vec<u32> {
    let parent_of: std::collections::HashMap<u32, u32> = live_parents().into_iter().collect();
    let python: std::collections::HashMap<u32, String> = descendants(pid)
        .into_iter()
        .map(|p| (p, cmdline(p)))
        .filter(|(_, c)| c.contains("kernelapp") || c.contains("ipybox_runtime.factory"))
        .collect();
    let mut found: Vec<u32> = python
        .iter()
        .filter(|(p, c)| {
            c.contains("kernelapp") || parent_of.get(p).is_some_and(|pp| python.contains_key(pp))
        })
        .map(|(p, _)| *p)
        .filter(|p| threads(*p) > 1)
        .collect();
    found.sort_unstable();
    found
}

/// The descendants of `pid` that have no child (sorted).
#[allow(dead_code)] // the benchmark includes this file and needs only `descendants`
pub(crate) fn leaves(pid: u32) -> Vec<u32> {
    let parents: std::collections::HashSet<u32> =
        live_parents().into_iter().map(|(_, pp)| pp).collect();
    let mut found: Vec<u32> = descendants(pid)
        .into_iter()
        .filter(|p| !parents.contains(p))
        .collect();
    found.sort_unstable();
    found
}
