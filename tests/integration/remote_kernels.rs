//! Kernels on Jupyter servers (`kernel_gateway(url)`, `--kernel-gateway`): the kernel test list
//! against a real Jupyter Kernel Gateway, Enterprise Gateway and Jupyter Server on loopback, tool
//! calls over the stdin channel, the MCP server, a server killed and restarted, a dropped
//! connection, bad tokens and addresses, and nothing left behind on the server.

use std::path::Path;
use std::time::{Duration, Instant};

use ipybox::CodeExecutor;
use ipybox::executor::ExecutorError;
use ipybox::host_env::HostEnv;
use ipybox::kernel::KernelError;
use ipybox::tools::tool_output;
use serde_json::json;
use tokio::io::AsyncWriteExt;

use crate::jupyter_servers::{ALL, JupyterServer, Kind, TOKEN};
use crate::support::*;

/// A host environment for ipybox: this process's, plus the gateway token.
fn host() -> HostEnv {
    let mut vars = process_env();
    vars.insert("IPYBOX_GATEWAY_TOKEN".into(), TOKEN.into());
    vars.insert(
        "IPYBOX_HOST_ONLY".into(),
        "must not reach the kernel".into(),
    );
    HostEnv::from_vars(vars)
}

fn builder(ws: &Path, server: &JupyterServer) -> ipybox::executor::CodeExecutorBuilder {
    builder_at(ws, &server.url())
}

/// An executor builder for the server at `url` (a proxy, extra URL parameters).
fn builder_at(ws: &Path, url: &str) -> ipybox::executor::CodeExecutorBuilder {
    CodeExecutor::builder()
        .workspace(ws)
        .host_env(host())
        .kernel_gateway(url)
}

async fn remote(ws: &Path, server: &JupyterServer) -> CodeExecutor {
    let ex = builder(ws, server).without_spare_kernel().build();
    ex.start()
        .await
        .unwrap_or_else(|e| panic!("{:?}: {e}\n{}", server.kind, server.log()));
    ex
}

