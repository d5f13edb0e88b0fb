//! The host confines itself when the kernel is not the user's own (issue 18, host side): nothing
//! a sandboxed kernel writes is run, imported, sourced or followed by the host, and the
//! kernel's variables never reach a host process. Each test plants what hostile code in the
//! kernel would plant, then proves that the host did nothing with it (a marker file only
//! host-side code could write stays absent; the process tree shows no such child) and that the
//! server or executor stays usable. The MCP-server tests start ipybox with its working directory
//! inside the workspace and no `--workspace` (the default `.`).
//!
//! Host-only scratch directories come from `support::probe_dir` (not under `/tmp`, which the sandbox
//! hides behind an empty tmpfs: a write "succeeding" there would prove nothing).

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::proc_tree::descendants;
use crate::support::*;
use ipybox::CodeExecutor;
use ipybox::host_env::HostEnv;
use ipybox::sandbox::SandboxOptions;
use ipybox::tools::{McpSession, ServerParams, tool_output};
use rmcp::model::ContentBlock;
use serde_json::{Value, json};

/// srt as `scripts/sandbox-deps.sh` installs it.
fn srt() -> PathBuf {
    root().join("target/sandbox-deps/node_modules/.bin/srt")
}

fn options() -> SandboxOptions {
    SandboxOptions {
        srt: Some(srt()),
        ..Default::default()
    }
}

/// A host directory visible and unwritable inside the sandbox (outside /tmp, /var/tmp and
/// $HOME: `support::probe_dir`), removed on drop.
type Scratch = crate::support::Probe;

/// A canonical temporary workspace.
fn workspace() -> (tempfile::TempDir, PathBuf) {
    let t = tempfile::tempdir().unwrap();
    let p = t.path().canonicalize().unwrap();
    (t, p)
}

