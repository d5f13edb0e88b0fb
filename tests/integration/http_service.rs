//! `ipybox serve --http` with local kernels, driven by real MCP clients over Streamable HTTP:
//! rmcp's client in both eras (handles in 2026-07-28, the MCP session's own kernel in the
//! handshake era), the Python `mcp` SDK 2.x `Client` and 1.x `ClientSession`
//! (`tests/python/http_clients_check.py`), isolation between concurrent clients, handles of
//! other credentials, the limits (idle expiry, max sessions, calls per session, body size,
//! tokens, Origin, binding without a token), shutdown with running cells, and 500 sessions
//! created and closed without leaking kernels, file descriptors or memory.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::http_support::*;
use crate::mcp_eras::{CallTool, Era};
use crate::support::*;

const EXPIRED_SUFFIX: &str = " expired: it was idle for more than 3 s (--idle-timeout), so its kernel was stopped and its state is gone\n  help: call without `session` to start a new session";

/// The handle shape `text` shows its reader (`ipybox-s1.<route>.<...>`: from `ipybox-s1` to the
/// next backtick, quote or space).
fn shown_shape(text: &str) -> &str {
    let at = text
        .find("ipybox-s1")
        .unwrap_or_else(|| panic!("no handle shape in: {text}"));
    let rest = &text[at..];
    &rest[..rest.find(['`', '"', ' ']).unwrap_or(rest.len())]
}

/// Whether `handle` has the shape `shape` shows: its literal parts as they are, each `<...>`
/// one or more characters a handle's part is made of (base64url, no dots).
fn has_shape(handle: &str, shape: &str) -> bool {
    let mut rest = handle;
    let mut pattern = shape;
    while !pattern.is_empty() {
        if let Some(after) = pattern.strip_prefix('<') {
            let Some(end) = after.find('>') else {
                return false;
            };
            pattern = &after[end + 1..];
            let part = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '_'))
                .unwrap_or(rest.len());
            if part == 0 {
                return false;
            }
            rest = &rest[part..];
        } else {
            let literal = pattern.find('<').unwrap_or(pattern.len());
            let Some(after) = rest.strip_prefix(&pattern[..literal]) else {
                return false;
            };
            rest = after;
            pattern = &pattern[literal..];
        }
    }
    rest.is_empty()
}

fn session_tag_ok(tag: &str) -> bool {
    tag.len() == 8 && tag.bytes().all(|b| b.is_ascii_hexdigit())
}

