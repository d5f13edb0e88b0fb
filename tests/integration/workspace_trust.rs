//! The workspace is no way out of the sandbox (docs/sandbox.md, "Code in the workspace"): what a
//! `--sandbox` cell writes there is not imported by a later unsandboxed kernel (a stdio server in
//! each MCP era, an SDK `CodeExecutor`) until a person accepts it with `ipybox trust`, and the
//! generated `mcptools/` is not the sandboxed kernel's to write. Each refusal has its control in
//! the same test: the same payload, written by a trusted kernel, imports and runs. The payload's
//! signal is a file in a probe directory outside `/tmp` and `$HOME`, which the sandboxed kernel
//! cannot write: only a kernel on the host can have written it.

use std::path::Path;

use ipybox::CodeExecutor;
use ipybox::host_env::HostEnv;
use ipybox::sandbox::SandboxOptions;
use serde_json::json;

use crate::apigen_cli::apigen_fx;
use crate::mcp_eras::{Era, both_eras};
use crate::support::{BIN, Probe, fixture_stdio_params, kernel_python, ok_text, require, root};

/// Where the sandboxed cell tries to write, and what it gets (`EROFS`: a read-only mount).
const PLANTED: &[&str] = &[
    "mcptools/__init__.py",
    "mcptools/fx/__init__.py",
    "mcptools/fx/greet.py",
    "mcptools/evil/tool.py",
    "gentools/__init__.py",
    "gentools/saved/__init__.py",
    "gentools/saved/api.py",
    "mcpparse/__init__.py",
    "mcpparse/fx/__init__.py",
    "mcpparse/fx/greet.py",
    "mine.py",
];

/// A cell that appends `payload` (which records its module's name in `marker`) to each of
/// `files` under `ws` and prints what each write gave.
fn plant(ws: &Path, marker: &Path, files: &[&str]) -> String {
    format!(
        r#"import os, errno
MARKER = {marker:?}
payload = "open(%r, 'a').write(__name__ + '\\n')\n" % MARKER
got = []
for rel in {files:?}:
    path = os.path.join({ws:?}, rel)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, 'a') as f:
            f.write(payload)
        got.append((rel, 'written'))
    except OSError as e:
        got.append((rel, errno.errorcode.get(e.errno, str(e.errno))))
print(got)"#
    )
}

/// A cell that imports `module` and prints `imported` or the error's message.
fn import(module: &str) -> String {
    format!(
        "try:\n    import {module}\n    print('imported')\nexcept ImportError as e:\n    print(type(e).__name__ + ': ' + str(e))"
    )
}

/// Waits out the margin a closed window keeps (2 s after its kernels stopped: a killed
/// kernel's processes may linger that long), so that the controls' files are written after it.
async fn past_the_window() {
    tokio::time::sleep(std::time::Duration::from_millis(2100)).await;
}

fn marker_lines(marker: &Path) -> Vec<String> {
    match std::fs::read_to_string(marker) {
        Ok(text) => text.lines().map(str::to_string).collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => panic!("cannot read {}: {e}", marker.display()),
    }
}

