//! Sessions that survive, exactly (issue 39): a fractional `--idle-timeout` expires a saved
//! session when it says (not truncated to whole seconds); a save whose session closes meanwhile
//! (expiry during a checkpoint or a hibernation, a handshake-era DELETE during a hibernation)
//! leaves no snapshot behind, and the start-up sweep removes snapshot directories no record of
//! any replica names (after a grace); a clean SIGTERM with a cell running past the grace
//! interrupts that cell and saves the session, so no acknowledged cell is rolled back, and a
//! cell that ignores the interruption leaves the checkpoint, whose restore says what it lacks.
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

/// The snapshot directories (and unfinished writes) under `saved`, and the session records.
/// A directory that cannot be listed (`snapshots/` and `sessions/` are made when the service
/// starts) is a failure, not an empty list: "nothing left" must be seen, not assumed.
fn on_disk(saved: &Path) -> (Vec<String>, Vec<String>) {
    let list = |dir: &Path, keep: &dyn Fn(&str) -> bool| -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
            .map(|e| {
                e.unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
                    .file_name()
                    .to_string_lossy()
                    .into_owned()
            })
            .filter(|n| keep(n))
            .collect();
        names.sort();
        names
    };
    let snapshots = list(&saved.join("snapshots"), &|_| true);
    let mut records = Vec::new();
    for replica in list(&saved.join("sessions"), &|_| true) {
        for r in list(&saved.join("sessions").join(&replica), &|n| {
            n.ends_with(".json")
        }) {
            records.push(format!("{replica}/{r}"));
        }
    }
    (snapshots, records)
}

