//! Sandboxed kernels: the srt (Anthropic's sandbox-runtime) policy and the command wrapping.
//!
//! [`prepare`] checks that the sandbox can run (srt; on Linux also bubblewrap, socat, ripgrep and
//! working user namespaces), loads the user's policy (an srt settings file) or the default one,
//! adds what ipybox itself needs under any policy (see [`effective_settings`] and
//! `docs/sandbox.md`), writes the result into the runtime directory and returns the
//! [`CommandWrapper`] that runs the kernel command under `srt --settings FILE -c 'COMMAND'`.
//!
//! Not here: launching, interrupting and killing the kernel (see `kernel/process.rs`; interrupts go
//! over the control channel, which works inside the sandbox) and sandboxing MCP servers (those
//! use `srt` as their command, see `docs/sandbox.md`). This module never falls back to running
//! unsandboxed: when something is missing, [`prepare`] fails and says what to install.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use serde_json::{Map, Value, json};

use crate::kernel::CommandWrapper;

/// The srt release ipybox is tested with (`scripts/sandbox-deps.sh` installs it).
pub const SRT_VERSION: &str = "0.0.78";

/// Environment variable naming the srt executable (default: `srt` on `PATH`).
pub const SRT_ENV: &str = "IPYBOX_SRT";

/// Name of the effective settings file written into the runtime directory.
pub const SETTINGS_FILE: &str = "sandbox-settings.json";

/// Host directories that hold other programs' Unix sockets (Linux). With `allowAllUnixSockets`
/// the kernel could connect to any socket it can see, so these are hidden (a `denyRead`
/// directory is an empty tmpfs inside srt's bubblewrap sandbox); the runtime directory and the
/// workspace are bound back when they live below one of them.
pub const HIDDEN_SOCKET_DIRS: &[&str] = &["/run", "/var/run", "/tmp", "/var/tmp"];

/// Workspace entries srt (on Linux) creates as empty mount points to keep the sandbox from
/// creating them; srt removes them when the command exits normally, but a killed kernel leaves
/// them behind, so ipybox removes the ones it saw appear (see [`ArtifactSweeper`]).
const SRT_MOUNT_POINTS: &[&str] = &[
    ".gitconfig",
    ".gitmodules",
    ".bashrc",
    ".bash_profile",
    ".zshrc",
    ".zprofile",
    ".profile",
    ".ripgreprc",
    ".mcp.json",
    ".vscode",
    ".idea",
    ".claude/commands",
    ".claude/agents",
    ".claude",
];

/// How to sandbox the kernel.
#[derive(Debug, Clone, Default)]
pub struct SandboxOptions {
    /// srt settings file; relative paths are taken from the workspace. Missing file: a warning
    /// and the default policy. `None`: the default policy.
    pub config_file: Option<PathBuf>,
    /// The srt executable. `None`: `$IPYBOX_SRT`, else `srt` on `PATH`.
    pub srt: Option<PathBuf>,
}

/// Why the sandbox could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// A required program or kernel feature is missing.
    #[error("sandbox unavailable: {reason}\n  help: {help}")]
    Unavailable { reason: String, help: String },
    /// The settings file is not valid JSON or not a valid srt policy.
    #[error("invalid sandbox config {}: {reason}\n  help: {help}", path.display())]
    Config {
        path: PathBuf,
        reason: String,
        help: String,
    },
    /// A file in the runtime directory could not be written.
    #[error("cannot prepare the sandbox ({}): {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// The default policy (the seed's): read everything except `.env` files, write only the
/// workspace and IPython's own directories, no network. Relative paths are taken from the
/// workspace (srt resolves them against its working directory, which is the workspace).
pub fn default_policy() -> Value {
    let jupyter_data = if cfg!(target_os = "macos") {
        "~/Library/Jupyter"
    } else {
        "~/.local/share/jupyter"
    };
    json!({
        "filesystem": {
            "denyRead": [".env", "**/.env"],
            "allowRead": [],
            "allowWrite": [".", "~/.ipython", jupyter_data],
            "denyWrite": [],
        },
        "network": {
            "allowedDomains": [],
            "deniedDomains": [],
        },
    })
}

