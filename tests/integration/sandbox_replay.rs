//! What a sandboxed session leaves behind in its notebook never runs outside the sandbox
//! (issue 36, parts 3 and 4), with a real srt + bubblewrap and real stdio MCP servers:
//!
//! - `ipybox replay` of a `--sandbox` recording replays sandboxed (a write the recording was
//!   denied is denied again), `--unsandboxed` is needed to run it on the host, and an
//!   unsandboxed recording replays unsandboxed;
//! - a sandboxed cell cannot rewrite the notebook (its directory is read-only inside the
//!   sandbox, the directory a mount point it cannot rename), and a notebook rewritten anyway
//!   (here by the test, as the cell would have) is refused by `ipybox replay`, its forged cells
//!   named, nothing run.
//!
//! Host-side probes live under `target/` (the sandbox hides `/tmp`: a write "succeeding" there
//! would prove nothing).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::support::*;
use serde_json::{Value, json};

fn srt() -> PathBuf {
    root().join("target/sandbox-deps/node_modules/.bin/srt")
}

/// A canonical temporary workspace.
fn workspace() -> (tempfile::TempDir, PathBuf) {
    let t = tempfile::tempdir().unwrap();
    let p = t.path().canonicalize().unwrap();
    (t, p)
}

/// The stdio MCP server in `ws` (`--sandbox` when `sandboxed`), connected. It gets this
/// process's `IPYBOX_HOME`, where `ipybox replay` looks for the host's records (an MCP server's
/// environment is minimal otherwise).
async fn server(ws: &Path, sandboxed: bool) -> ipybox::tools::McpSession {
    let srt = srt().display().to_string();
    let args: &[&str] = if sandboxed { &["--sandbox"] } else { &[] };
    let mut env = vec![("IPYBOX_SRT", srt.clone())];
    if let Ok(home) = std::env::var("IPYBOX_HOME") {
        env.push(("IPYBOX_HOME", home));
    }
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    connect_ipybox_with(ws, args, &env).await
}

async fn cell(s: &ipybox::tools::McpSession, code: &str) -> String {
    ok_text(s, "execute_ipython_cell", json!({"code": code})).await
}

