//! Registering an MCP server: list its tools over a short-lived session, generate the typed
//! Python package for them (`<root_dir>/<server_name>/`), and record the params on the host for
//! `root_dir` (kernels may only call servers registered for a directory they import from, with
//! these params: `crate::tools::registry`).
//!
//! This is where the MCP client ([`crate::tools`]) meets code generation ([`crate::apigen`]);
//! neither knows the other.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

use crate::apigen::{self, ApiStyle, ApigenError, ToolSpec};
use crate::tools::registry;
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
    /// With a sandboxed kernel, the server would run code from a place the kernel can write.
    #[error(
        "MCP server `{server}` would run from {path}, inside {root}, which the sandboxed kernel can write: the host would start code the kernel may have changed\n  help: move the server (its script, its working directory, what its env points at) out of the workspace, e.g. to ~/mcp-servers/, or run ipybox without --sandbox"
    )]
    InWritablePlace {
        server: String,
        path: PathBuf,
        root: PathBuf,
    },
}

/// For a sandboxed kernel's executor: refuses a stdio server whose `cwd`, `command`, arguments or
/// `env` values name a path inside one of `writable` (the directories the kernel can write). The
/// host starts that server outside the sandbox, so a script, module or working directory there
/// is code the kernel could have rewritten. `${VAR}` placeholders are resolved from `env` where
/// they can be; paths are absolute ones, `--opt=/path` forms and `:`-separated lists. HTTP
/// servers run nothing on the host.
pub(crate) fn refuse_writable_paths(
    server_name: &str,
    server_params: &Value,
    env: &HashMap<String, String>,
    writable: &[PathBuf],
) -> Result<(), RegisterError> {
    let Some(obj) = server_params.as_object() else {
        return Ok(());
    };
    if obj.get("command").is_none() {
        return Ok(());
    }
    let mut words: Vec<String> = Vec::new();
    let mut push = |v: &Value| {
        if let Some(s) = v.as_str() {
            let resolved = crate::tools::env_subst::substitute_str(s, env, "", &mut Vec::new())
                .unwrap_or_else(|_| s.to_string());
            words.push(resolved);
        }
    };
    for key in ["command", "cwd"] {
        if let Some(v) = obj.get(key) {
            push(v);
        }
    }
    for v in obj
        .get("args")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        push(v);
    }
    for v in obj
        .get("env")
        .and_then(Value::as_object)
        .into_iter()
        .flat_map(|m| m.values())
    {
        push(v);
    }
    let cwd = obj
        .get("cwd")
        .and_then(Value::as_str)
        .map(PathBuf::from)
        .filter(|c| c.is_absolute());
    for word in &words {
        let candidates = word
            .split(':')
            .chain(word.split_once('=').map(|(_, v)| v))
            .map(Path::new)
            .filter_map(|p| {
                if p.is_absolute() {
                    Some(p.to_path_buf())
                } else if p.components().count() > 1 || p.starts_with(".") {
                    cwd.as_ref().map(|c| c.join(p))
                } else {
                    None
                }
            });
        for path in candidates {
            let real = path.canonicalize().unwrap_or_else(|_| path.clone());
            if let Some(root) = writable.iter().find(|r| real.starts_with(r)) {
                return Err(RegisterError::InWritablePlace {
                    server: server_name.to_string(),
                    path,
                    root: root.clone(),
                });
            }
        }
    }
    Ok(())
}

/// Generates `<root_dir>/<server_name>/` from the tools of the server at `server_params`, with
/// `${VAR}` placeholders resolved from the process environment, with synchronous `run()`
/// functions, and registers the server for `root_dir` (relative to the current directory):
/// kernels whose executor imports from `root_dir` (`import <server_name>`) or from its parent
/// (`import mcptools.<server_name>` for `root_dir = <workspace>/mcptools`) — its workspace,
/// or an entry of `kernel_env`'s `PYTHONPATH` — may call it. Returns the module names.
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
    let data_dir = crate::host_env::HostEnv::from_vars(env.clone()).data_dir();
    let modules = generate_only(
        server_name,
        server_params,
        root_dir,
        env,
        timeout,
        style,
        data_dir.as_deref(),
    )
    .await?;
    record(server_name, server_params, root_dir, data_dir.as_deref())?;
    Ok(modules)
}

