//! Nothing of the host's environment that a kernel should not see is readable inside the
//! sandbox (issue 27, item 9), while the host's upstream proxy, credentials and all, still
//! carries the traffic the policy allows.
//!
//! The host environment holds a proxy URL with a password (`HTTP_PROXY`, `HTTPS_PROXY`, lower
//! case too) and an `AWS_SECRET_ACCESS_KEY`. The proxy is real: a small HTTP proxy on the host's
//! loopback that records what it is sent. Kernel code, with and without the kernel factory,
//! reads what it can: `/proc/<every visible pid>/environ` and `cmdline` (bubblewrap's pid 1
//! included, which keeps srt's environment), its own environment, every file of the runtime
//! directory it can open, and the effective settings file. Neither secret may appear. Then it
//! fetches an allowed domain through srt's proxy: srt must reach it through the host's proxy,
//! authenticated; a domain the policy does not allow still gets srt's 403 and never reaches
//! the upstream proxy.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ipybox::CodeExecutor;
use ipybox::host_env::HostEnv;
use ipybox::sandbox::{SETTINGS_FILE, SandboxOptions, SandboxPolicy};
use serde_json::json;

use crate::support::{require, root, run};

const PROXY_PASSWORD: &str = "proxy-pass-7f3e1c";
const AWS_SECRET: &str = "aws-secret-91b2d4e6a0";
/// base64 of `ipybox-user:proxy-pass-7f3e1c`.
const PROXY_AUTH: &str = "Basic aXB5Ym94LXVzZXI6cHJveHktcGFzcy03ZjNlMWM=";

/// An upstream HTTP proxy on 127.0.0.1: answers every request with `via upstream` and keeps
/// each request's head.
fn upstream_proxy() -> (u16, Arc<Mutex<Vec<String>>>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let heads = seen.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut s) = stream else { continue };
            let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && head.len() < 16 * 1024 {
                match s.read(&mut byte) {
                    Ok(1) => head.push(byte[0]),
                    _ => break,
                }
            }
            heads
                .lock()
                .unwrap()
                .push(String::from_utf8_lossy(&head).into_owned());
            let body = "via upstream";
            let _ = write!(
                s,
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    (port, seen)
}

/// What the kernel can read of the host, as JSON: which readable places hold a secret
/// (`found`), whether bubblewrap's pid 1's environment was readable (`pid1_environ`), how many
/// processes it saw, and whether the effective settings file could be opened.
fn scan_code(runtime_dir: &std::path::Path) -> String {
    let settings = runtime_dir.join(SETTINGS_FILE);
    format!(
        r#"import os, json
secrets = [{PROXY_PASSWORD:?}.encode(), {AWS_SECRET:?}.encode()]
found, pids = [], []
def check(name, data):
    for s in secrets:
        if s in data:
            found.append(name)
for d in os.listdir('/proc'):
    if not d.isdigit():
        continue
    pids.append(d)
    for part in ('environ', 'cmdline'):
        try:
            with open(f'/proc/{{d}}/{{part}}', 'rb') as f:
                check(f'/proc/{{d}}/{{part}}', f.read())
        except OSError:
            pass
check('os.environ', repr(dict(os.environ)).encode())
for top, dirs, files in os.walk({rt:?}):
    for name in files:
        path = os.path.join(top, name)
        try:
            with open(path, 'rb') as f:
                check(path, f.read(1 << 20))
        except OSError:
            pass
try:
    with open('/proc/1/environ', 'rb') as f:
        pid1 = b'PATH=' in f.read()
except OSError:
    pid1 = False
try:
    open({settings:?}, 'rb').close()
    settings = True
except OSError:
    settings = False
print(json.dumps({{"found": found, "pid1_environ": pid1, "many_pids": len(pids) >= 3, "settings_readable": settings}}))"#,
        rt = runtime_dir.display().to_string(),
        settings = settings.display().to_string(),
    )
}

const FETCH: &str = r#"import urllib.request, urllib.error
print(urllib.request.urlopen('http://upstream-only.test/hello', timeout=30).read().decode())
try:
    urllib.request.urlopen('http://not-allowed.test/', timeout=30)
except urllib.error.HTTPError as e:
    print(e.code)"#;

async fn check(factory: bool) {
    let (port, seen) = upstream_proxy();
    let proxy = format!("http://ipybox-user:{PROXY_PASSWORD}@127.0.0.1:{port}");
    let mut vars: HashMap<String, String> = std::env::vars()
        .filter(|(k, _)| !k.eq_ignore_ascii_case("no_proxy"))
        .collect();
    for k in ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"] {
        vars.insert(k.into(), proxy.clone());
    }
    vars.insert("AWS_SECRET_ACCESS_KEY".into(), AWS_SECRET.into());
    let ws = tempfile::tempdir().unwrap();
    let policy =
        SandboxPolicy::from_value(json!({"network": {"allowedDomains": ["upstream-only.test"]}}))
            .unwrap();
    let ex = CodeExecutor::builder()
        .workspace(ws.path())
        .host_env(HostEnv::from_vars(vars))
        .kernel_factory(factory)
        .without_spare_kernel()
        .sandbox(SandboxOptions {
            srt: Some(root().join("target/sandbox-deps/node_modules/.bin/srt")),
            policy: Some(policy),
            ..Default::default()
        })
        .build();
    ex.start().await.expect("starts");
    let rt = ex.runtime_dir().await.unwrap();
    let what = if factory { "forked" } else { "launched" };
    let scan: serde_json::Value = serde_json::from_str(&run(&ex, &scan_code(&rt)).await).unwrap();
    assert_eq!(
        scan,
        json!({"found": [], "pid1_environ": true, "many_pids": true, "settings_readable": false}),
        "{what}: what the sandbox can read"
    );
    // The host's proxy still carries the allowed traffic: srt goes through it, with its
    // credentials, which the kernel never saw.
    assert_eq!(run(&ex, FETCH).await, "via upstream\n403", "{what}");
    let heads = seen.lock().unwrap().clone();
    assert_eq!(heads.len(), 1, "{what}: {heads:?}");
    let head = &heads[0];
    assert!(
        head.starts_with("GET http://upstream-only.test/hello HTTP/1.1\r\n"),
        "{what}: {head}"
    );
    assert!(
        head.lines()
            .any(|l| l.split_once(':').is_some_and(|(name, value)| name
                .eq_ignore_ascii_case("proxy-authorization")
                && value.trim() == PROXY_AUTH)),
        "{what}: {head}"
    );
    ex.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_hosts_environment_stays_outside_the_sandbox() {
    require!(SandboxDeps);
    check(true).await;
    check(false).await;
}