/// Waits until the log holds `want` lines with `what` (at most 60 s).
async fn log_count(service: &Service, what: &str, want: usize) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let n = service.log().matches(what).count();
        if n >= want {
            assert_eq!(n, want, "{what}:\n{}", service.log());
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{n} of {want} `{what}` in:\n{}",
            service.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A namespace big enough that saving it takes a while (50 MB: 2-6 s with this debug build
/// here, most of it the host hashing and writing the data; the races below need 0.4 s).
const BIG: &str = "big = bytearray(50_000_000)";
const ABANDONED: &str = "abandoned: the session was closed while it was being saved";

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

/// Expiry races a checkpoint (2026-07-28) and a hibernation (both eras): each save sees its
/// session closed, waits for its write and deletes it; nothing is left under `snapshots/` and
/// no record. The log never says such a session "stays open".
#[tokio::test(flavor = "multi_thread")]
async fn expiry_during_a_save_leaves_no_snapshot() {
    require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    // Checkpoints: the session stays open while saved, and expires 0.6 s after its last use,
    // while its 50 MB checkpoint (started at 0.2 s) is still being written.
    let saved_c = tempfile::tempdir().unwrap();
    let checkpointing = service(
        ws.path(),
        saved_c.path(),
        &[
            "--hibernate-after",
            "off",
            "--checkpoint-after",
            "0.2",
            "--idle-timeout",
            "0.6",
        ],
    );
    // Hibernation, both eras.
    let saved_h = tempfile::tempdir().unwrap();
    let hibernating = service(
        ws.path(),
        saved_h.path(),
        &["--hibernate-after", "0.2", "--idle-timeout", "0.6"],
    );
    let c = connect(&checkpointing.url(), None, Era::Stateless).await;
    let modern = connect(&hibernating.url(), None, Era::Stateless).await;
    let legacy = connect(&hibernating.url(), None, Era::Handshake).await;
    let (_, hc) = new_session(&c, BIG).await;
    let (_, hm) = new_session(&modern, BIG).await;
    assert_eq!(cell(&legacy, BIG, None).await, (false, String::new()));
    log_count(&checkpointing, ABANDONED, 1).await;
    log_count(&hibernating, ABANDONED, 2).await;
    for (service, saved, handle) in [
        (&checkpointing, &saved_c, &hc),
        (&hibernating, &saved_h, &hm),
    ] {
        assert_eq!(on_disk(saved.path()), (vec![], vec![]), "{}", service.log());
        assert!(!service.log().contains("stays open"), "{}", service.log());
        // The handle is told the session expired.
        let client = connect(&service.url(), None, Era::Stateless).await;
        let (is_error, text) = cell(&client, "print(len(big))", Some(handle)).await;
        assert!(
            is_error && text.contains(" expired: it was idle for more than 0.6 s"),
            "{text}"
        );
        client.close().await;
    }
    for client in [c, modern, legacy] {
        client.close().await;
    }
}

/// A handshake-era MCP session ended (DELETE) while its kernel session is being hibernated:
/// the hibernation is abandoned and its snapshot deleted. Control in the same service: a
/// 2026-07-28 session that hibernates undisturbed keeps exactly its snapshot and its record.
#[tokio::test(flavor = "multi_thread")]
async fn a_delete_during_a_hibernation_leaves_no_snapshot() {
    require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    let saved = tempfile::tempdir().unwrap();
    let service = service(
        ws.path(),
        saved.path(),
        &["--hibernate-after", "0.2", "--idle-timeout", "60"],
    );
    let modern = connect(&service.url(), None, Era::Stateless).await;
    let (_, h) = new_session(&modern, "kept = 1").await;
    metric_reaches(&service, HIBERNATED, 1.0, Duration::from_secs(30)).await;
    let (snapshots, records) = on_disk(saved.path());
    assert_eq!(
        (snapshots.len(), records.len()),
        (1, 1),
        "{snapshots:?} {records:?}"
    );

    let legacy = connect(&service.url(), None, Era::Handshake).await;
    assert_eq!(cell(&legacy, BIG, None).await, (false, String::new()));
    // The hibernation starts 0.2-0.3 s after the cell and takes longer than that for 50 MB:
    // nothing tells a client it started, so the DELETE comes at 0.4 s (the log below proves
    // it came during the save).
    tokio::time::sleep(Duration::from_millis(400)).await;
    legacy.close().await;
    log_count(&service, ABANDONED, 1).await;
    assert_eq!(
        on_disk(saved.path()),
        (snapshots, records),
        "{}",
        service.log()
    );
    assert!(!service.log().contains("stays open"), "{}", service.log());
    // The undisturbed session comes back.
    let (is_error, text) = cell(&modern, "print(kept)", Some(&h)).await;
    assert!(!is_error && text.ends_with("\n\n1"), "{text}");
    modern.close().await;
}

/// Makes `dir` and the files in it look last changed 10 minutes ago (past the sweep's grace).
fn make_old(dir: &Path) {
    let old = std::time::SystemTime::now() - Duration::from_secs(600);
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        std::fs::File::open(entry.path())
            .unwrap()
            .set_modified(old)
            .unwrap();
    }
    std::fs::File::open(dir).unwrap().set_modified(old).unwrap();
}

/// The start-up sweep, run by another replica on the same `--snapshot-dir`: it removes an
/// orphan snapshot directory and an unfinished write older than the grace; it keeps a fresh
/// orphan (a write in flight, maybe another replica's) and the snapshot a record of another
/// replica names, however old, which that replica then restores.
#[tokio::test(flavor = "multi_thread")]
async fn the_start_up_sweep_removes_only_old_snapshots_nobody_names() {
    require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    let saved = tempfile::tempdir().unwrap();
    let snapshots = saved.path().join("snapshots");
    let (one, two) = (replica(), replica());
    let flags = |replica: &str| -> Vec<String> {
        [
            "--warm-sessions",
            "0",
            "--hibernate-after",
            "0.2",
            "--replica-id",
            replica,
            "--snapshot-dir",
            saved.path().to_str().unwrap(),
        ]
        .map(str::to_string)
        .to_vec()
    };
    let start = |replica: &str| {
        let flags = flags(replica);
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        Service::start(ws.path(), &[], &flags)
    };
    let mut first = start(&one);
    let client = connect(&first.url(), None, Era::Stateless).await;
    let (_, h) = new_session(&client, "kept = 'still here'").await;
    metric_reaches(&first, HIBERNATED, 1.0, Duration::from_secs(30)).await;
    client.close().await;
    let (status, _) = first.terminate(Duration::from_secs(30));
    assert!(status.success(), "{}", first.log());
    let (named, records) = on_disk(saved.path());
    assert_eq!(
        (named.len(), records.len()),
        (1, 1),
        "{named:?} {records:?}"
    );
    make_old(&snapshots.join(&named[0]));
    // Planted: an old orphan, an old unfinished write, a fresh orphan.
    let plant = |name: &str, old: bool| {
        let dir = snapshots.join(name);
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join("data"), vec![7u8; 1000]).unwrap();
        if old {
            make_old(&dir);
        }
    };
    plant("0123456789abcdef0123456789abcdef", true);
    plant(".tmp-00000000deadbeef", true);
    plant("fedcba9876543210fedcba9876543210", false);

    let second = start(&two);
    let mut want = vec![
        named[0].clone(),
        "fedcba9876543210fedcba9876543210".to_string(),
    ];
    want.sort();
    assert_eq!(on_disk(saved.path()), (want, records), "{}", second.log());
    assert!(
        second
            .log()
            .contains("removed 2 snapshot directories no saved session names (2000 bytes)"),
        "{}",
        second.log()
    );
    drop(second);
    // The kept snapshot is whole: its replica restores it.
    let first = start(&one);
    let client = connect(&first.url(), None, Era::Stateless).await;
    let (is_error, text) = cell(&client, "print(kept)", Some(&h)).await;
    assert!(!is_error && text.ends_with("\n\nstill here"), "{text}");
    client.close().await;
}

