//! What the host adds to a session's environment: `register_mcp_server` (generated modules
//! and the host's record of the server, the trust rule) and `install_package` (into the
//! kernel's Python environment, then the kernel's import caches refreshed). Not here: code
//! generation (`crate::register`, `crate::apigen`), the installers (`crate::pyenv`).

use std::path::PathBuf;
use std::time::Duration;

use super::{CodeExecutor, ExecutorError};
use crate::apigen::ApiStyle;
use crate::kernel::KernelError;
use crate::register::RegisterError;
use crate::tools::DEFAULT_CONNECT_TIMEOUT;
// Named in doc links only.
#[cfg(doc)]
use super::CodeExecutorBuilder;

impl CodeExecutor {
    /// Registers an MCP server: generates `<workspace>/mcptools/<server_name>/` from its tools
    /// (see [`crate::generate_mcp_sources`]) and records the params on the host for
    /// `<workspace>/mcptools`: kernel code may only call servers registered for a directory it
    /// imports from (here: its workspace), with the recorded params. `${VAR}`
    /// placeholders are resolved from the builder's `tool_env` (default: the process env).
    /// Does not wait for a running execution. Returns the module names.
    pub async fn register_mcp_server(
        &self,
        server_name: &str,
        server_params: &serde_json::Value,
    ) -> Result<Vec<String>, RegisterError> {
        let root = self
            .workspace()
            .map_err(|e| RegisterError::Workspace(e.into()))?
            .join("mcptools");
        let timeout = self
            .inner
            .builder
            .connect_timeout
            .unwrap_or(DEFAULT_CONNECT_TIMEOUT);
        if let Some(options) = &self.inner.builder.sandbox {
            // The host starts this server outside the sandbox: none of it may live where the
            // sandboxed kernel writes.
            let workspace = root.parent().unwrap_or(&root);
            let (policy, _) = crate::sandbox::load_policy(options, workspace)
                .await
                .map_err(|e| RegisterError::Workspace(e.into()))?;
            let home = self.host_env().get("HOME").map(PathBuf::from);
            let writable = policy.writable_roots(workspace, home.as_deref());
            crate::register::refuse_writable_paths(
                server_name,
                server_params,
                &self.tool_env(),
                &writable,
            )?;
        }
        let modules = crate::register::generate_only(
            server_name,
            server_params,
            &root,
            &self.tool_env(),
            timeout,
            ApiStyle::Sync,
        )
        .await?;
        let registry = self
            .registry()
            .map_err(|e| RegisterError::Workspace(e.into()))?;
        // `root` was written without following a link at `mcptools` (and the workspace is
        // canonical): it is the registration's directory as it stands.
        registry
            .record(server_name, &root, server_params)
            .map_err(RegisterError::Record)?;
        Ok(modules)
    }

    /// Installs `spec` (`numpy`, `numpy>=2`, `git+https://…`) into the kernel's Python environment
    /// on the host (uv when on PATH, else pip), also when the kernel is sandboxed, and refreshes
    /// the kernel's import caches so the package imports without a reset. Starts the executor if
    /// needed; does not wait for a running cell to install. Returns the installer's summary.
    ///
    /// With [`CodeExecutorBuilder::kernel_gateway`] there is no local kernel environment: this
    /// fails with a message that says to add the package to the server's kernel image.
    pub async fn install_package(&self, spec: &str) -> Result<String, ExecutorError> {
        if self.inner.builder.kernel_gateway.is_some() {
            return Err(KernelError::Start {
                reason: format!(
                    "cannot install `{spec}`: the kernels run on a Jupyter server, whose kernel image holds their packages"
                ),
                help: "add the package to the server's kernel image, or run `%pip install PACKAGE` in a cell if that image has pip".into(),
            }
            .into());
        }
        self.start().await?;
        let python = self.python().await.ok_or(KernelError::Stopped)?;
        let owned = spec.to_string();
        let host = self.host_env().clone();
        // A sandboxed kernel can write local paths (the workspace): building one would run its
        // code on the host.
        let sandboxed = self.inner.builder.sandbox.is_some();
        let summary = tokio::task::spawn_blocking(move || {
            if sandboxed {
                crate::pyenv::install_package_from_remote(&python, &owned, &host)
            } else {
                crate::pyenv::install_package(&python, &owned, &host)
            }
        })
        .await
        .map_err(|source| ExecutorError::Task {
            what: "installing a package",
            source,
        })??;
        // Kernels started from now on (spares, the factory's template) import afresh.
        if let Some(running) = self.inner.state.lock().await.as_mut() {
            running.pool.refresh_after_install();
        }
        // New distributions become importable once the import system's caches are fresh.
        let refresh = "import importlib as _i; _i.invalidate_caches(); del _i";
        if let Err(e) = self
            .execute_inner(refresh, Some(Duration::from_secs(30)), false)
            .await
        {
            tracing::warn!("could not refresh the kernel's import caches: {e}");
        }
        if let Some(notebook) = &self.inner.notebook {
            notebook.note_install(spec);
        }
        Ok(summary)
    }
}
