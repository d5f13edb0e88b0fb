//! The ipybox MCP server: four tools (`register_mcp_server`, `execute_ipython_cell`,
//! `install_package`, `reset`) on top of [`CodeExecutor`], served over stdio with rmcp.
//!
//! The kernel starts in the background when the server is created, so the `initialize` reply
//! never waits for it; the first execution does. Tool calls made by executed code are accepted
//! automatically (as in Python ipybox), or, with `--approve ask`, asked about through the client
//! ([`elicit`]); a cell whose request carries a progress token reports progress ([`progress`]).
//! Results are text only (plus image content), never `structuredContent`: Claude Code would show
//! the model only that.
//!
//! Not here: serving on stdio and shutting down ([`stdio`]), the workspace/`.env` handling of the
//! command line (the binary's `dotenv` module builds the executor's environments), and everything
//! the executor does.

mod elicit;
mod mrtr;
mod progress;
mod stdio;

pub(crate) use stdio::serve_stdio;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::tool::{InputResponses as ToolInputResponses, RequestState};
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    CallToolResponse, CallToolResult, ContentBlock, Implementation, ServerCapabilities,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, schemars, tool, tool_handler, tool_router};
use serde::Deserialize;
use serde_json::{Map, Value};

use ipybox::CodeExecutor;
use ipybox::executor::{Execution, ExecutionEvent, ExecutorError};
use ipybox::tools::ApprovalRequest;

/// What the server is told by its command line.
#[derive(Debug, Clone)]
pub(crate) struct ServerConfig {
    /// Absolute workspace path: the kernel's cwd; `mcptools/` is generated here.
    pub workspace: PathBuf,
    /// Who approves the tool calls and shell commands of executed code.
    pub approve: ApproveMode,
    /// How long a call waits for the user's answer with [`ApproveMode::Ask`].
    pub approval_timeout: Duration,
}

/// `--approve`: who approves the tool calls (and approved-category shell commands) of executed
/// code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum ApproveMode {
    /// Accept every call (Python ipybox's behaviour).
    Auto,
    /// Ask the user through the MCP client (elicitation), see [`elicit`].
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
    /// "git+https://..." URL.
    pub package_name: String,
}

/// The MCP server handler.
#[derive(Clone)]
pub(crate) struct IpyboxServer {
    executor: CodeExecutor,
    config: Arc<ServerConfig>,
    /// What the user allowed for the rest of the session (`--approve ask`).
    allowances: elicit::SessionAllowances,
    /// Executions waiting for a 2026-07-28 client's retry (`--approve ask`).
    pauses: Arc<mrtr::Pauses>,
    tool_router: ToolRouter<Self>,
}

impl std::fmt::Debug for IpyboxServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IpyboxServer")
            .field("workspace", &self.config.workspace)
            .finish()
    }
}

fn text_error(text: String) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(text)])
}

/// Keeps the first `max` characters, appending the truncation notice.
pub(crate) fn truncate_output(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        None => text.to_string(),
        Some((cut, _)) => {
            format!(
                "{}\n\n[Output truncated: exceeded {max} character limit]",
                &text[..cut]
            )
        }
    }
}

/// How a cell's `tools/call` ends (this round).
enum CellOutcome {
    Done(Result<ipybox::executor::ExecutionResult, ExecutorError>),
    /// The client cancelled the request (the execution was interrupted).
    Cancelled,
    /// 2026-07-28 with `--approve ask`: the execution is parked until the client retries with
    /// the user's answers ([`mrtr`]).
    InputRequired(rmcp::model::InputRequiredResult),
}

/// After the first approval of a round, how long the driver gathers more (concurrent calls of
/// threads or `asyncio.gather` arrive within milliseconds) before answering `input_required`.
const GATHER: Duration = Duration::from_millis(100);

/// Whether this request speaks a revision without server-to-client requests (2026-07-28 on).
fn stateless(context: &RequestContext<RoleServer>) -> bool {
    context
        .protocol_version()
        .is_some_and(|v| !v.has_initialize())
}

