//! The environment a local kernel process starts with: a minimal base taken from the host,
//! ipybox's own variables, and the caller's `kernel_env` (SDK `kernel_env`, the MCP server's
//! `KERNEL_ENV_*` in the workspace `.env`), combined by one rule per variable — the table in
//! docs/kernel.md ("The kernel's environment"):
//!
//! - `PYTHONPATH` merges: ipybox's runtime directory, then the caller's entries in their order
//!   (empty entries are dropped: they would mean "the working directory"), except those inside
//!   the workspace. The workspace (and the caller's entries inside it, and a confined kernel's
//!   own working directory) is never on `PYTHONPATH`: the interpreter would import
//!   `sitecustomize`, or a module shadowing one the kernel imports, from there as it starts, and
//!   a sandboxed kernel can write the workspace. The kernel appends these directories to the end
//!   of `sys.path` once it is up ([`import_path_after_start`], `ipybox_runtime.import_path`);
//! - `PATH` merges: the kernel environment's `bin` first (so `!python` and `!pip` are the
//!   kernel's), then the caller's `PATH` if given, else the host's;
//! - `IPYBOX_TOOL_SOCKET` is ipybox's (the executor sets it after the caller's variables);
//! - every other variable is the caller's when given (`TMPDIR`, `MPLBACKEND`, `LANG`, `TERM`,
//!   `NO_COLOR`, ...), else ipybox's default.
//!
//! Not here: which host variables reach kernels at all ([`crate::host_env`]); remote kernels,
//! whose bootstrap cell applies the same rules in the kernel ([`super::gateway::bootstrap`]).

use std::collections::BTreeMap;

use super::{KernelConfig, fixed_env};

/// Used when neither the caller nor the host has a `PATH`.
const DEFAULT_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// The kernel process's environment for `config` (sorted by name).
pub(crate) fn local(config: &KernelConfig) -> Vec<(String, String)> {
    let mut env: BTreeMap<String, String> = BTreeMap::new();
    let host = |k: &str| config.host.get(k).map(str::to_string);
    for k in crate::host_env::IDENTITY
        .iter()
        .chain(crate::host_env::NETWORK)
    {
        if let Some(v) = host(k) {
            env.insert(k.to_string(), v);
        }
    }
    env.entry("LANG".into()).or_insert_with(|| "C.UTF-8".into());
    env.insert(
        "TMPDIR".into(),
        super::runtime_dir::temp_dir(&config.host)
            .display()
            .to_string(),
    );
    for (k, v) in fixed_env() {
        env.insert(k.into(), v.into());
    }
    for (k, v) in &config.env {
        env.insert(k.clone(), v.clone());
    }
    // The merged variables, computed from the caller's value (if any) and ipybox's own entries.
    let venv_bin = config.python.parent().map(|p| p.display().to_string());
    let rest = config
        .env
        .get("PATH")
        .cloned()
        .or_else(|| host("PATH"))
        .unwrap_or_else(|| DEFAULT_PATH.to_string());
    env.insert(
        "PATH".into(),
        join(venv_bin.into_iter().chain(split(&rest))),
    );
    let own = config.python_path.iter().map(|p| p.display().to_string());
    let user = caller_path(config).filter(|e| !in_workspace(config, e));
    env.insert("PYTHONPATH".into(), join(own.chain(user)));
    env.into_iter().collect()
}

/// The directories the kernel appends to `sys.path` once it is up, in order: the workspace, the
/// caller's `PYTHONPATH` entries inside it, and the kernel's working directory when it is not
/// the workspace (a confined kernel's own). At the end of `sys.path`, after the standard library
/// and the kernel environment's packages, so that nothing there is shadowed by a file in the
/// workspace; and only after start, so that nothing there runs as the interpreter starts.
pub(crate) fn import_path_after_start(config: &KernelConfig) -> Vec<String> {
    let mut dirs = vec![config.workspace.display().to_string()];
    dirs.extend(
        caller_path(config)
            .filter(|e| in_workspace(config, e))
            .map(|e| config.cwd().join(e).display().to_string()),
    );
    if config.cwd() != config.workspace {
        dirs.push(config.cwd().display().to_string());
    }
    let mut seen = std::collections::HashSet::new();
    dirs.retain(|d| seen.insert(d.clone()));
    dirs
}

/// The caller's `PYTHONPATH` entries (from `kernel_env`), empty ones dropped.
fn caller_path(config: &KernelConfig) -> impl Iterator<Item = String> + '_ {
    split(
        config
            .env
            .get("PYTHONPATH")
            .map(String::as_str)
            .unwrap_or(""),
    )
}

