//! Issue 27's hardening of the service (and of stdio where it applies), attacked as an attacker
//! would: what ipybox's log may carry
//! (no code, output or handle at any level; text from kernels escaped, one record per line),
//! bounded retention of output and finished tasks (ipybox's RSS read from /proc), images capped
//! per cell and removed with their session, and connection floods from unauthenticated peers
//! (thousands of real sockets) while real clients keep working.

use std::time::{Duration, Instant};

use crate::http_support::*;
use crate::mcp_eras::Era;
use crate::support::*;

/// Waits until `log()` contains `needle` (records are written as they happen).
async fn wait_logged(service: &Service, needle: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let log = service.log();
        if log.contains(needle) {
            return log;
        }
        assert!(Instant::now() < deadline, "`{needle}` never logged:\n{log}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

const CODE: &str = "x = 'OUT' + 'PUT-7f3a'  # CODE-MARKER-19c2\nprint(x)";

/// Runs a cell with code and output markers in a new 2026-07-28 session and in a handshake-era
/// session; returns the 2026-07-28 session's handle.
async fn marked_cells(url: &str) -> String {
    let c = connect(url, Some(TOKEN_A), Era::Stateless).await;
    let (out, handle) = new_session(&c, CODE).await;
    assert_eq!(out, "OUTPUT-7f3a");
    assert_eq!(
        cell(&c, CODE, Some(&handle)).await,
        (false, "OUTPUT-7f3a".into())
    );
    let h = connect(url, Some(TOKEN_A), Era::Handshake).await;
    assert_eq!(cell(&h, CODE, None).await, (false, "OUTPUT-7f3a".into()));
    h.close().await;
    handle
}

/// Items 7 and 11: at `trace` (IPYBOX_LOG=trace and --log-level trace) the log carries no
/// cell's code, output, session handle or token; a tool name chosen by kernel code and a dying
/// kernel's stderr are written escaped, so they forge no record; every record is one line.
/// With --log-content the same run does log the code (what the guard keeps out).
#[tokio::test(flavor = "multi_thread")]
async fn logs_carry_no_code_output_or_handle_and_kernel_text_forges_no_record() {
    require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    register_fixture(ws.path());
    let service = Service::start(
        ws.path(),
        &[("IPYBOX_LOG", "trace")],
        &["--log-level", "trace", "--token", TOKEN_A],
    );
    let handle = marked_cells(&service.url()).await;
    let c = connect(&service.url(), Some(TOKEN_A), Era::Stateless).await;
    // A tool name with a newline and a terminal escape, from kernel code.
    let forged_tool = "from mcptools.fx import runner\ntry:\n    runner.run('add\\nERROR forged-record\\x1b[2J', {'a': 1})\nexcept Exception as e:\n    print(type(e).__name__)";
    assert_eq!(
        cell(&c, forged_tool, Some(&handle)).await,
        (false, "ToolError".into())
    );
    // A kernel that writes a forged record to its real stderr (ipykernel captures fd 2 for
    // the cell's output: the original is its copy), then dies.
    let (is_error, text) = cell(
        &c,
        "import os, sys, time\nfd = getattr(sys.stderr, '_original_stdstream_copy', None) or 2\nos.write(fd, b'\\nERROR forged-by-stderr\\x1b[31m\\n')\ntime.sleep(0.5)\nos._exit(3)",
        Some(&handle),
    )
    .await;
    assert!(is_error, "{text}");
    let log = wait_logged(&service, "the kernel died").await;
    drop(service);

    assert!(log.lines().count() > 10, "a trace log has records:\n{log}");
    assert!(log.contains("session{id="), "{log}");
    for secret in ["CODE-MARKER-19c2", "OUTPUT-7f3a", &handle, TOKEN_A] {
        assert!(!log.contains(secret), "the log carries `{secret}`:\n{log}");
    }
    let payload = handle.rsplit('.').next().unwrap();
    assert!(
        !log.contains(payload),
        "the log carries the handle's payload"
    );
    // Kernel text is escaped: one record per line, no terminal escape, nothing forged.
    assert!(!log.contains('\u{1b}'), "{log}");
    for line in log.lines() {
        assert!(
            line.starts_with(|c: char| c.is_ascii_digit()),
            "not a record of its own (forged?): {line:?}"
        );
    }
    assert!(
        log.contains(r#"tool="add\nERROR forged-record\u{1b}[2J""#),
        "{log}"
    );
    assert!(
        log.contains(r#"stderr="\nERROR forged-by-stderr\u{1b}[31m""#),
        "{log}"
    );
    assert!(log.contains(r#"status="exit code 3""#), "{log}");

    // The guard is what keeps them out: asked for, the content is there.
    let service = Service::start(
        ws.path(),
        &[("IPYBOX_LOG", "trace")],
        &["--log-content", "--token", TOKEN_A],
    );
    marked_cells(&service.url()).await;
    let log = wait_logged(&service, "CODE-MARKER-19c2").await;
    assert!(log.contains("OUTPUT-7f3a"));
}

/// The resident memory of process `pid`, in MiB.
fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kb / 1024.0
}

/// 64 MiB printed in 1 MiB writes (`00000000…`, `00000001…`, …), then `end`.
const FLOOD: &str = "import sys\nfor i in range(64):\n    sys.stdout.write(('%08d' % i) * 131072)\n    sys.stdout.flush()\nprint('end')";

/// What [`FLOOD`] prints.
fn flood_text() -> String {
    let mut text: String = (0..64).map(|i| format!("{i:08}").repeat(131_072)).collect();
    text.push_str("end\n");
    text
}

/// [`FLOOD`] as the server keeps it with `--max-output-bytes` `max`: the first and last halves,
/// the middle replaced by the note (then trimmed, as every result is).
fn flood_kept(max: usize) -> String {
    let text = flood_text();
    let cut = text.len() - max;
    format!(
        "{}\n[ipybox: {cut} bytes of output cut here: at most {max} bytes of a cell's output are kept, the first and the last half]\n{}",
        &text[..max / 2],
        &text[text.len() - max / 2..]
    )
    .trim()
    .to_string()
}

/// Runs `code` as a task (the server has `--task-after 0`) with a one-year timeout and
/// `max_output_chars`; waits until it completes and returns its id and result text.
async fn task_to_the_end(
    service: &rmcp::service::RunningService<rmcp::RoleClient, crate::mcp_eras::ScriptedClient>,
    code: &str,
    max_output_chars: usize,
    session: Option<&str>,
) -> (String, String) {
    use rmcp::model::{CallToolRequestParams, CallToolResponse, GetTaskParams, TaskPayload};
    let mut arguments = serde_json::json!({
        "code": code, "timeout": 31_536_000, "max_output_chars": max_output_chars});
    if let Some(session) = session {
        arguments["session"] = session.into();
    }
    let params = CallToolRequestParams::new("execute_ipython_cell").with_arguments(args(arguments));
    let task = match service.call_tool_once(params).await.expect("tools/call") {
        CallToolResponse::Task(t) => t.task,
        other => panic!("expected a task, got {other:?}"),
    };
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let got = service
            .get_task(GetTaskParams::new(task.task_id.clone()))
            .await
            .expect("tasks/get answers");
        if got.task.task.status.is_terminal() {
            let TaskPayload::Completed { result } = got.task.payload else {
                panic!("task did not complete: {:?}", got.task.payload);
            };
            let result: rmcp::model::CallToolResult =
                serde_json::from_value(result.into()).unwrap();
            let (is_error, text) = text_of(&result);
            assert!(!is_error, "{}", &text[..text.len().min(2000)]);
            return (task.task_id, text);
        }
        assert!(Instant::now() < deadline, "the task never ended");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Item 5 over stdio: cells that print 64 MiB each, as tasks with a one-year timeout. One asks
/// for 100 characters and gets exactly them; one asks for a billion and gets the server's
/// maximum (1 MiB by default: the first and last halves and a note). After they ended ipybox
/// holds no more than a loose bound beyond where it started (it held +128–192 MB per such task
/// before), and the results are forgotten `--task-ttl` after their cells ended, though their
/// clients asked for a year.
#[tokio::test(flavor = "multi_thread")]
async fn finished_tasks_hold_bounded_output_for_the_servers_time_only_over_stdio() {
    use crate::mcp_eras::ScriptedClient;
    require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    let user = ScriptedClient::new(Era::Stateless, true, &[]).with_tasks();
    let c =
        crate::mcp_approvals::start(ws.path(), &user, &["--task-after", "0", "--task-ttl", "4"])
            .await;
    let pid = c.pid();
    task_to_the_end(&c.service, "print(1)", 100, None).await;
    let before = rss_mib(pid);
    let (small, small_text) = task_to_the_end(&c.service, FLOOD, 100, None).await;
    let (large, text) = task_to_the_end(&c.service, FLOOD, 1_000_000_000, None).await;
    let after = rss_mib(pid);
    eprintln!("stdio: RSS {before:.1} MiB -> {after:.1} MiB after two 64 MiB tasks");
    assert_eq!(
        small_text,
        format!(
            "{}\n\n[Output truncated: exceeded 100 character limit]",
            &flood_text()[..100]
        )
    );
    assert_eq!(text.len(), flood_kept(1 << 20).len());
    assert!(text == flood_kept(1 << 20), "the kept text differs");
    assert!(after < before + 40.0, "RSS {before:.1} -> {after:.1} MiB");
    // Forgotten once --task-ttl has passed since their cells ended.
    tokio::time::sleep(Duration::from_secs(5)).await;
    for id in [small, large] {
        let gone = c
            .service
            .get_task(rmcp::model::GetTaskParams::new(id.clone()))
            .await
            .expect_err("a forgotten task");
        assert!(
            gone.to_string().contains(&format!("unknown task: {id}")),
            "{gone}"
        );
    }
    c.close().await;
}

/// Item 5 over HTTP: two sessions flood at once as tasks with one-year timeouts; ipybox's RSS
/// stays within a loose bound, and each result is the server's maximum, cut with the note.
#[tokio::test(flavor = "multi_thread")]
async fn flooding_sessions_hold_bounded_output_over_http() {
    use crate::mcp_eras::ScriptedClient;
    require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    let service = Service::start(
        ws.path(),
        &[],
        &[
            "--task-after",
            "0",
            "--max-output-bytes",
            "200000",
            "--warm-sessions",
            "2",
        ],
    );
    let pid = service.pid();
    let connect_tasks = || async {
        let user = ScriptedClient::new(Era::Stateless, true, &[]).with_tasks();
        connect_with(&service.url(), None, user, Era::Stateless).await
    };
    let (a, b) = (connect_tasks().await, connect_tasks().await);
    let (_, first) = task_to_the_end(&a.service, "print(1)", 100, None).await;
    let handle_a = split_note(&first).1.unwrap();
    let (_, first) = task_to_the_end(&b.service, "print(1)", 100, None).await;
    let handle_b = split_note(&first).1.unwrap();
    let before = rss_mib(pid);
    let (ra, rb) = tokio::join!(
        task_to_the_end(&a.service, FLOOD, 1_000_000_000, Some(&handle_a)),
        task_to_the_end(&b.service, FLOOD, 1_000_000_000, Some(&handle_b)),
    );
    let after = rss_mib(pid);
    eprintln!("http: RSS {before:.1} MiB -> {after:.1} MiB after two 64 MiB tasks at once");
    assert!(ra.1 == flood_kept(200_000), "the kept text differs");
    assert!(rb.1 == flood_kept(200_000), "the kept text differs");
    assert!(after < before + 40.0, "RSS {before:.1} -> {after:.1} MiB");
}

/// Code that displays `n` PNG outputs of `size` bytes each (distinct bytes: 0x89 'PNG' then
/// the image's number, repeated).
fn show_images(n: usize, size: usize) -> String {
    format!(
        "import base64\nfrom IPython.display import display\nfor i in range({n}):\n    data = (b'\\x89PNG' + bytes([i % 256]) * {size})[:{size}]\n    display({{'image/png': base64.b64encode(data).decode()}}, raw=True)\nprint('shown')"
    )
}

/// Items 5 and 6 in the SDK: `max_output_bytes` keeps the first and last halves of the text
/// (a cell's own `RunOptions` cap can be lower), an exception's text is held within it too, and
/// images over `max_images` or `max_image_bytes` are neither saved nor returned, only counted.
#[tokio::test(flavor = "multi_thread")]
async fn the_sdk_caps_text_and_images_per_execution() {
    use ipybox::executor::{ExecutionEvent, RunOptions};
    let ws = tempfile::tempdir().unwrap();
    let ex = ipybox::CodeExecutor::builder()
        .workspace(ws.path())
        .without_spare_kernel()
        .max_output_bytes(100)
        .max_images(3)
        .max_image_bytes(2500)
        .build();
    ex.start().await.expect("executor starts");
    let timeout = Some(Duration::from_secs(60));
    let note = |cut: usize, max: usize| {
        format!(
            "\n[ipybox: {cut} bytes of output cut here: at most {max} bytes of a cell's output are kept, the first and the last half]\n"
        )
    };
    let r = ex
        .execute("print('a' * 60 + 'b' * 60 + 'c' * 60)", timeout)
        .await
        .unwrap();
    assert_eq!(
        r.text,
        format!("{}{}{}", "a".repeat(50), note(81, 100), "c".repeat(49))
    );
    // One execution asks for less.
    let mut run = ex.stream_with_options(
        "print('a' * 60 + 'b' * 60 + 'c' * 60)",
        RunOptions {
            timeout,
            accept_all: true,
            max_output_bytes: Some(20),
            ..RunOptions::default()
        },
    );
    let mut result = None;
    while let Some(event) = run.next().await {
        if let ExecutionEvent::Result(r) = event {
            result = Some(r.unwrap());
        }
    }
    assert_eq!(
        result.unwrap().text,
        format!("{}{}{}", "a".repeat(10), note(161, 20), "c".repeat(9))
    );
    // An exception's message, as long as the kernel likes: held within the limit.
    let e = ex
        .execute("raise ValueError('v' * 100000)", timeout)
        .await
        .unwrap_err();
    assert!(e.to_string().len() < 400, "{}", e.to_string().len());
    assert!(e.to_string().contains("bytes of output cut here"), "{e}");
    // Images: three at most, 2 500 bytes at most.
    let r = ex.execute(&show_images(5, 100), timeout).await.unwrap();
    assert_eq!(
        (r.text.as_str(), r.images.len(), r.images_dropped),
        ("shown", 3, 2)
    );
    assert_eq!(r.image_data[2][4..], [2u8; 96]);
    let r = ex.execute(&show_images(3, 1000), timeout).await.unwrap();
    assert_eq!((r.images.len(), r.images_dropped), (2, 1));
    let saved = std::fs::read_dir(ws.path().join("images")).unwrap().count();
    assert_eq!(saved, 5, "only kept images are saved");
    ex.stop().await;
}

/// Item 6 over HTTP: a cell's images are capped by `--max-images` and `--max-image-bytes`, the
/// result says how many were dropped, and a closed session's `images/<session tag>/` is removed.
#[tokio::test(flavor = "multi_thread")]
async fn images_are_capped_per_cell_and_removed_with_their_session() {
    require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    let service = Service::start(
        ws.path(),
        &[],
        &["--max-images", "5", "--max-image-bytes", "3000000"],
    );
    let h = connect(&service.url(), None, Era::Handshake).await;
    let result = crate::support::call(
        &h,
        "execute_ipython_cell",
        serde_json::json!({"code": show_images(20, 1_000_000)}),
    )
    .await;
    let images = result
        .content
        .iter()
        .filter(|c| c.as_image().is_some())
        .count();
    let (is_error, text) = text_of(&result);
    assert!(!is_error, "{text}");
    assert_eq!(images, 3);
    let dirs: Vec<_> = std::fs::read_dir(ws.path().join("images"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(dirs.len(), 1, "{dirs:?}");
    let tag = dirs[0].file_name().unwrap().to_str().unwrap().to_string();
    let files: Vec<String> = std::fs::read_dir(&dirs[0])
        .unwrap()
        .map(|e| format!("images/{tag}/{}", e.unwrap().file_name().to_str().unwrap()))
        .collect();
    assert_eq!(files.len(), 3);
    let listed: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix("- ")).collect();
    assert_eq!(listed.len(), 3);
    assert!(
        text.starts_with("shown\n\n[ipybox: 17 more image(s) not saved or returned: a cell keeps at most 5 images and 3000000 bytes of images (--max-images, --max-image-bytes)]\n\nGenerated images:\n- "),
        "{text}"
    );
    // By count: 7 small ones, 5 kept.
    let result = crate::support::call(
        &h,
        "execute_ipython_cell",
        serde_json::json!({"code": show_images(7, 10)}),
    )
    .await;
    assert_eq!(
        result
            .content
            .iter()
            .filter(|c| c.as_image().is_some())
            .count(),
        5
    );
    assert!(
        text_of(&result)
            .1
            .starts_with("shown\n\n[ipybox: 2 more image(s)")
    );
    // The session closes (DELETE of its MCP session): its images go with it.
    h.close().await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while dirs[0].exists() {
        assert!(
            Instant::now() < deadline,
            "{} is still there",
            dirs[0].display()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        ws.path().join("images").is_dir(),
        "only the session's own directory goes"
    );
}

/// A GET of `/healthz` on `stream` (kept alive), with `token` if any; returns the status line.
async fn healthz_on(stream: &mut tokio::net::TcpStream, token: Option<&str>) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let authorization = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    stream
        .write_all(
            format!("GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n{authorization}\r\n").as_bytes(),
        )
        .await
        .unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    while !got.ends_with(b"\r\n\r\nok\n") {
        let n = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut buf))
            .await
            .expect("an answer")
            .unwrap();
        assert!(n > 0, "closed: {}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&got)
        .lines()
        .next()
        .unwrap()
        .to_string()
}

/// Whether the server has closed `stream` (EOF or reset within `within`).
async fn closed_by_server(stream: &mut tokio::net::TcpStream, within: Duration) -> bool {
    use tokio::io::AsyncReadExt;
    let mut buf = [0u8; 64];
    matches!(
        tokio::time::timeout(within, stream.read(&mut buf)).await,
        Ok(Ok(0) | Err(_))
    )
}

/// The metric `name` (with its labels) from `/metrics`.
async fn metric(port: u16, name: &str) -> f64 {
    let text = reqwest::Client::new()
        .get(format!("http://127.0.0.1:{port}/metrics"))
        .bearer_auth(TOKEN_A)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix(' ')))
        .unwrap_or_else(|| panic!("no {name} in:\n{text}"))
        .parse()
        .unwrap()
}

/// Item 4: thousands of connections that send nothing, from 120 addresses and from the real
/// client's own address, lock no client out: while they are held, `/healthz` answers, a
/// session's client keeps working and a new client gets in; the global and per-address caps
/// shed the silent connections (they never refuse), and every silent one is closed once
/// `--first-request-timeout` has passed. The timeout is 40 s here, not the default 5 s, so that
/// the caps, not the timeout, meet the flood however slowly this loaded machine opens it (9 s
/// seen, and 23 s once in a whole CI run); the 5 s default is tested in
/// `idle_keep_alive_connections_of_real_clients_are_kept`.
#[tokio::test(flavor = "multi_thread")]
async fn a_flood_of_silent_connections_locks_no_client_out() {
    let ws = tempfile::tempdir().unwrap();
    let service = Service::start(
        ws.path(),
        &[],
        &["--token", TOKEN_A, "--first-request-timeout", "40"],
    );
    let port = service.port;
    let c = connect(&service.url(), Some(TOKEN_A), Era::Stateless).await;
    let (_, handle) = new_session(&c, "x = 1").await;
    let server: std::net::SocketAddr = ([127, 0, 0, 1], port).into();
    let started = Instant::now();
    let mut flood = Vec::new();
    for host in 2..122u8 {
        for _ in 0..50 {
            let socket = tokio::net::TcpSocket::new_v4().unwrap();
            socket.bind(([127, 0, 0, host], 0).into()).unwrap();
            flood.push(socket.connect(server).await.unwrap());
        }
    }
    for _ in 0..300 {
        flood.push(tokio::net::TcpStream::connect(server).await.unwrap());
    }
    let flooded = Instant::now();
    eprintln!(
        "{} silent connections in {:?}",
        flood.len(),
        flooded - started
    );
    assert!(
        flooded - started < Duration::from_secs(38),
        "the flood took {:?}: the first ones timed out before the caps were reached",
        flooded - started
    );
    // Held: the service answers everyone who speaks.
    assert_eq!(crate::http_support::healthz(port), Some(200));
    assert_eq!(
        cell(&c, "x += 1\nprint(x)", Some(&handle)).await,
        (false, "2".into())
    );
    let newcomer = connect(&service.url(), Some(TOKEN_A), Era::Handshake).await;
    assert_eq!(
        cell(&newcomer, "print(40 + 2)", None).await,
        (false, "42".into())
    );
    newcomer.close().await;
    let shed = metric(
        port,
        "ipybox_http_connections_closed_total{reason=\"shed\"}",
    )
    .await;
    // 300 from one address over its cap of 64, then 6 064 over the cap of 4096 in all: at least
    // 236 + 1 968 shed.
    assert!(shed >= 2204.0, "{shed} shed");
    assert_eq!(
        metric(
            port,
            "ipybox_http_connections_closed_total{reason=\"refused\"}"
        )
        .await,
        0.0
    );
    // At most 64 silent connections per address, 4096 in all.
    assert!(metric(port, "ipybox_http_connections").await <= 4096.0);
    // Every silent one is closed within the first request timeout (and a sweep).
    tokio::time::sleep_until((flooded + Duration::from_secs(41)).into()).await;
    let mut open = 0;
    for stream in flood.iter_mut().step_by(50) {
        if !closed_by_server(stream, Duration::from_millis(200)).await {
            open += 1;
        }
    }
    assert_eq!(open, 0, "silent connections still open 41 s after the last");
    assert!(metric(port, "ipybox_http_connections").await < 20.0);
    assert_eq!(
        cell(&c, "x += 1\nprint(x)", Some(&handle)).await,
        (false, "3".into())
    );
}

/// Item 4's other side: a real client's connection idle between requests is not cut early.
/// A raw keep-alive connection with the token is idle 8 s (more than the 5 s a new connection
/// gets for its first request) and answers on the same socket, and so does the MCP client's own;
/// a connection that sends nothing, and one whose request had no token, are closed after 5 s. (What clients keep idle themselves, measured
/// against this server: Node's fetch 4 s, Python httpx 5 s, reqwest (rmcp) 90 s by default.)
#[tokio::test(flavor = "multi_thread")]
async fn idle_keep_alive_connections_of_real_clients_are_kept() {
    let ws = tempfile::tempdir().unwrap();
    let service = Service::start(ws.path(), &[], &["--token", TOKEN_A]);
    let port = service.port;
    let server: std::net::SocketAddr = ([127, 0, 0, 1], port).into();
    let mut kept = tokio::net::TcpStream::connect(server).await.unwrap();
    assert_eq!(
        healthz_on(&mut kept, Some(TOKEN_A)).await,
        "HTTP/1.1 200 OK"
    );
    let mut anonymous = tokio::net::TcpStream::connect(server).await.unwrap();
    assert_eq!(healthz_on(&mut anonymous, None).await, "HTTP/1.1 200 OK");
    let mut silent = tokio::net::TcpStream::connect(server).await.unwrap();
    let c = connect(&service.url(), Some(TOKEN_A), Era::Stateless).await;
    let (_, handle) = new_session(&c, "x = 1").await;
    tokio::time::sleep(Duration::from_secs(8)).await;
    assert!(closed_by_server(&mut silent, Duration::from_millis(100)).await);
    assert!(closed_by_server(&mut anonymous, Duration::from_millis(100)).await);
    assert_eq!(
        healthz_on(&mut kept, Some(TOKEN_A)).await,
        "HTTP/1.1 200 OK"
    );
    assert_eq!(
        cell(&c, "x += 1\nprint(x)", Some(&handle)).await,
        (false, "2".into())
    );
    assert_eq!(
        metric(
            port,
            "ipybox_http_connections_closed_total{reason=\"idle\"}"
        )
        .await,
        1.0,
        "the anonymous one only"
    );
    assert_eq!(
        metric(
            port,
            "ipybox_http_connections_closed_total{reason=\"no_request\"}"
        )
        .await,
        1.0
    );
    // Idle for longer than --keep-alive-timeout: closed.
    let short = Service::start(
        ws.path(),
        &[],
        &["--token", TOKEN_A, "--keep-alive-timeout", "2"],
    );
    let server: std::net::SocketAddr = ([127, 0, 0, 1], short.port).into();
    let mut idle = tokio::net::TcpStream::connect(server).await.unwrap();
    assert_eq!(
        healthz_on(&mut idle, Some(TOKEN_A)).await,
        "HTTP/1.1 200 OK"
    );
    assert!(!closed_by_server(&mut idle, Duration::from_millis(1500)).await);
    assert!(closed_by_server(&mut idle, Duration::from_secs(2)).await);
}