/// Keys srt 0.0.78 accepts (its zod schema silently drops others: a typo such as `denyRaed`
/// would weaken the policy without a word, so ipybox rejects unknown keys).
const TOP_KEYS: &[&str] = &[
    "network",
    "filesystem",
    "credentials",
    "ignoreViolations",
    "enableWeakerNestedSandbox",
    "enableWeakerNetworkIsolation",
    "allowAppleEvents",
    "ripgrep",
    "mandatoryDenySearchDepth",
    "allowPty",
    "seccomp",
    "bwrapPath",
    "socatPath",
    "javaAgentJarPath",
    "windows",
    "git",
];
const NETWORK_KEYS: &[&str] = &[
    "allowedDomains",
    "deniedDomains",
    "deniedDomainReasons",
    "strictAllowlist",
    "deniedResolvedAddresses",
    "allowUnixSockets",
    "allowAllUnixSockets",
    "allowLocalBinding",
    "allowMachLookup",
    "httpProxyPort",
    "socksProxyPort",
    "mitmProxy",
    "filterRequest",
    "tlsTerminate",
    "parentProxy",
];
const FILESYSTEM_KEYS: &[&str] = &[
    "disabled",
    "denyRead",
    "allowRead",
    "allowWrite",
    "denyWrite",
    "allowGitConfig",
];
const NETWORK_LISTS: &[&str] = &[
    "allowedDomains",
    "deniedDomains",
    "deniedResolvedAddresses",
    "allowUnixSockets",
    "allowMachLookup",
];
const FILESYSTEM_LISTS: &[&str] = &["denyRead", "allowRead", "allowWrite", "denyWrite"];
const BOOLS: &[&str] = &[
    "enableWeakerNestedSandbox",
    "enableWeakerNetworkIsolation",
    "allowAppleEvents",
    "allowPty",
    "strictAllowlist",
    "allowAllUnixSockets",
    "allowLocalBinding",
    "disabled",
    "allowGitConfig",
];

/// Loads the policy: the settings file if given and present (relative to the workspace), else
/// the default policy. A section (`network`, `filesystem`) the file leaves out is taken from the
/// default policy; a list the file's section leaves out is empty.
pub fn load_policy(options: &SandboxOptions, workspace: &Path) -> Result<Value, SandboxError> {
    let Some(file) = &options.config_file else {
        return Ok(default_policy());
    };
    let path = if file.is_absolute() {
        file.clone()
    } else {
        workspace.join(file)
    };
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            tracing::warn!(
                "sandbox config {} not found: using the default policy (read all but .env, \
                 write the workspace, no network)",
                path.display()
            );
            return Ok(default_policy());
        }
        Err(e) => {
            return Err(SandboxError::Config {
                path,
                reason: format!("cannot read it: {e}"),
                help: "check the file's permissions".into(),
            });
        }
    };
    parse_policy(&text, &path)
}

