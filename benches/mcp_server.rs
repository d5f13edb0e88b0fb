//! Tool calling and MCP server benchmark (`cargo bench --bench mcp_server`); prints a table.
//!
//! Through MCP stdio, against the real `ipybox` binary (and Python ipybox 0.9.2 when
//! `scripts/bench-reference.sh` has installed it under target/reference):
//! - spawn -> initialize -> first `execute_ipython_cell` result
//! - `execute_ipython_cell` round trip, reset -> next result
//! - peak RSS of the server's whole process tree during the run, and its PSS and RSS at rest
//!   with one kernel and its spare (from /proc/PID/smaps_rollup), with the kernel factory (the
//!   default) and without (`--no-kernel-factory`)
//!
//! With the Python `mcp` client (issue 40, `benches/stdio_memory.py`): tree PSS after five cells,
//! resets spaced and back to back, this build against `$IPYBOX_BENCH_BASELINE` when set.
//!
//! Tool calling (issue 3): register a stdio MCP server (spawn included), the warm tool call
//! round trip measured inside kernel code, a cell with one tool call (accepted by `execute`, or
//! through `stream` answering the approval at once), and a reset right after a tool call (the
//! stdio server is closed in the background; `reset()` alone, which must not wait for it).
//! Needs `bash scripts/test-env.sh` (fixture servers).

// This starts ipybox and the Python client, not host children of ipybox (clippy.toml).
#![allow(clippy::disallowed_methods)]

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ipybox::tools::{McpSession, ServerParams, tool_output};
use serde_json::{Map, Value, json};

#[path = "common/mod.rs"]
mod common;
use common::{median, ms};

#[path = "../tests/integration/proc_tree.rs"]
mod proc_tree;

/// (PSS, RSS) in kB of `pid` and its descendants, from smaps_rollup.
fn tree_pss_rss(pid: u32) -> (u64, u64) {
    let pids: Vec<u32> = std::iter::once(pid)
        .chain(proc_tree::descendants(pid))
        .collect();
    common::pss_rss(&pids)
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn args(v: Value) -> Map<String, Value> {
    v.as_object().unwrap().clone()
}

async fn connect(command: &str, argv: &[&str], ws: &Path) -> McpSession {
    let mut a: Vec<Value> = argv.iter().map(|s| json!(s)).collect();
    a.push(json!("--workspace"));
    a.push(json!(ws));
    let params = ServerParams::parse(&json!({"command": command, "args": a})).unwrap();
    let env: HashMap<String, String> = std::env::vars().collect();
    McpSession::connect(&params, &env, Duration::from_secs(120))
        .await
        .expect("server starts")
}

async fn exec(s: &McpSession, code: &str) -> String {
    let r = s
        .call_tool("execute_ipython_cell", args(json!({"code": code})))
        .await
        .unwrap();
    let out = tool_output(&r);
    assert!(!out.is_error, "{}", out.text);
    out.text
}

/// Samples the RSS of `pid` and all its descendants every 20 ms; keeps the maximum (kB).
fn watch_tree(pid: u32, stop: Arc<AtomicBool>, peak: Arc<AtomicU64>) {
    std::thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            let mut parents: HashMap<u32, u32> = HashMap::new();
            let mut rss: HashMap<u32, u64> = HashMap::new();
            for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
                let Ok(p) = e.file_name().to_string_lossy().parse::<u32>() else {
                    continue;
                };
                let Ok(status) = std::fs::read_to_string(format!("/proc/{p}/status")) else {
                    continue;
                };
                let field = |name: &str| {
                    status
                        .lines()
                        .find(|l| l.starts_with(name))
                        .and_then(|l| l.split_whitespace().nth(1))
                        .and_then(|v| v.parse::<u64>().ok())
                };
                if let Some(pp) = field("PPid:") {
                    parents.insert(p, pp as u32);
                }
                rss.insert(p, field("VmRSS:").unwrap_or(0));
            }
            let mut tree: HashSet<u32> = HashSet::from([pid]);
            loop {
                let before = tree.len();
                for (p, pp) in &parents {
                    if tree.contains(pp) {
                        tree.insert(*p);
                    }
                }
                if tree.len() == before {
                    break;
                }
            }
            let total: u64 = tree.iter().map(|p| rss.get(p).copied().unwrap_or(0)).sum();
            peak.fetch_max(total, Ordering::Relaxed);
            std::thread::sleep(Duration::from_millis(20));
        }
    });
}

