//! `ipybox --approve ask` (and `--approve-shell`) driven by a real rmcp client that declares the
//! elicitation capability and answers from a script, one that does not declare it, and progress
//! notifications for a request that carries a progress token.

use std::collections::VecDeque;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::*;
use rmcp::model::{
    CallToolRequestParams, CallToolResult, ClientCapabilities, ClientConfig, ElicitRequestParams,
    ElicitResult, ElicitationAction, Implementation, ProgressNotificationParam, ProtocolVersion,
};
use rmcp::service::{
    ClientLifecycleMode, ClientServiceExt, NotificationContext, RequestContext, RunningService,
};
use rmcp::{ClientHandler, ErrorData, RoleClient, ServiceExt};
use serde_json::{Value, json};

/// How the scripted user answers one question.
#[derive(Debug, Clone, Copy)]
enum Answer {
    Accept,
    AcceptForSession,
    Decline,
    Cancel,
    /// Never answers (the approval timeout decides).
    Never,
}

#[derive(Default)]
struct Seen {
    questions: Vec<(String, Value)>,
    progress: Vec<ProgressNotificationParam>,
}

/// Which MCP revision the client speaks: the handshake era (`initialize`, server-to-client
/// `elicitation/create`) or 2026-07-28 (`server/discover`, stateless, `input_required` rounds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Era {
    Handshake,
    Stateless,
}

/// Runs an `async fn NAME(era: Era)` test once per era: `NAME::handshake`, `NAME::stateless`.
macro_rules! both_eras {
    ($name:ident) => {
        mod $name {
            #[tokio::test(flavor = "multi_thread")]
            async fn handshake() {
                super::$name(super::Era::Handshake).await
            }
            #[tokio::test(flavor = "multi_thread")]
            async fn stateless() {
                super::$name(super::Era::Stateless).await
            }
        }
    };
}

#[derive(Clone)]
struct ScriptedClient {
    era: Era,
    elicitation: bool,
    answers: Arc<Mutex<VecDeque<Answer>>>,
    seen: Arc<Mutex<Seen>>,
}

impl ScriptedClient {
    fn new(era: Era, elicitation: bool, answers: &[Answer]) -> Self {
        Self {
            era,
            elicitation,
            answers: Arc::new(Mutex::new(answers.iter().copied().collect())),
            seen: Arc::default(),
        }
    }

    fn questions(&self) -> Vec<String> {
        let seen = self.seen.lock().unwrap();
        seen.questions.iter().map(|(m, _)| m.clone()).collect()
    }
}

impl ClientHandler for ScriptedClient {
    fn get_info(&self) -> ClientConfig {
        let capabilities = if self.elicitation {
            ClientCapabilities::builder().enable_elicitation().build()
        } else {
            ClientCapabilities::default()
        };
        let version = match self.era {
            Era::Handshake => ProtocolVersion::LATEST_WITH_INITIALIZE,
            Era::Stateless => ProtocolVersion::V_2026_07_28,
        };
        ClientConfig::new(capabilities, Implementation::new("scripted-client", "1.0"))
            .with_protocol_version(version)
    }

    async fn create_elicitation(
        &self,
        request: ElicitRequestParams,
        _context: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, ErrorData> {
        let ElicitRequestParams::FormElicitationParams {
            message,
            requested_schema,
            ..
        } = request
        else {
            panic!("ipybox asks in form mode");
        };
        let schema = serde_json::to_value(&requested_schema).unwrap();
        self.seen.lock().unwrap().questions.push((message, schema));
        let answer = self
            .answers
            .lock()
            .unwrap()
            .pop_front()
            .unwrap_or(Answer::Decline);
        let result = |action, content: Option<Value>| match content {
            Some(c) => ElicitResult::new(action).with_content(c),
            None => ElicitResult::new(action),
        };
        Ok(match answer {
            Answer::Accept => result(ElicitationAction::Accept, Some(json!({}))),
            Answer::AcceptForSession => {
                result(ElicitationAction::Accept, Some(json!({"remember": true})))
            }
            Answer::Decline => result(ElicitationAction::Decline, None),
            Answer::Cancel => result(ElicitationAction::Cancel, None),
            Answer::Never => {
                tokio::time::sleep(Duration::from_secs(3600)).await;
                result(ElicitationAction::Decline, None)
            }
        })
    }

    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.seen.lock().unwrap().progress.push(params);
    }
}

/// A connected client; the server exits when its stdin closes (dropping this).
struct Client {
    service: RunningService<RoleClient, ScriptedClient>,
    _child: tokio::process::Child,
}

impl Client {
    fn peer(&self) -> &rmcp::Peer<RoleClient> {
        self.service.peer()
    }

    async fn cancel(self) {
        let _ = self.service.cancel().await;
    }
}

async fn start(ws: &Path, client: &ScriptedClient, flags: &[&str]) -> Client {
    use std::process::Stdio;
    let mut child = tokio::process::Command::new(BIN)
        .arg("--workspace")
        .arg(ws)
        .args(["--log-level", "warn"])
        .args(flags)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let transport = (child.stdout.take().unwrap(), child.stdin.take().unwrap());
    let service = match client.era {
        Era::Handshake => client.clone().serve(transport).await,
        Era::Stateless => {
            let lifecycle = ClientLifecycleMode::Discover {
                preferred_versions: vec![ProtocolVersion::V_2026_07_28],
            };
            client
                .clone()
                .serve_with_lifecycle(transport, lifecycle)
                .await
        }
    }
    .expect("ipybox MCP server starts");
    let negotiated = service
        .peer()
        .peer_info()
        .map(|info| info.protocol_version.clone());
    let expected = match client.era {
        Era::Handshake => ProtocolVersion::LATEST_WITH_INITIALIZE,
        Era::Stateless => ProtocolVersion::V_2026_07_28,
    };
    assert_eq!(negotiated, Some(expected), "negotiated revision");
    Client {
        service,
        _child: child,
    }
}

