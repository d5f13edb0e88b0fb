//! `kernel_env` variables that ipybox also sets (issue: `kernel_env={"PYTHONPATH": ...}` killed the
//! kernel): the caller's `PYTHONPATH` entries are added after ipybox's own and the workspace (those
//! inside the workspace at the end of `sys.path` once the kernel is up, issue 36), for
//! a local kernel (SDK), the MCP server's `.env` (`KERNEL_ENV_PYTHONPATH`), a sandboxed kernel and
//! kernels on each kind of Jupyter server. Every case proves that ipybox's runtime still loads (a
//! tool call goes through) and that the caller's entries are importable, in their order. The
//! per-variable rules themselves are unit-tested in `src/kernel/kernel_env.rs`.

use std::path::Path;

use ipybox::CodeExecutor;
use ipybox::executor::CodeExecutorBuilder;
use serde_json::json;

use crate::jupyter_servers::{ALL, JupyterServer, TOKEN};
use crate::support::*;

/// Two library directories inside the workspace (visible in the sandbox too): `a` has `mod_a`
/// and `shadow` (says "a"), `b` has `mod_b` and `shadow` (says "b"). Returns their paths.
fn libraries(ws: &Path) -> (String, String) {
    let mut dirs = Vec::new();
    for (name, module) in [("a", "mod_a"), ("b", "mod_b")] {
        let dir = ws.join("libs").join(name);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join(format!("{module}.py")),
            format!("V = '{module}'\n"),
        )
        .unwrap();
        std::fs::write(dir.join("shadow.py"), format!("WHO = '{name}'\n")).unwrap();
        dirs.push(dir.display().to_string());
    }
    (dirs[0].clone(), dirs[1].clone())
}

/// The kernel's `PYTHONPATH` cases: (value, modules that must import, which `shadow` wins).
fn cases(a: &str, b: &str) -> Vec<(String, Vec<&'static str>, Option<&'static str>)> {
    vec![
        (a.to_string(), vec!["mod_a"], Some("a")),
        (format!("{b}:{a}"), vec!["mod_a", "mod_b"], Some("b")),
        (format!("{a}::{b}:"), vec!["mod_a", "mod_b"], Some("a")),
        (String::new(), vec![], None),
    ]
}

/// Code that prints what the case expects: the modules' values and the winning `shadow`, or
/// `none` when nothing of the libraries is importable.
fn check_code(modules: &[&str], shadow: Option<&str>) -> (String, String) {
    let mut code = String::new();
    let mut expected = Vec::new();
    for m in modules {
        code.push_str(&format!("import {m}; print({m}.V)\n"));
        expected.push(m.to_string());
    }
    match shadow {
        Some(who) => {
            code.push_str("import shadow; print(shadow.WHO)\n");
            expected.push(who.to_string());
        }
        None => {
            code.push_str("try:\n    import mod_a\n    print('importable')\nexcept ImportError:\n    print('none')\n");
            expected.push("none".to_string());
        }
    }
    (code, expected.join("\n"))
}

/// ipybox's runtime is there: a registered tool goes through, and the workspace is importable.
const TOOL_CALL: &str = "from mcptools.fx import greet\nprint(greet.run(greet.Params(name='pp')))";

