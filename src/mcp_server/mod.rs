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

mod cell;
mod elicit;
mod mrtr;
mod progress;
mod request;
mod skills;
mod stdio;
mod tasks;

pub(crate) use stdio::serve_stdio;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
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
use serde_json::{Map, Value};

use ipybox::CodeExecutor;
use ipybox::executor::ExecutorError;

use cell::CellRun;
use request::Outcome;

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
    /// A task lives for its cell's timeout plus this long (a finished task's result stays at
    /// least this long).
    pub task_ttl: Duration,
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
    /// Cells waiting for a 2026-07-28 client's retry (`--approve ask`).
    rounds: Arc<mrtr::Rounds>,
    /// Cells running as tasks (the tasks extension).
    tasks: tasks::CellTasks,
    /// The codeact skill (the skills extension).
    skills: Arc<skills::Skills>,
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
            rounds: Arc::new(mrtr::Rounds::new()),
            tasks: tasks::CellTasks::default(),
            skills: Arc::new(skills::Skills::load()),
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
        let timeout = Duration::from_secs_f64(p.timeout.min(86_400.0 * 365.0));
        let (run, resumed) = match request_state {
            Some(state) => {
                match self
                    .rounds
                    .resume(&state, &binding, responses.as_ref(), &self.allowances)
                {
                    Ok((run, round)) => (run, Some(round)),
                    Err(mrtr::Refused(why)) => return Ok(text_error(why).into()),
                }
            }
            None => {
                if let Some(busy) = self.tasks.busy_error() {
                    return Ok(text_error(busy).into());
                }
                if let Err(e) = self.executor.start().await {
                    return Ok(text_error(format!("the kernel could not be started: {e}")).into());
                }
                let execution = if self.config.approve == ApproveMode::Ask {
                    self.executor.stream(&p.code, Some(timeout))
                } else {
                    self.executor.stream_accepting(&p.code, Some(timeout))
                };
                (CellRun::start(execution, self.allowances.clone()), None)
            }
        };
        let serve = request::Serve {
            config: &self.config,
            allowances: &self.allowances,
            rounds: &self.rounds,
            tasks: &self.tasks,
            context: &context,
            binding: &binding,
            timeout,
        };
        let max_chars = p.max_output_chars;
        let finish = move || -> tasks::Finish {
            Box::new(move |result| Box::pin(async move { cell_result(result, max_chars).await }))
        };
        match serve.serve(run, resumed, finish).await {
            Outcome::Done(result) => Ok(cell_result(result, max_chars).await.into()),
            Outcome::InputRequired(asked) => Ok(asked.into()),
            Outcome::Task(task) => Ok(CreateTaskResult::new(task).into()),
            // A cancelled request (notifications/cancelled, e.g. Esc in Claude Code): the code
            // in the kernel was interrupted; state is kept.
            Outcome::Cancelled => Ok(text_error(
                "execution cancelled by the client; the kernel was interrupted and its state kept"
                    .into(),
            )
            .into()),
        }
    }

    #[tool(
        description = "Install a Python package into the kernel's environment (with uv or pip).\n\nAccepts a name with an optional version specifier (\"numpy\", \"numpy>=1.20\") or a \"git+https://...\" URL. The package is importable right away, without a reset (a package that was already imported in an older version needs `reset`). Returns the installer's summary."
    )]
    async fn install_package(
        &self,
        Parameters(p): Parameters<InstallParams>,
    ) -> Result<CallToolResult, ErrorData> {
        if let Some(busy) = self.tasks.busy_error() {
            return Ok(text_error(busy));
        }
        match self.executor.install_package(&p.package_name).await {
            Ok(summary) => Ok(CallToolResult::success(vec![ContentBlock::text(summary)])),
            Err(e) => Ok(text_error(e.to_string())),
        }
    }

    #[tool(
        description = "Reset the IPython kernel: a fresh kernel replaces the current one, clearing all variables, imports and definitions, and the MCP server sessions used by generated tools are closed. Files in the workspace (generated modules included) and installed packages are kept."
    )]
    async fn reset(&self) -> Result<CallToolResult, ErrorData> {
        // A cell running as a task would make the reset wait for it: it is cancelled instead.
        self.tasks.cancel_running().await;
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

/// The tool's result for a cell's result: the output (truncated to `max_chars`) and the images,
/// or the error with the output printed before it.
async fn cell_result(
    result: Result<ipybox::executor::ExecutionResult, ExecutorError>,
    max_chars: usize,
) -> CallToolResult {
    let result = match result {
        Ok(result) => result,
        Err(e) => return text_error(truncate_output(&failure_text(&e), max_chars)),
    };
    let mut text = truncate_output(&result.text, max_chars);
    let mut content = Vec::new();
    if !result.images.is_empty() {
        if !text.is_empty() {
            text.push_str("\n\n");
        }
        text.push_str("Generated images:");
        // The bytes the kernel sent, kept in memory: the files are in the workspace, where a
        // sandboxed kernel can swap them for links.
        for (path, bytes) in result.images.iter().zip(&result.image_data) {
            text.push_str(&format!("\n- {}", path.display()));
            content.push(ContentBlock::image(
                base64::engine::general_purpose::STANDARD.encode(bytes),
                "image/png",
            ));
        }
    }
    content.insert(0, ContentBlock::text(text));
    CallToolResult::success(content)
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
        rmcp::model::ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_resources()
                .enable_skills_with_directory_read()
                .enable_tasks()
                .build(),
        )
        .with_server_info(Implementation::new("ipybox", env!("CARGO_PKG_VERSION")))
        .with_instructions(INSTRUCTIONS)
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, ErrorData> {
        Ok(GetTaskResult::new(
            self.tasks.manager().get_task(&request.task_id)?,
        ))
    }

    async fn update_task(
        &self,
        request: UpdateTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.tasks
            .manager()
            .update_task(&request.task_id, request.input_responses)
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.tasks.manager().cancel_task(&request.task_id)
    }

    async fn list_skills(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListSkillsResult, ErrorData> {
        Ok(self.skills.list())
    }

    async fn get_skill(
        &self,
        request: GetSkillRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<GetSkillResult, ErrorData> {
        self.skills.get(&request.uri)
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        Ok(self.skills.resources())
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        self.skills
            .read(&request.uri)
            .map(Into::into)
            .ok_or_else(|| ErrorData::resource_not_found(format!("no resource {}: ipybox serves the codeact skill's files (skill://codeact/...)", request.uri), None))
    }

    async fn read_resource_directory(
        &self,
        request: ReadResourceDirectoryRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceDirectoryResult, ErrorData> {
        self.skills.read_directory(&request.uri)
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
