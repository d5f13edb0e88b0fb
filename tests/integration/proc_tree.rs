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
