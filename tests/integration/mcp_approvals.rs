//! `ipybox --approve ask` (and `--approve-shell`) driven by a real rmcp client that declares the
//! elicitation capability and answers from a script, one that does not declare it, and progress
//! notifications for a request that carries a progress token.

use std::path::Path;
use std::time::Duration;

use crate::mcp_eras::{Answer, Connected, Era, ScriptedClient, both_eras, start_with};
use crate::support::*;
use rmcp::model::{CallToolRequestParams, CallToolResult};
use serde_json::json;

/// A client whose user answers from a script, connected to an ipybox it started.
pub(crate) type Client = Connected<ScriptedClient>;

pub(crate) async fn start(ws: &Path, client: &ScriptedClient, flags: &[&str]) -> Client {
    start_with(ws, &[], flags, client.clone(), client.era()).await
}

pub(crate) async fn cell(c: &Client, code: &str) -> (bool, String) {
    let params = CallToolRequestParams::new("execute_ipython_cell")
        .with_arguments(args(json!({"code": code, "timeout": 60})));
    let result = c
        .service
        .call_tool(params)
        .await
        .expect("tools/call answers");
    (result.is_error == Some(true), text(&result))
}

pub(crate) fn text(result: &CallToolResult) -> String {
    ipybox::tools::tool_output(result).text
}

pub(crate) async fn register_fixture(c: &Client) {
    let params = CallToolRequestParams::new("register_mcp_server").with_arguments(args(
        json!({"server_name": "fx", "server_params": fixture_stdio_params("stdio")}),
    ));
    let result = c.service.call_tool(params).await.unwrap();
    assert_ne!(result.is_error, Some(true), "{}", text(&result));
}

/// The question about `fx.add(a=1, b=2)`: the tool, the server, the registered server's command
/// line (the fixture), the arguments.
pub(crate) fn ask_add() -> String {
    ask_fx("add", "a=1, b=2")
}

fn ask_fx(tool: &str, arguments: &str) -> String {
    format!(
        "ipybox: Allow executed code to call the tool `{tool}` of the MCP server `fx`?\n\nServer: {} {} stdio\nArguments: {arguments}",
        python(),
        fixture_script()
    )
}

pub(crate) const CALL_ADD: &str =
    "from mcptools.fx import add\nprint(add.run(add.Params(a=1, b=2)).sum)";
const CALL_GREET: &str =
    "from mcptools.fx import greet\nprint(greet.run(greet.Params(name='x' * 500)))";

async fn ask_accept_once_for_session_decline_and_cancel(era: Era) {
    require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    let user = ScriptedClient::new(
        era,
        true,
        &[
            Answer::Accept,
            Answer::Decline,
            Answer::Cancel,
            Answer::AcceptForSession,
            Answer::Decline,
        ],
    );
    let c = start(ws.path(), &user, &["--approve", "ask"]).await;
    register_fixture(&c).await;
    // Accept once: the call runs; the question names server, tool and arguments.
    assert_eq!(cell(&c, CALL_ADD).await, (false, "3".into()));
    assert_eq!(user.questions(), [ask_add()]);
    let schema = user.seen.lock().unwrap().questions[0].1.clone();
    assert_eq!(schema["type"], "object");
    assert_eq!(schema["properties"]["remember"]["type"], "boolean");
    assert_eq!(schema["properties"]["remember"]["default"], false);
    // A short title (clients cut it to one line); what it applies to is in the description.
    assert_eq!(
        schema["properties"]["remember"]["title"],
        "Allow for the rest of this session"
    );
    assert_eq!(
        schema["properties"]["remember"]["description"],
        "Ticked: later calls of fx.add run without asking until this session ends. Accept runs this one either way."
    );
    // Decline and cancel: typed rejection in the kernel, the cell's output says so.
    let (failed, out) = cell(&c, CALL_ADD).await;
    assert!(failed, "{out}");
    assert!(
        out.contains("ApprovalRejectedError: Approval request for fx.add rejected: tool call fx.add was rejected: declined by the user"),
        "{out}"
    );
    let (failed, out) = cell(
        &c,
        &format!(
            "try:\n    {}\nexcept Exception as e:\n    print(type(e).__name__, e)",
            CALL_ADD.replace('\n', "\n    ")
        ),
    )
    .await;
    assert!(!failed, "{out}");
    assert_eq!(
        out,
        "ApprovalRejectedError Approval request for fx.add rejected: tool call fx.add was rejected: cancelled by the user"
    );
    // Accept for the session: asked once, then never again for this tool, but still for others.
    for _ in 0..3 {
        assert_eq!(cell(&c, CALL_ADD).await, (false, "3".into()));
    }
    assert_eq!(user.questions().len(), 4);
    let (failed, out) = cell(&c, CALL_GREET).await;
    assert!(failed, "{out}");
    let questions = user.questions();
    assert_eq!(questions.len(), 5);
    // Nothing is cut from the question: long values are shown whole.
    let expected = ask_fx("greet", &format!("name=\"{}\"", "x".repeat(500)));
    assert_eq!(questions[4], expected);
    // The allowance outlives a reset (it is the MCP session's).
    let reset = c
        .service
        .call_tool(CallToolRequestParams::new("reset"))
        .await
        .unwrap();
    assert_ne!(reset.is_error, Some(true));
    assert_eq!(cell(&c, CALL_ADD).await, (false, "3".into()));
    assert_eq!(user.questions().len(), 5);
    c.close().await;
}

