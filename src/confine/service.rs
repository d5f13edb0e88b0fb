//! What all confined sessions of a service may use together (`ipybox serve --http`'s
//! `--service-memory`; docs/http.md "What the service may use"): the memory budget that
//! admission reserves each session's `--session-memory` from, and its default, taken from the
//! machine.
//!
//! No overcommit: a session is admitted only while every open session's whole limit still fits
//! in the budget. Were limits overcommitted, the kernel's OOM killer would act when the service's
//! cgroup as a whole ran out, and it picks the largest process among all sessions — possibly
//! another tenant's kernel, which stayed within its own limit. Reserved in full, each session
//! can use its limit without taking memory any other session was promised; the service's own
//! cgroup limit ([`super::cgroup::CgroupRoot::limit_memory`]) is then only a backstop.

/// The share of the machine's memory a service takes by default (the rest: the host, ipybox,
/// page cache).
pub const DEFAULT_SHARE_PERCENT: u64 = 90;

/// The memory of all confined sessions of a service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryBudget {
    /// Bytes all sessions may use together.
    pub total: u64,
    /// Bytes each session may use (`--session-memory`, more than 0).
    pub per_session: u64,
}

impl MemoryBudget {
    /// A budget of `total` for sessions of `per_session` each; `None` when sessions have no
    /// memory limit (nothing to reserve).
    pub fn new(total: u64, per_session: u64) -> Option<Self> {
        (per_session > 0).then_some(Self { total, per_session })
    }

    /// How many sessions fit at once.
    pub fn sessions(&self) -> usize {
        usize::try_from(self.total / self.per_session).unwrap_or(usize::MAX)
    }
}

/// The default budget: [`DEFAULT_SHARE_PERCENT`] of the machine's memory (`MemTotal`); `None`
/// when it cannot be read.
pub fn default_total() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    mem_total(&meminfo).map(|bytes| bytes / 100 * DEFAULT_SHARE_PERCENT)
}

/// The machine's memory, from `/proc/meminfo`'s text.
fn mem_total(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// The machine's memory in bytes, if it can be read.
pub fn machine_memory() -> Option<u64> {
    mem_total(&std::fs::read_to_string("/proc/meminfo").ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_counts_whole_sessions() {
        assert_eq!(
            mem_total("MemTotal:       24683772 kB\nMemFree: 1 kB\n"),
            Some(24_683_772 * 1024)
        );
        let budget = MemoryBudget::new(7 << 30, 2 << 30).unwrap();
        assert_eq!(budget.sessions(), 3);
        assert_eq!(MemoryBudget::new(1 << 30, 0), None);
    }
}
