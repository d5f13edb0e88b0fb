//! Driving the ipybox MCP server in either MCP era with rmcp's client: the handshake era
//! (`initialize`, sessions, server-to-client `elicitation/create`) and 2026-07-28
//! (`server/discover`, stateless requests with capabilities in `_meta`, `input_required`
//! rounds that rmcp's `call_tool` drives through the client handler). Every MCP-server test runs
//! once per era ([`both_eras!`]).

use std::collections::VecDeque;
use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResult, ClientCapabilities, ClientConfig, ElicitRequestParams,
    ElicitResult, ElicitationAction, Implementation, ProgressNotificationParam, ProtocolVersion,
};
use rmcp::service::{
    ClientLifecycleMode, ClientServiceExt, NotificationContext, RequestContext, RunningService,
};
use rmcp::{ClientHandler, ErrorData, RoleClient, ServiceExt};
use serde_json::{Map, Value, json};

use crate::support::BIN;

/// Which MCP revision a client speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Era {
    /// 2025-11-25 and before: `initialize`, a session, server-to-client requests.
    Handshake,
    /// 2026-07-28: `server/discover`, stateless requests, `input_required` results.
    Stateless,
}

impl Era {
    /// The revision a client of this era negotiates with ipybox.
    pub(crate) fn version(self) -> ProtocolVersion {
        match self {
            Era::Handshake => ProtocolVersion::LATEST_WITH_INITIALIZE,
            Era::Stateless => ProtocolVersion::V_2026_07_28,
        }
    }
}

/// Runs an `async fn NAME(era: Era)` test once per era: `NAME::handshake`, `NAME::stateless`.
macro_rules! both_eras {
    ($name:ident) => {
        mod $name {
            #[tokio::test(flavor = "multi_thread")]
            async fn handshake() {
                super::$name($crate::mcp_eras::Era::Handshake).await
            }
            #[tokio::test(flavor = "multi_thread")]
            async fn stateless() {
                super::$name($crate::mcp_eras::Era::Stateless).await
            }
        }
    };
}
pub(crate) use both_eras;

/// [`both_eras!`] for a blocking `fn NAME(era: Era)`.
macro_rules! both_eras_blocking {
    ($name:ident) => {
        mod $name {
            #[test]
            fn handshake() {
                super::$name($crate::mcp_eras::Era::Handshake)
            }
            #[test]
            fn stateless() {
                super::$name($crate::mcp_eras::Era::Stateless)
            }
        }
    };
}
pub(crate) use both_eras_blocking;

/// A client connected to an ipybox MCP server it started; the server exits when the client is
/// dropped (its stdin closes).
pub(crate) struct Connected<H: ClientHandler> {
    pub(crate) service: RunningService<RoleClient, H>,
    /// The server process (killed when dropped).
    _child: tokio::process::Child,
}

impl<H: ClientHandler> Connected<H> {
    pub(crate) fn peer(&self) -> &rmcp::Peer<RoleClient> {
        self.service.peer()
    }

    /// Closes the connection (the server sees EOF) and waits up to 5 s for the server to shut
    /// down by itself (it deletes remote kernels, stops MCP servers); kills it after that.
    pub(crate) async fn close(mut self) {
        let _ = self.service.cancel().await;
        let _ = tokio::time::timeout(Duration::from_secs(5), self._child.wait()).await;
    }

    /// The ipybox server's process id.
    pub(crate) fn pid(&self) -> u32 {
        self._child.id().expect("ipybox runs")
    }
}

/// A client without handlers of its own (no elicitation, no tasks).
pub(crate) type Plain = Connected<ClientConfig>;

/// Connects `handler` over `transport` in `era` (2026-07-28: `server/discover`; handshake:
/// `initialize`) and asserts the negotiated revision.
pub(crate) async fn serve_in<H, T, E, A>(
    era: Era,
    handler: H,
    transport: T,
) -> Result<RunningService<RoleClient, H>, rmcp::service::ClientInitializeError>
where
    H: ClientHandler,
    T: rmcp::transport::IntoTransport<RoleClient, E, A>,
    E: std::error::Error + Send + Sync + 'static,
{
    let service = match era {
        Era::Handshake => handler.serve(transport).await,
        Era::Stateless => {
            let lifecycle = ClientLifecycleMode::Discover {
                preferred_versions: vec![ProtocolVersion::V_2026_07_28],
            };
            handler.serve_with_lifecycle(transport, lifecycle).await
        }
    }?;
    let negotiated = service
        .peer()
        .peer_info()
        .map(|info| info.protocol_version.clone());
    assert_eq!(negotiated, Some(era.version()), "negotiated revision");
    Ok(service)
}

