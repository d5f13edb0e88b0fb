//! Session notebooks end to end (issue 31): what the SDK, the stdio MCP server and the HTTP
//! service record (code, outputs, errors, images, timeouts, cancels, resets, approvals with their
//! answers), that it validates with `nbformat` and renders with `jupyter nbconvert`, that one
//! HTTP session never sees another's, that a link planted by sandboxed code redirects no write,
//! and that `ipybox replay` reproduces a recorded session.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::http_support::{
    PLANTED, Service, cell as http_cell, connect, probe_outcome, read_probe, split_note,
};
use crate::mcp_approvals::{CALL_ADD, ask_add, cell, start};
use crate::mcp_eras::{Answer, Era, ScriptedClient, both_eras};
use crate::support::*;
use ipybox::CodeExecutor;
use ipybox::executor::ExecutionEvent;
use rmcp::model::{CallToolRequestParams, ReadResourceRequestParams, ResourceContents};
use serde_json::{Value, json};

/// A tiny PNG (1x1), base64.
const PNG: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==";

fn display_png() -> String {
    format!(
        "import base64\nfrom IPython.display import Image, display\ndisplay(Image(data=base64.b64decode('{PNG}')))"
    )
}

/// The notebook files in `dir`, sorted.
fn notebooks_in(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    files.retain(|p| p.extension().is_some_and(|e| e == "ipynb"));
    files.sort();
    files
}

