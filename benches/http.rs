//! `ipybox serve --http` benchmark (`cargo bench --bench http`); prints tables.
//!
//! N = 1, 8, 32 concurrent MCP clients (rmcp, 2026-07-28 over Streamable HTTP, each with its
//! own kernel session) running `print(1)` and a cell with one MCP tool call back to back for
//! 10 s: throughput, p50, p99, and the memory one session costs (ipybox, its kernel and the
//! stdio MCP server its tool calls started, measured after the sessions were created and had
//! made one tool call). Then session creation (a call without `session`) to the
//! first result, with a warm kernel waiting and without; the same client against the stdio
//! server (one client, `print(1)`) for comparison; and the same load with the kernels on a
//! local Jupyter Enterprise Gateway.
//!
//! Then confinement (docs/http.md): the default (each session's kernel in a bubblewrap of its
//! own) against `--unconfined-sessions`: session start with and without a warm kernel, PSS per
//! session, `print(1)` p50/p99 at 1 and 32 clients. `cargo bench --bench http -- confinement`
//! runs that part alone.
//!
//! Then density: PSS per additional active session (1, 8, 32) with the shared kernel template
//! (the default) against a bubblewrap per kernel (`--no-kernel-factory`); `cargo bench --bench http
//! -- density` runs that part alone.
//!
//! Then a thousand sessions, 100 active and the rest hibernated (issue 30); `cargo bench --bench
//! http -- thousand` runs that part alone (about 10 minutes), `-- forty` the same with 40
//! sessions, 10 of them woken (issue 40: a new and a restored session's PSS, about a minute).
//!
//! Needs `bash scripts/test-env.sh` (fixture server, Enterprise Gateway).

// It starts ipybox, the fixture and the gateway itself, not host children of ipybox.
#![allow(clippy::disallowed_methods)]

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rmcp::RoleClient;
use rmcp::model::{CallToolRequestParams, ClientConfig, ProtocolVersion};
use rmcp::service::{ClientLifecycleMode, ClientServiceExt, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use serde_json::json;

#[path = "common/mod.rs"]
mod common;
use common::ms;

/// What `jupyter_servers` needs from the test support module.
#[path = "common/support.rs"]
mod support;

#[path = "../tests/integration/apigen_cli.rs"]
mod apigen_cli;
#[allow(dead_code)]
#[path = "../tests/integration/jupyter_servers.rs"]
mod jupyter_servers;
#[allow(dead_code)]
#[path = "../tests/integration/proc_tree.rs"]
mod proc_tree;
use jupyter_servers::{JupyterServer, Kind, TOKEN};

const BIN: &str = env!("CARGO_BIN_EXE_ipybox");
const PRINT: &str = "print(1)";
const TOOL: &str = "print(add.run(add.Params(a=1, b=2)).sum)";
const WINDOW: Duration = Duration::from_secs(10);

type Client = RunningService<RoleClient, ClientConfig>;

/// The service as a child process; killed when dropped.
struct Service {
    child: Child,
    port: u16,
}

impl Service {
    fn start(ws: &Path, flags: &[&str], env: &[(&str, &str)]) -> Self {
        Self::start_bin(BIN, ws, flags, env)
    }

    /// [`Self::start`] with another ipybox executable (`tenants` compares two builds).
    fn start_bin(bin: &str, ws: &Path, flags: &[&str], env: &[(&str, &str)]) -> Self {
        let port = support::free_port();
        let child = Command::new(bin)
            .args(["serve", "--http", &format!("127.0.0.1:{port}")])
            .arg("--workspace")
            .arg(ws)
            .args(["--log-level", "error"])
            .args(if flags.contains(&"--max-sessions") {
                &[][..]
            } else {
                &["--max-sessions", "40"][..]
            })
            .args(flags)
            // Hundreds of sessions of 2 GiB would not fit this machine's memory budget; an
            // older build (`tenants`' baseline) has no such flag.
            .args(if bin == BIN {
                &["--service-memory", "off"][..]
            } else {
                &[][..]
            })
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "ipybox serve did not listen");
            std::thread::sleep(Duration::from_millis(50));
        }
        Self { child, port }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.port)
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        // SAFETY: signalling our own child; SIGTERM lets it delete its kernels.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
    }
}

