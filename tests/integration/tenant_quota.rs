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

const NOTEBOOK_QUOTA: u64 = 2 << 20;
/// A cell of the flood: 300 000 characters of output, all of it returned (and recorded).
const FLOOD: &str = "for _ in range(3):\n    print('x' * 100_000)";
const ALICE: &str = "token-of-alice-0123456789";
const BOB: &str = "token-of-bob-0123456789";
const TOLD: &str = "[ipybox] This session's notebook: ";

/// Runs `code` in `session` (a new one if `None`) with the whole output returned.
async fn flood_cell(client: &PlainHttp, code: &str, session: Option<&str>) -> (bool, String) {
    let mut arguments = serde_json::json!({"code": code, "max_output_chars": 1_000_000});
    if let Some(session) = session {
        arguments["session"] = serde_json::json!(session);
    }
    let result = client
        .call_tool_json(
            "execute_ipython_cell",
            arguments.as_object().unwrap().clone(),
        )
        .await
        .unwrap();
    text_of(&result)
}

async fn notebook_uris(client: &PlainHttp) -> Vec<String> {
    client
        .service
        .list_all_resources()
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.uri)
        .filter(|u| u.starts_with("ipybox://notebook/"))
        .collect()
}

async fn read_notebook(client: &PlainHttp, uri: &str) -> Result<String, String> {
    client
        .service
        .peer()
        .read_resource(rmcp::model::ReadResourceRequestParams::new(uri.to_string()))
        .await
        .map(|r| match &r.contents[0] {
            rmcp::model::ResourceContents::TextResourceContents { text, .. } => text.clone(),
            other => panic!("{other:?}"),
        })
        .map_err(|e| e.to_string())
}

/// The bytes of the files in `dir` whose name has `tag` in it.
fn files_of(dir: &Path, tag: &str) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().contains(tag))
        .map(|e| e.metadata().map_or(0, |m| m.len()))
        .sum()
}

struct Flooded {
    /// Alice's notebook bytes on disk at the end, her first session's alone.
    alice: u64,
    first: u64,
    /// Bob's notebook bytes before and after, and his resource's text after.
    bob: (u64, u64, String),
    /// What the first session's resource answers, and its next two results.
    first_resource: Result<String, String>,
    first_results: [String; 2],
    /// The flood session's results.
    flood_results: Vec<String>,
    tags: (String, String),
}

