//! What a snapshot saved and what a restore brought back, for the caller and, as short text, for
//! the model ([`RestoreReport::text`]: what the MCP server puts at the top of the first result
//! after a restore).
//!
//! The restore's facts come from the kernel (`report.json`), which may be hostile: only names the
//! sealed manifest holds are reported, texts are cut to one short line, and a name the kernel
//! does not account for is reported as not restored.
//!
//! Not here: taking or loading snapshots (`local`), storing them (`store`).

use serde::Deserialize;

use super::manifest::{Manifest, ModuleName, NotSaved};

/// What [`crate::CodeExecutor::snapshot`] saved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotReport {
    /// The stored manifest: names saved (with types and sizes), names not saved (with reasons),
    /// modules, imports, working directory, time.
    pub manifest: Manifest,
}

/// A name a restore brought back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Restored {
    pub name: String,
    pub type_name: String,
}

/// A saved name that did not come back, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotRestored {
    pub name: String,
    pub reason: String,
}

/// The working directory after a restore.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CwdOutcome {
    pub path: String,
    /// Whether the kernel is in it; else `reason` says why not.
    pub restored: bool,
    pub reason: Option<String>,
}

/// What [`crate::CodeExecutor::restore`] brought back and what it did not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestoreReport {
    /// When the snapshot was taken (seconds since the Unix epoch).
    pub created: u64,
    /// Names that came back, in the order they were defined.
    pub restored: Vec<Restored>,
    /// Names bound to modules that were imported again.
    pub modules: Vec<ModuleName>,
    /// Saved names (and module names) that did not load.
    pub failed: Vec<NotRestored>,
    /// Names the snapshot could not hold in the first place.
    pub not_saved: Vec<NotSaved>,
    /// Imports of the cells that failed again (`module`, reason).
    pub imports_failed: Vec<(String, String)>,
    pub cwd: Option<CwdOutcome>,
}

/// `report.json` as the kernel writes it.
#[derive(Deserialize)]
pub(crate) struct KernelReport {
    #[serde(default)]
    restored: Vec<String>,
    #[serde(default)]
    failed: Vec<KernelFailure>,
    #[serde(default)]
    modules: Vec<String>,
    #[serde(default)]
    imports_failed: Vec<KernelImportFailure>,
    #[serde(default)]
    cwd: Option<KernelCwd>,
}

#[derive(Deserialize)]
struct KernelFailure {
    name: String,
    reason: String,
}

#[derive(Deserialize)]
struct KernelImportFailure {
    module: String,
    reason: String,
}

#[derive(Deserialize)]
struct KernelCwd {
    restored: bool,
    #[serde(default)]
    reason: Option<String>,
}

/// One short line of at most `max` characters, without control characters.
pub(crate) fn line(text: &str, max: usize) -> String {
    let clean: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let clean = clean.split_whitespace().collect::<Vec<_>>().join(" ");
    if clean.chars().count() <= max {
        clean
    } else {
        let mut cut: String = clean.chars().take(max.saturating_sub(1)).collect();
        cut.push('…');
        cut
    }
}