/// Parses and validates an srt settings document (see [`load_policy`]); `path` names it in errors.
pub fn parse_policy(text: &str, path: &Path) -> Result<Value, SandboxError> {
    let err = |reason: String, help: &str| SandboxError::Config {
        path: path.to_path_buf(),
        reason,
        help: help.to_string(),
    };
    let doc: Value = serde_json::from_str(text).map_err(|e| {
        err(
            format!("not valid JSON: {e}"),
            "fix the JSON syntax (see docs/sandbox.md for an example)",
        )
    })?;
    let Value::Object(top) = doc else {
        return Err(err(
            "the top level must be a JSON object".into(),
            "write {\"filesystem\": {...}, \"network\": {...}}",
        ));
    };
    check_keys(&top, "", TOP_KEYS).map_err(|r| err(r, KEYS_HELP))?;
    let defaults = default_policy();
    let mut policy = top.clone();
    for (section, keys, lists) in [
        ("network", NETWORK_KEYS, NETWORK_LISTS),
        ("filesystem", FILESYSTEM_KEYS, FILESYSTEM_LISTS),
    ] {
        match top.get(section) {
            None => {
                policy.insert(section.into(), defaults[section].clone());
            }
            Some(Value::Object(map)) => {
                check_keys(map, &format!("{section}."), keys).map_err(|r| err(r, KEYS_HELP))?;
                let mut map = map.clone();
                for list in lists {
                    match map.get(*list) {
                        None if *list == "allowUnixSockets" || *list == "allowMachLookup" => {}
                        None if *list == "deniedResolvedAddresses" => {}
                        None => {
                            map.insert((*list).into(), json!([]));
                        }
                        Some(Value::Array(items)) if items.iter().all(Value::is_string) => {}
                        Some(_) => {
                            return Err(err(
                                format!("`{section}.{list}` must be a list of strings"),
                                "write e.g. [\"/some/path\"]",
                            ));
                        }
                    }
                }
                for key in BOOLS {
                    if let Some(v) = map.get(*key)
                        && !v.is_boolean()
                    {
                        return Err(err(
                            format!("`{section}.{key}` must be true or false"),
                            "write true or false",
                        ));
                    }
                }
                policy.insert(section.into(), Value::Object(map));
            }
            Some(_) => {
                return Err(err(
                    format!("`{section}` must be a JSON object"),
                    "see docs/sandbox.md for the settings format",
                ));
            }
        }
    }
    for key in BOOLS {
        if let Some(v) = top.get(*key)
            && !v.is_boolean()
        {
            return Err(err(
                format!("`{key}` must be true or false"),
                "write true or false",
            ));
        }
    }
    Ok(Value::Object(policy))
}

const KEYS_HELP: &str = "remove or correct the key; the format is srt's settings file \
     (see docs/sandbox.md)";

fn check_keys(map: &Map<String, Value>, prefix: &str, known: &[&str]) -> Result<(), String> {
    match map.keys().find(|k| !known.contains(&k.as_str())) {
        Some(key) => Err(format!(
            "unknown key `{prefix}{key}` (known here: {})",
            known.join(", ")
        )),
        None => Ok(()),
    }
}

/// Paths the effective settings must keep working for ipybox.
#[derive(Debug, Clone)]
pub struct SandboxPaths {
    /// The kernel's working directory (readable: cwd and `PYTHONPATH`).
    pub workspace: PathBuf,
    /// The private runtime directory (IPC sockets, connection files, embedded Python, tool
    /// socket, srt's bridge sockets and the kernel's TMPDIR): readable and writable.
    pub runtime_dir: PathBuf,
    /// Directories of the kernel's interpreter and its environment (readable).
    pub python_dirs: Vec<PathBuf>,
}

