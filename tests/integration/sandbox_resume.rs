//! A sandboxed session's snapshot keeps its confinement (issue 36, part 2; docs/sandbox.md
//! "Checkpoints and hibernated sessions"): a stdio `--sandbox` session keeps an object whose
//! unpickling runs `touch MARKER` (`__reduce__` returning `os.system`) and is checkpointed. A
//! server without `--sandbox`, or with another policy, given the handle refuses to restore it,
//! says why and how to resume it, keeps working, and MARKER is not made; the snapshot is kept:
//! a second `--sandbox` server with the same policy restores it (its `touch` then runs inside
//! the sandbox, which denies the write). The control: the same object saved by an unsandboxed
//! session and resumed unsandboxed makes MARKER, so the payload works where it is allowed to.
//!
//! The same over HTTP (a confined session's hibernated snapshot, the service restarted with
//! `--unconfined-sessions`) and through the library (a Jupyter server's kernel's snapshot, a
//! local executor), each beside its control.
//!
//! MARKER lies under `support::probe_dir` (`target/probe-…`: outside /tmp and $HOME, which a sandboxed kernel sees
//! empty or private, and outside the workspace, the only place the default policy writes).

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use ipybox::sandbox::SandboxPolicy;
use ipybox::snapshot::KernelConfinement;
use ipybox::tools::tool_output;
use serde_json::json;

use crate::mcp_eras::{Era, Plain, both_eras, start};
use crate::stdio_resume::{checkpointed_after, err, handle_note, ok};
use crate::support::{call, kernel_python, probe_dir_or_skip, require, root};

fn srt() -> PathBuf {
    root().join("target/sandbox-deps/node_modules/.bin/srt")
}

/// A stdio server on `ws` with the data directory `home`, checkpointing 0.3 s after a cell,
/// with `flags` added (`--sandbox`, ...).
async fn server(ws: &Path, home: &Path, flags: &[&str], era: Era) -> Plain {
    let python = kernel_python();
    let srt = srt();
    let mut all = vec!["--checkpoint-after", "0.3"];
    all.extend_from_slice(flags);
    start(
        ws,
        &[
            ("IPYBOX_HOME", home.to_str().unwrap()),
            ("IPYBOX_PYTHON", python.to_str().unwrap()),
            ("IPYBOX_SRT", srt.to_str().unwrap()),
        ],
        &all,
        era,
    )
    .await
}

/// The command that makes `marker` (silent: a denied write leaves no stderr to interleave with
/// a cell's output).
fn touch(marker: &Path) -> String {
    format!("touch {} 2>/dev/null", marker.display())
}

/// Defines `boom`, whose unpickling runs `touch <marker>` wherever it is loaded.
fn plant(marker: &Path) -> String {
    format!(
        "import os\nclass Boom:\n    def __reduce__(self):\n        return (os.system, ({:?},))\nboom = Boom()",
        touch(marker)
    )
}

/// The short policy digest a refusal names for the default policy.
fn default_policy_digest() -> String {
    let record = KernelConfinement::sandbox(&SandboxPolicy::default_policy(), false);
    let KernelConfinement::Sandbox { policy } = record else {
        unreachable!()
    };
    let hex: String = policy.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{}", &hex[..12])
}

