//! The sandbox policy: srt's settings format as typed structs, the default policy, loading a
//! settings file, and the overrides ipybox adds under any policy.
//!
//! Unknown keys are errors (`deny_unknown_fields`): srt's own schema silently drops them, so a
//! typo such as `denyRaed` would weaken the policy without a word. A section (`network`,
//! `filesystem`) a policy leaves out is taken from the default policy; a list its section leaves
//! out is empty. Keys srt knows but ipybox does not interpret are kept as written.
//!
//! Not here: checking that srt can run (`super::platform`) and building the kernel command
//! (`super::wrap`).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::SandboxError;

/// Host directories that hold other programs' Unix sockets (Linux). With `allowAllUnixSockets`
/// the kernel could connect to any socket it can see, so these are hidden (a `denyRead`
/// directory is an empty tmpfs inside srt's bubblewrap sandbox); the runtime directory, the
/// workspace and the interpreter are bound back when they live below one of them.
pub const HIDDEN_SOCKET_DIRS: &[&str] = &["/run", "/var/run", "/tmp", "/var/tmp"];

/// Credential stores and other private files under the home directory the default policy does
/// not let the kernel read (docs/sandbox.md says why each is there). A policy that gives its own
/// `filesystem` section replaces this list.
pub const DEFAULT_DENY_READ_HOME: &[&str] = &[
    "~/.ssh",
    "~/.aws",
    "~/.azure",
    "~/.config",
    "~/.gnupg",
    "~/.netrc",
    "~/.docker",
    "~/.kube",
    "~/.git-credentials",
    "~/.npmrc",
    "~/.pypirc",
    "~/.password-store",
    "~/.local/share/keyrings",
    "~/.vault-token",
    "~/.terraform.d",
];

/// Places host programs load code or configuration from at their start that no sandboxed
/// kernel may write, whatever the policy says: IPython's profile (startup files run in every
/// IPython, the unsandboxed `ipybox exec` included) and Jupyter's configuration and data (a
/// sandboxed kernel gets private ones in the runtime directory instead).
pub const DENY_WRITE_HOME: &[&str] = &[
    "~/.ipython",
    "~/.jupyter",
    "~/.local/share/jupyter",
    "~/Library/Jupyter",
];

/// An srt settings document (srt 0.0.78).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SandboxPolicy {
    /// Network rules; missing: the default policy's (no network).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkPolicy>,
    /// Filesystem rules; missing: the default policy's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filesystem: Option<FilesystemPolicy>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials: Option<Map<String, Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ignore_violations: Option<Map<String, Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enable_weaker_nested_sandbox: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enable_weaker_network_isolation: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_apple_events: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ripgrep: Option<Map<String, Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mandatory_deny_search_depth: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_pty: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seccomp: Option<Map<String, Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bwrap_path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socat_path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub java_agent_jar_path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub windows: Option<Map<String, Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub git: Option<Map<String, Value>>,
}

/// srt's `network` section.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct NetworkPolicy {
    /// Domains the kernel may reach through srt's proxy (empty: none).
    #[serde(default)]
    pub allowed_domains: Vec<String>,
    #[serde(default)]
    pub denied_domains: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub denied_domain_reasons: Option<Map<String, Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strict_allowlist: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub denied_resolved_addresses: Option<Vec<String>>,
    /// macOS: Unix socket paths the kernel may use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_unix_sockets: Option<Vec<String>>,
    /// Linux: lift srt's seccomp filter on `socket(AF_UNIX)` (ipybox always sets it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_all_unix_sockets: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_local_binding: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_mach_lookup: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_proxy_port: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socks_proxy_port: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mitm_proxy: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter_request: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_terminate: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_proxy: Option<Value>,
}

/// srt's `filesystem` section. Relative paths are taken from the workspace (srt resolves them
/// against its working directory, which is the workspace); `~` is the user's home.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct FilesystemPolicy {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disabled: Option<bool>,
    #[serde(default)]
    pub deny_read: Vec<String>,
    #[serde(default)]
    pub allow_read: Vec<String>,
    #[serde(default)]
    pub allow_write: Vec<String>,
    #[serde(default)]
    pub deny_write: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_git_config: Option<bool>,
}