/// The user's policy plus what ipybox needs under any policy (each override is explained in
/// `docs/sandbox.md`):
///
/// - Linux: `network.allowAllUnixSockets = true` (srt's seccomp filter otherwise makes
///   `socket(AF_UNIX)` fail, and the kernel's ZMQ IPC sockets and the tool socket are Unix
///   sockets); in exchange [`HIDDEN_SOCKET_DIRS`] are added to `filesystem.denyRead`, so host
///   sockets are not even visible (the network namespace already hides abstract sockets).
/// - macOS: `network.allowUnixSockets += [runtime_dir]` (Seatbelt filters Unix sockets by path).
/// - `filesystem.allowRead += [workspace, runtime_dir, python dirs]` and
///   `filesystem.allowWrite += [runtime_dir]`.
pub fn effective_settings(policy: &Value, paths: &SandboxPaths) -> Value {
    let mut s = policy.clone();
    let disp = |p: &Path| Value::String(p.display().to_string());
    let push = |list: &mut Value, item: Value| {
        if let Value::Array(items) = list {
            if !items.contains(&item) {
                items.push(item);
            }
        } else {
            *list = Value::Array(vec![item]);
        }
    };
    let fs = s["filesystem"].as_object_mut().expect("validated policy");
    let allow_read = fs.entry("allowRead").or_insert_with(|| json!([]));
    push(allow_read, disp(&paths.workspace));
    push(allow_read, disp(&paths.runtime_dir));
    for dir in &paths.python_dirs {
        push(allow_read, disp(dir));
    }
    push(
        fs.entry("allowWrite").or_insert_with(|| json!([])),
        disp(&paths.runtime_dir),
    );
    if cfg!(target_os = "linux") {
        let deny_read = fs.entry("denyRead").or_insert_with(|| json!([]));
        for dir in HIDDEN_SOCKET_DIRS {
            if Path::new(dir).exists() {
                push(deny_read, json!(dir));
            }
        }
    }
    let net = s["network"].as_object_mut().expect("validated policy");
    if cfg!(target_os = "linux") {
        net.insert("allowAllUnixSockets".into(), json!(true));
    } else {
        push(
            net.entry("allowUnixSockets").or_insert_with(|| json!([])),
            disp(&paths.runtime_dir),
        );
    }
    s
}

/// Checks the sandbox, builds the effective policy, writes it into `runtime_dir` and returns the
/// wrapper that runs the kernel command under srt.
pub fn prepare(
    options: &SandboxOptions,
    workspace: &Path,
    runtime_dir: &Path,
) -> Result<CommandWrapper, SandboxError> {
    let srt = find_srt(options.srt.as_deref())?;
    check_platform(&srt)?;
    let policy = load_policy(options, workspace)?;
    let tmp = runtime_dir.join("tmp");
    std::fs::create_dir_all(&tmp).map_err(|source| SandboxError::Io {
        path: tmp.clone(),
        source,
    })?;
    let settings_path = runtime_dir.join(SETTINGS_FILE);
    let base = SandboxPaths {
        workspace: workspace.to_path_buf(),
        runtime_dir: runtime_dir.to_path_buf(),
        python_dirs: Vec::new(),
    };
    // Written now so a bad policy fails here; rewritten with the interpreter's directories when
    // the first kernel command is wrapped.
    let written = Arc::new(Mutex::new(String::new()));
    write_settings(
        &settings_path,
        &effective_settings(&policy, &base),
        &written,
    )?;
    let env = find_in_path("env").unwrap_or_else(|| PathBuf::from("/usr/bin/env"));
    let sweeper = Arc::new(ArtifactSweeper::new(workspace));
    let wrap = move |argv: Vec<String>| -> Vec<String> {
        let _keep = &sweeper;
        let mut paths = base.clone();
        if let Some(python) = argv.first() {
            paths.python_dirs = python_dirs(Path::new(python));
        }
        if let Err(e) = write_settings(
            &settings_path,
            &effective_settings(&policy, &paths),
            &written,
        ) {
            tracing::warn!("{e}");
        }
        let tmp = tmp.display().to_string();
        vec![
            env.display().to_string(),
            // srt's own temp files (its proxy bridge sockets, bound into the sandbox) and the
            // kernel's TMPDIR (srt sets it from CLAUDE_CODE_TMPDIR) live in the runtime
            // directory, because the host's /tmp is hidden inside the sandbox.
            format!("TMPDIR={tmp}"),
            format!("CLAUDE_CODE_TMPDIR={tmp}"),
            srt.display().to_string(),
            "--settings".into(),
            settings_path.display().to_string(),
            "-c".into(),
            format!("exec {}", shell_join(&argv)),
        ]
    };
    Ok(CommandWrapper(Arc::new(wrap)))
}

