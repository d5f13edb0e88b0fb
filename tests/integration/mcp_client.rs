//! MCP client side against real servers: the Python fixture (PyPI `mcp` 2.x) and
//! `@modelcontextprotocol/server-everything`, over stdio, legacy SSE and streamable HTTP.
//! Needs `target/test-env/` (`bash scripts/test-env.sh`); skipped with one line without it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::*;
use base64::Engine;
use ipybox::tools::{
    McpSession, ServerParams, SessionCache, ToolsError, TransportKind, tool_output,
};
use serde_json::{Map, Value, json};

const T: Duration = Duration::from_secs(30);

async fn connect(params: &Value) -> McpSession {
    connect_env(params, &process_env()).await
}

async fn connect_env(params: &Value, env: &HashMap<String, String>) -> McpSession {
    let p = ServerParams::parse(params).expect("params parse");
    let started = Instant::now();
    let s = McpSession::connect(&p, env, T)
        .await
        .unwrap_or_else(|e| panic!("connect failed: {e}"));
    eprintln!(
        "connected {:?} in {} ms",
        p.kind(),
        started.elapsed().as_millis()
    );
    s
}

async fn connect_err(params: &Value, env: &HashMap<String, String>, t: Duration) -> ToolsError {
    let p = ServerParams::parse(params).expect("params parse");
    McpSession::connect(&p, env, t)
        .await
        .expect_err("connect should fail")
}