impl SandboxPolicy {
    /// The default policy: read everything except `.env` files and the credential stores of
    /// [`DEFAULT_DENY_READ_HOME`], write only the workspace, no network.
    pub fn default_policy() -> Self {
        let mut deny_read: Vec<String> = vec![".env".into(), "**/.env".into()];
        deny_read.extend(DEFAULT_DENY_READ_HOME.iter().map(|p| p.to_string()));
        Self {
            network: Some(NetworkPolicy::default()),
            filesystem: Some(FilesystemPolicy {
                deny_read,
                allow_write: vec![".".into()],
                ..FilesystemPolicy::default()
            }),
            ..Self::default()
        }
    }

    /// This policy with its missing sections taken from the default policy.
    pub fn with_defaults(mut self) -> Self {
        let default = Self::default_policy();
        if self.network.is_none() {
            self.network = default.network;
        }
        if self.filesystem.is_none() {
            self.filesystem = default.filesystem;
        }
        self
    }

    /// Parses an srt settings document; `path` names it in errors.
    pub fn parse(text: &str, path: &Path) -> Result<Self, SandboxError> {
        let doc: Value = serde_json::from_str(text).map_err(|source| SandboxError::Config {
            path: path.to_path_buf(),
            reason: "not valid JSON".into(),
            help: "fix the JSON syntax (see docs/sandbox.md for an example)".into(),
            source: Some(source),
        })?;
        if !doc.is_object() {
            return Err(SandboxError::Config {
                path: path.to_path_buf(),
                reason: "the top level must be a JSON object".into(),
                help: "write {\"filesystem\": {...}, \"network\": {...}}".into(),
                source: None,
            });
        }
        Self::from_value(doc).map_err(|source| SandboxError::Config {
            path: path.to_path_buf(),
            reason: "not a valid srt policy".into(),
            help:
                "remove or correct the key; the format is srt's settings file (see docs/sandbox.md)"
                    .into(),
            source: Some(source),
        })
    }

    /// A policy from a JSON value (as a caller of the library may hold it); unknown keys and
    /// wrong types are errors naming the key.
    pub fn from_value(value: Value) -> Result<Self, serde_json::Error> {
        serde_json::from_value(value)
    }