/// Runs `code` with the test venv's Python and returns its stdout (panics on failure).
fn py(code: &str) -> String {
    let out = std::process::Command::new(python())
        .args(["-c", code])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// A wheel of `ipybox-confinement-probe` 1.0 (module `ipybox_confinement_probe`, `VALUE = 42`)
/// in `dir`: something to install without a package index.
fn probe_wheel(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    py(&format!(
        r#"
import base64, hashlib, zipfile
files = {{
    "ipybox_confinement_probe/__init__.py": b"VALUE = 42\n",
    "ipybox_confinement_probe-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: ipybox-confinement-probe\nVersion: 1.0\n",
    "ipybox_confinement_probe-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
}}
record = ""
for name, data in files.items():
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    record += f"{{name}},sha256={{digest}},{{len(data)}}\n"
record += "ipybox_confinement_probe-1.0.dist-info/RECORD,,\n"
files["ipybox_confinement_probe-1.0.dist-info/RECORD"] = record.encode()
with zipfile.ZipFile("{}/ipybox_confinement_probe-1.0-py3-none-any.whl", "w") as z:
    for name, data in files.items():
        z.writestr(name, data)
"#,
        dir.display()
    ));
}

/// A kernel interpreter of its own in `dir` (installs must not touch the shared kernel
/// environment): a venv without pip whose `.pth` file puts the managed environment's
/// site-packages (ipykernel, pydantic, pip) on its path.
fn private_kernel_python(dir: &Path) -> PathBuf {
    let kernel = kernel_python();
    let status = std::process::Command::new(&kernel)
        .args(["-m", "venv", "--without-pip"])
        .arg(dir)
        .status()
        .unwrap();
    assert!(status.success());
    let site = |python: &Path| {
        let out = std::process::Command::new(python)
            .args([
                "-c",
                "import sysconfig; print(sysconfig.get_paths()['purelib'])",
            ])
            .output()
            .unwrap();
        PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
    };
    let python = dir.join("bin/python");
    std::fs::write(
        site(&python).join("_ipybox_kernel_env.pth"),
        format!("{}\n", site(&kernel).display()),
    )
    .unwrap();
    python
}

/// `uv`, which `scripts/test-env.sh` provides (on PATH or in `~/.local/bin`).
fn uv() -> PathBuf {
    let host = HostEnv::from_process();
    host.find_on_path("uv")
        .or_else(|| {
            let p = PathBuf::from(std::env::var("HOME").ok()?).join(".local/bin/uv");
            p.is_file().then_some(p)
        })
        .expect("uv is missing: run `bash scripts/test-env.sh`")
}

/// This process's PATH without the directories that hold `uv` (so ipybox installs with pip).
fn path_without_uv() -> String {
    std::env::var("PATH")
        .unwrap_or_default()
        .split(':')
        .filter(|d| !Path::new(d).join("uv").exists())
        .collect::<Vec<_>>()
        .join(":")
}

/// `ipybox --sandbox ARGS` as an MCP server whose working directory is `ws` (no `--workspace`:
/// the default `.`), with `env` added to its minimal environment.
async fn sandboxed_server(ws: &Path, args: &[&str], env: &[(&str, String)]) -> McpSession {
    // No session handle in results (their exact text is asserted), no checkpoints written.
    let mut argv = vec![
        "--sandbox",
        "--log-level",
        "warn",
        "--checkpoint-after",
        "off",
    ];
    argv.extend(args);
    let mut vars: serde_json::Map<String, Value> =
        env.iter().map(|(k, v)| (k.to_string(), json!(v))).collect();
    vars.insert("IPYBOX_SRT".into(), json!(srt()));
    let params = json!({"command": BIN, "args": argv, "env": vars, "cwd": ws});
    McpSession::connect(
        &ServerParams::parse(&params).unwrap(),
        &process_env(),
        Duration::from_secs(60),
    )
    .await
    .expect("sandboxed ipybox MCP server starts")
}

/// The text of a tool call that must fail.
async fn err_text(s: &McpSession, tool: &str, arguments: Value) -> String {
    let out = tool_output(&call(s, tool, arguments).await);
    assert!(out.is_error, "{tool} should fail: {}", out.text);
    out.text
}

/// Python that raises nothing and prints `<label> refused` when `action` fails with OSError,
/// `<label> DONE` when it succeeds.
fn attempt(label: &str, action: &str) -> String {
    format!(
        "try:\n    {action}\n    print('{label} DONE')\nexcept OSError:\n    print('{label} refused')\n"
    )
}

/// `PUT /reset` on the tool socket from inside the kernel: the MCP sessions close, so the next
/// tool call starts its server again (what hostile code does to get its plant run).
const RESET_SESSIONS: &str = r#"
import os, socket
s = socket.socket(socket.AF_UNIX)
s.connect(os.environ["IPYBOX_TOOL_SOCKET"])
s.sendall(b"PUT /reset HTTP/1.1\r\nHost: ipybox\r\nContent-Length: 0\r\n\r\n")
print("reset", s.recv(100).split(b" ")[1].decode())
s.close()
"#;

/// The working directories of `pid`'s descendants whose command line mentions `needle`.
fn cwds_of(pid: u32, needle: &str) -> Vec<String> {
    descendants(pid)
        .into_iter()
        .filter(|p| {
            std::fs::read(format!("/proc/{p}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(needle))
        })
        .filter_map(|p| std::fs::read_link(format!("/proc/{p}/cwd")).ok())
        .map(|c| c.display().to_string())
        .collect()
}

/// Path 2: a stdio MCP server without `cwd` and the installer behind `install_package` (pip or
/// uv) never run from ipybox's working directory (the workspace): a sandboxed cell plants
/// `echosrv.py`, `pip/__main__.py`, `uv.toml` and `pyproject.toml` there, forces new MCP
/// sessions (`PUT /reset`) and an install; none of it runs.
async fn planted_code_never_runs(installer: &str) {
    let scratch = Scratch::new(&format!("host-confinement-{installer}"));
    let (_keep, ws) = workspace();
    let marker = scratch.path().join("planted-code-ran");
    let cache_marker = scratch.path().join("planted-uv-cache");
    // A legitimate `echosrv` module on the host (outside the workspace): the fixture server.
    let lib = scratch.path().join("lib");
    std::fs::create_dir(&lib).unwrap();
    std::fs::write(
        lib.join("echosrv.py"),
        format!(
            "import runpy, sys\nsys.argv = [{f:?}, 'stdio']\nrunpy.run_path({f:?}, run_name='__main__')\n",
            f = fixture_script()
        ),
    )
    .unwrap();
    let wheels = scratch.path().join("wheels");
    probe_wheel(&wheels);
    let kernel = private_kernel_python(&scratch.path().join("venv"));
    let mut env = vec![
        ("IPYBOX_PYTHON", kernel.display().to_string()),
        // The private interpreter reaches into the managed environment (its `.pth`): keep
        // ipybox's data directory, which the sandbox may not read, elsewhere.
        (
            "IPYBOX_HOME",
            scratch.path().join("data").display().to_string(),
        ),
        ("PIP_FIND_LINKS", wheels.display().to_string()),
        ("PIP_NO_INDEX", "1".to_string()),
        ("UV_FIND_LINKS", wheels.display().to_string()),
    ];
    if installer == "uv" {
        let uv_dir = uv().parent().unwrap().display().to_string();
        env.push(("PATH", format!("{uv_dir}:{}", path_without_uv())));
    } else {
        env.push(("PATH", path_without_uv()));
    }
    let s = sandboxed_server(&ws, &[], &env).await;

    let params =
        json!({"command": python(), "args": ["-m", "echosrv"], "env": {"PYTHONPATH": lib}});
    ok_text(
        &s,
        "register_mcp_server",
        json!({"server_name": "echo", "server_params": params}),
    )
    .await;
    let greet = |name: &str| {
        format!(
            "from mcptools.echo import greet, get_cwd\nprint(greet.run(greet.Params(name={name:?})), get_cwd.run(get_cwd.Params()))"
        )
    };
    let exec = |code: String| {
        let s = &s;
        async move { ok_text(s, "execute_ipython_cell", json!({"code": code})).await }
    };
    assert_eq!(exec(greet("one")).await, "Hello, one! /");

    // What hostile code plants in the workspace (the host's former working directory).
    let payload = format!(
        "open({:?}, 'a').write('planted code ran on the host')\n",
        marker.display().to_string()
    );
    let plant = format!(
        r#"
import os
payload = {payload:?}
open("echosrv.py", "w").write(payload)
os.makedirs("pip", exist_ok=True)
open("pip/__init__.py", "w").write(payload)
open("pip/__main__.py", "w").write(payload)
open("uv.toml", "w").write('cache-dir = "{c}"\n')
open("pyproject.toml", "w").write('[project]\nname = "x"\nversion = "0"\n[tool.uv]\ncache-dir = "{c}"\n')
open(".python-version", "w").write("system\n")
print(sorted(os.listdir(".")))
{RESET_SESSIONS}
"#,
        c = cache_marker.display()
    );
    let planted = exec(plant).await;
    assert!(planted.ends_with("reset 200"), "{planted}");
    assert!(planted.contains("'echosrv.py'"), "{planted}");

    // A new session starts the server again, from `/`: the legitimate module runs.
    assert_eq!(exec(greet("two")).await, "Hello, two! /");
    let ipybox = s.pid().unwrap();
    let cwds = cwds_of(ipybox, "echosrv");
    assert!(
        !cwds.is_empty() && cwds.iter().all(|c| c == "/"),
        "{cwds:?}"
    );

    let summary = ok_text(
        &s,
        "install_package",
        json!({"package_name": "ipybox-confinement-probe==1.0"}),
    )
    .await;
    assert!(
        summary.contains("ipybox-confinement-probe")
            || summary.contains("ipybox_confinement_probe"),
        "{summary}"
    );
    assert_eq!(
        exec("import ipybox_confinement_probe as p\nprint(p.VALUE)".into()).await,
        "42"
    );
    assert!(
        !marker.exists(),
        "planted code ran on the host: {}",
        std::fs::read_to_string(&marker).unwrap_or_default()
    );
    assert!(
        !cache_marker.exists(),
        "uv read a configuration file the sandbox planted"
    );
    // A local path is refused for a sandboxed kernel (it is no package of the index).
    let refused = err_text(
        &s,
        "install_package",
        json!({"package_name": format!("{}/pkg", ws.display())}),
    )
    .await;
    assert!(
        refused.contains("is not a package requirement: it is a path") && refused.contains("help:"),
        "{refused}"
    );
    assert_eq!(exec(greet("three")).await, "Hello, three! /");
    s.close().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn planted_code_never_runs_with_pip() {
    require!(SandboxDeps, TestEnv);
    planted_code_never_runs("pip").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn planted_code_never_runs_with_uv() {
    require!(SandboxDeps, TestEnv);
    planted_code_never_runs("uv").await;
}

/// A server registered for a sandboxed kernel may not run from the workspace (its `cwd`, its
/// script): the host would start code the kernel can rewrite.
#[tokio::test(flavor = "multi_thread")]
async fn servers_that_would_run_from_the_workspace_are_refused() {
    require!(SandboxDeps, TestEnv);
    let (_keep, ws) = workspace();
    std::fs::copy(fixture_script(), ws.join("server.py")).unwrap();
    let ex = CodeExecutor::builder()
        .workspace(&ws)
        .without_spare_kernel()
        .sandbox(options())
        .build();
    for params in [
        json!({"command": python(), "args": [fixture_script(), "stdio"], "cwd": ws}),
        json!({"command": python(), "args": [ws.join("server.py"), "stdio"]}),
    ] {
        let err = ex.register_mcp_server("fx", &params).await.unwrap_err();
        assert!(
            err.to_string()
                .contains("which the sandboxed kernel can write: the host would start code"),
            "{err}"
        );
    }
    assert!(!ws.join("mcptools/fx").exists());
    ex.register_mcp_server("fx", &fixture_stdio_params("stdio"))
        .await
        .expect("a server outside the workspace registers");
}

/// Path 3: the sandbox cannot write IPython's or Jupyter's directories in the home directory
/// (a startup file there runs in the next unsandboxed `ipybox exec`, and in any IPython), not
/// even when the policy asks for it; the sandboxed kernel has private ones. Also the default
/// policy's credential stores and ipybox's data directory are unreadable, while the kernel
/// environment inside the data directory keeps working.
#[tokio::test(flavor = "multi_thread")]
async fn home_startup_files_and_credentials_are_out_of_reach() {
    require!(SandboxDeps);
    let home = Scratch::new("host-confinement-home");
    let (_keep, ws) = workspace();
    let h = home.path();
    // A home where the sandbox replaces what is there with an empty directory of its own (a
    // checkout under /tmp) would make every "refused" and "hidden" below hold whatever the
    // policy says.
    if ["/tmp", "/var/tmp", "/run", "/var/run"]
        .iter()
        .any(|d| h.starts_with(d))
    {
        return skip(&format!(
            "the scratch home {} is below a directory the sandbox empties: run from a checkout elsewhere",
            h.display()
        ));
    }
    let marker = h.join("startup-file-ran");
    // The control: a file of the home that no rule hides, which the kernel reads.
    std::fs::write(h.join("notes.txt"), "secret in plain sight").unwrap();
    std::fs::create_dir_all(h.join(".ipython/profile_default/startup")).unwrap();
    for (file, secret) in [
        (".ssh/id_ed25519", "ssh-secret"),
        (".aws/credentials", "aws-secret"),
        (".config/gh/hosts.yml", "gh-secret"),
        (".netrc", "netrc-secret"),
        (
            ".local/share/ipybox/registrations/x.json",
            "registration-secret",
        ),
    ] {
        let path = h.join(file);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, secret).unwrap();
    }
    let mut vars = process_env();
    vars.insert("HOME".into(), h.display().to_string());
    vars.remove("XDG_DATA_HOME");
    vars.remove("IPYBOX_HOME");
    let host = HostEnv::from_vars(vars.clone());
    let kernel = kernel_python();
    // The old documented example policy asked for ~/.ipython to be writable: it no longer is.
    std::fs::write(
        ws.join("policy.json"),
        r#"{"filesystem": {"denyRead": [".env", "~/.ssh", "~/.aws", "~/.config", "~/.netrc"], "allowWrite": [".", "~/.ipython"]}}"#,
    )
    .unwrap();
    for config in [None, Some("policy.json")] {
        let ex = CodeExecutor::builder()
            .workspace(&ws)
            .host_env(host.clone())
            .python(&kernel)
            .without_spare_kernel()
            .sandbox(SandboxOptions {
                config_file: config.map(PathBuf::from),
                ..options()
            })
            .build();
        ex.start().await.expect("sandboxed executor starts");
        let rt = ex.runtime_dir().await.unwrap();
        let startup = h.join(".ipython/profile_default/startup/00-planted.py");
        let mut code = String::new();
        let planted = format!(
            "open({:?}, 'w').write('ran')\n",
            marker.display().to_string()
        );
        for (label, path) in [
            ("ipython startup", startup.clone()),
            (
                "jupyter config",
                h.join(".jupyter/jupyter_server_config.py"),
            ),
            (
                "jupyter data",
                h.join(".local/share/jupyter/kernels/x/kernel.json"),
            ),
        ] {
            let p = path.display().to_string();
            code.push_str(&attempt(
                label,
                &format!("os.makedirs(os.path.dirname({p:?}), exist_ok=True); open({p:?}, 'w').write({planted:?})"),
            ));
        }
        let out = run(
            &ex,
            &format!(
                "import os\nfrom IPython.paths import get_ipython_dir\nfrom jupyter_core.paths import jupyter_data_dir, jupyter_config_dir\nprint('private', all(d.startswith({rt:?}) for d in (get_ipython_dir(), get_ipython().profile_dir.location, jupyter_data_dir(), jupyter_config_dir())))\n{code}\nfor f in ['notes.txt', '.ssh/id_ed25519', '.aws/credentials', '.config/gh/hosts.yml', '.netrc', '.local/share/ipybox/registrations/x.json']:\n    try:\n        seen = 'secret' in open(os.path.join({h:?}, f)).read()\n    except OSError:\n        seen = False\n    print(f, 'READ' if seen else 'hidden')\nimport pydantic, sys\nprint('kernel env', sys.prefix.startswith({k:?}))",
                rt = rt.display().to_string(),
                h = h.display().to_string(),
                k = kernel.parent().unwrap().parent().unwrap().display().to_string(),
            ),
        )
        .await;
        assert_eq!(
            out,
            "private True\nipython startup refused\njupyter config refused\njupyter data refused\nnotes.txt READ\n.ssh/id_ed25519 hidden\n.aws/credentials hidden\n.config/gh/hosts.yml hidden\n.netrc hidden\n.local/share/ipybox/registrations/x.json hidden\nkernel env True",
            "policy {config:?}"
        );
        assert!(!startup.exists());
        assert!(!h.join(".jupyter/jupyter_server_config.py").exists());
        assert!(
            !h.join(".local/share/jupyter/kernels/x/kernel.json")
                .exists()
        );
        ex.stop().await;
    }
    // The next unsandboxed `ipybox exec` (the user's own IPython profile) runs no planted file.
    let out = std::process::Command::new(BIN)
        .args(["exec", "-c", "print('exec ok')"])
        .current_dir(&ws)
        .env_clear()
        .envs(&vars)
        .env("IPYBOX_PYTHON", &kernel)
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "exec ok\n",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!marker.exists(), "a planted startup file ran");
}

/// With the workspace holding the home directory (or the kernel's interpreter, or srt), a
/// sandbox could plant what the host runs: refused before anything starts.
#[tokio::test(flavor = "multi_thread")]
async fn a_workspace_holding_what_the_host_runs_is_refused() {
    require!(SandboxDeps);
    let (_keep, ws) = workspace();
    let venv = ws.join("venv/bin/python");
    let mut vars = process_env();
    vars.insert("HOME".into(), ws.join("home").display().to_string());
    vars.insert(
        "IPYBOX_HOME".into(),
        root()
            .join("target/unused-ipybox-home")
            .display()
            .to_string(),
    );
    for (host, python, what) in [
        (vars.clone(), None, "your home directory"),
        (process_env(), Some(venv), "the kernel's Python environment"),
    ] {
        let mut b = CodeExecutor::builder()
            .workspace(&ws)
            .host_env(HostEnv::from_vars(host))
            .without_spare_kernel()
            .sandbox(options());
        if let Some(p) = python {
            b = b.python(p);
        }
        let ex = b.build();
        let msg = ex.start().await.unwrap_err().to_string();
        assert!(
            msg.starts_with("refusing to start a sandboxed kernel: ")
                && msg.contains(what)
                && msg.contains("which the sandboxed kernel can write")
                && msg.contains("help:"),
            "{msg}"
        );
        assert!(ex.kernel_pid().await.is_none());
    }
}

/// Live processes (pid, command line) below `pid` whose command line mentions `needle`.
fn processes_below(pid: u32, needle: &str) -> Vec<(u32, String)> {
    descendants(pid)
        .into_iter()
        .filter_map(|p| {
            let cmd = std::fs::read(format!("/proc/{p}/cmdline")).ok()?;
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            cmd.contains(needle).then_some((p, cmd))
        })
        .collect()
}

/// Path 4: the sandbox cannot create or replace the workspace `.env` (nor the policy file the
/// next start reads); `KERNEL_ENV_*` values reach the kernel and no host process (srt, its
/// shell, bubblewrap, socat); loader variables are refused with a clear message.
#[tokio::test(flavor = "multi_thread")]
async fn the_environment_of_the_next_start_cannot_be_planted() {
    require!(SandboxDeps, TestEnv);
    let scratch = Scratch::new("host-confinement-dotenv");
    let (_keep, ws) = workspace();
    let marker = scratch.path().join("evil-js-ran");
    std::fs::write(
        ws.join("evil.js"),
        format!(
            "require('fs').writeFileSync({:?}, 'ran')\n",
            marker.display().to_string()
        ),
    )
    .unwrap();
    // No .env and no policy file yet (the codeact-sandbox plugin passes a path that may not
    // exist): the sandbox tries to create them, also by rename and as a link.
    let s = sandboxed_server(&ws, &["--sandbox-config", "sandbox-config.json"], &[]).await;
    let mut code = String::from(
        "import os\nopen('staged', 'w').write('KERNEL_ENV_NODE_OPTIONS=--require ./evil.js\\n')\n",
    );
    for target in [".env", "sandbox-config.json"] {
        code.push_str(&attempt(
            &format!("write {target}"),
            &format!("open({target:?}, 'w').write('{{}}')"),
        ));
        code.push_str(&attempt(
            &format!("rename {target}"),
            &format!("os.rename('staged', {target:?})"),
        ));
        code.push_str(&attempt(
            &format!("link {target}"),
            &format!("os.symlink('staged', {target:?})"),
        ));
    }
    assert_eq!(
        ok_text(&s, "execute_ipython_cell", json!({"code": code})).await,
        "write .env refused\nrename .env refused\nlink .env refused\nwrite sandbox-config.json refused\nrename sandbox-config.json refused\nlink sandbox-config.json refused"
    );
    s.close().await;
    for name in [".env", "sandbox-config.json"] {
        assert!(
            std::fs::symlink_metadata(ws.join(name)).is_err(),
            "{name} exists after the session"
        );
    }

    // A `.env` the user wrote: KERNEL_ENV_ values reach the kernel, not srt & co.
    std::fs::write(ws.join(".env"), "KERNEL_ENV_CANARY=kernel-only-value\n").unwrap();
    let s = sandboxed_server(&ws, &[], &[]).await;
    assert_eq!(
        ok_text(
            &s,
            "execute_ipython_cell",
            json!({"code": "import os\nprint(os.environ['CANARY'], os.environ['SANDBOX_RUNTIME'])"})
        )
        .await,
        "kernel-only-value 1"
    );
    let ipybox = s.pid().unwrap();
    // Every host process of the sandbox: all but the kernel itself and the kernel factory's
    // template (the Python the shell inside the sandbox `exec`s after sourcing the kernel's
    // variables, whichever kernel environment the server resolved).
    type Processes = Vec<(u32, String)>;
    let (kernels, wrappers): (Processes, Processes) = processes_below(ipybox, "")
        .into_iter()
        .partition(|(_, cmd)| {
            cmd.split(' ').next().is_some_and(|exe| {
                exe.rsplit('/')
                    .next()
                    .is_some_and(|n| n.starts_with("python"))
            })
        });
    assert!(
        wrappers.iter().any(|(_, c)| c.contains("--settings"))
            && wrappers.iter().any(|(_, c)| c.contains("bwrap")),
        "{wrappers:?}"
    );
    // A read that fails is a failure, not an empty environment.
    let environ_of = |pid: u32| -> String {
        let bytes = std::fs::read(format!("/proc/{pid}/environ"))
            .unwrap_or_else(|e| panic!("cannot read the environment of {pid}: {e}"));
        String::from_utf8_lossy(&bytes).into_owned()
    };
    // The control: read the same way, the kernel's side (the process started with the kernel's
    // variables) has it.
    assert!(
        kernels
            .iter()
            .any(|(pid, _)| environ_of(*pid).contains("CANARY=kernel-only-value")),
        "no kernel process has CANARY: {kernels:?}"
    );
    for (pid, cmd) in &wrappers {
        let environ = environ_of(*pid);
        // The control: the read sees that process's environment (a failed or empty read would
        // find no CANARY either).
        assert!(
            environ.split('\0').any(|v| v.starts_with("PATH=")),
            "no PATH in the environment of {pid} {cmd}"
        );
        assert!(
            !environ.contains("kernel-only-value") && !environ.contains("CANARY"),
            "a kernel variable reached a host process: {pid} {cmd}"
        );
        assert!(
            !cmd.contains("kernel-only-value"),
            "a kernel variable is on a command line: {cmd}"
        );
    }
    s.close().await;

    // A loader variable for the kernel: refused, and srt never sees it.
    std::fs::write(
        ws.join(".env"),
        format!(
            "KERNEL_ENV_NODE_OPTIONS=--require {}/evil.js\n",
            ws.display()
        ),
    )
    .unwrap();
    let s = sandboxed_server(&ws, &[], &[]).await;
    let msg = err_text(&s, "execute_ipython_cell", json!({"code": "print(1)"})).await;
    assert!(
        msg.contains("refusing to start a sandboxed kernel: the kernel environment sets `NODE_OPTIONS`")
            && msg.contains("help: remove `NODE_OPTIONS` from kernel_env (for the MCP server: `KERNEL_ENV_NODE_OPTIONS`"),
        "{msg}"
    );
    // Still answering (with the same reason) after the refusal.
    let again = err_text(&s, "execute_ipython_cell", json!({"code": "print(1)"})).await;
    assert!(again.contains("NODE_OPTIONS"), "{again}");
    s.close().await;
    assert!(!marker.exists(), "evil.js ran on the host");

    // The SDK's kernel_env gets the same answer for the dynamic loader's variables.
    let ex = CodeExecutor::builder()
        .workspace(&ws)
        .kernel_env([("LD_PRELOAD", "/x.so")])
        .without_spare_kernel()
        .sandbox(options())
        .build();
    let msg = ex.start().await.unwrap_err().to_string();
    assert!(msg.contains("`LD_PRELOAD`"), "{msg}");
}

/// A tiny PNG (1x1), base64.
const PNG: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==";

fn png_bytes() -> Vec<u8> {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD
        .decode(PNG)
        .unwrap()
}

/// Path 5: links the sandbox puts in the workspace redirect no host write or read: a linked
/// `mcptools` or server folder (registration refuses, deletes nothing there), a linked `images`
/// (nothing written there), and an image file swapped for a link to a file the sandbox cannot
/// read (the MCP client gets the bytes the kernel displayed).
#[tokio::test(flavor = "multi_thread")]
async fn links_in_the_workspace_redirect_nothing() {
    require!(SandboxDeps, TestEnv);
    let outside = Scratch::new("host-confinement-links");
    let o = outside.path();
    std::fs::create_dir_all(o.join("fx")).unwrap();
    std::fs::write(o.join("fx/keep.txt"), "precious").unwrap();
    let (_keep, ws) = workspace();
    let ex = CodeExecutor::builder()
        .workspace(&ws)
        .without_spare_kernel()
        .sandbox(options())
        .build();
    ex.start().await.unwrap();
    ex.register_mcp_server("fx", &fixture_stdio_params("stdio"))
        .await
        .unwrap();
    let listing = || {
        let mut v: Vec<String> = walk(o);
        v.sort();
        v
    };
    let before = listing();
    let o_s = o.display().to_string();
    // The sandboxed kernel cannot plant them: `mcptools/` is read-only to it (issue 50).
    assert_eq!(
        run(
            &ex,
            &format!(
                "import os, errno\ntry:\n    os.symlink({o_s:?}, 'mcptools/fx2')\nexcept OSError as e:\n    print(errno.errorcode[e.errno])"
            )
        )
        .await,
        "EROFS"
    );
    // Planted from outside the sandbox, as an older ipybox's sandboxed kernel could: the host
    // still writes and deletes nothing through them.
    let mcptools = ws.join("mcptools");
    let plants: [(&dyn Fn(), &str); 2] = [
        (
            &|| {
                std::fs::remove_dir_all(&mcptools).unwrap();
                std::os::unix::fs::symlink(o, &mcptools).unwrap();
            },
            "mcptools",
        ),
        (
            &|| {
                std::fs::remove_file(&mcptools).unwrap();
                std::fs::create_dir(&mcptools).unwrap();
                std::os::unix::fs::symlink(o.join("fx"), mcptools.join("fx")).unwrap();
            },
            "mcptools/fx",
        ),
    ];
    for (plant, what) in plants {
        plant();
        let err = ex
            .register_mcp_server("fx", &fixture_stdio_params("stdio"))
            .await
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(&format!("{}", ws.join(what).display())) && err.contains("symbolic link"),
            "{what}: {err}"
        );
        assert_eq!(
            listing(),
            before,
            "{what}: the host wrote or deleted through the link"
        );
    }
    std::fs::remove_file(mcptools.join("fx")).unwrap();
    ex.register_mcp_server("fx", &fixture_stdio_params("stdio"))
        .await
        .expect("registration works again");
    assert_eq!(
        run(
            &ex,
            "from mcptools.fx import add\nprint(add.run(add.Params(a=1, b=2)).sum)"
        )
        .await,
        "3"
    );

    // A linked images directory: the image is not written through it.
    let display = format!(
        "import base64\nfrom IPython.display import Image, display\ndisplay(Image(data=base64.b64decode('{PNG}')))"
    );
    run(&ex, &format!("import os\nos.symlink({o_s:?}, 'images')")).await;
    let r = ex
        .execute(&display, Some(Duration::from_secs(30)))
        .await
        .unwrap();
    assert!(r.images.is_empty() && r.image_data.is_empty(), "{r:?}");
    assert!(
        r.text.contains("[ipybox: could not save an image: ") && r.text.contains("symbolic link"),
        "{}",
        r.text
    );
    assert_eq!(listing(), before, "an image was written through the link");
    run(&ex, "import os\nos.remove('images')").await;
    let r = ex
        .execute(&display, Some(Duration::from_secs(30)))
        .await
        .unwrap();
    assert_eq!(r.image_data, vec![png_bytes()]);
    assert_eq!(std::fs::read(&r.images[0]).unwrap(), png_bytes());
    ex.stop().await;

    // The MCP server returns the displayed bytes, not what the file was swapped for (a link to
    // the workspace's .env, which the sandbox cannot read).
    std::fs::write(ws.join(".env"), "SECRET=hunter2\n").unwrap();
    let s = sandboxed_server(&ws, &[], &[]).await;
    let swap = format!(
        r#"import os, time
images = os.path.abspath("images")
before = set(os.listdir(images))
{display}
deadline = time.time() + 10
while not set(os.listdir(images)) - before and time.time() < deadline:
    time.sleep(0.01)
(new,) = set(os.listdir(images)) - before
os.remove(os.path.join(images, new))
os.symlink(os.path.abspath(".env"), os.path.join(images, new))
try:
    open(".env").read()
except PermissionError:
    print("env unreadable")
"#
    );
    let r = call(&s, "execute_ipython_cell", json!({"code": swap})).await;
    let out = tool_output(&r);
    assert!(!out.is_error, "{}", out.text);
    assert!(out.text.starts_with("env unreadable\n"), "{}", out.text);
    let images: Vec<Vec<u8>> = r
        .content
        .iter()
        .filter_map(|c| match c {
            ContentBlock::Image(i) => {
                use base64::Engine;
                Some(
                    base64::engine::general_purpose::STANDARD
                        .decode(&i.data)
                        .unwrap(),
                )
            }
            _ => None,
        })
        .collect();
    assert_eq!(images, vec![png_bytes()], "the MCP client got other bytes");
    s.close().await;
}

/// Every file and directory below `dir`, relative, with file contents.
fn walk(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        let rel = p.strip_prefix(dir).unwrap().display().to_string();
        if p.is_dir() {
            out.push(format!("{rel}/"));
            out.extend(walk(&p).into_iter().map(|s| format!("{rel}/{s}")));
        } else {
            out.push(format!(
                "{rel}={}",
                std::fs::read_to_string(&p).unwrap_or_default()
            ));
        }
    }
    out
}

/// Path 6: ipybox's data directory and what it writes there are private.
#[tokio::test(flavor = "multi_thread")]
async fn private_state_is_private() {
    require!(SandboxDeps, TestEnv);
    use std::os::unix::fs::MetadataExt;
    let data = Scratch::new("host-confinement-data");
    let home = data.path().join("ipybox");
    let (_keep, ws) = workspace();
    let mut vars = process_env();
    vars.insert("IPYBOX_HOME".into(), home.display().to_string());
    let ex = CodeExecutor::builder()
        .workspace(&ws)
        .host_env(HostEnv::from_vars(vars))
        .python(kernel_python())
        .without_spare_kernel()
        .sandbox(options())
        .build();
    ex.register_mcp_server("fx", &fixture_stdio_params("stdio"))
        .await
        .unwrap();
    assert_eq!(std::fs::metadata(&home).unwrap().mode() & 0o777, 0o700);
    ex.start().await.unwrap();
    let rt = ex.runtime_dir().await.unwrap();
    let settings = rt.join("sandbox-settings.json");
    assert_eq!(std::fs::metadata(&settings).unwrap().mode() & 0o777, 0o600);
    // The environment file the sandbox wrapper hands srt: the kernel factory's template's
    // (`t1`), and a plainly launched kernel's (`k<N>`) if any.
    let env_files: Vec<_> = std::fs::read_dir(rt.join("kernels"))
        .unwrap()
        .map(|e| e.unwrap().path().join("kernel-env.sh"))
        .filter(|f| f.exists())
        .collect();
    assert!(
        !env_files.is_empty(),
        "no kernel-env.sh in {}",
        rt.display()
    );
    for f in &env_files {
        assert_eq!(
            std::fs::metadata(f).unwrap().mode() & 0o777,
            0o600,
            "{}",
            f.display()
        );
    }
    // The kernel cannot rewrite the settings its next kernel starts with (inside the sandbox the
    // runtime directory is hidden: a write there lands in a throwaway tmpfs at best).
    let written = std::fs::read(&settings).unwrap();
    run(
        &ex,
        &attempt(
            "settings",
            &format!(
                "open({:?}, 'w').write('{{\"filesystem\": {{\"allowWrite\": [\"/\"]}}}}')",
                settings.display().to_string()
            ),
        ),
    )
    .await;
    assert_eq!(std::fs::read(&settings).unwrap(), written);
    ex.stop().await;
}