async fn a_sandboxed_checkpoint_restores_only_in_the_same_sandbox(era: Era) {
    require!(SandboxDeps);
    let ws = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    let probe = probe_dir_or_skip!("sandbox-resume");
    let marker = probe.path().join("MARKER");
    let planted = plant(&marker);

    // The sandboxed session: the payload cannot write MARKER from inside (denied by the
    // policy), and it is kept in a variable and checkpointed.
    let sandboxed = server(ws.path(), home.path(), &["--sandbox"], era).await;
    let (_, handle) = handle_note(&ok(&sandboxed, &planted, None).await);
    let tried = ok(
        &sandboxed,
        &format!("print(os.system({:?}) != 0)", touch(&marker)),
        None,
    )
    .await;
    assert_eq!(tried, "True");
    assert!(!marker.exists());
    checkpointed_after(home.path(), SystemTime::now()).await;
    sandboxed.close().await;

    // Without --sandbox, the handle is refused: the model is told why and how to resume it,
    // nothing of the snapshot runs, and the server goes on with its own kernel.
    let digest = default_policy_digest();
    let unsandboxed = server(ws.path(), home.path(), &[], era).await;
    let refused = format!(
        "session {handle} cannot be resumed here: refused to restore the snapshot: it was taken in a sandboxed kernel (--sandbox, policy {digest}), and this is an unconfined kernel (no --sandbox): what that kernel left in it would run with less confinement here; nothing of it was loaded, and it is kept\n  help: resume it in the sandbox: start ipybox with --sandbox and the same policy ({digest}: the same --sandbox-config file, unchanged, or none if it had none) in this workspace\n  help: leave `session` out to continue with the current kernel (its state is unchanged)"
    );
    assert_eq!(err(&unsandboxed, "boom", Some(&handle)).await, refused);
    // A reset naming it would switch to the session (and overwrite its snapshot): refused too.
    let reset = tool_output(&call(&unsandboxed, "reset", json!({"session": handle})).await);
    assert!(reset.is_error, "{}", reset.text);
    assert_eq!(reset.text, refused);
    assert!(!marker.exists(), "the sandboxed snapshot ran unsandboxed");
    // The server keeps working, in its own session.
    let text = ok(&unsandboxed, "1 + 1", None).await;
    let (note, own) = handle_note(&text);
    assert_eq!(text, format!("2\n\n{note}"));
    // The control: the same payload saved by this unsandboxed session ...
    ok(&unsandboxed, &planted, None).await;
    checkpointed_after(home.path(), SystemTime::now()).await;
    unsandboxed.close().await;
    assert!(!marker.exists());

    // Another policy is another sandbox: refused as well.
    let policy = probe.path().join("policy.json");
    std::fs::write(
        &policy,
        r#"{"network": {"allowedDomains": ["example.com"]}}"#,
    )
    .unwrap();
    let other = server(
        ws.path(),
        home.path(),
        &["--sandbox", "--sandbox-config", policy.to_str().unwrap()],
        era,
    )
    .await;
    let text = err(&other, "boom", Some(&handle)).await;
    assert!(
        text.starts_with(&format!(
            "session {handle} cannot be resumed here: refused to restore the snapshot: it was taken in a sandboxed kernel (--sandbox, policy {digest}), and this is a sandboxed kernel (--sandbox, policy sha256:"
        )) && text.contains("another policy, which may allow what that one denied"),
        "{text}"
    );
    other.close().await;
    assert!(!marker.exists());

    // ... and the refused snapshot was kept: a server with the same sandbox restores it (the
    // payload runs inside the sandbox, where the write is denied: `boom` is now touch's status).
    let again = server(ws.path(), home.path(), &["--sandbox"], era).await;
    let text = ok(&again, "print(boom != 0)", Some(&handle)).await;
    let (report, output) = text.rsplit_once("\n\n").unwrap();
    assert_eq!(output, "True");
    assert!(
        report.starts_with("[ipybox] This session's kernel was restored from a snapshot taken "),
        "{report}"
    );
    assert!(report.contains("boom (Boom)"), "{report}");
    again.close().await;
    assert!(!marker.exists());

    // ... resumed without the sandbox, the unsandboxed session's payload runs on the host.
    let control = server(ws.path(), home.path(), &[], era).await;
    let text = ok(&control, "print(boom)", Some(&own)).await;
    assert!(text.ends_with("\n\n0"), "{text}");
    control.close().await;
    assert!(marker.exists(), "the control's payload did not run");
}

both_eras!(a_sandboxed_checkpoint_restores_only_in_the_same_sandbox);

