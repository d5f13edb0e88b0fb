//! The ipybox MCP server: four tools (`register_mcp_server`, `execute_ipython_cell`,
//! `install_package`, `reset`) on top of [`CodeExecutor`], served with rmcp over stdio (one
//! kernel session) or Streamable HTTP (one kernel session per agent conversation, see
//! `crate::http`).
//!
//! The kernel starts in the background when the stdio server is created, so the `initialize`
//! reply never waits for it; the first execution does. Tool calls made by executed code are
//! accepted automatically (as in Python ipybox), or, with `--approve ask`, asked about through
//! the client ([`elicit`]); a cell whose request carries a progress token reports progress
//! ([`progress`]). Results are text only (plus image content), never `structuredContent`:
//! Claude Code would show the model only that.
//!
//! Over HTTP the tools that need a kernel take a `session` argument (a handle): 2026-07-28
//! clients get a new session's handle in the first result and pass it back; a handshake-era
//! MCP session has its own kernel session unless a handle is passed ([`Scope`]). Over stdio they
//! take one too, so that a resumed conversation gets its kernel state back ([`resume`]).
//!
//! Not here: serving on stdio and shutting down ([`stdio`]), kernel sessions over HTTP
//! (`crate::http::sessions`), the workspace/`.env` handling of the command line (the binary's
//! `dotenv` module builds the executor's environments), and everything the executor does.

pub(crate) mod caller;
mod cell;
mod elicit;
mod mrtr;
pub(crate) mod notebook;
pub(crate) mod notebook_fate;
mod progress;
mod request;
mod results;
mod resume;
pub(crate) mod session;
mod skills;
mod stdio;
mod tasks;

pub(crate) use resume::snapshot_in_flight;
pub(crate) use stdio::{refuse_stdio, serve_stdio};

use std::path::PathBuf;
use std::sync::{Arc, Weak};
use std::time::Duration;

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::tool::{InputResponses as ToolInputResponses, RequestState};
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    CallToolResponse, CallToolResult, CancelTaskParams, ContentBlock, CreateTaskResult,
    GetSkillRequestParams, GetSkillResult, GetTaskParams, GetTaskResult, Implementation,
    ListResourcesResult, ListSkillsResult, PaginatedRequestParams,
    ReadResourceDirectoryRequestParams, ReadResourceDirectoryResult, ReadResourceRequestParams,
    ReadResourceResponse, ServerCapabilities, UpdateTaskParams,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, schemars, tool, tool_handler, tool_router};
use serde::Deserialize;
use serde_json::{Map, Value, json};
use tracing::Instrument;

use ipybox::CodeExecutor;

use caller::Caller;
use cell::CellRun;
use request::Outcome;
use results::{cell_result, kept_bytes, start_failed, text_error};
use session::{KernelSession, SessionSource};

/// What the server is told by its command line.
#[derive(Debug, Clone)]
pub(crate) struct ServerConfig {
    /// Absolute workspace path: the kernel's cwd; `mcptools/` is generated here.
    pub workspace: PathBuf,
    /// Who approves the tool calls and shell commands of executed code.
    pub approve: ApproveMode,
    /// How long a call waits for the user's answer with [`ApproveMode::Ask`].
    pub approval_timeout: Duration,
    /// For clients with the tasks extension: a cell still running after this long becomes a
    /// task (`None`: never).
    pub task_after: Option<Duration>,
    /// A task lives for its cell's timeout plus this long; a finished task's result is kept
    /// this long after its cell ended, and no longer.
    pub task_ttl: Duration,
    /// Images a cell keeps (`--max-images`) and their bytes (`--max-image-bytes`), as the
    /// executors are built with: named in a result that dropped some.
    pub max_images: usize,
    pub max_image_bytes: usize,
    /// stdio: checkpoint the session after it has been idle this long after a change, so a
    /// resumed conversation can get its state back ([`resume`]); `None`: no handle, no
    /// checkpoints.
    pub checkpoint_after: Option<Duration>,
}

/// `--approve`: who approves the tool calls (and approved-category shell commands) of executed
/// code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum ApproveMode {
    /// Accept every call (Python ipybox's behaviour).
    Auto,
    /// Ask the user through the MCP client (elicitation), once per call or for the rest of the
    /// session (docs/approvals.md).
    Ask,
}

