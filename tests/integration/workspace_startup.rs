//! Nothing in the workspace runs as a kernel starts (issue 36): a sandboxed kernel can write the
//! workspace, and what it writes there must not run in a later kernel of that workspace, however
//! confined — the user's own unsandboxed kernel (SDK, with and without the kernel factory),
//! `ipybox exec`, a later stdio conversation (`ipybox --workspace`), a later sandboxed session, a
//! session of `ipybox serve --http`. The workspace stays importable for the model's code
//! (`import planted_ok`), at the end of `sys.path`, so a file there shadows nothing the kernel
//! environment has (`pydantic.py`).
//!
//! The planted hooks write a marker into a probe directory outside `/tmp`, `$HOME` and the
//! workspace (`support::probe_dir`, where a sandboxed kernel cannot write and an unsandboxed one can)
//! and into the workspace (where a later sandboxed kernel can), and knock (`http_support::Knock`:
//! a loopback connection, the one signal a confined session of `serve --http`, which can write
//! neither, can send); each later kernel also lists the
//! modules it imported from the workspace (which works under any confinement). The control runs
//! the same files where Python does run them (`PYTHONPATH` = the workspace, the workspace as the
//! working directory of `python -c`, the config loader on the workspace) and sees every marker.
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::http_support::{Knock, Service, cell, connect, split_note};
use crate::mcp_eras::Era;
use crate::support::*;
use ipybox::CodeExecutor;
use ipybox::sandbox::SandboxOptions;
use serde_json::json;

/// The files a hostile sandboxed cell plants, each a hook that records that it ran.
const PLANTED: &[&str] = &[
    // imported by `site` from PYTHONPATH as the interpreter starts
    "sitecustomize.py",
    // shadows the package the launcher and the factory template import first
    "ipybox_runtime/__init__.py",
    // shadows a package of the kernel environment (generated code imports it)
    "pydantic.py",
    // what IPython and ipykernel load as configuration from a config directory
    "ipython_config.py",
    "ipython_kernel_config.py",
];

/// The hook: a marker named `name` in each of `dirs` it can write, and a knock (a loopback
/// connection the host sees: a confined kernel can write nowhere the host looks).
fn hook(name: &str, dirs: &[&Path], knock: &Knock) -> String {
    let dirs: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
    format!(
        "import os as _o\nfor _d in {dirs:?}:\n    try:\n        open(_o.path.join(_d, {name:?}), 'w').close()\n    except OSError:\n        pass\ntry:\n    {}\nexcept OSError:\n    pass\n",
        knock.code()
    )
}

fn marker_name(file: &str) -> String {
    file.split(['/', '.']).next().unwrap().to_string()
}

/// The markers present in `dir`, sorted (a directory that cannot be listed is a failure).
fn markers(dir: &Path) -> Vec<String> {
    let mut found: Vec<String> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    found.sort();
    found
}

/// What each later kernel runs: the workspace's module imports, `pydantic` is the environment's,
/// and the modules that came from the workspace are exactly the one imported by name.
fn check_code(ws: &Path) -> String {
    format!(
        "import sys, planted_ok, pydantic\nws = {ws:?}\nprint(planted_ok.VALUE, pydantic.__file__.startswith(ws), sorted(n for n, m in list(sys.modules.items()) if (getattr(m, '__file__', None) or '').startswith(ws + '/')))",
        ws = ws.display().to_string()
    )
}

const CHECKED: &str = "42 False ['planted_ok']";

fn srt() -> PathBuf {
    root().join("target/sandbox-deps/node_modules/.bin/srt")
}

fn sandboxed(ws: &Path) -> CodeExecutor {
    CodeExecutor::builder()
        .workspace(ws)
        .sandbox(SandboxOptions {
            srt: Some(srt()),
            ..Default::default()
        })
        .without_spare_kernel()
        .build()
}