struct ServerFigures {
    first: Duration,
    roundtrip: Duration,
    reset: Duration,
    peak_mb: f64,
    /// PSS and RSS (MB) of the tree at rest: one kernel (after 221 cells) and its spare.
    rest_mb: (f64, f64),
}

async fn bench_server(
    label: &str,
    command: &str,
    argv: &[&str],
    reset_settle: Duration,
) -> ServerFigures {
    let ws = tempfile::tempdir().unwrap();
    let mut firsts = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        let s = connect(command, argv, ws.path()).await;
        exec(&s, "1").await;
        firsts.push(t.elapsed());
        s.close().await;
    }
    let s = connect(command, argv, ws.path()).await;
    let (stop, peak) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU64::new(0)),
    );
    watch_tree(s.pid().unwrap(), stop.clone(), peak.clone());
    exec(&s, "1").await;
    for _ in 0..20 {
        exec(&s, "1").await;
    }
    let mut rts = Vec::new();
    for _ in 0..200 {
        let t = Instant::now();
        exec(&s, "1").await;
        rts.push(t.elapsed());
    }
    tokio::time::sleep(Duration::from_secs(2)).await; // the spare is up
    let (pss, rss) = tree_pss_rss(s.pid().unwrap());
    let rest_mb = (pss as f64 / 1024.0, rss as f64 / 1024.0);
    let mut resets = Vec::new();
    for _ in 0..5 {
        tokio::time::sleep(reset_settle).await;
        let t = Instant::now();
        let r = s.call_tool("reset", Map::new()).await.unwrap();
        assert!(!tool_output(&r).is_error, "{label}: reset failed");
        exec(&s, "1").await;
        resets.push(t.elapsed());
    }
    stop.store(true, Ordering::Relaxed);
    tokio::time::sleep(Duration::from_millis(50)).await;
    s.close().await;
    ServerFigures {
        first: median(firsts),
        roundtrip: median(rts),
        reset: median(resets),
        peak_mb: peak.load(Ordering::Relaxed) as f64 / 1024.0,
        rest_mb,
    }
}

