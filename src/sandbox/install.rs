//! A sandboxed kernel's `install_package`: the installer (uv, or the kernel interpreter's pip)
//! runs under srt with a policy of its own, so that neither the installer nor anything it runs
//! for the package (an sdist's build backend, the interpreter it queries) runs on the host:
//!
//! - network: the package index's hosts only (srt's proxy; the host's upstream proxy as its
//!   `parentProxy`);
//! - writable: the site layer and its cache (`crate::pyenv::install::SiteLayer`) and a private
//!   temporary directory, nothing else; the kernel environment and the workspace are read-only;
//! - not readable: ipybox's data directory (except the interpreter and the layer), the
//!   credential stores of the default policy, the host's socket directories;
//! - environment: ipybox's minimal one for srt ([`super::env::outer`]) plus the host's index
//!   variables (`crate::pyenv::install::INDEX_VARS`).
//!
//! Not here: the installer's command line and which specs are accepted (`crate::pyenv`).

use std::path::{Path, PathBuf};
use std::process::Stdio;

use super::policy::{
    DEFAULT_DENY_READ_HOME, DENY_WRITE_HOME, FilesystemPolicy, HIDDEN_SOCKET_DIRS, NetworkPolicy,
    SandboxPolicy,
};
use super::shell::shell_join;
use super::{SandboxError, SandboxOptions, env, platform, wrap};
use crate::child_process::host_command;
use crate::host_env::HostEnv;

/// The prefix of an install's scratch directory (then six random characters): one letter, as
/// srt's socket names in it are long. `kernel::runtime_dir` makes room for it by the same
/// name (`INSTALL_SCRATCH_PREFIX`; the executor's tests keep the two equal): neither module
/// uses the other.
pub(crate) const SCRATCH_PREFIX: &str = "i";

/// What a sandboxed install runs and where it may write.
#[derive(Debug, Clone)]
pub(crate) struct Installer<'a> {
    /// The installer (uv, or the kernel's interpreter for pip) and its arguments.
    pub(crate) program: &'a Path,
    pub(crate) args: &'a [String],
    /// The kernel's interpreter (its directories stay readable).
    pub(crate) python: &'a Path,
    /// The directories the installer writes (the layer and its cache).
    pub(crate) writable: &'a [PathBuf],
    /// The hosts it may reach.
    pub(crate) domains: &'a [String],
    /// Extra host variables it gets (the index configuration).
    pub(crate) env_vars: &'a [&'a str],
    /// A private directory only the host writes (the executor's runtime directory), where the
    /// install's scratch directory (settings, srt's and the installer's temp) is made: never a
    /// place a sandboxed kernel can write, which could change the settings before srt reads them.
    pub(crate) scratch_in: &'a Path,
}

/// What the installer printed and whether it succeeded.
#[derive(Debug)]
pub(crate) struct InstallOutput {
    pub(crate) success: bool,
    pub(crate) stdout: Vec<u8>,
    pub(crate) stderr: Vec<u8>,
}

/// The srt settings for `installer`, with srt's temp directory `srt_tmp` (readable inside) and
/// the installer's `tmp` (writable), both in `installer.scratch_in` (hidden otherwise).
pub(crate) fn policy(
    installer: &Installer<'_>,
    host: &HostEnv,
    srt_tmp: &Path,
    tmp: &Path,
) -> SandboxPolicy {
    let scratch = installer.scratch_in;
    let disp = |p: &Path| p.display().to_string();
    let mut deny_read: Vec<String> = DEFAULT_DENY_READ_HOME
        .iter()
        .map(|p| p.to_string())
        .collect();
    if let Some(data) = host.data_dir() {
        deny_read.push(disp(&data));
    }
    if cfg!(target_os = "linux") {
        for dir in HIDDEN_SOCKET_DIRS {
            if Path::new(dir).exists() {
                deny_read.push(dir.to_string());
            }
        }
    }
    if !HIDDEN_SOCKET_DIRS.iter().any(|d| scratch.starts_with(d)) {
        deny_read.push(disp(scratch));
    }
    let mut allow_read: Vec<String> = wrap::python_dirs(installer.python, host)
        .iter()
        .map(|p| disp(p))
        .collect();
    allow_read.push(disp(srt_tmp));
    let mut allow_write: Vec<String> = installer.writable.iter().map(|p| disp(p)).collect();
    allow_write.push(disp(tmp));
    SandboxPolicy {
        network: Some(NetworkPolicy {
            allowed_domains: installer.domains.to_vec(),
            parent_proxy: env::parent_proxy(host),
            ..NetworkPolicy::default()
        }),
        filesystem: Some(FilesystemPolicy {
            deny_read,
            allow_read,
            allow_write,
            deny_write: DENY_WRITE_HOME.iter().map(|p| p.to_string()).collect(),
            ..FilesystemPolicy::default()
        }),
        ..SandboxPolicy::default()
    }
}