/// Starts `ipybox --workspace WS FLAGS...` (with `env` added to its environment) and connects
/// `handler` to it in `era`; asserts the negotiated revision. Unless `flags` name
/// `--checkpoint-after`, it is `off`: no session handle in results (their exact text is what
/// the tests compare) and nothing saved into the data directory; `stdio_resume` tests resuming.
pub(crate) async fn start_with<H: ClientHandler>(
    ws: &Path,
    env: &[(&str, &str)],
    flags: &[&str],
    handler: H,
    era: Era,
) -> Connected<H> {
    let mut child = tokio::process::Command::new(BIN)
        .arg("--workspace")
        .arg(ws)
        .args(["--log-level", "warn"])
        .args(flags)
        .args(checkpoints_off(flags))
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("ipybox starts");
    let transport = (child.stdout.take().unwrap(), child.stdin.take().unwrap());
    let service = serve_in(era, handler, transport)
        .await
        .expect("ipybox MCP server starts");
    Connected {
        service,
        _child: child,
    }
}

/// `--checkpoint-after off` unless `flags` set it (see [`start_with`]).
pub(crate) fn checkpoints_off(flags: &[&str]) -> &'static [&'static str] {
    if flags.contains(&"--checkpoint-after") {
        &[]
    } else {
        &["--checkpoint-after", "off"]
    }
}

/// [`start_with`] for a client that declares nothing (the handshake era pins the newest
/// handshake revision).
pub(crate) async fn start(ws: &Path, env: &[(&str, &str)], flags: &[&str], era: Era) -> Plain {
    let config = ClientConfig::default().with_protocol_version(era.version());
    start_with(ws, env, flags, config, era).await
}

/// What can make `tools/call` requests: ipybox's own MCP client session, or an rmcp client of
/// either era connected to an ipybox MCP server.
pub(crate) trait CallTool {
    async fn call_tool_json(
        &self,
        tool: &str,
        arguments: Map<String, Value>,
    ) -> Result<CallToolResult, String>;
}

impl CallTool for ipybox::tools::McpSession {
    async fn call_tool_json(
        &self,
        tool: &str,
        arguments: Map<String, Value>,
    ) -> Result<CallToolResult, String> {
        self.call_tool(tool, arguments)
            .await
            .map_err(|e| e.to_string())
    }
}

impl<H: ClientHandler> CallTool for Connected<H> {
    async fn call_tool_json(
        &self,
        tool: &str,
        arguments: Map<String, Value>,
    ) -> Result<CallToolResult, String> {
        let params = CallToolRequestParams::new(tool.to_string()).with_arguments(arguments);
        self.service
            .call_tool(params)
            .await
            .map_err(|e| e.to_string())
    }
}

impl<T: CallTool> CallTool for std::sync::Arc<T> {
    async fn call_tool_json(
        &self,
        tool: &str,
        arguments: Map<String, Value>,
    ) -> Result<CallToolResult, String> {
        (**self).call_tool_json(tool, arguments).await
    }
}

/// How the scripted user answers one question.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Answer {
    Accept,
    AcceptForSession,
    Decline,
    Cancel,
    /// Never answers (the approval timeout decides).
    Never,
    /// Accepts after this many milliseconds.
    Late(u64),
}

/// What the scripted client saw: each question (message, requested schema) and each progress
/// notification.
#[derive(Default)]
pub(crate) struct Seen {
    pub(crate) questions: Vec<(String, Value)>,
    pub(crate) progress: Vec<ProgressNotificationParam>,
}

/// An MCP client whose user answers elicitations from a script (in either era: rmcp routes a
/// 2026-07-28 `input_required` round's elicitations to the same handler), optionally declaring
/// the tasks extension.
#[derive(Clone)]
pub(crate) struct ScriptedClient {
    era: Era,
    elicitation: bool,
    tasks: bool,
    answers: Arc<Mutex<VecDeque<Answer>>>,
    pub(crate) seen: Arc<Mutex<Seen>>,
}

impl ScriptedClient {
    pub(crate) fn new(era: Era, elicitation: bool, answers: &[Answer]) -> Self {
        Self {
            era,
            elicitation,
            tasks: false,
            answers: Arc::new(Mutex::new(answers.iter().copied().collect())),
            seen: Arc::default(),
        }
    }

    /// The same client, declaring the tasks extension.
    pub(crate) fn with_tasks(mut self) -> Self {
        self.tasks = true;
        self
    }

    pub(crate) fn era(&self) -> Era {
        self.era
    }

    /// The messages of the questions asked so far.
    pub(crate) fn questions(&self) -> Vec<String> {
        let seen = self.seen.lock().unwrap();
        seen.questions.iter().map(|(m, _)| m.clone()).collect()
    }
}

impl ClientHandler for ScriptedClient {
    fn get_info(&self) -> ClientConfig {
        let mut capabilities = if self.elicitation {
            ClientCapabilities::builder().enable_elicitation().build()
        } else {
            ClientCapabilities::default()
        };
        if self.tasks {
            capabilities
                .extensions
                .get_or_insert_with(Default::default)
                .insert(
                    rmcp::model::TASKS_EXTENSION_ID.to_string(),
                    Default::default(),
                );
        }
        ClientConfig::new(capabilities, Implementation::new("scripted-client", "1.0"))
            .with_protocol_version(self.era.version())
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
            Answer::Late(ms) => {
                tokio::time::sleep(Duration::from_millis(ms)).await;
                result(ElicitationAction::Accept, Some(json!({})))
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
