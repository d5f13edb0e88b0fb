//! Sessions that survive, exactly (issue 39): a fractional `--idle-timeout` expires a saved
//! session when it says (not truncated to whole seconds).
//!
//! Every service here has a replica name of its own and keeps its saved sessions in a
//! temporary `--snapshot-dir` (removed with the test).

use std::path::Path;
use std::time::{Duration, Instant};

use crate::http_support::*;
use crate::mcp_eras::Era;
use crate::support::*;

fn replica() -> String {
    format!("srv-{:08x}", rand::random::<u32>())
}

/// A service with no warm kernel, a replica name of its own and its saved sessions in `saved`;
/// `extra` flags on top.
fn service(ws: &Path, saved: &Path, extra: &[&str]) -> Service {
    let replica = replica();
    let mut flags = vec![
        "--warm-sessions",
        "0",
        "--replica-id",
        &replica,
        "--snapshot-dir",
        saved.to_str().unwrap(),
    ];
    flags.extend_from_slice(extra);
    Service::start(ws, &[], &flags)
}

/// Polls `/metrics` every 20 ms until `name` is at least `want` (at most `within`); returns
/// when it got there.
async fn metric_reaches(service: &Service, name: &str, want: f64, within: Duration) -> Instant {
    let deadline = Instant::now() + within;
    loop {
        let value = metric(service.port, None, name).await;
        if value >= want {
            return Instant::now();
        }
        assert!(
            Instant::now() < deadline,
            "{name} stayed {value} (want {want}):\n{}",
            service.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

const HIBERNATED: &str = "ipybox_session_saves_total{kind=\"hibernate\"}";
const EXPIRED: &str = "ipybox_saved_sessions_expired_total";

/// `--idle-timeout 0.8` with `--hibernate-after 0.2`: the session hibernates, and its saved
/// state is deleted 0.8 s after its last use, not 0 s (what truncating to whole seconds made
/// of it: deleted at the first look after the hibernation). The log and the expired handle say
/// 0.8 s.
#[tokio::test(flavor = "multi_thread")]
async fn a_sub_second_idle_timeout_expires_a_saved_session_when_it_says() {
    require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    let saved = tempfile::tempdir().unwrap();
    let service = service(
        ws.path(),
        saved.path(),
        &["--hibernate-after", "0.2", "--idle-timeout", "0.8"],
    );
    let client = connect(&service.url(), None, Era::Stateless).await;
    let (_, h) = new_session(&client, "x = 1").await;
    let used = Instant::now();
    let hibernated = metric_reaches(&service, HIBERNATED, 1.0, Duration::from_secs(30)).await;
    let expired = metric_reaches(&service, EXPIRED, 1.0, Duration::from_secs(30)).await;
    let (hibernated, expired) = (hibernated - used, expired - used);
    eprintln!("hibernated after {hibernated:?}, expired after {expired:?}");
    // Hibernated well before the timeout (else this test proves nothing about saved sessions).
    assert!(hibernated < Duration::from_millis(700), "{hibernated:?}");
    // Not before 0.8 s after the last use (the service's last use is a few ms before the
    // client got the result: 50 ms of slack), and within the reaper's tick (0.1 s here) plus
    // the metric's polling after it.
    assert!(
        expired >= Duration::from_millis(750) && expired < Duration::from_millis(1400),
        "expired {expired:?} after the last use\n{}",
        service.log()
    );
    let (is_error, text) = cell(&client, "print(x)", Some(&h)).await;
    assert!(is_error, "{text}");
    assert!(
        text.contains("expired: it was idle for more than 0.8 s (--idle-timeout), so its saved state was deleted"),
        "{text}"
    );
    assert!(
        service.log().contains("closed after 0.8 s idle"),
        "{}",
        service.log()
    );
    client.close().await;
}