async fn ask_without_an_answer_times_out_and_the_server_keeps_working(era: Era) {
    require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    // The answer comes after the timeout: handshake era, the executor stopped waiting; 2026,
    // the retry finds the cell ended with the call failed.
    let user = ScriptedClient::new(era, true, &[Answer::Late(2500), Answer::Accept]);
    let c = start(
        ws.path(),
        &user,
        &["--approve", "ask", "--approval-timeout", "1"],
    )
    .await;
    register_fixture(&c).await;
    let started = std::time::Instant::now();
    let (failed, out) = cell(&c, CALL_ADD).await;
    assert!(failed, "{out}");
    assert!(
        out.contains(
            "ApprovalTimeoutError: Approval request for fx.add expired: tool call fx.add was not approved within 1 s, so it was not made"
        ),
        "{out}"
    );
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(cell(&c, CALL_ADD).await, (false, "3".into()));
    c.close().await;
}

async fn ask_with_a_client_without_elicitation_fails_clearly(era: Era) {
    require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    let user = ScriptedClient::new(era, false, &[]);
    let c = start(ws.path(), &user, &["--approve", "ask", "--approve-shell"]).await;
    register_fixture(&c).await;
    let (failed, out) = cell(&c, CALL_ADD).await;
    assert!(failed, "{out}");
    assert!(
        out.contains("ApprovalRejectedError: Approval request for fx.add rejected: tool call fx.add was rejected: nobody could be asked: ipybox runs with --approve ask, but this MCP client did not declare the elicitation capability"),
        "{out}"
    );
    let (failed, out) = cell(&c, "!echo never-runs").await;
    assert!(failed, "{out}");
    assert!(!has_line(&out, "never-runs"), "{out}");
    assert!(
        out.contains(
            "ApprovalRejectedError: Approval request for ipybox.shell rejected: shell command `echo never-runs` was rejected: nobody could be asked"
        ),
        "{out}"
    );
    // Code without tool calls or shell commands runs as usual.
    assert_eq!(cell(&c, "print(6 * 7)").await, (false, "42".into()));
    assert!(user.questions().is_empty());
    c.close().await;
    // The control: without --approve-shell the same command runs, and its line is found (on a
    // pty: `never-runs\r`, the output's first line).
    let c = start(ws.path(), &user, &["--approve", "ask"]).await;
    let (failed, out) = cell(&c, "!echo never-runs").await;
    assert!(!failed && has_line(&out, "never-runs"), "{out:?}");
    c.close().await;
}