fn write_settings(path: &Path, settings: &Value, last: &Mutex<String>) -> Result<(), SandboxError> {
    let text = serde_json::to_string_pretty(settings).expect("JSON value serializes");
    let mut last = last.lock().unwrap_or_else(|p| p.into_inner());
    if *last == text {
        return Ok(());
    }
    // Write then rename: a kernel starting concurrently never reads half a file.
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, &text)
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(|source| SandboxError::Io {
            path: path.to_path_buf(),
            source,
        })?;
    *last = text;
    Ok(())
}

/// Directories the interpreter needs to be readable: its environment (a venv's root), the
/// installation it links to (`home` in `pyvenv.cfg`), and the real interpreter's prefix.
pub fn python_dirs(python: &Path) -> Vec<PathBuf> {
    let mut dirs = BTreeSet::new();
    let prefix = |p: &Path| p.parent().and_then(Path::parent).map(Path::to_path_buf);
    let abs = if python.is_absolute() {
        Some(python.to_path_buf())
    } else {
        find_in_path(&python.display().to_string())
    };
    let Some(python) = abs else {
        return Vec::new();
    };
    if let Some(root) = prefix(&python) {
        if let Ok(cfg) = std::fs::read_to_string(root.join("pyvenv.cfg")) {
            for line in cfg.lines() {
                if let Some((k, v)) = line.split_once('=')
                    && k.trim() == "home"
                    && let Some(home) = Path::new(v.trim()).parent()
                {
                    dirs.insert(home.to_path_buf());
                }
            }
        }
        dirs.insert(root);
    }
    if let Some(real) = std::fs::canonicalize(&python).ok().and_then(|p| prefix(&p)) {
        dirs.insert(real);
    }
    // "/" or "/usr" would re-open everything the policy hides.
    dirs.retain(|d| d.components().count() > 2);
    dirs.into_iter().collect()
}

