//! The first cell a kernel on a Jupyter server runs (silently, before any user code).
//!
//! The server's kernel image has only ipykernel and pydantic: the cell brings ipybox's
//! kernel-side runtime with it (the sources of `python/ipybox_runtime`, served by an in-memory
//! importer), then does what a local kernel gets from its command line and environment: the
//! kernel's environment variables (ipybox's fixed ones plus `kernel_env`), no colours, the output
//! flush patch, tool calls over the stdin channel, workspace imports from the host, the
//! working-directory guard and shell-command approval.

use include_dir::Dir;
use serde_json::Value;

use crate::kernel::{KernelConfig, ShellApproval};

const BOOTSTRAP: &str = r#"def _ipybox_bootstrap(sources, env, restore_cwd, shell_guard):
    import importlib.abc, importlib.util, os, sys

    class EmbeddedRuntime(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, name, path=None, target=None):
            if name not in sources:
                return None
            origin = "ipybox-embedded://" + name.replace(".", "/") + ".py"
            return importlib.util.spec_from_loader(name, self, origin=origin, is_package="." not in name)

        def create_module(self, spec):
            return None

        def exec_module(self, module):
            code = compile(sources[module.__name__], module.__spec__.origin, "exec")
            exec(code, module.__dict__)

    sys.meta_path.insert(0, EmbeddedRuntime())
    os.environ.update(env)
    # kernel_env's PYTHONPATH: importable now, whether or not the server passed it to the
    # kernel process (servers often drop variables that are not KERNEL_*).
    entries = [e for e in env.get("PYTHONPATH", "").split(os.pathsep) if e and e not in sys.path]
    sys.path[0:0] = entries
    ip = get_ipython()
    __import__("ipybox_runtime.output_flush", fromlist=["install"]).install()
    try:
        ip.kernel._execute_sleep = 0
    except Exception:
        pass
    for magic, arg in (("colors", "nocolor"), ("xmode", "Context")):
        try:
            ip.run_line_magic(magic, arg)
        except Exception:
            pass
    __import__("ipybox_runtime.stdin_channel", fromlist=["install"]).install(ip)
    __import__("ipybox_runtime.host_import", fromlist=["install"]).install()
    if restore_cwd:
        __import__("ipybox_runtime.working_dir", fromlist=["install"]).install(os.getcwd())
    if shell_guard is not None:
        __import__("ipybox_runtime.shell_guard", fromlist=["install"]).install(shell_guard)
"#;

/// A silent cell that fails unless the bootstrap cell ran in this kernel (checked when another
/// replica's kernel is attached); binds no name in the user's namespace.
pub(crate) const PROBE: &str = r#"__import__("sys").modules["ipybox_runtime.stdin_channel"]"#;

/// The bootstrap cell for a kernel configured by `config`; `runtime` is ipybox's embedded
/// `python/` directory.
pub(crate) fn cell(config: &KernelConfig, runtime: &Dir<'_>) -> String {
    let mut sources = serde_json::Map::new();
    collect(runtime, &mut sources);
    let mut env = serde_json::Map::new();
    for (k, v) in crate::kernel::fixed_env() {
        env.insert(k.to_string(), Value::String(v.to_string()));
    }
    for (k, v) in &config.env {
        env.insert(k.clone(), Value::String(v.clone()));
    }
    let restore_cwd = if config.restore_cwd { "True" } else { "False" };
    let shell_guard = match config.shell_approval {
        ShellApproval::Off => "None",
        ShellApproval::On {
            require_escape: true,
        } => "True",
        ShellApproval::On {
            require_escape: false,
        } => "False",
    };
    // A JSON object of strings is a valid Python dict literal.
    format!(
        "{BOOTSTRAP}_ipybox_bootstrap({}, {}, {restore_cwd}, {shell_guard})\ndel _ipybox_bootstrap\n",
        Value::Object(sources),
        Value::Object(env),
    )
}

/// Module name → source for every `.py` file under `dir` (`pkg/__init__.py` is `pkg`).
fn collect(dir: &Dir<'_>, out: &mut serde_json::Map<String, Value>) {
    for file in dir.files() {
        let path = file.path();
        if path.extension().and_then(|e| e.to_str()) != Some("py") {
            continue;
        }
        let Some(text) = file.contents_utf8() else {
            continue;
        };
        let mut parts: Vec<String> = path
            .with_extension("")
            .iter()
            .map(|p| p.to_string_lossy().into_owned())
            .collect();
        if parts.last().is_some_and(|p| p == "__init__") {
            parts.pop();
        }
        out.insert(parts.join("."), Value::String(text.to_string()));
    }
    for sub in dir.dirs() {
        collect(sub, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn carries_the_runtime_and_kernel_env() {
        let mut config = KernelConfig::new(
            "python3".into(),
            "/w".into(),
            crate::host_env::HostEnv::from_vars(Default::default()),
        );
        config.env.insert("MY_VAR".into(), "x'y".into());
        config.shell_approval = ShellApproval::On {
            require_escape: false,
        };
        let code = cell(&config, &crate::kernel::RUNTIME);
        assert!(code.contains(r#""ipybox_runtime":"#));
        assert!(code.contains(r#""ipybox_runtime.stdin_channel":"#));
        assert!(code.contains(r#""MY_VAR":"x'y""#));
        assert!(
            code.contains(", False, False)\n"),
            "restore_cwd off, shell guard without escape"
        );
        assert!(
            !code.contains(r#""IPYBOX_TOOL_SOCKET":"#),
            "no host socket path"
        );
    }
}