fn main() {
    common::run(|| async {
        let bin = root().join("target/release/ipybox");
        let bin = if bin.exists() {
            bin
        } else {
            root().join("target/debug/ipybox")
        };
        assert!(
            bin.exists(),
            "build the binary first: cargo build --release"
        );
        let ours = bench_server(
            "ipybox (Rust)",
            bin.to_str().unwrap(),
            &["--log-level", "warn"],
            Duration::from_millis(1500),
        )
        .await;
        let plain = bench_server(
            "ipybox (Rust), --no-kernel-factory",
            bin.to_str().unwrap(),
            &["--log-level", "warn", "--no-kernel-factory"],
            Duration::from_millis(1500),
        )
        .await;

        let reference = root().join("target/reference/venv/bin/ipybox");
        let theirs = if reference.exists() {
            Some(
                bench_server(
                    "Python ipybox",
                    reference.to_str().unwrap(),
                    &[],
                    Duration::from_millis(1500),
                )
                .await,
            )
        } else {
            eprintln!(
                "(Python ipybox not installed: run scripts/bench-reference.sh for the comparison column)"
            );
            None
        };

        // Tool calling: register (spawn included) and warm call round trip in kernel code.
        let python = root().join("target/test-env/venv/bin/python");
        assert!(python.exists(), "run scripts/test-env.sh first");
        let fixture = json!({"command": python, "args": [root().join("tests/fixtures/mcp_fixture.py"), "stdio"]});
        let everything = json!({"command": root().join("target/test-env/node_modules/.bin/mcp-server-everything"), "args": ["stdio"]});
        let ws = tempfile::tempdir().unwrap();
        let mut reg_fixture = Vec::new();
        let mut reg_everything = Vec::new();
        for _ in 0..5 {
            let t = Instant::now();
            ipybox::generate_mcp_sources("fx", &fixture, &ws.path().join("mcptools"))
                .await
                .unwrap();
            reg_fixture.push(t.elapsed());
            let t = Instant::now();
            ipybox::generate_mcp_sources("ev", &everything, &ws.path().join("mcptools"))
                .await
                .unwrap();
            reg_everything.push(t.elapsed());
        }
        let ex = ipybox::CodeExecutor::builder()
            .workspace(ws.path())
            .without_spare_kernel()
            .build();
        ex.start().await.unwrap();
        let code = "import time, statistics\nfrom mcptools.fx import add\nfor _ in range(20): add.run(add.Params(a=1, b=2))\nts = []\nfor _ in range(200):\n    t = time.perf_counter(); add.run(add.Params(a=1, b=2)); ts.append(time.perf_counter() - t)\nprint(statistics.median(ts) * 1000)";
        let call_ms: f64 = ex.execute(code, None).await.unwrap().text.parse().unwrap();
        // The same call as a whole cell, from the host: accepted automatically (execute) and
        // through an approval request answered at once (stream).
        let cell = "print(add.run(add.Params(a=1, b=2)).sum)";
        let mut auto = Vec::new();
        let mut asked = Vec::new();
        for i in 0..60 {
            let t = Instant::now();
            assert_eq!(ex.execute(cell, None).await.unwrap().text, "3");
            if i >= 10 {
                auto.push(t.elapsed());
            }
            let t = Instant::now();
            let mut run = ex.stream(cell, None);
            while let Some(event) = run.next().await {
                match event {
                    ipybox::executor::ExecutionEvent::Approval(request) => request.accept(),
                    ipybox::executor::ExecutionEvent::Result(r) => assert_eq!(r.unwrap().text, "3"),
                    _ => {}
                }
            }
            if i >= 10 {
                asked.push(t.elapsed());
            }
        }
        ex.stop().await;

        // Reset right after a tool call: the fixture's stdio session is closed in the background.
        let ex = ipybox::CodeExecutor::builder().workspace(ws.path()).build();
        ex.start().await.unwrap();
        let mut after_call = Vec::new();
        let mut reset_alone = Vec::new();
        for _ in 0..5 {
            tokio::time::sleep(Duration::from_millis(1500)).await; // spare ready
            assert_eq!(
                ex.execute(
                    "from mcptools.fx import add\nprint(add.run(add.Params(a=1, b=2)).sum)",
                    None
                )
                .await
                .unwrap()
                .text,
                "3"
            );
            let t = Instant::now();
            ex.reset().await.unwrap();
            reset_alone.push(t.elapsed());
            ex.execute("1", None).await.unwrap();
            after_call.push(t.elapsed());
        }
        ex.stop().await;

        let col = |f: &Option<ServerFigures>, pick: fn(&ServerFigures) -> String| {
            f.as_ref().map_or("-".to_string(), pick)
        };
        println!(
            "| measurement (MCP stdio) | ipybox (Rust) | --no-kernel-factory | target | Python ipybox 0.9.2 (measured here) |"
        );
        println!("|---|---|---|---|---|");
        println!(
            "| spawn -> initialize -> first result (median of 5) | {} | {} | <= 1000 ms | {} |",
            ms(ours.first),
            ms(plain.first),
            col(&theirs, |f| ms(f.first))
        );
        println!(
            "| execute_ipython_cell round trip (median of 200) | {} | {} | <= 5 ms | {} |",
            ms(ours.roundtrip),
            ms(plain.roundtrip),
            col(&theirs, |f| ms(f.roundtrip))
        );
        println!(
            "| reset -> next result (median of 5) | {} | {} | <= 300 ms | {} |",
            ms(ours.reset),
            ms(plain.reset),
            col(&theirs, |f| ms(f.reset))
        );
        println!(
            "| peak RSS of the server process tree | {:.0} MB | {:.0} MB | - | {} |",
            ours.peak_mb,
            plain.peak_mb,
            col(&theirs, |f| format!("{:.0} MB", f.peak_mb))
        );
        println!(
            "| server tree at rest, one kernel + spare: PSS / RSS | {:.0} / {:.0} MB | {:.0} / {:.0} MB | PSS <= 85 MB | {} |",
            ours.rest_mb.0,
            ours.rest_mb.1,
            plain.rest_mb.0,
            plain.rest_mb.1,
            col(&theirs, |f| format!(
                "{:.0} / {:.0} MB",
                f.rest_mb.0, f.rest_mb.1
            ))
        );
        println!();
        println!("| measurement (tool calling) | ipybox (Rust) | target |");
        println!("|---|---|---|");
        println!(
            "| register stdio server, Python fixture (spawn incl., median of 5) | {} | <= 700 ms |",
            ms(median(reg_fixture))
        );
        println!(
            "| register stdio server, server-everything (spawn incl., median of 5) | {} | <= 700 ms |",
            ms(median(reg_everything))
        );
        println!(
            "| warm tool call round trip from kernel code (median of 200) | {call_ms:.2} ms | <= 3 ms |"
        );
        println!(
            "| cell with one tool call, accepted automatically (`execute`, median of 50) | {} | - |",
            ms(median(auto))
        );
        println!(
            "| cell with one tool call, approval request accepted at once (`stream`, median of 50) | {} | <= 5 ms |",
            ms(median(asked))
        );
        println!(
            "| reset right after a tool call (stdio server open) -> next result (median of 5) | {} | <= 50 ms |",
            ms(median(after_call))
        );
        // The server gets up to 500 ms to exit after its stdin closes: a reset that waited for
        // it would show here (tests/integration/tool_calls.rs used to assert this bound).
        println!(
            "| `reset()` alone, stdio server open (not waiting for its exit; median of 5) | {} | <= 300 ms |",
            ms(median(reset_alone))
        );

        // Issue 40's figures with the Python `mcp` client (benches/stdio_memory.py): tree PSS
        // after five cells, resets spaced and back to back; this build against
        // $IPYBOX_BENCH_BASELINE (another ipybox executable) and Python ipybox when installed.
        python_client_rows(&bin);
    });
}

/// Runs `benches/stdio_memory.py` with the handshake-era Python client (`target/mcp1/venv`, from
/// `scripts/test-env.sh`) and prints its table.
fn python_client_rows(bin: &Path) {
    let python = root().join("target/mcp1/venv/bin/python");
    if !python.exists() {
        eprintln!(
            "(no {}: run scripts/test-env.sh for the Python-client rows)",
            python.display()
        );
        return;
    }
    let mut servers = vec![format!("this build={}", bin.display())];
    if let Ok(baseline) = std::env::var("IPYBOX_BENCH_BASELINE") {
        servers.insert(0, format!("baseline={baseline}"));
    }
    let reference = root().join("target/reference/venv/bin/ipybox");
    if reference.exists() {
        servers.push(format!("Python ipybox 0.9.2={}", reference.display()));
    }
    println!();
    let status = std::process::Command::new(python)
        .arg(root().join("benches/stdio_memory.py"))
        .args(servers)
        .stderr(std::process::Stdio::null())
        .status()
        .expect("runs benches/stdio_memory.py");
    assert!(status.success(), "benches/stdio_memory.py failed");
}
