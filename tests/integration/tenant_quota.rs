//! What a token may keep (issue 37, items 4 and 5): `--snapshot-quota` holds on every path
//! that keeps a snapshot (a hibernation that reuses a checkpoint included), and
//! `--notebook-quota` bounds the bytes of a token's session notebooks on disk (oldest first;
//! the session whose notebook is removed or no longer written is told, and its resource says
//! why). Each check runs the same sessions with the quota `off` as the control.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::http_support::*;
use crate::mcp_eras::Era;
use crate::support::*;

fn replica() -> String {
    format!("quota-{:08x}", rand::random::<u32>())
}

/// Polls `/metrics` until `name` is at least `want` (at most 60 s).
async fn metric_reaches(service: &Service, token: Option<&str>, name: &str, want: f64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let value = metric(service.port, token, name).await;
        if value >= want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{name} stayed {value} (want {want}):\n{}",
            service.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The bytes of every file under `dir` (recursively; links not followed).
fn tree_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => tree_bytes(&e.path()),
            Ok(t) if t.is_file() => e.metadata().map_or(0, |m| m.len()),
            _ => 0,
        })
        .sum()
}

const HIBERNATED: &str = "ipybox_session_saves_total{kind=\"hibernate\"}";
const CHECKPOINTED: &str = "ipybox_session_saves_total{kind=\"checkpoint\"}";
const SNAPSHOT_QUOTA: u64 = 3_000_000;

/// Three sessions of one token, 1.2 MB of state each, checkpointed while all three are open
/// (`--checkpoint-after 0.3`), then hibernated reusing their checkpoints (`--hibernate-after
/// 5`). Returns the snapshot bytes on disk once all three are saved, and what each handle
/// gets next: `Ok` its state back, `Err` the message.
async fn three_hibernations(quota: &str) -> (u64, Vec<Result<(), String>>) {
    let ws = tempfile::tempdir().unwrap();
    let saved = tempfile::tempdir().unwrap();
    let replica = replica();
    let service = Service::start(
        ws.path(),
        &[],
        &[
            "--checkpoint-after",
            "0.3",
            "--hibernate-after",
            "5",
            "--idle-timeout",
            "120",
            "--warm-sessions",
            "0",
            "--replica-id",
            &replica,
            "--snapshot-dir",
            saved.path().to_str().unwrap(),
            "--snapshot-quota",
            quota,
        ],
    );
    let client = connect(&service.url(), None, Era::Stateless).await;
    let (a, b, c) = tokio::join!(
        new_session(&client, "blob = b'a' * 1_200_000"),
        new_session(&client, "blob = b'b' * 1_200_000"),
        new_session(&client, "blob = b'c' * 1_200_000"),
    );
    let handles = [a.1, b.1, c.1];
    // All three checkpointed while open, then hibernated.
    metric_reaches(&service, None, CHECKPOINTED, 3.0).await;
    assert_eq!(metric(service.port, None, HIBERNATED).await, 0.0);
    metric_reaches(&service, None, HIBERNATED, 3.0).await;
    let snapshots = saved.path().join("snapshots");
    // A save that met another session's transition leaves the token to the next reap.
    let deadline = Instant::now() + Duration::from_secs(10);
    let limit = quota.parse::<u64>().unwrap_or(u64::MAX);
    while tree_bytes(&snapshots) > limit && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let on_disk = tree_bytes(&snapshots);
    let mut outcomes = Vec::new();
    for (h, byte) in handles.iter().zip(["a", "b", "c"]) {
        let (is_error, text) = cell(&client, "print(len(blob), blob[:1])", Some(h)).await;
        outcomes.push(if is_error {
            Err(text)
        } else {
            assert!(text.ends_with(&format!("\n\n1200000 b'{byte}'")), "{text}");
            Ok(())
        });
    }
    client.close().await;
    (on_disk, outcomes)
}

#[tokio::test(flavor = "multi_thread")]
async fn reused_checkpoints_count_against_the_snapshot_quota() {
    require!(TestEnv);
    let quota = SNAPSHOT_QUOTA.to_string();
    let ((bounded, outcomes), (unbounded, kept)) =
        tokio::join!(three_hibernations(&quota), three_hibernations("off"));
    // Control: with no quota the three hibernations keep their checkpoints, 3.6 MB.
    assert!(unbounded > 3_600_000, "{unbounded}");
    assert_eq!(kept, vec![Ok(()), Ok(()), Ok(())]);
    // The quota: what is on disk for the token fits; the sessions deleted were told exactly.
    assert!(bounded <= SNAPSHOT_QUOTA, "{bounded} > {SNAPSHOT_QUOTA}");
    let ended: Vec<&String> = outcomes.iter().filter_map(|o| o.as_ref().err()).collect();
    assert!(!ended.is_empty() && ended.len() < 3, "{outcomes:?}");
    for text in ended {
        let tag = &text["session ".len().."session ".len() + 8];
        assert_eq!(
            *text,
            format!(
                "session {tag} expired: its saved state was deleted to keep this token's hibernated sessions within {SNAPSHOT_QUOTA} bytes (--snapshot-quota), least recently used first\n  help: call without `session` to start a new session"
            )
        );
    }
}