const INSTRUCTIONS: &str = "\
ipybox runs Python in a stateful IPython kernel and turns the tools of other MCP servers into a \
typed Python API. Workflow: (1) `register_mcp_server(server_name, server_params)` generates \
`mcptools/<server_name>/<tool>.py` in the workspace, one module per tool, and returns the module \
names; (2) read a module's source to see its `Params` model (and `Result`, if the tool has \
structured output); (3) in `execute_ipython_cell`, `from mcptools.<server_name>.<tool> import \
Params, run` and call `run(Params(...))` — loop over calls, combine tools and print only what \
you need in one cell. Variables persist across cells; `reset` starts a fresh kernel (needed \
after regenerating or editing modules that are already imported). `install_package` adds \
packages to the kernel's environment.";

/// What the instructions add over HTTP.
const SESSION_INSTRUCTIONS: &str = " This server keeps one kernel per session: the first \
`execute_ipython_cell` without `session` starts a new kernel and its result names the session \
handle; pass that handle as `session` in every later call (`execute_ipython_cell`, `reset`) to \
keep your variables.";

/// What the instructions add over stdio when sessions can be resumed.
const RESUME_INSTRUCTIONS: &str = " Results name this kernel's session handle once: pass it as \
`session` in later calls (`execute_ipython_cell`, `reset`); in a resumed conversation it brings the \
kernel's variables back.";

/// The `session` argument's description over stdio.
const STDIO_SESSION_DOC: &str = "The kernel session to continue: the handle a previous result named (`ipybox-s1.stdio.<...>`). \
Leave it out to use this server's current kernel. Pass it in later calls: when the conversation was resumed \
(the server restarted since), it restores that session's variables, functions and classes into the kernel.";

/// The `session` argument's description (HTTP only).
const SESSION_DOC: &str = "The kernel session to use: the handle a previous result named (`ipybox-s1.<route>.<...>`). \
Leave it out to start a new session with a fresh kernel (its handle is in the result); pass it in every \
later call to keep your variables. Over a handshake-era MCP session it may be left out: the MCP session \
has its own kernel.";

/// Arguments of `register_mcp_server`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub(crate) struct RegisterParams {
    /// Name for the server; must be a Python identifier. Its tools become `mcptools.<server_name>.<tool>`.
    pub server_name: String,
    /// How to reach the server. stdio: {"command": "...", "args": [...], "env": {...}, "cwd": "..."}.
    /// HTTP: {"url": "...", "headers": {...}} (a URL path ending in /sse is SSE, else streamable HTTP;
    /// "type": "stdio" | "streamable_http" | "sse" overrides). `${VAR}` placeholders are resolved from
    /// ipybox's environment and the workspace .env when connecting; they are written to the generated
    /// code unresolved.
    pub server_params: Map<String, Value>,
}

/// Arguments of `execute_ipython_cell`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub(crate) struct ExecuteParams {
    /// Python code to execute.
    pub code: String,
    /// Maximum execution time in seconds; the kernel is interrupted after it (state is kept).
    #[serde(default = "default_timeout")]
    #[schemars(default = "default_timeout")]
    pub timeout: f64,
    /// Maximum number of characters of output returned; longer output is truncated.
    #[serde(default = "default_max_output_chars")]
    #[schemars(default = "default_max_output_chars")]
    pub max_output_chars: usize,
    /// Over HTTP: the kernel session (the schema gets it there, see [`SESSION_DOC`]).
    #[serde(default)]
    #[schemars(skip)]
    pub session: Option<String>,
}

fn default_timeout() -> f64 {
    120.0
}

fn default_max_output_chars() -> usize {
    5000
}

/// Arguments of `install_package`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub(crate) struct InstallParams {
    /// Package name with optional version specifier (e.g. "numpy", "numpy>=1.20") or a
    /// "git+https://..." URL (sandboxed: a package of the index only).
    pub package_name: String,
    /// Over HTTP: the kernel session.
    #[serde(default)]
    #[schemars(skip)]
    pub session: Option<String>,
}

/// Arguments of `reset`.
#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
pub(crate) struct ResetParams {
    /// Over HTTP: the kernel session.
    #[serde(default)]
    #[schemars(skip)]
    pub session: Option<String>,
}

/// The MCP server handler. Over stdio one value serves the whole connection; over HTTP rmcp
/// makes one per handshake-era MCP session and one per 2026-07-28 request
/// ([`IpyboxServer::factory`]), all sharing one [`Shared`].
#[derive(Clone)]
pub(crate) struct IpyboxServer {
    shared: Arc<Shared>,
    /// The kernel session of this handshake-era MCP session (HTTP).
    implicit: Arc<Implicit>,
    tool_router: ToolRouter<Self>,
}

