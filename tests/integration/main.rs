//! The integration tests: one test binary (one link), a module per area, helpers once in
//! [`support`]. Every test drives real components: a real ipykernel, real MCP servers and
//! clients, real srt + bubblewrap. Tests that need prepared components (`target/test-env/`,
//! `target/sandbox-deps/`) skip with one line under plain `cargo test` and run under
//! `bash scripts/test.sh`; see [`support::ready`].
//!
//! Generated-code snapshots (exact text, no Python) live in `apigen_snapshots`, apart from the
//! tests that run generated code (`apigen`, `apigen_corpus`, `tool_calls`, `tool_calls_async`).
//!
//! # The rule of the suite: every test can fail (issue 42; also `tests/README.md`)
//!
//! - **A check that something did not happen has a control.** A file absent, a call refused, a
//!   value unreadable: the same test runs the same attack where it *does* happen (unconfined,
//!   unsandboxed, without the check, or a file next to the hidden one that nothing hides) and
//!   asserts both outcomes exactly (not `assert_ne!(x, "written")`: which error, which text).
//! - **The signal must be one the mechanism cannot fake.** A confined kernel cannot write the
//!   workspace at all, so "no file in the workspace" proves nothing about whether code ran: use
//!   a signal it can send and the host sees ([`http_support::Knock`], a loopback connection), or
//!   the other side's own record (the fixture's `FIXTURE_CALL_LOG`), not a count that was already
//!   what the assertion wants.
//! - **Hidden paths are probed where an operator's files would be**: outside `/tmp`, `$HOME`,
//!   `$TMPDIR`, `/run` and the data directory, which every confined or sandboxed kernel sees
//!   empty anyway (a probe there passes whatever ipybox hides). Use [`support::probe_dir`]
//!   (`target/p-*`, or under `/var/lib/ipyprobe` or `$IPYBOX_TEST_PROBE_DIR`) and
//!   [`http_support::read_probe`], with a visible file next to the hidden ones.
//! - **Processes are counted among all descendants.** A forked kernel is the kernel factory
//!   template's child, not ipybox's: count kernels with [`proc_tree::kernels`] over
//!   [`proc_tree::descendants`], never `children(pid)`.
//! - **Reads that fail, fail.** `read(...).unwrap_or_default()` turns "could not look" into
//!   "nothing there".
//! - **Every skip goes through [`support::skip`]** (or `require!`, `probe_dir_or_skip!`), which
//!   fails under `IPYBOX_TEST_STRICT=1` (`scripts/test.sh`); the Python SDK suite does the same
//!   (`tests/python_sdk/strict_skips.py`).
//! - **Show it once**: disable the mechanism locally (comment out the hiding line, raise the
//!   limit), watch the test fail, restore, and say so in the commit message.

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
mod cli_env;
mod cli_exec;
mod cli_flags;
mod cli_newcomer;
mod cli_units;
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
mod notebook_memory;
mod notebook_secrets;
#[cfg(target_os = "linux")]
mod pid_reuse;
mod proc_tree;
#[cfg(target_os = "linux")]
mod release_artifacts;
mod remote_kernels;
#[cfg(target_os = "linux")]
mod sandbox;
#[cfg(target_os = "linux")]
mod sandbox_environ;
#[cfg(target_os = "linux")]
mod sandbox_install;
mod sandbox_replay;
mod sandbox_resume;
mod seed_outputs;
mod shell_approval;
mod snapshot;
mod stdio_resume;
mod tenant_admission;
mod tenant_chain;
mod tenant_cleanup;
mod tenant_identity;
mod tenant_limits;
mod tenant_network;
mod tenant_quota;
mod tenant_view;
mod tool_calls;
mod tool_calls_async;
mod tool_reach;
mod tool_socket;
mod ts_client;
mod workspace_startup;
mod workspace_trust;