async fn connect(url: &str) -> Client {
    let transport = StreamableHttpClientTransport::from_uri(url.to_string());
    ClientConfig::default()
        .with_protocol_version(ProtocolVersion::V_2026_07_28)
        .serve_with_lifecycle(
            transport,
            ClientLifecycleMode::Discover {
                preferred_versions: vec![ProtocolVersion::V_2026_07_28],
            },
        )
        .await
        .unwrap()
}

/// Runs `code` (in `session`); returns the text.
async fn call(c: &Client, code: &str, session: Option<&str>) -> String {
    let mut arguments = json!({"code": code});
    if let Some(s) = session {
        arguments["session"] = json!(s);
    }
    let r = c
        .call_tool(
            CallToolRequestParams::new("execute_ipython_cell")
                .with_arguments(arguments.as_object().unwrap().clone()),
        )
        .await
        .unwrap();
    let text = r.content[0].as_text().unwrap().text.clone();
    assert!(r.is_error != Some(true), "{text}");
    text
}

/// A new session: (client, handle) after its first cell (`setup`).
async fn session(url: &str, setup: &str) -> (Client, String) {
    let c = connect(url).await;
    let text = call(&c, setup, None).await;
    (c, handle_in(&text))
}

/// The handle a new session's first result names.
fn handle_in(text: &str) -> String {
    text.rsplit("[ipybox session ")
        .next()
        .and_then(|t| t.split(':').next())
        .unwrap()
        .to_string()
}

/// `n` new sessions, each made with `setup`, 4 at a time.
async fn sessions(url: &str, n: usize, setup: &str) -> Vec<(Client, String)> {
    let mut made = Vec::new();
    while made.len() < n {
        let batch = (n - made.len()).min(4);
        made.extend(futures::future::join_all((0..batch).map(|_| session(url, setup))).await);
    }
    made
}

/// Every session of `sessions` runs `code` back to back for [`WINDOW`], then its client is
/// closed: every call's latency (sorted) and the seconds it all took.
async fn drive(sessions: Vec<(Client, String)>, code: &str) -> (Vec<Duration>, f64) {
    let started = Instant::now();
    let latencies: Vec<Vec<Duration>> =
        futures::future::join_all(sessions.iter().map(|(c, h)| async move {
            let mut times = Vec::new();
            while started.elapsed() < WINDOW {
                let t = Instant::now();
                call(c, code, Some(h)).await;
                times.push(t.elapsed());
            }
            times
        }))
        .await;
    let elapsed = started.elapsed().as_secs_f64();
    for (c, _) in sessions {
        let _ = c.cancel().await;
    }
    let mut all: Vec<Duration> = latencies.into_iter().flatten().collect();
    all.sort();
    (all, elapsed)
}

/// PSS of `pid` and its descendants (MB).
fn tree_pss_mb(pid: u32) -> f64 {
    let mut pids = proc_tree::descendants(pid);
    pids.push(pid);
    common::pss_rss(&pids).0 as f64 / 1024.0
}

fn rss_kb(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0)
}

/// RSS of `pid` and its descendants (MB).
fn tree_rss_mb(pid: u32) -> f64 {
    let mut pids = proc_tree::descendants(pid);
    pids.push(pid);
    pids.into_iter().map(rss_kb).sum::<u64>() as f64 / 1024.0
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1]
}

/// One row: `n` sessions (created 4 at a time), each running `code` back to back for
/// [`WINDOW`]. `rss_pids`: whose memory a session costs (ipybox's tree; the gateway's too).
async fn load(url: &str, rss_pids: &[u32], n: usize, code: &str, label: &str) -> String {
    // The warm kernel is up before and after: the difference is the sessions' kernels.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let base: f64 = rss_pids.iter().map(|p| tree_rss_mb(*p)).sum();
    // The first tool call starts the session's MCP server (a Python process): part of creating
    // the session, not of the measured calls.
    let made = sessions(
        url,
        n,
        "from mcptools.fx import add\nadd.run(add.Params(a=1, b=2))",
    )
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let per_session = (rss_pids.iter().map(|p| tree_rss_mb(*p)).sum::<f64>() - base) / n as f64;
    let (all, elapsed) = drive(made, code).await;
    format!(
        "| {n} | {label} | {:.0} | {} | {} | {per_session:.0} MB |",
        all.len() as f64 / elapsed,
        ms(percentile(&all, 0.50)),
        ms(percentile(&all, 0.99)),
    )
}