fn read_json(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// The code cells of a notebook.
fn code_cells(notebook: &Value) -> Vec<Value> {
    notebook["cells"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["cell_type"] == "code")
        .cloned()
        .collect()
}

/// Validates `path` with `nbformat.validate` and renders it with `jupyter nbconvert --to html`
/// (the test venv's); returns the HTML.
fn validate_and_render(path: &Path) -> String {
    let out = std::process::Command::new(python())
        .args([
            "-c",
            "import sys, nbformat\nnb = nbformat.read(sys.argv[1], as_version=nbformat.NO_CONVERT)\nnbformat.validate(nb)\nprint(nb.nbformat, nb.nbformat_minor)",
        ])
        .arg(path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "nbformat.validate failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "4 5");
    let html_dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(python())
        .args(["-m", "nbconvert", "--to", "html", "--output-dir"])
        .arg(html_dir.path())
        .arg(path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "jupyter nbconvert failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let html = std::fs::read_dir(html_dir.path())
        .unwrap()
        .flatten()
        .find(|e| e.path().extension().is_some_and(|x| x == "html"))
        .expect("an HTML file");
    std::fs::read_to_string(html.path()).unwrap()
}

/// Runs `code` with `stream()`, answering its approval requests with `answer` (`None`: never).
async fn streamed(ex: &CodeExecutor, code: &str, answer: Option<bool>) -> Result<String, String> {
    let mut execution = ex.stream(code, Some(Duration::from_secs(60)));
    let mut held = Vec::new();
    while let Some(event) = execution.next().await {
        match event {
            ExecutionEvent::Approval(request) => match answer {
                Some(true) => request.accept(),
                Some(false) => request.reject(),
                None => held.push(request),
            },
            ExecutionEvent::Result(r) => return r.map(|o| o.text).map_err(|e| e.to_string()),
            _ => {}
        }
    }
    unreachable!("a stream ends with its result")
}

/// The SDK with `notebook(dir)`: every kind of cell, as described in docs/notebook.md, and the
/// file validates and renders.
#[tokio::test(flavor = "multi_thread")]
async fn the_sdk_records_every_kind_of_cell_and_the_notebook_validates() {
    require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    let ex = CodeExecutor::builder()
        .workspace(ws.path())
        .notebook("notebooks")
        .approval_timeout(Duration::from_secs(1))
        .build();
    ex.start().await.unwrap();
    ex.register_mcp_server("fx", &fixture_stdio_params("stdio"))
        .await
        .unwrap();
    let secs = |s| Some(Duration::from_secs(s));
    assert_eq!(run(&ex, "x = 6 * 7\nprint(x)").await, "42");
    assert_eq!(run(&ex, "x").await, "42");
    run(
        &ex,
        "import sys\nprint('out')\nprint('warn', file=sys.stderr)",
    )
    .await;
    run(&ex, &display_png()).await;
    assert!(ex.execute("print('before')\n1/0", secs(30)).await.is_err());
    assert_eq!(streamed(&ex, CALL_ADD, Some(true)).await.unwrap(), "3");
    let declined = streamed(&ex, CALL_ADD, Some(false)).await.unwrap_err();
    assert!(declined.contains("ApprovalRejected"), "{declined}");
    let expired = streamed(&ex, CALL_ADD, None).await.unwrap_err();
    assert!(expired.contains("ApprovalTimeout"), "{expired}");
    let timed_out = ex
        .execute("import time\nprint('sleeping')\ntime.sleep(30)", secs(1))
        .await
        .unwrap_err();
    assert!(timed_out.to_string().contains("timed out"), "{timed_out}");
    let mut sleeper = ex.stream("import time\ntime.sleep(30)", secs(60));
    let canceller = sleeper.canceller();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(500)).await;
        canceller.cancel();
    });
    while sleeper.next().await.is_some() {}
    ex.reset().await.unwrap();
    assert_eq!(run(&ex, "print('x' in dir())").await, "False");
    let path = ex.notebook().unwrap().path().unwrap();
    ex.stop().await;

    assert_eq!(
        notebooks_in(&ws.path().join("notebooks")),
        std::slice::from_ref(&path)
    );
    let name = path.file_name().unwrap().to_str().unwrap();
    let tag = ex.notebook().unwrap().tag().to_string();
    assert!(name.ends_with(&format!("Z-{tag}.ipynb")), "{name}");
    let nb = read_json(&path);
    assert_eq!(nb["metadata"]["kernelspec"]["name"], "python3");
    assert_eq!(nb["metadata"]["ipybox"]["session"], tag.as_str());
    let cells = code_cells(&nb);
    assert_eq!(cells.len(), 11, "{cells:#?}");
    let meta = |i: usize| cells[i]["metadata"]["ipybox"].clone();
    let outputs = |i: usize| cells[i]["outputs"].clone();
    let counts: Vec<Value> = cells.iter().map(|c| c["execution_count"].clone()).collect();
    assert_eq!(
        counts,
        (1..=10).chain(1..=1).map(Value::from).collect::<Vec<_>>()
    );
    assert_eq!(cells[0]["source"], "x = 6 * 7\nprint(x)");
    assert_eq!(
        outputs(0),
        json!([{"output_type": "stream", "name": "stdout", "text": "42\n"}])
    );
    assert_eq!(meta(0)["status"], "ok");
    assert_eq!(meta(0)["timeout"], 60.0);
    assert!(meta(0)["duration"].as_f64().unwrap() > 0.0);
    assert_eq!(
        outputs(1),
        json!([{"output_type": "execute_result", "execution_count": 2, "data": {"text/plain": "42"}, "metadata": {}}])
    );
    assert_eq!(
        outputs(2),
        json!([
            {"output_type": "stream", "name": "stdout", "text": "out\n"},
            {"output_type": "stream", "name": "stderr", "text": "warn\n"},
        ])
    );
    assert_eq!(
        outputs(3),
        json!([{"output_type": "display_data", "data": {"image/png": PNG}, "metadata": {}}])
    );
    assert_eq!(meta(4)["status"], "error");
    assert_eq!(outputs(4)[0]["text"], "before\n");
    assert_eq!(outputs(4)[1]["output_type"], "error");
    assert_eq!(outputs(4)[1]["ename"], "ZeroDivisionError");
    assert_eq!(outputs(4)[1]["evalue"], "division by zero");
    assert!(
        outputs(4)[1]["traceback"]
            .as_array()
            .unwrap()
            .iter()
            .any(|l| l == "ZeroDivisionError: division by zero"),
        "{}",
        outputs(4)
    );
    // Approvals: what was asked, and the answer.
    let call = |i: usize| meta(i)["tool_calls"][0].clone();
    assert_eq!(call(5)["server"], "fx");
    assert_eq!(call(5)["tool"], "add");
    assert_eq!(call(5)["arguments"], json!({"a": 1, "b": 2}));
    assert_eq!(call(5)["question"], "fx.add(a=1, b=2)");
    assert_eq!(call(5)["answer"], "accepted");
    assert_eq!(call(6)["answer"], "declined");
    assert_eq!(meta(6)["status"], "error");
    assert_eq!(outputs(6)[0]["ename"], "ApprovalRejectedError");
    assert_eq!(call(7)["answer"], "timed out");
    assert!(call(7)["waited"].as_f64().unwrap() >= 1.0);
    assert_eq!(outputs(7)[0]["ename"], "ApprovalTimeoutError");
    // The timeout and the cancel.
    assert_eq!(meta(8)["status"], "timed out");
    assert_eq!(meta(8)["timeout"], 1.0);
    assert_eq!(outputs(8)[0]["text"], "sleeping\n");
    assert_eq!(
        outputs(8)[1]["text"],
        "execution timed out after 1 s and was interrupted; kernel state was kept\n"
    );
    assert_eq!(meta(9)["status"], "cancelled");
    assert_eq!(
        outputs(9),
        json!([{"output_type": "stream", "name": "stderr", "text": "the execution was cancelled\n"}])
    );
    // The reset: a section, counts start again.
    let all = nb["cells"].as_array().unwrap();
    let reset_at = all
        .iter()
        .position(|c| c["metadata"]["ipybox"]["section"] == "reset")
        .expect("a reset section");
    assert_eq!(all[reset_at - 1]["source"], "import time\ntime.sleep(30)");
    assert_eq!(all[reset_at + 1]["source"], "print('x' in dir())");
    // register_mcp_server and the executions of execute() without tool calls: nothing else.
    assert_eq!(all.len(), 13, "header + 11 code cells + the reset");

    let html = validate_and_render(&path);
    assert!(html.contains("ZeroDivisionError"), "the error renders");
    assert!(html.contains(PNG), "the image renders");
}