/// What a call cut at shutdown is told, at the top of its result.
const CUT: &str = "[ipybox] ipybox is shutting down: this cell was still running when --shutdown-grace (3 s) ended, so it was interrupted (KeyboardInterrupt) and did not finish. The session is saved with what its cells did until then; if this cell did not stop when interrupted, its kernel was replaced and the session comes back as its last checkpoint, and the first call after the restart says what that lacks.\n  help: after the restart, call again with the same `session`; run what this cell did not do again if you need it";

/// Copies the saved sessions (snapshots and records, not the locks) from `from` to `to`.
fn copy_saved(from: &Path, to: &Path) {
    let _ = std::fs::remove_dir_all(to.join("snapshots"));
    let _ = std::fs::remove_dir_all(to.join("sessions"));
    for dir in ["snapshots", "sessions", "keys"] {
        copy_tree(&from.join(dir), &to.join(dir));
    }
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap().flatten() {
        let name = entry.file_name();
        if name == "lock" || name == "lease" {
            continue;
        }
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&entry.path(), &to.join(&name));
        } else {
            std::fs::copy(entry.path(), to.join(&name)).unwrap();
        }
    }
}

/// The checkpoint holds `log == ['base']`; `log.append('quick')` returns; a 30 s cell starts;
/// SIGTERM with `--shutdown-grace 3`. The running cell is interrupted when the grace ends and
/// the session saved: the cut call is told so, and after a restart the handle gets
/// `['base', 'quick']`. Control: the saved state as it was at the SIGTERM (the checkpoint),
/// restored by a service of its own, gives `['base']`: what a restart silently brought back
/// before.
#[tokio::test(flavor = "multi_thread")]
async fn a_clean_shutdown_keeps_every_acknowledged_cell() {
    require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    let saved = tempfile::tempdir().unwrap();
    let before = tempfile::tempdir().unwrap();
    let name = replica();
    let flags = |dir: &Path| -> Vec<String> {
        [
            "--warm-sessions",
            "0",
            "--hibernate-after",
            "off",
            "--checkpoint-after",
            "1",
            "--shutdown-grace",
            "3",
            "--replica-id",
            &name,
            "--snapshot-dir",
            dir.to_str().unwrap(),
        ]
        .map(str::to_string)
        .to_vec()
    };
    let start = |dir: &Path| {
        let flags = flags(dir);
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        Service::start(ws.path(), &[], &flags)
    };
    let mut service = start(saved.path());
    let client = std::sync::Arc::new(connect(&service.url(), None, Era::Stateless).await);
    let (_, h) = new_session(&*client, "log = ['base']").await;
    const CHECKPOINTS: &str = "ipybox_session_saves_total{kind=\"checkpoint\"}";
    metric_reaches(&service, CHECKPOINTS, 1.0, Duration::from_secs(30)).await;
    assert_eq!(
        cell(&*client, "log.append('quick')", Some(&h)).await,
        (false, String::new())
    );
    let slow = {
        let (client, h) = (client.clone(), h.clone());
        tokio::spawn(async move {
            cell(
                &*client,
                "import time\nlog.append('slow')\ntime.sleep(30)",
                Some(&h),
            )
            .await
        })
    };
    // The slow cell runs (no call is idle): the checkpoint still holds ['base'].
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(metric(service.port, None, CHECKPOINTS).await, 1.0);
    copy_saved(saved.path(), before.path());
    let (status, took) = tokio::task::block_in_place(|| service.terminate(Duration::from_secs(40)));
    assert!(status.success(), "{status}\n{}", service.log());
    let (is_error, text) = slow.await.unwrap();
    assert!(is_error, "{text}");
    assert_eq!(text, format!("{CUT}\n\nthe execution was cancelled"));
    assert!(took < Duration::from_secs(15), "{took:?}");
    let log = service.log();
    assert!(
        log.contains("shutdown: 1 of 1 idle sessions hibernated"),
        "{log}"
    );
    drop(client);

    let service = start(saved.path());
    let client = connect(&service.url(), None, Era::Stateless).await;
    let (is_error, text) = cell(&client, "print(log)", Some(&h)).await;
    assert!(!is_error, "{text}");
    assert!(text.ends_with("\n\n['base', 'quick', 'slow']"), "{text}");
    client.close().await;
    drop(service);

    // Control: the checkpoint alone.
    let control = start(before.path());
    let client = connect(&control.url(), None, Era::Stateless).await;
    let (is_error, text) = cell(&client, "print(log)", Some(&h)).await;
    assert!(!is_error && text.ends_with("\n\n['base']"), "{text}");
    client.close().await;
}