/// Whether a `PYTHONPATH` entry lies in the workspace (relative entries are taken from the
/// kernel's working directory, as Python takes them). Lexical: `..` is not resolved, so an
/// entry that climbs out with `..` is counted as inside (kept off `PYTHONPATH`).
fn in_workspace(config: &KernelConfig, entry: &str) -> bool {
    let path = std::path::Path::new(entry);
    let abs = if path.is_absolute() {
        path.to_path_buf()
    } else {
        config.cwd().join(path)
    };
    abs.starts_with(&config.workspace)
        || abs.starts_with(config.cwd())
        || abs
            .components()
            .any(|c| c == std::path::Component::ParentDir)
}

/// The non-empty entries of a `:`-separated list.
fn split(list: &str) -> impl Iterator<Item = String> + '_ {
    list.split(':')
        .filter(|e| !e.is_empty())
        .map(str::to_string)
}

fn join(entries: impl Iterator<Item = String>) -> String {
    entries.collect::<Vec<_>>().join(":")
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::path::PathBuf;

    use super::*;
    use crate::host_env::HostEnv;

    fn config(user: &[(&str, &str)]) -> KernelConfig {
        let host = HostEnv::from_vars(HashMap::from([
            ("PATH".to_string(), "/host/bin:/usr/bin".to_string()),
            ("HOME".to_string(), "/home/u".to_string()),
            ("SECRET_TOKEN".to_string(), "s3cr3t".to_string()),
        ]));
        let mut c = KernelConfig::new(PathBuf::from("/env/bin/python"), PathBuf::from("/ws"), host);
        c.python_path = vec![PathBuf::from("/run/ipybox/python")];
        c.env = user
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        c
    }

    fn get(env: &[(String, String)], key: &str) -> Option<String> {
        env.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone())
    }

    /// The caller's `kernel_env`, a variable, and its expected value in the kernel.
    type Row = (
        &'static [(&'static str, &'static str)],
        &'static str,
        Option<&'static str>,
    );

    #[test]
    fn each_variable_follows_its_rule() {
        let table: &[Row] = &[
            (&[], "PYTHONPATH", Some("/run/ipybox/python")),
            (
                &[("PYTHONPATH", "/a")],
                "PYTHONPATH",
                Some("/run/ipybox/python:/a"),
            ),
            (
                &[("PYTHONPATH", "/a:/b::/c")],
                "PYTHONPATH",
                Some("/run/ipybox/python:/a:/b:/c"),
            ),
            (
                &[("PYTHONPATH", "/a:/ws/lib:lib:/b/../ws/x")],
                "PYTHONPATH",
                Some("/run/ipybox/python:/a"),
            ),
            (
                &[("PYTHONPATH", "")],
                "PYTHONPATH",
                Some("/run/ipybox/python"),
            ),
            (&[], "PATH", Some("/env/bin:/host/bin:/usr/bin")),
            (&[("PATH", "/mine")], "PATH", Some("/env/bin:/mine")),
            (&[("PATH", "")], "PATH", Some("/env/bin")),
            (
                &[],
                "MPLBACKEND",
                Some("module://matplotlib_inline.backend_inline"),
            ),
            (&[("MPLBACKEND", "Agg")], "MPLBACKEND", Some("Agg")),
            (&[("TMPDIR", "/mytmp")], "TMPDIR", Some("/mytmp")),
            (&[("TERM", "xterm")], "TERM", Some("xterm")),
            (&[("LANG", "de_DE.UTF-8")], "LANG", Some("de_DE.UTF-8")),
            (&[], "LANG", Some("C.UTF-8")),
            (&[], "HOME", Some("/home/u")),
            (&[], "SECRET_TOKEN", None),
            (&[("MY_VAR", "x")], "MY_VAR", Some("x")),
        ];
        for (user, key, want) in table {
            let env = local(&config(user));
            assert_eq!(get(&env, key).as_deref(), *want, "{key} with {user:?}");
        }
    }

    #[test]
    fn the_workspace_is_imported_only_after_start() {
        let c = config(&[("PYTHONPATH", "/a:/ws/lib:lib:/ws")]);
        assert_eq!(import_path_after_start(&c), ["/ws", "/ws/lib"]);
        let mut confined = config(&[]);
        confined.cwd = Some(PathBuf::from("/run/k/work"));
        assert_eq!(import_path_after_start(&confined), ["/ws", "/run/k/work"]);
    }
}