#[tokio::test(flavor = "multi_thread")]
async fn state_output_errors_images_env_and_imports() {
    require!(TestEnv);
    for kind in ALL {
        let server = JupyterServer::start(kind);
        let ws = tempfile::tempdir().unwrap();
        std::fs::write(ws.path().join("helper_mod.py"), "VALUE = 'from the host'\n").unwrap();
        let ex = builder(ws.path(), &server)
            .without_spare_kernel()
            .kernel_env([("IPYBOX_TEST_VAR", "from kernel_env")])
            .build();
        ex.start().await.unwrap();
        assert_eq!(run(&ex, "x = 6 * 7").await, "", "{kind:?}");
        assert_eq!(run(&ex, "print(x + 1)\nx * 2").await, "43\n84", "{kind:?}");
        assert_eq!(
            run(
                &ex,
                "import sys\nprint('out')\nprint('err', file=sys.stderr)"
            )
            .await,
            "out\nerr",
            "{kind:?}"
        );
        let err = ex
            .execute(
                "print('before')\ndef f():\n    raise ValueError('boom')\nf()",
                None,
            )
            .await
            .unwrap_err();
        match &err {
            ExecutorError::Kernel(KernelError::Failed {
                ename,
                evalue,
                output,
                traceback,
            }) => {
                assert_eq!(
                    (ename.as_str(), evalue.as_str(), output.as_str()),
                    ("ValueError", "boom", "before")
                );
                assert!(traceback.ends_with("ValueError: boom"), "{traceback}");
                assert!(!traceback.contains('\u{1b}'), "{traceback}");
            }
            other => panic!("{kind:?}: unexpected {other:?}"),
        }
        // Environment: fixed variables and kernel_env; nothing of the host's own environment.
        assert_eq!(
            run(&ex, "import os\nprint(os.environ['IPYBOX_TEST_VAR'], os.environ['MPLBACKEND'], os.environ.get('IPYBOX_HOST_ONLY'))").await,
            "from kernel_env module://matplotlib_inline.backend_inline None"
        );
        // The workspace's modules come from the host.
        assert_eq!(
            run(&ex, "import helper_mod\nhelper_mod.VALUE").await,
            "'from the host'"
        );
        assert_eq!(
            run(&ex, "try:\n    import no_such_module_anywhere\nexcept ImportError as e:\n    print(type(e).__name__)").await,
            "ModuleNotFoundError"
        );
        // input() is unavailable, as with local kernels.
        let err = ex.execute("input('? ')", None).await.unwrap_err();
        assert!(
            err.to_string().contains("StdinNotImplementedError"),
            "{kind:?}: {err}"
        );
        // PNG display data becomes an image file in the host's images directory.
        let png = "import struct, zlib\nfrom IPython.display import Image, display\ndef chunk(t, d):\n    return struct.pack('>I', len(d)) + t + d + struct.pack('>I', zlib.crc32(t + d))\nraw = b''.join(b'\\x00' + b'\\xff\\x00\\x00' * 4 for _ in range(4))\npng = b'\\x89PNG\\r\\n\\x1a\\n' + chunk(b'IHDR', struct.pack('>IIBBBBB', 4, 4, 8, 2, 0, 0, 0)) + chunk(b'IDAT', zlib.compress(raw)) + chunk(b'IEND', b'')\ndisplay(Image(data=png))\nimport base64\nprint(base64.b64encode(png).decode())";
        let result = ex.execute(png, None).await.unwrap();
        assert_eq!(result.images.len(), 1, "{kind:?}");
        let b64 = result.text.lines().last().unwrap();
        use base64::Engine;
        assert_eq!(
            std::fs::read(&result.images[0]).unwrap(),
            base64::engine::general_purpose::STANDARD
                .decode(b64)
                .unwrap()
        );
        assert!(result.images[0].starts_with(ws.path().canonicalize().unwrap().join("images")));
        assert_eq!(server.kernels().await.len(), 1);
        ex.stop().await;
        server.assert_empty(&format!("{kind:?}: after stop")).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn legacy_json_framing_works_too() {
    require!(TestEnv);
    let server = JupyterServer::start(Kind::JupyterServer);
    let ws = tempfile::tempdir().unwrap();
    register(ws.path(), "fx", &fixture_stdio_params("stdio")).await;
    let ex = builder_at(ws.path(), &format!("{}/?framing=legacy", server.url()))
        .without_spare_kernel()
        .build();
    ex.start().await.unwrap();
    assert_eq!(
        run(&ex, "from mcptools.fx import greet\nprint(greet.run(greet.Params(name='legacy')))\nprint('é' * 3)").await,
        "Hello, legacy!\nééé"
    );
    let big = run(&ex, "print('y' * 2_000_000)").await;
    assert_eq!(big.len(), 2_000_000);
    ex.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn thousand_random_sizes_and_ten_megabytes_arrive_intact() {
    require!(TestEnv);
    for kind in ALL {
        let server = JupyterServer::start(kind);
        let ws = tempfile::tempdir().unwrap();
        let ex = remote(ws.path(), &server).await;
        let what = format!("{kind:?}");
        thousand_random_sizes_arrive_intact(&ex, &what).await;
        ten_megabytes_arrive_intact(&ex, &what).await;
        ex.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn output_a_rate_limited_server_drops_is_announced_in_the_output() {
    require!(TestEnv);
    let server = JupyterServer::start_rate_limited(Kind::JupyterServer);
    let ws = tempfile::tempdir().unwrap();
    let ex = remote(ws.path(), &server).await;
    let out = run(&ex, TEN_MEGABYTES).await;
    assert!(
        out.len() < 100_000 * 100 - 1,
        "the default limit should have dropped output"
    );
    assert!(
        out.contains("IOPub data rate exceeded."),
        "silent loss: {} bytes",
        out.len()
    );
    ex.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn timeouts_interrupt_proof_code_death_and_reset() {
    require!(TestEnv);
    for kind in ALL {
        let server = JupyterServer::start(kind);
        let ws = tempfile::tempdir().unwrap();
        // With a warm spare (the default): replacements take the spare kernel.
        let ex = builder(ws.path(), &server).build();
        ex.start().await.unwrap();
        run(&ex, "kept = 'still here'").await;
        let start = Instant::now();
        let err = ex
            .execute(
                "import time\nprint('started')\ntime.sleep(30)",
                // 3 s: on a loaded machine the cell may reach a remote kernel a second late, and
                // the test checks that its output before the timeout is kept.
                Some(Duration::from_secs(3)),
            )
            .await
            .unwrap_err();
        assert!(
            start.elapsed() < Duration::from_secs(8),
            "{kind:?}: {:?}",
            start.elapsed()
        );
        assert_eq!(
            err.to_string(),
            "execution timed out after 3 s and was interrupted; kernel state was kept"
        );
        assert_eq!(err.output(), "started");
        assert_eq!(run(&ex, "kept").await, "'still here'", "{kind:?}");

        let code = "import time\nwhile True:\n    try:\n        time.sleep(0.1)\n    except KeyboardInterrupt:\n        pass";
        let err = ex
            .execute(code, Some(Duration::from_secs(1)))
            .await
            .unwrap_err();
        assert!(
            err.to_string().contains("kernel restarted, state lost"),
            "{kind:?}: {err}"
        );
        let err = ex.execute("kept", None).await.unwrap_err();
        assert!(err.to_string().contains("NameError"), "{kind:?}: {err}");

        run(&ex, "lost = 1").await;
        let start = Instant::now();
        let err = ex
            .execute(
                "import os\nprint('bye', flush=True)\nos._exit(3)",
                Some(Duration::from_secs(30)),
            )
            .await
            .unwrap_err();
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{kind:?}: noticed after {:?}",
            start.elapsed()
        );
        let text = err.to_string();
        assert!(
            text.starts_with("kernel died (") && text.ends_with(") — restarted, state lost"),
            "{kind:?}: {text}"
        );
        assert_eq!(run(&ex, "'next runs'").await, "'next runs'");
        assert!(ex.execute("lost", None).await.is_err());

        run(&ex, "gone = True").await;
        let start = Instant::now();
        ex.reset().await.unwrap();
        let reset_took = start.elapsed();
        assert!(
            ex.execute("gone", None).await.is_err(),
            "{kind:?}: state survived reset"
        );
        assert_eq!(run(&ex, "'fresh'").await, "'fresh'");
        eprintln!("{kind:?}: reset with a warm spare took {reset_took:?}");
        // The current kernel and one spare, nothing else.
        assert_eq!(
            server.wait_kernels(2).await.len(),
            2,
            "{kind:?}: server log:\n{}",
            server.log()
        );
        ex.stop().await;
        server.assert_empty(&format!("{kind:?}: after stop")).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_executors_and_callers() {
    require!(TestEnv);
    let server = JupyterServer::start(Kind::EnterpriseGateway);
    let ws = tempfile::tempdir().unwrap();
    // The token in the URL this time (IPYBOX_GATEWAY_TOKEN is not set).
    let executors: Vec<CodeExecutor> = futures::future::join_all((0..4).map(|_| async {
        let ex = CodeExecutor::builder()
            .workspace(ws.path())
            .host_env(HostEnv::from_vars(process_env()))
            .kernel_gateway(server.url_with_token())
            .without_spare_kernel()
            .build();
        if let Err(e) = ex.start().await {
            panic!("{e}\nserver log:\n{}", server.log());
        }
        ex
    }))
    .await;
    let outs = futures::future::join_all(executors.iter().enumerate().map(|(i, ex)| async move {
        run(ex, &format!("mine = {i}")).await;
        let mut seen = Vec::new();
        for _ in 0..20 {
            seen.push(run(ex, "mine").await);
        }
        seen
    }))
    .await;
    for (i, seen) in outs.iter().enumerate() {
        assert!(
            seen.iter().all(|s| *s == i.to_string()),
            "executor {i} saw {seen:?}"
        );
    }
    // Concurrent callers of one executor queue: each sees its own complete output.
    let ex = &executors[0];
    let results = futures::future::join_all((0..8).map(|i| async move {
        run(
            ex,
            &format!("import time\nprint('start {i}')\ntime.sleep(0.05)\nprint('end {i}')"),
        )
        .await
    }))
    .await;
    for (i, out) in results.iter().enumerate() {
        assert_eq!(*out, format!("start {i}\nend {i}"));
    }
    assert_eq!(server.kernels().await.len(), 4);
    futures::future::join_all(executors.iter().map(|ex| ex.stop())).await;
    server.assert_empty("after stop").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn tool_calls_over_the_stdin_channel_with_approvals_and_threads() {
    require!(TestEnv);
    for kind in ALL {
        let server = JupyterServer::start(kind);
        let ws = tempfile::tempdir().unwrap();
        register(ws.path(), "fx", &fixture_stdio_params("stdio")).await;
        let ex = builder(ws.path(), &server)
            .without_spare_kernel()
            .approval_timeout(Duration::from_secs(1))
            .build();
        ex.start().await.unwrap();
        // The generated package is imported from the host; the call goes over stdin.
        assert_eq!(
            run(&ex, "from mcptools.fx import greet, add\nprint(greet.run(greet.Params(name='remote')))\nadd.run(add.Params(a=2, b=3)).sum").await,
            "Hello, remote!\n5",
            "{kind:?}"
        );
        approvals_accept_reject_and_time_out_on(&ex, &format!("{kind:?}")).await;
        // 16 threads call at once: the calls queue on the channel and all arrive.
        let code = "from concurrent.futures import ThreadPoolExecutor\nfrom mcptools.fx import add\nwith ThreadPoolExecutor(16) as pool:\n    sums = list(pool.map(lambda i: add.run(add.Params(a=i, b=1000)).sum, range(64)))\nprint(sums == [i + 1000 for i in range(64)], len(sums))";
        assert_eq!(run(&ex, code).await, "True 64", "{kind:?}");
        // asyncio.gather over the async call path.
        let code = "import asyncio\nfrom mcptools.fx import add\nasync def main():\n    return await asyncio.gather(*(asyncio.to_thread(add.run, add.Params(a=i, b=1)) for i in range(8)))\nprint([r.sum for r in await main()])";
        assert_eq!(run(&ex, code).await, "[1, 2, 3, 4, 5, 6, 7, 8]", "{kind:?}");
        // The trust rule: a remote kernel reaches registered servers with recorded params only.
        register(ws.path(), "fx", &fixture_params_who()).await;
        forged_params_reach_nothing(&ex, ws.path(), &format!("{kind:?}")).await;
        ex.stop().await;
        server.assert_empty("after stop").await;
    }
}

/// A remote kernel's import roots (issue 28): a directory on `kernel_env`'s `PYTHONPATH` reaches
/// the servers the host registered there (this Jupyter server shares the machine's files), and a
/// link in the workspace is not followed (a kernel on a server that shares the workspace could
/// have planted it), while the same link is followed for the user's own local kernel.
#[tokio::test(flavor = "multi_thread")]
async fn remote_kernels_reach_servers_registered_for_their_pythonpath() {
    require!(TestEnv);
    let server = JupyterServer::start(Kind::KernelGateway);
    let (ws, tools) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    ipybox::generate_mcp_sources_with(
        "fx",
        &fixture_stdio_params("stdio"),
        tools.path(),
        &process_env(),
        ipybox::tools::DEFAULT_CONNECT_TIMEOUT,
        ipybox::apigen::ApiStyle::Sync,
    )
    .await
    .expect("registration");
    let call = "from ipybox_runtime import ToolRunner, ToolError\ntry:\n    print(ToolRunner('fx', {}).run('greet', {'name': 'there'}))\nexcept ToolError as e:\n    print(str(e).splitlines()[0])";
    let ex = builder(ws.path(), &server)
        .without_spare_kernel()
        .kernel_env([("PYTHONPATH", tools.path().display().to_string())])
        .build();
    ex.start().await.unwrap();
    assert_eq!(
        run(
            &ex,
            "from fx import add\nprint(add.run(add.Params(a=2, b=3)).sum)"
        )
        .await,
        "5"
    );
    ex.stop().await;
    // `lib -> <tools>` in the workspace, with `lib` on the kernel's path.
    std::os::unix::fs::symlink(tools.path(), ws.path().join("lib")).unwrap();
    let via_link = [("PYTHONPATH", "lib")];
    let ex = builder(ws.path(), &server)
        .without_spare_kernel()
        .kernel_env(via_link)
        .build();
    ex.start().await.unwrap();
    assert_eq!(
        run(&ex, call).await,
        "MCP server `fx` is not registered for any directory this kernel imports from: kernel code can only call servers the host registered, with the params recorded then"
    );
    ex.stop().await;
    let own = CodeExecutor::builder()
        .workspace(ws.path())
        .kernel_env(via_link)
        .without_spare_kernel()
        .build();
    own.start().await.unwrap();
    assert_eq!(run(&own, call).await, "Hello, there!", "the control");
    own.stop().await;
    server.assert_empty("after stop").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn shell_approval_on_a_remote_kernel() {
    require!(TestEnv);
    let server = JupyterServer::start(Kind::JupyterServer);
    let ws = tempfile::tempdir().unwrap();
    let ex = builder(ws.path(), &server)
        .without_spare_kernel()
        .approve_shell_cmds(true)
        .build();
    ex.start().await.unwrap();
    let (asked, out) = stream_with(&ex, "!echo remote-shell\n!echo refused", None, |d| {
        Some((!d.contains("refused"), Duration::ZERO))
    })
    .await;
    assert_eq!(asked.len(), 2, "{asked:?}");
    let err = out.unwrap_err();
    assert_eq!(err.output(), "remote-shell");
    assert!(err.to_string().contains("ApprovalRejected"), "{err}");
    ex.stop().await;
}

/// A TCP proxy in front of a server whose connections can be cut.
struct Proxy {
    port: u16,
    cut: tokio::sync::watch::Sender<u32>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    async fn start(target: u16) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (cut, _) = tokio::sync::watch::channel(0u32);
        let cuts = cut.clone();
        let task = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let mut cut = cuts.subscribe();
                tokio::spawn(async move {
                    let Ok(mut outbound) =
                        tokio::net::TcpStream::connect(("127.0.0.1", target)).await
                    else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = cut.changed() => {
                            let _ = inbound.shutdown().await;
                        }
                    }
                });
            }
        });
        Self { port, cut, task }
    }

    /// Drops every open connection.
    fn cut(&self) {
        self.cut.send_modify(|n| *n += 1);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dropped_connection_reconnects_without_losing_output() {
    require!(TestEnv);
    let server = JupyterServer::start(Kind::JupyterServer);
    let proxy = Proxy::start(server.port).await;
    let ws = tempfile::tempdir().unwrap();
    let ex = builder_at(ws.path(), &format!("http://127.0.0.1:{}", proxy.port))
        .without_spare_kernel()
        .build();
    ex.start().await.unwrap();
    run(&ex, "state = 'kept'").await;
    let code = "import time\nfor i in range(40):\n    print(i, flush=True)\n    time.sleep(0.05)";
    let cutter = async {
        tokio::time::sleep(Duration::from_millis(700)).await;
        proxy.cut();
    };
    let (result, ()) = tokio::join!(ex.execute(code, Some(Duration::from_secs(30))), cutter);
    let expected: Vec<String> = (0..40).map(|i| i.to_string()).collect();
    assert_eq!(result.unwrap().text, expected.join("\n"));
    assert_eq!(run(&ex, "state").await, "'kept'");
    ex.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_server_killed_mid_execution_and_restarted() {
    require!(TestEnv);
    let mut server = JupyterServer::start(Kind::KernelGateway);
    let ws = tempfile::tempdir().unwrap();
    let ex = remote(ws.path(), &server).await;
    run(&ex, "state = 1").await;
    let started = Instant::now();
    let (result, ()) = tokio::join!(
        ex.execute(
            "import time\nprint('working', flush=True)\ntime.sleep(60)",
            Some(Duration::from_secs(120))
        ),
        async {
            tokio::time::sleep(Duration::from_millis(500)).await;
            server.kill();
        }
    );
    let err = result.unwrap_err();
    let text = err.to_string();
    assert!(
        text.starts_with("kernel died (") && text.contains("restarted, state lost"),
        "{text}"
    );
    assert_eq!(err.output(), "working");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "noticed after {:?}",
        started.elapsed()
    );
    // While the server is down, executions fail clearly; once it is back, they run again.
    let err = ex.execute("1", None).await.unwrap_err().to_string();
    assert!(err.contains("cannot reach the kernel gateway"), "{err}");
    server.restart();
    assert_eq!(run(&ex, "'back'").await, "'back'");
    assert!(
        ex.execute("state", None).await.is_err(),
        "state cannot survive the server"
    );
    ex.stop().await;
    server.assert_empty("after stop").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn wrong_token_and_unreachable_url_are_clear_errors() {
    require!(TestEnv);
    let server = JupyterServer::start(Kind::JupyterServer);
    let ws = tempfile::tempdir().unwrap();
    let ex = CodeExecutor::builder()
        .workspace(ws.path())
        .kernel_gateway(format!("{}/?token=wrong", server.url()))
        .build();
    let err = ex.start().await.unwrap_err().to_string();
    assert!(
        err.contains("refused ipybox's credentials (HTTP 403)"),
        "{err}"
    );
    assert!(err.contains("the token is wrong"), "{err}");
    assert!(!err.contains("token=wrong"), "token leaked: {err}");
    let port = free_port();
    let ex = CodeExecutor::builder()
        .workspace(ws.path())
        .kernel_gateway(format!("http://127.0.0.1:{port}"))
        .build();
    let err = ex.start().await.unwrap_err().to_string();
    assert!(
        err.contains(&format!(
            "cannot reach the kernel gateway at http://127.0.0.1:{port}/"
        )),
        "{err}"
    );
    assert!(
        err.contains("help: check that the Jupyter server runs"),
        "{err}"
    );
    assert_eq!(server.kernels().await.len(), 0);
}

async fn mcp_exec(s: &impl crate::mcp_eras::CallTool, code: &str) -> (bool, String) {
    let r = call(s, "execute_ipython_cell", json!({"code": code})).await;
    let out = tool_output(&r);
    (out.is_error, out.text)
}

async fn mcp_server_with_kernel_gateway(era: crate::mcp_eras::Era) {
    require!(TestEnv);
    let server = JupyterServer::start(Kind::EnterpriseGateway);
    let ws = tempfile::tempdir().unwrap();
    let url = server.url();
    let s = crate::mcp_eras::start(
        ws.path(),
        &[("IPYBOX_GATEWAY_TOKEN", TOKEN)],
        &["--kernel-gateway", &url],
        era,
    )
    .await;
    let modules = ok_text(
        &s,
        "register_mcp_server",
        json!({"server_name": "fx", "server_params": fixture_stdio_params("stdio")}),
    )
    .await;
    assert!(modules.lines().any(|m| m == "greet"), "{modules}");
    assert_eq!(
        mcp_exec(
            &s,
            "from mcptools.fx import greet\nprint(greet.run(greet.Params(name='mcp')))\nx = 5"
        )
        .await,
        (false, "Hello, mcp!".to_string())
    );
    assert_eq!(mcp_exec(&s, "x * 2").await, (false, "10".to_string()));
    ok_text(&s, "reset", json!({})).await;
    let (is_error, text) = mcp_exec(&s, "x").await;
    assert!(is_error && text.contains("NameError"), "{text}");
    s.close().await;
    server.assert_empty("after the MCP server exited").await;

    // A wrong token: the server starts and says so on each call.
    let s = crate::mcp_eras::start(
        ws.path(),
        &[("IPYBOX_GATEWAY_TOKEN", "wrong")],
        &["--kernel-gateway", &url],
        era,
    )
    .await;
    for _ in 0..2 {
        let (is_error, text) = mcp_exec(&s, "1").await;
        assert!(
            is_error && text.contains("refused ipybox's credentials"),
            "{text}"
        );
    }
    s.close().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn kernels_of_a_killed_ipybox_are_deleted_on_the_next_start() {
    require!(TestEnv);
    let server = JupyterServer::start(Kind::JupyterServer);
    let ws = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    let mut child = std::process::Command::new(BIN)
        .args([
            "exec",
            "--kernel-gateway",
            &server.url(),
            "-c",
            "import time\nprint('up', flush=True)\ntime.sleep(120)",
        ])
        .current_dir(ws.path())
        .env("IPYBOX_GATEWAY_TOKEN", TOKEN)
        .env("IPYBOX_HOME", home.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    assert_eq!(line.trim(), "up");
    let left = server.kernels().await;
    assert_eq!(left.len(), 1);
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(
        server.kernels().await,
        left,
        "the kernel outlives the killed ipybox"
    );
    let record = home
        .path()
        .join("gateway-kernels")
        .join(format!("{}.json", left[0]));
    let text = std::fs::read_to_string(&record).unwrap();
    assert!(
        !text.contains(TOKEN),
        "the ledger must not hold the token: {text}"
    );

    let mut vars = process_env();
    vars.insert("IPYBOX_GATEWAY_TOKEN".into(), TOKEN.into());
    vars.insert("IPYBOX_HOME".into(), home.path().display().to_string());
    let ex = CodeExecutor::builder()
        .workspace(ws.path())
        .host_env(HostEnv::from_vars(vars))
        .kernel_gateway(server.url())
        .without_spare_kernel()
        .build();
    ex.start().await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while server.kernels().await.contains(&left[0]) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let now = server.kernels().await;
    assert!(
        !now.contains(&left[0]),
        "the orphan is still there: {now:?}"
    );
    assert_eq!(now.len(), 1);
    assert!(!record.exists());
    ex.stop().await;
    server.assert_empty("after stop").await;
    let remaining: Vec<_> = std::fs::read_dir(home.path().join("gateway-kernels"))
        .unwrap()
        .collect();
    assert!(remaining.is_empty(), "{remaining:?}");
}

crate::mcp_eras::both_eras!(mcp_server_with_kernel_gateway);
