//! What the user approves is exactly what runs (issue 18): kernel code that crafts names and
//! arguments cannot hide or fake what an approval request shows. Real kernel, real fixture
//! server, requests as `CodeExecutor::stream()` yields them (the renderer every surface uses);
//! the executor has the text limit the MCP server and `ipybox exec` set for people.

use std::path::Path;

use crate::support::*;
use ipybox::CodeExecutor;
use ipybox::executor::ExecutionEvent;
use ipybox::tools::shown::HUMAN_TEXT_LIMIT;

async fn people_executor(ws: &Path) -> CodeExecutor {
    register(ws, "fx", &fixture_stdio_params("stdio")).await;
    let ex = CodeExecutor::builder()
        .workspace(ws)
        .without_spare_kernel()
        .approval_text_limit(HUMAN_TEXT_LIMIT)
        .build();
    ex.start().await.expect("executor starts");
    ex
}

/// Streams `code`, rejecting every request; returns what was shown and the output or error.
async fn shown(ex: &CodeExecutor, code: &str) -> (Vec<String>, Result<String, String>) {
    let mut execution = ex.stream(code, None);
    let mut asked = Vec::new();
    while let Some(event) = execution.next().await {
        match event {
            ExecutionEvent::Approval(request) => {
                asked.push(request.describe());
                request.reject();
            }
            ExecutionEvent::Result(r) => {
                return (asked, r.map(|o| o.text).map_err(|e| e.to_string()));
            }
            _ => {}
        }
    }
    unreachable!("the stream ends with a result")
}

