//! Registering an MCP server: list its tools over a short-lived session, generate the typed
//! Python package for them (`<root_dir>/<server_name>/`), and record the params on the host for
//! the workspace that holds `root_dir` (kernels may only call servers registered for their
//! workspace, with these params: `crate::tools::registry`).
//!
//! This is where the MCP client ([`crate::tools`]) meets code generation ([`crate::apigen`]);
//! neither knows the other.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use serde_json::Value;

use crate::apigen::{self, ApiStyle, ApigenError, ToolSpec};
use crate::tools::{DEFAULT_CONNECT_TIMEOUT, McpSession, ServerParams, ToolsError};

/// Why registration failed.
#[derive(Debug, thiserror::Error)]
pub enum RegisterError {
    #[error(transparent)]
    Tools(#[from] ToolsError),
    #[error(transparent)]
    Apigen(#[from] ApigenError),
    /// The workspace (or the host-side record of registrations) could not be prepared.
    #[error(transparent)]
    Workspace(Box<dyn std::error::Error + Send + Sync>),
    /// The registration could not be recorded on the host (see `tools::registry`).
    #[error("cannot record the registration: {0}")]
    Record(#[source] std::io::Error),
}

/// Generates `<root_dir>/<server_name>/` from the tools of the server at `server_params`, with
/// `${VAR}` placeholders resolved from the process environment, with synchronous `run()`
/// functions, and registers the server for the workspace `root_dir` is in (its parent: kernels
/// import `mcptools.<server_name>` from their working directory). Returns the module names.
pub async fn generate_mcp_sources(
    server_name: &str,
    server_params: &Value,
    root_dir: &Path,
) -> Result<Vec<String>, RegisterError> {
    let host = crate::host_env::HostEnv::from_process();
    generate_mcp_sources_with(
        server_name,
        server_params,
        root_dir,
        host.vars(),
        DEFAULT_CONNECT_TIMEOUT,
        ApiStyle::Sync,
    )
    .await
}

/// [`generate_mcp_sources`] with an explicit environment (for `${VAR}`, and for finding ipybox's
/// data directory, where the registration is recorded: `IPYBOX_HOME`, `XDG_DATA_HOME`, `HOME`),
/// a connect timeout and the style of the generated `run()` functions ([`ApiStyle::Async`]:
/// `async def run`).
pub async fn generate_mcp_sources_with(
    server_name: &str,
    server_params: &Value,
    root_dir: &Path,
    env: &HashMap<String, String>,
    timeout: Duration,
    style: ApiStyle,
) -> Result<Vec<String>, RegisterError> {
    let modules = generate_only(server_name, server_params, root_dir, env, timeout, style).await?;
    let data_dir = crate::host_env::HostEnv::from_vars(env.clone()).data_dir();
    record(server_name, server_params, root_dir, data_dir.as_deref())?;
    Ok(modules)
}

/// Records the registration for the workspace that holds `root_dir`.
fn record(
    server_name: &str,
    server_params: &Value,
    root_dir: &Path,
    data_dir: Option<&Path>,
) -> Result<(), RegisterError> {
    let Some(data_dir) = data_dir else {
        return Err(RegisterError::Record(std::io::Error::other(
            "no data directory to record it in: set IPYBOX_HOME (or HOME)",
        )));
    };
    let workspace = root_dir
        .canonicalize()
        .map_err(RegisterError::Record)?
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    crate::tools::registry::Registry::for_workspace(data_dir, &workspace)
        .record(server_name, server_params)
        .map_err(RegisterError::Record)
}

/// Lists the tools and generates the package, without recording the registration (the
/// executor records it in its own registry).
pub(crate) async fn generate_only(
    server_name: &str,
    server_params: &Value,
    root_dir: &Path,
    env: &HashMap<String, String>,
    timeout: Duration,
    style: ApiStyle,
) -> Result<Vec<String>, RegisterError> {
    // Fail on a bad server name before spawning anything (rendering no tools checks the name).
    apigen::render_package(server_name, server_params, &[], style)?;
    let params = ServerParams::parse(server_params)?;
    warn_on_literal_secrets(server_name, server_params);
    let session = McpSession::connect_named(Some(server_name), &params, env, timeout).await?;
    let tools = session.list_tools().await;
    // A graceful close waits for the server to exit (stdin EOF, grace, SIGTERM): don't make the
    // caller wait for it.
    tokio::spawn(session.close());
    let specs: Vec<ToolSpec> = tools?
        .into_iter()
        .map(|t| ToolSpec {
            name: t.name.to_string(),
            description: t.description.map(|d| d.to_string()),
            input_schema: Value::Object((*t.input_schema).clone()),
            output_schema: t.output_schema.map(|s| Value::Object((*s).clone())),
        })
        .collect();
    let root = root_dir.to_path_buf();
    let name = server_name.to_string();
    let written = server_params.clone();
    tokio::task::spawn_blocking(move || {
        apigen::generate_package(&name, &written, &specs, &root, style)
    })
    .await
    .map_err(|e| ApigenError::Io {
        path: root_dir.to_path_buf(),
        source: std::io::Error::other(e),
    })?
    .map_err(RegisterError::from)
}

/// The params are written to the generated `__init__.py` as given. Values of headers and env
/// entries whose names look like credentials should be `${VAR}` placeholders; say so if not.
fn warn_on_literal_secrets(server_name: &str, params: &Value) {
    const SECRETISH: &[&str] = &["auth", "token", "key", "secret", "password", "cookie"];
    for section in ["headers", "env"] {
        let Some(map) = params.get(section).and_then(Value::as_object) else {
            continue;
        };
        for (name, value) in map {
            let lower = name.to_ascii_lowercase();
            let literal = value.as_str().is_some_and(|v| !v.contains("${"));
            if literal && SECRETISH.iter().any(|s| lower.contains(s)) {
                tracing::warn!(
                    "MCP server `{server_name}`: {section}.{name} is a literal value and will be written to the generated code; use a ${{VAR}} placeholder (set VAR in the environment or .env) to keep it out"
                );
            }
        }
    }
}