/// True when `out` has `line` as one of its lines: a command's output on a pty ends its lines
/// in `\r\n`, and its first line has no `\n` before it.
pub(crate) fn has_line(out: &str, line: &str) -> bool {
    out.split('\n')
        .any(|l| l.trim_end_matches('\r').trim() == line)
}

async fn ask_about_shell_commands_and_magics(era: Era) {
    require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    let user = ScriptedClient::new(
        era,
        true,
        &[
            Answer::Accept,
            Answer::Decline,
            Answer::AcceptForSession,
            Answer::Accept,
        ],
    );
    let flags = [
        "--approve",
        "ask",
        "--approve-shell",
        "--require-shell-escape",
    ];
    let c = start(ws.path(), &user, &flags).await;
    assert_eq!(
        cell(&c, "name = 'world'\n!echo hello {name}").await,
        (false, "hello world".into())
    );
    let (failed, out) = cell(&c, "!touch declined.txt").await;
    assert!(failed, "{out}");
    assert!(
        out.contains("ApprovalRejectedError: Approval request for ipybox.shell rejected: shell command `touch declined.txt` was rejected: declined by the user"),
        "{out}"
    );
    assert!(!ws.path().join("declined.txt").exists());
    // Accepted for the session: this exact command only.
    for _ in 0..2 {
        assert_eq!(cell(&c, "!echo again").await, (false, "again".into()));
    }
    assert_eq!(
        cell(&c, "%%bash\necho from bash $((6 * 7))").await,
        (false, "from bash 42".into())
    );
    let (failed, out) = cell(&c, "import subprocess\nsubprocess.run(['true'])").await;
    assert!(failed, "{out}");
    assert!(
        out.contains("ShellEscapeRequired: Direct subprocess calls are not allowed. Use ! syntax. (direct process creation (subprocess) is blocked"),
        "{out}"
    );
    assert_eq!(
        user.questions(),
        [
            "ipybox: Run this shell command from executed code?\n\necho hello world",
            "ipybox: Run this shell command from executed code?\n\ntouch declined.txt",
            "ipybox: Run this shell command from executed code?\n\necho again",
            "ipybox: Run this %%bash cell from executed code?\n\necho from bash $((6 * 7))",
        ]
    );
    c.close().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn approve_shell_without_ask_is_refused_at_start() {
    let out = std::process::Command::new(BIN)
        .args(["--approve-shell"])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("error: --approve-shell needs someone to ask: with --approve auto every command would be accepted unseen\n  help: add --approve ask"),
        "{stderr}"
    );
}

async fn progress_notifications_carry_the_output_in_order(era: Era) {
    require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    let user = ScriptedClient::new(era, false, &[]);
    let c = start(ws.path(), &user, &[]).await;
    let code = "import time\nfor i in range(6):\n    print(f'line {i}', flush=True)\n    time.sleep(0.2)\nprint('end', end='')";
    // rmcp's client puts a progress token on every request (the Python test covers requests
    // without one).
    let params = CallToolRequestParams::new("execute_ipython_cell")
        .with_arguments(args(json!({"code": code})));
    let result = c.service.call_tool(params).await.unwrap();
    let expected = "line 0\nline 1\nline 2\nline 3\nline 4\nline 5\nend";
    assert_eq!(text(&result), expected, "the result is unchanged");
    // Notifications are handled in order of arrival; give the last one a moment.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let progress = user.seen.lock().unwrap().progress.clone();
    assert!(
        progress.len() >= 2,
        "rate-limited, but more than one: {progress:?}"
    );
    assert!(progress.len() <= 5, "rate-limited: {progress:?}");
    let messages: Vec<String> = progress
        .iter()
        .map(|p| p.message.clone().unwrap())
        .collect();
    // Complete lines, in order, while the cell ran: the output not sent by the end (at least
    // the unfinished `end`) is in the result only.
    let sent = messages.join("\n");
    assert!(
        expected.starts_with(&format!("{sent}\n")),
        "a prefix of the output, in whole lines: {sent:?}"
    );
    for pair in progress.windows(2) {
        assert!(pair[1].progress > pair[0].progress, "{progress:?}");
    }
    // Nothing in the first 250 ms: `line 0` was printed at once, `line 1` at 0.2 s.
    assert!(progress[0].progress >= 0.25, "{progress:?}");
    let token = &progress[0].progress_token;
    assert!(progress.iter().all(|p| &p.progress_token == token));
    // A quick cell sends none.
    let before = progress.len();
    let params = CallToolRequestParams::new("execute_ipython_cell")
        .with_arguments(args(json!({"code": "print('quick')"})));
    assert_eq!(text(&c.service.call_tool(params).await.unwrap()), "quick");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(user.seen.lock().unwrap().progress.len(), before);
    c.close().await;
}