    /// The settings srt gets: this policy (missing sections from the default policy) plus what
    /// ipybox needs under any policy (each override is explained in `docs/sandbox.md`):
    ///
    /// - Linux: `network.allowAllUnixSockets = true` (srt's seccomp filter otherwise makes
    ///   `socket(AF_UNIX)` fail, and the kernel's ZMQ IPC sockets and the tool socket are Unix
    ///   sockets); in exchange [`HIDDEN_SOCKET_DIRS`] are added to `filesystem.denyRead`, so
    ///   host sockets are not even visible (the network namespace already hides abstract ones).
    /// - macOS: `network.allowUnixSockets += [runtime_dir]` (Seatbelt filters them by path).
    /// - `filesystem.allowRead += [workspace, runtime_readable, python dirs]` and
    ///   `filesystem.allowWrite += [the runtime directory's kernel-writable part]` (the rest of
    ///   the runtime directory, the settings of the next kernel included, stays read-only);
    ///   The directory runtime directories live in is hidden too when it is not one of them.
    /// - `filesystem.denyRead += [ipybox's data directory]` (registrations, kernel ledger; the
    ///   kernel environment inside it stays readable through the python dirs) and the effective
    ///   settings file itself (it may hold the host's upstream proxy credentials);
    /// - `filesystem.denyWrite += [<workspace>/.env, the policy file, DENY_WRITE_HOME]`: what
    ///   the host reads or runs at its next start (srt keeps an absent path from being created);
    /// - `filesystem.denyRead += [deny_read]` (the HTTP service's operator files: token files,
    ///   session secret, notebook and snapshot directories, wherever they are);
    /// - `filesystem.denyWrite += [record_dirs]` (the session notebook's directory: what a
    ///   person opens and `ipybox replay` runs is what the host recorded), unless the directory
    ///   is hidden from the kernel already (ipybox's data directory, a hidden directory outside
    ///   every writable one): a read-only bind there would show it.
    pub fn effective(&self, paths: &SandboxPaths) -> Self {
        let mut s = self.clone().with_defaults();
        let disp = |p: &Path| p.display().to_string();
        let fs = s.filesystem.get_or_insert_with(FilesystemPolicy::default);
        push(&mut fs.allow_read, disp(&paths.workspace));
        for p in &paths.runtime_readable {
            push(&mut fs.allow_read, disp(p));
        }
        for dir in &paths.python_dirs {
            push(&mut fs.allow_read, disp(dir));
        }
        push(&mut fs.allow_write, disp(&paths.kernel_writable));
        if let Some(data) = &paths.data_dir {
            push(&mut fs.deny_read, disp(data));
        }
        if let Some(file) = &paths.settings_file {
            push(&mut fs.deny_read, disp(file));
        }
        push(&mut fs.deny_write, disp(&paths.workspace.join(".env")));
        if let Some(file) = &paths.config_file {
            push(&mut fs.deny_write, disp(file));
        }
        if paths.isolate_workspace {
            // What the policy lets the kernel write in the workspace it may not write: those
            // entries go (srt would otherwise make its mount points for dangerous files there,
            // in a read-only place). A directory above the workspace stays writable, except
            // the workspace.
            let inside = |entry: &String| {
                !entry.contains(['*', '?', '[', '~'])
                    && paths.workspace.join(entry).starts_with(&paths.workspace)
            };
            fs.allow_write.retain(|entry| !inside(entry));
            let above = fs
                .allow_write
                .iter()
                .any(|entry| entry.starts_with('/') && paths.workspace.starts_with(entry.as_str()));
            if above {
                push(&mut fs.deny_write, disp(&paths.workspace));
            }
            push(&mut fs.deny_read, disp(&paths.workspace.join("images")));
        }
        for path in &paths.deny_read {
            if std::fs::symlink_metadata(path).is_ok() {
                push(&mut fs.deny_read, disp(path));
            }
        }
        for dir in &paths.record_dirs {
            // A record directory hidden as an operator file stays hidden (a read-only bind
            // would show it).
            if paths.deny_read.iter().any(|d| dir.starts_with(d)) {
                continue;
            }
            if record_dir_needs_deny(dir, paths, &fs.allow_write) {
                push(&mut fs.deny_write, disp(dir));
            }
        }
        for p in DENY_WRITE_HOME {
            push(&mut fs.deny_write, (*p).to_string());
        }
        if cfg!(target_os = "linux") {
            for dir in HIDDEN_SOCKET_DIRS {
                if Path::new(dir).exists() {
                    push(&mut fs.deny_read, (*dir).to_string());
                }
            }
            // Where runtime directories live, when it is none of those (`$XDG_RUNTIME_DIR`
            // or `$TMPDIR` elsewhere): other executors' directories (their connection files
            // and sockets: other sessions of an HTTP service) stay out of sight.
            if let Some(base) = paths.runtime_dir.parent()
                && base.components().count() > 1
                && !HIDDEN_SOCKET_DIRS.iter().any(|d| base.starts_with(d))
            {
                push(&mut fs.deny_read, disp(base));
            }
        }
        let net = s.network.get_or_insert_with(NetworkPolicy::default);
        if cfg!(target_os = "linux") {
            net.allow_all_unix_sockets = Some(true);
        } else {
            // tools.sock (in the runtime dir) and the IPC sockets (in its kernel-writable part).
            push(
                net.allow_unix_sockets.get_or_insert_with(Vec::new),
                disp(&paths.runtime_dir),
            );
        }
        s
    }
}

/// Whether the host's record directory `dir` must be denied to the kernel's writes: always,
/// except for the workspace and the directories above it, and when the kernel cannot see it
/// anyway (inside ipybox's data directory, or below a
/// hidden directory such as `/tmp` and outside the workspace and every absolute `allowWrite`
/// entry), where a read-only bind would make it visible.
fn record_dir_needs_deny(dir: &Path, paths: &SandboxPaths, allow_write: &[String]) -> bool {
    // Never the workspace itself or a directory above it (a notebook replayed from the
    // workspace's top): the kernel works there.
    if paths
        .data_dir
        .as_deref()
        .is_some_and(|d| dir.starts_with(d))
        || paths.workspace.starts_with(dir)
    {
        return false;
    }
    let writable = dir.starts_with(&paths.workspace)
        || allow_write.iter().any(|entry| {
            !entry.contains(['*', '?', '[', '~']) && dir.starts_with(paths.workspace.join(entry))
        });
    let hidden = HIDDEN_SOCKET_DIRS.iter().any(|d| dir.starts_with(d))
        || paths
            .runtime_dir
            .parent()
            .is_some_and(|base| dir.starts_with(base));
    writable || !hidden
}

fn push(list: &mut Vec<String>, item: String) {
    if !list.contains(&item) {
        list.push(item);
    }
}

