//! MCP tool definitions -> a typed Python API (pydantic v2 models), one package per server.
//!
//! [`generate_package`] writes `root_dir/<server>/__init__.py` (the server's `runner`) and one
//! module per tool with `Params`, `Result` (if the tool has an outputSchema), named classes for
//! nested objects and enums, and `run()` — a plain function, or with [`ApiStyle::Async`] an
//! `async def` the kernel awaits. The conversion rules and their limits are in
//! `docs/apigen.md`. This module does not talk to MCP servers (the caller lists the tools) and
//! does not run Python; the generated code calls the host through `ipybox_runtime`.
//!
//! Layout: `schema.rs` (JSON Schema -> type model), `naming.rs` (Python names),
//! `pyliteral.rs` (escaping), `pattern.rs` (regex portability), `render.rs` (templates).

mod naming;
mod pattern;
mod pyliteral;
mod render;
mod schema;

pub use pyliteral::{py_literal, py_str};

use std::path::{Path, PathBuf};

/// The shape of the generated `run()` functions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ApiStyle {
    /// `def run(params) -> Result`: blocks until the tool call returns.
    #[default]
    Sync,
    /// `async def run(params) -> Result`: awaited in the kernel (top-level `await` works), so
    /// many calls can be in flight at once (`asyncio.gather`) without blocking the kernel's
    /// event loop.
    Async,
}

/// One MCP tool as listed by its server.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct ToolSpec {
    pub name: String,
    pub description: Option<String>,
    #[serde(rename = "inputSchema")]
    pub input_schema: serde_json::Value,
    #[serde(
        rename = "outputSchema",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub output_schema: Option<serde_json::Value>,
}

#[derive(thiserror::Error, Debug)]
pub enum ApigenError {
    #[error(
        "invalid MCP server name {name:?}: {reason}; choose a name that is a Python identifier \
         (e.g. `github`, `my_server`), it becomes the package `mcptools.<name>`"
    )]
    InvalidServerName { name: String, reason: String },
    #[error("cannot generate a module for tool {tool:?} of server `{server}`: {message}")]
    InvalidSchema {
        server: String,
        tool: String,
        message: String,
    },
    #[error("cannot write the generated package at {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("internal error rendering generated code (a bug in ipybox's apigen templates): {0}")]
    Template(#[from] minijinja::Error),
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> ApigenError + '_ {
    move |source| ApigenError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The Python module name of each tool, in tool order (see `docs/apigen.md` for the rules).
pub fn module_names(tools: &[ToolSpec]) -> Vec<String> {
    naming::module_names(tools.iter().map(|t| t.name.as_str()))
}

/// A package rendered in memory.
#[derive(Debug)]
pub struct RenderedPackage {
    /// `(file name, Python source)`, `__init__.py` first, then one module per tool.
    pub files: Vec<(String, String)>,
    /// Module names in tool order.
    pub modules: Vec<String>,
}

/// Renders the package in memory; nothing is written. Same checks as [`generate_package`].
pub fn render_package(
    server_name: &str,
    server_params: &serde_json::Value,
    tools: &[ToolSpec],
    style: ApiStyle,
) -> Result<RenderedPackage, ApigenError> {
    naming::check_server_name(server_name).map_err(|reason| ApigenError::InvalidServerName {
        name: server_name.to_string(),
        reason,
    })?;
    let modules = module_names(tools);
    let mut files = Vec::with_capacity(tools.len() + 1);
    let index: Vec<(String, Option<&str>)> = modules
        .iter()
        .zip(tools)
        .map(|(m, t)| (m.clone(), t.description.as_deref()))
        .collect();
    files.push((
        "__init__.py".to_string(),
        render::render_init(server_name, server_params, &index, style)?,
    ));
    for (tool, module) in tools.iter().zip(&modules) {
        let model =
            schema::build_module(&tool.name, &tool.input_schema, tool.output_schema.as_ref())
                .map_err(|message| ApigenError::InvalidSchema {
                    server: server_name.to_string(),
                    tool: tool.name.clone(),
                    message,
                })?;
        let src = render::render_module(
            server_name,
            &tool.name,
            tool.description.as_deref(),
            &model,
            style,
        )?;
        files.push((format!("{module}.py"), src));
    }
    Ok(RenderedPackage { files, modules })
}

/// Writes `root_dir/<server_name>/__init__.py` and one module per tool, with `run()` functions
/// in the given `style`; returns the module names in tool order.
///
/// The package is written to a temporary directory inside `root_dir` and swapped in, so a
/// failed run leaves any previous package untouched. `root_dir` is created if missing and gets
/// an `__init__.py` if it has none. `server_params` are written as given (no secrets should be
/// in them; `${VAR}` placeholders stay as written).
pub fn generate_package(
    server_name: &str,
    server_params: &serde_json::Value,
    tools: &[ToolSpec],
    root_dir: &Path,
    style: ApiStyle,
) -> Result<Vec<String>, ApigenError> {
    let RenderedPackage { files, modules } =
        render_package(server_name, server_params, tools, style)?;
    std::fs::create_dir_all(root_dir).map_err(io_err(root_dir))?;
    let root_init = root_dir.join("__init__.py");
    if !root_init.exists() {
        std::fs::write(&root_init, render::render_root_init()?).map_err(io_err(&root_init))?;
    }
    let tmp = tempfile::Builder::new()
        .prefix(&format!(".{server_name}.new-"))
        .tempdir_in(root_dir)
        .map_err(io_err(root_dir))?;
    for (name, src) in &files {
        let path = tmp.path().join(name);
        std::fs::write(&path, src).map_err(io_err(&path))?;
    }
    let target = root_dir.join(server_name);
    let old = if target.exists() {
        let old = tempfile::Builder::new()
            .prefix(&format!(".{server_name}.old-"))
            .tempdir_in(root_dir)
            .map_err(io_err(root_dir))?;
        // Rename over the (empty) placeholder directory.
        std::fs::rename(&target, old.path()).map_err(io_err(&target))?;
        Some(old)
    } else {
        None
    };
    let tmp_path = tmp.keep();
    if let Err(e) = std::fs::rename(&tmp_path, &target) {
        if let Some(old) = &old {
            let _ = std::fs::rename(old.path(), &target);
        }
        let _ = std::fs::remove_dir_all(&tmp_path);
        return Err(io_err(&target)(e));
    }
    drop(old); // removes the previous package
    Ok(modules)
}