/// Records the registration of a package another generator wrote into `root_dir/<server_name>/`
/// (mcpygen, which Python ipybox 0.9 and freeact use; the Python package calls this after it),
/// without connecting to the server: kernels that import from `root_dir` or its parent may then
/// call it with these params, as after [`generate_mcp_sources_with`]. `env` finds the data
/// directory (`IPYBOX_HOME`, ...). The params must parse as server params.
pub fn register_generated(
    server_name: &str,
    server_params: &Value,
    root_dir: &Path,
    env: &HashMap<String, String>,
) -> Result<(), RegisterError> {
    ServerParams::parse(server_params)?;
    let data_dir = crate::host_env::HostEnv::from_vars(env.clone()).data_dir();
    record(server_name, server_params, root_dir, data_dir.as_deref())
}

/// Records the registration for `root_dir`: kernels that import from `root_dir` or its parent
/// reach it (`crate::tools::registry`).
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
    let root = registry::registration_root(root_dir).map_err(RegisterError::Record)?;
    crate::safe_fs::create_private_dir(data_dir).map_err(RegisterError::Record)?;
    registry::Registry::open(data_dir)
        .record(server_name, &root, server_params)
        .map_err(RegisterError::Record)
}

/// Lists the tools and generates the package, without recording the registration (the
/// executor records it in its own registry). What it wrote is recorded as generated in the
/// trust ledger of `data_dir` ([`crate::workspace_trust`]): a trusted kernel imports it even
/// when it was written while a sandboxed kernel ran.
pub(crate) async fn generate_only(
    server_name: &str,
    server_params: &Value,
    root_dir: &Path,
    env: &HashMap<String, String>,
    timeout: Duration,
    style: ApiStyle,
    data_dir: Option<&Path>,
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
    let (modules, files) = tokio::task::spawn_blocking(move || {
        apigen::generate_package_files(&name, &written, &specs, &root, style)
    })
    .await
    .map_err(|e| ApigenError::Io {
        path: root_dir.to_path_buf(),
        source: std::io::Error::other(e),
    })??;
    if let Some(data_dir) = data_dir {
        // `root_dir` was just written without following a link: its canonical form is what a
        // kernel's import finds.
        let root = root_dir.canonicalize().map_err(RegisterError::Record)?;
        let files: Vec<(PathBuf, Vec<u8>)> = files
            .into_iter()
            .map(|(rel, src)| (root.join(rel), src.into_bytes()))
            .collect();
        let ledger = crate::workspace_trust::Ledger::in_data_dir(data_dir);
        crate::workspace_trust::record_generated(&ledger, &files).map_err(RegisterError::Record)?;
    }
    Ok(modules)
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn servers_that_would_run_from_the_workspace_are_refused() {
        let ws = tempfile::tempdir().unwrap();
        let ws = ws.path().canonicalize().unwrap();
        std::fs::create_dir(ws.join("srv")).unwrap();
        let roots = vec![ws.clone()];
        let env = HashMap::from([("WS".to_string(), ws.display().to_string())]);
        let w = ws.display();
        for params in [
            json!({"command": "python", "args": ["-m", "echosrv"], "cwd": ws}),
            json!({"command": "python", "args": ["-m", "echosrv"], "cwd": "${WS}/srv"}),
            json!({"command": "python", "args": [format!("{w}/server.py")]}),
            json!({"command": format!("{w}/bin/server")}),
            json!({"command": "node", "args": [format!("--require={w}/x.js")]}),
            json!({"command": "python", "args": ["-m", "x"], "env": {"PYTHONPATH": format!("/usr/lib:{w}/lib")}}),
            json!({"command": "python", "args": [format!("{}/srv/x.py", ws.file_name().unwrap().to_string_lossy())], "cwd": ws.parent().unwrap()}),
        ] {
            let Err(err) = refuse_writable_paths("s", &params, &env, &roots) else {
                panic!("not refused: {params}")
            };
            assert!(
                err.to_string()
                    .contains("which the sandboxed kernel can write"),
                "{params}: {err}"
            );
        }
        for params in [
            json!({"command": "python", "args": ["-m", "echosrv"]}),
            json!({"command": "/usr/bin/python3", "args": ["/opt/srv/x.py", "--flag=1"]}),
            json!({"url": format!("http://localhost/{w}")}),
        ] {
            refuse_writable_paths("s", &params, &env, &roots).unwrap();
        }
    }
}
