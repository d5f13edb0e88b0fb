//! Remote kernels benchmark (`cargo bench --bench remote`; needs `bash scripts/test-env.sh`).
//!
//! Part 1, per backend (local child process, Jupyter Kernel Gateway, Jupyter Enterprise Gateway,
//! Jupyter Server, all on loopback, and Python ipybox 0.9.2 when `target/bench-python/py`
//! exists), medians of:
//! - cold start to first result: `start()` + `execute("print(1)")`, no spare kernel;
//! - the `print(1)` round trip (200 after 20 warm-up);
//! - a tool call round trip: `add` of the MCP fixture server through the generated API (the call
//!   is accepted by `execute()`; over the stdin channel for remote kernels), 50 after warm-up.
//!
//! Part 2, scale-out: N concurrent `CodeExecutor`s (N = 1, 8, 32) against one Enterprise Gateway,
//! each running `print(1)` back to back for 10 s: executions/s in total, p50/p99 latency, and the
//! memory per session (the kernels' RSS on the server, and this process's RSS growth, per
//! executor).

// These start fixtures and ipybox itself, not host children of ipybox (clippy.toml).
#![allow(clippy::disallowed_methods)]

use std::path::Path;
use std::time::{Duration, Instant};

use ipybox::CodeExecutor;
use ipybox::host_env::HostEnv;
use serde_json::json;

#[path = "common/mod.rs"]
mod common;
use common::{median, ms};

/// What `jupyter_servers` needs from the test support module.
#[path = "common/support.rs"]
mod support;

#[allow(dead_code)]
#[path = "../tests/integration/jupyter_servers.rs"]
mod jupyter_servers;
#[path = "../tests/integration/proc_tree.rs"]
mod proc_tree;
use jupyter_servers::{JupyterServer, Kind, TOKEN};

fn host() -> HostEnv {
    let mut vars: std::collections::HashMap<String, String> = std::env::vars().collect();
    vars.insert("IPYBOX_GATEWAY_TOKEN".into(), TOKEN.into());
    HostEnv::from_vars(vars)
}

fn builder(ws: &Path, gateway: Option<&str>) -> ipybox::executor::CodeExecutorBuilder {
    let b = CodeExecutor::builder().workspace(ws).host_env(host());
    match gateway {
        Some(url) => b.kernel_gateway(url),
        None => b,
    }
}

struct Figures {
    cold: Duration,
    print1: Duration,
    tool: Duration,
}

async fn measure(ws: &Path, gateway: Option<&str>) -> Figures {
    let mut cold = Vec::new();
    for _ in 0..5 {
        let ex = builder(ws, gateway).without_spare_kernel().build();
        let t = Instant::now();
        ex.start().await.unwrap();
        assert_eq!(ex.execute("print(1)", None).await.unwrap().text, "1");
        cold.push(t.elapsed());
        ex.stop().await;
    }
    let ex = builder(ws, gateway).without_spare_kernel().build();
    ex.start().await.unwrap();
    for _ in 0..20 {
        ex.execute("print(1)", None).await.unwrap();
    }
    let mut print1 = Vec::new();
    for _ in 0..200 {
        let t = Instant::now();
        ex.execute("print(1)", None).await.unwrap();
        print1.push(t.elapsed());
    }
    let code = "from mcptools.fx.add import Params, run; print(run(Params(a=1, b=2)).sum)";
    let mut tool = Vec::new();
    for i in 0..55 {
        let t = Instant::now();
        let out = ex.execute(code, None).await.unwrap();
        assert_eq!(out.text, "3");
        if i >= 5 {
            tool.push(t.elapsed());
        }
    }
    ex.stop().await;
    Figures {
        cold: median(cold),
        print1: median(print1),
        tool: median(tool),
    }
}

fn reference(ws: &Path) -> Option<serde_json::Value> {
    let root = support::root();
    let py = root.join("target/bench-python/py/bin/python");
    let fixture_py = root.join("target/bench-python/fixture/bin/python");
    if !py.exists() || !fixture_py.exists() {
        eprintln!(
            "Python ipybox 0.9.2 not measured: run `bash scripts/bench-python.sh` once to install it"
        );
        return None;
    }
    let dir = ws.join("reference");
    std::fs::create_dir_all(&dir).unwrap();
    let out = std::process::Command::new(py)
        .arg(root.join("benches/remote_reference.py"))
        .arg(fixture_py)
        .arg(root.join("tests/fixtures/mcp_fixture.py"))
        .arg(&dir)
        .stderr(std::process::Stdio::inherit())
        .output()
        .ok()?;
    if !out.status.success() {
        eprintln!("Python ipybox run failed ({})", out.status);
        return None;
    }
    serde_json::from_slice(
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .last()?
            .as_bytes(),
    )
    .ok()
}

