//! What a sandboxed kernel's environment may hold, and how it crosses into the sandbox without
//! touching the host processes on the way (srt, which is Node, the `sh` it starts, bubblewrap,
//! socat).
//!
//! - srt gets [`outer`]: ipybox's own minimal environment, built from the host (`PATH` without
//!   relative entries, `HOME`, the CA-bundle variables, its temp directories): nothing a kernel
//!   is not given anyway, because everything in it is readable inside the sandbox (bubblewrap's
//!   pid 1 keeps srt's environment, `/proc/1/environ`). Never a value of the caller's
//!   `kernel_env` or of `KERNEL_ENV_*` in the workspace `.env`, and no proxy variable: the
//!   host's upstream proxy, credentials and all, reaches srt through its settings file instead
//!   ([`parent_proxy`], srt's `network.parentProxy`), which the sandbox cannot read.
//! - The kernel's variables are written by the host to a private file in the kernel's host-only
//!   directory ([`write_file`]) and sourced by the shell inside the sandbox, right before it
//!   `exec`s the kernel. Values never appear in a command line (which any local user can read).
//! - Loader variables ([`REFUSED`], [`REFUSED_PREFIXES`]) are refused in `kernel_env` for a
//!   sandboxed kernel ([`check_kernel_env`]): they make programs load code they name, which is
//!   exactly what must never steer a host process.
//!
//! Not here: the variables themselves (`kernel/kernel_env.rs`), the policy (`policy.rs`).

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{Map, Value};

use super::SandboxError;
use super::shell::shell_quote;
use crate::host_env::HostEnv;

/// Variables that make a program load or run code they name (or change how a shell runs what
/// it is given), refused in a sandboxed kernel's `kernel_env`.
pub const REFUSED: &[&str] = &[
    "NODE_OPTIONS",
    "NODE_PATH",
    "PYTHONSTARTUP",
    "PYTHONINSPECT",
    "PYTHONHOME",
    "BASH_ENV",
    "ENV",
    "SHELLOPTS",
    "BASHOPTS",
    "PS4",
    "PROMPT_COMMAND",
    "PERL5OPT",
    "PERL5LIB",
    "PERLLIB",
    "RUBYOPT",
    "RUBYLIB",
    "JAVA_TOOL_OPTIONS",
    "_JAVA_OPTIONS",
    "JDK_JAVA_OPTIONS",
    "GCONV_PATH",
];

/// Prefixes of refused variables: the dynamic loaders' (`LD_PRELOAD`, `LD_LIBRARY_PATH`,
/// `LD_AUDIT`, ...; macOS `DYLD_*`) and bash's exported functions.
pub const REFUSED_PREFIXES: &[&str] = &["LD_", "DYLD_", "BASH_FUNC_"];

/// Variables srt sets for the sandboxed process itself (its temp directory, its proxy, git's
/// route through it; names compared case-insensitively): the kernel keeps srt's values, so they
/// are not written to the kernel's environment file.
const SRT_OWNED: &[&str] = &[
    "TMPDIR",
    "SANDBOX_RUNTIME",
    "GIT_CONFIG_PARAMETERS",
    "GIT_SSH_COMMAND",
    "ALL_PROXY",
    "FTP_PROXY",
    "GRPC_PROXY",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "RSYNC_PROXY",
];

/// Refuses `kernel_env` variables that could steer a host process, and names that cannot cross
/// a shell (`export NAME=...` needs a shell identifier).
pub(crate) fn check_kernel_env(kernel_env: &BTreeMap<String, String>) -> Result<(), SandboxError> {
    for name in kernel_env.keys() {
        let loader = REFUSED.contains(&name.as_str())
            || REFUSED_PREFIXES.iter().any(|p| name.starts_with(p));
        if loader {
            return Err(SandboxError::Refused {
                reason: format!(
                    "the kernel environment sets `{name}`, a variable that makes programs load code it names; \
                     a sandboxed kernel's variables must never be able to steer a process on the host \
                     (srt, bubblewrap, socat run outside the sandbox)"
                ),
                help: format!(
                    "remove `{name}` from kernel_env (for the MCP server: `KERNEL_ENV_{name}` in the \
                     environment or the workspace .env); if code in the kernel needs it, set it there \
                     (os.environ[\"{name}\"] = ...) for the processes the kernel starts"
                ),
            });
        }
        let shell_name = name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !shell_name {
            return Err(SandboxError::Refused {
                reason: format!(
                    "the kernel environment variable name `{name}` is not a shell identifier, and a \
                     sandboxed kernel's variables are set by a shell inside the sandbox"
                ),
                help: "use letters, digits and `_` only, not starting with a digit".into(),
            });
        }
    }
    Ok(())
}

