//! Installs stay in the sandbox (issue 36, part 1): a sandboxed session's `install_package`
//! refuses what is not a package of the index (the `.pth` wheel a cell wrote, however the spec
//! is spelled), runs the installer inside the sandbox (a build backend cannot write the host),
//! and installs into a layer only the workspace's sandboxed kernels import from. Each check
//! comes with its control: the same wheel or sdist installed on the host does what it says.
//!
//! Every server is the real `ipybox` binary over stdio with `--sandbox` (real srt + bubblewrap),
//! installing from the package index pip is configured with (and, for the build probe, a
//! find-links directory of the test's). Markers live in `target/probe-install-*`: outside /tmp
//! and $HOME, which the sandbox hides or makes private, and outside every writable root of the
//! sandbox.
//!
//! Every test has a data directory of its own (`IPYBOX_HOME`, so a kernel environment of its
//! own) and checks that it lacks what the test installs before installing it: the default
//! kernel environment is the machine's, shaped by whatever ran there before (issue 49: an
//! `iniconfig` already there made an isolated session "share" an install it never made).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use ipybox::host_env::HostEnv;
use ipybox::tools::{McpSession, ServerParams, tool_output};
use serde_json::{Value, json};

use crate::support::{BIN, Probe, process_env, python, require, root};

fn srt() -> PathBuf {
    root().join("target/sandbox-deps/node_modules/.bin/srt")
}

fn uv() -> PathBuf {
    let home = std::env::var("HOME").unwrap_or_default();
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .chain([PathBuf::from(home).join(".local/bin")])
        .map(|d| d.join("uv"))
        .find(|p| p.is_file())
        .expect("uv on PATH or in ~/.local/bin (the tests' installer)")
}

/// A data directory of the test's own (`<probe>/home`): its kernel environment is made fresh,
/// so it holds only ipybox's kernel packages.
fn own_home(probe: &Probe) -> PathBuf {
    probe.path().join("home")
}

/// The host environment of this test process with `IPYBOX_HOME` set to `home`.
fn host_with_home(home: &Path) -> HostEnv {
    let mut vars = process_env();
    vars.insert("IPYBOX_HOME".into(), home.display().to_string());
    HostEnv::from_vars(vars)
}

/// The ipybox MCP server over stdio in `ws` with the data directory `home`, with `--sandbox`
/// unless `sandboxed` is false.
async fn server(
    ws: &Path,
    home: &Path,
    sandboxed: bool,
    extra: &[&str],
    env: &[(&str, String)],
) -> McpSession {
    let mut args = vec![
        "--workspace".to_string(),
        ws.display().to_string(),
        "--log-level".into(),
        "warn".into(),
        "--checkpoint-after".into(),
        "off".into(),
    ];
    if sandboxed {
        args.push("--sandbox".into());
    }
    args.extend(extra.iter().map(|a| a.to_string()));
    let mut vars = serde_json::Map::new();
    vars.insert("IPYBOX_SRT".into(), json!(srt()));
    // The test's own data directory: where the workspace's layer is looked for (`Layer`).
    vars.insert("IPYBOX_HOME".into(), json!(home));
    for (k, v) in env {
        vars.insert(k.to_string(), json!(v));
    }
    let params = json!({"command": BIN, "args": args, "env": vars});
    McpSession::connect(
        &ServerParams::parse(&params).unwrap(),
        &process_env(),
        Duration::from_secs(120),
    )
    .await
    .expect("ipybox MCP server starts")
}

/// The site layer of a workspace in the data directory `home`, removed on drop.
struct Layer(ipybox::pyenv::install::SiteLayer);

impl Layer {
    fn of(home: &Path, ws: &Path) -> Self {
        Self(ipybox::pyenv::install::SiteLayer::for_workspace(&host_with_home(home), ws).unwrap())
    }
}