/// `ipybox replay` runs a recorded 10-cell session (a tool call, an image, an error, a reset)
/// again and finds every output as recorded; a recording that differs is named, and `--check`
/// makes that an exit status of 1.
#[tokio::test(flavor = "multi_thread")]
async fn replay_reproduces_a_ten_cell_session() {
    require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    let ex = CodeExecutor::builder()
        .workspace(ws.path())
        .notebook("notebooks")
        .build();
    ex.start().await.unwrap();
    ex.register_mcp_server("fx", &fixture_stdio_params("stdio"))
        .await
        .unwrap();
    let png = display_png();
    let cells = [
        "import random\nrandom.seed(1)\ndata = [random.randint(0, 100) for _ in range(5)]\nprint(data)",
        "sum(data)",
        "import sys\nprint('a note', file=sys.stderr)",
        png.as_str(),
        "def f(x):\n    return x * 2\n[f(v) for v in data]",
        "print('half')\n1/0",
        CALL_ADD,
    ];
    for code in cells {
        let _ = ex.execute(code, Some(Duration::from_secs(60))).await;
    }
    ex.reset().await.unwrap();
    for code in [
        "print('fresh', 'data' in dir())",
        "for i in range(3):\n    print(i)",
        "{'a': 1, 'b': [1, 2]}",
    ] {
        run(&ex, code).await;
    }
    let path = ex.notebook().unwrap().path().unwrap();
    ex.stop().await;
    assert_eq!(code_cells(&read_json(&path)).len(), 10);

    let replay = |file: &Path, check: bool| {
        let mut command = std::process::Command::new(BIN);
        command
            .arg("replay")
            .arg(file)
            .arg("--workspace")
            .arg(ws.path())
            .arg("--yes");
        if check {
            command.arg("--check");
        }
        // A copy has no host record: it replays in the sandbox unless the person, trusting
        // it (here: the test's own edit of its own session), runs it on the host.
        if file != path {
            command.arg("--unsandboxed");
        }
        let out = command.output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (status, stdout, stderr) = replay(&path, true);
    assert_eq!(status, Some(0), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("ipybox replay: 10 cells replayed, every output as recorded"),
        "{stderr}"
    );
    assert!(
        stderr.contains("the kernel is reset here, as it was in the recording (reset)"),
        "{stderr}"
    );
    assert!(stdout.contains("fresh False\n"), "{stdout}");
    assert!(stdout.contains("\n3\n"), "the tool call ran: {stdout}");
    assert!(stderr.contains("ZeroDivisionError"), "{stderr}");
    // No notebook of its own: the replay records in memory.
    assert_eq!(
        notebooks_in(&ws.path().join("notebooks")),
        std::slice::from_ref(&path)
    );

    // A recording whose output differs: named, and an exit status only with --check.
    let mut nb = read_json(&path);
    let second = nb["cells"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .filter(|c| c["cell_type"] == "code")
        .nth(1)
        .unwrap();
    second["outputs"][0]["data"]["text/plain"] = json!("999");
    let edited = ws.path().join("edited.ipynb");
    std::fs::write(&edited, serde_json::to_vec(&nb).unwrap()).unwrap();
    let (status, _, stderr) = replay(&edited, true);
    assert_eq!(status, Some(1), "{stderr}");
    assert!(
        stderr.contains("ipybox replay: 1 of 10 cells differ from the recording:\n  cell 2: results differ: recorded \"999\", replayed \""),
        "{stderr}"
    );
    let (status, _, _) = replay(&edited, false);
    assert_eq!(status, Some(0));
    let (status, _, stderr) = replay(&ws.path().join("missing.ipynb"), false);
    assert_eq!(status, Some(1));
    assert!(stderr.contains("cannot read"), "{stderr}");
}

/// The stdio MCP server records by default in `<ws>/notebooks`: the approvals of `--approve ask`
/// with their questions and answers (accepted, declined, timed out, remembered), shell commands,
/// outputs within `max_output_chars`, no `.env` value; the notebook is a resource.
async fn the_mcp_server_records_approvals_and_serves_the_notebook(era: Era) {
    require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    std::fs::write(
        ws.path().join(".env"),
        "FX_SECRET=s3cr3t-value-from-dotenv\n",
    )
    .unwrap();
    let user = ScriptedClient::new(
        era,
        true,
        &[
            Answer::Accept,
            Answer::Decline,
            Answer::Late(2500),
            Answer::AcceptForSession,
            Answer::Accept,
        ],
    );
    let c = start(
        ws.path(),
        &user,
        &[
            "--approve",
            "ask",
            "--approval-timeout",
            "1",
            "--approve-shell",
        ],
    )
    .await;
    let mut params = fixture_stdio_params("stdio");
    params["env"] = json!({"FX_SECRET": "${FX_SECRET}"});
    let result = c
        .service
        .call_tool(
            CallToolRequestParams::new("register_mcp_server")
                .with_arguments(args(json!({"server_name": "fx", "server_params": params}))),
        )
        .await
        .unwrap();
    assert_ne!(result.is_error, Some(true));
    assert_eq!(cell(&c, CALL_ADD).await, (false, "3".into()));
    assert!(cell(&c, CALL_ADD).await.0, "declined");
    assert!(cell(&c, CALL_ADD).await.0, "timed out");
    assert_eq!(cell(&c, CALL_ADD).await, (false, "3".into()));
    assert_eq!(cell(&c, CALL_ADD).await, (false, "3".into()));
    assert_eq!(
        cell(&c, "!echo shell-ran").await,
        (false, "shell-ran".into())
    );
    let long = c
        .service
        .call_tool(
            CallToolRequestParams::new("execute_ipython_cell").with_arguments(args(
                json!({"code": "print('y' * 100)", "max_output_chars": 10}),
            )),
        )
        .await
        .unwrap();
    assert!(crate::mcp_approvals::text(&long).starts_with("yyyyyyyyyy\n\n[Output truncated"));
    assert_eq!(user.questions().len(), 5, "remembered: not asked");

    // The resource, listed and read, is the file.
    let listed = c.peer().list_all_resources().await.unwrap();
    let notebooks: Vec<_> = listed
        .iter()
        .filter(|r| r.uri.starts_with("ipybox://notebook/"))
        .collect();
    assert_eq!(notebooks.len(), 1, "{listed:?}");
    assert_eq!(
        notebooks[0].mime_type.as_deref(),
        Some("application/x-ipynb+json")
    );
    let read = c
        .peer()
        .read_resource(ReadResourceRequestParams::new(notebooks[0].uri.clone()))
        .await
        .unwrap();
    let ResourceContents::TextResourceContents { text, .. } = &read.contents[0] else {
        panic!("{read:?}")
    };
    let files = notebooks_in(&ws.path().join("notebooks"));
    assert_eq!(files.len(), 1);
    assert_eq!(text.as_bytes(), std::fs::read(&files[0]).unwrap());
    let unknown = c
        .peer()
        .read_resource(ReadResourceRequestParams::new("ipybox://notebook/nobody"))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        unknown.contains("no notebook ipybox://notebook/nobody"),
        "{unknown}"
    );
    c.close().await;

    assert!(
        !text.contains("s3cr3t-value-from-dotenv"),
        "a .env value is in the notebook"
    );
    let nb: Value = serde_json::from_str(text).unwrap();
    let cells = code_cells(&nb);
    assert_eq!(cells.len(), 7);
    let answers: Vec<Value> = cells[..5]
        .iter()
        .map(|c| c["metadata"]["ipybox"]["tool_calls"][0]["answer"].clone())
        .collect();
    assert_eq!(
        answers,
        [
            "accepted",
            "declined",
            "timed out",
            "accepted",
            "remembered"
        ]
    );
    let call = |i: usize| cells[i]["metadata"]["ipybox"]["tool_calls"][0].clone();
    assert_eq!(call(0)["question"], ask_add());
    assert_eq!(call(1)["reason"], "declined by the user");
    assert_eq!(call(2)["question"], "fx.add(a=1, b=2)");
    assert!(call(4).get("question").is_none(), "nobody was asked");
    let shell = &cells[5]["metadata"]["ipybox"]["shell_commands"][0];
    assert_eq!(shell["command"], "echo shell-ran");
    assert_eq!(shell["answer"], "accepted");
    assert_eq!(
        shell["question"],
        "ipybox: Run this shell command from executed code?\n\necho shell-ran"
    );
    assert_eq!(
        cells[6]["outputs"],
        json!([
            {"output_type": "stream", "name": "stdout", "text": "yyyyyyyyyy"},
            {"output_type": "stream", "name": "stderr", "text": "\n[Output truncated: exceeded 10 character limit]\n"},
        ])
    );
    assert_eq!(cells[6]["metadata"]["ipybox"]["output_limit"], 10);
    validate_and_render(&files[0]);
}

both_eras!(the_mcp_server_records_approvals_and_serves_the_notebook);

/// `--no-notebook` records nothing.
#[tokio::test(flavor = "multi_thread")]
async fn no_notebook_records_nothing() {
    let ws = tempfile::tempdir().unwrap();
    let user = ScriptedClient::new(Era::Handshake, false, &[]);
    let c = start(ws.path(), &user, &["--no-notebook"]).await;
    assert_eq!(cell(&c, "print(1)").await, (false, "1".into()));
    let listed = c.peer().list_all_resources().await.unwrap();
    assert!(
        listed
            .iter()
            .all(|r| !r.uri.starts_with("ipybox://notebook/"))
    );
    c.close().await;
    assert!(!ws.path().join("notebooks").exists());
}

/// Over HTTP each session's notebook is host-side (0600 in a 0700 directory, not the workspace)
/// and readable only by the session's owner: another token's URI answers as unknown. No kernel
/// reads a notebook file: not in an operator's `--notebook-dir` (outside `/tmp` and `$HOME`, next
/// to a file the kernel reads), not in the default `$IPYBOX_HOME/notebooks`; the same probes from
/// an `--unconfined-sessions` service read them (the control).
async fn http_sessions_never_see_each_others_notebook(era: Era) {
    require!(TestEnv);
    let probe = probe_dir_or_skip!("notebooks");
    let ws = tempfile::tempdir().unwrap();
    let visible = probe.path().join("visible.txt");
    std::fs::write(&visible, PLANTED).unwrap();
    let dir = probe.path().join("notebooks");
    let dir_flag = dir.display().to_string();
    // The view is an allowlist (tenant_view.rs): the control file is shown explicitly.
    let visible_flag = visible.display().to_string();
    let tenants = [
        "--token",
        "token-of-alice-0123456789",
        "--token",
        "token-of-bob-0123456789",
        "--trust-tenants",
        "--notebook-dir",
        &dir_flag,
        "--session-show",
        &visible_flag,
    ];
    let service = Service::start(ws.path(), &[], &tenants);
    let alice = connect(&service.url(), Some("token-of-alice-0123456789"), era).await;
    let bob = connect(&service.url(), Some("token-of-bob-0123456789"), era).await;
    let (failed, text) = http_cell(
        &alice,
        &format!("print('alice was here', {PLANTED:?})"),
        None,
    )
    .await;
    assert!(!failed, "{text}");
    let (failed, text) =
        http_cell(&bob, &format!("print('bob was here', {PLANTED:?})"), None).await;
    assert!(!failed, "{text}");
    let bob_session = split_note(&text).1;
    if era == Era::Stateless {
        assert!(bob_session.is_some());
    }
    let own = |resources: Vec<rmcp::model::Resource>| -> Vec<String> {
        resources
            .into_iter()
            .map(|r| r.uri)
            .filter(|u| u.starts_with("ipybox://notebook/"))
            .collect()
    };
    let alice_uris = own(alice.service.list_all_resources().await.unwrap());
    let bob_uris = own(bob.service.list_all_resources().await.unwrap());
    assert_eq!(alice_uris.len(), 1, "{alice_uris:?}");
    assert_eq!(bob_uris.len(), 1, "{bob_uris:?}");
    assert_ne!(alice_uris, bob_uris);
    let read = |client: &crate::http_support::PlainHttp, uri: &str| {
        let uri = uri.to_string();
        let peer = client.service.peer().clone();
        async move {
            peer.read_resource(ReadResourceRequestParams::new(uri))
                .await
                .map(|r| match &r.contents[0] {
                    ResourceContents::TextResourceContents { text, .. } => text.clone(),
                    other => panic!("{other:?}"),
                })
                .map_err(|e| e.to_string())
        }
    };
    let mine = read(&alice, &alice_uris[0]).await.unwrap();
    assert!(mine.contains("alice was here") && !mine.contains("bob was here"));
    let theirs = read(&alice, &bob_uris[0]).await.unwrap_err();
    assert!(
        theirs.contains(&format!("no notebook {}", bob_uris[0])),
        "{theirs}"
    );
    let theirs = read(&bob, &alice_uris[0]).await.unwrap_err();
    assert!(
        theirs.contains(&format!("no notebook {}", alice_uris[0])),
        "{theirs}"
    );
    assert!(
        read(&bob, &bob_uris[0])
            .await
            .unwrap()
            .contains("bob was here")
    );

    // On the host, private, and nowhere in the shared workspace (written in the background:
    // waited for).
    use std::os::unix::fs::MetadataExt;
    let files = wait_notebooks(&dir, 2).await;
    assert_eq!(std::fs::metadata(&dir).unwrap().mode() & 0o777, 0o700);
    for file in &files {
        assert_eq!(std::fs::metadata(file).unwrap().mode() & 0o777, 0o600);
    }
    assert!(!ws.path().join("notebooks").exists());
    // Confined (the service's default): no kernel can read a notebook file, another session's
    // or its own: the host's directory is hidden from its view, the file next to it is not.
    let probe_code = notebook_probe(&visible, &files);
    let hidden = notebook_outcome(files.len(), "FileNotFoundError");
    let (failed, text) = http_cell(&bob, &probe_code, bob_session.as_deref()).await;
    assert!(!failed, "{text}");
    assert_eq!(split_note(&text).0, hidden);
    alice.close().await;
    bob.close().await;
    drop(service);

    // The documented default, `$IPYBOX_HOME/notebooks` (the data directory, which every
    // confined kernel sees empty): hidden too, and not in the workspace.
    let home = probe.path().join("home");
    let python = kernel_python().display().to_string();
    let home_env = home.display().to_string();
    let env = [
        ("IPYBOX_HOME", home_env.as_str()),
        ("IPYBOX_PYTHON", python.as_str()),
    ];
    let service = Service::start(
        ws.path(),
        &env,
        &["--warm-sessions", "0", "--session-show", &visible_flag],
    );
    let carol = connect(&service.url(), None, era).await;
    let (failed, text) = http_cell(&carol, &format!("print({PLANTED:?})"), None).await;
    assert!(!failed, "{text}");
    let carol_session = split_note(&text).1;
    let default_files = wait_notebooks(&home.join("notebooks"), 1).await;
    assert!(!ws.path().join("notebooks").exists());
    let (failed, text) = http_cell(
        &carol,
        &notebook_probe(&visible, &default_files),
        carol_session.as_deref(),
    )
    .await;
    assert!(!failed, "{text}");
    assert_eq!(
        split_note(&text).0,
        notebook_outcome(1, "FileNotFoundError")
    );
    carol.close().await;
    drop(service);

    // The control: the same probes from an unconfined service's kernel read every notebook.
    let mut unconfined = tenants.to_vec();
    unconfined.push("--unconfined-sessions");
    let service = Service::start(ws.path(), &[], &unconfined);
    let bob = connect(&service.url(), Some("token-of-bob-0123456789"), era).await;
    let mut all = files.clone();
    all.extend(default_files);
    let (failed, text) = http_cell(&bob, &notebook_probe(&visible, &all), None).await;
    assert!(!failed, "{text}");
    assert_eq!(split_note(&text).0, notebook_outcome(all.len(), "read"));
    bob.close().await;
}

/// Waits (30 s at most) for `n` notebook files in `dir`; returns them.
async fn wait_notebooks(dir: &Path, n: usize) -> Vec<PathBuf> {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while notebooks_in(dir).len() < n && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let files = notebooks_in(dir);
    assert_eq!(files.len(), n, "{files:?}");
    files
}

/// A kernel's reads of `visible` (the control) and of each notebook file.
fn notebook_probe(visible: &Path, files: &[PathBuf]) -> String {
    let labels: Vec<String> = (0..files.len()).map(|i| format!("notebook{i}")).collect();
    let mut paths: Vec<(&str, &Path)> = vec![("visible", visible)];
    paths.extend(
        labels
            .iter()
            .map(String::as_str)
            .zip(files.iter().map(PathBuf::as_path)),
    );
    read_probe(&paths)
}

/// What [`notebook_probe`] prints when the `n` notebooks read as `outcome`.
fn notebook_outcome(n: usize, outcome: &str) -> String {
    let labels: Vec<String> = (0..n).map(|i| format!("notebook{i}")).collect();
    let mut want = vec![("visible", "read")];
    want.extend(labels.iter().map(|l| (l.as_str(), outcome)));
    probe_outcome(&want)
}

both_eras!(http_sessions_never_see_each_others_notebook);

/// Under `--sandbox` the kernel cannot plant links for the notebook: its directory is read-only
/// inside the sandbox (a link in place of the file cannot be made) and a mount point (it cannot
/// be moved away for a link to take its place); the host goes on writing the file, and a link's
/// target stays untouched. (The host never follows links there either: the unit tests of
/// `notebook` plant them from outside.)
#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread")]
async fn links_planted_by_sandboxed_code_do_not_redirect_the_notebook() {
    require!(SandboxDeps);
    let ws = tempfile::tempdir().unwrap();
    let ws = ws.path().canonicalize().unwrap();
    // Outside the workspace (the sandbox cannot write there), under target/.
    let outside = root()
        .join("target")
        .join(format!("notebook-links-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&outside);
    std::fs::create_dir_all(outside.join("dir")).unwrap();
    std::fs::write(outside.join("precious.txt"), "precious").unwrap();
    let ex = CodeExecutor::builder()
        .workspace(&ws)
        .without_spare_kernel()
        .notebook("notebooks")
        .sandbox(ipybox::sandbox::SandboxOptions {
            srt: Some(root().join("target/sandbox-deps/node_modules/.bin/srt")),
            ..Default::default()
        })
        .build();
    ex.start().await.unwrap();
    assert_eq!(run(&ex, "print('first')").await, "first");
    let notebook = ex.notebook().unwrap();
    let path = notebook.path().unwrap();
    assert!(path.starts_with(ws.join("notebooks")));
    // The file is written in the background: wait for it before the kernel looks for it.
    notebook.flush();
    // The kernel tries to swap the file for a link to a file it cannot write.
    let target = outside.join("precious.txt");
    assert_eq!(
        run(
            &ex,
            &format!(
                "import errno, os\nname = os.listdir('notebooks')[0]\ntry:\n    os.remove('notebooks/' + name)\n    os.symlink({:?}, 'notebooks/' + name)\n    print('planted')\nexcept OSError as e:\n    print(errno.errorcode[e.errno])",
                target.display().to_string()
            ),
        )
        .await,
        "EROFS"
    );
    notebook.flush();
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "precious");
    let meta = std::fs::symlink_metadata(&path).unwrap();
    assert!(meta.is_file(), "the notebook is a file");
    assert_eq!(code_cells(&read_json(&path)).len(), 2);
    // The kernel tries to swap the directory for a link.
    let dir = outside.join("dir");
    assert_eq!(
        run(
            &ex,
            &format!(
                "import errno, os\ntry:\n    os.rename('notebooks', 'moved')\n    os.symlink({:?}, 'notebooks')\n    print('planted')\nexcept OSError as e:\n    print(errno.errorcode[e.errno])",
                dir.display().to_string()
            ),
        )
        .await,
        "EBUSY"
    );
    assert_eq!(run(&ex, "print('third')").await, "third");
    notebook.flush();
    assert_eq!(
        std::fs::read_dir(&dir).unwrap().count(),
        0,
        "nothing was written through a link"
    );
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "precious");
    assert_eq!(
        code_cells(&read_json(&path)).len(),
        4,
        "the file holds every cell"
    );
    ex.stop().await;
    let _ = std::fs::remove_dir_all(&outside);
}