/// What every handler of one server shares.
struct Shared {
    config: ServerConfig,
    scope: Scope,
    /// Cells waiting for a 2026-07-28 client's retry (`--approve ask`).
    rounds: Arc<mrtr::Rounds>,
    /// Cells running as tasks (the tasks extension).
    tasks: tasks::CellTasks,
    /// The codeact skill (the skills extension).
    skills: skills::Skills,
    /// The tools, with the `session` argument over HTTP (and over stdio with [`resume`]).
    router: ToolRouter<IpyboxServer>,
    /// stdio: the session's handle, checkpoints and restores (`None`: turned off, or no data
    /// directory).
    resume: Option<Arc<resume::Resume>>,
}

/// Where a request's kernel session comes from.
enum Scope {
    /// stdio: the one session.
    Single(Arc<KernelSession>),
    /// HTTP: a session per agent conversation.
    Service(Arc<dyn SessionSource>),
}

/// The kernel session of one handshake-era MCP session (HTTP): made on its first call that
/// needs a kernel, closed when rmcp drops the MCP session (DELETE, idle, shutdown).
#[derive(Default)]
struct Implicit {
    slot: tokio::sync::Mutex<Option<Arc<KernelSession>>>,
    source: Option<Weak<dyn SessionSource>>,
}

impl Drop for Implicit {
    fn drop(&mut self) {
        if let (Some(session), Some(source)) = (
            self.slot.get_mut().take(),
            self.source.as_ref().and_then(Weak::upgrade),
        ) {
            source.close(&session, "its MCP session ended");
        }
    }
}

impl std::fmt::Debug for IpyboxServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IpyboxServer")
            .field("workspace", &self.shared.config.workspace)
            .finish()
    }
}

/// Whether this request speaks a revision without server-to-client requests (2026-07-28 on).
fn stateless(context: &RequestContext<RoleServer>) -> bool {
    context
        .protocol_version()
        .is_some_and(|v| !v.has_initialize())
}

/// The credential of this request (put there by the HTTP service; stdio: local).
pub(crate) fn caller(context: &RequestContext<RoleServer>) -> Caller {
    context
        .extensions
        .get::<hyper::http::request::Parts>()
        .and_then(|parts| parts.extensions.get::<Caller>())
        .cloned()
        .unwrap_or(Caller::Local)
}

/// How a result tells the model its session's handle: over HTTP, when the session is new to
/// it (2026-07-28 without a handle) or its handle changed (a gateway kernel was replaced).
#[derive(Clone)]
struct Announce {
    source: Option<Arc<dyn SessionSource>>,
    session: Arc<KernelSession>,
    /// The handle the request passed.
    given: Option<String>,
    /// Whether this request's client keeps the handle itself (2026-07-28, or a handle passed).
    keeps_handle: bool,
    /// Why the state the client had is gone (its MCP session's kernel session was closed, and
    /// this request got a new one).
    lost: Option<String>,
    /// stdio: the note naming the session's handle ([`resume::Resume::resolve`]).
    stdio_note: Option<String>,
}

impl Announce {
    /// The line to add to a result, if any.
    fn note(&self) -> Option<String> {
        if let Some(lost) = &self.lost {
            return Some(format!("[ipybox: {lost}]"));
        }
        if let Some(note) = &self.stdio_note {
            return Some(note.clone());
        }
        let source = self.source.as_ref()?;
        if !self.keeps_handle {
            return None;
        }
        let current = source.handle(&self.session)?;
        match &self.given {
            None => Some(format!(
                "[ipybox session {current}: a new kernel session; pass session=\"{current}\" in later calls to keep its state]"
            )),
            Some(given) if *given != current => Some(format!(
                "[ipybox session {current}: this session's kernel was replaced; pass session=\"{current}\" from now on]"
            )),
            Some(_) => None,
        }
    }

    /// `result` with the session's restore report (once, see [`KernelSession::set_restored`])
    /// before its text and the note appended to it.
    fn apply(&self, mut result: CallToolResult) -> CallToolResult {
        let report = self.session.take_restored();
        let notebook = self
            .session
            .notebook_fate
            .take_untold()
            .map(|why| format!("[ipybox] This session's notebook: {why}"));
        let report = match (report, notebook) {
            (Some(r), Some(n)) => Some(format!("{r}\n{n}")),
            (r, n) => r.or(n),
        };
        if let Some(report) = report {
            match result.content.first_mut() {
                Some(ContentBlock::Text(text)) if !text.text.is_empty() => {
                    text.text = format!("{report}\n\n{}", text.text)
                }
                Some(ContentBlock::Text(text)) => text.text = report,
                _ => result.content.insert(0, ContentBlock::text(report)),
            }
        }
        let Some(note) = self.note() else {
            return result;
        };
        match result.content.first_mut() {
            Some(ContentBlock::Text(text)) if !text.text.is_empty() => {
                text.text = format!("{}\n\n{note}", text.text)
            }
            Some(ContentBlock::Text(text)) => text.text = note,
            _ => result.content.insert(0, ContentBlock::text(note)),
        }
        result
    }
}

