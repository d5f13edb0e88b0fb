//! What the host adds to a session's environment: `register_mcp_server` (generated modules
//! and the host's record of the server, the trust rule) and `install_package` (into the
//! kernel's Python environment, then the kernel's import caches refreshed). Not here: code
//! generation (`crate::register`, `crate::apigen`), the installers (`crate::pyenv`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{CodeExecutor, ExecutorError};
use crate::apigen::ApiStyle;
use crate::kernel::KernelError;
use crate::pyenv::install::SiteLayer;
use crate::pyenv::requirement::Checked;
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
            self.host_env().data_dir().as_deref(),
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

    /// Installs `spec` into the kernel's Python environment and refreshes the kernel's import
    /// caches so the package imports without a reset. Starts the executor if needed; does not
    /// wait for a running cell to install. Returns the installer's summary.
    ///
    /// - Unsandboxed: `spec` (`numpy`, `numpy>=2`, `git+https://…`, a path) is installed on the
    ///   host into the kernel's environment (uv when on PATH, else pip).
    /// - Sandboxed: `spec` must be a PEP 508 requirement naming a package of the index (name,
    ///   extras, version, markers; `https://`/`git+https://` URLs only with
    ///   [`CodeExecutorBuilder::allow_install_urls`], local sources never). The installer runs
    ///   inside the sandbox (`crate::sandbox::install`), reaching only the index, and installs
    ///   into the workspace's site layer ([`crate::pyenv::install::SiteLayer`]), which only this
    ///   workspace's sandboxed kernels import from: never into the kernel environment.
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
        // Refused specs are refused before anything starts.
        let sandbox = self.inner.builder.sandbox.clone();
        let checked = match &sandbox {
            Some(_) => Checked::sandboxed(spec, self.inner.builder.allow_install_urls)?,
            None => Checked::unsandboxed(spec)?,
        };
        self.start().await?;
        let python = self.python().await.ok_or(KernelError::Stopped)?;
        let host = self.host_env().clone();
        let summary = match &sandbox {
            Some(options) => {
                let runtime = self
                    .inner
                    .state
                    .lock()
                    .await
                    .as_ref()
                    .map(|r| r.runtime.path().to_path_buf())
                    .ok_or(KernelError::Stopped)?;
                let layer = self.site_layer(&runtime)?;
                layer.create()?;
                let locking = layer.clone();
                let _lock = tokio::task::spawn_blocking(move || locking.lock())
                    .await
                    .map_err(|source| ExecutorError::Task {
                        what: "waiting for another install into the site layer",
                        source,
                    })??;
                let (program, args) = crate::pyenv::install::installer_command(
                    &python,
                    &checked.spec,
                    Some(&layer),
                    &host,
                );
                let mut domains = crate::pyenv::install::index_hosts(&host);
                domains.extend(checked.url_host.clone());
                let writable = [layer.site.clone(), layer.cache.clone()];
                let out = crate::sandbox::install::run(
                    options,
                    &host,
                    &crate::sandbox::install::Installer {
                        program: &program,
                        args: &args,
                        python: &python,
                        writable: &writable,
                        domains: &domains,
                        env_vars: crate::pyenv::install::INDEX_VARS,
                        scratch_in: &runtime,
                    },
                )
                .await?;
                crate::pyenv::install::installer_result(
                    &checked.spec,
                    &program,
                    &args,
                    out.success,
                    &out.stdout,
                    &out.stderr,
                )?
            }
            None => {
                let spec = checked.spec.clone();
                tokio::task::spawn_blocking(move || {
                    crate::pyenv::install_package(&python, &spec, &host)
                })
                .await
                .map_err(|source| ExecutorError::Task {
                    what: "installing a package",
                    source,
                })??
            }
        };
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

    /// Where this executor's sandboxed installs go: the workspace's layer in ipybox's data
    /// directory, or, when the workspace is isolated (each session of `ipybox serve --http`,
    /// where the workspace must not be a channel between sessions), a layer in the executor's
    /// runtime directory that goes with it.
    pub(super) fn site_layer(&self, runtime: &Path) -> Result<SiteLayer, ExecutorError> {
        let isolated = self
            .inner
            .builder
            .sandbox
            .as_ref()
            .is_some_and(|o| o.isolate_workspace);
        if isolated {
            return Ok(SiteLayer::in_dir(&runtime.join("site-layer")));
        }
        Ok(SiteLayer::for_workspace(
            self.host_env(),
            &self.workspace()?,
        )?)
    }
}

#[cfg(test)]
mod tests {
    /// The sandboxed installer's scratch directory is named as the runtime directory made room
    /// for (the two modules do not use each other; the executor composes both).
    #[test]
    fn the_install_scratch_prefix_is_the_one_runtime_directories_fit() {
        assert_eq!(
            crate::sandbox::install::SCRATCH_PREFIX,
            crate::kernel::runtime_dir::INSTALL_SCRATCH_PREFIX
        );
    }
}
