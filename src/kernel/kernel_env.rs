//! The environment a local kernel process starts with: a minimal base taken from the host,
//! ipybox's own variables, and the caller's `kernel_env` (SDK `kernel_env`, the MCP server's
//! `KERNEL_ENV_*` in the workspace `.env`), combined by one rule per variable — the table in
//! docs/kernel.md ("The kernel's environment"):
//!
//! - `PYTHONPATH` merges: ipybox's runtime directory, then the workspace, then the caller's
//!   entries in their order (empty entries are dropped: they would mean "the working directory");
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
    let own = config
        .python_path
        .iter()
        .chain(std::iter::once(&config.workspace))
        .map(|p| p.display().to_string());
    let user = config
        .env
        .get("PYTHONPATH")
        .map(String::as_str)
        .unwrap_or("");
    env.insert("PYTHONPATH".into(), join(own.chain(split(user))));
    env.into_iter().collect()
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
            (&[], "PYTHONPATH", Some("/run/ipybox/python:/ws")),
            (
                &[("PYTHONPATH", "/a")],
                "PYTHONPATH",
                Some("/run/ipybox/python:/ws:/a"),
            ),
            (
                &[("PYTHONPATH", "/a:/b::/c")],
                "PYTHONPATH",
                Some("/run/ipybox/python:/ws:/a:/b:/c"),
            ),
            (
                &[("PYTHONPATH", "")],
                "PYTHONPATH",
                Some("/run/ipybox/python:/ws"),
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
}