#[tool_router(router = tool_router_template)]
impl IpyboxServer {
    /// The stdio server: one kernel session; its kernel starts in the background.
    pub(crate) fn new(executor: CodeExecutor, config: ServerConfig) -> Self {
        let background = executor.clone();
        tokio::spawn(async move {
            if let Err(e) = background.start().await {
                tracing::error!(
                    "kernel failed to start (the first execution will retry): {}",
                    ipybox::log_text::escaped(&e.to_string())
                );
            }
        });
        let session = Arc::new(KernelSession::new(executor, Caller::Local, [0; 16], None));
        let task_ttl = config.task_ttl;
        let resume = config.checkpoint_after.and_then(|after| {
            let data_dir = ipybox::host_env::HostEnv::from_process().data_dir()?;
            match resume::Resume::open(&data_dir, &config.workspace, after) {
                Ok(resume) => Some(Arc::new(resume)),
                Err(e) => {
                    tracing::warn!(
                        "resuming conversations is off: {}",
                        ipybox::log_text::escaped(&e)
                    );
                    None
                }
            }
        });
        let mut router = Self::tool_router_template();
        if let Some(resume) = &resume {
            tokio::spawn(resume.clone().checkpoints(session.clone()));
            with_session_argument(&mut router, STDIO_SESSION_DOC, false);
        }
        Self::with_shared(Arc::new(Shared {
            config,
            scope: Scope::Single(session),
            rounds: Arc::new(mrtr::Rounds::new()),
            tasks: tasks::CellTasks::new(task_ttl),
            skills: skills::Skills::load(),
            router,
            resume,
        }))
    }

