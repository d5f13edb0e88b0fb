//! Density over HTTP: the stdio MCP servers of the workspace's registered servers are shared by
//! the sessions that call them (one process per server for the service), a session's reset
//! leaves the shared server to the others, and `--per-session-mcp-servers` gives each session
//! processes of its own again.

use crate::http_support::*;
use crate::mcp_eras::{CallTool, Era};
use crate::support::*;

/// The service's processes that run the fixture server.
fn fixture_processes(service: &Service) -> Vec<u32> {
    let script = fixture_script();
    crate::proc_tree::descendants(service.pid())
        .into_iter()
        .filter(|p| {
            std::fs::read(format!("/proc/{p}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(&script))
        })
        .collect()
}

const GET_PID: &str = "from mcptools.fx import get_pid\nprint(get_pid.run(get_pid.Params()))";

/// The fixture server's pid as a call from `session` sees it.
async fn server_pid(client: &impl CallTool, session: &str) -> String {
    let (is_error, text) = cell(client, GET_PID, Some(session)).await;
    assert!(!is_error, "{text}");
    split_note(&text).0
}

/// 32 sessions call one registered stdio server: one server process answers them all; a
/// session's reset (which closes its own MCP sessions) leaves it running for the others.
#[tokio::test(flavor = "multi_thread")]
async fn sessions_share_one_stdio_server_process() {
    require!(TestEnv);
    const SESSIONS: usize = 32;
    let ws = tempfile::tempdir().unwrap();
    register_fixture(ws.path());
    let service = Service::start(
        ws.path(),
        &[("IPYBOX_TOKEN", TOKEN_A)],
        // 34 sessions with the warm ones: 256 MiB each fit the default --service-memory.
        &[
            "--max-sessions",
            "40",
            "--warm-sessions",
            "2",
            "--session-memory",
            "256M",
        ],
    );
    let client = connect(&service.url(), Some(TOKEN_A), Era::Stateless).await;
    let mut handles = Vec::new();
    let mut pids = std::collections::BTreeSet::new();
    for _ in 0..SESSIONS {
        let (out, handle) = new_session(&client, GET_PID).await;
        pids.insert(out);
        handles.push(handle);
    }
    assert_eq!(pids.len(), 1, "one server answered every session: {pids:?}");
    let pid = pids.pop_first().unwrap();
    assert_eq!(
        fixture_processes(&service),
        vec![pid.parse::<u32>().unwrap()]
    );

    // Session A resets: its kernel is new, the shared server stays, B's next call works.
    let (a, b) = (&handles[0], &handles[1]);
    let reset = client
        .call_tool_json(
            "reset",
            serde_json::json!({"session": a})
                .as_object()
                .unwrap()
                .clone(),
        )
        .await
        .unwrap();
    let (is_error, text) = text_of(&reset);
    assert!(!is_error, "{text}");
    // (A local kernel's handle stays; a result names a new one when it changes.)
    let a = split_note(&text).1.unwrap_or_else(|| a.clone());
    assert_eq!(server_pid(&client, b).await, pid);
    assert_eq!(server_pid(&client, &a).await, pid);
    assert_eq!(fixture_processes(&service).len(), 1);
    client.close().await;
}

/// `--per-session-mcp-servers`: each session starts a server process of its own.
#[tokio::test(flavor = "multi_thread")]
async fn per_session_mcp_servers_flag_gives_each_session_its_own() {
    require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    register_fixture(ws.path());
    let service = Service::start(
        ws.path(),
        &[("IPYBOX_TOKEN", TOKEN_A)],
        &["--per-session-mcp-servers", "--warm-sessions", "0"],
    );
    let client = connect(&service.url(), Some(TOKEN_A), Era::Stateless).await;
    let (first, _) = new_session(&client, GET_PID).await;
    let (second, _) = new_session(&client, GET_PID).await;
    assert_ne!(first, second);
    assert_eq!(fixture_processes(&service).len(), 2);
    client.close().await;
}