impl IpyboxServer {
    /// Runs one cell (or resumes a parked one) for `execute_ipython_cell`: asks the client about
    /// tool calls with `--approve ask` (elicitation/create for handshake-era clients,
    /// input_required rounds for 2026-07-28 ones), reports progress when the request carries a
    /// progress token.
    async fn run_cell(
        &self,
        code: &str,
        timeout: Duration,
        context: &RequestContext<RoleServer>,
        resumed: Option<(Execution, (u64, u64))>,
        binding: &[u8],
    ) -> CellOutcome {
        let ask = self.config.approve == ApproveMode::Ask;
        let token = context.meta.get_progress_token();
        if resumed.is_none() && !ask && token.is_none() {
            // Dropping this future interrupts the code in the kernel.
            return tokio::select! {
                result = self.executor.execute(code, Some(timeout)) => CellOutcome::Done(result),
                _ = context.ct.cancelled() => CellOutcome::Cancelled,
            };
        }
        let (mut execution, round) = match resumed {
            Some((execution, round)) => (execution, Some(round)),
            None if ask => (self.executor.stream(code, Some(timeout)), None),
            None => (self.executor.stream_accepting(code, Some(timeout)), None),
        };
        let canceller = execution.canceller();
        let stateless = stateless(context);
        let can_elicit = if stateless {
            context
                .client_capabilities()
                .and_then(|c| c.elicitation)
                .is_some_and(|e| e.form.is_some() || e.url.is_none())
        } else {
            true // the handshake-era path checks the peer's declared capabilities itself
        };
        let mut progress = token.map(|t| progress::ProgressReporter::new(context.peer.clone(), t));
        let mut deciding = tokio::task::JoinSet::new();
        let mut asking: Vec<ApprovalRequest> = Vec::new();
        let mut gather_until: Option<tokio::time::Instant> = None;
        loop {
            let tick = progress
                .as_ref()
                .map(|p| p.next_tick())
                .unwrap_or_else(|| std::time::Instant::now() + Duration::from_secs(3600));
            let gathered = gather_until
                .unwrap_or_else(|| tokio::time::Instant::now() + Duration::from_secs(3600));
            let event = tokio::select! {
                event = execution.next() => event,
                _ = tokio::time::sleep_until(tick.into()) => {
                    if let Some(p) = progress.as_mut() {
                        p.tick().await;
                    }
                    continue;
                }
                _ = tokio::time::sleep_until(gathered), if gather_until.is_some() => {
                    if let Some(p) = progress.as_mut() {
                        p.finish().await;
                    }
                    let ttl = self.config.approval_timeout;
                    let pending = std::mem::take(&mut asking);
                    return CellOutcome::InputRequired(
                        self.pauses.park(round, execution, pending, binding, ttl),
                    );
                }
                _ = context.ct.cancelled() => {
                    canceller.cancel();
                    return CellOutcome::Cancelled;
                }
            };
            match event {
                Some(ExecutionEvent::Chunk(text)) => {
                    if let Some(p) = progress.as_mut() {
                        p.output(&text).await;
                    }
                }
                Some(ExecutionEvent::Image(_)) => {}
                Some(ExecutionEvent::Approval(request)) if stateless => {
                    if self.allowances.allows(&request) {
                        request.accept();
                    } else if !can_elicit {
                        tracing::warn!(
                            "rejected {}: the MCP client did not declare the elicitation capability",
                            request.describe()
                        );
                        request.reject_with(elicit::NO_ELICITATION);
                    } else {
                        asking.push(request);
                        gather_until.get_or_insert_with(|| tokio::time::Instant::now() + GATHER);
                    }
                }
                Some(ExecutionEvent::Approval(request)) => {
                    // Each on its own task: concurrent calls are asked about concurrently, and
                    // output keeps flowing while the user thinks.
                    let (peer, allowances) = (context.peer.clone(), self.allowances.clone());
                    let approval_timeout = self.config.approval_timeout;
                    deciding.spawn(async move {
                        elicit::decide(request, &peer, &allowances, approval_timeout).await;
                    });
                }
                Some(ExecutionEvent::Result(result)) => {
                    if let Some(p) = progress.as_mut() {
                        p.finish().await;
                    }
                    return CellOutcome::Done(result);
                }
                None => return CellOutcome::Done(Err(ipybox::kernel::KernelError::Stopped.into())),
            }
        }
    }
}

#[tool_router]
impl IpyboxServer {
    /// Creates the server and starts the kernel in the background.
    pub(crate) fn new(executor: CodeExecutor, config: ServerConfig) -> Self {
        let background = executor.clone();
        tokio::spawn(async move {
            if let Err(e) = background.start().await {
                tracing::error!("kernel failed to start (the first execution will retry): {e}");
            }
        });
        Self {
            executor,
            config: Arc::new(config),
            allowances: elicit::SessionAllowances::default(),
            pauses: Arc::new(mrtr::Pauses::new()),
            tool_router: Self::tool_router(),
        }
    }

    /// The executor behind the server (to stop it on shutdown).
    pub(crate) fn executor(&self) -> &CodeExecutor {
        &self.executor
    }