/// What srt takes from the host's environment besides `PATH`: `HOME` (srt expands `~` in the
/// policy with it) and where the CA bundles are (its proxy's TLS to an upstream proxy). The
/// kernel is given all of these anyway.
const OUTER_FROM_HOST: &[&str] = &[
    "HOME",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "REQUESTS_CA_BUNDLE",
    "NODE_EXTRA_CA_CERTS",
];

/// srt's own environment: what it needs to run, from the host. Everything in it can be read
/// inside the sandbox (`/proc/1/environ`, bubblewrap's pid 1), so it holds nothing a kernel is
/// not given anyway: no proxy variables (see [`parent_proxy`]), no identity or locale (the
/// kernel gets those from its own environment file). `tmp` is srt's temp directory (its proxy
/// bridge sockets; only the host writes it), `kernel_tmp` the kernel's (srt passes it on as the
/// kernel's `TMPDIR`).
pub(crate) fn outer(host: &HostEnv, tmp: &Path, kernel_tmp: &Path) -> Vec<(String, String)> {
    let mut env = BTreeMap::new();
    env.insert(
        "PATH".to_string(),
        host.absolute_path()
            .unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into()),
    );
    for k in OUTER_FROM_HOST {
        if let Some(v) = host.get(k) {
            env.insert(k.to_string(), v.to_string());
        }
    }
    env.insert("TMPDIR".into(), tmp.display().to_string());
    env.insert(
        "CLAUDE_CODE_TMPDIR".into(),
        kernel_tmp.display().to_string(),
    );
    env.into_iter().collect()
}

/// The host's upstream proxy as srt's `network.parentProxy` (`http`, `https`, `noProxy`), read
/// as srt itself would read it from its environment (`HTTP_PROXY`, else `http_proxy`;
/// `HTTPS_PROXY`, else `https_proxy`; `NO_PROXY`, else `no_proxy`), so that srt's proxy still
/// goes through it for allowed domains. Given in the settings file rather than srt's
/// environment, whose values the sandbox can read: a proxy URL may carry a password. A value
/// without a scheme gets `http://` (as curl and srt read it); one that is not an http(s) URL
/// with a host is left out, with a warning. None without any proxy variable.
pub(crate) fn parent_proxy(host: &HostEnv) -> Option<Value> {
    let var = |upper: &str, lower: &str| host.get(upper).or_else(|| host.get(lower));
    let url = |name: &str, value: &str| -> Option<String> {
        let value = value.trim();
        let with_scheme = if value.contains("://") {
            value.to_string()
        } else {
            format!("http://{value}")
        };
        let (scheme, rest) = with_scheme.split_once("://")?;
        let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
        let host_part = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
        let ok = matches!(scheme.to_ascii_lowercase().as_str(), "http" | "https")
            && !host_part.is_empty()
            && !host_part.starts_with(':')
            && !with_scheme.chars().any(char::is_whitespace);
        if !ok {
            tracing::warn!(
                "ignoring {name} for the sandbox's upstream proxy: not an http(s) URL with a host"
            );
        }
        ok.then_some(with_scheme)
    };
    let mut proxy = Map::new();
    if let Some(v) = var("HTTP_PROXY", "http_proxy").and_then(|v| url("HTTP_PROXY", v)) {
        proxy.insert("http".into(), Value::String(v));
    }
    if let Some(v) = var("HTTPS_PROXY", "https_proxy").and_then(|v| url("HTTPS_PROXY", v)) {
        proxy.insert("https".into(), Value::String(v));
    }
    if proxy.is_empty() {
        return None;
    }
    if let Some(v) = var("NO_PROXY", "no_proxy") {
        proxy.insert("noProxy".into(), Value::String(v.to_string()));
    }
    Some(Value::Object(proxy))
}