/// The one notebook file of the session in `ws`, once it holds `cells` code cells (the host
/// writes it in the background).
async fn notebook_with(ws: &Path, cells: usize) -> PathBuf {
    let dir = ws.join("notebooks");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        files.retain(|p| p.extension().is_some_and(|e| e == "ipynb")); // not its .gitignore
        if let [file] = files.as_slice()
            && std::fs::read(file)
                .ok()
                .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
                .is_some_and(|nb| code_sources(&nb).len() == cells)
        {
            return file.clone();
        }
        assert!(
            Instant::now() < deadline,
            "no notebook with {cells} code cells in {}: {files:?}",
            dir.display()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn code_sources(notebook: &Value) -> Vec<String> {
    notebook["cells"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["cell_type"] == "code")
        .map(|c| c["source"].as_str().unwrap().to_string())
        .collect()
}

/// `ipybox replay --yes NB --workspace WS EXTRA`: exit status, stdout, stderr. `--asking` in
/// `extra` leaves `--yes` out (tool calls and shell commands would be asked on the terminal;
/// there is none: stdin is null).
fn replay(ws: &Path, notebook: &Path, extra: &[&str]) -> (Option<i32>, String, String) {
    replay_with_srt(ws, notebook, extra, &srt())
}

/// [`replay`] with `IPYBOX_SRT=srt`.
fn replay_with_srt(
    ws: &Path,
    notebook: &Path,
    extra: &[&str],
    srt: &Path,
) -> (Option<i32>, String, String) {
    let out = std::process::Command::new(BIN)
        .arg("replay")
        .arg(notebook)
        .arg("--workspace")
        .arg(ws)
        .args((!extra.contains(&"--asking")).then_some("--yes"))
        .args(extra.iter().filter(|e| **e != "--asking"))
        .env("IPYBOX_SRT", srt)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A cell that writes `file` and prints `wrote`, or prints `denied <errno name>`.
fn write_probe(file: &Path) -> String {
    format!(
        "import errno\ntry:\n    with open({:?}, 'w') as f:\n        f.write('ran')\n    print('wrote')\nexcept OSError as e:\n    print('denied', errno.errorcode[e.errno])",
        file.display().to_string()
    )
}

/// Part 3: a sandboxed recording replays sandboxed by default (the write it was denied is
/// denied again); `--unsandboxed` runs it on the host (the control: the cell does write the
/// file there), and an unsandboxed recording replays unsandboxed.
#[tokio::test(flavor = "multi_thread")]
async fn a_sandboxed_recording_replays_in_the_sandbox() {
    require!(SandboxDeps);
    let probe = Probe::new("replay-confinement");
    let file = probe.path().join("written-on-the-host");
    let code = write_probe(&file);

    // The recorded session: sandboxed, the write denied; the server exits.
    let (_keep, ws) = workspace();
    let s = server(&ws, true).await;
    assert_eq!(cell(&s, &code).await, "denied EROFS");
    s.close().await;
    assert!(!file.exists());
    let nb = notebook_with(&ws, 1).await;
    let recorded: Value = serde_json::from_slice(&std::fs::read(&nb).unwrap()).unwrap();
    let confinement = &recorded["metadata"]["ipybox"]["confinement"];
    assert_eq!(confinement["sandbox"], true, "{confinement}");
    assert_eq!(confinement["kernel"], "sandbox");
    assert_eq!(
        confinement["policy"]["filesystem"]["allowWrite"],
        json!(["."]),
        "the default policy is recorded: {confinement}"
    );

    // Replayed as recorded: in the sandbox, said on stderr; still denied, the file absent.
    let (status, stdout, stderr) = replay(&ws, &nb, &["--check"]);
    assert_eq!(status, Some(0), "{stdout}\n{stderr}");
    assert!(
        stderr.contains(
            "ipybox replay: replaying in the sandbox (srt, the recorded policy), as it was recorded\n"
        ),
        "{stderr}"
    );
    assert_eq!(stdout, "denied EROFS\n", "{stderr}");
    assert!(
        stderr.contains("ipybox replay: 1 cells replayed, every output as recorded"),
        "{stderr}"
    );
    assert!(!stderr.contains("no host record"), "{stderr}");
    assert!(!file.exists(), "the sandboxed replay wrote on the host");

    // No sandbox here (srt missing): the replay fails before running anything, never falls
    // back to running unsandboxed.
    let missing = probe.path().join("no-srt-here");
    let (status, stdout, stderr) = replay_with_srt(&ws, &nb, &[], &missing);
    assert_eq!(status, Some(1), "{stdout}\n{stderr}");
    assert_eq!(stdout, "", "nothing ran: {stderr}");
    assert!(
        stderr.contains("cannot replay in the sandbox: sandbox unavailable: ")
            && stderr.contains("pass --unsandboxed to run it on this host, unconfined"),
        "{stderr}"
    );
    assert!(!file.exists());

    // A policy of the person's choice (--sandbox-config) replaces the recorded one: here one
    // that lets the kernel write the probe directory.
    let policy = probe.path().join("policy.json");
    std::fs::write(
        &policy,
        json!({"filesystem": {"allowWrite": [".", probe.path()], "denyRead": [".env"]}})
            .to_string(),
    )
    .unwrap();
    let config = policy.display().to_string();
    let (status, stdout, stderr) = replay(&ws, &nb, &["--sandbox-config", &config]);
    assert_eq!(status, Some(0), "{stdout}\n{stderr}");
    assert!(
        stderr.contains(&format!(
            "ipybox replay: replaying in the sandbox (srt, the policy of {config}), as asked\n"
        )),
        "{stderr}"
    );
    assert_eq!(stdout, "wrote\n", "{stderr}");
    std::fs::remove_file(&file).unwrap();

    // The control: the explicit flag runs the same cell on the host, and it writes the file.
    let (status, stdout, stderr) = replay(&ws, &nb, &["--unsandboxed"]);
    assert_eq!(status, Some(0), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("ipybox replay: the session was recorded in a sandbox; --unsandboxed replays it WITHOUT that confinement: its cells run on this host, unconfined\n"),
        "{stderr}"
    );
    assert_eq!(stdout, "wrote\n", "{stderr}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "ran");
    std::fs::remove_file(&file).unwrap();

    // An unsandboxed recording replays unsandboxed by default (the write happens both times).
    let (_keep2, plain_ws) = workspace();
    let s = server(&plain_ws, false).await;
    assert_eq!(cell(&s, &code).await, "wrote");
    s.close().await;
    std::fs::remove_file(&file).unwrap();
    let plain = notebook_with(&plain_ws, 1).await;
    let recorded: Value = serde_json::from_slice(&std::fs::read(&plain).unwrap()).unwrap();
    assert_eq!(
        recorded["metadata"]["ipybox"]["confinement"],
        json!({"sandbox": false, "kernel": "local"})
    );
    let (status, stdout, stderr) = replay(&plain_ws, &plain, &["--check"]);
    assert_eq!(status, Some(0), "{stdout}\n{stderr}");
    assert_eq!(stdout, "wrote\n", "{stderr}");
    assert!(!stderr.contains("sandbox"), "{stderr}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "ran");
}

/// The attack of issue 36 (4): a thread that rewrites the notebook after each host write,
/// dropping its own cell and adding one that never ran. It reports which attempts succeeded
/// and the errno names of those that failed.
const FORGER: &str = r#"import errno, json, os, threading, time
forge_report = {"done": 0, "errors": set()}
def forge_loop():
    for round in range(30):
        for name in os.listdir("notebooks"):
            if not name.endswith(".ipynb"):
                continue  # the directory's .gitignore
            path = "notebooks/" + name
            attempts = [
                ("replace", lambda: forge_replace(path)),
                ("append", lambda: open(path, "a").close()),
                ("remove", lambda: os.remove(path)),
            ]
            if round == 29:
                attempts.append(("rename dir", forge_rename))
            for what, attempt in attempts:
                try:
                    attempt()
                    forge_report["done"] += 1
                except OSError as e:
                    forge_report["errors"].add(errno.errorcode[e.errno])
        time.sleep(0.05)
def forge_replace(path):
    with open(path) as f:
        nb = json.load(f)
    nb["cells"] = [c for c in nb["cells"] if "forge_loop" not in "".join(c["source"])]
    nb["cells"].append({"cell_type": "code", "execution_count": 9, "id": "forged", "metadata": {}, "outputs": [], "source": "print('never ran')"})
    with open("notebooks/.forged", "w") as f:
        json.dump(nb, f)
    os.replace("notebooks/.forged", path)
def forge_rename():
    os.rename("notebooks", "notebooks-moved")
    os.rename("notebooks-moved", "notebooks")
forger = threading.Thread(target=forge_loop, daemon=True)
forger.start()
print("started")"#;

const FORGER_REPORT: &str =
    "forger.join()\nprint(forge_report['done'], sorted(forge_report['errors']))";

/// Part 4: a sandboxed cell's thread cannot rewrite the notebook (every attempt refused), and
/// the file on disk after the server exits holds exactly the cells that ran. The control: the
/// same thread in an unsandboxed session does rewrite it; and the rewrite made on the host (by
/// the test, as the thread would have) is refused by `ipybox replay`, the forged cells named,
/// nothing run (a probe file the inserted cell writes stays absent) — with or without
/// `--unsandboxed`. A copy of the forged file (no host record) does run, once asked to.
#[tokio::test(flavor = "multi_thread")]
async fn a_sandboxed_cell_cannot_forge_the_notebook() {
    require!(SandboxDeps);
    let probe = Probe::new("replay-forged");
    let file = probe.path().join("forged-cell-ran");

    let (_keep, ws) = workspace();
    let s = server(&ws, true).await;
    assert_eq!(cell(&s, "print('one')").await, "one");
    assert_eq!(cell(&s, FORGER).await, "started");
    assert_eq!(
        cell(&s, FORGER_REPORT).await,
        "0 ['EBUSY', 'EROFS']",
        "every rewrite refused"
    );
    s.close().await;
    let nb = notebook_with(&ws, 3).await;
    let original = std::fs::read(&nb).unwrap();
    let on_disk: Value = serde_json::from_slice(&original).unwrap();
    assert_eq!(
        code_sources(&on_disk),
        ["print('one')", FORGER, FORGER_REPORT],
        "the file shows exactly the cells that ran"
    );

    // The control: the same thread in an unsandboxed session rewrites the notebook.
    let (_keep2, plain_ws) = workspace();
    let s = server(&plain_ws, false).await;
    assert_eq!(cell(&s, "print('one')").await, "one");
    assert_eq!(cell(&s, FORGER).await, "started");
    let report = cell(&s, FORGER_REPORT).await;
    let done: u32 = report.split(' ').next().unwrap().parse().unwrap();
    assert!(done > 0, "the forger rewrote nothing unsandboxed: {report}");
    s.close().await;

    // The rewrite the thread would have made, made on the host: the attack cell gone, a cell
    // that never ran (it writes the probe file) added, an output changed.
    let mut forged = on_disk.clone();
    let cells = forged["cells"].as_array_mut().unwrap();
    cells.retain(|c| c["source"] != FORGER);
    cells[1]["outputs"] = json!([{"output_type": "stream", "name": "stdout", "text": "fine\n"}]);
    let mut inserted = cells[1].clone();
    inserted["source"] = json!(write_probe(&file));
    inserted["id"] = json!("forged");
    cells.push(inserted);
    std::fs::write(&nb, serde_json::to_vec(&forged).unwrap()).unwrap();

    for extra in [
        &[][..],
        &["--unsandboxed"][..],
        &["--asking"][..],
        &["--asking", "--unsandboxed"][..],
    ] {
        let (status, stdout, stderr) = replay(&ws, &nb, extra);
        assert_eq!(status, Some(1), "{extra:?}: {stdout}\n{stderr}");
        assert_eq!(stdout, "", "{extra:?}: nothing ran: {stderr}");
        assert!(
            stderr.contains(&format!(
                "ipybox replay: {} is not what ran: its code cells differ from the host's record of the session:\nipybox replay:   cell 2 of the recording ran after cell 1 and is gone (removed)\nipybox replay:   cell 3 never ran (inserted)\nipybox replay: nothing was replayed\n",
                nb.display()
            )),
            "{extra:?}: {stderr}"
        );
        assert!(!file.exists(), "{extra:?}: a forged cell ran");
    }
    // A changed cell is named as such.
    let mut changed = on_disk.clone();
    changed["cells"][1]["source"] = json!("print('two')");
    std::fs::write(&nb, serde_json::to_vec(&changed).unwrap()).unwrap();
    let (status, _, stderr) = replay(&ws, &nb, &[]);
    assert_eq!(status, Some(1), "{stderr}");
    assert!(
        stderr.contains("ipybox replay:   cell 1 differs from what ran\n"),
        "{stderr}"
    );

    // The forged file copied elsewhere has no host record: its cells are not checked (said),
    // it replays in the sandbox under the default policy (the inserted cell is denied) and,
    // asked to run unsandboxed, the inserted cell writes the probe: the forgery is real code.
    let copy = probe.path().join("copy.ipynb");
    std::fs::write(&copy, serde_json::to_vec(&forged).unwrap()).unwrap();
    let (status, stdout, stderr) = replay(&ws, &copy, &[]);
    assert_eq!(status, Some(0), "{stdout}\n{stderr}");
    assert!(
        stderr.contains(&format!(
            "ipybox replay: no host record of {} (a copy, a notebook from another machine, or one a kernel wrote): its cells cannot be checked against what ran, and the confinement its metadata names (a sandbox, under the policy written there) is not trusted\n",
            copy.display()
        )),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!("ipybox replay: replaying in the sandbox (srt, the default policy), as {} has no host record: a notebook without one replays in the sandbox, whatever its metadata says (only --unsandboxed runs it on this host)\n", copy.display())),
        "{stderr}"
    );
    assert!(stdout.ends_with("denied EROFS\n"), "{stdout}\n{stderr}");
    assert!(!file.exists());
    let (status, stdout, stderr) = replay(&ws, &copy, &["--unsandboxed"]);
    assert_eq!(status, Some(0), "{stdout}\n{stderr}");
    assert!(stdout.ends_with("wrote\n"), "{stdout}\n{stderr}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "ran");

    // Only an output edited, in the host's layout: the code is what ran, so the replay runs
    // (in the sandbox, where the replayed forger cannot rewrite the notebook either) and warns
    // that the file was edited, naming the cell.
    let edited = String::from_utf8(original.clone()).unwrap().replacen(
        "\"text\":\"one\\n\"",
        "\"text\":\"two\\n\"",
        1,
    );
    assert_ne!(edited.as_bytes(), original.as_slice());
    std::fs::write(&nb, &edited).unwrap();
    let (status, stdout, stderr) = replay(&ws, &nb, &[]);
    assert_eq!(status, Some(0), "{stdout}\n{stderr}");
    assert!(
        stderr.contains(&format!(
            "ipybox replay: warning: {} was edited after the session: cell 1's outputs or metadata (tool calls, approvals) differ from what the host wrote\n",
            nb.display()
        )),
        "{stderr}"
    );
    assert_eq!(stdout, "one\nstarted\n0 ['EBUSY', 'EROFS']\n", "{stderr}");
    assert!(
        stderr.contains("cell 1: stdout differs: recorded \"two\\n\", replayed \"one\\n\""),
        "{stderr}"
    );
    assert_eq!(std::fs::read_to_string(&nb).unwrap(), edited);
}

/// What the kernel would try on the notebook's directory (and the one above it, for a nested
/// `--notebook-dir`): write into it, rename it, rename its parent. Prints each outcome.
const MOVE_AWAY: &str = "import errno, os\ndef attempt(f):\n    try:\n        f()\n        return 'ok'\n    except OSError as e:\n        return errno.errorcode[e.errno]\nprint(attempt(lambda: open('a/nb/x', 'w').close()), attempt(lambda: os.rename('a/nb', 'a/nb2')), attempt(lambda: os.rename('a', 'moved')))";

/// Under `--sandbox` a nested notebook directory (`--notebook-dir a/nb`) cannot be moved away
/// either: it is a read-only mount point, and its parent, which holds a mount point, cannot
/// be renamed (`EBUSY`), so the kernel cannot put a directory of its own where the host writes.
/// The control: unsandboxed, the same cell writes, renames both.
#[tokio::test(flavor = "multi_thread")]
async fn a_nested_notebook_directory_cannot_be_moved_away() {
    require!(SandboxDeps);
    use ipybox::CodeExecutor;
    use ipybox::sandbox::SandboxOptions;
    let (_keep, ws) = workspace();
    let ex = CodeExecutor::builder()
        .workspace(&ws)
        .without_spare_kernel()
        .notebook("a/nb")
        .sandbox(SandboxOptions {
            srt: Some(srt()),
            ..Default::default()
        })
        .build();
    ex.start().await.unwrap();
    assert_eq!(run(&ex, MOVE_AWAY).await, "EROFS EBUSY EBUSY");
    let path = ex.notebook().unwrap().path().unwrap();
    ex.notebook().unwrap().flush();
    ex.stop().await;
    assert!(path.starts_with(ws.join("a/nb")), "{}", path.display());
    let on_disk: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    assert_eq!(code_sources(&on_disk), [MOVE_AWAY]);

    // The control: the same cell in an unsandboxed kernel.
    let (_keep2, plain) = workspace();
    std::fs::create_dir_all(plain.join("a/nb")).unwrap();
    let ex = CodeExecutor::builder()
        .workspace(&plain)
        .without_spare_kernel()
        .build();
    ex.start().await.unwrap();
    assert_eq!(run(&ex, MOVE_AWAY).await, "ok ok ok");
    ex.stop().await;
    assert!(plain.join("moved/nb2/x").is_file());
}

/// A notebook with no host record that says it was recorded in the HTTP service's confined
/// kernels (per-session bubblewrap, which a replay cannot apply) does not choose its
/// confinement either: it replays in the sandbox (the cell's write denied), never unconfined by
/// default; `--unsandboxed` runs it (the control: its cell writes the probe file).
#[tokio::test(flavor = "multi_thread")]
async fn an_unrecorded_confined_notebook_replays_in_the_sandbox() {
    require!(SandboxDeps);
    let probe = Probe::new("replay-confined");
    let file = probe.path().join("written-on-the-host");
    let nb = probe.path().join("confined.ipynb");
    let notebook = json!({
        "nbformat": 4, "nbformat_minor": 5,
        "metadata": {"ipybox": {"session": "s", "confinement": {"sandbox": false, "kernel": "confined"}}},
        "cells": [{"cell_type": "code", "execution_count": 1, "id": "a", "metadata": {}, "outputs": [], "source": write_probe(&file)}],
    });
    std::fs::write(&nb, serde_json::to_vec(&notebook).unwrap()).unwrap();
    // (A workspace of its own: the sandbox lets the kernel write the workspace.)
    let (_keep, ws) = workspace();
    let (status, stdout, stderr) = replay(&ws, &nb, &[]);
    assert_eq!(status, Some(0), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("its metadata names (no sandbox (a confined kernel)) is not trusted\n")
            && stderr
                .contains("ipybox replay: replaying in the sandbox (srt, the default policy), as "),
        "{stderr}"
    );
    assert_eq!(stdout, "denied EROFS\n");
    assert!(!file.exists());
    let (status, stdout, stderr) = replay(&ws, &nb, &["--unsandboxed"]);
    assert_eq!(status, Some(0), "{stdout}\n{stderr}");
    assert!(
        stderr.contains(&format!("ipybox replay: warning: no host record shows how {} was confined; --unsandboxed replays it WITHOUT the sandbox: its cells run on this host, unconfined, as you\n", nb.display())),
        "{stderr}"
    );
    assert_eq!(stdout, "wrote\n");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "ran");
}

/// `ipybox exec --sandbox --workspace WS -c CODE`: exit status, stdout, stderr.
fn exec_sandboxed(ws: &Path, code: &str) -> (Option<i32>, String, String) {
    let out = std::process::Command::new(BIN)
        .args(["exec", "--sandbox", "--workspace"])
        .arg(ws)
        .args(["-c", code])
        .env("IPYBOX_SRT", srt())
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Issue 50 (2): a notebook without a host record never chooses its own confinement. A
/// sandboxed cell (`ipybox exec --sandbox`) writes two notebooks into the workspace, each with
/// one cell that writes a file outside it: `review/unsandboxed.ipynb`, whose metadata says it
/// ran unsandboxed (`{"sandbox": false, "kernel": "local"}`), and `review/wide.ipynb`, whose
/// metadata says it ran in a sandbox whose policy lets the kernel write that file's directory.
/// `ipybox replay` of each, with `--yes` and without, replays in the sandbox under the default
/// policy and says why (the cell's write denied, the file absent); with srt missing it refuses,
/// nothing run. The controls: `--unsandboxed` says before the first cell that the cells run on
/// the host and then writes the file; and the same cell recorded by a trusted (unsandboxed)
/// session, which the host has a record of, replays on the host and writes it.
#[tokio::test(flavor = "multi_thread")]
async fn a_notebook_without_a_host_record_does_not_choose_its_confinement() {
    require!(SandboxDeps);
    let probe = Probe::new("replay-unrecorded");
    let file = probe.path().join("written-on-the-host");
    let attack = write_probe(&file);
    let wide_policy = json!({
        "filesystem": {"allowWrite": [".", probe.path()], "denyRead": [], "denyWrite": []},
        "network": {"allowedDomains": [], "deniedDomains": []},
    });
    let forge = format!(
        r#"import json, os
attack = {attack}
def notebook(confinement):
    return {{"nbformat": 4, "nbformat_minor": 5,
            "metadata": {{"ipybox": {{"session": "forged", "confinement": confinement}}}},
            "cells": [{{"cell_type": "code", "execution_count": 1, "id": "a", "metadata": {{}}, "outputs": [], "source": attack}}]}}
os.makedirs("review", exist_ok=True)
with open("review/unsandboxed.ipynb", "w") as f:
    json.dump(notebook({{"sandbox": False, "kernel": "local"}}), f)
with open("review/wide.ipynb", "w") as f:
    json.dump(notebook({{"sandbox": True, "kernel": "sandbox", "policy": json.loads({policy}), "policy_sha256": "0" * 64}}), f)
print("forged")"#,
        attack = serde_json::to_string(&attack).unwrap(),
        policy = serde_json::to_string(&wide_policy.to_string()).unwrap(),
    );
    let (_keep, ws) = workspace();
    let (status, stdout, stderr) = exec_sandboxed(&ws, &forge);
    assert_eq!((status, stdout.as_str()), (Some(0), "forged\n"), "{stderr}");
    // The sandboxed cell itself could not write the file.
    let (status, stdout, stderr) = exec_sandboxed(&ws, &attack);
    assert_eq!(
        (status, stdout.as_str()),
        (Some(0), "denied EROFS\n"),
        "{stderr}"
    );
    assert!(!file.exists());

    let forged = [
        (
            ws.join("review/unsandboxed.ipynb"),
            "no sandbox (a local kernel)",
        ),
        (
            ws.join("review/wide.ipynb"),
            "a sandbox, under the policy written there",
        ),
    ];
    for (nb, claim) in &forged {
        assert!(nb.is_file(), "the sandboxed kernel wrote {}", nb.display());
        for extra in [&[][..], &["--asking"][..]] {
            let (status, stdout, stderr) = replay(&ws, nb, extra);
            assert_eq!(status, Some(0), "{extra:?}: {stdout}\n{stderr}");
            assert!(
                stderr.contains(&format!(
                    "ipybox replay: no host record of {} (a copy, a notebook from another machine, or one a kernel wrote): its cells cannot be checked against what ran, and the confinement its metadata names ({claim}) is not trusted\nipybox replay: replaying in the sandbox (srt, the default policy), as {} has no host record: a notebook without one replays in the sandbox, whatever its metadata says (only --unsandboxed runs it on this host)\nipybox replay: cell 1/1: ",
                    nb.display(),
                    nb.display()
                )),
                "{extra:?}: {stderr}"
            );
            assert_eq!(stdout, "denied EROFS\n", "{extra:?}: {stderr}");
            assert!(
                !file.exists(),
                "{extra:?}: {} ran on the host",
                nb.display()
            );
        }
        // No sandbox here: refused, nothing run.
        let (status, stdout, stderr) =
            replay_with_srt(&ws, nb, &[], &probe.path().join("no-srt-here"));
        assert_eq!(status, Some(1), "{stdout}\n{stderr}");
        assert_eq!(stdout, "", "{stderr}");
        assert!(
            stderr.contains("error: cannot replay in the sandbox: sandbox unavailable: ")
                && stderr.contains("pass --unsandboxed to run it on this host, unconfined"),
            "{stderr}"
        );
        assert!(!file.exists());

        // The control: asked to, it runs on the host, and says so before the first cell.
        let (status, stdout, stderr) = replay(&ws, nb, &["--unsandboxed"]);
        assert_eq!(status, Some(0), "{stdout}\n{stderr}");
        assert!(
            stderr.contains(&format!(
                "ipybox replay: warning: no host record shows how {} was confined; --unsandboxed replays it WITHOUT the sandbox: its cells run on this host, unconfined, as you\nipybox replay: cell 1/1: ",
                nb.display()
            )),
            "{stderr}"
        );
        assert_eq!(stdout, "wrote\n", "{stderr}");
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "ran");
        std::fs::remove_file(&file).unwrap();
    }

    // The control: the same cell run by a trusted session (the user's own unsandboxed kernel),
    // which the host recorded, replays on the host by default and writes the file.
    let (_keep2, plain_ws) = workspace();
    let s = server(&plain_ws, false).await;
    assert_eq!(cell(&s, &attack).await, "wrote");
    s.close().await;
    std::fs::remove_file(&file).unwrap();
    let trusted = notebook_with(&plain_ws, 1).await;
    let (status, stdout, stderr) = replay(&plain_ws, &trusted, &[]);
    assert_eq!(status, Some(0), "{stdout}\n{stderr}");
    assert!(!stderr.contains("no host record"), "{stderr}");
    assert!(!stderr.contains("sandbox"), "{stderr}");
    assert_eq!(stdout, "wrote\n", "{stderr}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "ran");
}

/// A notebook the host recorded from a confined `serve --http` session (its host record says
/// so) is not replayed less confined by default: refused, with what to pass; nothing runs. The
/// control: `--unsandboxed` runs it on this host, and the cell it was denied in the session
/// then writes its file.
#[tokio::test(flavor = "multi_thread")]
async fn a_recorded_confined_session_is_not_replayed_less_confined() {
    require!(TestEnv);
    let probe = Probe::new("replay-confined");
    let file = probe.path().join("written");
    let notebooks = probe.path().join("notebooks");
    let (_keep, ws) = workspace();
    let service = crate::http_support::Service::start(
        &ws,
        &[],
        &["--notebook-dir", notebooks.to_str().unwrap()],
    );
    let client =
        crate::http_support::connect(&service.url(), None, crate::mcp_eras::Era::Handshake).await;
    let (failed, text) = crate::http_support::cell(&client, &write_probe(&file), None).await;
    assert!(!failed, "{text}");
    assert!(
        text.starts_with("denied "),
        "the confined session wrote it: {text}"
    );
    client.close().await;
    drop(service);
    let nb = std::fs::read_dir(&notebooks)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "ipynb"))
        .expect("the session's notebook");

    let (status, stdout, stderr) = replay(&ws, &nb, &[]);
    assert_eq!(status, Some(1), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("the session was recorded in the HTTP service's per-session confinement, which a replay on this host cannot apply: its cells would run less confined\n  help: pass --sandbox"),
        "{stderr}"
    );
    assert!(!stderr.contains("no host record"), "{stderr}");
    assert!(!file.exists());

    let (status, stdout, stderr) = replay(&ws, &nb, &["--unsandboxed"]);
    assert_eq!(status, Some(0), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("ipybox replay: the session was recorded in the HTTP service's per-session confinement; --unsandboxed replays it WITHOUT that confinement"),
        "{stderr}"
    );
    assert_eq!(stdout, "wrote\n", "{stderr}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "ran");
}
