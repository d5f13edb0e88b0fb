//! ipybox: a code-execution sandbox for agents that act by writing Python.
//!
//! Agent code runs in a stateful IPython kernel ([`kernel`]); the tools of any MCP server become a
//! typed Python API ([`apigen`]) whose calls cross to the host ([`tools`]) where the application
//! approves or rejects them. [`executor::CodeExecutor`] composes these pieces; it is the SDK.
//! See `docs/architecture.md` for the map.

pub mod apigen;
mod child_process;
pub mod confine;
pub mod executor;
mod group_leader;
pub mod host_env;
mod json_kind;
pub mod kernel;
pub mod log_text;
pub mod notebook;
pub(crate) mod pause;
pub mod pyenv;
pub mod redact;
pub mod register;
pub(crate) mod runtime_layout;
pub(crate) mod safe_fs;
pub mod sandbox;
pub mod snapshot;
pub mod tools;
pub mod workspace_trust;

pub use executor::CodeExecutor;

/// The skills this repository ships (`skills/`: the `codeact` skill), embedded at build time:
/// the MCP server serves them over the skills extension from the same files the Claude Code
/// plugin marketplace installs.
pub static SKILLS: include_dir::Dir<'static> =
    include_dir::include_dir!("$CARGO_MANIFEST_DIR/skills");
pub use register::{generate_mcp_sources, generate_mcp_sources_with, register_generated};