/// The directory of srt's package (the nearest directory above the resolved `srt` that holds a
/// `package.json`), if there is one.
fn srt_package_dir(srt: &Path) -> Option<PathBuf> {
    let real = std::fs::canonicalize(srt).ok()?;
    real.ancestors()
        .skip(1)
        .find(|d| d.join("package.json").is_file())
        .map(Path::to_path_buf)
}

/// Runs `installer` under srt (found as the kernel's sandbox finds it) and waits for it.
pub(crate) async fn run(
    options: &SandboxOptions,
    host: &HostEnv,
    installer: &Installer<'_>,
) -> Result<InstallOutput, SandboxError> {
    let srt = platform::find_srt(options.srt.as_deref(), host)?;
    platform::check(&srt, host).await?;
    let base = installer.scratch_in;
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| SandboxError::Io { path, source }
    };
    // Private (0700), removed when this install ends. A short name: srt's sockets in it are
    // long (`kernel::runtime_dir::Sockets::Sandboxed` made room for them).
    let scratch = tempfile::Builder::new()
        .prefix(SCRATCH_PREFIX)
        .rand_bytes(6)
        .tempdir_in(base)
        .map_err(io(base))?;
    let srt_tmp = scratch.path().join("srt");
    let tmp = scratch.path().join("tmp");
    for dir in [&srt_tmp, &tmp] {
        crate::safe_fs::create_private_dir(dir).map_err(io(dir))?;
    }
    let mut settings = policy(installer, host, &srt_tmp, &tmp);
    // srt's own files (its `apply-seccomp` helper) must stay readable inside, even where the
    // policy hides their directory (an srt installed under /tmp).
    if let (Some(fs), Some(dir)) = (settings.filesystem.as_mut(), srt_package_dir(&srt)) {
        fs.allow_read.push(dir.display().to_string());
    }
    let text = serde_json::to_string_pretty(&settings).map_err(|source| SandboxError::Config {
        path: scratch.path().join("settings.json"),
        reason: "cannot serialize the installer's settings".into(),
        help: "report this as a bug".into(),
        source: Some(source),
    })?;
    let settings_path = scratch.path().join("settings.json");
    crate::safe_fs::write_private(&settings_path, text.as_bytes()).map_err(io(&settings_path))?;
    let mut vars = env::outer(host, &srt_tmp, &tmp);
    for name in installer.env_vars {
        if let Some(v) = host.get(name) {
            vars.push((name.to_string(), v.to_string()));
        }
    }
    let mut argv = vec![installer.program.display().to_string()];
    argv.extend(installer.args.iter().cloned());
    tracing::info!(
        "installing in the sandbox: {} (settings {})",
        argv.join(" "),
        settings_path.display()
    );
    let out = host_command(&srt)
        .arg("--settings")
        .arg(&settings_path)
        .arg("-c")
        .arg(format!("exec {}", shell_join(&argv)))
        .env_clear()
        .envs(vars)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|source| SandboxError::Run {
            program: srt.clone(),
            help: "check that srt runs (`srt --version`)",
            source,
        })?;
    Ok(InstallOutput {
        success: out.status.success(),
        stdout: out.stdout,
        stderr: out.stderr,
    })
}

// Its one test is of the Linux policy (bubblewrap's).
#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn the_installer_writes_only_its_layer_and_reaches_only_the_index() {
        let host = HostEnv::from_vars(HashMap::from([
            ("IPYBOX_HOME".to_string(), "/data".to_string()),
            ("HOME".to_string(), "/home/u".to_string()),
        ]));
        let writable = [PathBuf::from("/data/sandbox-layers/x/site")];
        let domains = ["pypi.org".to_string()];
        let installer = Installer {
            program: Path::new("/usr/bin/uv"),
            args: &[],
            python: Path::new("/data/kernel-env/bin/python"),
            writable: &writable,
            domains: &domains,
            env_vars: &[],
            scratch_in: Path::new("/tmp/ipybox-1"),
        };
        let p = policy(
            &installer,
            &host,
            Path::new("/tmp/ipybox-1/install-x/srt"),
            Path::new("/tmp/ipybox-1/install-x/tmp"),
        );
        let v = serde_json::to_value(&p).unwrap();
        assert_eq!(
            v["filesystem"]["allowWrite"],
            serde_json::json!(["/data/sandbox-layers/x/site", "/tmp/ipybox-1/install-x/tmp"])
        );
        assert_eq!(
            v["network"]["allowedDomains"],
            serde_json::json!(["pypi.org"])
        );
        let deny = v["filesystem"]["denyRead"].as_array().unwrap();
        for p in ["/data", "~/.ssh", "~/.config", "/tmp"] {
            assert!(deny.contains(&serde_json::json!(p)), "{p}: {deny:?}");
        }
        // No unix sockets: srt's seccomp filter stays on.
        assert!(v["network"].get("allowAllUnixSockets").is_none());
    }
}