    #[tool(
        description = "Register an MCP server and generate importable Python tool functions.\n\nConnects to the MCP server, lists its tools and generates the package `mcptools/<server_name>/` in the workspace: one module per tool with a Pydantic `Params` model, a `Result` model when the tool has structured output, and `run(params)`. Use them in `execute_ipython_cell` as `from mcptools.<server_name>.<module> import Params, run`. Returns the module names, one per line. Call `reset` afterwards if modules of this server were already imported."
    )]
    async fn register_mcp_server(
        &self,
        Parameters(p): Parameters<RegisterParams>,
    ) -> Result<CallToolResult, ErrorData> {
        let params = Value::Object(p.server_params);
        match self
            .executor
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
        // A retry must carry the arguments its requestState was sealed for.
        let binding =
            serde_json::to_vec(&(&p.code, p.timeout, p.max_output_chars)).unwrap_or_default();
        let resumed = match request_state {
            None => None,
            Some(state) => {
                match self
                    .pauses
                    .resume(&state, &binding, responses.as_ref(), &self.allowances)
                {
                    Ok(resumed) => Some(resumed),
                    Err(mrtr::Refused(why)) => return Ok(text_error(why).into()),
                }
            }
        };
        if resumed.is_none()
            && let Err(e) = self.executor.start().await
        {
            return Ok(text_error(format!("the kernel could not be started: {e}")).into());
        }
        let timeout = Duration::from_secs_f64(p.timeout.min(86_400.0 * 365.0));
        let executed = match self
            .run_cell(&p.code, timeout, &context, resumed, &binding)
            .await
        {
            CellOutcome::Done(result) => result,
            CellOutcome::InputRequired(asked) => return Ok(asked.into()),
            CellOutcome::Cancelled => {
                // A cancelled request (notifications/cancelled, e.g. Esc in Claude Code): the
                // code in the kernel was interrupted; state is kept.
                return Ok(text_error(
                    "execution cancelled by the client; the kernel was interrupted and its state kept"
                        .into(),
                )
                .into());
            }
        };
        match executed {
            Ok(result) => {
                let mut text = truncate_output(&result.text, p.max_output_chars);
                let mut content = Vec::new();
                if !result.images.is_empty() {
                    if !text.is_empty() {
                        text.push_str("\n\n");
                    }
                    text.push_str("Generated images:");
                    // The bytes the kernel sent, kept in memory: the files are in the
                    // workspace, where a sandboxed kernel can swap them for links.
                    for (path, bytes) in result.images.iter().zip(&result.image_data) {
                        text.push_str(&format!("\n- {}", path.display()));
                        content.push(ContentBlock::image(
                            base64::engine::general_purpose::STANDARD.encode(bytes),
                            "image/png",
                        ));
                    }
                }
                content.insert(0, ContentBlock::text(text));
                Ok(CallToolResult::success(content).into())
            }
            Err(e) => Ok(text_error(truncate_output(&failure_text(&e), p.max_output_chars)).into()),
        }
    }

    #[tool(
        description = "Install a Python package into the kernel's environment (with uv or pip).\n\nAccepts a name with an optional version specifier (\"numpy\", \"numpy>=1.20\") or a \"git+https://...\" URL. The package is importable right away, without a reset (a package that was already imported in an older version needs `reset`). Returns the installer's summary."
    )]
    async fn install_package(
        &self,
        Parameters(p): Parameters<InstallParams>,
    ) -> Result<CallToolResult, ErrorData> {
        match self.executor.install_package(&p.package_name).await {
            Ok(summary) => Ok(CallToolResult::success(vec![ContentBlock::text(summary)])),
            Err(e) => Ok(text_error(e.to_string())),
        }
    }

    #[tool(
        description = "Reset the IPython kernel: a fresh kernel replaces the current one, clearing all variables, imports and definitions, and the MCP server sessions used by generated tools are closed. Files in the workspace (generated modules included) and installed packages are kept."
    )]
    async fn reset(&self) -> Result<CallToolResult, ErrorData> {
        if let Err(e) = self.executor.start().await {
            return Ok(text_error(format!("the kernel could not be started: {e}")));
        }
        match self.executor.reset().await {
            Ok(()) => Ok(CallToolResult::success(vec![ContentBlock::text(
                "Kernel reset: a fresh kernel is running and MCP sessions were closed.",
            )])),
            Err(e) => Ok(text_error(format!("reset failed: {e}"))),
        }
    }
}

/// The text of a failed execution: what was printed before, then the error.
fn failure_text(e: &ExecutorError) -> String {
    let output = e.output();
    let error = e.error_text();
    if output.is_empty() {
        error
    } else {
        format!("{output}\n\n{error}")
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for IpyboxServer {
    fn get_info(&self) -> rmcp::model::ServerConfig {
        rmcp::model::ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("ipybox", env!("CARGO_PKG_VERSION")))
            .with_instructions(INSTRUCTIONS)
    }
}

#[cfg(test)]
mod tests {
    use super::truncate_output;

    #[test]
    fn truncates_by_characters() {
        assert_eq!(truncate_output("héllo", 10), "héllo");
        assert_eq!(truncate_output("héllo", 5), "héllo");
        assert_eq!(
            truncate_output("héllo", 2),
            "hé\n\n[Output truncated: exceeded 2 character limit]"
        );
    }
}
