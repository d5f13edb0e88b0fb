//! Notebooks hold no secret (issue 38, docs/notebook.md "Secrets"): a `.env` value that a
//! registered server gets through `${VAR}`, printed by cells — whole, split across two flushed
//! chunks, as `display_data`, as an `execute_result` and in an error's traceback — reaches the
//! caller as it is (the seed returns output unredacted: the attack happens), and is
//! `[redacted: NAME]` in the notebook file, the `ipybox://notebook/<tag>` resource and the log
//! lines (`--log-content` with `IPYBOX_LOG=ipybox=debug,rmcp=trace`: the results' JSON is logged). The workspace's
//! notebook directory gets a `.gitignore`; with `--no-notebook-gitignore` it does not (control).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use ipybox::tools::tool_output;
use rmcp::model::{ClientConfig, ReadResourceRequestParams, ResourceContents};
use serde_json::json;

use crate::mcp_eras::{Era, serve_in};
use crate::seed_outputs::exact;
use crate::support::{BIN, call, fixture_script, kernel_python, python};

const SECRET: &str = "sk-fixture-0123456789abcdef";
const REDACTED: &str = "[redacted: FIXTURE_SECRET]";

fn notebooks_in(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    files.retain(|p| p.extension().is_some_and(|e| e == "ipynb"));
    files
}

/// Waits (at most 30 s) until the one notebook in `dir` holds `marker`, and returns its text.
async fn notebook_holding(dir: &Path, marker: &str) -> String {
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        if let [file] = notebooks_in(dir).as_slice()
            && let Ok(text) = std::fs::read_to_string(file)
            && text.contains(marker)
        {
            return text;
        }
        assert!(
            Instant::now() < until,
            "no notebook in {dir:?} holds {marker:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_printed_secret_is_redacted_in_the_notebook_resource_and_logs() {
    let ws = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    std::fs::write(ws.path().join(".env"), format!("FIXTURE_SECRET={SECRET}\n")).unwrap();
    let log_path = home.path().join("stderr.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let mut child = tokio::process::Command::new(BIN)
        .arg("--workspace")
        .arg(ws.path())
        .args(["--log-content"])
        .env("IPYBOX_LOG", "ipybox=debug,rmcp=trace")
        .env("IPYBOX_HOME", home.path())
        .env("IPYBOX_PYTHON", kernel_python())
        .env_remove("FIXTURE_SECRET")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(log))
        .kill_on_drop(true)
        .spawn()
        .expect("ipybox starts");
    let transport = (child.stdout.take().unwrap(), child.stdin.take().unwrap());
    let era = Era::Handshake;
    let c = serve_in(
        era,
        ClientConfig::default().with_protocol_version(era.version()),
        transport,
    )
    .await
    .expect("ipybox MCP server starts");
    let client = SessionClient(&c);

    let params = json!({
        "command": python(),
        "args": [fixture_script(), "stdio"],
        "env": {"FIXTURE_SECRET": "${FIXTURE_SECRET}"},
    });
    let r = tool_output(
        &call(
            &client,
            "register_mcp_server",
            json!({"server_name": "fx", "server_params": params}),
        )
        .await,
    );
    assert!(!r.is_error, "{}", r.text);

    let cells = [
        "from mcptools.fx import get_env\ns = get_env.run(get_env.Params(name='FIXTURE_SECRET'))\nprint(s)",
        "import sys\nprint(s[:10], end='')\nsys.stdout.flush()\nprint(s[10:])",
        "from IPython.display import display\ndisplay(s)",
        "s",
    ];
    for code in cells {
        let out = tool_output(&call(&client, "execute_ipython_cell", json!({"code": code})).await);
        assert!(!out.is_error, "{code}: {}", out.text);
        // The caller gets the output as it is (the attack happens).
        assert!(out.text.contains(SECRET), "{code}: {}", out.text);
    }
    let out = tool_output(
        &call(
            &client,
            "execute_ipython_cell",
            json!({"code": "raise ValueError('the key is ' + s)"}),
        )
        .await,
    );
    assert!(out.is_error && out.text.contains(SECRET), "{}", out.text);

    // The file: every one of the five outputs redacted, the secret nowhere.
    let file = notebook_holding(&ws.path().join("notebooks"), "raise ValueError").await;
    assert!(
        !file.contains(SECRET),
        "the notebook holds the secret:\n{file}"
    );
    assert!(
        !file.contains(&SECRET[10..]),
        "the notebook holds half the secret"
    );
    let nb: serde_json::Value = serde_json::from_str(&file).unwrap();
    let outputs: Vec<String> = nb["cells"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["cell_type"] == "code")
        .map(|c| c["outputs"].to_string())
        .collect();
    assert_eq!(outputs.len(), 5, "{file}");
    for (i, o) in outputs.iter().enumerate() {
        assert!(o.contains(REDACTED), "cell {i}'s outputs: {o}");
    }

    // The resource.
    let listed = c.peer().list_all_resources().await.unwrap();
    let uri = listed
        .iter()
        .find(|r| r.uri.starts_with("ipybox://notebook/"))
        .map(|r| r.uri.clone())
        .expect("the notebook resource is listed");
    let read = c
        .peer()
        .read_resource(ReadResourceRequestParams::new(uri))
        .await
        .unwrap();
    let ResourceContents::TextResourceContents { text, .. } = &read.contents[0] else {
        panic!("{read:?}")
    };
    assert!(text.contains(REDACTED) && !text.contains(SECRET));

    // The logs: the results' JSON was logged (redacted), never the secret.
    let _ = c.cancel().await;
    let _ = tokio::time::timeout(Duration::from_secs(10), child.wait()).await;
    let logged = std::fs::read_to_string(&log_path).unwrap();
    assert!(logged.contains(REDACTED), "no result logged:\n{logged}");
    assert!(!logged.contains(SECRET), "the log holds the secret");

    // The workspace's notebook directory keeps notebooks out of git.
    assert_eq!(
        std::fs::read(ws.path().join("notebooks/.gitignore")).unwrap(),
        ipybox::notebook::GITIGNORE
    );
    assert!(
        String::from_utf8_lossy(ipybox::notebook::GITIGNORE)
            .lines()
            .any(|l| l == "*")
    );

    // Control: with --no-notebook-gitignore the directory gets none.
    let ws2 = tempfile::tempdir().unwrap();
    let s = exact(ws2.path(), home.path(), &["--no-notebook-gitignore"], era).await;
    let out = tool_output(&call(&s, "execute_ipython_cell", json!({"code": "print(1)"})).await);
    assert_eq!(out.text, "1");
    notebook_holding(&ws2.path().join("notebooks"), "print(1)").await;
    assert!(!ws2.path().join("notebooks/.gitignore").exists());
}

/// A running client service as [`crate::mcp_eras::CallTool`].
struct SessionClient<'a>(&'a rmcp::service::RunningService<rmcp::RoleClient, ClientConfig>);

impl crate::mcp_eras::CallTool for SessionClient<'_> {
    async fn call_tool_json(
        &self,
        tool: &str,
        arguments: serde_json::Map<String, serde_json::Value>,
    ) -> Result<rmcp::model::CallToolResult, String> {
        let params =
            rmcp::model::CallToolRequestParams::new(tool.to_string()).with_arguments(arguments);
        self.0.call_tool(params).await.map_err(|e| e.to_string())
    }
}