    /// Makes the handlers of an HTTP server whose kernel sessions come from `source`: one per
    /// handshake-era MCP session, one per 2026-07-28 request (cheap: they share everything).
    ///
    /// With `session_header`, the `session` argument carries the `x-mcp-header` annotation
    /// (SEP-2243): 2026-07-28 clients that listed the tools also send it as the
    /// `Mcp-Param-Session` header, which a load balancer can route on (and rmcp then refuses a
    /// call whose header is missing).
    pub(crate) fn factory(
        source: Arc<dyn SessionSource>,
        config: ServerConfig,
        session_header: bool,
    ) -> impl Fn() -> Self + Send + Sync + 'static {
        let mut router = Self::tool_router_template();
        with_session_argument(&mut router, SESSION_DOC, session_header);
        let task_ttl = config.task_ttl;
        let shared = Arc::new(Shared {
            config,
            scope: Scope::Service(source),
            rounds: Arc::new(mrtr::Rounds::new()),
            tasks: tasks::CellTasks::new(task_ttl),
            skills: skills::Skills::load(),
            router,
            resume: None,
        });
        move || Self::with_shared(shared.clone())
    }

    fn with_shared(shared: Arc<Shared>) -> Self {
        let source = match &shared.scope {
            Scope::Service(source) => Some(Arc::downgrade(source)),
            Scope::Single(_) => None,
        };
        Self {
            tool_router: shared.router.clone(),
            implicit: Arc::new(Implicit {
                slot: Default::default(),
                source,
            }),
            shared,
        }
    }

    /// The executor behind the stdio server (to stop it on shutdown); over HTTP, the shared
    /// workspace's.
    pub(crate) fn executor(&self) -> &CodeExecutor {
        match &self.shared.scope {
            Scope::Single(session) => &session.executor,
            Scope::Service(source) => source.workspace_executor(),
        }
    }

    /// The kernel sessions `caller` owns: the one over stdio; over HTTP its open sessions.
    fn own_sessions(&self, caller: &Caller) -> Vec<Arc<KernelSession>> {
        match &self.shared.scope {
            Scope::Single(session) => vec![session.clone()],
            Scope::Service(source) => source.sessions_of(caller),
        }
    }

    /// The kernel session of this request: the one over stdio; over HTTP the one `given`
    /// names, else (with `create`) a new one for 2026-07-28 requests, the MCP session's own for
    /// handshake-era ones. `Ok(None)`: there is none and `create` was false.
    async fn session(
        &self,
        context: &RequestContext<RoleServer>,
        given: Option<&str>,
        create: bool,
    ) -> Result<Option<(Arc<KernelSession>, Announce)>, String> {
        let source = match &self.shared.scope {
            Scope::Single(session) => {
                // stdio: `given` may name a saved session of a resumed conversation; `create`
                // is false only for `reset`, which switches without restoring.
                let stdio_note = match &self.shared.resume {
                    Some(resume) => resume.resolve(session, given, create).await?,
                    None => None,
                };
                let announce = Announce {
                    source: None,
                    session: session.clone(),
                    given: None,
                    keeps_handle: false,
                    lost: None,
                    stdio_note,
                };
                return Ok(Some((session.clone(), announce)));
            }
            Scope::Service(source) => source,
        };
        let caller = caller(context);
        let stateless = stateless(context);
        let announce = |session: &Arc<KernelSession>| Announce {
            source: Some(source.clone()),
            session: session.clone(),
            given: given.map(str::to_string),
            keeps_handle: stateless || given.is_some(),
            lost: None,
            stdio_note: None,
        };
        if given.is_some() || stateless {
            if given.is_none() && !create {
                return Ok(None);
            }
            let session = source.resolve(&caller, given).await?;
            let announced = announce(&session);
            return Ok(Some((session, announced)));
        }
        // A handshake-era MCP session without a handle: its own kernel session.
        let mut slot = self.implicit.slot.lock().await;
        let mut lost = None;
        if let Some(session) = slot.as_ref() {
            if session.owner != caller {
                return Err("this MCP session belongs to another credential\n  help: start your own MCP session (initialize) with your token".into());
            }
            // (issue 30, hibernation) A hibernated session comes back on its next call.
            let why = match session.closed() {
                None => return Ok(Some((session.clone(), announce(session)))),
                Some(why) => match source.reopen(&caller, session).await {
                    Ok(Some(back)) => {
                        *slot = Some(back.clone());
                        return Ok(Some((back.clone(), announce(&back))));
                    }
                    Ok(None) => why,
                    Err(failed) => failed,
                },
            };
            // (end issue 30)
            // Expired (or its kernel gone): this client cannot pass a handle, so it gets a
            // new kernel session, told that the old state is gone.
            let first = why.lines().next().unwrap_or_default().to_string();
            lost = Some(format!(
                "{first}. This call runs in a new kernel session: variables, imports and definitions from before are gone"
            ));
            *slot = None;
        }
        if !create {
            return Ok(None);
        }
        let session = source.resolve(&caller, None).await?;
        *slot = Some(session.clone());
        let mut announced = announce(&session);
        announced.lost = lost;
        Ok(Some((session.clone(), announced)))
    }

    #[tool(
        description = "Register an MCP server and generate importable Python tool functions.\n\nConnects to the MCP server, lists its tools and generates the package `mcptools/<server_name>/` in the workspace: one module per tool with a Pydantic `Params` model, a `Result` model when the tool has structured output, and `run(params)`. Use them in `execute_ipython_cell` as `from mcptools.<server_name>.<module> import Params, run`. Returns the module names, one per line. Call `reset` afterwards if modules of this server were already imported."
    )]
    async fn register_mcp_server(
        &self,
        Parameters(p): Parameters<RegisterParams>,
    ) -> Result<CallToolResult, ErrorData> {
        if let Scope::Service(source) = &self.shared.scope
            && !source.register_allowed()
        {
            return Ok(text_error(format!(
                "cannot register `{}`: on this ipybox service the operator registers the MCP servers (registering makes the host start the server named), and every session shares them\n  help: use the servers already in `mcptools/` (list them with `import os; print(os.listdir('mcptools'))`), or ask the operator to register it (`ipybox apigen`) or to start `ipybox serve` with --allow-register",
                p.server_name
            )));
        }
        let params = Value::Object(p.server_params);
        match self
            .executor()
            .register_mcp_server(&p.server_name, &params)
            .await
        {
            Ok(modules) => Ok(CallToolResult::success(vec![ContentBlock::text(
                modules.join("\n"),
            )])),
            Err(e) => Ok(text_error(e.to_string())),
        }
    }

    #[tool(
        description = "Execute Python code in a stateful IPython kernel.\n\nVariables, imports and definitions persist across calls; call `reset` for a fresh kernel. The working directory is the workspace, so generated tools import as `from mcptools.<server>.<tool> import Params, run`. Returns what the code printed and the value of its last expression. Images (e.g. matplotlib figures) are saved as PNG files and listed under \"Generated images:\". Errors return the traceback together with the output printed before it; on timeout the kernel is interrupted and its state is kept."
    )]
    async fn execute_ipython_cell(
        &self,
        Parameters(p): Parameters<ExecuteParams>,
        RequestState(request_state): RequestState,
        ToolInputResponses(responses): ToolInputResponses,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        if !(p.timeout.is_finite() && p.timeout > 0.0) {
            return Ok(text_error(format!(
                "invalid timeout {}: pass a positive number of seconds",
                p.timeout
            ))
            .into());
        }
        let started = std::time::Instant::now();
        // A retry must carry the arguments its requestState was sealed for.
        let binding = serde_json::to_vec(&(&p.code, p.timeout, p.max_output_chars, &p.session))
            .unwrap_or_default();
        let timeout = Duration::from_secs_f64(p.timeout.min(86_400.0 * 365.0));
        let (run, resumed, session, announce, _entered) = match request_state {
            Some(state) => {
                let caller = caller(&context);
                match self
                    .shared
                    .rounds
                    .resume(&state, &binding, responses.as_ref(), &caller)
                {
                    Ok((run, round, session)) => {
                        let entered = match session.enter() {
                            Ok(entered) => entered,
                            Err(why) => return Ok(text_error(why).into()),
                        };
                        let announce = Announce {
                            source: match &self.shared.scope {
                                Scope::Service(source) => Some(source.clone()),
                                Scope::Single(_) => None,
                            },
                            session: session.clone(),
                            given: p.session.clone(),
                            keeps_handle: stateless(&context) || p.session.is_some(),
                            lost: None,
                            stdio_note: None,
                        };
                        (run, Some(round), session, announce, entered)
                    }
                    // Not genuine, another credential's, stale: a JSON-RPC error.
                    Err(mrtr::Refused::Invalid(error)) => return Err(error),
                    // Genuine but late: what became of the cell.
                    Err(mrtr::Refused::Late(result)) => return Ok((*result).into()),
                }
            }
            None => {
                let (session, announce) =
                    match self.session(&context, p.session.as_deref(), true).await {
                        Ok(Some(found)) => found,
                        Ok(None) => unreachable!("create is true"),
                        Err(why) => return Ok(text_error(why).into()),
                    };
                if let Some(busy) = session.busy.busy_error() {
                    return Ok(announce.apply(text_error(busy)).into());
                }
                let entered = match session.enter() {
                    Ok(entered) => entered,
                    Err(why) => return Ok(announce.apply(text_error(why)).into()),
                };
                let span = session_span(&session);
                if let Err(e) = session.executor.start().instrument(span.clone()).await {
                    return Ok(announce.apply(text_error(start_failed(&e))).into());
                }
                // Closed while this call started its kernel (expiry, DELETE, shutdown): the
                // kernel it may have started again is stopped, not left behind.
                if let Some(why) = session.closed() {
                    session.executor.stop().await;
                    return Ok(announce.apply(text_error(why)).into());
                }
                let _in_span = span.enter();
                if let Some(resume) = &self.shared.resume {
                    resume.changed();
                }
                let execution = session.executor.stream_with_options(
                    &p.code,
                    ipybox::executor::RunOptions {
                        timeout: Some(timeout),
                        accept_all: self.shared.config.approve != ApproveMode::Ask,
                        max_output_bytes: Some(kept_bytes(p.max_output_chars)),
                        // The notebook holds what the result gets.
                        notebook_output_chars: Some(p.max_output_chars),
                    },
                );
                let run = CellRun::start(
                    execution,
                    session.allowances.clone(),
                    session.cell_running(),
                );
                (run, None, session, announce, entered)
            }
        };
        let serve = request::Serve {
            config: &self.shared.config,
            session: &session,
            rounds: &self.shared.rounds,
            tasks: &self.shared.tasks,
            context: &context,
            binding: &binding,
            timeout,
        };
        let max_chars = p.max_output_chars;
        let image_limits = (
            self.shared.config.max_images,
            self.shared.config.max_image_bytes,
        );
        let announced = announce.clone();
        let finish = move || -> tasks::Finish {
            Box::new(move |result| {
                Box::pin(async move {
                    announced.apply(cell_result(result, max_chars, image_limits).await)
                })
            })
        };
        let outcome = serve
            .serve(run, resumed, finish)
            .instrument(session_span(&session))
            .await;
        super::metrics::cell(
            match &outcome {
                Outcome::Done(Ok(_)) => super::metrics::CellEnd::Ok,
                Outcome::Done(Err(_)) => super::metrics::CellEnd::Error,
                Outcome::InputRequired(_) => super::metrics::CellEnd::InputRequired,
                Outcome::Task(_) => super::metrics::CellEnd::Task,
                Outcome::Cancelled => super::metrics::CellEnd::Cancelled,
            },
            started.elapsed(),
        );
        match outcome {
            Outcome::Done(result) => Ok(announce
                .apply(cell_result(result, max_chars, image_limits).await)
                .into()),
            Outcome::InputRequired(asked) => Ok(asked.into()),
            Outcome::Task(task) => Ok(CreateTaskResult::new(task).into()),
            // A cancelled request (notifications/cancelled, e.g. Esc in Claude Code): the code
            // in the kernel was interrupted; state is kept.
            Outcome::Cancelled => Ok(announce
                .apply(text_error(
                    "execution cancelled by the client; the kernel was interrupted and its state kept"
                        .into(),
                ))
                .into()),
        }
    }

    #[tool(
        description = "Install a Python package into the kernel's environment (with uv or pip).\n\nAccepts a name with an optional version specifier (\"numpy\", \"numpy>=1.20\") or a \"git+https://...\" URL; when the kernel is sandboxed, only a package of the package index (name, extras, version), installed by an installer inside the sandbox for this workspace's sandboxed kernels. The package is importable right away, without a reset (a package that was already imported in an older version needs `reset`). Returns the installer's summary."
    )]
    async fn install_package(
        &self,
        Parameters(p): Parameters<InstallParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        if let Scope::Service(source) = &self.shared.scope
            && !source.install_allowed()
        {
            return Ok(text_error(format!(
                "cannot install `{}`: every session of this ipybox service shares the kernel environment, so installing is up to its operator\n  help: ask the operator to add the package to the kernel environment (or image), or to start `ipybox serve` with --allow-install",
                p.package_name
            )));
        }
        let (session, announce) = match self.session(&context, p.session.as_deref(), true).await {
            Ok(Some(found)) => found,
            Ok(None) => unreachable!("create is true"),
            Err(why) => return Ok(text_error(why)),
        };
        if let Some(busy) = session.busy.busy_error() {
            return Ok(announce.apply(text_error(busy)));
        }
        let _entered = match session.enter() {
            Ok(entered) => entered,
            Err(why) => return Ok(announce.apply(text_error(why))),
        };
        let result = match session.executor.install_package(&p.package_name).await {
            Ok(summary) => CallToolResult::success(vec![ContentBlock::text(summary)]),
            Err(e) => text_error(e.to_string()),
        };
        Ok(announce.apply(result))
    }

    #[tool(
        description = "Reset the IPython kernel: a fresh kernel replaces the current one, clearing all variables, imports and definitions, and the MCP server sessions used by generated tools are closed. Files in the workspace (generated modules included) and installed packages are kept."
    )]
    async fn reset(
        &self,
        Parameters(p): Parameters<ResetParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let (session, announce) = match self.session(&context, p.session.as_deref(), false).await {
            Ok(Some(found)) => found,
            Ok(None) if stateless(&context) => {
                return Ok(text_error(
                    "no session given: reset needs the `session` handle of the kernel to reset\n  help: pass session=\"ipybox-s1.<route>.<...>\" as named by an earlier result; a call without it starts a new session with a fresh kernel anyway".into(),
                ));
            }
            Ok(None) => {
                return Ok(CallToolResult::success(vec![ContentBlock::text(
                    "Kernel reset: no kernel was started in this session yet; the first cell gets a fresh one.",
                )]));
            }
            Err(why) => return Ok(text_error(why)),
        };
        let _entered = match session.enter() {
            Ok(entered) => entered,
            Err(why) => return Ok(announce.apply(text_error(why))),
        };
        // A cell running as a task would make the reset wait for it: it is cancelled instead.
        session.busy.cancel_running(&self.shared.tasks).await;
        if let Err(e) = session.executor.start().await {
            return Ok(announce.apply(text_error(start_failed(&e))));
        }
        let result = match session.executor.reset().await {
            Ok(()) => {
                // The session's saved state becomes the empty kernel's at the next checkpoint.
                if let Some(resume) = &self.shared.resume {
                    resume.changed();
                }
                CallToolResult::success(vec![ContentBlock::text(
                    "Kernel reset: a fresh kernel is running and MCP sessions were closed.",
                )])
            }
            Err(e) => text_error(format!("reset failed: {e}")),
        };
        Ok(announce.apply(result))
    }
}