async fn cell(c: &Client, code: &str) -> (bool, String) {
    let params = CallToolRequestParams::new("execute_ipython_cell")
        .with_arguments(args(json!({"code": code, "timeout": 60})));
    let result = c
        .service
        .call_tool(params)
        .await
        .expect("tools/call answers");
    (result.is_error == Some(true), text(&result))
}

fn text(result: &CallToolResult) -> String {
    ipybox::tools::tool_output(result).text
}

async fn register_fixture(c: &Client) {
    let params = CallToolRequestParams::new("register_mcp_server").with_arguments(args(
        json!({"server_name": "fx", "server_params": fixture_stdio_params("stdio")}),
    ));
    let result = c.service.call_tool(params).await.unwrap();
    assert_ne!(result.is_error, Some(true), "{}", text(&result));
}

const CALL_ADD: &str = "from mcptools.fx import add\nprint(add.run(add.Params(a=1, b=2)).sum)";
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
    assert_eq!(
        user.questions(),
        [
            "ipybox: Allow executed code to call the tool `add` of the MCP server `fx`?\n\nArguments: a=1, b=2"
        ]
    );
    let schema = user.seen.lock().unwrap().questions[0].1.clone();
    assert_eq!(schema["type"], "object");
    assert_eq!(schema["properties"]["remember"]["type"], "boolean");
    assert_eq!(schema["properties"]["remember"]["default"], false);
    assert_eq!(
        schema["properties"]["remember"]["title"],
        "Allow fx.add for the rest of this session"
    );
    // Decline and cancel: typed rejection in the kernel, the cell's output says so.
    let (failed, out) = cell(&c, CALL_ADD).await;
    assert!(failed, "{out}");
    assert!(
        out.contains("ApprovalRejected: Approval request for fx.add rejected: tool call fx.add was rejected: declined by the user"),
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
        "ApprovalRejected Approval request for fx.add rejected: tool call fx.add was rejected: cancelled by the user"
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
    // Long values are shortened in the question.
    let expected = format!(
        "ipybox: Allow executed code to call the tool `greet` of the MCP server `fx`?\n\nArguments: name=\"{}…\"",
        "x".repeat(200)
    );
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
    c.cancel().await;
}

async fn ask_without_an_answer_times_out_and_the_server_keeps_working(era: Era) {
    require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    let user = ScriptedClient::new(era, true, &[Answer::Never, Answer::Accept]);
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
            "ApprovalTimeout: Approval request for fx.add expired: tool call fx.add was not approved within 1 s, so it was not made"
        ),
        "{out}"
    );
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(cell(&c, CALL_ADD).await, (false, "3".into()));
    c.cancel().await;
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
        out.contains("ApprovalRejected: Approval request for fx.add rejected: tool call fx.add was rejected: nobody could be asked: ipybox runs with --approve ask, but this MCP client did not declare the elicitation capability"),
        "{out}"
    );
    let (failed, out) = cell(&c, "!echo never-runs").await;
    assert!(failed, "{out}");
    assert!(!out.contains("\nnever-runs"), "{out}");
    assert!(
        out.contains(
            "ApprovalRejected: Approval request for ipybox.shell rejected: shell command `echo never-runs` was rejected: nobody could be asked"
        ),
        "{out}"
    );
    // Code without tool calls or shell commands runs as usual.
    assert_eq!(cell(&c, "print(6 * 7)").await, (false, "42".into()));
    assert!(user.questions().is_empty());
    c.cancel().await;
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
        out.contains("ApprovalRejected: Approval request for ipybox.shell rejected: shell command `touch declined.txt` was rejected: declined by the user"),
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
            "ipybox: Run this %%bash cell from executed code?\n\necho from bash $((6 * 7))\n",
        ]
    );
    c.cancel().await;
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
    assert!(progress.len() <= 7, "rate-limited: {progress:?}");
    let messages: Vec<String> = progress
        .iter()
        .map(|p| p.message.clone().unwrap())
        .collect();
    assert_eq!(messages.join("\n"), expected, "all output, in order");
    for pair in progress.windows(2) {
        assert!(pair[1].progress > pair[0].progress, "{progress:?}");
    }
    let token = &progress[0].progress_token;
    assert!(progress.iter().all(|p| &p.progress_token == token));
    c.cancel().await;
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
    let server = c._child.id().expect("ipybox runs");
    let fixtures: Vec<u32> = crate::proc_tree::descendants(server)
        .into_iter()
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| String::from_utf8_lossy(&c).contains("mcp_fixture"))
                .unwrap_or(false)
        })
        .collect();
    assert_eq!(
        fixtures,
        Vec::<u32>::new(),
        "the cancelled call reached a server"
    );
    assert_eq!(user.questions().len(), 1);
    // The next call is asked again (and accepted) and runs.
    assert_eq!(cell(&c, CALL_ADD).await, (false, "3".into()));
    assert_eq!(user.questions().len(), 2);
    c.cancel().await;
}

both_eras!(ask_accept_once_for_session_decline_and_cancel);
both_eras!(ask_without_an_answer_times_out_and_the_server_keeps_working);
both_eras!(ask_with_a_client_without_elicitation_fails_clearly);
both_eras!(ask_about_shell_commands_and_magics);
both_eras!(progress_notifications_carry_the_output_in_order);