/// Session creation (a call without `session`) to its first result, 10 times in a row.
async fn creation(url: &str) -> String {
    let mut times = Vec::new();
    for _ in 0..10 {
        let c = connect(url).await;
        let t = Instant::now();
        call(&c, PRINT, None).await;
        times.push(t.elapsed());
        let _ = c.cancel().await;
        // Let a warm kernel come up again (what a steady trickle of new sessions sees).
        tokio::time::sleep(Duration::from_millis(1500)).await;
    }
    times.sort();
    format!(
        "{} (p50), {} (max)",
        ms(percentile(&times, 0.5)),
        ms(*times.last().unwrap())
    )
}

/// One client against the stdio server, `print(1)` back to back.
async fn stdio(ws: &Path) -> String {
    let mut child = tokio::process::Command::new(BIN)
        .arg("--workspace")
        .arg(ws)
        .args(["--log-level", "error"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let transport = (child.stdout.take().unwrap(), child.stdin.take().unwrap());
    let c = ClientConfig::default()
        .with_protocol_version(ProtocolVersion::V_2026_07_28)
        .serve_with_lifecycle(
            transport,
            ClientLifecycleMode::Discover {
                preferred_versions: vec![ProtocolVersion::V_2026_07_28],
            },
        )
        .await
        .unwrap();
    call(&c, PRINT, None).await;
    let started = Instant::now();
    let mut times = Vec::new();
    while started.elapsed() < WINDOW {
        let t = Instant::now();
        call(&c, PRINT, None).await;
        times.push(t.elapsed());
    }
    let elapsed = started.elapsed().as_secs_f64();
    let _ = c.cancel().await;
    times.sort();
    format!(
        "| 1 | `print(1)`, stdio | {:.0} | {} | {} | — |",
        times.len() as f64 / elapsed,
        ms(percentile(&times, 0.50)),
        ms(percentile(&times, 0.99)),
    )
}

fn register_fixture(ws: &Path) {
    let python = support::root().join("target/test-env/venv/bin/python");
    let fixture = support::root().join("tests/fixtures/mcp_fixture.py");
    apigen_cli::apigen_fx(
        ws,
        &json!({"command": python, "args": [fixture, "stdio"]}),
        None,
    );
}

/// `n` sessions (made with `print(0)`, 4 at a time) running `print(1)` back to back for
/// [`WINDOW`]: (p50, p99, PSS per session in MB: ipybox's process tree, kernels and whatever
/// confines them, after the sessions were made, less before).
async fn confined_load(url: &str, pid: u32, n: usize) -> (Duration, Duration, f64) {
    tokio::time::sleep(Duration::from_secs(2)).await;
    let base = tree_pss_mb(pid);
    let made = sessions(url, n, "print(0)").await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let per_session = (tree_pss_mb(pid) - base) / n as f64;
    let (all, _) = drive(made, PRINT).await;
    (percentile(&all, 0.50), percentile(&all, 0.99), per_session)
}

/// Confined sessions (the default) against `--unconfined-sessions`, one row each.
async fn confinement(ws: &Path) {
    println!(
        "\n## Confinement: local kernels, confined (default) vs --unconfined-sessions\n\n| sessions | start, warm kernel | start, no warm kernel | PSS per session (8 sessions) | `print(1)`, 1 client: p50 / p99 | 32 clients: p50 / p99 |\n|---|---|---|---|---|---|"
    );
    for (label, flags) in [
        ("confined", &[][..]),
        ("unconfined", &["--unconfined-sessions"][..]),
    ] {
        let with = |warm: &'static str| {
            let mut all = vec!["--warm-sessions", warm];
            all.extend_from_slice(flags);
            Service::start(ws, &all, &[])
        };
        let warm = creation(&with("1").url()).await;
        let cold = creation(&with("0").url()).await;
        let service = with("1");
        let (_, _, pss) = confined_load(&service.url(), service.child.id(), 8).await;
        drop(service);
        let service = with("1");
        let (p50_1, p99_1, _) = confined_load(&service.url(), service.child.id(), 1).await;
        drop(service);
        let service = with("1");
        let (p50_32, p99_32, _) = confined_load(&service.url(), service.child.id(), 32).await;
        drop(service);
        println!(
            "| {label} | {warm} | {cold} | {pss:.1} MB | {} / {} | {} / {} |",
            ms(p50_1),
            ms(p99_1),
            ms(p50_32),
            ms(p99_32)
        );
    }
}

/// Tenant isolation (issue 37) against the build before it: session start without a warm
/// kernel (p50 and max of 10) and the PSS one more active session costs (8 sessions, as in
/// [`density`]), for the executable in `IPYBOX_BENCH_BASELINE` and this build, interleaved
/// over `rounds` rounds so that the machine's load falls on both alike. `cargo bench --bench
/// http -- tenants` with `IPYBOX_BENCH_BASELINE=/path/to/old/ipybox`.
async fn tenants(ws: &Path) {
    let Ok(baseline) = std::env::var("IPYBOX_BENCH_BASELINE") else {
        eprintln!("tenants: set IPYBOX_BENCH_BASELINE to the ipybox executable to compare with");
        return;
    };
    println!(
        "\n## Tenant isolation: this build vs {baseline}\n\n| build | round | start, no warm kernel (p50, max of 10) | PSS per session (8 sessions) |\n|---|---|---|---|"
    );
    const SETUP: &str = "x = list(range(1000))";
    for round in 1..=2 {
        for (label, bin) in [("before", baseline.as_str()), ("after", BIN)] {
            let cold = {
                let service = Service::start_bin(bin, ws, &["--warm-sessions", "0"], &[]);
                creation(&service.url()).await
            };
            let service = Service::start_bin(bin, ws, &["--warm-sessions", "1"], &[]);
            let (pid, url) = (service.child.id(), service.url());
            let first = session(&url, SETUP).await;
            tokio::time::sleep(Duration::from_secs(5)).await;
            let base = tree_pss_mb(pid);
            let mut made = vec![first];
            made.extend(sessions(&url, 8, SETUP).await);
            tokio::time::sleep(Duration::from_secs(5)).await;
            let per = (tree_pss_mb(pid) - base) / 8.0;
            for (c, _) in made {
                let _ = c.cancel().await;
            }
            println!("| {label} | {round} | {cold} | {per:.1} MB |");
        }
    }
}

/// Density (docs/http.md, "One kernel template for the service"): the PSS one more active
/// session costs (ipybox's process tree after `n` more sessions, each with a small namespace,
/// less before them, over `n`) with the shared kernel template (the default) and with a
/// bubblewrap per kernel (`--no-kernel-factory`), for 1, 8 and 32 sessions; and the tree's PSS
/// with one session (ipybox, that session's kernel, the warm kernel and, shared, the template).
async fn density(ws: &Path) {
    println!(
        "\n## Density: PSS per additional active session, shared template vs a bubblewrap per kernel\n\n| mode | the service with one session | +1 session | +8 sessions (each) | +32 sessions (each) |\n|---|---|---|---|---|"
    );
    const SETUP: &str = "x = list(range(1000))";
    for (label, flags) in [
        ("shared template (default)", &["--warm-sessions", "1"][..]),
        (
            "bubblewrap per kernel (`--no-kernel-factory`)",
            &["--warm-sessions", "1", "--no-kernel-factory"][..],
        ),
    ] {
        let mut cells = Vec::new();
        let mut base = 0.0;
        for n in [1, 8, 32] {
            let service = Service::start(ws, flags, &[]);
            let (pid, url) = (service.child.id(), service.url());
            // The first session starts what every session shares (the template).
            let first = session(&url, SETUP).await;
            tokio::time::sleep(Duration::from_secs(5)).await;
            base = tree_pss_mb(pid);
            let mut made = vec![first];
            made.extend(sessions(&url, n, SETUP).await);
            tokio::time::sleep(Duration::from_secs(5)).await;
            cells.push(format!("{:.1} MB", (tree_pss_mb(pid) - base) / n as f64));
            for (c, _) in made {
                let _ = c.cancel().await;
            }
        }
        println!("| {label} | {base:.0} MB | {} |", cells.join(" | "));
    }
}

/// The gauge `name` from the service's `/metrics`.
async fn metric(port: u16, name: &str) -> f64 {
    let text = reqwest::get(format!("http://127.0.0.1:{port}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in /metrics"))
}

/// Bytes of the files under `dir`.
fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir).map_or(0, |entries| {
        entries
            .flatten()
            .map(|e| match e.metadata() {
                Ok(m) if m.is_dir() => dir_bytes(&e.path()),
                Ok(m) => m.len(),
                Err(_) => 0,
            })
            .sum()
    })
}

