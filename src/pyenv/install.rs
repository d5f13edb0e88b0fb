//! Installing a package for `install_package`: the installer's command (uv when it is on
//! `PATH`, else `python -I -m pip`), run on the host into the kernel's environment for an
//! unsandboxed kernel ([`install_package`]), or, for a sandboxed kernel, into a site layer of
//! its own ([`SiteLayer`]) by an installer that the sandbox runs (`crate::sandbox::install`):
//! nothing a sandboxed session installs lands where unsandboxed kernels, other workspaces or
//! the host start from.
//!
//! Not here: which specs are accepted (`super::requirement`), running under srt
//! (`crate::sandbox::install`).

use std::path::{Path, PathBuf};
use std::process::Stdio;

use super::requirement::Checked;
use super::{PyEnvError, io_err};
use crate::child_process::{host_command_blocking, tail};
use crate::host_env::HostEnv;

/// The kernel environment variable naming a sandboxed kernel's site layer: an absolute path to
/// a directory the kernel adds as a site directory (its `.pth` files processed) in front of the
/// kernel environment's site-packages. Set for sandboxed kernels only.
pub const SITE_LAYER_ENV: &str = "IPYBOX_SITE_LAYER";

/// Index hosts a sandboxed install reaches besides those of the index variables
/// ([`INDEX_VARS`]): PyPI.
pub const DEFAULT_INDEX_HOSTS: &[&str] = &["pypi.org", "files.pythonhosted.org"];

/// The host's variables that tell the installer where packages come from (and how): passed to
/// a sandboxed installer as they are, and the hosts of the URLs in them allowed by its network
/// policy.
pub const INDEX_VARS: &[&str] = &[
    "UV_INDEX_URL",
    "UV_DEFAULT_INDEX",
    "UV_INDEX",
    "UV_EXTRA_INDEX_URL",
    "UV_FIND_LINKS",
    "UV_NO_INDEX",
    "UV_INDEX_STRATEGY",
    "UV_HTTP_TIMEOUT",
    "UV_NATIVE_TLS",
    "PIP_INDEX_URL",
    "PIP_EXTRA_INDEX_URL",
    "PIP_FIND_LINKS",
    "PIP_NO_INDEX",
    "PIP_CERT",
    "PIP_DEFAULT_TIMEOUT",
];

/// Where a sandboxed kernel's installs go: `site`, the layer (written only by the sandboxed
/// installer, read by the sandboxed kernels it belongs to), and `cache`, the installer's own
/// cache (never shared with the host's or another layer's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SiteLayer {
    /// The directory the installer installs into (`--target`).
    pub site: PathBuf,
    /// The installer's cache.
    pub cache: PathBuf,
}

impl SiteLayer {
    /// The layer of `workspace` (canonical): `<data dir>/sandbox-layers/<digest of the
    /// workspace path>/{site,cache}`. The data directory is hidden from every sandboxed kernel;
    /// the sandbox re-opens this workspace's `site` for reading only.
    pub fn for_workspace(host: &HostEnv, workspace: &Path) -> Result<Self, PyEnvError> {
        use sha2::Digest;
        let digest = sha2::Sha256::digest(workspace.as_os_str().as_encoded_bytes());
        let name: String = digest[..12].iter().map(|b| format!("{b:02x}")).collect();
        let root = super::data_dir(host)?.join("sandbox-layers").join(name);
        Ok(Self::in_dir(&root))
    }

    /// A layer in `root` (`root/site`, `root/cache`): for an executor whose layer lives no
    /// longer than it does (an isolated workspace: sessions of `ipybox serve --http`).
    pub fn in_dir(root: &Path) -> Self {
        Self {
            site: root.join("site"),
            cache: root.join("cache"),
        }
    }

    /// Waits for (blocking) and takes the layer's install lock, held until the file returned is
    /// dropped: two installs into one layer (two conversations in one workspace) take turns.
    pub fn lock(&self) -> Result<std::fs::File, PyEnvError> {
        let path = self
            .site
            .parent()
            .unwrap_or(&self.site)
            .join("install.lock");
        let file = crate::safe_fs::open_lock_file(&path).map_err(io_err(&path))?;
        fs4::fs_std::FileExt::lock_exclusive(&file).map_err(io_err(&path))?;
        Ok(file)
    }

    /// Creates both directories (private to the user) if missing.
    pub fn create(&self) -> Result<(), PyEnvError> {
        for dir in [&self.site, &self.cache] {
            if let Some(parent) = dir.parent() {
                crate::safe_fs::create_private_dir(parent).map_err(io_err(parent))?;
            }
            crate::safe_fs::create_private_dir(dir).map_err(io_err(dir))?;
        }
        Ok(())
    }
}