/// Paths the effective settings must keep working for ipybox, or keep from the kernel.
#[derive(Debug, Clone)]
pub struct SandboxPaths {
    /// The kernel's working directory (readable: cwd and `PYTHONPATH`).
    pub workspace: PathBuf,
    /// The private runtime directory (macOS: Unix sockets below it are allowed).
    pub runtime_dir: PathBuf,
    /// What the kernel reads in the runtime directory (the embedded Python, the connection
    /// files, the tool socket, srt's bridge sockets): readable, not writable. Listed one by one,
    /// not as the runtime directory: srt restores a readable directory over a denied one
    /// (`/tmp`) after the writable ones, which would bury the kernel-writable part.
    pub runtime_readable: Vec<PathBuf>,
    /// The part of the runtime directory the kernel writes (its IPC sockets, TMPDIR, IPython
    /// and Jupyter directories): writable.
    pub kernel_writable: PathBuf,
    /// Directories of the kernel's interpreter and its environment (readable).
    pub python_dirs: Vec<PathBuf>,
    /// ipybox's data directory (`$IPYBOX_HOME`): not readable, except the python dirs in it.
    pub data_dir: Option<PathBuf>,
    /// The workspace is read-only and its `images/` hidden ([`crate::sandbox::SandboxOptions`]).
    pub isolate_workspace: bool,
    /// The srt settings file the policy came from (not writable, so the kernel cannot choose
    /// the policy of the next start).
    pub config_file: Option<PathBuf>,
    /// The effective settings file srt reads (not readable: it may hold the host's upstream
    /// proxy with its credentials, `network.parentProxy`).
    pub settings_file: Option<PathBuf>,
    /// Directories the host keeps its records in (the session notebook's) or its generated code
    /// (the workspace's `mcptools/`): never writable by the kernel, whatever the policy says. They must exist before srt starts (bubblewrap
    /// binds them read-only; a mount point cannot be renamed or replaced from inside).
    pub record_dirs: Vec<PathBuf>,
    /// Host paths never readable by the kernel, whatever the policy says (the HTTP service's
    /// operator files); those that do not exist when the kernel starts are left out.
    pub deny_read: Vec<PathBuf>,
}

impl SandboxPolicy {
    /// The directories this policy lets the kernel write, as absolute paths where they can be
    /// told without srt (relative entries are taken from `workspace`, `~/` from `home`; globs
    /// are left out): what the host must never run or read code from.
    pub fn writable_roots(&self, workspace: &Path, home: Option<&Path>) -> Vec<PathBuf> {
        let s = self.clone().with_defaults();
        let mut roots = vec![workspace.to_path_buf()];
        for entry in s.filesystem.map(|f| f.allow_write).unwrap_or_default() {
            if entry.contains(['*', '?', '[']) {
                continue;
            }
            let path = if entry == "~" {
                home.map(Path::to_path_buf)
            } else if let Some(rest) = entry.strip_prefix("~/") {
                home.map(|h| h.join(rest))
            } else if Path::new(&entry).is_absolute() {
                Some(PathBuf::from(&entry))
            } else {
                Some(workspace.join(&entry))
            };
            if let Some(p) = path {
                roots.push(p.canonicalize().unwrap_or(p));
            }
        }
        roots
    }
}