fn trust(home: &Path, args: &[&str]) -> (i32, String, String) {
    let out = std::process::Command::new(BIN)
        .arg("trust")
        .args(args)
        .env("IPYBOX_HOME", home)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn refusal(ws: &Path, rel: &str) -> String {
    format!(
        "UntrustedModuleError: {}/{rel} may have been written by a sandboxed kernel (--sandbox, policy ",
        ws.display()
    )
}

/// A `--sandbox` stdio server's cell plants code in every workspace package; a later
/// unsandboxed server of the same workspace (the same era) uses the generated API as
/// documented, refuses the rest by name, runs its own code (the control), and runs what a
/// person accepted with `ipybox trust`.
async fn sandboxed_code_is_quarantined_for_unsandboxed_servers(era: Era) {
    require!(SandboxDeps, TestEnv);
    let ws = tempfile::tempdir().unwrap();
    let ws = ws.path().canonicalize().unwrap();
    let home = tempfile::tempdir().unwrap();
    let probe = Probe::new("trust");
    let marker = probe.path().join("ran");
    let python = kernel_python();
    let srt = root().join("target/sandbox-deps/node_modules/.bin/srt");
    let env = [
        ("IPYBOX_SRT", srt.to_str().unwrap()),
        ("IPYBOX_HOME", home.path().to_str().unwrap()),
        ("IPYBOX_PYTHON", python.to_str().unwrap()),
    ];
    apigen_fx(&ws, &fixture_stdio_params("stdio"), Some(home.path()));

    let sandboxed = crate::mcp_eras::start(&ws, &env, &["--sandbox"], era).await;
    let got = ok_text(
        &sandboxed,
        "execute_ipython_cell",
        json!({"code": plant(&ws, &marker, PLANTED)}),
    )
    .await;
    let expected: Vec<String> = PLANTED
        .iter()
        .map(|rel| {
            let outcome = if rel.starts_with("mcptools/") {
                "EROFS"
            } else {
                "written"
            };
            format!("('{rel}', '{outcome}')")
        })
        .collect();
    assert_eq!(
        crate::http_support::split_note(&got).0,
        format!("[{}]", expected.join(", ")),
        "{era:?}"
    );
    sandboxed.close().await;
    past_the_window().await;

    let trusted = crate::mcp_eras::start(&ws, &env[1..], &[], era).await;
    let run = |code: String| {
        let trusted = &trusted;
        async move {
            let out = ok_text(trusted, "execute_ipython_cell", json!({ "code": code })).await;
            crate::http_support::split_note(&out).0.to_string()
        }
    };
    // The generated API, as documented: untouched, it imports and calls the tool.
    assert_eq!(
        run("from mcptools.fx.greet import Params, run\nprint(run(Params(name='ada')))".into())
            .await,
        "Hello, ada!",
        "{era:?}"
    );
    for (module, rel) in [
        ("gentools.saved.api", "gentools/__init__.py"),
        ("mcpparse.fx.greet", "mcpparse/__init__.py"),
        ("mine", "mine.py"),
    ] {
        let out = run(import(module)).await;
        assert!(
            out.starts_with(&refusal(&ws, rel)),
            "{era:?} {module}: {out}"
        );
        assert!(
            out.contains(&format!(
                "help: read it, then run `ipybox trust {}/{rel}`",
                ws.display()
            )),
            "{era:?} {module}: {out}"
        );
    }
    assert_eq!(marker_lines(&marker), Vec::<String>::new(), "{era:?}");

    // The control: the same payload written by this (trusted) kernel imports and runs.
    run(plant(&ws, &marker, &["own.py"])).await;
    assert_eq!(run(import("own")).await, "imported", "{era:?}");
    assert_eq!(marker_lines(&marker), ["own"], "{era:?}");

    // A person's acceptance: listed, refused without a terminal, then accepted with --yes.
    let gentools = ws.join("gentools");
    let gentools = gentools.to_str().unwrap();
    let (code, out, _) = trust(home.path(), &["--list", gentools]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("3 file(s) written while a sandboxed kernel could write them."),
        "{out}"
    );
    assert!(
        out.contains(&format!("=== {}/gentools/saved/api.py", ws.display())),
        "{out}"
    );
    assert!(out.contains("open("), "the content is shown: {out}");
    let (code, _, err) = trust(home.path(), &[gentools]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("run again with --yes"), "{err}");
    let out = run(import("gentools.saved.api")).await;
    assert!(
        out.starts_with(&refusal(&ws, "gentools/__init__.py")),
        "{era:?}: {out}"
    );
    let (code, out, err) = trust(home.path(), &["--yes", gentools]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("accepted 3 file(s)"), "{out}");
    assert_eq!(
        run(import("gentools.saved.api")).await,
        "imported",
        "{era:?}"
    );
    assert_eq!(
        marker_lines(&marker),
        ["own", "gentools", "gentools.saved", "gentools.saved.api"],
        "{era:?}"
    );
    // Accepting gentools/ accepted nothing else.
    let out = run(import("mcpparse.fx.greet")).await;
    assert!(
        out.starts_with(&refusal(&ws, "mcpparse/__init__.py")),
        "{era:?}: {out}"
    );
    trusted.close().await;
}
both_eras!(sandboxed_code_is_quarantined_for_unsandboxed_servers);

/// The SDK: what a sandboxed `CodeExecutor` wrote is refused by an unsandboxed one, and a
/// package planted in `mcptools/` while a sandboxed executor ran (the host writing in its
/// place, as an ipybox without the read-only `mcptools/` let the kernel do) is refused too,
/// while what the host generated during that time imports; registering again restores the
/// generated package root. Controls: the trusted executor's own files import and run.
#[tokio::test]
async fn an_sdk_executor_refuses_what_a_sandboxed_one_wrote() {
    require!(SandboxDeps, TestEnv);
    let ws = tempfile::tempdir().unwrap();
    let ws = ws.path().canonicalize().unwrap();
    let home = tempfile::tempdir().unwrap();
    let probe = Probe::new("trust-sdk");
    let marker = probe.path().join("ran");
    let mut vars = crate::support::process_env();
    vars.insert("IPYBOX_HOME".into(), home.path().display().to_string());
    let host = HostEnv::from_vars(vars);
    let srt = root().join("target/sandbox-deps/node_modules/.bin/srt");
    let sandboxed = CodeExecutor::builder()
        .workspace(&ws)
        .python(kernel_python())
        .host_env(host.clone())
        .without_spare_kernel()
        .sandbox(SandboxOptions {
            srt: Some(srt),
            ..Default::default()
        })
        .build();
    sandboxed.start().await.expect("sandboxed executor starts");
    let got = crate::support::run(&sandboxed, &plant(&ws, &marker, &["saved.py"])).await;
    assert_eq!(got.trim(), "[('saved.py', 'written')]");
    // While it runs: the host generates fx (vouched for by its digests), and plants a package
    // and a line in the generated root as a kernel could before mcptools/ was read-only.
    ipybox::generate_mcp_sources_with(
        "fx",
        &fixture_stdio_params("stdio"),
        &ws.join("mcptools"),
        host.vars(),
        ipybox::tools::DEFAULT_CONNECT_TIMEOUT,
        ipybox::apigen::ApiStyle::Sync,
    )
    .await
    .expect("registration");
    let payload = format!("open({marker:?}, 'a').write(__name__ + '\\n')\n");
    std::fs::create_dir_all(ws.join("mcptools/planted")).unwrap();
    std::fs::write(ws.join("mcptools/planted/__init__.py"), &payload).unwrap();
    sandboxed.stop().await;
    past_the_window().await;

    let trusted = CodeExecutor::builder()
        .workspace(&ws)
        .python(kernel_python())
        .host_env(host.clone())
        .without_spare_kernel()
        .build();
    trusted.start().await.expect("trusted executor starts");
    let run = |code: String| {
        let trusted = &trusted;
        async move { crate::support::run(trusted, &code).await.trim().to_string() }
    };
    let out = run(import("saved")).await;
    assert!(out.starts_with(&refusal(&ws, "saved.py")), "{out}");
    let out = run(import("mcptools.planted")).await;
    assert!(
        out.starts_with(&refusal(&ws, "mcptools/planted/__init__.py")),
        "{out}"
    );
    assert!(
        out.contains("registering its server again writes it anew"),
        "{out}"
    );
    assert_eq!(
        run("from mcptools.fx.greet import Params, run\nprint(run(Params(name='ada')))".into())
            .await,
        "Hello, ada!"
    );
    assert_eq!(marker_lines(&marker), Vec::<String>::new());
    // Controls: written by the host outside any window, and by the trusted kernel itself.
    std::fs::write(ws.join("host_written.py"), &payload).unwrap();
    assert_eq!(run(import("host_written")).await, "imported");
    run(plant(&ws, &marker, &["kernel_written.py"])).await;
    assert_eq!(run(import("kernel_written")).await, "imported");
    assert_eq!(marker_lines(&marker), ["host_written", "kernel_written"]);
    trusted.stop().await;
}