/// RSS in MB of `pid` and all its descendants.
fn tree_rss_mb(pid: u32) -> f64 {
    let kb: u64 = std::iter::once(pid)
        .chain(proc_tree::descendants(pid))
        .map(rss_kb)
        .sum();
    kb as f64 / 1024.0
}

fn rss_kb(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0)
}

async fn scale_out(server: &JupyterServer, ws: &Path, n: usize) -> String {
    let base_server = tree_rss_mb(server.pid());
    let base_self = rss_kb(std::process::id()) as f64 / 1024.0;
    // Started 4 at a time: 32 Python kernels starting at once on 2 cores take longer than the
    // gateway's launch timeout.
    let mut executors: Vec<CodeExecutor> = Vec::new();
    while executors.len() < n {
        let batch = (n - executors.len()).min(4);
        executors.extend(
            futures::future::join_all((0..batch).map(|_| async {
                let ex = builder(ws, Some(&server.url()))
                    .without_spare_kernel()
                    .kernel_start_timeout(Duration::from_secs(180))
                    .build();
                ex.start().await.unwrap();
                ex.execute("print(1)", None).await.unwrap();
                ex
            }))
            .await,
        );
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let per_kernel = (tree_rss_mb(server.pid()) - base_server) / n as f64;
    let per_host = (rss_kb(std::process::id()) as f64 / 1024.0 - base_self) / n as f64;
    let window = Duration::from_secs(10);
    let started = Instant::now();
    let latencies: Vec<Vec<Duration>> =
        futures::future::join_all(executors.iter().map(|ex| async move {
            let mut times = Vec::new();
            while started.elapsed() < window {
                let t = Instant::now();
                ex.execute("print(1)", None).await.unwrap();
                times.push(t.elapsed());
            }
            times
        }))
        .await;
    let elapsed = started.elapsed().as_secs_f64();
    futures::future::join_all(executors.iter().map(|ex| ex.stop())).await;
    let mut all: Vec<Duration> = latencies.into_iter().flatten().collect();
    all.sort();
    let pct = |p: f64| all[((p * all.len() as f64).ceil() as usize).clamp(1, all.len()) - 1];
    format!(
        "| {n} | {:.0} | {} | {} | {per_kernel:.0} MB | {per_host:.1} MB |",
        all.len() as f64 / elapsed,
        ms(pct(0.50)),
        ms(pct(0.99)),
    )
}

fn main() {
    common::run(|| async {
        let ws = tempfile::tempdir().unwrap();
        let fixture = json!({
            "command": support::root().join("target/test-env/venv/bin/python"),
            "args": [support::root().join("tests/fixtures/mcp_fixture.py"), "stdio"],
        });
        let reg = CodeExecutor::builder().workspace(ws.path()).build();
        reg.register_mcp_server("fx", &fixture).await.unwrap();

        let mut rows = Vec::new();
        let local = measure(ws.path(), None).await;
        rows.push((
            "local (child process, Unix socket)".to_string(),
            local.cold,
            local.print1,
            local.tool,
        ));
        for (kind, name) in [
            (Kind::KernelGateway, "Jupyter Kernel Gateway 3.0.1"),
            (Kind::EnterpriseGateway, "Jupyter Enterprise Gateway 3.3.0"),
            (Kind::JupyterServer, "Jupyter Server 2.21.1"),
        ] {
            let server = JupyterServer::start(kind);
            let f = measure(ws.path(), Some(&server.url())).await;
            rows.push((
                format!("{name} (WebSocket, stdin channel)"),
                f.cold,
                f.print1,
                f.tool,
            ));
        }
        println!(
            "\n| backend | cold start → first result | print(1) round trip | tool call round trip |"
        );
        println!("|---|---|---|---|");
        for (name, cold, print1, tool) in &rows {
            println!(
                "| {name} | {} | {} | {} |",
                ms(*cold),
                ms(*print1),
                ms(*tool)
            );
        }
        if let Some(r) = reference(ws.path()) {
            let f = |k: &str| r[k].as_f64().map_or("?".into(), |v| format!("{v:.2} ms"));
            println!(
                "| Python ipybox 0.9.2 (its own Kernel Gateway) | {} | {} | {} |",
                f("cold_start_ms"),
                f("print1_ms"),
                f("tool_call_ms")
            );
            println!(
                "\nPython ipybox 0.9.2 lost the output of {} of its 258 executions in this run.",
                r["lost_outputs"]
            );
        }

        let server = JupyterServer::start(Kind::EnterpriseGateway);
        println!(
            "\nScale-out: N concurrent CodeExecutors against one local Enterprise Gateway, `print(1)` back to back for 10 s each"
        );
        println!(
            "\n| N | executions/s | p50 | p99 | kernel RSS per session (server) | ipybox RSS per session (host) |"
        );
        println!("|---|---|---|---|---|---|");
        for n in [1, 8, 32] {
            println!("{}", scale_out(&server, ws.path(), n).await);
        }
    });
}
