//! Which of the host's environment variables reach the processes ipybox starts (the kernel and
//! stdio MCP servers), beyond what each of them sets itself. Everything else — API keys, cloud
//! credentials — stays out unless the user passes it explicitly. And [`HostEnv`], the snapshot of
//! the process environment that the library reads in one place and passes down.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Identity and locale.
pub const IDENTITY: &[&str] = &["HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "TZ"];

/// What HTTPS needs behind a proxy or with a custom CA bundle (pip, npx, uvx, requests).
pub const NETWORK: &[&str] = &[
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "REQUESTS_CA_BUNDLE",
    "NODE_EXTRA_CA_CERTS",
];

/// A snapshot of the host's environment variables: the one place the library reads the process
/// environment ([`HostEnv::from_process`]); everything below it gets a `HostEnv` passed in, so a
/// caller (or a test) decides what ipybox sees.
#[derive(Debug, Clone, Default)]
pub struct HostEnv {
    vars: HashMap<String, String>,
}

impl HostEnv {
    /// The current process environment (variables that are not valid UTF-8 are left out).
    pub fn from_process() -> Self {
        Self {
            vars: std::env::vars().collect(),
        }
    }

    /// An environment made of exactly `vars`.
    pub fn from_vars(vars: HashMap<String, String>) -> Self {
        Self { vars }
    }

    /// The value of `key`, if set and not empty.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.vars
            .get(key)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }

    /// Every variable (for `${VAR}` substitution in MCP server params).
    pub fn vars(&self) -> &HashMap<String, String> {
        &self.vars
    }

    /// The first executable file called `name` in a `PATH` directory. Relative entries (`.`,
    /// an empty entry) are skipped: they would be looked up from ipybox's working directory,
    /// which with `--workspace .` is a directory a sandboxed kernel can write.
    pub fn find_on_path(&self, name: &str) -> Option<PathBuf> {
        let path = self.get("PATH")?;
        std::env::split_paths(path)
            .filter(|d| d.is_absolute())
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    }

    /// `PATH` without its relative entries (see [`HostEnv::find_on_path`]); `None` if unset or
    /// nothing is left.
    pub fn absolute_path(&self) -> Option<String> {
        let path = self.get("PATH")?;
        let kept: Vec<&str> = path
            .split(':')
            .filter(|d| Path::new(d).is_absolute())
            .collect();
        (!kept.is_empty()).then(|| kept.join(":"))
    }

    /// ipybox's per-user data directory: `$IPYBOX_HOME`, else `$XDG_DATA_HOME/ipybox`, else
    /// `~/.local/share/ipybox`; `None` without any of them.
    pub fn data_dir(&self) -> Option<PathBuf> {
        if let Some(dir) = self.get("IPYBOX_HOME") {
            return Some(PathBuf::from(dir));
        }
        if let Some(dir) = self.get("XDG_DATA_HOME") {
            return Some(PathBuf::from(dir).join("ipybox"));
        }
        self.get("HOME")
            .map(|home| PathBuf::from(home).join(".local/share/ipybox"))
    }
}