#[tokio::test(flavor = "multi_thread")]
async fn files_a_sandboxed_kernel_plants_never_run_as_a_later_kernel_starts() {
    require!(SandboxDeps, TestEnv);
    let ws_dir = tempfile::tempdir().unwrap();
    let ws = ws_dir.path().canonicalize().unwrap();
    let probe_dir = probe_dir_or_skip!("startup");
    let probe = probe_dir.path().canonicalize().unwrap();
    let ws_marks = ws.join("marks");
    let knock = Knock::new();

    // 1. A sandboxed cell plants the hooks and a module of its own; it cannot write the probe.
    let ex = sandboxed(&ws);
    ex.start().await.expect("sandboxed executor starts");
    let mut plant = format!(
        "import os\nos.makedirs('marks', exist_ok=True)\nos.makedirs('ipybox_runtime', exist_ok=True)\nopen('planted_ok.py', 'w').write('VALUE = 42\\n')\ntry:\n    open({p:?}, 'w')\n    print('probe written')\nexcept OSError:\n    print('probe denied')\n",
        p = probe.join("from-sandbox").display().to_string()
    );
    for file in PLANTED {
        let code = hook(&marker_name(file), &[&probe, &ws_marks], &knock);
        plant.push_str(&format!("open({file:?}, 'w').write({code:?})\n"));
    }
    plant.push_str("print(sorted(n for n in os.listdir('.') if not n.startswith('.')))");
    assert_eq!(
        run(&ex, &plant).await,
        "probe denied\n['ipybox_runtime', 'ipython_config.py', 'ipython_kernel_config.py', 'marks', 'mcptools', 'planted_ok.py', 'pydantic.py', 'sitecustomize.py']"
    );
    ex.stop().await;
    assert!(!probe.join("from-sandbox").exists());
    let check = check_code(&ws);
    // The module the sandboxed kernel wrote is imported by unsandboxed kernels once a person
    // accepted it (docs/sandbox.md, "Code in the workspace"; refused before: workspace_trust).
    let out = Command::new(BIN)
        .args(["trust", "--yes"])
        .arg(ws.join("planted_ok.py"))
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("accepted 1 file(s)"),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    // 2. Later kernels of the workspace: none of the hooks runs, the workspace still imports.
    for factory in [true, false] {
        let ex = CodeExecutor::builder()
            .workspace(&ws)
            .kernel_factory(factory)
            .without_spare_kernel()
            .build();
        ex.start().await.expect("unsandboxed executor starts");
        assert_eq!(run(&ex, &check).await, CHECKED, "factory: {factory}");
        ex.stop().await;
    }
    let out = Command::new(BIN)
        .args(["exec", "--workspace"])
        .arg(&ws)
        .args(["-c", &check])
        .current_dir(&ws)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim_end(), CHECKED);
    let s = connect_ipybox_with(&ws, &[], &[]).await;
    let text = ok_text(&s, "execute_ipython_cell", json!({ "code": check })).await;
    assert_eq!(split_note(&text).0, CHECKED, "a later stdio conversation");
    s.close().await;
    let ex = sandboxed(&ws);
    ex.start().await.expect("a later sandboxed executor starts");
    assert_eq!(run(&ex, &check).await, CHECKED, "a later sandboxed kernel");
    ex.stop().await;
    assert_eq!(
        knock.count(),
        0,
        "a hook ran as a later kernel started (it knocked)"
    );
    {
        // A confined session can write neither the probe directory nor the workspace: its
        // hooks would only knock (the host's network, so that they can). The control, in the
        // same session: the planted `ipython_config.py` run by hand knocks.
        let token = "startup-token-0123456789abcdef0123456789";
        let service = Service::start(&ws, &[], &["--token", token, "--session-network", "host"]);
        let c = connect(&service.url(), Some(token), Era::Stateless).await;
        let (is_error, text) = cell(&c, &check, None).await;
        assert!(!is_error, "{text}");
        assert_eq!(split_note(&text).0, CHECKED, "a session of serve --http");
        assert_eq!(
            knock.count(),
            0,
            "a hook ran as a session of serve --http started (it knocked)"
        );
        let by_hand = format!(
            "exec(open({:?}).read())",
            ws.join("ipython_config.py").display().to_string()
        );
        let (is_error, text) = cell(&c, &by_hand, None).await;
        assert!(!is_error, "{text}");
        assert_eq!(
            knock.count(),
            1,
            "the control: the hook knocks from that session"
        );
        c.close().await;
    }
    assert_eq!(
        markers(&probe),
        Vec::<String>::new(),
        "hooks ran on the host"
    );
    assert_eq!(
        markers(&ws_marks),
        Vec::<String>::new(),
        "hooks ran in a kernel"
    );

    // 3. The control: where Python does run these files, every hook runs.
    let python = kernel_python();
    let py = |args: &[&str], cwd: &Path, env: &[(&str, &Path)]| {
        let out = Command::new(&python)
            .args(args)
            .current_dir(cwd)
            .envs(env.iter().map(|(k, v)| (*k, v.as_os_str())))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    py(&["-c", "pass"], Path::new("/"), &[("PYTHONPATH", &ws)]);
    py(&["-c", "import ipybox_runtime, pydantic"], &ws, &[]);
    let load = format!(
        "from traitlets.config.loader import PyFileConfigLoader as L\nfor f in ('ipython_config.py', 'ipython_kernel_config.py'):\n    L(f, path={:?}).load_config()",
        ws.display().to_string()
    );
    py(&["-c", &load], Path::new("/"), &[]);
    let all: Vec<String> = PLANTED.iter().map(|f| marker_name(f)).collect();
    let mut sorted = all.clone();
    sorted.sort();
    assert_eq!(markers(&probe), sorted, "the control: the hooks run there");
    assert_eq!(markers(&ws_marks), sorted);
    // Each of the five ran once on the host (and knocked), after the one run by hand.
    assert_eq!(knock.count(), 1 + PLANTED.len());
}