/// Quotes one word for a POSIX shell.
pub fn shell_quote(word: &str) -> String {
    if !word.is_empty()
        && word
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./=:,+@%".contains(&b))
    {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

/// Joins an argv into one shell command line.
pub fn shell_join(argv: &[String]) -> String {
    argv.iter()
        .map(|w| shell_quote(w))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Finds srt: the explicit path, then `$IPYBOX_SRT`, then `srt` on `PATH`.
pub fn find_srt(explicit: Option<&Path>) -> Result<PathBuf, SandboxError> {
    let from_env = std::env::var_os(SRT_ENV)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from);
    let (path, source) = match (explicit, from_env) {
        (Some(p), _) => (p.to_path_buf(), "the sandbox options"),
        (None, Some(p)) => (p, SRT_ENV),
        (None, None) => match find_in_path("srt") {
            Some(p) => (p, "PATH"),
            None => {
                return Err(SandboxError::Unavailable {
                    reason: "srt (Anthropic's sandbox-runtime) was not found on PATH".into(),
                    help: format!(
                        "install it with `npm install -g @anthropic-ai/sandbox-runtime@{SRT_VERSION}` \
                         (needs Node.js >= 20.11), or point {SRT_ENV} at an srt executable"
                    ),
                });
            }
        },
    };
    let path = if path.is_absolute() {
        path
    } else if path.components().count() == 1 {
        find_in_path(&path.display().to_string()).unwrap_or(path)
    } else {
        std::env::current_dir()
            .map(|d| d.join(&path))
            .unwrap_or(path)
    };
    if !is_executable(&path) {
        return Err(SandboxError::Unavailable {
            reason: format!(
                "srt {} (from {source}) does not exist or is not executable",
                path.display()
            ),
            help: format!(
                "install it with `npm install -g @anthropic-ai/sandbox-runtime@{SRT_VERSION}`, \
                 or fix {SRT_ENV}"
            ),
        });
    }
    Ok(path)
}

/// Checks the platform's sandbox prerequisites once per srt path per process (the checks cost
/// ~0.3 s, mostly Node starting for `srt --version`).
fn check_platform(srt: &Path) -> Result<(), SandboxError> {
    static CHECKED: OnceLock<Mutex<BTreeSet<PathBuf>>> = OnceLock::new();
    let checked = CHECKED.get_or_init(Default::default);
    if checked
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .contains(srt)
    {
        return Ok(());
    }
    if !cfg!(any(target_os = "linux", target_os = "macos")) {
        return Err(SandboxError::Unavailable {
            reason: "the sandbox supports Linux and macOS only".into(),
            help: "run without --sandbox on this platform".into(),
        });
    }
    let mut missing = Vec::new();
    let programs: &[(&str, &str)] = if cfg!(target_os = "linux") {
        &[
            ("bwrap", "bubblewrap"),
            ("socat", "socat"),
            ("rg", "ripgrep"),
        ]
    } else {
        &[("rg", "ripgrep")]
    };
    for (program, package) in programs {
        if find_in_path(program).is_none() {
            missing.push(*package);
        }
    }
    if !missing.is_empty() {
        let install = if cfg!(target_os = "linux") {
            format!(
                "`sudo apt-get install {}` (Debian/Ubuntu; dnf/pacman have the same names)",
                missing.join(" ")
            )
        } else {
            format!("`brew install {}`", missing.join(" "))
        };
        return Err(SandboxError::Unavailable {
            reason: format!("missing {} (needed by srt)", missing.join(", ")),
            help: format!("install with {install}"),
        });
    }
    if cfg!(target_os = "linux") {
        check_user_namespaces()?;
    }
    let out = std::process::Command::new(srt)
        .arg("--version")
        .stdin(std::process::Stdio::null())
        .output();
    match out {
        Ok(o) if o.status.success() => {
            let version = String::from_utf8_lossy(&o.stdout).trim().to_string();
            if version != SRT_VERSION {
                tracing::debug!(
                    "srt {version} at {} (ipybox is tested with {SRT_VERSION})",
                    srt.display()
                );
            }
        }
        Ok(o) => {
            return Err(SandboxError::Unavailable {
                reason: format!(
                    "`{} --version` failed ({}): {}",
                    srt.display(),
                    o.status,
                    crate::pyenv::tail(&o.stderr)
                ),
                help: format!(
                    "srt needs Node.js >= 20.11; reinstall with \
                     `npm install -g @anthropic-ai/sandbox-runtime@{SRT_VERSION}`"
                ),
            });
        }
        Err(e) => {
            return Err(SandboxError::Unavailable {
                reason: format!("cannot run {}: {e}", srt.display()),
                help: "srt is a Node.js script: check that `node` (>= 20.11) is on PATH".into(),
            });
        }
    }
    checked
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(srt.to_path_buf());
    Ok(())
}

/// bubblewrap needs user namespaces (srt also unshares the network and pid namespaces).
fn check_user_namespaces() -> Result<(), SandboxError> {
    let out = std::process::Command::new("bwrap")
        .args([
            "--unshare-user",
            "--unshare-net",
            "--unshare-pid",
            "--ro-bind",
            "/",
            "/",
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "true",
        ])
        .stdin(std::process::Stdio::null())
        .output();
    match out {
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => Err(SandboxError::Unavailable {
            reason: format!(
                "bubblewrap cannot create user namespaces here: {}",
                crate::pyenv::tail(&o.stderr)
            ),
            help:
                "enable unprivileged user namespaces (`sysctl kernel.unprivileged_userns_clone=1`; \
                   on Ubuntu 24.04+ `sysctl kernel.apparmor_restrict_unprivileged_userns=0`); \
                   in a container, allow them (e.g. Docker's default seccomp profile blocks them)"
                    .into(),
        }),
        Err(e) => Err(SandboxError::Unavailable {
            reason: format!("cannot run bwrap: {e}"),
            help: "install bubblewrap: `sudo apt-get install bubblewrap`".into(),
        }),
    }
}

fn find_in_path(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(program))
        .find(|p| is_executable(p))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Removes the empty mount points srt's bubblewrap backend creates in the workspace (see
/// [`SRT_MOUNT_POINTS`]) when the wrapper is dropped (the executor stopped). Only entries that
/// did not exist when the sandbox was prepared and are still empty are removed.
struct ArtifactSweeper {
    workspace: PathBuf,
    absent: Vec<&'static str>,
}

impl ArtifactSweeper {
    fn new(workspace: &Path) -> Self {
        let absent = SRT_MOUNT_POINTS
            .iter()
            .copied()
            .filter(|name| std::fs::symlink_metadata(workspace.join(name)).is_err())
            .collect();
        Self {
            workspace: workspace.to_path_buf(),
            absent,
        }
    }
}

impl Drop for ArtifactSweeper {
    fn drop(&mut self) {
        // Deepest first, so `.claude` is empty once its children are gone.
        for name in &self.absent {
            let path = self.workspace.join(name);
            match std::fs::symlink_metadata(&path) {
                Ok(m) if m.is_file() && m.len() == 0 => {
                    let _ = std::fs::remove_file(&path);
                }
                // remove_dir only removes empty directories.
                Ok(m) if m.is_dir() => {
                    let _ = std::fs::remove_dir(&path);
                }
                _ => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_round_trips_through_sh() {
        let argv: Vec<String> = [
            "python",
            "-c",
            "print('a b')\nx = \"$HOME\"",
            "",
            "plain-1.0",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!(
                "for a in {}; do printf '<%s>' \"$a\"; done",
                shell_join(&argv)
            ))
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8(out.stdout).unwrap(),
            "<python><-c><print('a b')\nx = \"$HOME\"><><plain-1.0>"
        );
    }

    #[test]
    fn unknown_keys_are_named() {
        let p = Path::new("/x/s.json");
        let e = parse_policy(r#"{"filesystem": {"denyRaed": []}}"#, p).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("filesystem.denyRaed") && msg.contains("/x/s.json"),
            "{msg}"
        );
        let e = parse_policy(r#"{"netwrk": {}}"#, p).unwrap_err();
        assert!(e.to_string().contains("`netwrk`"), "{e}");
        let e = parse_policy(r#"{"filesystem": {"allowWrite": "."}}"#, p).unwrap_err();
        assert!(e.to_string().contains("filesystem.allowWrite"), "{e}");
        let e = parse_policy("{", p).unwrap_err();
        assert!(e.to_string().contains("not valid JSON"), "{e}");
    }

    #[test]
    fn sections_fall_back_to_defaults() {
        let p = parse_policy(
            r#"{"network": {"allowedDomains": ["example.com"]}}"#,
            Path::new("s.json"),
        )
        .unwrap();
        assert_eq!(p["filesystem"], default_policy()["filesystem"]);
        assert_eq!(p["network"]["deniedDomains"], json!([]));
        assert_eq!(p["network"]["allowedDomains"], json!(["example.com"]));
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn overrides_keep_ipybox_working() {
        let paths = SandboxPaths {
            workspace: "/w".into(),
            runtime_dir: "/tmp/ipybox-1-abc".into(),
            python_dirs: vec!["/opt/py".into()],
        };
        let s = effective_settings(&default_policy(), &paths);
        assert_eq!(s["network"]["allowAllUnixSockets"], json!(true));
        let read = s["filesystem"]["allowRead"].as_array().unwrap();
        for p in ["/w", "/tmp/ipybox-1-abc", "/opt/py"] {
            assert!(read.contains(&json!(p)), "{read:?}");
        }
        assert!(
            s["filesystem"]["allowWrite"]
                .as_array()
                .unwrap()
                .contains(&json!("/tmp/ipybox-1-abc"))
        );
        let deny = s["filesystem"]["denyRead"].as_array().unwrap();
        assert!(deny.contains(&json!("/run")) && deny.contains(&json!("/tmp")));
        assert!(deny.contains(&json!(".env")));
    }
}