/// The shell text that sets `env` (the kernel's whole environment) inside the sandbox: one
/// `export NAME='value'` per variable that srt's environment `outer` does not already pass on
/// with the same value, srt's own ([`SRT_OWNED`]) left to srt. Names were checked by
/// [`check_kernel_env`] (the caller's) or are ipybox's own; any other name is skipped.
pub(crate) fn file_text(env: &[(String, String)], outer: &[(String, String)]) -> String {
    let srt_owned = |k: &str| SRT_OWNED.iter().any(|o| o.eq_ignore_ascii_case(k));
    let passed_on = |k: &str, v: &str| outer.iter().any(|(ok, ov)| ok == k && ov == v);
    let mut text = String::new();
    for (k, v) in env {
        let valid = k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            && k.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_');
        if srt_owned(k) || passed_on(k, v) || !valid {
            continue;
        }
        text.push_str(&format!("export {k}={}\n", shell_quote(v)));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loader_variables_and_odd_names_are_refused() {
        for name in [
            "LD_PRELOAD",
            "LD_LIBRARY_PATH",
            "NODE_OPTIONS",
            "BASH_ENV",
            "DYLD_INSERT_LIBRARIES",
            "PYTHONSTARTUP",
            "BASH_FUNC_x%%",
        ] {
            let env = BTreeMap::from([(name.to_string(), "x".to_string())]);
            let msg = check_kernel_env(&env).unwrap_err().to_string();
            assert!(
                msg.contains(&format!("`{name}`")) && msg.contains("help:"),
                "{msg}"
            );
        }
        let env = BTreeMap::from([("A.B".to_string(), "x".to_string())]);
        assert!(
            check_kernel_env(&env)
                .unwrap_err()
                .to_string()
                .contains("not a shell identifier")
        );
        let env = BTreeMap::from([
            ("MY_VAR".to_string(), "x".to_string()),
            ("PYTHONPATH".to_string(), "/lib".to_string()),
        ]);
        check_kernel_env(&env).unwrap();
    }

    #[test]
    fn the_file_round_trips_through_sh_and_leaves_srt_its_own() {
        let env: Vec<(String, String)> = [
            ("A", "it's \"$HOME\" `x` \\ \n two"),
            ("TMPDIR", "/not/this"),
            ("https_proxy", "http://not-this"),
            ("HOME", "/home/u"),
            ("LANG", "de_DE.UTF-8"),
            ("EMPTY", ""),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let outer = vec![
            ("HOME".to_string(), "/home/u".to_string()),
            ("LANG".to_string(), "C.UTF-8".to_string()),
        ];
        let text = file_text(&env, &outer);
        for gone in ["TMPDIR", "https_proxy", "export HOME"] {
            assert!(!text.contains(gone), "{text}");
        }
        assert!(text.contains("export LANG=de_DE.UTF-8\n"), "{text}");
        #[allow(clippy::disallowed_methods)] // a test of shell quoting, not a host child
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!(
                "{text}printf '<%s><%s>' \"$A\" \"${{EMPTY-unset}}\""
            ))
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8(out.stdout).unwrap(),
            "<it's \"$HOME\" `x` \\ \n two><>"
        );
    }

    fn host(vars: &[(&str, &str)]) -> HostEnv {
        HostEnv::from_vars(
            vars.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    }

    #[test]
    fn srt_gets_nothing_a_kernel_should_not_see() {
        let host = host(&[
            ("PATH", ".:/usr/bin::bin:/bin"),
            ("HOME", "/home/u"),
            ("USER", "u"),
            ("LANG", "de_DE.UTF-8"),
            ("SECRET", "s"),
            ("AWS_SECRET_ACCESS_KEY", "k"),
            ("NODE_OPTIONS", "--require x"),
            ("HTTPS_PROXY", "http://user:pass@proxy:3128"),
            ("http_proxy", "http://user:pass@proxy:3128"),
            ("NO_PROXY", "internal"),
            ("SSL_CERT_FILE", "/etc/ca.pem"),
        ]);
        let env = outer(&host, Path::new("/rt/srt"), Path::new("/rt/box/tmp"));
        assert_eq!(
            env,
            [
                ("CLAUDE_CODE_TMPDIR", "/rt/box/tmp"),
                ("HOME", "/home/u"),
                ("PATH", "/usr/bin:/bin"),
                ("SSL_CERT_FILE", "/etc/ca.pem"),
                ("TMPDIR", "/rt/srt"),
            ]
            .map(|(k, v)| (k.to_string(), v.to_string()))
        );
    }

    #[test]
    fn the_hosts_proxy_reaches_srt_through_its_settings() {
        assert_eq!(parent_proxy(&host(&[("PATH", "/bin")])), None);
        // Upper case first, as srt reads its environment; HTTPS_PROXY is not taken from
        // HTTP_PROXY (srt falls back to `http` itself).
        let p = parent_proxy(&host(&[
            ("HTTP_PROXY", "http://user:pa%3Ass@proxy:3128"),
            ("http_proxy", "http://other:1"),
            ("no_proxy", "localhost,.internal"),
        ]))
        .unwrap();
        assert_eq!(
            p,
            serde_json::json!({"http": "http://user:pa%3Ass@proxy:3128", "noProxy": "localhost,.internal"})
        );
        let p = parent_proxy(&host(&[
            ("https_proxy", "proxy.corp:8080"),
            ("HTTP_PROXY", "socks5://proxy:1080"),
        ]))
        .unwrap();
        assert_eq!(p, serde_json::json!({"https": "http://proxy.corp:8080"}));
        assert_eq!(
            parent_proxy(&host(&[("HTTPS_PROXY", "http://:3128")])),
            None
        );
    }
}
