//! `ipybox serve --http` replicas with kernels on a real Jupyter Enterprise Gateway, behind a
//! round-robin proxy (`http_support::Proxy`, what a plain load balancer does): one 2026-07-28
//! session whose calls alternate between the replicas keeps its state for 50 cells with tool
//! calls, across a reset, and after a replica is killed; a replica that finds a session idle
//! only detaches from a kernel the other still uses; and a replica stopped with running cells
//! leaves no kernel on the gateway.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::http_support::*;
use crate::jupyter_servers::{JupyterServer, Kind, TOKEN};
use crate::mcp_eras::{CallTool, Era};
use crate::support::*;

const SECRET: &str = "replicas-share-this-secret-0123456789";

/// Registers the fixture MCP server for `ws` as an operator does (`ipybox apigen`), with
/// `home` as IPYBOX_HOME (where registrations are kept; the replicas share it).
fn register_fixture(ws: &Path, home: &Path) {
    apigen_fx(ws, &fixture_stdio_params("stdio"), Some(home));
}

/// A replica named `name` against `eg`, sharing `ws`, `home` and the session secret.
fn replica(name: &str, eg: &JupyterServer, ws: &Path, home: &Path, extra: &[&str]) -> Service {
    let secret = home.join("session-secret");
    std::fs::write(&secret, SECRET).unwrap();
    let url = eg.url();
    let secret = secret.display().to_string();
    let mut flags = vec![
        "--kernel-gateway",
        &url,
        "--session-secret-file",
        &secret,
        "--replica-id",
        name,
        "--token",
        TOKEN_A,
    ];
    flags.extend_from_slice(extra);
    let home = home.display().to_string();
    Service::start(
        ws,
        &[("IPYBOX_GATEWAY_TOKEN", TOKEN), ("IPYBOX_HOME", &home)],
        &flags,
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn one_session_alternates_between_replicas_on_enterprise_gateway() {
    require!(TestEnv);
    let eg = JupyterServer::start(Kind::EnterpriseGateway);
    let ws = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    register_fixture(ws.path(), home.path());
    let mut a = replica("a", &eg, ws.path(), home.path(), &["--warm-sessions", "0"]);
    let mut b = replica("b", &eg, ws.path(), home.path(), &["--warm-sessions", "0"]);
    let proxy = Proxy::start(vec![a.port, b.port]).await;
    let c = connect(&proxy.url(), Some(TOKEN_A), Era::Stateless).await;
    let (_, mut h) = new_session(&c, "from mcptools.fx import add\nx = 0").await;
    assert!(h.starts_with("ipybox-s1.gw."), "{h}");
    let mut expected = 0;
    for n in 0..50 {
        if n == 25 {
            // A reset (on whichever replica) replaces the kernel: the result names the new
            // handle, and the other replica follows it.
            let reset = c
                .call_tool_json(
                    "reset",
                    serde_json::json!({"session": h})
                        .as_object()
                        .unwrap()
                        .clone(),
                )
                .await
                .unwrap();
            let (is_error, text) = text_of(&reset);
            let (out, new) = split_note(&text);
            assert!(!is_error, "{text}");
            assert_eq!(
                out,
                "Kernel reset: a fresh kernel is running and MCP sessions were closed."
            );
            let new = new.unwrap_or_else(|| panic!("no new handle: {text}"));
            assert!(text.ends_with(&format!(
                "[ipybox session {new}: this session's kernel was replaced; pass session=\"{new}\" from now on]"
            )));
            assert_ne!(new, h);
            let old = std::mem::replace(&mut h, new);
            let (is_error, text) = cell(&c, "x", Some(&h)).await;
            assert!(is_error && text.contains("NameError"), "{text}");
            assert_eq!(
                cell(&c, "from mcptools.fx import add\nx = 100", Some(&h)).await,
                (false, String::new())
            );
            expected = 100;
            // The handle from before the reset, on either replica: the call goes to the
            // session's current kernel (never back to the old one, which would detach the
            // current one), and the result names the current handle.
            for _ in 0..2 {
                assert_eq!(
                    cell(&c, "print(x)", Some(&old)).await,
                    (
                        false,
                        format!(
                            "100\n\n[ipybox session {h}: this session's kernel was replaced; pass session=\"{h}\" from now on]"
                        )
                    )
                );
            }
        }
        expected += 1;
        assert_eq!(
            cell(
                &c,
                "x += 1\nprint(x, add.run(add.Params(a=x, b=1)).sum)",
                Some(&h)
            )
            .await,
            (false, format!("{expected} {}", expected + 1)),
            "cell {n}"
        );
    }
    let served: Vec<usize> = proxy
        .served
        .iter()
        .map(|s| s.load(Ordering::SeqCst))
        .collect();
    assert!(
        served.iter().all(|n| *n >= 25),
        "both replicas served the session: {served:?}"
    );
    // A replica dies (SIGKILL): the session continues on the other.
    a.kill();
    for _ in 0..10 {
        expected += 1;
        assert_eq!(
            cell(
                &c,
                "x += 1\nprint(x, add.run(add.Params(a=x, b=1)).sum)",
                Some(&h)
            )
            .await,
            (false, format!("{expected} {}", expected + 1))
        );
    }
    c.close().await;
    let (status, _) = b.terminate(Duration::from_secs(30));
    assert!(status.success(), "{}", b.log());
    eg.assert_empty("after the last replica stopped").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_idle_replica_detaches_from_a_kernel_the_other_uses() {
    require!(TestEnv);
    let eg = JupyterServer::start(Kind::EnterpriseGateway);
    let ws = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    let flags = ["--warm-sessions", "0", "--idle-timeout", "2"];
    let a = replica("a", &eg, ws.path(), home.path(), &flags);
    let b = replica("b", &eg, ws.path(), home.path(), &flags);
    let ca = connect(&a.url(), Some(TOKEN_A), Era::Stateless).await;
    let cb = connect(&b.url(), Some(TOKEN_A), Era::Stateless).await;
    let (_, h) = new_session(&ca, "x = 0").await;
    // b takes over; a stays idle beyond its idle timeout meanwhile.
    for n in 1..=12 {
        assert_eq!(
            cell(&cb, "x += 1\nprint(x)", Some(&h)).await,
            (false, n.to_string())
        );
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    assert!(
        a.log()
            .contains("another replica uses this session's kernel: detaching, not deleting"),
        "{}",
        a.log()
    );
    assert_eq!(eg.kernels().await.len(), 1);
    // And a, asked again, attaches again: the state is there.
    assert_eq!(cell(&ca, "print(x)", Some(&h)).await, (false, "12".into()));
    // Nobody uses it any more: both replicas let it expire, the kernel is deleted.
    eg.wait_kernels(0).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    eg.assert_empty("after the session expired on both replicas")
        .await;
    // b had detached (a was still connected then): b finds the kernel gone; a, which
    // deleted it, knows it expired.
    let (is_error, text) = cell(&cb, "print(x)", Some(&h)).await;
    assert!(
        is_error
            && text.contains(" is gone: ")
            && text.ends_with(": it was reset (a reset names the new handle), closed after being idle for more than 2 s, or its kernel died\n  help: call without `session` to start a new session"),
        "{text}"
    );
    let (is_error, text) = cell(&ca, "print(x)", Some(&h)).await;
    assert!(
        is_error && text.ends_with(" expired: it was idle for more than 2 s (--idle-timeout), so its kernel was stopped and its state is gone\n  help: call without `session` to start a new session"),
        "{text}"
    );
    ca.close().await;
    cb.close().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_replica_stopped_with_running_cells_leaves_no_kernel_on_the_gateway() {
    require!(TestEnv);
    let eg = JupyterServer::start(Kind::EnterpriseGateway);
    let ws = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    let mut service = replica(
        "solo",
        &eg,
        ws.path(),
        home.path(),
        &["--warm-sessions", "1", "--shutdown-grace", "1"],
    );
    let modern = std::sync::Arc::new(connect(&service.url(), Some(TOKEN_A), Era::Stateless).await);
    let legacy = std::sync::Arc::new(connect(&service.url(), Some(TOKEN_A), Era::Handshake).await);
    let (_, h) = new_session(&*modern, "x = 1").await;
    assert_eq!(cell(&*legacy, "x = 1", None).await, (false, String::new()));
    let mut running = Vec::new();
    for (c, h) in [(modern.clone(), Some(h)), (legacy.clone(), None)] {
        running.push(tokio::spawn(async move {
            let code = "import time\ntime.sleep(60)";
            let arguments = match &h {
                Some(h) => serde_json::json!({"code": code, "session": h}),
                None => serde_json::json!({"code": code}),
            };
            c.call_tool_json(
                "execute_ipython_cell",
                arguments.as_object().unwrap().clone(),
            )
            .await
        }));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        eg.kernels().await.len() >= 3,
        "two sessions and a warm kernel"
    );
    let (status, took) = service.terminate(Duration::from_secs(30));
    assert!(status.success(), "{}", service.log());
    assert!(took < Duration::from_secs(15), "{took:?}");
    eg.assert_empty("after SIGTERM with running cells").await;
    for run in running {
        let _ = tokio::time::timeout(Duration::from_secs(10), run)
            .await
            .expect("the running call ended");
    }
}