/// A thousand sessions (issue 30, docs/benchmarks.md): 1 000 sessions created (each defines a
/// small namespace: a list and a function), those idle for `HIBERNATE_AFTER` s hibernated; then
/// 100 of them woken and kept active while the other 900 sleep. Prints the service's PSS
/// (ipybox's process tree) with no session, with every session new, with every session
/// hibernated and with 100 active; the snapshot disk per hibernated session; the first call to a
/// hibernated session (it restores its kernel); and `print(1)` p50/p99 in the active sessions.
/// `cargo bench --bench http -- thousand` runs this part alone; `-- forty` the same with 40
/// sessions, 10 of them woken (issue 40's new and restored session, in about a minute).
async fn at_scale(ws: &Path, total: usize, woken: usize) {
    const HIBERNATE_AFTER: &str = "20";
    const SETUP: &str = "x = list(range(1000))\ndef f(n):\n    return n + 1";
    let snapshots = tempfile::tempdir().unwrap();
    let snapshot_dir = snapshots.path().to_str().unwrap();
    let service = Service::start(
        ws,
        &[
            "--warm-sessions",
            "2",
            "--max-sessions",
            "400",
            "--hibernate-after",
            HIBERNATE_AFTER,
            "--checkpoint-after",
            "off",
            "--snapshot-dir",
            snapshot_dir,
            "--replica-id",
            "bench-thousand",
        ],
        &[],
    );
    let (pid, port, url) = (service.child.id(), service.port, service.url());
    let c = connect(&url).await;
    // The template and the warm kernels up, no session left open.
    let first = handle_in(&call(&c, PRINT, None).await);
    let idle = |want_open: f64, want_hibernated: f64| async move {
        let deadline = Instant::now() + Duration::from_secs(1200);
        while metric(port, "ipybox_sessions").await > want_open
            || metric(port, "ipybox_sessions_hibernated").await < want_hibernated
        {
            assert!(Instant::now() < deadline, "sessions did not hibernate");
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    };
    idle(0.0, 1.0).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let base = tree_pss_mb(pid);
    let disk_before = dir_bytes(snapshots.path());
    let created = Instant::now();
    let mut handles = Vec::with_capacity(total);
    while handles.len() < total {
        let batch = (total - handles.len()).min(4);
        let texts = futures::future::join_all((0..batch).map(|_| call(&c, SETUP, None))).await;
        handles.extend(texts.iter().map(|t| handle_in(t)));
    }
    let creation = created.elapsed();
    // Every session new and open (each ran its first cell), before any hibernates.
    let all_new = tree_pss_mb(pid);
    idle(0.0, (total + 1) as f64).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let all_hibernated = tree_pss_mb(pid);
    let disk = dir_bytes(snapshots.path()).saturating_sub(disk_before);
    // Wake `woken` of them, 4 at a time: the first call of each restores its kernel.
    let mut wake = Vec::new();
    for chunk in handles[..woken].chunks(4) {
        wake.extend(
            futures::future::join_all(chunk.iter().map(|h| {
                let c = &c;
                async move {
                    let t = Instant::now();
                    let text = call(c, "print(f(x[-1]))", Some(h)).await;
                    assert!(text.contains("1000"), "{text}");
                    t.elapsed()
                }
            }))
            .await,
        );
    }
    wake.sort();
    // Keep them active: 8 callers, round robin over the woken sessions, for the window; caller
    // k calls sessions k, k + 8, ... (no session gets two calls at once).
    let started = Instant::now();
    let times: Vec<Vec<Duration>> = futures::future::join_all((0..8).map(|k| {
        let (c, handles) = (&c, &handles);
        async move {
            let mine: Vec<&String> = handles[..woken].iter().skip(k).step_by(8).collect();
            let mut times = Vec::new();
            for h in mine.iter().cycle() {
                if started.elapsed() >= WINDOW {
                    break;
                }
                let t = Instant::now();
                call(c, PRINT, Some(h)).await;
                times.push(t.elapsed());
            }
            times
        }
    }))
    .await;
    let active = tree_pss_mb(pid);
    let open = metric(port, "ipybox_sessions").await;
    let mut all: Vec<Duration> = times.into_iter().flatten().collect();
    all.sort();
    let _ = (c.cancel().await, first);
    println!(
        "\n## Sessions at scale: {total} created, {woken} active, the rest hibernated (`--hibernate-after {HIBERNATE_AFTER}`)\n\n| measure | value |\n|---|---|"
    );
    println!(
        "| creating {total} sessions (4 at a time, each a first cell) | {:.0} s |",
        creation.as_secs_f64()
    );
    println!("| the service, no session open (template, warm kernels) | {base:.0} MB PSS |");
    println!(
        "| the service, {total} new sessions open | {all_new:.0} MB PSS ({:.1} MB per new session) |",
        (all_new - base) / total as f64
    );
    println!(
        "| the service, {total} sessions hibernated | {all_hibernated:.0} MB PSS ({:.1} KB per hibernated session) |",
        (all_hibernated - base) * 1024.0 / total as f64
    );
    println!(
        "| snapshot disk per hibernated session | {:.1} KB |",
        disk as f64 / 1024.0 / total as f64
    );
    println!(
        "| the service, {woken} woken and active ({open} open) + {} hibernated | {active:.0} MB PSS ({:.1} MB per active session) |",
        total - woken,
        (active - all_hibernated) / woken as f64
    );
    println!(
        "| first call to a hibernated session (restores it), 4 at a time, p50 / p99 | {} / {} |",
        ms(percentile(&wake, 0.5)),
        ms(percentile(&wake, 0.99))
    );
    println!(
        "| `print(1)` in the {woken} active sessions, 8 callers, p50 / p99 | {} / {} ({:.0} calls/s) |",
        ms(percentile(&all, 0.5)),
        ms(percentile(&all, 0.99)),
        all.len() as f64 / WINDOW.as_secs_f64()
    );
}

const HEADER: &str = "| clients | cell | calls/s (total) | p50 | p99 | memory per session |\n|---|---|---|---|---|---|";

fn main() {
    let only_confinement = std::env::args().any(|a| a == "confinement");
    let only_density = std::env::args().any(|a| a == "density");
    let only_thousand = std::env::args().any(|a| a == "thousand");
    let only_forty = std::env::args().any(|a| a == "forty");
    let only_tenants = std::env::args().any(|a| a == "tenants");
    common::run(|| async move {
        let ws = tempfile::tempdir().unwrap();
        if only_tenants {
            tenants(ws.path()).await;
            return;
        }
        if only_thousand {
            at_scale(ws.path(), 1000, 100).await;
            return;
        }
        if only_forty {
            at_scale(ws.path(), 40, 10).await;
            return;
        }
        if only_density {
            density(ws.path()).await;
            return;
        }
        if only_confinement {
            confinement(ws.path()).await;
            return;
        }
        register_fixture(ws.path());

        println!("\n## ipybox serve --http, local kernels (2 cores)\n\n{HEADER}");
        println!("{}", stdio(ws.path()).await);
        // A fresh service per row: 2026-07-28 sessions end only by expiring, so each row's
        // sessions go with its service.
        for n in [1, 8, 32] {
            for (code, label) in [(PRINT, "`print(1)`"), (TOOL, "one tool call")] {
                let service = Service::start(ws.path(), &["--warm-sessions", "1"], &[]);
                let pid = service.child.id();
                println!("{}", load(&service.url(), &[pid], n, code, label).await);
            }
        }
        {
            let service = Service::start(ws.path(), &["--warm-sessions", "1"], &[]);
            println!(
                "\nsession creation -> first result, a warm kernel waiting: {}",
                creation(&service.url()).await
            );
        }
        {
            let service = Service::start(ws.path(), &["--warm-sessions", "0"], &[]);
            println!(
                "session creation -> first result, no warm kernel: {}",
                creation(&service.url()).await
            );
        }
        confinement(ws.path()).await;
        density(ws.path()).await;
        at_scale(ws.path(), 1000, 100).await;

        let eg = JupyterServer::start(Kind::EnterpriseGateway);
        println!(
            "\n## ipybox serve --http, kernels on Jupyter Enterprise Gateway 3.3.0 (same machine)\n\n{HEADER}"
        );
        let url = eg.url();
        let on_eg = |warm: &'static str| {
            Service::start(
                ws.path(),
                &["--warm-sessions", warm, "--kernel-gateway", &url],
                &[("IPYBOX_GATEWAY_TOKEN", TOKEN)],
            )
        };
        for n in [1, 8, 32] {
            for (code, label) in [(PRINT, "`print(1)`"), (TOOL, "one tool call")] {
                let service = on_eg("1");
                let pids = [service.child.id(), eg.pid()];
                println!("{}", load(&service.url(), &pids, n, code, label).await);
                drop(service);
                // The gateway deletes the row's kernels asynchronously.
                eg.wait_kernels(0).await;
            }
        }
        for (warm, what) in [("1", "a warm kernel waiting"), ("0", "no warm kernel")] {
            let service = on_eg(warm);
            println!(
                "\nsession creation -> first result, {what}: {}",
                creation(&service.url()).await
            );
        }
    });
}