/// The same, with a cell that ignores the interruption (it catches KeyboardInterrupt and sleeps
/// again): the executor replaces its kernel (the state is gone), so the session is not saved
/// again (that would overwrite its checkpoint with an empty namespace); its checkpoint
/// (`['base']`) comes back, and the restore report says exactly what is missing and why. Control: the interrupted cell of the
/// test above is saved; here `quick` is not in the state, and the report says so.
#[tokio::test(flavor = "multi_thread")]
async fn a_cell_that_ignores_the_interruption_is_told_what_was_lost() {
    require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    let saved = tempfile::tempdir().unwrap();
    let name = replica();
    let flags = [
        "--warm-sessions",
        "0",
        "--hibernate-after",
        "off",
        "--checkpoint-after",
        "1",
        "--shutdown-grace",
        "3",
        "--replica-id",
        &name,
        "--snapshot-dir",
        saved.path().to_str().unwrap(),
    ];
    let mut service = Service::start(ws.path(), &[], &flags);
    let client = std::sync::Arc::new(connect(&service.url(), None, Era::Stateless).await);
    let (_, h) = new_session(&*client, "log = ['base']").await;
    const CHECKPOINTS: &str = "ipybox_session_saves_total{kind=\"checkpoint\"}";
    metric_reaches(&service, CHECKPOINTS, 1.0, Duration::from_secs(30)).await;
    assert_eq!(
        cell(&*client, "log.append('quick')", Some(&h)).await,
        (false, String::new())
    );
    let stubborn = {
        let (client, h) = (client.clone(), h.clone());
        tokio::spawn(async move {
            let code = "import time\nwhile True:\n    try:\n        time.sleep(30)\n    except KeyboardInterrupt:\n        pass";
            cell(&*client, code, Some(&h)).await
        })
    };
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(metric(service.port, None, CHECKPOINTS).await, 1.0);
    let (status, took) = tokio::task::block_in_place(|| service.terminate(Duration::from_secs(60)));
    assert!(status.success(), "{status}\n{}", service.log());
    // The grace, then the kernel's 3 s to stop the interrupted cell before it is replaced.
    assert!(
        took >= Duration::from_secs(6) && took < Duration::from_secs(20),
        "{took:?}"
    );
    assert!(
        service.log().contains(
            "shutdown: a cell did not stop when interrupted, so the session was not saved again"
        ),
        "{}",
        service.log()
    );
    let (is_error, text) = stubborn.await.unwrap();
    assert!(is_error && text.starts_with(CUT), "{text}");
    drop(client);

    let service = Service::start(ws.path(), &[], &flags);
    let client = connect(&service.url(), None, Era::Stateless).await;
    let (is_error, text) = cell(&client, "print(log)", Some(&h)).await;
    assert!(!is_error, "{text}");
    let (report, output) = text.split_once("\n\n").unwrap();
    assert_eq!(output, "['base']");
    let lost = report.lines().last().unwrap();
    assert_eq!(
        lost,
        "Lost: what this session ran after this snapshot was taken. ipybox was shut down while a cell of this session was still running, and the cell did not stop when interrupted (its kernel was replaced, or it still ran when ipybox exited), so the session could not be saved again. Every call made after the snapshot's time, and that cell, are not in the state that came back; run them again if you need what they did.",
        "{text}"
    );
    // Told once.
    let (is_error, text) = cell(&client, "print(log)", Some(&h)).await;
    assert_eq!((is_error, text.as_str()), (false, "['base']"));
    client.close().await;
}