impl RestoreReport {
    /// The report from the kernel's `report.json`, checked against the sealed `manifest`.
    pub(crate) fn from_kernel(manifest: &Manifest, kernel: KernelReport) -> Self {
        use std::collections::{HashMap, HashSet};
        let restored: HashSet<&str> = kernel.restored.iter().map(String::as_str).collect();
        let mut failures: HashMap<&str, &str> = HashMap::new();
        for f in &kernel.failed {
            failures.entry(&f.name).or_insert(&f.reason);
        }
        let why = |name: &str| {
            failures
                .get(name)
                .map_or("the kernel did not report it".to_string(), |r| line(r, 300))
        };
        let mut report = RestoreReport {
            created: manifest.created,
            restored: Vec::new(),
            modules: Vec::new(),
            failed: Vec::new(),
            not_saved: manifest.not_saved.clone(),
            imports_failed: Vec::new(),
            cwd: None,
        };
        let modules: HashSet<&str> = kernel.modules.iter().map(String::as_str).collect();
        for m in &manifest.modules {
            if modules.contains(m.name.as_str()) {
                report.modules.push(m.clone());
            } else {
                report.failed.push(NotRestored {
                    name: m.name.clone(),
                    reason: why(&m.name),
                });
            }
        }
        for s in &manifest.saved {
            if restored.contains(s.name.as_str()) && !failures.contains_key(s.name.as_str()) {
                report.restored.push(Restored {
                    name: s.name.clone(),
                    type_name: s.type_name.clone(),
                });
            } else {
                report.failed.push(NotRestored {
                    name: s.name.clone(),
                    reason: why(&s.name),
                });
            }
        }
        let imports: HashSet<&str> = manifest.imports.iter().map(String::as_str).collect();
        for f in kernel.imports_failed.iter().take(100) {
            if imports.contains(f.module.as_str()) {
                report
                    .imports_failed
                    .push((f.module.clone(), line(&f.reason, 300)));
            }
        }
        if let (Some(path), Some(cwd)) = (&manifest.cwd, kernel.cwd) {
            report.cwd = Some(CwdOutcome {
                path: path.clone(),
                restored: cwd.restored,
                reason: cwd.reason.map(|r| line(&r, 200)),
            });
        }
        report
    }

    /// Whether everything the snapshot held came back (and nothing was left out of it).
    pub fn complete(&self) -> bool {
        self.failed.is_empty()
            && self.not_saved.is_empty()
            && self.imports_failed.is_empty()
            && self.cwd.as_ref().is_none_or(|c| c.restored)
    }

    /// The report for the model: short, naming exactly what came back and what did not.
    pub fn text(&self) -> String {
        const SHOWN: usize = 40;
        let mut out = format!(
            "[ipybox] This session's kernel was restored from a snapshot taken {}.",
            utc(self.created)
        );
        let mut back: Vec<String> = self
            .restored
            .iter()
            .map(|r| format!("{} ({})", r.name, line(&r.type_name, 40)))
            .collect();
        back.extend(
            self.modules
                .iter()
                .map(|m| format!("{} (module {})", m.name, m.module)),
        );
        if back.is_empty() {
            out.push_str("\nNo names came back.");
        } else {
            out.push_str(&format!("\nCame back ({}): ", back.len()));
            out.push_str(&shown(&back, SHOWN));
            out.push('.');
        }
        if let Some(cwd) = &self.cwd {
            match (&cwd.restored, &cwd.reason) {
                (true, _) => out.push_str(&format!("\nWorking directory: {}.", cwd.path)),
                (false, reason) => out.push_str(&format!(
                    "\nWorking directory {} is gone ({}); the kernel stayed where it started.",
                    cwd.path,
                    reason.as_deref().unwrap_or("cannot enter it")
                )),
            }
        }
        let mut lost: Vec<String> = self
            .not_saved
            .iter()
            .map(|n| format!("- {}: not saved: {}", n.name, line(&n.reason, 200)))
            .collect();
        lost.extend(
            self.failed
                .iter()
                .map(|f| format!("- {}: did not load: {}", f.name, line(&f.reason, 200))),
        );
        lost.extend(
            self.imports_failed
                .iter()
                .map(|(m, r)| format!("- import {m}: failed: {}", line(r, 200))),
        );
        if !lost.is_empty() {
            out.push_str(&format!(
                "\nNot restored ({}); run the code that made them again if you need them:",
                lost.len()
            ));
            for l in lost.iter().take(SHOWN) {
                out.push('\n');
                out.push_str(l);
            }
            if lost.len() > SHOWN {
                out.push_str(&format!("\n- … and {} more", lost.len() - SHOWN));
            }
        }
        out
    }
}

