//! What one confined session may use, as values: processes, memory, CPU and its work
//! directory's size (`SessionLimits`, the flags' defaults, sizes read and written) and the note a
//! cell's result gets when the session met one of them (`LimitHit`). A leaf of `confine/`: the
//! cgroups (`cgroup`) and the rest of the enforcement (`limits`) both use it; `limits` re-exports
//! it all, so `confine::limits::*` names are unchanged.

/// The default of `--session-max-procs`: processes and threads of one session (its kernel's
/// threads count: an idle kernel has about 10).
pub const DEFAULT_MAX_PROCS: u64 = 512;
/// The default of `--session-memory`: 2 GiB.
pub const DEFAULT_MEMORY: u64 = 2 << 30;
/// The default of `--session-work-size`: 1 GiB.
pub const DEFAULT_WORK_SIZE: u64 = 1 << 30;
/// The default of `--session-box-size`: 16 MiB (a kernel's sockets and a restore's report take
/// a few KiB; snapshots do not pass through it).
pub const DEFAULT_BOX_SIZE: u64 = 16 << 20;

/// The limits of one session (the same for every session of a service).
#[derive(Debug, Clone, PartialEq)]
pub struct SessionLimits {
    /// Processes and threads (`pids.max`); 0: no limit.
    pub max_procs: u64,
    /// Memory in bytes (`memory.max`, swap off); 0: no limit.
    pub memory: u64,
    /// CPU quota in cores (`cpu.max`); `None`: no limit.
    pub cpus: Option<f64>,
    /// Size of the work directory in bytes (a tmpfs as root); 0: no limit.
    pub work_size: u64,
    /// Size of the directory the kernel itself writes (`box/`: its IPC sockets) in bytes (a
    /// tmpfs as root); 0: no limit.
    pub box_size: u64,
}

impl Default for SessionLimits {
    fn default() -> Self {
        Self {
            max_procs: DEFAULT_MAX_PROCS,
            memory: DEFAULT_MEMORY,
            cpus: None,
            work_size: DEFAULT_WORK_SIZE,
            box_size: DEFAULT_BOX_SIZE,
        }
    }
}

/// A limit a session met during a cell, for the note in the cell's result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitHit {
    /// A fork or thread start was refused (`pids.events`' `max` grew).
    Procs(u64),
    /// A process of the session was killed for memory (the OOM killer in its cgroup).
    Memory(u64),
    /// A write into the work directory found it full.
    WorkSize(u64),
    /// A write into the kernel's own directory (`box/`) found it full.
    BoxSize(u64),
}

impl LimitHit {
    /// The `[ipybox] …` line a cell's result gets.
    pub fn note(&self) -> String {
        match *self {
            LimitHit::Procs(n) => format!(
                "[ipybox] this session reached its process limit ({n} processes and threads, --session-max-procs): a fork or thread start failed (BlockingIOError: Resource temporarily unavailable). End processes you started (or start fewer at a time) and try again."
            ),
            LimitHit::Memory(n) => format!(
                "[ipybox] this session reached its memory limit ({}, --session-memory): a process of the session (the kernel, if it died) was killed for memory. Use less memory at once (smaller chunks, streaming, del of large objects) and try again.",
                format_bytes(n)
            ),
            LimitHit::WorkSize(n) => format!(
                "[ipybox] this session's work directory is full ({}, --session-work-size): writes into it fail with ENOSPC (No space left on device). Remove files you no longer need from the working directory and try again.",
                format_bytes(n)
            ),
            LimitHit::BoxSize(n) => format!(
                "[ipybox] this session's kernel directory is full ({}, --session-box-size): it holds the kernel's sockets, and writes into it fail with ENOSPC (No space left on device). Remove what you wrote there and write files into the working directory instead.",
                format_bytes(n)
            ),
        }
    }
}

/// Why a size could not be read.
#[derive(Debug, thiserror::Error)]
#[error(
    "invalid size {0:?}: expected a number of bytes with an optional unit K, M, G or T (powers of 1024), e.g. 512M or 2G"
)]
pub struct SizeError(String);

/// Reads a size: `1073741824`, `512M`, `2G`, `1.5G`, `64k`, `2GiB`, `2GB` (units are powers of
/// 1024).
pub fn parse_bytes(text: &str) -> Result<u64, SizeError> {
    let err = || SizeError(text.to_string());
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let unit = unit.trim().to_ascii_uppercase();
    let unit = unit
        .strip_suffix("IB")
        .or_else(|| unit.strip_suffix('B'))
        .unwrap_or(&unit);
    let scale: u64 = match unit {
        "" => 1,
        "K" => 1 << 10,
        "M" => 1 << 20,
        "G" => 1 << 30,
        "T" => 1 << 40,
        _ => return Err(err()),
    };
    if num.is_empty() {
        return Err(err());
    }
    if let Ok(n) = num.parse::<u64>() {
        return n.checked_mul(scale).ok_or_else(err);
    }
    let f: f64 = num.parse().map_err(|_| err())?;
    let bytes = f * scale as f64;
    if !bytes.is_finite() || bytes < 0.0 || bytes >= u64::MAX as f64 {
        return Err(err());
    }
    Ok(bytes as u64)
}

/// A size for people: `200 MiB`, `2 GiB`, `1.5 GiB`, `123 bytes`.
pub fn format_bytes(n: u64) -> String {
    const UNITS: [(&str, u64); 4] = [
        ("TiB", 1 << 40),
        ("GiB", 1 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
    ];
    for (name, size) in UNITS {
        if n >= size {
            return if n.is_multiple_of(size) {
                format!("{} {name}", n / size)
            } else {
                format!("{:.1} {name}", n as f64 / size as f64)
            };
        }
    }
    format!("{n} bytes")
}

/// Reads `--session-cpus`: a positive number of cores (`1`, `0.5`, `2.5`), or `0`/`none` for no
/// limit.
pub fn parse_cpus(text: &str) -> Result<Option<f64>, String> {
    let t = text.trim();
    if t.eq_ignore_ascii_case("none") || t == "0" {
        return Ok(None);
    }
    match t.parse::<f64>() {
        Ok(n) if n.is_finite() && n >= 0.01 => Ok(Some(n)),
        _ => Err(format!(
            "invalid CPU quota {text:?}: expected a number of cores of at least 0.01 (e.g. 1, 0.5, 2), or 0 / none for no limit"
        )),
    }
}
