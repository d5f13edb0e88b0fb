//! The integration tests: one test binary (one link), a module per area, helpers once in
//! [`support`]. Every test drives real components: a real ipykernel, real MCP servers and
//! clients, real srt + bubblewrap. Tests that need prepared components (`target/test-env/`,
//! `target/sandbox-deps/`) skip with one line under plain `cargo test` and run under
//! `bash scripts/test.sh`; see [`support::ready`].
//!
//! Generated-code snapshots (exact text, no Python) live in `apigen_snapshots`, apart from the
//! tests that run generated code (`apigen`, `apigen_corpus`, `tool_calls`, `tool_calls_async`).

// These start fixtures and ipybox itself, not host children of ipybox (clippy.toml).
#![allow(clippy::disallowed_methods)]

mod apigen_cli;
mod http_support;
mod mcp_eras;
mod support;

mod apigen;
mod apigen_corpus;
mod apigen_snapshots;
mod approval_prompts;
mod cli_exec;
mod codeact_example;
mod hardening;
#[cfg(target_os = "linux")]
mod host_confinement;
mod http_confinement;
mod http_density;
mod http_hibernate;
mod http_replicas;
mod http_service;
mod http_survive;
mod jupyter_servers;
mod kernel;
mod kernel_env;
mod kernel_factory;
mod mcp_approvals;
mod mcp_client;
mod mcp_modern;
mod mcp_server;
mod notebook;
#[cfg(target_os = "linux")]
mod pid_reuse;
mod proc_tree;
mod remote_kernels;
#[cfg(target_os = "linux")]
mod sandbox;
#[cfg(target_os = "linux")]
mod sandbox_environ;
#[cfg(target_os = "linux")]
mod sandbox_install;
mod sandbox_resume;
mod shell_approval;
mod snapshot;
mod stdio_resume;
mod tool_calls;
mod tool_calls_async;
mod tool_reach;
mod tool_socket;
mod ts_client;
mod workspace_startup;