impl SnapshotReport {
    /// A short summary: what was saved and what was not.
    pub fn text(&self) -> String {
        let m = &self.manifest;
        let mut saved: Vec<String> = m
            .saved
            .iter()
            .map(|s| format!("{} ({})", s.name, line(&s.type_name, 40)))
            .collect();
        saved.extend(
            m.modules
                .iter()
                .map(|x| format!("{} (module {})", x.name, x.module)),
        );
        let mut out = format!(
            "[ipybox] Snapshot taken {}: {} names, {}",
            utc(m.created),
            saved.len(),
            human_bytes(m.data_bytes)
        );
        if !saved.is_empty() {
            out.push_str(": ");
            out.push_str(&shown(&saved, 40));
        }
        out.push('.');
        if !m.not_saved.is_empty() {
            out.push_str(&format!("\nNot saved ({}):", m.not_saved.len()));
            for n in m.not_saved.iter().take(40) {
                out.push_str(&format!("\n- {}: {}", n.name, line(&n.reason, 200)));
            }
            if m.not_saved.len() > 40 {
                out.push_str(&format!("\n- … and {} more", m.not_saved.len() - 40));
            }
        }
        out
    }
}

fn shown(items: &[String], max: usize) -> String {
    let mut s = items
        .iter()
        .take(max)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if items.len() > max {
        s.push_str(&format!(", … and {} more", items.len() - max));
    }
    s
}

pub(crate) fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["bytes", "kB", "MB", "GB", "TB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1000.0 && unit < UNITS.len() - 1 {
        value /= 1000.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} bytes")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// `YYYY-MM-DD HH:MM UTC` for seconds since the Unix epoch.
pub fn utc(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_and_sizes() {
        assert_eq!(utc(0), "1970-01-01 00:00 UTC");
        assert_eq!(utc(951_782_400 + 3_660), "2000-02-29 01:01 UTC");
        assert_eq!(utc(1_700_000_000), "2023-11-14 22:13 UTC");
        assert_eq!(human_bytes(999), "999 bytes");
        assert_eq!(human_bytes(10_500_000), "10.5 MB");
    }

    #[test]
    fn the_kernel_reports_only_what_the_manifest_holds() {
        let manifest: Manifest = serde_json::from_value(serde_json::json!({
            "format": 1, "python": "3.11.7", "created": 1_700_000_000, "cwd": "/ws",
            "imports": ["numpy"], "modules": [{"name": "np", "module": "numpy"}],
            "saved": [
                {"name": "x", "type": "int", "bytes": 1, "pickle": [0, 1], "buffers": [], "memo": [0, 1], "code": false},
                {"name": "obj", "type": "Thing", "bytes": 1, "pickle": [1, 1], "buffers": [], "memo": [1, 2], "code": false},
                {"name": "quiet", "type": "int", "bytes": 1, "pickle": [2, 1], "buffers": [], "memo": [2, 3], "code": false}
            ],
            "not_saved": [{"name": "fh", "type": "TextIOWrapper", "reason": "an open file ('/x'): a file handle belongs to this process"}],
            "data_bytes": 3
        }))
        .unwrap();
        let kernel: KernelReport = serde_json::from_value(serde_json::json!({
            "restored": ["x", "planted"], "modules": ["np"],
            "failed": [{"name": "obj", "reason": "ModuleNotFoundError: No module named 'mymod'\n\u{1b}[31m"}],
            "imports_failed": [{"module": "other", "reason": "not ours"}],
            "cwd": {"path": "/elsewhere", "restored": true}
        }))
        .unwrap();
        let report = RestoreReport::from_kernel(&manifest, kernel);
        assert_eq!(
            report.text(),
            "[ipybox] This session's kernel was restored from a snapshot taken 2023-11-14 22:13 UTC.\n\
             Came back (2): x (int), np (module numpy).\n\
             Working directory: /ws.\n\
             Not restored (3); run the code that made them again if you need them:\n\
             - fh: not saved: an open file ('/x'): a file handle belongs to this process\n\
             - obj: did not load: ModuleNotFoundError: No module named 'mymod' [31m\n\
             - quiet: did not load: the kernel did not report it"
        );
        assert!(!report.complete());
    }
}