/// The installer's program and arguments that install `spec` for `python`: into its environment,
/// or, with `layer`, into the layer (`--target`, the layer's own cache, files copied rather
/// than linked from the cache, no configuration files read).
pub fn installer_command(
    python: &Path,
    spec: &str,
    layer: Option<&SiteLayer>,
    host: &HostEnv,
) -> (PathBuf, Vec<String>) {
    let s = |v: &str| v.to_string();
    let d = |p: &Path| p.display().to_string();
    match host.find_on_path("uv") {
        Some(uv) => {
            let mut args = vec![s("pip"), s("install")];
            if let Some(layer) = layer {
                args.extend([
                    s("--no-config"),
                    s("--target"),
                    d(&layer.site),
                    s("--cache-dir"),
                    d(&layer.cache),
                    s("--link-mode"),
                    s("copy"),
                ]);
            }
            args.extend([s("--python"), d(python), s(spec)]);
            (uv, args)
        }
        None => {
            let mut args = vec![
                s("-I"),
                s("-m"),
                s("pip"),
                s("install"),
                s("--disable-pip-version-check"),
            ];
            if let Some(layer) = layer {
                args.extend([
                    s("--no-input"),
                    s("--upgrade"),
                    s("--target"),
                    d(&layer.site),
                    s("--cache-dir"),
                    d(&layer.cache),
                ]);
            }
            args.push(s(spec));
            (python.to_path_buf(), args)
        }
    }
}

/// The hosts a sandboxed installer must reach: PyPI's and those of the index variables' URLs.
pub fn index_hosts(host: &HostEnv) -> Vec<String> {
    let mut hosts: Vec<String> = DEFAULT_INDEX_HOSTS.iter().map(|h| h.to_string()).collect();
    for var in INDEX_VARS {
        let Some(value) = host.get(var) else {
            continue;
        };
        // Lists are space- (pip, uv) or comma-separated; uv's `UV_INDEX` entries may be named
        // (`name=url`).
        for word in value.split([' ', ',', '\n']) {
            let url = word.split_once('=').map_or(word, |(_, u)| u);
            if let Ok(url) = url::Url::parse(url)
                && let Some(h) = url.host_str()
                && !hosts.iter().any(|k| k == h)
            {
                hosts.push(h.to_string());
            }
        }
    }
    hosts
}

/// Installs `spec` (a requirement such as `numpy`, `numpy>=2`, or a `git+https://…` URL) into
/// the environment of `python` on the host, with uv when it is on PATH, else pip: what an
/// unsandboxed kernel's `install_package` does (a sandboxed kernel's never runs this). Returns
/// the installer's summary (the last lines of its output). Runs from `/` (so no
/// `uv.toml`/`pyproject.toml` of a working directory is read) and, for pip, as
/// `python -I -m pip`.
pub fn install_package(python: &Path, spec: &str, host: &HostEnv) -> Result<String, PyEnvError> {
    let checked = Checked::unsandboxed(spec)?;
    let (program, args) = installer_command(python, &checked.spec, None, host);
    let out = host_command_blocking(&program)
        .args(&args)
        .stdin(Stdio::null())
        .output()
        .map_err(io_err(&program))?;
    installer_result(
        &checked.spec,
        &program,
        &args,
        out.status.success(),
        &out.stdout,
        &out.stderr,
    )
}

/// The installer's summary, or the error naming its command and output.
pub fn installer_result(
    spec: &str,
    program: &Path,
    args: &[String],
    success: bool,
    stdout: &[u8],
    stderr: &[u8],
) -> Result<String, PyEnvError> {
    let mut text = String::from_utf8_lossy(stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(stderr));
    if !success {
        return Err(PyEnvError::InstallFailed {
            spec: spec.to_string(),
            command: format!("{} {}", program.display(), args.join(" ")),
            output: tail(text.as_bytes()),
        });
    }
    Ok(tail(text.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn index_hosts_come_from_the_index_variables() {
        let host = HostEnv::from_vars(HashMap::from([
            (
                "PIP_EXTRA_INDEX_URL".to_string(),
                "https://a.example/simple https://u:p@b.example:8443/x".to_string(),
            ),
            (
                "UV_INDEX".to_string(),
                "corp=https://c.example/s".to_string(),
            ),
            ("PIP_FIND_LINKS".to_string(), "/opt/wheels".to_string()),
        ]));
        assert_eq!(
            index_hosts(&host),
            [
                "pypi.org",
                "files.pythonhosted.org",
                "c.example",
                "a.example",
                "b.example"
            ]
        );
    }

    #[test]
    fn layers_are_per_workspace() {
        let host = HostEnv::from_vars(HashMap::from([(
            "IPYBOX_HOME".to_string(),
            "/data".to_string(),
        )]));
        let a = SiteLayer::for_workspace(&host, Path::new("/w/a")).unwrap();
        let b = SiteLayer::for_workspace(&host, Path::new("/w/b")).unwrap();
        assert_ne!(a, b);
        assert!(a.site.starts_with("/data/sandbox-layers/") && a.site.ends_with("site"));
        assert_eq!(a.site.parent(), a.cache.parent());
    }
}