async fn check_executor(b: CodeExecutorBuilder, ws: &Path, value: &str, what: &str) {
    let (a, bdir) = libraries(ws);
    let case = cases(&a, &bdir)
        .into_iter()
        .find(|(v, _, _)| v == value)
        .expect("a known case");
    let ex = b.kernel_env([("PYTHONPATH", value)]).build();
    ex.start()
        .await
        .unwrap_or_else(|e| panic!("{what}: PYTHONPATH={value:?}: kernel did not start: {e}"));
    let (code, expected) = check_code(&case.1, case.2);
    assert_eq!(
        run(&ex, &code).await,
        expected,
        "{what}: PYTHONPATH={value:?}"
    );
    assert_eq!(
        run(&ex, TOOL_CALL).await,
        "Hello, pp!",
        "{what}: PYTHONPATH={value:?}"
    );
    ex.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn pythonpath_in_kernel_env_adds_entries_on_a_local_kernel() {
    require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    register(ws.path(), "fx", &fixture_stdio_params("stdio")).await;
    let (a, b) = libraries(ws.path());
    for (value, _, _) in cases(&a, &b) {
        let builder = CodeExecutor::builder()
            .workspace(ws.path())
            .without_spare_kernel();
        check_executor(builder, ws.path(), &value, "local kernel").await;
    }
    // The order on sys.path: ipybox's runtime first (the only entry of the kernel's own
    // PYTHONPATH here), the workspace and then the caller's entries inside it last, appended once
    // the kernel is up (nothing in the workspace runs as the interpreter starts).
    let ex = CodeExecutor::builder()
        .workspace(ws.path())
        .without_spare_kernel()
        .kernel_env([("PYTHONPATH", format!("{b}:{a}"))])
        .build();
    ex.start().await.unwrap();
    let out = run(
        &ex,
        "import os, sys\nprint(len(os.environ['PYTHONPATH'].split(':')))\nprint('\\n'.join(sys.path[-3:]))\nimport ipybox_runtime, os.path\nprint(os.path.basename(os.path.dirname(os.path.dirname(ipybox_runtime.__file__))))",
    )
    .await;
    assert_eq!(out, format!("1\n{}\n{b}\n{a}\npython", ws.path().display()));
    ex.stop().await;
}

async fn pythonpath_from_the_mcp_servers_dotenv(era: crate::mcp_eras::Era) {
    require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    let (a, b) = libraries(ws.path());
    std::fs::write(
        ws.path().join(".env"),
        format!("KERNEL_ENV_PYTHONPATH={b}:{a}\n"),
    )
    .unwrap();
    let s = crate::mcp_eras::start(ws.path(), &[], &[], era).await;
    let params = fixture_stdio_params("stdio");
    ok_text(
        &s,
        "register_mcp_server",
        json!({"server_name": "fx", "server_params": params}),
    )
    .await;
    let (code, expected) = check_code(&["mod_a", "mod_b"], Some("b"));
    assert_eq!(
        ok_text(&s, "execute_ipython_cell", json!({"code": code})).await,
        expected
    );
    assert_eq!(
        ok_text(&s, "execute_ipython_cell", json!({"code": TOOL_CALL})).await,
        "Hello, pp!"
    );
    s.close().await;
}

#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread")]
async fn pythonpath_in_kernel_env_under_the_sandbox() {
    require!(SandboxDeps, TestEnv);
    let ws = tempfile::tempdir().unwrap();
    let (a, b) = libraries(ws.path());
    let sandboxed = || {
        CodeExecutor::builder()
            .workspace(ws.path())
            .without_spare_kernel()
            .sandbox(ipybox::sandbox::SandboxOptions {
                srt: Some(root().join("target/sandbox-deps/node_modules/.bin/srt")),
                ..Default::default()
            })
    };
    // Sandboxed kernels call registered servers only (the registration persists per workspace).
    sandboxed()
        .build()
        .register_mcp_server("fx", &fixture_stdio_params("stdio"))
        .await
        .expect("registration");
    for value in [format!("{b}:{a}"), String::new()] {
        check_executor(sandboxed(), ws.path(), &value, "sandboxed kernel").await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn pythonpath_in_kernel_env_on_each_jupyter_server() {
    require!(TestEnv);
    for kind in ALL {
        let server = JupyterServer::start(kind);
        let ws = tempfile::tempdir().unwrap();
        register(ws.path(), "fx", &fixture_stdio_params("stdio")).await;
        let (a, b) = libraries(ws.path());
        for value in [format!("{b}:{a}"), String::new()] {
            let mut host = process_env();
            host.insert("IPYBOX_GATEWAY_TOKEN".into(), TOKEN.into());
            let builder = CodeExecutor::builder()
                .workspace(ws.path())
                .host_env(ipybox::host_env::HostEnv::from_vars(host))
                .kernel_gateway(server.url())
                .without_spare_kernel();
            check_executor(builder, ws.path(), &value, &format!("{kind:?}")).await;
        }
        server.assert_empty(&format!("{kind:?}")).await;
    }
}

crate::mcp_eras::both_eras!(pythonpath_from_the_mcp_servers_dotenv);
