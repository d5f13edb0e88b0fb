//! What a sandboxed kernel's environment may hold, and how it crosses into the sandbox without
//! touching the host processes on the way (srt, which is Node, the `sh` it starts, bubblewrap,
//! socat).
//!
//! - srt gets [`outer`]: ipybox's own minimal environment, built from the host (`PATH` without
//!   relative entries, identity, locale, proxy and CA variables, its temp directories). Never a
//!   value of the caller's `kernel_env` or of `KERNEL_ENV_*` in the workspace `.env`.
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

use super::SandboxError;
use super::wrap::shell_quote;
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

/// srt's own environment: what it needs to run, from the host. `tmp` is srt's temp directory
/// (its proxy bridge sockets; only the host writes it), `kernel_tmp` the kernel's (srt passes it
/// on as the kernel's `TMPDIR`).
pub(crate) fn outer(host: &HostEnv, tmp: &Path, kernel_tmp: &Path) -> Vec<(String, String)> {
    let mut env = BTreeMap::new();
    env.insert(
        "PATH".to_string(),
        host.absolute_path()
            .unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into()),
    );
    for k in crate::host_env::IDENTITY
        .iter()
        .chain(crate::host_env::NETWORK)
    {
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

    #[test]
    fn srt_gets_host_variables_only() {
        let host = HostEnv::from_vars(
            [
                ("PATH", ".:/usr/bin::bin:/bin"),
                ("HOME", "/home/u"),
                ("SECRET", "s"),
                ("NODE_OPTIONS", "--require x"),
            ]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        );
        let env = outer(&host, Path::new("/rt/srt"), Path::new("/rt/box/tmp"));
        let names: Vec<&str> = env.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(names, ["CLAUDE_CODE_TMPDIR", "HOME", "PATH", "TMPDIR"]);
        assert_eq!(env[2].1, "/usr/bin:/bin");
    }
}