impl Drop for Layer {
    fn drop(&mut self) {
        if let Some(dir) = self.0.site.parent() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

async fn call(s: &McpSession, tool: &str, args: Value) -> (bool, String) {
    let r = s
        .call_tool(tool, args.as_object().unwrap().clone())
        .await
        .unwrap();
    let out = tool_output(&r);
    (out.is_error, out.text)
}

async fn ok(s: &McpSession, tool: &str, args: Value) -> String {
    let (err, text) = call(s, tool, args).await;
    assert!(!err, "{tool}: {text}");
    text
}

async fn err(s: &McpSession, tool: &str, args: Value) -> String {
    let (err, text) = call(s, tool, args).await;
    assert!(err, "{tool} should fail: {text}");
    text
}

async fn exec(s: &McpSession, code: &str) -> String {
    ok(s, "execute_ipython_cell", json!({"code": code})).await
}

/// The `https://` URL of iniconfig 2.0.0's wheel as the package index gives it (asked once, with
/// `pip install --dry-run --report`, as pip on a user's machine would: PyPI's file host here, a
/// mirror's where `PIP_INDEX_URL` names one). Find-links directories are left out: the URL
/// must be one the index serves.
fn iniconfig_url() -> &'static str {
    static URL: OnceLock<String> = OnceLock::new();
    URL.get_or_init(|| {
        let out = Command::new("python3")
            .args([
                "-m",
                "pip",
                "install",
                "--dry-run",
                "--ignore-installed",
                "--no-deps",
            ])
            .args(["--quiet", "--report", "-", "iniconfig==2.0.0"])
            .env_remove("PIP_FIND_LINKS")
            .current_dir("/")
            .output()
            .expect("python3 -m pip runs (asks the index for iniconfig's wheel)");
        assert!(
            out.status.success(),
            "pip could not ask the package index for iniconfig 2.0.0: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let report: Value = serde_json::from_slice(&out.stdout).expect("pip's report is JSON");
        let url = report["install"][0]["download_info"]["url"]
            .as_str()
            .expect("pip's report names the wheel's URL")
            .to_string();
        assert!(
            url.starts_with("https://") && url.ends_with("iniconfig-2.0.0-py3-none-any.whl"),
            "precondition: the package index gives iniconfig 2.0.0's wheel at an https URL \
             (the sandbox installs no other kind), not {url}"
        );
        url
    })
}

/// Python that writes a wheel `evil-1.0-py3-none-any.whl` into `dir`: its `evil.pth` writes
/// `marker` when an interpreter with it in site-packages starts.
fn evil_wheel_code(dir: &str, marker: &Path) -> String {
    format!(
        r#"
import zipfile, os
whl = os.path.join({dir:?}, "evil-1.0-py3-none-any.whl")
marker = {m:?}
files = {{
    "evil.pth": "import os; open(%r, 'w').write('the .pth ran')\n" % marker,
    "evil-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: evil\nVersion: 1.0\n",
    "evil-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
}}
with zipfile.ZipFile(whl, "w") as z:
    for name, text in files.items():
        z.writestr(name, text)
    z.writestr("evil-1.0.dist-info/RECORD", "".join(f"{{n}},,\n" for n in files) + "evil-1.0.dist-info/RECORD,,\n")
print(whl)
"#,
        m = marker.display().to_string()
    )
}

/// The sandboxed kernel cannot write `marker` itself (else the check below would prove nothing).
fn try_write(marker: &Path) -> String {
    format!(
        "try:\n    open({:?}, 'w').write('x')\n    print('wrote')\nexcept OSError:\n    print('denied')",
        marker.display().to_string()
    )
}

/// a) The `.pth` attack: a sandboxed cell writes a wheel whose `.pth` writes a host marker and
/// asks for it with every spelling of a local source (two spaces and a tab after `@`, `name@`,
/// a bare path, `-e`, `--find-links`); each is refused with the reason, and a second install
/// (a real index package) runs: the marker never appears. Control: the same wheel installed
/// into a throwaway venv on the host writes the marker as soon as that venv's Python starts.
#[tokio::test(flavor = "multi_thread")]
async fn a_wheel_the_kernel_wrote_is_never_installed() {
    require!(SandboxDeps, TestEnv);
    let probe = Probe::new("install-pth");
    let home = own_home(&probe);
    let marker = probe.path().join("pth-ran-on-the-host");
    let ws = tempfile::tempdir().unwrap();
    let ws_path = ws.path().canonicalize().unwrap();
    let layer = Layer::of(&home, &ws_path);
    let s = server(&ws_path, &home, true, &[], &[]).await;

    assert_eq!(exec(&s, &try_write(&marker)).await, "denied");
    let whl = exec(
        &s,
        &evil_wheel_code(&ws_path.display().to_string(), &marker),
    )
    .await;
    assert!(Path::new(&whl).is_file(), "{whl}");

    for spec in [
        format!("evil @  file://{whl}"),
        format!("evil @\tfile://{whl}"),
        format!("evil@file://{whl}"),
        format!("evil @ file://localhost{whl}"),
    ] {
        let refused = err(&s, "install_package", json!({"package_name": spec})).await;
        assert!(
            refused.contains(&format!(
                "refusing to install `{}`: it names a local source",
                spec.trim()
            )) && refused.contains("help: install from the package index"),
            "{spec:?}: {refused}"
        );
    }
    for (spec, why) in [
        (whl.clone(), "is not a package requirement: it is a path"),
        (
            format!("-e {}", ws_path.display()),
            "it is an installer option",
        ),
    ] {
        let refused = err(&s, "install_package", json!({"package_name": spec})).await;
        assert!(refused.contains(why), "{spec:?}: {refused}");
    }
    let refused = err(
        &s,
        "install_package",
        json!({"package_name": format!("iniconfig --find-links {}", ws_path.display())}),
    )
    .await;
    assert!(
        refused.contains("is not a package requirement"),
        "{refused}"
    );

    // A remote URL needs the operator's --allow-install-urls (an_sdist_builds_inside_the_sandbox
    // has the server that allows them).
    let refused = err(
        &s,
        "install_package",
        json!({"package_name": format!("iniconfig @ {}", iniconfig_url())}),
    )
    .await;
    assert!(
        refused.contains("it names a URL (https://…)") && refused.contains("--allow-install-urls"),
        "{refused}"
    );
    // The next install (the moment the old code ran the kernel environment's Python on the
    // host with the wheel's `.pth` in it).
    let summary = ok(&s, "install_package", json!({"package_name": "iniconfig"})).await;
    assert!(summary.contains("iniconfig"), "{summary}");
    assert_eq!(
        exec(
            &s,
            "import importlib.util, iniconfig\nprint(importlib.util.find_spec('evil'))"
        )
        .await,
        "None"
    );
    s.close().await;
    let installed: Vec<String> = std::fs::read_dir(&layer.0.site)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        installed.iter().any(|n| n == "iniconfig") && !installed.iter().any(|n| n.contains("evil")),
        "{installed:?}"
    );
    assert!(
        !marker.exists(),
        "the wheel's .pth ran on the host: {:?}",
        std::fs::read_to_string(&marker)
    );

    // Control: the wheel is real and its `.pth` runs wherever it is installed.
    let venv = probe.path().join("venv");
    let status = Command::new(uv())
        .args(["venv", "--quiet", "--python", &python()])
        .arg(&venv)
        .status()
        .unwrap();
    assert!(status.success());
    let out = Command::new(uv())
        .args(["pip", "install", "--no-config", "--python"])
        .arg(venv.join("bin/python"))
        .arg(&whl)
        .current_dir(probe.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!marker.exists(), "installing alone runs nothing");
    let status = Command::new(venv.join("bin/python"))
        .args(["-c", "pass"])
        .current_dir(probe.path())
        .status()
        .unwrap();
    assert!(status.success());
    assert_eq!(
        std::fs::read_to_string(&marker).unwrap(),
        "the .pth ran",
        "control: the wheel's .pth runs in an interpreter it is installed for"
    );
}

/// Writes `ipybox_build_probe-1.0.tar.gz` into `links`: an sdist whose in-tree build backend
/// tries to write `marker` while it builds and records the outcome in the module it builds
/// (`ipybox_build_probe.RESULT`: `wrote` or `denied`).
fn build_probe_sdist(links: &Path, marker: &Path) {
    let code = r#"
import io, tarfile, sys
links, marker = sys.argv[1], sys.argv[2]
backend = '''
import os, zipfile
MARKER = @MARKER@
def get_requires_for_build_wheel(config_settings=None):
    return []
def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    try:
        with open(MARKER, "w") as f:
            f.write("the build ran on the host")
        result = "wrote"
    except OSError:
        result = "denied"
    name = "ipybox_build_probe-1.0-py3-none-any.whl"
    files = {
        "ipybox_build_probe.py": "RESULT = %r\\n" % result,
        "ipybox_build_probe-1.0.dist-info/METADATA": "Metadata-Version: 2.1\\nName: ipybox-build-probe\\nVersion: 1.0\\n",
        "ipybox_build_probe-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\\nGenerator: test\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n",
    }
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w") as z:
        for n, t in files.items():
            z.writestr(n, t)
        z.writestr("ipybox_build_probe-1.0.dist-info/RECORD", "".join(n + ",,\\n" for n in files) + "ipybox_build_probe-1.0.dist-info/RECORD,,\\n")
    return name
'''.replace("@MARKER@", repr(marker))
pyproject = '[build-system]\nrequires = []\nbuild-backend = "probe_backend"\nbackend-path = ["."]\n[project]\nname = "ipybox-build-probe"\nversion = "1.0"\n'
pkg_info = "Metadata-Version: 2.1\nName: ipybox-build-probe\nVersion: 1.0\n"
with tarfile.open(f"{links}/ipybox_build_probe-1.0.tar.gz", "w:gz") as t:
    for name, text in [("pyproject.toml", pyproject), ("probe_backend.py", backend), ("PKG-INFO", pkg_info)]:
        data = text.encode()
        info = tarfile.TarInfo(f"ipybox_build_probe-1.0/{name}")
        info.size = len(data)
        t.addfile(info, io.BytesIO(data))
"#;
    std::fs::create_dir_all(links).unwrap();
    let status = Command::new(python())
        .args(["-c", code])
        .arg(links)
        .arg(marker)
        .status()
        .unwrap();
    assert!(status.success());
}

/// c) The installer runs inside the sandbox: a package from the index (here a find-links
/// directory the operator configured, `UV_FIND_LINKS`) that is only an sdist is built by the
/// sandboxed installer; its build backend cannot write the host marker (it records `denied` in
/// the module it builds, which the sandboxed kernel then imports), and the marker is absent.
/// Control: the same sdist installed on the host builds with the marker written (`wrote`).
/// The server allows URLs (`--allow-install-urls`): an `https://` wheel installs into the layer,
/// a `file:` one stays refused.
#[tokio::test(flavor = "multi_thread")]
async fn an_sdist_builds_inside_the_sandbox() {
    require!(SandboxDeps, TestEnv);
    let probe = Probe::new("install-build");
    let home = own_home(&probe);
    let marker = probe.path().join("build-ran-on-the-host");
    let links = probe.path().join("links");
    build_probe_sdist(&links, &marker);
    let ws = tempfile::tempdir().unwrap();
    let ws_path = ws.path().canonicalize().unwrap();
    let layer = Layer::of(&home, &ws_path);
    let env = [
        ("UV_FIND_LINKS", links.display().to_string()),
        ("PIP_FIND_LINKS", links.display().to_string()),
    ];
    let s = server(&ws_path, &home, true, &["--allow-install-urls"], &env).await;
    assert_eq!(exec(&s, &try_write(&marker)).await, "denied");
    assert_eq!(
        exec(&s, IMPORT_INICONFIG).await,
        "absent",
        "precondition: the test's own kernel environment ({}) lacks iniconfig",
        home.display()
    );
    let summary = ok(
        &s,
        "install_package",
        json!({"package_name": "ipybox-build-probe==1.0"}),
    )
    .await;
    assert!(summary.contains("ipybox-build-probe"), "{summary}");
    assert_eq!(
        exec(
            &s,
            "import ipybox_build_probe as p\nprint(p.__file__, p.RESULT)"
        )
        .await,
        format!("{}/ipybox_build_probe.py denied", layer.0.site.display())
    );
    // This server allows URLs: an https URL installs (into the layer), a local one stays refused.
    let refused = err(
        &s,
        "install_package",
        json!({"package_name": format!("evil @  file://{}/evil.whl", ws_path.display())}),
    )
    .await;
    assert!(refused.contains("it names a local source"), "{refused}");
    ok(
        &s,
        "install_package",
        json!({"package_name": format!("iniconfig @ {}", iniconfig_url())}),
    )
    .await;
    assert_eq!(
        exec(
            &s,
            "import importlib.metadata as m, iniconfig\nprint(m.version('iniconfig'), iniconfig.__file__)"
        )
        .await,
        format!("2.0.0 {}/iniconfig/__init__.py", layer.0.site.display())
    );
    s.close().await;
    assert!(
        !marker.exists(),
        "the build backend wrote the host: {:?}",
        std::fs::read_to_string(&marker)
    );

    // Control: built on the host, the same backend writes the marker.
    let target = probe.path().join("host-target");
    let out = Command::new(uv())
        .args(["pip", "install", "--no-config", "--no-index", "--python"])
        .arg(python())
        .arg("--target")
        .arg(&target)
        .arg("--cache-dir")
        .arg(probe.path().join("host-cache"))
        .arg("--find-links")
        .arg(&links)
        .arg("ipybox-build-probe==1.0")
        .current_dir(probe.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        std::fs::read_to_string(target.join("ipybox_build_probe.py")).unwrap(),
        "RESULT = 'wrote'\n"
    );
    assert_eq!(
        std::fs::read_to_string(&marker).unwrap(),
        "the build ran on the host"
    );
}

/// The `*iniconfig*` entries of the kernel environment's site-packages under `home`.
fn in_kernel_env(home: &Path) -> Vec<String> {
    let lib = home.join("kernel-env/lib");
    let mut found = Vec::new();
    for py in std::fs::read_dir(&lib).unwrap() {
        let site = py.unwrap().path().join("site-packages");
        for entry in std::fs::read_dir(&site).into_iter().flatten() {
            let name = entry.unwrap().file_name().to_string_lossy().into_owned();
            if name.to_ascii_lowercase().contains("iniconfig") {
                found.push(name);
            }
        }
    }
    found
}

const IMPORT_INICONFIG: &str = "try:\n    import iniconfig\n    print('imported', iniconfig.__file__)\nexcept ImportError:\n    print('absent')";

/// b) An index package a sandboxed session installs is importable in that sandboxed kernel (in
/// front of the kernel environment, from the workspace's layer), not in an unsandboxed kernel
/// of the same workspace afterwards, and not in the shared kernel environment. Control: the
/// unsandboxed session's own install lands in the kernel environment and imports there.
#[tokio::test(flavor = "multi_thread")]
async fn a_sandboxed_install_stays_with_sandboxed_kernels() {
    require!(SandboxDeps, TestEnv);
    let probe = Probe::new("install-layer");
    // A private data directory (a kernel environment of its own): the control installs into it.
    let home = probe.path().join("home");
    let env = [("IPYBOX_HOME", home.display().to_string())];
    let ws = tempfile::tempdir().unwrap();
    let ws_path = ws.path().canonicalize().unwrap();

    let s = server(&ws_path, &home, true, &[], &env).await;
    assert_eq!(
        exec(&s, IMPORT_INICONFIG).await,
        "absent",
        "precondition: the test's own kernel environment ({}) lacks iniconfig",
        home.display()
    );
    assert!(in_kernel_env(&home).is_empty());
    ok(&s, "install_package", json!({"package_name": "iniconfig"})).await;
    let imported = exec(&s, IMPORT_INICONFIG).await;
    let layers = home.join("sandbox-layers");
    assert!(
        imported.starts_with(&format!("imported {}", layers.display()))
            && imported.contains("/site/iniconfig/"),
        "{imported}"
    );
    // The sandboxed kernel reads its layer but cannot write it.
    let file = imported.trim_start_matches("imported ");
    assert_eq!(
        exec(&s, &try_write(Path::new(file))).await,
        "denied",
        "the layer is the installer's to write"
    );
    // A kernel started afterwards (a fresh factory template) imports it too.
    ok(&s, "reset", json!({})).await;
    assert_eq!(exec(&s, IMPORT_INICONFIG).await, imported);
    s.close().await;
    assert!(
        in_kernel_env(&home).is_empty(),
        "a sandboxed install reached the shared kernel environment: {:?}",
        in_kernel_env(&home)
    );

    let u = server(&ws_path, &home, false, &[], &env).await;
    assert_eq!(
        exec(&u, IMPORT_INICONFIG).await,
        "absent",
        "an unsandboxed kernel imported a sandboxed install"
    );
    // Control: what an unsandboxed session installs goes into the kernel environment.
    ok(&u, "install_package", json!({"package_name": "iniconfig"})).await;
    let imported = exec(&u, IMPORT_INICONFIG).await;
    assert!(
        imported.starts_with(&format!("imported {}", home.join("kernel-env").display())),
        "{imported}"
    );
    assert!(!in_kernel_env(&home).is_empty());
    u.close().await;
}

/// A sandboxed executor with an isolated workspace (what `ipybox serve --http --sandbox` gives
/// each session) in `ws`, with the data directory `home`.
async fn isolated(ws: &Path, home: &Path, isolate_workspace: bool) -> ipybox::CodeExecutor {
    let ex = ipybox::CodeExecutor::builder()
        .host_env(host_with_home(home))
        .workspace(ws)
        .sandbox(ipybox::sandbox::SandboxOptions {
            srt: Some(srt()),
            isolate_workspace,
            ..Default::default()
        })
        .without_spare_kernel()
        .kernel_factory(false)
        .build();
    ex.start().await.expect("sandboxed executor starts");
    ex
}

async fn run(ex: &ipybox::CodeExecutor, code: &str) -> String {
    ex.execute(code, Some(Duration::from_secs(60)))
        .await
        .expect("the cell runs")
        .text
}

/// Isolated workspaces (HTTP sessions) do not share installs: what one session installs lives in
/// its runtime directory and is absent from another session of the same workspace. Control: two
/// executors of one workspace that is not isolated (stdio conversations) share the workspace's
/// layer, so the second imports what the first installed. Both sessions start without the
/// package (their own kernel environment: issue 49).
#[tokio::test(flavor = "multi_thread")]
async fn isolated_sessions_do_not_share_installs() {
    require!(SandboxDeps, TestEnv);
    let probe = Probe::new("install-isolated");
    let home = own_home(&probe);
    for isolate in [true, false] {
        let ws = tempfile::tempdir().unwrap();
        let ws_path = ws.path().canonicalize().unwrap();
        let layer = Layer::of(&home, &ws_path);
        let a = isolated(&ws_path, &home, isolate).await;
        let b = isolated(&ws_path, &home, isolate).await;
        for (name, ex) in [("a", &a), ("b", &b)] {
            assert_eq!(
                run(ex, IMPORT_INICONFIG).await,
                "absent",
                "precondition: session {name} starts without iniconfig (its kernel environment \
                 is the test's own, {})",
                home.display()
            );
        }
        a.install_package("iniconfig").await.expect("install");
        let in_a = run(&a, IMPORT_INICONFIG).await;
        assert!(in_a.starts_with("imported "), "{in_a}");
        let in_b = run(&b, IMPORT_INICONFIG).await;
        a.stop().await;
        b.stop().await;
        if isolate {
            assert_eq!(in_b, "absent", "isolated sessions shared an install");
            assert!(
                !layer.0.site.exists(),
                "no workspace layer for isolated sessions"
            );
        } else {
            assert_eq!(in_b, in_a, "control: one workspace's layer is shared");
            assert!(in_a.contains(&layer.0.site.display().to_string()), "{in_a}");
        }
    }
}

/// The MCP surface in each era (a 2026-07-28 client, as Claude Code speaks now, and a
/// handshake-era one): a sandboxed server refuses a local source with the same error, and an
/// index package installs and imports in the sandboxed kernel (the positive side of the same
/// call).
async fn install_package_under_the_sandbox_in_each_era(era: crate::mcp_eras::Era) {
    require!(SandboxDeps, TestEnv);
    let ws = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    let srt = root().join("target/sandbox-deps/node_modules/.bin/srt");
    let env = [
        ("IPYBOX_SRT", srt.to_str().unwrap()),
        ("IPYBOX_HOME", home.path().to_str().unwrap()),
    ];
    let s = crate::mcp_eras::start(ws.path(), &env, &["--sandbox"], era).await;
    let spec = "evil @  file:///srv/evil-1.0-py3-none-any.whl";
    let r = crate::support::call(&s, "install_package", json!({"package_name": spec})).await;
    let text = crate::http_support::text_of(&r).1;
    assert_eq!(r.is_error, Some(true), "{era:?}: {text}");
    assert!(
        text.contains(&format!(
            "refusing to install `{spec}`: it names a local source"
        )),
        "{era:?}: {text}"
    );
    crate::support::ok_text(&s, "install_package", json!({"package_name": "iniconfig"})).await;
    let out = crate::support::ok_text(
        &s,
        "execute_ipython_cell",
        json!({"code": "import iniconfig, os\nprint(iniconfig.__file__.startswith(os.environ['IPYBOX_SITE_LAYER']))"}),
    )
    .await;
    assert_eq!(
        crate::http_support::split_note(&out).0,
        "True",
        "{era:?}: {out}"
    );
}
crate::mcp_eras::both_eras!(install_package_under_the_sandbox_in_each_era);
