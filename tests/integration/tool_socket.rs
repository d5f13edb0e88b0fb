//! Limits of the tool socket against hostile kernel code (issue 18): a huge body is refused
//! before it is read, idle connections cannot exhaust the host's file handles, a thousand
//! threads cannot put a thousand prompts in front of the user — and after each attack a tool
//! call still works. The tool server runs in this test process, so its memory and file handles
//! are this process's.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use crate::support::*;
use ipybox::CodeExecutor;
use ipybox::executor::ExecutionEvent;
use ipybox::tools::MAX_OUTSTANDING_PROMPTS;

/// The tool server's limits (src/tools/server.rs), as the kernel sees them.
const MAX_CONNECTIONS: usize = 512;

/// This process's resident memory (VmRSS), bytes.
fn rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kib * 1024
}

/// This process's open file handles.
fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

async fn fixture_executor(ws: &std::path::Path) -> CodeExecutor {
    register(ws, "fx", &fixture_stdio_params("stdio")).await;
    executor(ws).await
}

const TOOL_CALL: &str = "from mcptools.fx import add\nprint(add.run(add.Params(a=20, b=22)).sum)";

/// Sends a request head with `head_extra`, then up to `send_mib` MiB of body in `chunk`s
/// (until the host stops reading); prints the MiB sent and the reply's status line and message.
fn flood(head_extra: &str, chunk: &str, send_mib: usize) -> String {
    format!(
        r#"
import json, os, socket
s = socket.socket(socket.AF_UNIX)
s.connect(os.environ["IPYBOX_TOOL_SOCKET"])
s.settimeout(20)
s.sendall(b"POST /run HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n{head_extra}\r\n")
chunk = {chunk}
sent = 0
try:
    while sent < ({send_mib} << 20):
        s.sendall(chunk)
        sent += len(chunk)
except OSError:
    pass
reply = b""
try:
    while True:
        data = s.recv(65536)
        if not data:
            break
        reply += data
except OSError:
    pass
head, _, body = reply.partition(b"\r\n\r\n")
print(sent >> 20, head.split(b"\r\n")[0].decode(), json.loads(body)["error"]["message"].splitlines()[0], sep="\n")
"#
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn a_huge_body_is_refused_before_it_is_read() {
    require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    let ex = fixture_executor(ws.path()).await;
    assert_eq!(run(&ex, TOOL_CALL).await, "42");

    // Content-Length: 2 GB, and 512 MiB actually pushed at the socket.
    let before = rss();
    let out = run(
        &ex,
        &flood("Content-Length: 2000000000\\r\\n", "b'x' * (1 << 20)", 512),
    )
    .await;
    let grown = rss().saturating_sub(before);
    eprintln!(
        "huge Content-Length: VmRSS {} MiB before, grew by {} KiB; kernel output: {out}",
        before >> 20,
        grown >> 10
    );
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 3, "{out}");
    assert!(
        lines[0].parse::<usize>().unwrap() < 64,
        "the host read the body: {out}"
    );
    assert_eq!(lines[1], "HTTP/1.1 413 Payload Too Large");
    assert_eq!(
        lines[2],
        "this /run request was not read: its body is 2000000000 bytes, and the ipybox tool server takes at most 32 MiB (33554432 bytes) per request, so that kernel code cannot fill the host's memory"
    );
    assert!(grown < 16 << 20, "VmRSS grew by {grown} bytes");

    // A chunked body has no Content-Length: it is cut off at the limit while it is read.
    let before = rss();
    let out = run(
        &ex,
        &flood(
            "Transfer-Encoding: chunked\\r\\n",
            r"b'100000\r\n' + b'x' * 0x100000 + b'\r\n'",
            256,
        ),
    )
    .await;
    let grown = rss().saturating_sub(before);
    eprintln!(
        "chunked flood: VmRSS grew by {} KiB; kernel output: {out}",
        grown >> 10
    );
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].parse::<usize>().unwrap() < 96, "{out}");
    assert_eq!(lines[1], "HTTP/1.1 413 Payload Too Large");
    assert!(
        lines[2].starts_with("this /run request was not read: its body is over that, and the ipybox tool server takes at most 32 MiB"),
        "{out}"
    );
    assert!(grown < 96 << 20, "VmRSS grew by {grown} bytes");

    // The kernel-side client refuses to send what the host would refuse, and says why.
    let out = run(
        &ex,
        "from mcptools.fx import greet\ntry:\n    greet.run(greet.Params(name='x' * (33 << 20)))\nexcept Exception as e:\n    print(type(e).__name__, str(e).splitlines()[0])",
    )
    .await;
    assert!(out.starts_with("ToolRunnerError the request is "), "{out}");
    assert!(
        out.contains(" bytes as JSON, over the 32 MiB the ipybox tool server takes per request"),
        "{out}"
    );

    // The host is still usable.
    assert_eq!(run(&ex, TOOL_CALL).await, "42");
    ex.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn forty_thousand_idle_connections_do_not_exhaust_file_handles() {
    require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    let ex = fixture_executor(ws.path()).await;
    assert_eq!(run(&ex, TOOL_CALL).await, "42");
    let baseline = open_fds();
    let peak = Arc::new(AtomicUsize::new(baseline));
    let done = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (peak, done) = (peak.clone(), done.clone());
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                peak.fetch_max(open_fds(), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    // Three processes of the kernel (one may hold 20 000 files here) open 13 400 connections
    // each and keep them; then the kernel makes a tool call.
    let code = r#"
import subprocess, sys, time
child = r'''
import os, resource, socket, sys
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
held = []
for _ in range(13400):
    s = socket.socket(socket.AF_UNIX)
    s.connect(os.environ["IPYBOX_TOOL_SOCKET"])
    held.append(s)
print(len(held), flush=True)
sys.stdin.read()
'''
start = time.monotonic()
children = [subprocess.Popen([sys.executable, "-c", child], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for _ in range(3)]
opened = sum(int(c.stdout.readline()) for c in children)
took = time.monotonic() - start
from mcptools.fx import add
print(opened, add.run(add.Params(a=20, b=22)).sum)
for c in children:
    c.stdin.close()
    c.wait()
print(f"{took:.1f}")
"#;
    let out = run(&ex, code).await;
    done.store(true, Ordering::Relaxed);
    sampler.join().unwrap();
    let peak = peak.load(Ordering::Relaxed);
    eprintln!(
        "40 200 idle connections: host fds {baseline} before, {peak} at most, {} after; kernel: {out}",
        open_fds()
    );
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "40200 42", "{out}");
    assert!(
        peak <= baseline + MAX_CONNECTIONS + 64,
        "host fds went from {baseline} to {peak}"
    );
    // The host is still usable, and its handles are back.
    assert_eq!(run(&ex, TOOL_CALL).await, "42");
    ex.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_thousand_threads_put_at_most_eight_prompts_in_front_of_the_user() {
    require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    let ex = fixture_executor(ws.path()).await;
    let code = r#"
from concurrent.futures import ThreadPoolExecutor
from collections import Counter
from mcptools.fx import add
def call(i):
    try:
        return "ok" if add.run(add.Params(a=i, b=1)).sum == i + 1 else "wrong"
    except Exception as e:
        return f"{type(e).__name__}: {str(e).splitlines()[0]}"
with ThreadPoolExecutor(1000) as pool:
    outcomes = Counter(pool.map(call, range(1000)))
for outcome, n in sorted(outcomes.items()):
    print(n, outcome)
"#;
    let mut execution = ex.stream(code, Some(Duration::from_secs(300)));
    let outstanding = Arc::new(AtomicUsize::new(0));
    let (mut most, mut asked) = (0, 0);
    let out = loop {
        match execution.next().await.expect("a result") {
            ExecutionEvent::Approval(request) => {
                asked += 1;
                let now = outstanding.fetch_add(1, Ordering::SeqCst) + 1;
                most = most.max(now);
                let outstanding = outstanding.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    outstanding.fetch_sub(1, Ordering::SeqCst);
                    request.accept();
                });
            }
            ExecutionEvent::Result(result) => break result.expect("the cell runs").text,
            _ => {}
        }
    };
    eprintln!("1 000 threads: {asked} prompts, at most {most} outstanding at once; kernel: {out}");
    assert_eq!(most, MAX_OUTSTANDING_PROMPTS, "{out}");
    // Each call was asked about and made, or refused at the connection limit with a clear
    // error (every one of the 512 connections busy waiting for its turn).
    let mut ok = 0;
    let mut refused = 0;
    for line in out.lines() {
        let (n, outcome) = line.split_once(' ').unwrap();
        let n: usize = n.parse().unwrap();
        match outcome {
            "ok" => ok = n,
            "ToolRunnerError: the ipybox tool server refused the connection: 512 connections are open and every one is busy with a call (a limit that keeps kernel code from exhausting the host's file handles)" => {
                refused = n
            }
            other => panic!("unexpected outcome {n} x {other}\n{out}"),
        }
    }
    assert_eq!(ok + refused, 1000, "{out}");
    assert_eq!(asked, ok, "every call that ran was asked about");
    assert!(ok >= MAX_CONNECTIONS - 16, "{out}");
    // The host is still usable.
    assert_eq!(run(&ex, TOOL_CALL).await, "42");
    ex.stop().await;
}