/// Over HTTP: a confined session's hibernated snapshot is refused (and kept) by the service
/// restarted with `--unconfined-sessions`, which goes on working: its own unconfined session,
/// hibernated and woken, runs the same payload on the host (the control); the service started
/// confined again restores the refused session.
#[tokio::test(flavor = "multi_thread")]
async fn a_confined_sessions_snapshot_is_not_restored_unconfined() {
    use crate::http_support::{Service, cell as http_cell, connect, metric, new_session};
    require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    let saved = tempfile::tempdir().unwrap();
    let probe = probe_dir_or_skip!("http-resume");
    let (confined_marker, unconfined_marker) = (
        probe.path().join("CONFINED"),
        probe.path().join("UNCONFINED"),
    );
    let replica = format!("resume-{:08x}", rand::random::<u32>());
    let flags = [
        "--hibernate-after",
        "1",
        "--warm-sessions",
        "0",
        "--replica-id",
        &replica,
        "--snapshot-dir",
        saved.path().to_str().unwrap(),
    ];
    let hibernated = |n: f64, service: &Service| {
        let port = service.port;
        async move {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
            while metric(port, None, "ipybox_session_saves_total{kind=\"hibernate\"}").await < n {
                assert!(std::time::Instant::now() < deadline, "not hibernated");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        }
    };

    let mut confined = Service::start(ws.path(), &[], &flags);
    let client = connect(&confined.url(), None, Era::Stateless).await;
    let (_, handle) = new_session(&client, &plant(&confined_marker)).await;
    client.close().await;
    let (status, _) = confined.terminate(std::time::Duration::from_secs(30));
    assert!(status.success(), "{status}\n{}", confined.log());

    let mut unconfined_flags = flags.to_vec();
    unconfined_flags.push("--unconfined-sessions");
    let mut unconfined = Service::start(ws.path(), &[], &unconfined_flags);
    let client = connect(&unconfined.url(), None, Era::Stateless).await;
    let (is_error, text) = http_cell(&client, "print(boom)", Some(&handle)).await;
    assert!(is_error, "{text}");
    assert!(
        text.ends_with(" cannot be restored by this service: refused to restore the snapshot: it was taken in a confined kernel (a bubblewrap of its own: an `ipybox serve --http` session), and this is an unconfined kernel (no --sandbox): what that kernel left in it would run with less confinement here; nothing of it was loaded, and it is kept\n  help: resume it in a confined session: start `ipybox serve --http` without --unconfined-sessions (and without --sandbox or --kernel-gateway)\n  help: or call without `session` to start a new session here"),
        "{text}"
    );
    assert!(
        !confined_marker.exists(),
        "the confined snapshot ran unconfined"
    );
    // The control: this service's own session, hibernated and woken, runs the payload here.
    let (_, own) = new_session(&client, &plant(&unconfined_marker)).await;
    hibernated(1.0, &unconfined).await;
    let (is_error, text) = http_cell(&client, "print(boom)", Some(&own)).await;
    assert!(!is_error && text.ends_with("\n\n0"), "{text}");
    assert!(
        unconfined_marker.exists(),
        "the control's payload did not run"
    );
    client.close().await;
    let (status, _) = unconfined.terminate(std::time::Duration::from_secs(30));
    assert!(status.success(), "{status}\n{}", unconfined.log());

    // Kept: confined again, the session comes back (its payload runs confined, denied).
    let confined = Service::start(ws.path(), &[], &flags);
    let client = connect(&confined.url(), None, Era::Stateless).await;
    let (is_error, text) = http_cell(&client, "print(boom != 0)", Some(&handle)).await;
    assert!(!is_error, "{text}");
    assert!(
        text.starts_with("[ipybox] This session's kernel was restored from a snapshot taken ")
            && text.ends_with("\n\nTrue"),
        "{text}"
    );
    client.close().await;
    assert!(!confined_marker.exists());
}

/// Through the library: a snapshot of a kernel on a Jupyter server is sealed with that server,
/// and a local executor (less confined: it runs on this host as the user) refuses it, loading
/// nothing and keeping it; an executor on the same server restores it, and the payload runs
/// there (the test's gateway runs its kernels on this machine, so MARKER then appears).
#[tokio::test(flavor = "multi_thread")]
async fn a_remote_kernels_snapshot_is_not_restored_locally() {
    use crate::jupyter_servers::{JupyterServer, Kind, TOKEN};
    use ipybox::CodeExecutor;
    use ipybox::snapshot::{SnapshotBinding, SnapshotError, SnapshotStore};
    require!(TestEnv);
    let timeout = Some(std::time::Duration::from_secs(120));
    let mut vars = crate::support::process_env();
    vars.insert("IPYBOX_GATEWAY_TOKEN".into(), TOKEN.into());
    let host = ipybox::host_env::HostEnv::from_vars(vars);
    let server = JupyterServer::start(Kind::KernelGateway);
    let ws = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    let probe = probe_dir_or_skip!("remote-resume");
    let marker = probe.path().join("MARKER");
    let store =
        SnapshotStore::open(home.path().join("snapshots"), &home.path().join("keys/k")).unwrap();
    let me = SnapshotBinding::new("remote-session", b"owner".to_vec());
    let remote = || {
        CodeExecutor::builder()
            .workspace(ws.path())
            .host_env(host.clone())
            .kernel_gateway(server.url())
            .without_spare_kernel()
            .build()
    };
    let ex = remote();
    ex.start()
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", server.log()));
    crate::support::run(&ex, &plant(&marker)).await;
    ex.snapshot(&store, &me, timeout).await.unwrap();
    ex.stop().await;
    let server_url = server.url();
    let recorded = store.confinement(&me).unwrap();
    let KernelConfinement::Remote { server: saved_on } = &recorded else {
        panic!("{recorded:?}")
    };
    assert!(
        server_url.starts_with(saved_on.trim_end_matches('/')),
        "{saved_on}"
    );

    let local = CodeExecutor::builder()
        .workspace(ws.path())
        .host_env(host.clone())
        .python(kernel_python())
        .without_spare_kernel()
        .build();
    local.start().await.unwrap();
    crate::support::run(&local, "kept = 'local state'").await;
    let err = local.restore(&store, &me, timeout).await.unwrap_err();
    assert!(matches!(err, SnapshotError::Confinement { .. }), "{err}");
    assert_eq!(
        err.to_string(),
        format!(
            "refused to restore the snapshot: it was taken in a kernel on the Jupyter server {saved_on} (--kernel-gateway), and this is an unconfined kernel (no --sandbox): what that kernel left in it would run with less confinement here; nothing of it was loaded, and it is kept\n  help: resume it with kernels on the same Jupyter server: start ipybox with --kernel-gateway {saved_on}"
        )
    );
    assert!(!marker.exists(), "the remote snapshot ran locally");
    // The local kernel keeps its state.
    assert_eq!(
        crate::support::run(&local, "print(kept)").await,
        "local state"
    );
    local.stop().await;

    // The control: on the same server, it is restored and its payload runs.
    let ex = remote();
    ex.start().await.unwrap();
    let report = ex.restore(&store, &me, timeout).await.unwrap();
    assert!(report.text().contains("boom (Boom)"), "{}", report.text());
    ex.stop().await;
    assert!(marker.exists(), "the control's payload did not run");
}