/// Adds the `session` argument (described by `doc`; with `header`, the `x-mcp-header`
/// annotation) to the tools that use a kernel session.
fn with_session_argument(router: &mut ToolRouter<IpyboxServer>, doc: &str, header: bool) {
    for name in ["execute_ipython_cell", "install_package", "reset"] {
        if let Some(route) = router.map.get_mut(name) {
            let mut schema = (*route.attr.input_schema).clone();
            let properties = schema
                .entry("properties")
                .or_insert_with(|| Value::Object(Map::new()));
            if let Some(properties) = properties.as_object_mut() {
                let mut session = json!({"type": "string", "description": doc});
                if header {
                    session["x-mcp-header"] = json!("Session");
                }
                properties.insert("session".into(), session);
            }
            route.attr.input_schema = Arc::new(schema);
        }
    }
}

/// The span of a call's work in its kernel session: logs carry the session's tag (never its
/// handle, never a token).
fn session_span(session: &KernelSession) -> tracing::Span {
    tracing::info_span!("session", id = %session.tag)
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for IpyboxServer {
    /// rmcp's router, with an unknown tool's name and the tools there are in its error.
    async fn call_tool(
        &self,
        request: rmcp::model::CallToolRequestParams,
        context: rmcp::service::RequestContext<RoleServer>,
    ) -> Result<rmcp::model::CallToolResponse, ErrorData> {
        let name = request.name.clone();
        let call = rmcp::handler::server::tool::ToolCallContext::new(self, request, context);
        self.tool_router.call(call).await.map_err(|e| {
            if e.message == "tool not found" && !self.tool_router.has_route(&name) {
                let tools: Vec<String> = self
                    .tool_router
                    .list_all()
                    .into_iter()
                    .map(|t| t.name.to_string())
                    .collect();
                ErrorData::invalid_params(
                    format!(
                        "tool not found: `{name}` (this server's tools: {})",
                        tools.join(", ")
                    ),
                    None,
                )
            } else {
                e
            }
        })
    }

    fn get_info(&self) -> rmcp::model::ServerConfig {
        let instructions = match &self.shared.scope {
            Scope::Single(_) if self.shared.resume.is_some() => {
                format!("{INSTRUCTIONS}{RESUME_INSTRUCTIONS}")
            }
            Scope::Single(_) => INSTRUCTIONS.to_string(),
            Scope::Service(_) => format!("{INSTRUCTIONS}{SESSION_INSTRUCTIONS}"),
        };
        rmcp::model::ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_resources()
                .enable_skills_with_directory_read()
                .enable_tasks()
                .build(),
        )
        .with_server_info(Implementation::new("ipybox", env!("CARGO_PKG_VERSION")))
        .with_instructions(instructions)
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, ErrorData> {
        Ok(GetTaskResult::new(
            self.shared.tasks.get(&caller(&context), &request.task_id)?,
        ))
    }

    async fn update_task(
        &self,
        request: UpdateTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.shared
            .tasks
            .manager_for(&caller(&context), &request.task_id)?
            .update_task(&request.task_id, request.input_responses)
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.shared
            .tasks
            .manager_for(&caller(&context), &request.task_id)?
            .cancel_task(&request.task_id)
    }

    async fn list_skills(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListSkillsResult, ErrorData> {
        Ok(self.shared.skills.list())
    }

    async fn get_skill(
        &self,
        request: GetSkillRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<GetSkillResult, ErrorData> {
        self.shared.skills.get(&request.uri)
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        let mut listed = self.shared.skills.resources();
        listed.resources.extend(
            self.own_sessions(&caller(&context))
                .iter()
                .filter_map(|s| notebook::resource(s)),
        );
        Ok(listed)
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        if let Some(tag) = notebook::tag(&request.uri) {
            let sessions = self.own_sessions(&caller(&context));
            let session = sessions.iter().find(|s| notebook::is(s, tag));
            if let Some(why) = session.and_then(|s| s.notebook_fate.gone()) {
                return Err(notebook::not_recorded(&request.uri, &why));
            }
            let Some(session) = session else {
                return Err(notebook::unknown(&request.uri));
            };
            return match notebook::read(session, &request.uri).await {
                Some(read) => read.map(Into::into),
                None => Err(notebook::unknown(&request.uri)),
            };
        }
        self.shared
            .skills
            .read(&request.uri)
            .map(Into::into)
            .ok_or_else(|| {
                ErrorData::resource_not_found(
                    format!(
                        "no resource {}: ipybox serves the codeact skill's files (skill://codeact/...) and your sessions' notebooks (ipybox://notebook/...)",
                        request.uri
                    ),
                    Some(json!({"uri": request.uri})),
                )
            })
    }

    async fn read_resource_directory(
        &self,
        request: ReadResourceDirectoryRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceDirectoryResult, ErrorData> {
        self.shared.skills.read_directory(&request.uri)
    }
}
