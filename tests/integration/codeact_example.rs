//! The codeact skill's worked example (docs/codeact.md), run step by step against the real
//! `ipybox` MCP server binary with the real memory and everything MCP servers.
//!
//! The steps come from the page itself: every fenced block after an `<!-- example:KIND ARG -->`
//! comment is a step (`register NAME` server params, `cell` code, `file PATH` written into the
//! workspace as an agent's file tool would, `reset`), an `output` block is the
//! exact text the previous step must return, and a `generated PATH` block is the exact content
//! of a generated file. So the page cannot drift from what ipybox does. After a deliberate
//! change (e.g. to the generated-code templates), `CODEACT_EXAMPLE_BLESS=1 cargo test --test
//! codeact_example` rewrites the output and generated blocks with what ipybox now returns.
//!
//! `npx -y PKG ARGS...` in the page becomes the package's binary from `target/test-env`
//! (`scripts/test-env.sh`): no network at test time.

use std::path::PathBuf;

use crate::support::{self, require, root};
use ipybox::tools::tool_output;
use serde_json::{Value, json};

/// What a step does.
#[derive(Debug, Clone, PartialEq)]
enum Action {
    Register(String),
    Cell,
    File(String),
    Generated(String),
    Reset,
    Output,
}

/// One `<!-- example:... -->` marker and the fenced block after it (if the action has one).
#[derive(Debug)]
struct Step {
    action: Action,
    body: String,
    /// Line range (0-based, exclusive end) of the block's content in the page.
    lines: std::ops::Range<usize>,
}

fn page_path() -> PathBuf {
    root().join("docs/codeact.md")
}

fn parse_page(text: &str) -> Vec<Step> {
    let lines: Vec<&str> = text.lines().collect();
    let mut steps = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i].trim();
        i += 1;
        let Some(marker) = line
            .strip_prefix("<!-- example:")
            .and_then(|s| s.strip_suffix("-->"))
        else {
            continue;
        };
        let mut words = marker.split_whitespace();
        let kind = words.next().unwrap_or_default();
        let arg = words.next().map(str::to_string);
        let action = match (kind, arg) {
            ("register", Some(name)) => Action::Register(name),
            ("cell", None) => Action::Cell,
            ("file", Some(path)) => Action::File(path),
            ("generated", Some(path)) => Action::Generated(path),
            ("reset", None) => Action::Reset,
            ("output", None) => Action::Output,
            other => panic!("docs/codeact.md: unknown example marker {other:?} in `{line}`"),
        };
        if action == Action::Reset {
            steps.push(Step {
                action,
                body: String::new(),
                lines: i..i,
            });
            continue;
        }
        let open = lines[i..]
            .iter()
            .position(|l| l.starts_with("```"))
            .map(|p| p + i)
            .unwrap_or_else(|| panic!("docs/codeact.md: no code block after `{line}`"));
        assert!(
            lines[i..open].iter().all(|l| l.trim().is_empty()),
            "docs/codeact.md: text between `{line}` and its code block"
        );
        let close = lines[open + 1..]
            .iter()
            .position(|l| l.starts_with("```"))
            .map(|p| p + open + 1)
            .expect("unterminated code block in docs/codeact.md");
        let mut body = lines[open + 1..close].join("\n");
        body.push('\n');
        steps.push(Step {
            action,
            body,
            lines: open + 1..close,
        });
        i = close + 1;
    }
    steps
}

/// `npx -y @scope/server-x ARGS` -> `target/test-env/node_modules/.bin/mcp-server-x ARGS`.
fn local_params(params: &Value) -> Value {
    let mut params = params.clone();
    if params["command"] == "npx" {
        let args: Vec<String> = params["args"]
            .as_array()
            .expect("npx params have args")
            .iter()
            .map(|a| a.as_str().unwrap().to_string())
            .collect();
        assert_eq!(args[0], "-y", "npx params start with -y");
        let package = args[1].rsplit('/').next().unwrap();
        let bin = root().join(format!("target/test-env/node_modules/.bin/mcp-{package}"));
        assert!(
            bin.exists(),
            "{} is missing: run `bash scripts/test-env.sh` first",
            bin.display()
        );
        params["command"] = json!(bin);
        params["args"] = json!(args[2..]);
    }
    params
}

async fn call(s: &impl crate::mcp_eras::CallTool, tool: &str, arguments: Value) -> String {
    let out = tool_output(&support::call(s, tool, arguments).await);
    assert!(!out.is_error, "{tool} failed:\n{}", out.text);
    out.text
}

/// A mismatch between the page and what ipybox did.
struct Mismatch {
    lines: std::ops::Range<usize>,
    what: String,
    expected: String,
    actual: String,
}