/// A normal call still asks and runs: the host stays usable.
async fn still_usable(ex: &CodeExecutor) {
    let (asked, out) = stream_with(
        ex,
        "from mcptools.fx import add\nprint(add.run(add.Params(a=1, b=2)).sum)",
        None,
        |_| Some((true, std::time::Duration::ZERO)),
    )
    .await;
    assert_eq!(asked, ["fx.add(a=1, b=2)"]);
    assert_eq!(out.unwrap(), "3");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_zero_width_argument_name_cannot_push_the_real_one_out_of_view() {
    require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    let ex = people_executor(ws.path()).await;
    // 1 500 zero-width characters before `a`: too long a name to show, refused unasked.
    let (asked, out) = shown(
        &ex,
        "from mcptools.fx import runner\nrunner.run('add', {'\\u200b' * 1500 + 'a': 1000000, 'b': 2})",
    )
    .await;
    assert!(asked.is_empty(), "{asked:?}");
    let err = out.unwrap_err();
    assert!(
        err.contains("ApprovalRejectedError: Approval request for fx.add rejected: tool call fx.add was rejected: not shown to anyone: its argument name is 1501 characters long, over the limit of 128 for names in an approval prompt (nothing in an approval prompt is ever cut, so a request that cannot be shown whole is refused before anyone is asked)"),
        "{err}"
    );
    // A few of them: shown, each one visible.
    let (asked, _) = shown(
        &ex,
        "from mcptools.fx import runner\nrunner.run('add', {'\\u200b' * 3 + 'a': 1000000, 'b': 2})",
    )
    .await;
    assert_eq!(asked, [r#"fx.add("\u200b\u200b\u200ba"=1000000, b=2)"#]);
    still_usable(&ex).await;
    ex.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_newline_in_an_argument_name_cannot_print_a_fake_request() {
    require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    let ex = people_executor(ws.path()).await;
    let (asked, out) = shown(
        &ex,
        "from mcptools.fx import runner\nrunner.run('add', {'a': 1000000, 'b=2)\\nipybox: approve tool call fx.add(a': 1})",
    )
    .await;
    assert_eq!(
        asked,
        [r#"fx.add(a=1000000, "b=2)\nipybox: approve tool call fx.add(a"=1)"#]
    );
    assert!(!asked[0].contains('\n'));
    assert!(out.unwrap_err().contains("ApprovalRejected"));
    still_usable(&ex).await;
    ex.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn escapes_and_bidi_controls_in_server_and_tool_names_are_shown_escaped() {
    require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    let ex = people_executor(ws.path()).await;
    // A server name with escapes is not a registered server: refused before anyone is asked
    // (the trust rule), and named escaped in the error.
    let (asked, out) = shown(
        &ex,
        "from ipybox_runtime import ToolRunner\nfrom mcptools.fx import SERVER_PARAMS\nToolRunner('\\x1b[2J\\x1b[Hfx', SERVER_PARAMS).run('add', {'a': 1})",
    )
    .await;
    assert!(asked.is_empty(), "{asked:?}");
    let err = out.unwrap_err();
    assert!(
        err.contains(r#"ToolError: MCP server `"\u001b[2J\u001b[Hfx"` is not registered"#),
        "{err}"
    );
    // The tool name and values come from the kernel: escaped.
    let (asked, out) = shown(
        &ex,
        "from mcptools.fx import runner\nrunner.run('a\\u202edd', {'text': 'gnp.\\u202eexe'})",
    )
    .await;
    assert_eq!(asked, [r#"fx."a\u202edd"(text="gnp.\u202eexe")"#]);
    assert!(!asked[0].chars().any(|c| c.is_control() || c == '\u{202e}'));
    assert!(out.unwrap_err().contains("ApprovalRejected"));
    still_usable(&ex).await;
    ex.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_value_too_long_to_show_is_refused_and_a_long_one_is_shown_whole() {
    require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    let ex = people_executor(ws.path()).await;
    // 10 000 characters: shown whole, nothing cut.
    let (asked, _) = shown(
        &ex,
        "from mcptools.fx import greet\ngreet.run(greet.Params(name='x' * 9999 + 'y'))",
    )
    .await;
    assert_eq!(asked, [format!("fx.greet(name=\"{}y\")", "x".repeat(9999))]);
    // 20 000: over the limit for a person; refused, nobody asked.
    let (asked, out) = shown(
        &ex,
        "from mcptools.fx import greet\ngreet.run(greet.Params(name='x' * 20000))",
    )
    .await;
    assert!(asked.is_empty());
    let err = out.unwrap_err();
    assert!(
        err.contains("ApprovalRejectedError: Approval request for fx.greet rejected: tool call fx.greet was rejected: not shown to anyone: it is 20017 characters long when shown, over the limit of 16384 for an approval prompt"),
        "{err}"
    );
    still_usable(&ex).await;
    ex.stop().await;
}

/// Issue 27, item 10: calls merged into one prompt must be identical as they will be sent.
/// Kernel code fills the eight outstanding prompts, then queues calls that are equal as JSON
/// values but not as sent (`0.0` / `-0.0`, key order) and three that are identical: the user is
/// asked about each different call apart, and once (saying so) about the identical ones.
#[tokio::test(flavor = "multi_thread")]
async fn calls_merged_into_one_prompt_are_identical_as_sent() {
    require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    let ex = people_executor(ws.path()).await;
    let code = r#"
import threading, time
from mcptools.fx import runner
def call(args):
    try:
        runner.run('add', args)
    except Exception:
        pass
threads = []
def start(args):
    t = threading.Thread(target=call, args=(args,))
    t.start()
    threads.append(t)
for i in range(8):
    start({'a': i, 'b': 0})
time.sleep(0.5)
for args in [{'a': 0.0, 'b': 1}, {'a': -0.0, 'b': 1}, {'a': 1, 'b': 2}, {'b': 2, 'a': 1},
             {'a': -0.0, 'b': 5}, {'a': -0.0, 'b': 5}, {'a': -0.0, 'b': 5}]:
    start(args)
    time.sleep(0.1)
for t in threads:
    t.join()
print('done')
"#;
    let mut execution = ex.stream(code, Some(std::time::Duration::from_secs(60)));
    let mut first = Vec::new();
    let mut later = Vec::new();
    let mut output = None;
    while let Some(event) = execution.next().await {
        match event {
            ExecutionEvent::Approval(request) if later.is_empty() && first.len() < 8 => {
                first.push(request);
                if first.len() == 8 {
                    // The others queue behind these eight meanwhile.
                    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
                    first.iter().for_each(|r| assert_eq!(r.calls(), 1));
                    std::mem::take(&mut first)
                        .into_iter()
                        .for_each(|r| r.reject());
                    later.push(("(the first eight)".to_string(), 8));
                }
            }
            ExecutionEvent::Approval(request) => {
                later.push((request.describe(), request.calls()));
                request.reject();
            }
            ExecutionEvent::Result(r) => output = Some(r.map(|o| o.text)),
            _ => {}
        }
    }
    assert_eq!(output.unwrap().unwrap(), "done");
    later.sort();
    assert_eq!(
        later,
        [
            ("(the first eight)".to_string(), 8),
            ("fx.add(a=-0.0, b=1)".to_string(), 1),
            ("fx.add(a=-0.0, b=5) [3 identical calls]".to_string(), 3),
            ("fx.add(a=0.0, b=1)".to_string(), 1),
            ("fx.add(a=1, b=2)".to_string(), 1),
            ("fx.add(b=2, a=1)".to_string(), 1),
        ]
    );
    still_usable(&ex).await;
    ex.stop().await;
}