/// Loads the policy: `config_file` if given and present (relative to the workspace), else the
/// default policy (a missing file logs a warning).
pub(crate) async fn load(
    config_file: Option<&Path>,
    workspace: &Path,
) -> Result<SandboxPolicy, SandboxError> {
    let Some(file) = config_file else {
        return Ok(SandboxPolicy::default_policy());
    };
    let path = if file.is_absolute() {
        file.to_path_buf()
    } else {
        workspace.join(file)
    };
    match tokio::fs::read_to_string(&path).await {
        Ok(text) => SandboxPolicy::parse(&text, &path),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            tracing::warn!(
                "sandbox config {} not found: using the default policy (read all but .env and \
                 credential stores, write the workspace, no network)",
                path.display()
            );
            Ok(SandboxPolicy::default_policy())
        }
        Err(source) => Err(SandboxError::Io { path, source }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(text: &str) -> Result<SandboxPolicy, String> {
        SandboxPolicy::parse(text, Path::new("/x/s.json")).map_err(|e| {
            let mut msg = e.to_string();
            let mut source = std::error::Error::source(&e);
            while let Some(s) = source {
                msg.push_str(&format!(" | {s}"));
                source = s.source();
            }
            msg
        })
    }

    #[test]
    fn unknown_keys_and_wrong_types_are_named() {
        let msg = parse(r#"{"filesystem": {"denyRaed": []}}"#).unwrap_err();
        assert!(
            msg.contains("unknown field `denyRaed`") && msg.contains("/x/s.json"),
            "{msg}"
        );
        let msg = parse(r#"{"netwrk": {}}"#).unwrap_err();
        assert!(msg.contains("unknown field `netwrk`"), "{msg}");
        let msg = parse(r#"{"filesystem": {"allowWrite": "."}}"#).unwrap_err();
        assert!(
            msg.contains("invalid type: string \".\", expected a sequence"),
            "{msg}"
        );
        let msg = parse(r#"{"network": {"allowLocalBinding": "yes"}}"#).unwrap_err();
        assert!(msg.contains("expected a boolean"), "{msg}");
        let msg = parse("{").unwrap_err();
        assert!(msg.contains("not valid JSON"), "{msg}");
        let msg = parse("[]").unwrap_err();
        assert!(msg.contains("top level must be a JSON object"), "{msg}");
    }

    #[test]
    fn empty_and_partial_policies_take_the_defaults() {
        let empty = parse("{}").unwrap().with_defaults();
        assert_eq!(empty, SandboxPolicy::default_policy());
        let p = parse(r#"{"network": {"allowedDomains": ["example.com"]}}"#)
            .unwrap()
            .with_defaults();
        assert_eq!(p.filesystem, SandboxPolicy::default_policy().filesystem);
        let net = p.network.unwrap();
        assert_eq!(net.allowed_domains, vec!["example.com"]);
        assert!(net.denied_domains.is_empty());
        // A section given without some lists: those lists are empty (not the defaults').
        let p = parse(r#"{"filesystem": {"allowWrite": ["out"]}}"#).unwrap();
        let fs = p.filesystem.unwrap();
        assert_eq!(fs.allow_write, vec!["out"]);
        assert!(fs.deny_read.is_empty());
    }

    #[test]
    fn keys_ipybox_does_not_interpret_are_kept() {
        let text = r#"{"allowPty": true, "ripgrep": {"command": "rg"}, "network": {"httpProxyPort": 3128}}"#;
        let p = parse(text).unwrap();
        let v = serde_json::to_value(&p).unwrap();
        assert_eq!(v["allowPty"], json!(true));
        assert_eq!(v["ripgrep"], json!({"command": "rg"}));
        assert_eq!(v["network"]["httpProxyPort"], json!(3128));
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn overrides_keep_ipybox_working_even_for_an_empty_policy() {
        let paths = SandboxPaths {
            workspace: "/w".into(),
            runtime_dir: "/tmp/ipybox-1-abc".into(),
            runtime_readable: vec!["/tmp/ipybox-1-abc/kernels".into()],
            kernel_writable: "/tmp/ipybox-1-abc/box".into(),
            python_dirs: vec!["/opt/py".into()],
            data_dir: Some("/home/u/.local/share/ipybox".into()),
            config_file: Some("/w/policy.json".into()),
            isolate_workspace: false,
            settings_file: Some("/tmp/ipybox-1-abc/sandbox-settings.json".into()),
            record_dirs: vec![],
            deny_read: vec![],
        };
        let s = serde_json::to_value(SandboxPolicy::default().effective(&paths)).unwrap();
        assert_eq!(s["network"]["allowAllUnixSockets"], json!(true));
        assert_eq!(s["network"]["allowedDomains"], json!([]));
        let read = s["filesystem"]["allowRead"].as_array().unwrap();
        for p in ["/w", "/tmp/ipybox-1-abc/kernels", "/opt/py"] {
            assert!(read.contains(&json!(p)), "{read:?}");
        }
        assert_eq!(
            s["filesystem"]["allowWrite"],
            json!([".", "/tmp/ipybox-1-abc/box"])
        );
        let deny = s["filesystem"]["denyRead"].as_array().unwrap();
        assert!(deny.contains(&json!("/run")) && deny.contains(&json!("/tmp")));
        for p in [
            ".env",
            "~/.ssh",
            "~/.config",
            "/home/u/.local/share/ipybox",
            "/tmp/ipybox-1-abc/sandbox-settings.json",
        ] {
            assert!(deny.contains(&json!(p)), "{p}: {deny:?}");
        }
        // An isolated workspace: nothing in it writable (the policy's "." goes), images hidden.
        let isolated = SandboxPaths {
            isolate_workspace: true,
            ..paths.clone()
        };
        let s = serde_json::to_value(SandboxPolicy::default().effective(&isolated)).unwrap();
        assert_eq!(
            s["filesystem"]["allowWrite"],
            json!(["/tmp/ipybox-1-abc/box"])
        );
        let deny = s["filesystem"]["denyRead"].as_array().unwrap();
        assert!(deny.contains(&json!("/w/images")), "{deny:?}");
        // Runtime directories in /tmp: /tmp is hidden already (only the settings file is named);
        // elsewhere, their base is.
        assert!(!deny.iter().any(|p| {
            let p = p.as_str().unwrap();
            p.starts_with("/tmp/") && p != "/tmp/ipybox-1-abc/sandbox-settings.json"
        }));
        // The notebook's directory: not writable when the kernel could otherwise write (or see)
        // it; left alone where it is hidden (a read-only bind would show it).
        let records = SandboxPaths {
            record_dirs: vec![
                "/w/notebooks".into(),
                "/home/u/.local/share/ipybox/notebooks".into(),
                "/tmp/elsewhere/nb".into(),
                "/srv/nb".into(),
                "/w".into(),
                "/".into(),
            ],
            ..paths.clone()
        };
        let s = serde_json::to_value(SandboxPolicy::default().effective(&records)).unwrap();
        let deny = s["filesystem"]["denyWrite"].as_array().unwrap();
        assert!(deny.contains(&json!("/w/notebooks")), "{deny:?}");
        assert!(deny.contains(&json!("/srv/nb")), "{deny:?}");
        assert!(
            !deny
                .iter()
                .any(|p| p.as_str().unwrap().contains("share/ipybox"))
        );
        assert!(!deny.contains(&json!("/tmp/elsewhere/nb")), "{deny:?}");
        assert!(!deny.contains(&json!("/w")) && !deny.contains(&json!("/")));
        let mut writable_tmp = SandboxPolicy::default_policy();
        writable_tmp
            .filesystem
            .as_mut()
            .unwrap()
            .allow_write
            .push("/tmp/elsewhere".into());
        let s = serde_json::to_value(writable_tmp.effective(&records)).unwrap();
        let deny = s["filesystem"]["denyWrite"].as_array().unwrap();
        assert!(deny.contains(&json!("/tmp/elsewhere/nb")), "{deny:?}");
        let elsewhere = SandboxPaths {
            runtime_dir: "/srv/rt/ipybox-1-abc".into(),
            ..paths.clone()
        };
        let s = serde_json::to_value(SandboxPolicy::default().effective(&elsewhere)).unwrap();
        let deny = s["filesystem"]["denyRead"].as_array().unwrap();
        assert!(deny.contains(&json!("/srv/rt")), "{deny:?}");
        assert_eq!(
            s["filesystem"]["denyWrite"],
            json!([
                "/w/.env",
                "/w/policy.json",
                "~/.ipython",
                "~/.jupyter",
                "~/.local/share/jupyter",
                "~/Library/Jupyter"
            ])
        );
    }

    #[test]
    fn operator_files_are_denied_whatever_the_policy() {
        let dir = tempfile::tempdir().unwrap();
        let tokens = dir.path().join("tokens");
        std::fs::write(&tokens, "t").unwrap();
        let notebooks = dir.path().join("nb");
        std::fs::create_dir(&notebooks).unwrap();
        let paths = SandboxPaths {
            workspace: "/w".into(),
            runtime_dir: "/tmp/ipybox-1-abc".into(),
            runtime_readable: vec![],
            kernel_writable: "/tmp/ipybox-1-abc/box".into(),
            python_dirs: vec![],
            data_dir: None,
            config_file: None,
            isolate_workspace: true,
            settings_file: None,
            record_dirs: vec![notebooks.clone()],
            deny_read: vec![tokens.clone(), notebooks.clone(), dir.path().join("absent")],
        };
        let s = serde_json::to_value(SandboxPolicy::default_policy().effective(&paths)).unwrap();
        let deny = s["filesystem"]["denyRead"].as_array().unwrap();
        let disp = |p: &Path| json!(p.display().to_string());
        assert!(deny.contains(&disp(&tokens)), "{deny:?}");
        assert!(deny.contains(&disp(&notebooks)), "{deny:?}");
        assert!(
            !deny.contains(&disp(&dir.path().join("absent"))),
            "{deny:?}"
        );
        // Hidden, not bound read-only over the denial.
        let deny_write = s["filesystem"]["denyWrite"].as_array().unwrap();
        assert!(!deny_write.contains(&disp(&notebooks)), "{deny_write:?}");
    }
}