async fn worked_example_runs_as_documented(era: crate::mcp_eras::Era) {
    require!(TestEnv);
    let page = std::fs::read_to_string(page_path()).expect("docs/codeact.md is readable");
    let steps = parse_page(&page);

    // The page must keep showing every part of the workflow the skill teaches.
    let has = |a: Action| steps.iter().any(|s| s.action == a);
    for action in [
        Action::Register("memory".into()),
        Action::Register("everything".into()),
        Action::Generated("mcptools/everything/get_sum.py".into()),
        Action::File("mcpparse/everything/get_sum.py".into()),
        Action::File("gentools/knowledge/remember/api.py".into()),
        Action::File("gentools/knowledge/remember/impl.py".into()),
        Action::Reset,
    ] {
        assert!(
            has(action.clone()),
            "docs/codeact.md lost its {action:?} step"
        );
    }
    assert!(steps.iter().filter(|s| s.action == Action::Cell).count() >= 5);

    let ws = tempfile::tempdir().unwrap();
    let memory_file = ws.path().join("memory.jsonl");
    std::fs::write(
        ws.path().join(".env"),
        format!("MEMORY_FILE_PATH={}\n", memory_file.display()),
    )
    .unwrap();
    let session = crate::mcp_eras::start(ws.path(), &[], &[], era).await;

    let mut mismatches: Vec<Mismatch> = Vec::new();
    let mut last: Option<(String, String)> = None; // (what, text) of the previous step
    for step in &steps {
        match &step.action {
            Action::Register(name) => {
                let params: Value = serde_json::from_str(&step.body)
                    .unwrap_or_else(|e| panic!("server params of {name} are not JSON: {e}"));
                let text = call(
                    &session,
                    "register_mcp_server",
                    json!({"server_name": name, "server_params": local_params(&params)}),
                )
                .await;
                last = Some((format!("register_mcp_server {name}"), text));
            }
            Action::Cell => {
                let text = call(
                    &session,
                    "execute_ipython_cell",
                    json!({"code": step.body, "timeout": 120}),
                )
                .await;
                last = Some((format!("cell:\n{}", step.body), text));
            }
            Action::Reset => {
                let text = call(&session, "reset", json!({})).await;
                last = Some(("reset".into(), text));
            }
            Action::File(path) => {
                let file = ws.path().join(path);
                std::fs::create_dir_all(file.parent().unwrap()).unwrap();
                std::fs::write(&file, &step.body).unwrap();
                last = None;
            }
            Action::Generated(path) => {
                let actual = std::fs::read_to_string(ws.path().join(path))
                    .unwrap_or_else(|e| panic!("{path} was not generated: {e}"));
                if actual != step.body {
                    mismatches.push(Mismatch {
                        lines: step.lines.clone(),
                        what: format!("generated {path}"),
                        expected: step.body.clone(),
                        actual,
                    });
                }
            }
            Action::Output => {
                let (what, actual) = last
                    .take()
                    .expect("an output block follows a register, cell or reset step");
                let actual = format!("{}\n", actual.trim_end());
                if actual != step.body {
                    mismatches.push(Mismatch {
                        lines: step.lines.clone(),
                        what,
                        expected: step.body.clone(),
                        actual,
                    });
                }
            }
        }
    }
    session.close().await;

    // The files the page shows are the files in the workspace: the agent's as written, the
    // generated ones still exactly as generated (the parser lives in mcpparse/, nothing is
    // appended to a generated module: a sandboxed kernel cannot write mcptools/).
    for step in &steps {
        if let Action::File(path) | Action::Generated(path) = &step.action {
            assert_eq!(
                std::fs::read_to_string(ws.path().join(path)).unwrap(),
                step.body,
                "{path} at the end of the example"
            );
        }
    }
    let module = std::fs::read_to_string(ws.path().join("mcptools/everything/get_sum.py")).unwrap();
    assert!(!module.contains("run_parsed"), "{module}");
    assert!(!module.contains("ParseResult"), "{module}");
    let parser = std::fs::read_to_string(ws.path().join("mcpparse/everything/get_sum.py")).unwrap();
    for def in [
        "class ParseResult(BaseModel):",
        "def parse(text: str) -> ParseResult:",
        "def run_parsed(params: Params) -> ParseResult:",
        "from mcptools.everything.get_sum import Params, run",
    ] {
        assert_eq!(parser.matches(def).count(), 1, "{def} in:\n{parser}");
    }
    let graph = std::fs::read_to_string(&memory_file).expect("the memory server wrote its file");
    assert!(graph.contains("\"fraud-check\""), "graph file: {graph}");
    assert!(graph.contains("p99 latency 120 ms"), "graph file: {graph}");

    if mismatches.is_empty() {
        return;
    }
    if std::env::var_os("CODEACT_EXAMPLE_BLESS").is_some() {
        let mut lines: Vec<String> = page.lines().map(str::to_string).collect();
        for m in mismatches.iter().rev() {
            let new: Vec<String> = m
                .actual
                .trim_end_matches('\n')
                .lines()
                .map(str::to_string)
                .collect();
            lines.splice(m.lines.clone(), new);
        }
        std::fs::write(page_path(), lines.join("\n") + "\n").unwrap();
        panic!(
            "rewrote {} block(s) of docs/codeact.md with what ipybox returned: review the diff and rerun",
            mismatches.len()
        );
    }
    let report: Vec<String> = mismatches
        .iter()
        .map(|m| {
            format!(
                "docs/codeact.md line {}: {}\n--- page\n{}--- ipybox\n{}",
                m.lines.start + 1,
                m.what,
                m.expected,
                m.actual
            )
        })
        .collect();
    panic!(
        "{} block(s) of docs/codeact.md differ from what ipybox returned (CODEACT_EXAMPLE_BLESS=1 rewrites them):\n\n{}",
        mismatches.len(),
        report.join("\n")
    );
}

crate::mcp_eras::both_eras!(worked_example_runs_as_documented);
