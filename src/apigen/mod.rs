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

use crate::safe_fs::{Kind, NoFollowDir};

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
/// failed run leaves any previous package untouched. `root_dir` is created if missing and its
/// `__init__.py` is written anew. `server_params` are written as given (no secrets should be
/// in them; `${VAR}` placeholders stay as written).
///
/// Nothing below `root_dir`'s parent is followed if it is a symbolic link: `root_dir` or the
/// server's folder being a link is an error, files are created new (never through a link), and
/// the previous package is removed without following links in it. (`root_dir` is usually
/// `<workspace>/mcptools`, which a sandboxed kernel cannot write, but an older ipybox's could.)
pub fn generate_package(
    server_name: &str,
    server_params: &serde_json::Value,
    tools: &[ToolSpec],
    root_dir: &Path,
    style: ApiStyle,
) -> Result<Vec<String>, ApigenError> {
    generate_package_files(server_name, server_params, tools, root_dir, style)
        .map(|(modules, _)| modules)
}

/// What [`generate_package_files`] wrote: paths relative to its `root_dir`, and contents.
pub type GeneratedFiles = Vec<(PathBuf, String)>;

/// [`generate_package`], also returning what it wrote: each file's path relative to
/// `root_dir` (`<server_name>/<module>.py` and `__init__.py`) and its
/// content, for the host's record of generated code (`crate::workspace_trust`).
pub fn generate_package_files(
    server_name: &str,
    server_params: &serde_json::Value,
    tools: &[ToolSpec],
    root_dir: &Path,
    style: ApiStyle,
) -> Result<(Vec<String>, GeneratedFiles), ApigenError> {
    let RenderedPackage { files, modules } =
        render_package(server_name, server_params, tools, style)?;
    let mut generated: Vec<(PathBuf, String)> = files
        .iter()
        .map(|(name, src)| (Path::new(server_name).join(name), src.clone()))
        .collect();
    let root = NoFollowDir::open(root_dir, Some(0o755)).map_err(io_err(root_dir))?;
    // The package root's `__init__.py` is generated too: written anew each time (atomically; a
    // link in its place is replaced, never followed), so registering again also undoes what
    // anyone else wrote there.
    let root_init = root_dir.join("__init__.py");
    let init = render::render_root_init()?;
    root.rewrite("__init__.py", init.as_bytes(), 0o644)
        .map_err(io_err(&root_init))?;
    generated.push(("__init__.py".into(), init));
    let target = root_dir.join(server_name);
    if let Some(kind) = root.kind(server_name).map_err(io_err(&target))?
        && kind != Kind::Dir
    {
        return Err(io_err(&target)(std::io::Error::other(format!(
            "{} is {}, not a directory ipybox generated; remove it",
            target.display(),
            if kind == Kind::Symlink {
                "a symbolic link (ipybox never writes or deletes through links here: code in a sandboxed kernel can plant them)"
            } else {
                "not a directory"
            }
        ))));
    }
    let tmp = format!(".{server_name}.new-{:08x}", rand::random::<u32>());
    let written = root
        .subdir(&tmp, Some(0o755))
        .and_then(|dir| {
            files
                .iter()
                .try_for_each(|(name, src)| dir.create_new(name, src.as_bytes(), 0o644))
        })
        .map_err(io_err(&root_dir.join(&tmp)));
    if let Err(e) = written {
        let _ = root.remove_tree(&tmp);
        return Err(e);
    }
    let old = format!(".{server_name}.old-{:08x}", rand::random::<u32>());
    let had_old = match root.rename(server_name, &old) {
        Ok(()) => true,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
        Err(e) => {
            let _ = root.remove_tree(&tmp);
            return Err(io_err(&target)(e));
        }
    };
    if let Err(e) = root.rename(&tmp, server_name) {
        if had_old {
            let _ = root.rename(&old, server_name);
        }
        let _ = root.remove_tree(&tmp);
        return Err(io_err(&target)(e));
    }
    if had_old && let Err(e) = root.remove_tree(&old) {
        tracing::warn!(
            "could not remove the previous package {}: {e}",
            root_dir.join(&old).display()
        );
    }
    Ok((modules, generated))
}
