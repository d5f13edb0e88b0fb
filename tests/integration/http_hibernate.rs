//! Hibernation over HTTP (issue 30): an idle session's state is saved and its kernel stopped;
//! the next call with its handle (2026-07-28) or the next cell of its MCP session (handshake
//! era) restores it and its result starts with the restore report; another token's handle and
//! another session's snapshot are refused; a restart of the service (SIGTERM, start again on
//! the same data directory) keeps sessions; a session's kernel cannot read the keys or the
//! snapshots.
//!
//! Every service here has a replica name of its own (`--replica-id`) and keeps its saved
//! sessions in a temporary `--snapshot-dir` (removed with the test); the session key is in
//! ipybox's data directory, which the tests share (but `a_restart_keeps_sessions_out_of_kernels_reach`,
//! whose data and snapshot directories are in its workspace, where a kernel would see them).

use std::path::Path;
use std::time::{Duration, Instant};

use crate::http_support::*;
use crate::mcp_eras::Era;
use crate::support::*;

fn replica() -> String {
    format!("hib-{:08x}", rand::random::<u32>())
}

/// A service that hibernates sessions idle for 1 s, with no warm kernel, a replica name of its
/// own and its saved sessions in `saved`; `extra` flags on top.
fn hibernating(ws: &Path, saved: &Path, extra: &[&str]) -> Service {
    let replica = replica();
    let mut flags = vec![
        "--hibernate-after",
        "1",
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

/// Polls `/metrics` until `name` is at least `want` (at most 30 s).
async fn wait_metric(service: &Service, token: Option<&str>, name: &str, want: f64) {
    let deadline = Instant::now() + Duration::from_secs(30);
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
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

const HIBERNATED: &str = "ipybox_session_saves_total{kind=\"hibernate\"}";
const RESTORED: &str = "ipybox_session_restores_total";

/// What the cells define: numbers, a dict of lists, a function, a class and its instance, and
/// two things no snapshot holds (an open file, a generator).
const STATE: &str = "x = 42\nrows = {'a': [1, 2, 3], 'b': [4.5, None]}\ndef f(n):\n    return n * x\nclass Point:\n    def __init__(self, v):\n        self.v = v\n    def twice(self):\n        return 2 * self.v\np = Point(21)\nfh = open('/etc/hostname')\ngen = (i for i in range(3))";
const CHECK: &str = "print(x, rows, f(2), p.twice(), type(p).__name__, isinstance(p, Point))";
const CHECKED: &str = "42 {'a': [1, 2, 3], 'b': [4.5, None]} 84 42 Point True";

/// The restore report at the top of `text`, with the snapshot's time cut out; and the rest.
fn report_and_rest(text: &str) -> (String, String) {
    let head = "[ipybox] This session's kernel was restored from a snapshot taken ";
    let after = text
        .strip_prefix(head)
        .unwrap_or_else(|| panic!("no restore report in: {text}"));
    let (time, rest) = after.split_once(" UTC.").unwrap();
    assert_eq!(time.len(), 16, "{time}");
    let (report, output) = rest.split_once("\n\n").unwrap_or((rest, ""));
    (report.to_string(), output.to_string())
}

fn expected_report(cwd: &str) -> String {
    format!(
        "\nCame back (5): x (int), rows (dict), f (function), Point (class), p (Point).\n\
         Working directory: {cwd}.\n\
         Not restored (2); run the code that made them again if you need them:\n\
         - fh: not saved: an open file ('/etc/hostname'): a file handle belongs to this process\n\
         - gen: not saved: a generator: its paused frame cannot be saved\n\
         The working directory is a new one: files written in the old one did not come back (only the kernel's state is saved)."
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn idle_sessions_hibernate_and_come_back_in_both_eras() {
    require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    let saved = tempfile::tempdir().unwrap();
    let service = hibernating(ws.path(), saved.path(), &[]);
    let modern = connect(&service.url(), None, Era::Stateless).await;
    let legacy = connect(&service.url(), None, Era::Handshake).await;
    let (_, h) = new_session(&modern, STATE).await;
    assert_eq!(cell(&legacy, STATE, None).await, (false, String::new()));
    // Both sessions hibernate: no kernel session is open.
    wait_metric(&service, None, HIBERNATED, 2.0).await;
    assert_eq!(metric(service.port, None, "ipybox_sessions").await, 0.0);
    assert_eq!(
        metric(service.port, None, "ipybox_sessions_hibernated").await,
        2.0
    );

    // 2026-07-28: the handle brings the state back; the first result starts with the report.
    let started = Instant::now();
    let (is_error, text) = cell(&modern, CHECK, Some(&h)).await;
    let first = started.elapsed();
    assert!(!is_error, "{text}");
    let (report, output) = report_and_rest(&text);
    let (_, modern_cwd) = {
        let (e, t) = cell(&modern, "import os; print(os.getcwd())", Some(&h)).await;
        assert!(!e, "{t}");
        (e, t)
    };
    assert_eq!(report, expected_report(&modern_cwd));
    assert_eq!(output, CHECKED);
    // Once: the next result has no report.
    let started = Instant::now();
    assert_eq!(
        cell(&modern, "print(x)", Some(&h)).await,
        (false, "42".into())
    );
    eprintln!(
        "first call to a hibernated session: {} ms; the next one: {} ms",
        first.as_millis(),
        started.elapsed().as_millis()
    );

    // Handshake era: the MCP session's kernel session comes back on its next cell.
    let (is_error, text) = cell(&legacy, CHECK, None).await;
    assert!(!is_error, "{text}");
    let (report, output) = report_and_rest(&text);
    let (_, cwd) = cell(&legacy, "import os; print(os.getcwd())", None).await;
    assert_eq!(report, expected_report(&cwd));
    assert_eq!(output, CHECKED);
    assert_eq!(cell(&legacy, "print(x)", None).await, (false, "42".into()));
    assert_eq!(metric(service.port, None, RESTORED).await, 2.0);

    // They hibernate again, and come back again (the snapshot replaced with the new state).
    assert_eq!(
        cell(&modern, "x = 43", Some(&h)).await,
        (false, String::new())
    );
    wait_metric(&service, None, HIBERNATED, 4.0).await;
    let (is_error, text) = cell(&modern, "print(f(1))", Some(&h)).await;
    assert!(!is_error && text.ends_with("\n\n43"), "{text}");
    modern.close().await;
    legacy.close().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_calls_restore_once() {
    require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    let saved = tempfile::tempdir().unwrap();
    let service = hibernating(ws.path(), saved.path(), &[]);
    let client = connect(&service.url(), None, Era::Stateless).await;
    let (_, h) = new_session(&client, "n = 7").await;
    wait_metric(&service, None, HIBERNATED, 1.0).await;
    let calls = (0..4).map(|_| cell(&client, "print(n)", Some(&h)));
    let results = futures::future::join_all(calls).await;
    let reports = results
        .iter()
        .filter(|(e, t)| {
            assert!(!e, "{t}");
            assert!(t.ends_with('7'), "{t}");
            t.starts_with("[ipybox] This session's kernel was restored")
        })
        .count();
    assert_eq!(reports, 1, "{results:?}");
    assert_eq!(metric(service.port, None, RESTORED).await, 1.0);
    assert_eq!(metric(service.port, None, "ipybox_sessions").await, 1.0);
    client.close().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn another_tokens_handle_and_another_sessions_snapshot_are_refused() {
    require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    let saved = tempfile::tempdir().unwrap();
    let service = hibernating(
        ws.path(),
        saved.path(),
        &["--token", TOKEN_A, "--token", TOKEN_B, "--trust-tenants"],
    );
    let marker = format!("{:016x}", rand::random::<u64>());
    let alice = connect(&service.url(), Some(TOKEN_A), Era::Stateless).await;
    let bob = connect(&service.url(), Some(TOKEN_B), Era::Stateless).await;
    let (_, one) = new_session(&alice, &format!("mine_{marker} = 'one'")).await;
    let (_, two) = new_session(&alice, &format!("mine_{marker} = 'two'")).await;
    wait_metric(&service, Some(TOKEN_A), HIBERNATED, 2.0).await;

    // Another token's call with Alice's handle: refused before anything is read.
    let (is_error, text) = cell(&bob, "print(1)", Some(&one)).await;
    assert!(is_error, "{text}");
    assert_eq!(
        text,
        "this session handle is not valid with your credential: it was made for another token, altered, or issued by an ipybox with another --session-secret\n  help: pass a handle a result gave you, or leave `session` out to start a new session"
    );
    assert_eq!(metric(service.port, Some(TOKEN_A), RESTORED).await, 0.0);

    // Each handle restores its own session.
    let (is_error, text) = cell(&alice, &format!("print(mine_{marker})"), Some(&two)).await;
    assert!(!is_error && text.ends_with("\n\ntwo"), "{text}");
    wait_metric(&service, Some(TOKEN_A), HIBERNATED, 3.0).await;

    // Session two's snapshot planted where session one's is: its seal is for another session,
    // so nothing of it is loaded, and session one is told so.
    let snapshots = saved.path().join("snapshots");
    let holding = |value: &str| {
        std::fs::read_dir(&snapshots)
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|dir| {
                std::fs::read_to_string(dir.join("manifest.json"))
                    .is_ok_and(|m| m.contains(&format!("mine_{marker}")))
                    && std::fs::read(dir.join("data"))
                        .is_ok_and(|d| d.windows(value.len()).any(|w| w == value.as_bytes()))
            })
            .unwrap_or_else(|| panic!("no snapshot holding {value}"))
    };
    let (dir_one, dir_two) = (holding("one"), holding("two"));
    assert_ne!(dir_one, dir_two);
    for file in ["data", "manifest.json", "seal.json"] {
        std::fs::copy(dir_two.join(file), dir_one.join(file)).unwrap();
    }
    let (is_error, text) = cell(&alice, &format!("print(mine_{marker})"), Some(&one)).await;
    assert!(is_error, "{text}");
    let tag = &text["session ".len().."session ".len() + 8];
    assert_eq!(
        text,
        format!(
            "session {tag} cannot be restored: refused to restore the snapshot: its seal does not verify for this session and owner: it was made for another session or owner, or changed since; nothing of it was loaded; its saved state was deleted\n  help: call without `session` to start a new session"
        )
    );
    assert!(!dir_one.exists());
    // Session two is untouched.
    let (is_error, text) = cell(&alice, &format!("print(mine_{marker})"), Some(&two)).await;
    assert!(!is_error && text.ends_with("\n\ntwo"), "{text}");
    alice.close().await;
    bob.close().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_restart_keeps_sessions_out_of_kernels_reach() {
    require!(TestEnv);
    // Where a kernel would see them if ipybox did not hide them: the data directory (the
    // session key) and the snapshot directory inside the workspace, which every kernel sees
    // (read-only), next to a file nothing hides (the control: the kernel reads it). Not /tmp
    // or $HOME, which every confined kernel sees empty anyway.
    let probe = probe_dir_or_skip!("hibernate-keys");
    let ws = probe.path().join("ws");
    std::fs::create_dir(&ws).unwrap();
    let visible = ws.join("visible.txt");
    std::fs::write(&visible, PLANTED).unwrap();
    let home = ws.join("home");
    let saved = ws.join("saved");
    let saved_dir = saved.to_str().unwrap();
    let replica = replica();
    let flags = [
        "--warm-sessions",
        "0",
        "--replica-id",
        &replica,
        "--snapshot-dir",
        saved_dir,
    ];
    let (home_env, python) = (
        home.display().to_string(),
        kernel_python().display().to_string(),
    );
    let env = [
        ("IPYBOX_HOME", home_env.as_str()),
        ("IPYBOX_PYTHON", python.as_str()),
    ];
    let mut service = Service::start(&ws, &env, &flags);
    let client = connect(&service.url(), None, Era::Stateless).await;
    let (_, h) = new_session(&client, STATE).await;
    // The kernel sees neither the keys nor the snapshots nor the saved sessions' records.
    let code = format!(
        "import os as _os\nprint(open({visible:?}).read())\nfor _q in [{key:?}, {saved:?} + '/keys/snapshot.key', {saved:?} + '/snapshots', {saved:?} + '/sessions']:\n    try:\n        open(_q).read() if not _os.path.isdir(_q) else _os.listdir(_q)[0]\n        print('read', _q)\n    except (OSError, IndexError) as e:\n        print(type(e).__name__)\ndel _q, _os",
        visible = visible.display().to_string(),
        key = home.join("keys/session.key").display().to_string(),
        saved = saved_dir,
    );
    // The control: the host reads each of them (they are there to be hidden).
    assert!(
        !std::fs::read(home.join("keys/session.key"))
            .unwrap()
            .is_empty()
    );
    assert!(
        !std::fs::read(saved.join("keys/snapshot.key"))
            .unwrap()
            .is_empty()
    );
    for dir in ["snapshots", "sessions"] {
        assert!(saved.join(dir).is_dir(), "{dir}");
    }
    let (is_error, text) = cell(&client, &code, Some(&h)).await;
    assert!(!is_error, "{text}");
    // Hidden (an empty directory in the kernel's view), not merely unreadable; the file next to
    // them in the workspace is read.
    assert_eq!(
        text,
        format!("{PLANTED}\n{}", ["FileNotFoundError"; 4].join("\n"))
    );
    client.close().await;

    // SIGTERM: the idle session is hibernated, not lost.
    let (status, _) = service.terminate(Duration::from_secs(30));
    assert!(status.success(), "{status}\n{}", service.log());
    assert!(
        service
            .log()
            .contains("shutdown: 1 of 1 idle sessions hibernated"),
        "{}",
        service.log()
    );
    let service = Service::start(&ws, &env, &flags);
    let client = connect(&service.url(), None, Era::Stateless).await;
    let (is_error, text) = cell(&client, CHECK, Some(&h)).await;
    assert!(!is_error, "{text}");
    let (report, output) = report_and_rest(&text);
    let (_, cwd) = cell(&client, "import os; print(os.getcwd())", Some(&h)).await;
    assert_eq!(report, expected_report(&cwd));
    assert_eq!(output, CHECKED);
    client.close().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn hibernated_sessions_expire_and_a_token_keeps_within_its_quota() {
    require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    let saved = tempfile::tempdir().unwrap();
    let service = hibernating(
        ws.path(),
        saved.path(),
        &["--idle-timeout", "4", "--snapshot-quota", "2000000"],
    );
    let client = connect(&service.url(), None, Era::Stateless).await;
    // Two sessions of 1.2 MB each: the second one's hibernation deletes the first (least
    // recently used) to stay within 2 MB.
    let (_, first) = new_session(&client, "blob = b'x' * 1_200_000").await;
    wait_metric(&service, None, HIBERNATED, 1.0).await;
    let (_, second) = new_session(&client, "blob = b'y' * 1_200_000").await;
    wait_metric(&service, None, HIBERNATED, 2.0).await;
    let (is_error, text) = cell(&client, "print(len(blob))", Some(&first)).await;
    assert!(is_error, "{text}");
    let tag = &text["session ".len().."session ".len() + 8];
    assert_eq!(
        text,
        format!(
            "session {tag} expired: its saved state was deleted to keep this token's hibernated sessions within 2000000 bytes (--snapshot-quota), least recently used first\n  help: call without `session` to start a new session"
        )
    );
    let (is_error, text) = cell(&client, "print(len(blob), blob[:1])", Some(&second)).await;
    assert!(!is_error && text.ends_with("\n\n1200000 b'y'"), "{text}");
    // Unused for the idle timeout (counted from its last call), a hibernated session's saved
    // state is deleted.
    wait_metric(&service, None, HIBERNATED, 3.0).await;
    wait_metric(&service, None, "ipybox_saved_sessions_expired_total", 2.0).await;
    assert_eq!(
        metric(service.port, None, "ipybox_sessions_hibernated").await,
        0.0
    );
    let (is_error, text) = cell(&client, "print(len(blob))", Some(&second)).await;
    assert!(is_error, "{text}");
    let tag = &text["session ".len().."session ".len() + 8];
    assert_eq!(
        text,
        format!(
            "session {tag} expired: it was idle for more than 4 s (--idle-timeout), so its saved state was deleted\n  help: call without `session` to start a new session"
        )
    );
    client.close().await;
}

/// The crash bound: a service killed (SIGKILL) during a 50-cell session loses what the session
/// did since its last checkpoint, and nothing before it. The cells come in bursts of ten
/// (20 ms apart, as a model that runs cells back to back) with a pause of 1.5 s after each
/// burst (a model thinking, a user reading); `--checkpoint-after 0.2`; the kill comes right
/// after cell 45.
#[tokio::test(flavor = "multi_thread")]
async fn a_killed_service_keeps_what_its_last_checkpoint_holds() {
    require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    let replica = replica();
    let saved = tempfile::tempdir().unwrap();
    let saved_dir = saved.path().to_str().unwrap();
    let flags = [
        "--checkpoint-after",
        "0.2",
        "--warm-sessions",
        "0",
        "--replica-id",
        &replica,
        "--snapshot-dir",
        saved_dir,
    ];
    let mut service = Service::start(ws.path(), &[], &flags);
    let client = connect(&service.url(), None, Era::Stateless).await;
    let (_, h) = new_session(&client, "done = []").await;
    for i in 0..=45 {
        let (is_error, text) = cell(&client, &format!("done.append({i})"), Some(&h)).await;
        assert!(!is_error, "{text}");
        let pause = if i % 10 == 9 { 1500 } else { 20 };
        if i < 45 {
            tokio::time::sleep(Duration::from_millis(pause)).await;
        }
    }
    service.kill();
    let log = service.log();
    let times: Vec<&str> = log
        .lines()
        .filter_map(|l| l.split("checkpoint: ").nth(1))
        .collect();
    eprintln!("checkpoints before the kill: {}: {times:?}", times.len());
    assert!(times.len() >= 4, "{log}");
    let service = Service::start(ws.path(), &[], &flags);
    let client = connect(&service.url(), None, Era::Stateless).await;
    let (is_error, text) = cell(&client, "print(done)", Some(&h)).await;
    assert!(!is_error, "{text}");
    let (report, output) = report_and_rest(&text);
    assert!(
        report.starts_with("\nCame back (1): done (list)."),
        "{report}"
    );
    let survived: Vec<u32> = serde_json::from_str(&output).unwrap();
    eprintln!(
        "cells whose effects survived the kill: {} of 46 (0..={})",
        survived.len(),
        survived.last().unwrap()
    );
    assert_eq!(survived, (0..40).collect::<Vec<u32>>());
    client.close().await;
}

/// Replicas with local kernels and `--snapshot-dir` on storage they share: a hibernated session
/// of a replica that died is restored by another replica its handle reaches; never while the
/// replica that holds it is alive (its lock and lease).
#[tokio::test(flavor = "multi_thread")]
async fn a_replica_restores_the_hibernated_sessions_of_a_dead_one() {
    require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    let shared = tempfile::tempdir().unwrap();
    let secret = shared.path().join("secret");
    std::fs::write(&secret, "a-shared-session-secret-0123456789").unwrap();
    let snapshots = shared.path().join("saved");
    let flags = |replica: &str| -> Vec<String> {
        [
            "--hibernate-after",
            "1",
            "--warm-sessions",
            "0",
            "--replica-id",
            replica,
            "--snapshot-dir",
            snapshots.to_str().unwrap(),
            "--session-secret-file",
            secret.to_str().unwrap(),
        ]
        .map(String::from)
        .to_vec()
    };
    let (a_name, b_name) = (replica(), replica());
    let a_flags = flags(&a_name);
    let b_flags = flags(&b_name);
    let a_flags: Vec<&str> = a_flags.iter().map(String::as_str).collect();
    let b_flags: Vec<&str> = b_flags.iter().map(String::as_str).collect();
    let mut a = Service::start(ws.path(), &[], &a_flags);
    let b = Service::start(ws.path(), &[], &b_flags);
    let on_a = connect(&a.url(), None, Era::Stateless).await;
    let on_b = connect(&b.url(), None, Era::Stateless).await;
    let (_, h) = new_session(&on_a, "x = 5\ndef g():\n    return x + 1").await;
    wait_metric(&a, None, HIBERNATED, 1.0).await;
    let elsewhere = format!(
        "this session's kernel runs on replica `{a_name}`, and this is `{b_name}`: kernels of local sessions live in one replica's memory\n  help: route requests by the handle's replica (the `Mcp-Param-Session` header, or the `{a_name}` part of the handle) to that replica, or start a new session"
    );
    // Alive: its session is not taken.
    assert_eq!(
        cell(&on_b, "print(g())", Some(&h)).await,
        (true, elsewhere.clone())
    );
    a.kill();
    // Dead: once its lease is stale, the session comes back on b, with a handle of b's.
    let killed = Instant::now();
    let (is_error, text) = loop {
        let (is_error, text) = cell(&on_b, "print(g())", Some(&h)).await;
        if text != elsewhere {
            break (is_error, text);
        }
        assert!(killed.elapsed() < Duration::from_secs(30), "{}", b.log());
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    eprintln!(
        "taken over {} ms after the kill",
        killed.elapsed().as_millis()
    );
    assert!(!is_error, "{text}");
    let (report, rest) = report_and_rest(&text);
    assert!(
        report.starts_with("\nCame back (2): x (int), g (function).\nWorking directory: "),
        "{report}"
    );
    let (output, new) = split_note(&rest);
    assert_eq!(output, "6");
    let new = new.unwrap();
    assert!(new.starts_with(&format!("ipybox-s1.{b_name}.")), "{new}");
    assert_eq!(
        rest,
        format!(
            "6\n\n[ipybox session {new}: this session's kernel was replaced; pass session=\"{new}\" from now on]"
        )
    );
    assert_eq!(
        cell(&on_b, "print(x)", Some(&new)).await,
        (false, "5".into())
    );
    on_b.close().await;
}