#[tokio::test(flavor = "multi_thread")]
async fn stateless_clients_carry_their_session_handle() {
    require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    let service = Service::start(ws.path(), &[("IPYBOX_TOKEN", TOKEN_A)], &[]);
    let c = connect(&service.url(), Some(TOKEN_A), Era::Stateless).await;
    let tools = c.service.list_all_tools().await.unwrap();
    let execute = tools
        .iter()
        .find(|t| t.name == "execute_ipython_cell")
        .unwrap();
    assert_eq!(
        execute.input_schema["properties"]["session"]["type"],
        json!("string")
    );
    assert_eq!(
        execute.input_schema["properties"]["session"].get("x-mcp-header"),
        None
    );
    let (out, h) = new_session(&c, "x = 1\nprint('one')").await;
    assert_eq!(out, "one");
    assert!(h.starts_with("ipybox-s1."), "{h}");
    // What the schema tells the model a handle looks like is what a handle looks like (and the
    // check can fail: the old `ipybox-s1-...` does not match).
    let described = execute.input_schema["properties"]["session"]["description"]
        .as_str()
        .unwrap();
    assert_eq!(shown_shape(described), "ipybox-s1.<route>.<...>");
    assert!(has_shape(&h, shown_shape(described)), "{h} vs {described}");
    assert!(!has_shape(&h, "ipybox-s1-..."));
    assert!(!has_shape(&format!("{h}.x"), shown_shape(described)));
    let reset = tools.iter().find(|t| t.name == "reset").unwrap();
    assert_eq!(
        reset.input_schema["properties"]["session"]["description"],
        execute.input_schema["properties"]["session"]["description"]
    );
    assert_eq!(
        cell(&c, "x += 1\nprint(x)", Some(&h)).await,
        (false, "2".into())
    );
    // Without the handle: a new session, a fresh kernel.
    let (is_error, text) = cell(&c, "print(x)", None).await;
    let (out, other) = split_note(&text);
    assert!(
        is_error && out.contains("NameError: name 'x' is not defined"),
        "{text}"
    );
    assert_ne!(other.as_deref(), Some(h.as_str()));
    // reset resets that session only.
    assert_eq!(
        cell(&c, "y = 5", other.as_deref()).await,
        (false, String::new())
    );
    let reset = c
        .call_tool_json("reset", json!({"session": h}).as_object().unwrap().clone())
        .await
        .unwrap();
    assert_eq!(
        text_of(&reset),
        (
            false,
            "Kernel reset: a fresh kernel is running and MCP sessions were closed.".into()
        )
    );
    let (is_error, text) = cell(&c, "x", Some(&h)).await;
    assert!(is_error && text.contains("NameError"), "{text}");
    assert_eq!(cell(&c, "y", other.as_deref()).await, (false, "5".into()));
    let reset = c
        .call_tool_json("reset", serde_json::Map::new())
        .await
        .unwrap();
    assert_eq!(
        text_of(&reset),
        (
            true,
            "no session given: reset needs the `session` handle of the kernel to reset\n  help: pass session=\"ipybox-s1.<route>.<...>\" as named by an earlier result; a call without it starts a new session with a fresh kernel anyway".into()
        )
    );
    assert!(has_shape(&h, shown_shape(&text_of(&reset).1)));
    // Operator-only tools.
    let register = c
        .call_tool_json(
            "register_mcp_server",
            json!({"server_name": "fx", "server_params": fixture_stdio_params("stdio")})
                .as_object()
                .unwrap()
                .clone(),
        )
        .await
        .unwrap();
    let (is_error, text) = text_of(&register);
    assert!(
        is_error && text.starts_with("cannot register `fx`: on this ipybox service the operator registers the MCP servers"),
        "{text}"
    );
    let install = c
        .call_tool_json(
            "install_package",
            json!({"package_name": "six", "session": h})
                .as_object()
                .unwrap()
                .clone(),
        )
        .await
        .unwrap();
    let (is_error, text) = text_of(&install);
    assert!(
        is_error && text.starts_with("cannot install `six`: every session of this ipybox service shares the kernel environment"),
        "{text}"
    );
    assert_eq!(
        metric(service.port, Some(TOKEN_A), "ipybox_sessions").await,
        2.0
    );
    c.close().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn handshake_sessions_have_their_own_kernel() {
    require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    let service = Service::start(ws.path(), &[], &["--token", TOKEN_A]);
    let a = connect(&service.url(), Some(TOKEN_A), Era::Handshake).await;
    let b = connect(&service.url(), Some(TOKEN_A), Era::Handshake).await;
    assert_eq!(cell(&a, "x = 'a'", None).await, (false, String::new()));
    assert_eq!(cell(&a, "print(x)", None).await, (false, "a".into()));
    let (is_error, text) = cell(&b, "print(x)", None).await;
    assert!(is_error && text.contains("NameError"), "{text}");
    // A handle works in this era too: b continues a's kernel only with a handle of its own
    // making, so a 2026-07-28 session made by the same token is reachable from b.
    let modern = connect(&service.url(), Some(TOKEN_A), Era::Stateless).await;
    let (_, h) = new_session(&modern, "z = 3").await;
    assert_eq!(cell(&b, "print(z)", Some(&h)).await, (false, "3".into()));
    let port = service.port;
    assert_eq!(metric(port, Some(TOKEN_A), "ipybox_sessions").await, 3.0);
    // Ending the MCP session (DELETE) closes its kernel session.
    a.close().await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while metric(port, Some(TOKEN_A), "ipybox_sessions").await != 2.0 {
        assert!(
            Instant::now() < deadline,
            "a's kernel session was not closed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        metric(
            port,
            Some(TOKEN_A),
            "ipybox_sessions_closed_total{reason=\"mcp_session\"}"
        )
        .await,
        1.0
    );
    b.close().await;
    modern.close().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn python_sdk_clients_of_both_eras() {
    require!(TestEnv);
    let mcp1 = root().join("target/mcp1/venv/bin/python");
    assert!(
        mcp1.exists(),
        "{} is missing: run `bash scripts/test-env.sh`",
        mcp1.display()
    );
    let ws = tempfile::tempdir().unwrap();
    let service = Service::start(ws.path(), &[("IPYBOX_TOKEN", TOKEN_A)], &[]);
    for python in [python(), mcp1.display().to_string()] {
        let out = std::process::Command::new(&python)
            .arg(root().join("tests/python/http_clients_check.py"))
            .arg(service.url())
            .arg(TOKEN_A)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{python}:\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(stdout.contains(" passed, 0 failed"), "{stdout}");
    }
}

/// Eight clients at once (four per era), each setting `x` to its own values and reading them
/// back 100 times: every read sees its own client's last write.
#[tokio::test(flavor = "multi_thread")]
async fn eight_concurrent_clients_never_see_each_other() {
    require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    let service = Service::start(
        ws.path(),
        &[],
        &[
            "--token",
            TOKEN_A,
            "--token",
            TOKEN_B,
            "--warm-sessions",
            "2",
            "--trust-tenants",
        ],
    );
    let url = service.url();
    let mut runs = Vec::new();
    for i in 0..8 {
        let url = url.clone();
        runs.push(tokio::spawn(async move {
            let era = if i % 2 == 0 {
                Era::Stateless
            } else {
                Era::Handshake
            };
            let token = if i < 4 { TOKEN_A } else { TOKEN_B };
            let c = connect(&url, Some(token), era).await;
            let mut handle = None;
            for n in 0..100 {
                let value = format!("client{i}-{n}");
                let set = format!("x = {value:?}");
                let (is_error, text) = cell(&c, &set, handle.as_deref()).await;
                assert!(!is_error, "{text}");
                if n == 0 && era == Era::Stateless {
                    handle = split_note(&text).1;
                    assert!(handle.is_some(), "{text}");
                }
                assert_eq!(
                    cell(&c, "print(x)", handle.as_deref()).await,
                    (false, value),
                    "client {i}, round {n}"
                );
            }
            c.close().await;
        }));
    }
    for run in runs {
        run.await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn handles_and_mcp_sessions_of_another_token_are_refused() {
    require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    let service = Service::start(
        ws.path(),
        &[],
        &["--token", TOKEN_A, "--token", TOKEN_B, "--trust-tenants"],
    );
    let a = connect(&service.url(), Some(TOKEN_A), Era::Stateless).await;
    let b = connect(&service.url(), Some(TOKEN_B), Era::Stateless).await;
    let (_, h) = new_session(&a, "secret = 42").await;
    let not_yours = "this session handle is not valid with your credential: it was made for another token, altered, or issued by an ipybox with another --session-secret\n  help: pass a handle a result gave you, or leave `session` out to start a new session";
    assert_eq!(
        cell(&b, "print(secret)", Some(&h)).await,
        (true, not_yours.into())
    );
    // A guessed handle: the right shape, random contents.
    use base64::Engine;
    let (prefix, payload) = h.rsplit_once('.').unwrap();
    let len = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload)
        .unwrap()
        .len();
    for _ in 0..20 {
        let mut bytes: Vec<u8> = (0..len).map(|_| rand::random()).collect();
        bytes[0] = 0;
        let route_len = bytes.len() - 1 - 16 - 1 - 16;
        bytes[17] = route_len as u8;
        let route = prefix.rsplit('.').next().unwrap().as_bytes();
        bytes[18..18 + route_len].copy_from_slice(route);
        let guess = format!(
            "{prefix}.{}",
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(&bytes)
        );
        assert_eq!(
            cell(&a, "print(secret)", Some(&guess)).await,
            (true, not_yours.into())
        );
    }
    assert_eq!(
        cell(&a, "1", Some("s1")).await,
        (
            true,
            "this is not an ipybox session handle (they look like `ipybox-s1.<route>.<...>`)\n  help: pass the handle exactly as a result named it, or leave `session` out to start a new session".into()
        )
    );
    assert!(has_shape(
        &h,
        shown_shape(&cell(&a, "1", Some("s1")).await.1)
    ));
    assert_eq!(
        cell(&a, "print(secret)", Some(&h)).await,
        (false, "42".into())
    );

    // A handshake-era MCP session is its opener's: another token's requests on it are 404.
    let http = reqwest::Client::new();
    let init = http
        .post(service.url())
        .bearer_auth(TOKEN_A)
        .header("Accept", "application/json, text/event-stream")
        .json(
            &json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "raw", "version": "1"}}}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(init.status(), 200);
    let sid = init.headers()["mcp-session-id"]
        .to_str()
        .unwrap()
        .to_string();
    let call = |token: &'static str| {
        http.post(service.url())
            .bearer_auth(token)
            .header("Accept", "application/json, text/event-stream")
            .header("Mcp-Session-Id", &sid)
            .header("MCP-Protocol-Version", "2025-11-25")
            .json(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .send()
    };
    let refused = call(TOKEN_B).await.unwrap();
    assert_eq!(refused.status(), 404);
    assert_eq!(
        refused.text().await.unwrap(),
        "Not Found: Session not found"
    );
    assert_eq!(call(TOKEN_A).await.unwrap().status(), 202);
    a.close().await;
    b.close().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn idle_sessions_expire_with_a_clear_error() {
    require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    // 3 s: long enough that starting the other client's kernel, or a slow round trip on a
    // loaded machine, never makes a session idle for longer between its calls (1 s did, at a
    // load of 10 on 2 cores).
    let service = Service::start(
        ws.path(),
        &[],
        &["--idle-timeout", "3", "--warm-sessions", "0"],
    );
    let modern = connect(&service.url(), None, Era::Stateless).await;
    let legacy = connect(&service.url(), None, Era::Handshake).await;
    // The handshake-era session's kernel starts first, so that the new session's next call
    // follows it at once.
    assert_eq!(cell(&legacy, "x = 1", None).await, (false, String::new()));
    let (_, h) = new_session(&modern, "x = 1").await;
    // A cell that runs longer than the idle timeout keeps its session.
    assert_eq!(
        cell(&modern, "import time\ntime.sleep(4)\nprint(x)", Some(&h)).await,
        (false, "1".into())
    );
    // Well past the idle timeout and the reaper's tick (300 ms) for both.
    tokio::time::sleep(Duration::from_millis(5000)).await;
    // 2026-07-28: the expired handle gets the error (the client leaves `session` out to start
    // anew).
    let (is_error, text) = cell(&modern, "print(x)", Some(&h)).await;
    let tag = text
        .strip_prefix("session ")
        .and_then(|t| t.strip_suffix(EXPIRED_SUFFIX))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(is_error && session_tag_ok(tag), "{text}");
    // A handshake-era client cannot pass a handle: its MCP session gets a new kernel session,
    // and the result says that the old state is gone, once.
    let (is_error, text) = cell(&legacy, "print('again')", None).await;
    let note = text
        .strip_prefix("again\n\n[ipybox: session ")
        .unwrap_or_else(|| panic!("{text}"));
    let (tag, rest) = note.split_at(8);
    assert!(!is_error && session_tag_ok(tag), "{text}");
    assert_eq!(
        rest,
        " expired: it was idle for more than 3 s (--idle-timeout), so its kernel was stopped and its state is gone. This call runs in a new kernel session: variables, imports and definitions from before are gone]"
    );
    assert_eq!(
        cell(&legacy, "print('x' in dir())", None).await,
        (false, "False".into())
    );
    assert_eq!(
        metric(
            service.port,
            None,
            "ipybox_sessions_closed_total{reason=\"idle\"}"
        )
        .await,
        2.0
    );
    modern.close().await;
    legacy.close().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn max_sessions_and_calls_per_session_are_refused_not_evicted() {
    require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    let service = Service::start(
        ws.path(),
        &[],
        &[
            "--max-sessions",
            "2",
            "--warm-sessions",
            "0",
            "--max-concurrent-calls",
            "1",
        ],
    );
    let c = connect(&service.url(), None, Era::Stateless).await;
    let (_, one) = new_session(&c, "x = 1").await;
    let (_, two) = new_session(&c, "x = 2").await;
    let refused = "too many sessions: this ipybox already runs the maximum of 2 kernel sessions (--max-sessions)\n  help: retry later (sessions idle for 600 s are hibernated), end a handshake-era MCP session you no longer need, or ask the operator for a higher --max-sessions";
    assert_eq!(cell(&c, "x = 3", None).await, (true, refused.into()));
    let legacy = connect(&service.url(), None, Era::Handshake).await;
    assert_eq!(cell(&legacy, "x = 3", None).await, (true, refused.into()));
    assert_eq!(cell(&c, "print(x)", Some(&one)).await, (false, "1".into()));
    assert_eq!(cell(&c, "print(x)", Some(&two)).await, (false, "2".into()));
    assert_eq!(
        metric(service.port, None, "ipybox_sessions_refused_total").await,
        2.0
    );

    // One call at a time per session (--max-concurrent-calls 1): a second is refused at once.
    let c = std::sync::Arc::new(c);
    let slow = {
        let (c, one) = (c.clone(), one.clone());
        tokio::spawn(async move {
            cell(&*c, "import time\ntime.sleep(2)\nprint('slow')", Some(&one)).await
        })
    };
    tokio::time::sleep(Duration::from_millis(700)).await;
    let started = Instant::now();
    assert_eq!(
        cell(&*c, "print('fast')", Some(&one)).await,
        (
            true,
            "too many calls at once in this session: it already has 1 in progress (--max-concurrent-calls)\n  help: wait for a call to finish; calls of one session run one after another in its kernel anyway".into()
        )
    );
    assert!(started.elapsed() < Duration::from_secs(1));
    // Another session is not held up.
    assert_eq!(cell(&*c, "print(x)", Some(&two)).await, (false, "2".into()));
    assert_eq!(slow.await.unwrap(), (false, "slow".into()));
    legacy.close().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn tokens_origin_and_body_size_are_checked_before_anything_runs() {
    require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    let service = Service::start(
        ws.path(),
        &[],
        // The knock below is a connection to the host's loopback: the host's network.
        &[
            "--token",
            TOKEN_A,
            "--max-body-bytes",
            "2000",
            "--session-network",
            "host",
        ],
    );
    let http = reqwest::Client::new();
    let discover = json!({"jsonrpc": "2.0", "id": 1, "method": "server/discover", "params": {"_meta": {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "1"},
        "io.modelcontextprotocol/clientCapabilities": {}}}});
    let post = |token: Option<&str>, origin: Option<&str>, body: Value| {
        let mut req = http
            .post(service.url())
            .header("Accept", "application/json, text/event-stream")
            .header("MCP-Protocol-Version", "2026-07-28")
            .header("Mcp-Method", body["method"].as_str().unwrap().to_string())
            .json(&body);
        if let Some(name) = body["params"]["name"].as_str() {
            req = req.header("Mcp-Name", name.to_string());
        }
        if let Some(token) = token {
            req = req.header("Authorization", format!("Bearer {token}"));
        }
        if let Some(origin) = origin {
            req = req.header("Origin", origin);
        }
        req.send()
    };
    // Code sent without the token, or with a wrong one, does not run: it would knock (a
    // signal the host sees; the control below runs the same call with the token, and knocks).
    let knock = Knock::new();
    let run_knock = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {
        "name": "execute_ipython_cell", "arguments": {"code": knock.code()},
        "_meta": discover["params"]["_meta"].clone()}});
    for (token, why) in [
        (None, "no bearer token was sent"),
        (
            Some("wrong-token-0123456789"),
            "the bearer token was not accepted",
        ),
        (Some(TOKEN_B), "the bearer token was not accepted"),
    ] {
        for body in [run_knock.clone(), discover.clone()] {
            let resp = post(token, None, body).await.unwrap();
            let (status, headers) = (resp.status(), resp.headers().clone());
            // (The whole response: had the cell run, it has ended.)
            let body = resp.text().await.unwrap();
            assert_eq!(knock.count(), 0, "code sent with {token:?} ran: {body}");
            assert_eq!(status, 401);
            assert_eq!(headers["www-authenticate"], "Bearer realm=\"ipybox\"");
            assert_eq!(
                body,
                format!(
                    "Unauthorized: {why}. This ipybox needs `Authorization: Bearer <token>` with a token its operator configured (--token, IPYBOX_TOKEN or --token-file).\n"
                )
            );
            assert!(!body.contains("wrong-token") && !body.contains(TOKEN_A));
        }
    }
    assert_eq!(
        post(Some(TOKEN_A), None, discover.clone())
            .await
            .unwrap()
            .status(),
        200
    );
    let metrics = http
        .get(format!("http://127.0.0.1:{}/metrics", service.port))
        .send()
        .await
        .unwrap();
    assert_eq!(metrics.status(), 401);
    // DNS rebinding: a page of another origin is refused; this machine's pages are not.
    for body in [run_knock.clone(), discover.clone()] {
        let evil = post(Some(TOKEN_A), Some("http://evil.example.com"), body)
            .await
            .unwrap();
        let status = evil.status();
        let text = evil.text().await.unwrap();
        assert_eq!(
            knock.count(),
            0,
            "code sent from another origin ran: {text}"
        );
        assert_eq!(status, 403);
    }
    let local = format!("http://localhost:{}", service.port);
    assert_eq!(
        post(Some(TOKEN_A), Some(&local), discover.clone())
            .await
            .unwrap()
            .status(),
        200
    );
    // A body over --max-body-bytes: 413, nothing runs (the code would connect to `knock`: a
    // confined kernel cannot write where the host looks).
    // (A call that runs when the limit allows it: see the control below.)
    let big = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
        "name": "execute_ipython_cell", "arguments": {"code": format!("{}  # {}", knock.code(), "x".repeat(3000))},
        "_meta": discover["params"]["_meta"].clone()}});
    assert_eq!(post(Some(TOKEN_A), None, big).await.unwrap().status(), 413);
    assert_eq!(knock.count(), 0, "the refused call ran");
    assert_eq!(
        metric(
            service.port,
            Some(TOKEN_A),
            "ipybox_http_unauthorized_total"
        )
        .await,
        7.0
    );
    assert_eq!(
        metric(
            service.port,
            Some(TOKEN_A),
            "ipybox_sessions_opened_total{how=\"new\"}"
        )
        .await,
        0.0
    );
    // The control: the same code in a body within the limit runs (and knocks) before its result
    // comes back; the big one never did.
    let client = connect(&service.url(), Some(TOKEN_A), Era::Stateless).await;
    let (is_error, text) = cell(&client, &knock.code(), None).await;
    assert!(!is_error, "{text}");
    assert_eq!(knock.count(), 1, "one knock: the call within the limit");
    client.close().await;
    // And the raw call the bad tokens sent, now with the token: it runs (and knocks).
    let resp = post(Some(TOKEN_A), None, run_knock.clone()).await.unwrap();
    let status = resp.status();
    // (The whole response: the cell has ended.)
    let text = resp.text().await.unwrap();
    assert_eq!(status, 200, "{text}");
    assert_eq!(knock.count(), 2, "the raw call with the token ran: {text}");

    // Several tokens sharing local kernels that do not keep them apart (unconfined; confined
    // with one uid for all, or with the host's network; clients allowed to register servers):
    // refused unless the operator says they
    // trust each other. Fully confined (the default as root) they start: see `tenant_chain`.
    for (flags, why) in [
        (
            &["--unconfined-sessions"][..],
            "each tenant's code can reach the others' kernels and files",
        ),
        (
            &["--session-uids", "none"][..],
            "each tenant's kernels still run as one uid",
        ),
        (
            &["--session-network", "host"][..],
            "with --session-network host every session reaches the host's loopback",
        ),
        (
            &["--allow-register"][..],
            "with --allow-register a client makes this host run commands",
        ),
    ] {
        let mut args = vec!["--token", TOKEN_A, "--token", TOKEN_B];
        args.extend(flags);
        let stderr = serve_refused("127.0.0.1", ws.path(), &args, &[]);
        assert!(
            stderr.contains("2 tokens (tenants) would share local kernels")
                && stderr.contains(why)
                && stderr.contains("pass --trust-tenants if these tenants trust each other")
                && !stderr.contains(TOKEN_A),
            "{flags:?}: {stderr}"
        );
    }

    // Binding beyond loopback without a token: refused at start.
    let stderr = serve_refused("0.0.0.0", ws.path(), &[], &[("IPYBOX_TOKEN", None)]);
    assert!(
        stderr.contains("refusing to serve on 0.0.0.0:")
            && stderr.contains("without a bearer token: anyone who reaches it could run code\n  help: pass --token-file FILE"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn shutdown_with_running_cells_leaves_no_kernel() {
    require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    let mut service = Service::start(
        ws.path(),
        &[],
        &["--shutdown-grace", "1", "--warm-sessions", "1"],
    );
    let modern = std::sync::Arc::new(connect(&service.url(), None, Era::Stateless).await);
    let legacy = std::sync::Arc::new(connect(&service.url(), None, Era::Handshake).await);
    let (_, h) = new_session(&*modern, "x = 1").await;
    assert_eq!(cell(&*legacy, "x = 1", None).await, (false, String::new()));
    let running: Vec<_> = [(modern.clone(), Some(h)), (legacy.clone(), None)]
        .into_iter()
        .map(|(c, h)| {
            tokio::spawn(async move {
                let code = "import time\nprint('started', flush=True)\ntime.sleep(60)";
                let arguments = match &h {
                    Some(h) => json!({"code": code, "session": h}),
                    None => json!({"code": code}),
                };
                c.call_tool_json(
                    "execute_ipython_cell",
                    arguments.as_object().unwrap().clone(),
                )
                .await
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // Exactly the kernels (among every descendant: forked kernels are the template's, not
    // ipybox's): the two sessions' and the warm one (it may still be starting). The template's
    // own processes are no kernel, so a count they meet proves nothing.
    let deadline = Instant::now() + Duration::from_secs(30);
    let kernels = loop {
        let kernels = crate::proc_tree::kernels(service.pid());
        if kernels.len() >= 3 || Instant::now() > deadline {
            break kernels;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(
        kernels.len(),
        3,
        "two sessions and a warm kernel: {kernels:?} among {:?}",
        crate::proc_tree::descendants(service.pid())
    );
    // Every other process of the service too (the template, the kernels' outer processes).
    let every = crate::proc_tree::descendants(service.pid());
    let (status, took) = service.terminate(Duration::from_secs(15));
    assert!(status.success(), "{status}\n{}", service.log());
    assert!(took < Duration::from_secs(6), "{took:?}");
    for pid in &kernels {
        assert!(
            wait_gone(*pid, Duration::from_secs(5)).await,
            "kernel {pid} left"
        );
    }
    for pid in every {
        assert!(
            wait_gone(pid, Duration::from_secs(5)).await,
            "process {pid} of the service left"
        );
    }
    for run in running {
        // The calls end (cancelled with the kernel, or the connection closed): none hangs.
        let _ = tokio::time::timeout(Duration::from_secs(10), run)
            .await
            .expect("the running call ended");
    }
}

/// 500 sessions made and closed (handshake-era MCP sessions, DELETE at the end; one more held
/// open as the control of the kernel count): kernels (among all descendants), processes, file
/// descriptors and memory come back to where they were after the first 20.
#[tokio::test(flavor = "multi_thread")]
async fn five_hundred_sessions_leak_nothing() {
    require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    let service = Service::start(ws.path(), &[], &["--warm-sessions", "1"]);
    let pid = service.pid();
    let fds = || {
        std::fs::read_dir(format!("/proc/{pid}/fd"))
            .unwrap()
            .count()
    };
    let rss_kb = || -> u64 {
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .unwrap()
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
            .unwrap()
    };
    let url = service.url();
    let port = service.port;
    let round = |n: usize| {
        let url = url.clone();
        async move {
            let c = connect(&url, None, Era::Handshake).await;
            assert_eq!(
                cell(&c, &format!("print({n})"), None).await,
                (false, n.to_string())
            );
            c.close().await;
        }
    };
    // Settled: every closed session's kernel is gone and the warm one is ready (the one kernel,
    // and no process below the service but it ends a branch: none half started or half gone).
    // Kernels are counted among all of the service's descendants (a forked kernel is the
    // template's child); with `processes`, every descendant (bubblewrap, the template, a
    // kernel's outer process and init) is counted too.
    let settle = |processes: Option<usize>| async move {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let open = metric(port, None, "ipybox_sessions").await;
            let kernels = crate::proc_tree::kernels(pid);
            let all = crate::proc_tree::descendants(pid).len();
            if open == 0.0
                && kernels.len() == 1
                && crate::proc_tree::leaves(pid) == kernels
                && processes.is_none_or(|n| n == all)
            {
                return all;
            }
            assert!(
                Instant::now() < deadline,
                "{open} sessions, kernels {kernels:?}, {all} processes (want {processes:?}) still there"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    for n in 0..20 {
        round(n).await;
    }
    let processes = settle(None).await;
    // The control: a session's kernel is counted while the session is open (next to the warm
    // one that replaces it), and gone when it closes.
    let open = connect(&url, None, Era::Handshake).await;
    assert_eq!(cell(&open, "print(1)", None).await, (false, "1".into()));
    let deadline = Instant::now() + Duration::from_secs(30);
    while crate::proc_tree::kernels(pid).len() != 2 {
        assert!(
            Instant::now() < deadline,
            "an open session and a warm kernel: {:?}",
            crate::proc_tree::kernels(pid)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    open.close().await;
    settle(Some(processes)).await;
    let (fds0, rss0) = (fds(), rss_kb());
    let started = Instant::now();
    for batch in 0..240 {
        // Two sessions at a time.
        tokio::join!(round(21 + 2 * batch), round(22 + 2 * batch));
    }
    settle(Some(processes)).await;
    let (fds1, rss1) = (fds(), rss_kb());
    eprintln!(
        "500 sessions in {:?}: fds {fds0} -> {fds1}, RSS {rss0} kB -> {rss1} kB, {processes} processes",
        started.elapsed()
    );
    assert_eq!(
        metric(
            port,
            None,
            "ipybox_sessions_closed_total{reason=\"mcp_session\"}"
        )
        .await,
        501.0
    );
    assert!(fds1 <= fds0 + 4, "fds {fds0} -> {fds1}");
    assert!(rss1 <= rss0 + 16 * 1024, "RSS {rss0} kB -> {rss1} kB");
}

/// `--approve ask` over HTTP: 2026-07-28 clients answer `input_required` rounds, handshake-era
/// clients `elicitation/create` on their MCP session's stream; "allow for the rest of the
/// session" holds for that kernel session only.
async fn approvals_are_per_session(era: Era) {
    use crate::mcp_approvals::{CALL_ADD, ask_add};
    use crate::mcp_eras::{Answer, ScriptedClient};
    require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    register_fixture(ws.path());
    let service = Service::start(ws.path(), &[], &["--approve", "ask", "--token", TOKEN_A]);
    let first = ScriptedClient::new(era, true, &[Answer::AcceptForSession]);
    let a = connect_with(&service.url(), Some(TOKEN_A), first.clone(), era).await;
    let (is_error, text) = cell(&a, CALL_ADD, None).await;
    let (output, handle) = split_note(&text);
    assert_eq!((is_error, output.as_str()), (false, "3"), "{text}");
    assert_eq!(handle.is_some(), era == Era::Stateless, "{text}");
    assert_eq!(first.questions(), vec![ask_add()]);
    // Remembered for this session: not asked again.
    assert_eq!(
        cell(&a, CALL_ADD, handle.as_deref()).await,
        (false, "3".into())
    );
    assert_eq!(first.questions().len(), 1);
    // Another session is asked afresh.
    let second = ScriptedClient::new(era, true, &[Answer::Decline]);
    let b = connect_with(&service.url(), Some(TOKEN_A), second.clone(), era).await;
    let (is_error, text) = cell(&b, CALL_ADD, None).await;
    assert!(
        is_error
            && text.contains("ApprovalRejectedError: Approval request for fx.add rejected: tool call fx.add was rejected: declined by the user"),
        "{text}"
    );
    assert_eq!(second.questions(), vec![ask_add()]);
    a.close().await;
    b.close().await;
}
crate::mcp_eras::both_eras!(approvals_are_per_session);

/// `--session-header`: the `session` argument is a header parameter (SEP-2243), so a load
/// balancer can route on `Mcp-Param-Session`: a 2026-07-28 client that listed the tools sends
/// it (and the call works); a call whose header is missing is refused before anything runs.
#[tokio::test(flavor = "multi_thread")]
async fn session_header_for_load_balancers() {
    require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    let service = Service::start(ws.path(), &[], &["--session-header"]);
    let c = connect(&service.url(), None, Era::Stateless).await;
    let tools = c.service.list_all_tools().await.unwrap();
    let execute = tools
        .iter()
        .find(|t| t.name == "execute_ipython_cell")
        .unwrap();
    assert_eq!(
        execute.input_schema["properties"]["session"]["x-mcp-header"],
        json!("Session")
    );
    let (_, h) = new_session(&c, "x = 'routed'").await;
    assert_eq!(
        cell(&c, "print(x)", Some(&h)).await,
        (false, "routed".into())
    );
    let raw = |header: Option<&str>| {
        let mut req = reqwest::Client::new()
            .post(service.url())
            .header("Accept", "application/json, text/event-stream")
            .header("MCP-Protocol-Version", "2026-07-28")
            .header("Mcp-Method", "tools/call")
            .header("Mcp-Name", "execute_ipython_cell")
            .json(
                &json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {
                "name": "execute_ipython_cell",
                "arguments": {"code": "print(x)", "session": h},
                "_meta": {
                    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                    "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "1"},
                    "io.modelcontextprotocol/clientCapabilities": {}}}}),
            );
        if let Some(value) = header {
            req = req.header("Mcp-Param-Session", value);
        }
        req.send()
    };
    let missing = raw(None).await.unwrap();
    assert_eq!(missing.status(), 400);
    let body: Value = missing.json().await.unwrap();
    assert_eq!(body["error"]["code"], json!(-32020), "{body}");
    let routed = raw(Some(&h)).await.unwrap();
    assert_eq!(routed.status(), 200);
    let body: Value = routed.json().await.unwrap();
    assert_eq!(
        body["result"]["content"][0]["text"],
        json!("routed"),
        "{body}"
    );
    c.close().await;
}

/// The trust rule holds in every session's kernel (servers registered for the workspace only,
/// with their recorded params), and a parked `input_required` round can only be resumed with
/// the token whose call parked it.
#[tokio::test(flavor = "multi_thread")]
async fn trust_rule_per_session_and_request_state_per_token() {
    use crate::mcp_approvals::CALL_ADD;
    require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    apigen_fx(ws.path(), &fixture_params_who(), None);

    // Two sessions, each kernel held to the workspace's registrations.
    let service = Service::start(ws.path(), &[], &[]);
    let c = connect(&service.url(), None, Era::Stateless).await;
    let marker = ws.path().join("host-ran-it");
    let forged = format!(
        r#"from ipybox_runtime import ToolRunner, ToolError
evil = {{"command": "sh", "args": ["-c", "touch {m}"], "env": {{"WHO": "${{HOME}}"}}}}
try:
    ToolRunner("evil", evil).run("x", {{}})
except ToolError as e:
    print(str(e).splitlines()[0])
print(ToolRunner("fx", evil).run("get_env", {{"name": "WHO"}}))"#,
        m = marker.display()
    );
    for _ in 0..2 {
        let (out, _) = new_session(&c, &forged).await;
        assert_eq!(
            out,
            "MCP server `evil` is not registered for any directory this kernel imports from: kernel code can only call servers the host registered, with the params recorded then\nregistered"
        );
    }
    assert!(!marker.exists(), "the host ran the kernel's command");
    c.close().await;
    drop(service);

    // --approve ask: the round parked by token A's call answers only token A's retry.
    let service = Service::start(
        ws.path(),
        &[],
        &[
            "--approve",
            "ask",
            "--token",
            TOKEN_A,
            "--token",
            TOKEN_B,
            "--trust-tenants",
        ],
    );
    let http = reqwest::Client::new();
    let meta = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "1"},
        "io.modelcontextprotocol/clientCapabilities": {"elicitation": {"form": {}}}});
    let call = |token: &'static str, extra: Value| {
        let mut params =
            json!({"name": "execute_ipython_cell", "arguments": {"code": CALL_ADD}, "_meta": meta});
        for (k, v) in extra.as_object().unwrap() {
            params[k] = v.clone();
        }
        http.post(service.url())
            .bearer_auth(token)
            .header("Accept", "application/json, text/event-stream")
            .header("MCP-Protocol-Version", "2026-07-28")
            .header("Mcp-Method", "tools/call")
            .header("Mcp-Name", "execute_ipython_cell")
            .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}))
            .send()
    };
    let first: Value = call(TOKEN_A, json!({}))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let result = &first["result"];
    assert_eq!(result["resultType"], json!("input_required"), "{first}");
    let state = result["requestState"].as_str().unwrap().to_string();
    let key = result["inputRequests"]
        .as_object()
        .unwrap()
        .keys()
        .next()
        .unwrap()
        .clone();
    let answer = json!({
        "requestState": state,
        "inputResponses": {key: {"action": "accept", "content": {}}}});
    let stolen: Value = call(TOKEN_B, answer.clone())
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    // Refused as a state that is not valid (a JSON-RPC error; nothing about the run revealed).
    assert_eq!(stolen["error"]["code"], json!(-32602), "{stolen}");
    let text = stolen["error"]["message"].as_str().unwrap();
    assert!(
        text.starts_with("this requestState is not valid for this call"),
        "{text}"
    );
    let own: Value = call(TOKEN_A, answer).await.unwrap().json().await.unwrap();
    let text = own["result"]["content"][0]["text"].as_str().unwrap();
    assert!(text.starts_with("3\n\n[ipybox session "), "{own}");
}