/// Exercises every fixture tool with exact assertions.
async fn exercise_fixture(s: &McpSession) {
    let tools = s.list_tools().await.unwrap();
    let mut names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    names.sort();
    assert_eq!(
        names,
        [
            "add",
            "echo",
            "fail",
            "get-thing",
            "get_cwd",
            "get_env",
            "get_header",
            "get_pid",
            "greet",
            "sleep"
        ]
    );
    let add = tools.iter().find(|t| t.name == "add").unwrap();
    let schema = serde_json::to_value(add.output_schema.as_ref().expect("outputSchema")).unwrap();
    assert_eq!(schema["required"], json!(["sum", "operands"]));
    assert!(
        tools
            .iter()
            .find(|t| t.name == "greet")
            .unwrap()
            .output_schema
            .is_none()
    );

    // structured
    let r = s
        .call_tool("add", args(json!({"a": 2, "b": 3})))
        .await
        .unwrap();
    let out = tool_output(&r);
    assert_eq!(out.structured, Some(json!({"sum": 5, "operands": [2, 3]})));
    assert!(!out.is_error);
    // text only
    let out = tool_output(
        &s.call_tool("greet", args(json!({"name": "Ada"})))
            .await
            .unwrap(),
    );
    assert_eq!(out.text, "Hello, Ada!");
    assert_eq!(out.structured, None);
    assert!(!out.is_error);
    // hyphenated name
    let out = tool_output(
        &s.call_tool("get-thing", args(json!({"id": "42"})))
            .await
            .unwrap(),
    );
    assert_eq!(out.text, "thing 42");
    // tool error
    let out = tool_output(
        &s.call_tool("fail", args(json!({"message": "kaput 17"})))
            .await
            .unwrap(),
    );
    assert!(out.is_error);
    assert!(out.text.contains("kaput 17"), "{}", out.text);
    // exact echo (unicode, floats, nulls, nesting, key order)
    let sent = json!({
        "text": "héllo \"quoted\" ${NOT_A_VAR} \n tab\t",
        "number": 1.25,
        "flag": false,
        "items": [1, "two", null, {"three": [3.5]}],
        "obj": {"z": 1, "a": {"b": null}},
        "nothing": null
    });
    let out = tool_output(&s.call_tool("echo", args(sent.clone())).await.unwrap());
    let got: Value = serde_json::from_str(&out.text).unwrap();
    assert_eq!(got, sent);
    // unknown tool: the server answers with an error (result or JSON-RPC error), never a hang
    match s.call_tool("no-such-tool", Map::new()).await {
        Ok(r) => assert!(tool_output(&r).is_error),
        Err(e) => assert!(e.to_string().contains("tools/call"), "{e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixture_over_stdio() {
    require!(TestEnv);
    let s = connect(&fixture_stdio_params("stdio")).await;
    assert_eq!(s.kind(), TransportKind::Stdio);
    exercise_fixture(&s).await;
    let pid = s.pid().unwrap();
    // The pid we hold is the server process itself.
    let out = tool_output(&s.call_tool("get_pid", Map::new()).await.unwrap());
    assert_eq!(out.text, pid.to_string());
    let started = Instant::now();
    s.close().await;
    eprintln!(
        "closed stdio session in {} ms",
        started.elapsed().as_millis()
    );
    assert!(!pid_exists(pid), "stdio child {pid} survived close()");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixture_over_sse() {
    require!(TestEnv);
    let server = start_fixture("sse", None);
    let s = connect(&json!({"url": server.url("/sse")})).await;
    assert_eq!(s.kind(), TransportKind::Sse);
    exercise_fixture(&s).await;
    s.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixture_over_streamable_http() {
    require!(TestEnv);
    let server = start_fixture("http", None);
    let s = connect(&json!({"url": server.url("/mcp")})).await;
    assert_eq!(s.kind(), TransportKind::StreamableHttp);
    exercise_fixture(&s).await;
    s.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_calls_share_one_session() {
    require!(TestEnv);
    let s = Arc::new(connect(&fixture_stdio_params("stdio")).await);
    let started = Instant::now();
    let calls = (0..5).map(|_| {
        let s = s.clone();
        async move { s.call_tool("sleep", args(json!({"seconds": 1.0}))).await }
    });
    let results = futures::future::join_all(calls).await;
    let elapsed = started.elapsed();
    for r in results {
        assert_eq!(tool_output(&r.unwrap()).text, "slept 1.0");
    }
    eprintln!("5 concurrent 1 s calls took {} ms", elapsed.as_millis());
    assert!(elapsed < Duration::from_millis(2500), "{elapsed:?}");
    s.shutdown().await;
}

async fn exercise_everything(s: &McpSession) {
    let tools = s.list_tools().await.unwrap();
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    for n in [
        "echo",
        "get-structured-content",
        "get-sum",
        "get-tiny-image",
    ] {
        assert!(names.contains(&n), "{n} missing from {names:?}");
    }
    let gsc = tools
        .iter()
        .find(|t| t.name == "get-structured-content")
        .unwrap();
    assert!(gsc.output_schema.is_some());

    let out = tool_output(
        &s.call_tool("echo", args(json!({"message": "hi there"})))
            .await
            .unwrap(),
    );
    assert_eq!(out.text, "Echo: hi there");
    assert_eq!(out.structured, None);

    let out = tool_output(
        &s.call_tool(
            "get-structured-content",
            args(json!({"location": "Chicago"})),
        )
        .await
        .unwrap(),
    );
    let expected = json!({"temperature": 36, "conditions": "Light rain / drizzle", "humidity": 82});
    assert_eq!(out.structured, Some(expected.clone()));
    assert_eq!(serde_json::from_str::<Value>(&out.text).unwrap(), expected);

    let r = s.call_tool("get-tiny-image", Map::new()).await.unwrap();
    let png_len = r
        .content
        .iter()
        .find_map(|c| match c {
            rmcp::model::ContentBlock::Image(i) => Some(
                base64::engine::general_purpose::STANDARD
                    .decode(&i.data)
                    .unwrap()
                    .len(),
            ),
            _ => None,
        })
        .unwrap();
    let out = tool_output(&r);
    assert_eq!(
        out.text,
        format!(
            "Here's the image you requested:\n[image: image/png, {png_len} bytes]\nThe image above is the MCP logo."
        )
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn everything_over_stdio() {
    require!(TestEnv);
    let s = connect(&everything_stdio_params()).await;
    exercise_everything(&s).await;
    let pid = s.pid().unwrap();
    s.close().await;
    assert!(!pid_exists(pid));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn everything_over_sse() {
    require!(TestEnv);
    let server = start_everything("sse");
    let s = connect(&json!({"url": server.url("/sse")})).await;
    assert_eq!(s.kind(), TransportKind::Sse);
    exercise_everything(&s).await;
    s.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn everything_over_streamable_http() {
    require!(TestEnv);
    let server = start_everything("streamableHttp");
    let s = connect(&json!({"url": server.url("/mcp")})).await;
    assert_eq!(s.kind(), TransportKind::StreamableHttp);
    exercise_everything(&s).await;
    s.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdio_env_substitution_minimal_env_and_cwd() {
    require!(TestEnv);
    let dir = tempfile::tempdir().unwrap();
    let cwd = dir.path().canonicalize().unwrap();
    let mut env = process_env();
    env.insert("MY_SECRET".into(), "tok-123456".into());
    env.insert("IPYBOX_TEST_NOT_PASSED".into(), "leak".into());
    let mut params = fixture_stdio_params("stdio");
    params["env"] = json!({"FIXTURE_TOKEN": "Bearer ${MY_SECRET}", "LITERAL": "$${KEPT}"});
    params["cwd"] = json!(cwd.to_string_lossy());
    let s = connect_env(&params, &env).await;
    let get = |name: &str| {
        let s = &s;
        let name = name.to_string();
        async move {
            tool_output(
                &s.call_tool("get_env", args(json!({"name": name})))
                    .await
                    .unwrap(),
            )
            .text
        }
    };
    assert_eq!(get("FIXTURE_TOKEN").await, "Bearer tok-123456");
    assert_eq!(get("LITERAL").await, "${KEPT}");
    assert_eq!(get("IPYBOX_TEST_NOT_PASSED").await, "<unset>");
    assert_eq!(get("PATH").await, env["PATH"]);
    let out = tool_output(&s.call_tool("get_cwd", Map::new()).await.unwrap());
    assert_eq!(out.text, cwd.to_string_lossy());
    // Debug output shows params as written / no resolved values.
    let debug = format!("{s:?} {:?}", ServerParams::parse(&params).unwrap());
    assert!(!debug.contains("tok-123456"), "{debug}");
    s.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_header_substitution() {
    require!(TestEnv);
    let mut env = process_env();
    env.insert("API_KEY".into(), "key-abcdef".into());
    let headers = json!({"X-Api-Key": "${API_KEY}", "Authorization": "Bearer ${API_KEY}"});
    for (mode, path) in [("http", "/mcp"), ("sse", "/sse")] {
        let server = start_fixture(mode, None);
        let s = connect_env(&json!({"url": server.url(path), "headers": headers}), &env).await;
        let get = |name: &'static str| {
            let s = &s;
            async move {
                tool_output(
                    &s.call_tool("get_header", args(json!({"name": name})))
                        .await
                        .unwrap(),
                )
                .text
            }
        };
        assert_eq!(get("X-Api-Key").await, "key-abcdef", "{mode}");
        assert_eq!(get("Authorization").await, "Bearer key-abcdef", "{mode}");
        s.close().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_variable_is_named() {
    require!(TestEnv);
    let mut params = fixture_stdio_params("stdio");
    params["env"] = json!({"TOKEN": "${IPYBOX_SURELY_UNSET_VAR}"});
    let err = connect_err(&params, &process_env(), T).await;
    assert!(matches!(err, ToolsError::MissingVariable { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.contains("`IPYBOX_SURELY_UNSET_VAR` is not set"),
        "{msg}"
    );
    assert!(msg.contains("env.TOKEN"), "{msg}");

    let err = connect_err(
        &json!({"url": "http://127.0.0.1:1/mcp", "headers": {"Authorization": "Bearer ${NOPE_TOKEN}"}}),
        &HashMap::new(),
        T,
    )
    .await;
    let msg = err.to_string();
    assert!(
        msg.contains("`NOPE_TOKEN`") && msg.contains("headers.Authorization"),
        "{msg}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_never_in_errors() {
    require!(TestEnv);
    let secret = "hunter2-very-secret";
    let mut env = process_env();
    env.insert("SECRET".into(), secret.into());

    // stdio server that prints the secret to stderr and exits.
    let mut params = fixture_stdio_params("crash");
    params["env"] = json!({"FIXTURE_SECRET": "${SECRET}"});
    let err = connect_err(&params, &env, T).await;
    let text = format!("{err}\n{err:?}");
    assert!(!text.contains(secret), "{text}");
    assert!(text.contains("token=***"), "{text}");

    // unreachable URL with the secret in the query and a header.
    let port = free_port();
    let params = json!({
        "url": format!("http://127.0.0.1:{port}/mcp?token=${{SECRET}}"),
        "headers": {"Authorization": "Bearer ${SECRET}"}
    });
    let err = connect_err(&params, &env, Duration::from_secs(5)).await;
    let text = format!("{err}\n{err:?}");
    assert!(!text.contains(secret), "{text}");
    assert!(
        text.contains("?token=${SECRET}"),
        "written URL shown: {text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explicit_type_overrides_url_inference() {
    require!(TestEnv);
    // SSE served at a path not ending in /sse.
    let sse = start_fixture("sse", Some("/events"));
    let p = json!({"url": sse.url("/events"), "type": "sse"});
    assert_eq!(ServerParams::parse(&p).unwrap().kind(), TransportKind::Sse);
    let s = connect(&p).await;
    assert_eq!(
        tool_output(
            &s.call_tool("greet", args(json!({"name": "x"})))
                .await
                .unwrap()
        )
        .text,
        "Hello, x!"
    );
    s.close().await;
    // Without the type it is taken for streamable HTTP and fails clearly.
    let err = connect_err(
        &json!({"url": sse.url("/events")}),
        &process_env(),
        Duration::from_secs(10),
    )
    .await;
    eprintln!("SSE server taken for streamable HTTP:\n{err}");
    assert!(matches!(err, ToolsError::Connect { .. }), "{err:?}");
    assert!(err.to_string().contains("streamable HTTP"), "{err}");

    // Streamable HTTP served at /sse.
    let http = start_fixture("http", Some("/sse"));
    let p = json!({"url": http.url("/sse"), "type": "streamable_http"});
    assert_eq!(
        ServerParams::parse(&p).unwrap().kind(),
        TransportKind::StreamableHttp
    );
    let s = connect(&p).await;
    assert_eq!(
        tool_output(
            &s.call_tool("greet", args(json!({"name": "y"})))
                .await
                .unwrap()
        )
        .text,
        "Hello, y!"
    );
    s.close().await;
}

#[test]
fn bad_params_errors() {
    let cases = [
        (json!("npx"), "must be a JSON object"),
        (json!({}), "neither `command` nor `url` is set"),
        (json!({"command": ""}), "non-empty `command`"),
        (
            json!({"command": 3}),
            "`command` must be a string, found a number",
        ),
        (
            json!({"command": "x", "args": "a b"}),
            "`args` must be an array of strings",
        ),
        (
            json!({"command": "x", "args": ["a", 1]}),
            "`args[1]` must be a string",
        ),
        (
            json!({"command": "x", "env": {"A": 1}}),
            "`env.A` must be a string",
        ),
        (
            json!({"command": "x", "cwd": false}),
            "`cwd` must be a string",
        ),
        (
            json!({"command": "x", "comand": "y"}),
            "unknown key `comand`",
        ),
        (
            json!({"command": "x", "url": "http://h/mcp"}),
            "both `command` and `url` are set",
        ),
        (
            json!({"command": "x", "headers": {}}),
            "`headers` is not valid for a stdio server",
        ),
        (
            json!({"url": "http://h/mcp", "args": []}),
            "`args` is not valid for an HTTP server",
        ),
        (
            json!({"url": "ftp://h/mcp"}),
            "must start with http:// or https://",
        ),
        (
            json!({"url": "http://h/mcp", "headers": ["a"]}),
            "`headers` must be an object of strings",
        ),
        (
            json!({"url": "http://h/mcp", "headers": {"bad header": "v"}}),
            "not a valid HTTP header name",
        ),
        (
            json!({"url": "http://h/mcp", "type": "websocket"}),
            "unknown transport type `websocket`",
        ),
        (
            json!({"type": "sse", "command": "x"}),
            "`command` is not valid for an HTTP server",
        ),
        (
            json!({"type": "stdio", "url": "http://h"}),
            "`url` is not valid for a stdio server",
        ),
    ];
    for (params, expected) in cases {
        let err = ServerParams::parse(&params).expect_err(&params.to_string());
        assert!(matches!(err, ToolsError::InvalidParams { .. }));
        let msg = err.to_string();
        assert!(msg.contains(expected), "{params}: {msg}");
        assert!(msg.contains("help:"), "{msg}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_time_errors() {
    require!(TestEnv);
    // Nonexistent command.
    let err = connect_err(
        &json!({"command": "ipybox-no-such-server-binary"}),
        &process_env(),
        T,
    )
    .await;
    let msg = err.to_string();
    assert!(
        msg.contains("cannot start `ipybox-no-such-server-binary`") && msg.contains("PATH"),
        "{msg}"
    );
    // Nonexistent cwd.
    let mut p = fixture_stdio_params("stdio");
    p["cwd"] = json!("/nonexistent/ipybox-dir");
    let msg = connect_err(&p, &process_env(), T).await.to_string();
    assert!(
        msg.contains("`/nonexistent/ipybox-dir` (`cwd`) does not exist"),
        "{msg}"
    );
    // Invalid URL after substitution.
    let mut env = HashMap::new();
    env.insert("HOST".to_string(), "not a host".to_string());
    let msg = connect_err(&json!({"url": "${HOST}"}), &env, T)
        .await
        .to_string();
    assert!(msg.contains("not a valid URL"), "{msg}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crashing_stdio_server_reports_stderr_tail() {
    require!(TestEnv);
    let started = Instant::now();
    let err = connect_err(&fixture_stdio_params("crash"), &process_env(), T).await;
    let elapsed = started.elapsed();
    let msg = err.to_string();
    eprintln!("crash reported in {} ms:\n{msg}", elapsed.as_millis());
    assert!(matches!(err, ToolsError::Connect { .. }), "{err:?}");
    assert!(msg.contains("FIXTURE_CRASH_MARKER missing config"), "{msg}");
    assert!(msg.contains("exit status: 3"), "{msg}");
    assert!(msg.contains("help:"), "{msg}");
    assert!(elapsed < Duration::from_secs(10));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_url_fails_fast_and_clearly() {
    let port = free_port();
    for path in ["/mcp", "/sse"] {
        let url = format!("http://127.0.0.1:{port}{path}");
        let started = Instant::now();
        let err = connect_err(
            &json!({"url": url}),
            &process_env(),
            Duration::from_secs(10),
        )
        .await;
        let elapsed = started.elapsed();
        let msg = err.to_string();
        eprintln!(
            "unreachable {path} reported in {} ms:\n{msg}",
            elapsed.as_millis()
        );
        assert!(matches!(err, ToolsError::Connect { .. }), "{err:?}");
        assert!(
            msg.contains(&format!("failed to connect to MCP server `{url}`")),
            "{msg}"
        );
        assert!(elapsed < Duration::from_secs(5), "{elapsed:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_timeout_is_honoured() {
    require!(TestEnv);
    let timeout = Duration::from_millis(1500);
    // stdio server that never answers.
    let started = Instant::now();
    let err = connect_err(&fixture_stdio_params("hang"), &process_env(), timeout).await;
    let elapsed = started.elapsed();
    let msg = err.to_string();
    eprintln!("stdio hang reported in {} ms:\n{msg}", elapsed.as_millis());
    assert!(matches!(err, ToolsError::Timeout { .. }), "{err:?}");
    assert!(msg.contains("timed out after 1.5s"), "{msg}");
    assert!(msg.contains("fixture: hanging"), "{msg}");
    assert!(
        elapsed >= timeout && elapsed < timeout + Duration::from_secs(2),
        "{elapsed:?}"
    );

    // HTTP server that accepts connections and never answers.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let holder = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((sock, _)) = listener.accept().await {
            held.push(sock);
        }
    });
    for path in ["/mcp", "/sse"] {
        let started = Instant::now();
        let err = connect_err(
            &json!({"url": format!("http://127.0.0.1:{port}{path}")}),
            &process_env(),
            timeout,
        )
        .await;
        let elapsed = started.elapsed();
        assert!(matches!(err, ToolsError::Timeout { .. }), "{path}: {err:?}");
        assert!(
            elapsed >= timeout && elapsed < timeout + Duration::from_secs(2),
            "{elapsed:?}"
        );
    }
    holder.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_cache_connects_once_and_close_all_kills_children() {
    require!(TestEnv);
    let cache = Arc::new(SessionCache::new(process_env(), T));
    let params = fixture_stdio_params("stdio");
    let started = Instant::now();
    let handles: Vec<_> = (0..20)
        .map(|_| {
            let cache = cache.clone();
            let params = params.clone();
            tokio::spawn(async move { cache.get_or_connect("fixture", &params).await })
        })
        .collect();
    let mut sessions = Vec::new();
    for h in handles {
        sessions.push(h.await.unwrap().unwrap());
    }
    eprintln!(
        "20 concurrent get_or_connect took {} ms",
        started.elapsed().as_millis()
    );
    assert_eq!(cache.connect_count(), 1);
    assert_eq!(cache.len(), 1);
    assert!(sessions.iter().all(|s| Arc::ptr_eq(s, &sessions[0])));
    // A different name or different params is a different session.
    let other = cache.get_or_connect("fixture2", &params).await.unwrap();
    assert!(!Arc::ptr_eq(&other, &sessions[0]));
    assert_eq!(cache.len(), 2);

    let pids = [sessions[0].pid().unwrap(), other.pid().unwrap()];
    assert!(pids.iter().all(|p| pid_exists(*p)));
    let started = Instant::now();
    cache.close_all().await;
    eprintln!(
        "close_all (2 stdio sessions) took {} ms",
        started.elapsed().as_millis()
    );
    assert_eq!(cache.len(), 0);
    for pid in pids {
        assert!(!pid_exists(pid), "child {pid} survived close_all");
    }
    // Calls on a closed session fail cleanly.
    assert!(
        sessions[0]
            .call_tool("greet", args(json!({"name": "x"})))
            .await
            .is_err()
    );
    // The next use reconnects.
    let again = cache.get_or_connect("fixture", &params).await.unwrap();
    assert_eq!(cache.connect_count(), 3);
    again.shutdown().await;
    cache.close_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_cache_shares_failures_and_replaces_dead_sessions() {
    require!(TestEnv);
    let cache = Arc::new(SessionCache::new(process_env(), T));
    let crash = fixture_stdio_params("crash");
    let results =
        futures::future::join_all((0..5).map(|_| cache.get_or_connect("bad", &crash))).await;
    for r in &results {
        let msg = r.as_ref().unwrap_err().to_string();
        assert!(msg.contains("FIXTURE_CRASH_MARKER"), "{msg}");
    }
    assert_eq!(cache.connect_count(), 1);
    assert_eq!(cache.len(), 0, "failed connects are not cached");
    assert!(cache.get_or_connect("bad", &crash).await.is_err());
    assert_eq!(cache.connect_count(), 2);

    // A session whose server died is replaced on next use.
    let params = fixture_stdio_params("stdio");
    let s1 = cache.get_or_connect("fixture", &params).await.unwrap();
    let pid1 = s1.pid().unwrap();
    unsafe {
        libc::kill(pid1 as i32, libc::SIGKILL);
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while !s1.is_closed() {
        assert!(Instant::now() < deadline, "death not noticed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let err = s1
        .call_tool("greet", args(json!({"name": "x"})))
        .await
        .unwrap_err();
    eprintln!("call on dead session: {err}");
    let s2 = cache.get_or_connect("fixture", &params).await.unwrap();
    assert!(!Arc::ptr_eq(&s1, &s2));
    assert_ne!(s2.pid().unwrap(), pid1);
    let out = tool_output(
        &s2.call_tool("greet", args(json!({"name": "z"})))
            .await
            .unwrap(),
    );
    assert_eq!(out.text, "Hello, z!");
    cache.close_all().await;
    assert!(!pid_exists(pid1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_a_session_kills_its_child() {
    require!(TestEnv);
    let s = connect(&fixture_stdio_params("stdio")).await;
    let pid = s.pid().unwrap();
    drop(s);
    let deadline = Instant::now() + Duration::from_secs(5);
    while pid_exists(pid) {
        assert!(Instant::now() < deadline, "child {pid} survived drop");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