/// `notifications/cancelled` while the user is being asked (an elicitation is outstanding, the
/// approval timeout is far off): the cell is interrupted with its state kept, the pending call
/// is rejected and never made (no fixture server is started for it), and the next cell runs.
#[tokio::test(flavor = "multi_thread")]
async fn cancel_while_the_user_is_asked_interrupts_and_keeps_state() {
    // Handshake era only: a 2026-07-28 client is asked between rounds, with no request open.
    let era = Era::Handshake;
    use rmcp::model::{ClientRequest, Request};
    use rmcp::service::PeerRequestOptions;
    require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    let user = ScriptedClient::new(era, true, &[Answer::Never, Answer::Accept]);
    let c = start(ws.path(), &user, &["--approve", "ask"]).await;
    register_fixture(&c).await;
    assert_eq!(cell(&c, "x = 41").await, (false, String::new()));
    let server = c.pid();
    let fixtures = || -> Vec<u32> {
        crate::proc_tree::descendants(server)
            .into_iter()
            .filter(|pid| {
                std::fs::read(format!("/proc/{pid}/cmdline"))
                    .map(|c| String::from_utf8_lossy(&c).contains("mcp_fixture"))
                    .unwrap_or(false)
            })
            .collect()
    };
    // The server the registration listed tools from closes in the background: wait for it, so
    // a fixture seen below can only be one the cancelled call started.
    let since = std::time::Instant::now();
    while !fixtures().is_empty() && since.elapsed() < Duration::from_secs(15) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        fixtures(),
        Vec::<u32>::new(),
        "the registration's server is still running"
    );
    let code = format!(
        "import pathlib\npathlib.Path('before').touch()\n{CALL_ADD}\npathlib.Path('after').touch()"
    );
    let request = ClientRequest::CallToolRequest(Request::new(
        CallToolRequestParams::new("execute_ipython_cell")
            .with_arguments(args(json!({"code": code, "timeout": 60}))),
    ));
    let handle = c
        .peer()
        .send_cancellable_request(request, PeerRequestOptions::no_options())
        .await
        .unwrap();
    let asked = std::time::Instant::now();
    while user.questions().is_empty() {
        assert!(
            asked.elapsed() < Duration::from_secs(60),
            "the user was never asked"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(ws.path().join("before").exists());
    let cancelled = std::time::Instant::now();
    handle
        .cancel(Some("user pressed Esc".into()))
        .await
        .unwrap();
    assert_eq!(cell(&c, "print(x + 1)").await, (false, "42".into()));
    let waited = cancelled.elapsed();
    assert!(
        waited < Duration::from_secs(5),
        "next cell waited {waited:?}"
    );
    assert!(!ws.path().join("after").exists(), "the cell ran on");
    let fixtures = fixtures();
    assert_eq!(
        fixtures,
        Vec::<u32>::new(),
        "the cancelled call reached a server"
    );
    assert_eq!(user.questions().len(), 1);
    // The next call is asked again (and accepted) and runs.
    assert_eq!(cell(&c, CALL_ADD).await, (false, "3".into()));
    assert_eq!(user.questions().len(), 2);
    c.close().await;
}

/// What the model gets when a call ends a cell: the output before it, the frames of its own
/// code (the cell, a function it defined) and the error with a `help:` line; none of ipybox's
/// runtime or the generated module's plumbing. Declined, unanswered (timed out), a tool's own
/// error, and an awaited call.
async fn rejected_calls_reach_the_model_short(era: Era) {
    require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    let user = ScriptedClient::new(
        era,
        true,
        &[
            Answer::Decline,
            Answer::Late(2500),
            Answer::Decline,
            Answer::Accept,
        ],
    );
    let c = start(
        ws.path(),
        &user,
        &["--approve", "ask", "--approval-timeout", "1"],
    )
    .await;
    register_fixture(&c).await;
    let total = "from mcptools.fx import add\ndef total(a, b):\n    return add.run(add.Params(a=a, b=b)).sum\nprint('before')\ntotal(1, 2)";
    let frames = [
        "Traceback (most recent call last):",
        "  Cell In[N], line 5",
        "    total(1, 2)",
        "  Cell In[N], line 3, in total",
        "    return add.run(add.Params(a=a, b=b)).sum",
    ]
    .join("\n");
    let (failed, out) = cell(&c, total).await;
    assert!(failed);
    assert_eq!(
        cell_numbers_as_n(&out),
        format!(
            "before\n\n{frames}\nApprovalRejectedError: Approval request for fx.add rejected: tool call fx.add was rejected: declined by the user\n  help: {REJECTED_HELP}"
        )
    );
    let (failed, out) = cell(&c, total).await;
    assert!(failed);
    // 2026-07-28: the answer's retry came after the cell ended, and is told so first.
    let out = match era {
        Era::Handshake => out,
        Era::Stateless => {
            let (note, rest) = out.split_once("Its result:]\n\n").expect(&out);
            assert!(
                note.starts_with("[ipybox: this answer came too late. The cell had stopped waiting for it, so the call it asked about was not made: fx.add(a=1, b=2)."),
                "{out}"
            );
            rest.to_string()
        }
    };
    assert_eq!(
        cell_numbers_as_n(&out),
        format!(
            "before\n\n{frames}\nApprovalTimeoutError: Approval request for fx.add expired: tool call fx.add was not approved within 1 s, so it was not made\n  help: {TIMEOUT_HELP}"
        )
    );
    // Awaited (the async runner): the cell's line, then the error.
    let (failed, out) = cell(
        &c,
        "from mcptools.fx import runner\nawait runner.run_async('add', {'a': 1, 'b': 2})",
    )
    .await;
    assert!(failed);
    assert_eq!(
        cell_numbers_as_n(&out),
        format!(
            "Traceback (most recent call last):\n  Cell In[N], line 2\n    await runner.run_async('add', {{'a': 1, 'b': 2}})\nApprovalRejectedError: Approval request for fx.add rejected: tool call fx.add was rejected: declined by the user\n  help: {REJECTED_HELP}"
        )
    );
    // The tool's own error (the call accepted).
    let (failed, out) = cell(
        &c,
        "from mcptools.fx import fail\nfail.run(fail.Params(message='no such thing'))",
    )
    .await;
    assert!(failed);
    assert!(
        cell_numbers_as_n(&out).starts_with("Traceback (most recent call last):\n  Cell In[N], line 2\n    fail.run(fail.Params(message='no such thing'))\nToolError: "),
        "{out}"
    );
    assert!(!out.contains("help:"), "{out}");
    assert!(!out.contains("ipybox_runtime"), "{out}");
    c.close().await;
}

both_eras!(ask_accept_once_for_session_decline_and_cancel);
both_eras!(rejected_calls_reach_the_model_short);
both_eras!(ask_without_an_answer_times_out_and_the_server_keeps_working);
both_eras!(ask_with_a_client_without_elicitation_fails_clearly);
both_eras!(ask_about_shell_commands_and_magics);
both_eras!(progress_notifications_carry_the_output_in_order);

/// Issue 18: the question shows every name quoted and escaped and every value whole, so kernel
/// code can neither hide what is sent nor print a fake question; what cannot be shown whole is
/// refused before the user is asked.
async fn the_question_shows_exactly_what_runs(era: Era) {
    require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    let user = ScriptedClient::new(era, true, &[Answer::Decline, Answer::Accept]);
    let c = start(ws.path(), &user, &["--approve", "ask"]).await;
    register_fixture(&c).await;
    // An argument name of 1 500 zero-width characters would push the real `a` out of view.
    let (failed, out) = cell(
        &c,
        "from mcptools.fx import runner\nrunner.run('add', {'\\u200b' * 1500 + 'a': 1000000, 'b': 2})",
    )
    .await;
    assert!(failed, "{out}");
    assert!(
        out.contains("ApprovalRejectedError: Approval request for fx.add rejected: tool call fx.add was rejected: not shown to anyone: its argument name is 1501 characters long, over the limit of 128"),
        "{out}"
    );
    assert!(user.questions().is_empty());
    // A server name with ANSI escapes: not a registered server, refused before anyone is
    // asked (the trust rule), named escaped.
    let (failed, out) = cell(
        &c,
        "from ipybox_runtime import ToolRunner\nfrom mcptools.fx import SERVER_PARAMS\nToolRunner('\\x1b[31mfx', SERVER_PARAMS).run('add', {'a': 1, 'b': 2})",
    )
    .await;
    assert!(
        failed && out.contains(r#"ToolError: MCP server `"\u001b[31mfx"` is not registered for any directory this kernel imports from"#),
        "{out}"
    );
    assert!(user.questions().is_empty());
    // A bidi override in the tool name, a newline in an argument name.
    let (failed, out) = cell(
        &c,
        "from mcptools.fx import runner\nrunner.run('a\\u202edd', {'a': 1, 'b=2\\n\\nipybox: Allow': 2})",
    )
    .await;
    assert!(failed && out.contains("declined by the user"), "{out}");
    assert_eq!(
        user.questions(),
        [ask_fx("\"a\\u202edd\"", r#"a=1, "b=2\n\nipybox: Allow"=2"#)
            .replace("`\"a\\u202edd\"`", "\"a\\u202edd\"")]
    );
    // A value too long to show whole: refused, nobody asked.
    let (failed, out) = cell(
        &c,
        "from mcptools.fx import greet\ngreet.run(greet.Params(name='x' * 20000))",
    )
    .await;
    assert!(failed, "{out}");
    assert!(
        out.contains("not shown to anyone: it is 20017 characters long when shown, over the limit of 16384 for an approval prompt"),
        "{out}"
    );
    assert_eq!(user.questions().len(), 1);
    // The server is still usable.
    assert_eq!(cell(&c, CALL_ADD).await, (false, "3".into()));
    assert_eq!(user.questions().len(), 2);
    c.close().await;
}
both_eras!(the_question_shows_exactly_what_runs);

/// "Allow for the session" is keyed by the registered server (its recorded params) and the
/// tool: after `fx` is registered again with other params, its calls are asked about afresh.
async fn remember_is_keyed_by_the_registered_server(era: Era) {
    require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    let user = ScriptedClient::new(era, true, &[Answer::AcceptForSession, Answer::Accept]);
    let c = start(ws.path(), &user, &["--approve", "ask"]).await;
    register_fixture(&c).await;
    for _ in 0..2 {
        assert_eq!(cell(&c, CALL_ADD).await, (false, "3".into()));
    }
    assert_eq!(user.questions(), [ask_add()]);
    let params = CallToolRequestParams::new("register_mcp_server").with_arguments(args(
        json!({"server_name": "fx", "server_params": fixture_params_who()}),
    ));
    let result = c.service.call_tool(params).await.unwrap();
    assert_ne!(result.is_error, Some(true), "{}", text(&result));
    assert_eq!(cell(&c, CALL_ADD).await, (false, "3".into()));
    assert_eq!(
        user.questions().len(),
        2,
        "asked again for the re-registered server"
    );
    c.close().await;
}

both_eras!(remember_is_keyed_by_the_registered_server);