/// Alice (2026-07-28) runs a session of four flood cells, then floods a second one (twelve
/// cells, 3.6 MB of output); Bob (handshake era) has one small session meanwhile.
async fn notebook_flood(quota: &str) -> Flooded {
    let ws = tempfile::tempdir().unwrap();
    let notebooks = tempfile::tempdir().unwrap();
    let dir = notebooks.path().join("nb");
    let service = Service::start(
        ws.path(),
        &[],
        &[
            "--token",
            ALICE,
            "--token",
            BOB,
            "--trust-tenants",
            "--warm-sessions",
            "0",
            "--hibernate-after",
            "off",
            "--notebook-dir",
            dir.to_str().unwrap(),
            "--notebook-quota",
            quota,
        ],
    );
    let alice = connect(&service.url(), Some(ALICE), Era::Stateless).await;
    let bob = connect(&service.url(), Some(BOB), Era::Handshake).await;
    let (is_error, text) = cell(&bob, "print('bob was here')", None).await;
    assert!(!is_error, "{text}");
    let bob_uri = notebook_uris(&bob).await.remove(0);
    let bob_tag = bob_uri.rsplit('/').next().unwrap().to_string();
    let (is_error, text) = flood_cell(&alice, FLOOD, None).await;
    assert!(!is_error);
    let first = split_note(&text).1.unwrap();
    for _ in 0..3 {
        let (is_error, text) = flood_cell(&alice, FLOOD, Some(&first)).await;
        assert!(!is_error && !text.contains(TOLD), "{}", &text[..200]);
    }
    let first_uri = notebook_uris(&alice).await.remove(0);
    let first_tag = first_uri.rsplit('/').next().unwrap().to_string();
    // Written in the background: on disk once it is all there.
    let deadline = Instant::now() + Duration::from_secs(20);
    while files_of(&dir, &first_tag) < 1_200_000 || files_of(&dir, &bob_tag) == 0 {
        assert!(Instant::now() < deadline, "{}", service.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let bob_before = files_of(&dir, &bob_tag);
    let (_, text) = flood_cell(&alice, FLOOD, None).await;
    let second = split_note(&text).1.unwrap();
    let mut flood_results = vec![text];
    for _ in 0..11 {
        let (is_error, text) = flood_cell(&alice, FLOOD, Some(&second)).await;
        assert!(!is_error);
        flood_results.push(text);
    }
    let second_tag = notebook_uris(&alice)
        .await
        .into_iter()
        .map(|u| u.rsplit('/').next().unwrap().to_string())
        .find(|t| *t != first_tag)
        .unwrap();
    let first_resource = read_notebook(&alice, &first_uri).await;
    let mut first_results = Vec::new();
    for _ in 0..2 {
        let (is_error, text) = cell(&alice, "print('still here')", Some(&first)).await;
        assert!(!is_error, "{text}");
        first_results.push(text);
    }
    // The control's last writes land in the background.
    if quota == "off" {
        let deadline = Instant::now() + Duration::from_secs(20);
        while files_of(&dir, &second_tag) < 3_600_000 {
            assert!(Instant::now() < deadline, "{}", service.log());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let bob_text = read_notebook(&bob, &bob_uri).await.unwrap();
    let out = Flooded {
        alice: files_of(&dir, &first_tag) + files_of(&dir, &second_tag),
        first: files_of(&dir, &first_tag),
        bob: (bob_before, files_of(&dir, &bob_tag), bob_text),
        first_resource,
        first_results: [first_results[0].clone(), first_results[1].clone()],
        flood_results,
        tags: (first_tag, second_tag),
    };
    alice.close().await;
    bob.close().await;
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn a_notebook_flood_stays_within_the_tokens_notebook_quota() {
    require!(TestEnv);
    let (bounded, control) = tokio::join!(notebook_flood("2M"), notebook_flood("off"));
    // Control: no quota, 4.8 MB of Alice's notebooks on disk, nobody told anything.
    assert!(control.alice > 4_800_000, "{}", control.alice);
    assert!(control.first > 1_200_000);
    assert!(control.first_resource.as_ref().unwrap().contains("xxxx"));
    assert!(
        control
            .flood_results
            .iter()
            .chain(&control.first_results)
            .all(|t| !t.contains(TOLD))
    );
    // The quota: at most 2 MiB of Alice's notebooks once the writes settle.
    let (first_tag, second_tag) = &bounded.tags;
    assert!(
        bounded.alice <= NOTEBOOK_QUOTA,
        "{} > {NOTEBOOK_QUOTA}",
        bounded.alice
    );
    // Her older session's notebook went first; its resource and its next result say why
    // (once).
    assert_eq!(bounded.first, 0);
    let removed = format!(
        "the notebook of session {first_tag} was removed and this session is no longer recorded: this token's session notebooks passed {NOTEBOOK_QUOTA} bytes (--notebook-quota), and the least recently written are removed first\n  help: ask the operator for a larger --notebook-quota; the session itself goes on"
    );
    let resource = bounded.first_resource.as_ref().unwrap_err();
    assert!(
        resource.contains(&format!("ipybox://notebook/{first_tag}: {removed}")),
        "{resource}"
    );
    assert_eq!(
        bounded.first_results[0].trim_end(),
        format!("{TOLD}{removed}\n\nstill here")
    );
    assert_eq!(bounded.first_results[1].trim_end(), "still here");
    // The flood session itself stopped being recorded when it alone would not fit: told once.
    let told: Vec<&String> = bounded
        .flood_results
        .iter()
        .filter(|t| t.starts_with(TOLD))
        .collect();
    assert_eq!(
        told.len(),
        1,
        "{:?}",
        bounded
            .flood_results
            .iter()
            .map(|t| &t[..80])
            .collect::<Vec<_>>()
    );
    let head = format!(
        "{TOLD}the notebook of session {second_tag} is no longer recorded: its next version ("
    );
    let tail = format!(
        " bytes) would not fit in this token's {NOTEBOOK_QUOTA} bytes of session notebooks (--notebook-quota) even with every older notebook of the token removed; its file keeps what was recorded until now\n  help: ask the operator for a larger --notebook-quota; the session itself goes on\n\n"
    );
    let (first_line, _) = told[0].split_once("\n\nxxxx").unwrap();
    assert!(
        first_line.starts_with(&head) && format!("{first_line}\n\n").ends_with(&tail),
        "{first_line}"
    );
    // Bob's notebook: untouched, in both.
    for run in [&bounded, &control] {
        assert!(run.bob.0 > 0 && run.bob.0 == run.bob.1, "{:?}", run.bob);
        assert!(run.bob.2.contains("bob was here"));
    }
}
