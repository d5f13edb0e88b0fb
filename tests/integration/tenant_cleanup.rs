//! What a hostile session leaves behind is cleaned up without harm to the service (issue 37,
//! found by an attack on the uid per session): a kernel makes a 60 000-deep tree of directories
//! in what it may write (`box/`). A recursive removal of it overflowed the service's stack when
//! the session ended (every tenant's sessions went with it), and again in the start-up sweep of
//! every restart. Here the service shuts down cleanly with the tree in place (its removal is
//! part of the shutdown: exit status 0, the tree gone), and a service killed with the tree in
//! place is swept by the next start, which then serves. The attack's own proof: the kernel
//! reports the depth it made.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::http_support::*;
use crate::mcp_eras::Era;
use crate::support::*;

const DEPTH: usize = 60_000;

fn deep_tree() -> String {
    format!(
        r#"import os
d = os.open(os.path.join(os.getcwd(), "..", "box"), os.O_RDONLY)
for i in range({DEPTH}):
    os.mkdir("d", 0o700, dir_fd=d)
    n = os.open("d", os.O_RDONLY, dir_fd=d)
    os.close(d)
    d = n
os.close(d)
print("depth={DEPTH}")"#
    )
}

/// The `box/` directories under `base` (runtime directories, and those of a shared factory's
/// sessions).
fn boxes(base: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut dirs = vec![(base.to_path_buf(), 0)];
    while let Some((dir, level)) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if entry.file_name() == "box" {
                found.push(path);
            } else if level < 2 && entry.file_type().is_ok_and(|t| t.is_dir()) {
                dirs.push((path, level + 1));
            }
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread")]
async fn a_deep_tree_in_box_neither_crashes_the_service_nor_its_restart() {
    require!(TestEnv);
    let probe = probe_dir_or_skip!("tenant-cleanup");
    // Runtime directories go here ($XDG_RUNTIME_DIR), so that the sweep of the next start
    // looks at exactly them.
    let base = probe.path().join("run");
    std::fs::create_dir(&base).unwrap();
    let base_s = base.display().to_string();
    // What this test needs of the machine: a base the service's sessions fit in whatever its
    // pid (seven digits at most: `pid_max` is 4194304 or less), else the start would fail for
    // a reason this test is not about.
    let below = "/ipybox-4194304-000000/s-000000/box/k999999/k-5";
    let longest = ipybox::kernel::SOCKET_PATH_MAX - below.len();
    assert!(
        base_s.len() <= longest,
        "precondition: the runtime base {base_s} is {} bytes, longer than the {longest} a \
         service's sessions fit with a seven-digit pid: set IPYBOX_TEST_PROBE_DIR to a shorter \
         directory",
        base_s.len()
    );
    let ws = tempfile::tempdir().unwrap();
    let env = [
        ("IPYBOX_TOKEN", TOKEN_A),
        ("XDG_RUNTIME_DIR", base_s.as_str()),
    ];
    let flags = ["--warm-sessions", "0"];
    for killed in [false, true] {
        let mut service = Service::start(ws.path(), &env, &flags);
        let client = connect(&service.url(), Some(TOKEN_A), Era::Handshake).await;
        let (is_error, text) = cell(&client, &deep_tree(), None).await;
        assert!(!is_error, "{text}\n{}", service.log());
        assert_eq!(split_note(&text).0, format!("depth={DEPTH}"));
        assert!(!boxes(&base).is_empty(), "the session's box/ is there");
        if killed {
            // No chance to clean up: the tree stays for the next start's sweep.
            service.kill();
            assert!(!boxes(&base).is_empty());
            let next = Service::start(ws.path(), &env, &flags);
            let client = connect(&next.url(), Some(TOKEN_A), Era::Stateless).await;
            let (is_error, text) = cell(&client, "print(6 * 7)", None).await;
            assert!(!is_error, "{text}\n{}", next.log());
            assert_eq!(split_note(&text).0, "42");
            let (status, _) = { next }.terminate(Duration::from_secs(30));
            assert!(status.success(), "{status}");
        } else {
            client.close().await;
            let (status, _) = service.terminate(Duration::from_secs(60));
            assert!(status.success(), "{status}\n{}", service.log());
        }
        assert_eq!(boxes(&base), Vec::<PathBuf>::new(), "killed: {killed}");
    }
}
